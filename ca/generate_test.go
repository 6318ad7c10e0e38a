package ca_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

func TestGenerateRelayCA(t *testing.T) {
	// Time and serial randomness are injected: the result is a function of
	// them (and of fresh keys).
	randomness := bytes.Repeat([]byte{0xab}, 64)
	r, err := ca.GenerateRelayCA(ca.GenerateConfig{
		Clock: func() time.Time { return t0 },
		Rand:  bytes.NewReader(randomness),
	})
	require.NoError(t, err)

	wantSerial := new(big.Int).SetBytes(bytes.Repeat([]byte{0xab}, 16))
	wantSerial.SetBit(wantSerial, 128, 1)
	notBefore := time.Date(2031, 5, 6, 6, 58, 9, 0, time.UTC)

	root := r.Root
	assert.Equal(t, wantSerial, root.SerialNumber, "serial from cfg.Rand")
	assert.Equal(t, "relaymesh relay root CA", root.Subject.CommonName)
	assert.Equal(t, []string{"relaymesh"}, root.Subject.Organization)
	assert.True(t, root.IsCA && root.BasicConstraintsValid)
	assert.Equal(t, 1, root.MaxPathLen)
	assert.Equal(t, x509.KeyUsageCertSign|x509.KeyUsageCRLSign, root.KeyUsage)
	assert.Equal(t, notBefore, root.NotBefore, "backdated 10m, whole seconds")
	assert.Equal(t, t0.Add(10*365*24*time.Hour).Truncate(time.Second), root.NotAfter, "10 years")
	require.NoError(t, root.CheckSignatureFrom(root), "self-signed")
	assertP256(t, root.PublicKey)
	assertP256(t, r.RootKey.Public())

	issuer := r.Issuer
	assert.Equal(t, "relaymesh relay issuing CA", issuer.Subject.CommonName)
	assert.True(t, issuer.IsCA && issuer.BasicConstraintsValid)
	assert.Equal(t, 0, issuer.MaxPathLen)
	assert.True(t, issuer.MaxPathLenZero, "pathLen 0")
	assert.Equal(t, notBefore, issuer.NotBefore)
	assert.Equal(t, t0.Add(365*24*time.Hour).Truncate(time.Second), issuer.NotAfter, "1 year")
	require.NoError(t, issuer.CheckSignatureFrom(root))
	assertP256(t, issuer.PublicKey)
	assert.NotEqual(t, root.SubjectKeyId, issuer.SubjectKeyId)
	catest.Lint(t, root)
	catest.Lint(t, issuer)

	s, err := r.Signer(t0)
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{issuer}, s.Chain())
	assert.Equal(t, []*x509.Certificate{root}, s.Roots())
	_, err = r.Signer(issuer.NotAfter.Add(time.Second))
	assert.ErrorIs(t, err, ca.ErrInvalidSigner, "an expired issuer is refused")

	t.Run("issuerTTL may equal rootTTL", func(t *testing.T) {
		r, err := ca.GenerateRelayCA(ca.GenerateConfig{Clock: func() time.Time { return t0 }, RootTTL: time.Hour, IssuerTTL: time.Hour})
		require.NoError(t, err)
		assert.Equal(t, r.Root.NotAfter, r.Issuer.NotAfter)
	})
	t.Run("randomness failure", func(t *testing.T) {
		r, err := ca.GenerateRelayCA(ca.GenerateConfig{Rand: iotest.ErrReader(errors.New("no entropy"))})
		require.ErrorContains(t, err, "no entropy")
		assert.Nil(t, r)
	})
	t.Run("two CAs differ", func(t *testing.T) {
		a, b := newRelayCA(t, ca.GenerateConfig{}), newRelayCA(t, ca.GenerateConfig{})
		assert.False(t, a.Root.Equal(b.Root))
		assert.NotEqual(t, a.Root.SerialNumber, b.Root.SerialNumber)
	})
}

func assertP256(t *testing.T, pub any) {
	t.Helper()
	k, ok := pub.(*ecdsa.PublicKey)
	if assert.True(t, ok, "ECDSA key, got %T", pub) {
		assert.Equal(t, elliptic.P256(), k.Curve)
	}
}

func TestGenerateConfigValidate(t *testing.T) {
	valid := ca.GenerateConfig{}.Default()
	require.NoError(t, valid.Validate())
	assert.Equal(t, "relaymesh", valid.Org)
	assert.Equal(t, 10*365*24*time.Hour, valid.RootTTL)
	assert.Equal(t, 365*24*time.Hour, valid.IssuerTTL)

	tests := []struct {
		name   string
		mutate func(*ca.GenerateConfig)
		want   string
	}{
		{"org too long", func(c *ca.GenerateConfig) { c.Org = strings.Repeat("x", 65) }, "org:"},
		{"no org", func(c *ca.GenerateConfig) { c.Org = "" }, "org:"},
		{"rootTTL too long", func(c *ca.GenerateConfig) { c.RootTTL = 31 * 365 * 24 * time.Hour }, "rootTTL:"},
		{"rootTTL too short", func(c *ca.GenerateConfig) { c.RootTTL = time.Second }, "rootTTL:"},
		{"issuerTTL beyond rootTTL", func(c *ca.GenerateConfig) { c.IssuerTTL = c.RootTTL + time.Hour }, "issuerTTL:"},
		{"issuerTTL negative", func(c *ca.GenerateConfig) { c.IssuerTTL = -time.Hour }, "issuerTTL:"},
		{"no clock", func(c *ca.GenerateConfig) { c.Clock = nil }, "clock: required"},
		{"no rand", func(c *ca.GenerateConfig) { c.Rand = nil }, "rand: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.mutate(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	t.Run("every problem at once", func(t *testing.T) {
		err := ca.GenerateConfig{RootTTL: -1, IssuerTTL: -1}.Validate()
		require.Error(t, err)
		for _, field := range []string{"org:", "rootTTL:", "issuerTTL:", "clock:", "rand:"} {
			assert.Contains(t, err.Error(), field)
		}
	})
	t.Run("GenerateRelayCA validates", func(t *testing.T) {
		r, err := ca.GenerateRelayCA(ca.GenerateConfig{IssuerTTL: 20 * 365 * 24 * time.Hour})
		require.ErrorContains(t, err, "issuerTTL:")
		assert.Nil(t, r)
	})
}

func TestGenerateMeshRoot(t *testing.T) {
	r, err := ca.GenerateMeshRoot(ca.MeshRootConfig{
		VirtualMesh: "vm1",
		Clock:       func() time.Time { return t0 },
		Rand:        bytes.NewReader(bytes.Repeat([]byte{0xcd}, 16)),
	})
	require.NoError(t, err)
	c := r.Cert
	assert.Equal(t, "CN=relaymesh mesh root CA,O=vm1", c.Subject.String())
	assert.True(t, c.IsCA && c.BasicConstraintsValid)
	assert.Equal(t, 1, c.MaxPathLen, "one level of intermediates")
	assert.Equal(t, x509.KeyUsageCertSign|x509.KeyUsageCRLSign, c.KeyUsage)
	assert.Empty(t, c.ExtKeyUsage)
	assert.Equal(t, time.Date(2031, 5, 6, 6, 58, 9, 0, time.UTC), c.NotBefore, "backdated 10m")
	assert.Equal(t, t0.Add(10*365*24*time.Hour).Truncate(time.Second), c.NotAfter, "10 years")
	require.NoError(t, c.CheckSignatureFrom(c), "self-signed")
	assertP256(t, c.PublicKey)
	catest.Lint(t, c)

	s, err := r.Signer(t0)
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{c}, s.Chain())
	assert.Equal(t, []*x509.Certificate{c}, s.Roots())

	relay := newRelayCA(t, ca.GenerateConfig{})
	assert.NotEqual(t, relay.Root.Subject.String(), c.Subject.String(), "a mesh root is not the relay root")

	for name, cfg := range map[string]ca.MeshRootConfig{
		"no VirtualMesh":       {},
		"VirtualMesh too long": {VirtualMesh: strings.Repeat("v", 65)},
		"TTL too short":        {VirtualMesh: "vm1", TTL: time.Second},
		"TTL too long":         {VirtualMesh: "vm1", TTL: 31 * 365 * 24 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := ca.GenerateMeshRoot(cfg)
			require.ErrorContains(t, err, "invalid mesh root config")
			assert.Nil(t, r)
		})
	}
	err = ca.MeshRootConfig{TTL: -1}.Validate()
	for _, field := range []string{"virtualMesh:", "ttl:", "clock:", "rand:"} {
		assert.ErrorContains(t, err, field)
	}
}

// TestGenerateMeshRootKeyAlgorithms: each allowed key algorithm makes a
// root that loads from its PEM as a provided root does (the way the trust
// controller keeps it in a Secret), signs a mesh intermediate that chains
// to it, and passes the lints.
func TestGenerateMeshRootKeyAlgorithms(t *testing.T) {
	tests := []struct {
		alg   ca.KeyAlgorithm
		check func(t *testing.T, pub any)
	}{
		{"", assertP256},
		{ca.KeyECDSAP256, assertP256},
		{ca.KeyECDSAP384, func(t *testing.T, pub any) {
			k, ok := pub.(*ecdsa.PublicKey)
			if assert.True(t, ok, "ECDSA key, got %T", pub) {
				assert.Equal(t, elliptic.P384(), k.Curve)
			}
		}},
		{ca.KeyRSA3072, assertRSA(3072)},
		// One RSA-4096 key: its generation takes seconds under -race.
		{ca.KeyRSA4096, assertRSA(4096)},
	}
	for _, tt := range tests {
		name := string(tt.alg)
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: catest.Intermediate.VirtualMesh, KeyAlgorithm: tt.alg})
			require.NoError(t, err)
			tt.check(t, r.Cert.PublicKey)
			catest.Lint(t, r.Cert)

			keyBlock, err := pemutil.Serialize(r.Key)
			require.NoError(t, err)
			certPEM := ca.CertsPEM(r.Cert)
			s, err := ca.ParseSignerPEM(certPEM, pem.EncodeToMemory(keyBlock), certPEM, time.Now())
			require.NoError(t, err)
			iss := catest.IssueIntermediate(t, s)
			assert.Equal(t, []*x509.Certificate{r.Cert}, iss.Roots)
		})
	}
}

func assertRSA(bits int) func(t *testing.T, pub any) {
	return func(t *testing.T, pub any) {
		t.Helper()
		k, ok := pub.(*rsa.PublicKey)
		if assert.True(t, ok, "RSA key, got %T", pub) {
			assert.Equal(t, bits, k.N.BitLen())
		}
	}
}

// TestGenerateMeshRootRefusesWeakKeys: a root's key must be at least ECDSA
// P-256 or RSA-3072; anything else is refused before a key is made, with
// the reason and the allowed names.
func TestGenerateMeshRootRefusesWeakKeys(t *testing.T) {
	for _, alg := range []ca.KeyAlgorithm{"RSA2048", "RSA1024", "ECDSAP224", "ECDSAP521", "Ed25519", "ecdsap256", "RSA"} {
		t.Run(string(alg), func(t *testing.T) {
			r, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "vm1", KeyAlgorithm: alg})
			require.Error(t, err)
			assert.Nil(t, r)
			assert.ErrorContains(t, err, `keyAlgorithm: "`+string(alg)+`" is not allowed for a root, which must be at least ECDSA P-256 or RSA-3072`)
			assert.ErrorContains(t, err, "one of ECDSAP256, ECDSAP384, RSA3072, RSA4096")
		})
	}
	assert.Equal(t, ca.KeyECDSAP256, ca.MeshRootConfig{}.Default().KeyAlgorithm)
}
