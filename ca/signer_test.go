package ca_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

func TestSignerConformance(t *testing.T) {
	t.Run("generated relay CA", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			s, err := newRelayCA(t, ca.GenerateConfig{}).Signer(time.Now())
			require.NoError(t, err)
			return s
		})
	})
	t.Run("generated mesh root", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			r, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "vm1"})
			require.NoError(t, err)
			s, err := r.Signer(time.Now())
			require.NoError(t, err)
			return s
		})
	})
	t.Run("provided single-level root", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			return catest.NewRoot(t, catest.CAOptions{}).Signer(t, time.Now())
		})
	})
	t.Run("provided 3-level chain", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			// Path lengths that leave room for one level of mesh
			// intermediates below the issuing CA.
			root := catest.NewRoot(t, catest.CAOptions{MaxPathLen: 3})
			issuing := root.NewIntermediate(t, catest.CAOptions{MaxPathLen: 2}).
				NewIntermediate(t, catest.CAOptions{MaxPathLen: 1})
			return issuing.Signer(t, time.Now())
		})
	})
	t.Run("provided 3-level chain ending in pathLen 0 (issues no intermediates)", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			root := catest.NewRoot(t, catest.CAOptions{MaxPathLen: 2})
			issuing := root.NewIntermediate(t, catest.CAOptions{MaxPathLen: 1}).
				NewIntermediate(t, catest.CAOptions{PathLenZero: true})
			return issuing.Signer(t, time.Now())
		})
	})
	t.Run("provided 3-level chain of mixed key types, from PEM", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			root := catest.NewRoot(t, catest.CAOptions{KeyType: catest.RSA3072})
			issuing := root.NewIntermediate(t, catest.CAOptions{KeyType: catest.ECDSAP384}).
				NewIntermediate(t, catest.CAOptions{KeyType: catest.Ed25519})
			s, err := ca.ParseSignerPEM(issuing.ChainPEM(), issuing.KeyPEM(t), issuing.RootsPEM(), time.Now())
			require.NoError(t, err)
			return s
		})
	})
}

// TestNewKeySignerRejects: a provided CA that cannot sign correctly is
// refused before it signs anything.
func TestNewKeySignerRejects(t *testing.T) {
	now := time.Now()
	root := catest.NewRoot(t, catest.CAOptions{})
	inter := root.NewIntermediate(t, catest.CAOptions{})
	issuing := inter.NewIntermediate(t, catest.CAOptions{})
	foreign := catest.NewRoot(t, catest.CAOptions{})
	notCA := root.NewIntermediate(t, catest.CAOptions{NotCA: true})
	noCertSign := root.NewIntermediate(t, catest.CAOptions{NoCertSign: true})
	expired := catest.NewRoot(t, catest.CAOptions{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)})
	notYet := catest.NewRoot(t, catest.CAOptions{NotBefore: now.Add(time.Hour), NotAfter: now.Add(48 * time.Hour)})
	expiredInter := root.NewIntermediate(t, catest.CAOptions{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)})
	underExpired := expiredInter.NewIntermediate(t, catest.CAOptions{NotAfter: now.Add(time.Hour)})
	expiredRoot := catest.NewRoot(t, catest.CAOptions{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)})
	underExpiredRoot := expiredRoot.NewIntermediate(t, catest.CAOptions{NotAfter: now.Add(time.Hour)})
	pathLenZeroRoot := catest.NewRoot(t, catest.CAOptions{PathLenZero: true})
	tooDeep := pathLenZeroRoot.NewIntermediate(t, catest.CAOptions{}).NewIntermediate(t, catest.CAOptions{})

	tests := []struct {
		name  string
		chain []*x509.Certificate
		key   crypto.Signer
		roots []*x509.Certificate
		want  string
	}{
		{"not a CA", notCA.Chain(), notCA.Key, notCA.Roots(), "is not a CA certificate"},
		{"no keyCertSign", noCertSign.Chain(), noCertSign.Key, noCertSign.Roots(), "keyCertSign"},
		{"key mismatch", issuing.Chain(), inter.Key, issuing.Roots(), "does not belong"},
		{"expired", expired.Chain(), expired.Key, expired.Roots(), "expired at"},
		{"not yet valid", notYet.Chain(), notYet.Key, notYet.Roots(), "not valid before"},
		{"intermediate expired", underExpired.Chain(), underExpired.Key, underExpired.Roots(), "expired at"},
		{"root expired", underExpiredRoot.Chain(), underExpiredRoot.Key, underExpiredRoot.Roots(), "expired at"},
		{"chain does not verify to the roots", issuing.Chain(), issuing.Key, foreign.Roots(), "does not chain to the roots"},
		{"intermediate missing", []*x509.Certificate{issuing.Cert}, issuing.Key, issuing.Roots(), "does not chain to the roots"},
		{"chain out of order", []*x509.Certificate{issuing.Cert, foreign.Cert, inter.Cert}, issuing.Key, issuing.Roots(), "not an ordered chain"},
		{"path length exceeded", tooDeep.Chain(), tooDeep.Key, tooDeep.Roots(), "does not chain"},
		{"no chain", nil, root.Key, root.Roots(), "no CA certificate"},
		{"no roots", root.Chain(), root.Key, nil, "no root"},
		{"no key", root.Chain(), nil, root.Roots(), "no CA key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ca.NewKeySigner(tt.chain, tt.key, tt.roots, now)
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.Contains(t, err.Error(), tt.want)
			assert.Nil(t, s)
		})
	}
	t.Run("full chain including the root is accepted", func(t *testing.T) {
		chain := append(issuing.Chain(), root.Cert)
		s, err := ca.NewKeySigner(chain, issuing.Key, issuing.Roots(), now)
		require.NoError(t, err)
		assert.Len(t, s.Chain(), 3)
	})
}

func TestParseSignerPEM(t *testing.T) {
	now := time.Now()
	root := catest.NewRoot(t, catest.CAOptions{})
	issuing := root.NewIntermediate(t, catest.CAOptions{}).NewIntermediate(t, catest.CAOptions{})

	s, err := ca.ParseSignerPEM(issuing.ChainPEM(), issuing.KeyPEM(t), issuing.RootsPEM(), now)
	require.NoError(t, err)
	assert.Len(t, s.Chain(), 2)
	assert.True(t, s.Roots()[0].Equal(root.Cert))

	pubPEM := catest.CertsPEM(issuing.Cert) // a certificate where the key belongs
	tests := []struct {
		name                 string
		cert, key, rootsData []byte
		want                 string
	}{
		{"empty certificate", nil, issuing.KeyPEM(t), issuing.RootsPEM(), "CA certificates: empty"},
		{"garbage certificate", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), issuing.KeyPEM(t), issuing.RootsPEM(), "CA certificates"},
		{"empty key", issuing.ChainPEM(), nil, issuing.RootsPEM(), "CA key: empty"},
		{"garbage key", issuing.ChainPEM(), []byte("not a key"), issuing.RootsPEM(), "CA key"},
		{"certificate instead of key", issuing.ChainPEM(), pubPEM, issuing.RootsPEM(), "no ECDSA, RSA or Ed25519 private key"},
		{"wrong key", issuing.ChainPEM(), root.KeyPEM(t), issuing.RootsPEM(), "does not belong"},
		{"empty roots", issuing.ChainPEM(), issuing.KeyPEM(t), nil, "roots: empty"},
		{"encrypted key", issuing.ChainPEM(), []byte("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"), issuing.RootsPEM(), "CA key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ca.ParseSignerPEM(tt.cert, tt.key, tt.rootsData, now)
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "PRIVATE KEY-----", "no key material in errors")
			assert.Nil(t, s)
		})
	}
}

func TestLoadSignerFiles(t *testing.T) {
	dir := t.TempDir()
	root := catest.NewRoot(t, catest.CAOptions{})
	issuing := root.NewIntermediate(t, catest.CAOptions{})
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	certPath := write("tls.crt", issuing.ChainPEM())
	keyPath := write("tls.key", issuing.KeyPEM(t))
	rootsPath := write("ca.crt", issuing.RootsPEM())

	s, err := ca.LoadSignerFiles(certPath, keyPath, rootsPath, time.Now())
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := ca.ParseCSR(catest.NewCSRPEM(t, key, nil))
	require.NoError(t, err)
	iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.NoError(t, err)
	catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)

	s, err = ca.LoadSignerFiles(certPath, filepath.Join(dir, "missing.key"), rootsPath, time.Now())
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Nil(t, s)

	s, err = ca.LoadSignerFiles(certPath, rootsPath, rootsPath, time.Now())
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	assert.Contains(t, err.Error(), rootsPath, "names the files")
	assert.Nil(t, s)
}
