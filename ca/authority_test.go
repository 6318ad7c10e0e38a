package ca_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

// t0 is a fixed time, far from the wall clock, with a fraction of a second.
var t0 = time.Date(2031, 5, 6, 7, 8, 9, 500_000_000, time.UTC)

func TestConfigDefault(t *testing.T) {
	c := ca.Config{}.Default()
	assert.NotNil(t, c.Clock)
	assert.NotNil(t, c.Rand)
	assert.Equal(t, 24*time.Hour, c.AgentTTL)
	assert.Equal(t, 720*time.Hour, c.ServerTTL)
	assert.Equal(t, time.Minute, c.Backdate)
	assert.Equal(t, 365*24*time.Hour, c.IntermediateTTL)

	kept := ca.Config{AgentTTL: time.Hour, ServerTTL: 2 * time.Hour, Backdate: 5 * time.Minute}.Default()
	assert.Equal(t, time.Hour, kept.AgentTTL)
	assert.Equal(t, 2*time.Hour, kept.ServerTTL)
	assert.Equal(t, 5*time.Minute, kept.Backdate)
}

func TestConfigValidate(t *testing.T) {
	s, err := newRelayCA(t, ca.GenerateConfig{}).Signer(time.Now())
	require.NoError(t, err)
	valid := ca.Config{Signer: s}.Default()
	tests := []struct {
		name   string
		mutate func(*ca.Config)
		want   string
	}{
		{"defaults", func(*ca.Config) {}, ""},
		{"shortest agentTTL", func(c *ca.Config) { c.AgentTTL = 10 * time.Second }, ""},
		{"longest agentTTL", func(c *ca.Config) { c.AgentTTL = 30 * 24 * time.Hour }, ""},
		{"no backdate", func(c *ca.Config) { c.Backdate = 0 }, ""},
		{"no signer", func(c *ca.Config) { c.Signer = nil }, "signer: required"},
		{"no clock", func(c *ca.Config) { c.Clock = nil }, "clock: required"},
		{"no rand", func(c *ca.Config) { c.Rand = nil }, "rand: required"},
		{"agentTTL too short", func(c *ca.Config) { c.AgentTTL = 9 * time.Second }, "agentTTL: 9s is outside"},
		{"agentTTL too long", func(c *ca.Config) { c.AgentTTL = 31 * 24 * time.Hour }, "agentTTL: 744h0m0s is outside"},
		{"agentTTL negative", func(c *ca.Config) { c.AgentTTL = -time.Hour }, "agentTTL:"},
		{"serverTTL too short", func(c *ca.Config) { c.ServerTTL = time.Second }, "serverTTL: 1s is outside"},
		{"serverTTL too long", func(c *ca.Config) { c.ServerTTL = 366 * 24 * time.Hour }, "serverTTL:"},
		{"longest intermediateTTL", func(c *ca.Config) { c.IntermediateTTL = 2 * 365 * 24 * time.Hour }, ""},
		{"intermediateTTL too short", func(c *ca.Config) { c.IntermediateTTL = time.Second }, "intermediateTTL: 1s is outside"},
		{"intermediateTTL too long", func(c *ca.Config) { c.IntermediateTTL = 2*365*24*time.Hour + time.Second }, "intermediateTTL:"},
		{"backdate negative", func(c *ca.Config) { c.Backdate = -time.Second }, "backdate: -1s is outside"},
		{"backdate too long", func(c *ca.Config) { c.Backdate = 11 * time.Minute }, "backdate: 11m0s is outside"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.mutate(&c)
			err := c.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			a, err := ca.New(c)
			if c.Signer != nil && c.Clock != nil && c.Rand != nil {
				// New applies defaults, so only non-zero bad values remain bad.
				assert.Error(t, err)
				assert.Nil(t, a)
			}
		})
	}

	t.Run("every problem at once", func(t *testing.T) {
		err := ca.Config{AgentTTL: time.Second, ServerTTL: -time.Second, Backdate: time.Hour}.Validate()
		require.Error(t, err)
		for _, field := range []string{"signer:", "clock:", "rand:", "agentTTL:", "serverTTL:", "intermediateTTL:", "backdate:"} {
			assert.Contains(t, err.Error(), field)
		}
		assert.Len(t, strings.Split(err.Error(), "\n"), 7, "one line per problem")
	})
}

// fakeSigner is a Signer whose chain and roots are given and whose Sign
// is a function.
type fakeSigner struct {
	chain, roots []*x509.Certificate
	sign         func(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error)
}

func (f *fakeSigner) Sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	return f.sign(ctx, tmpl, pub)
}
func (f *fakeSigner) Chain() []*x509.Certificate { return append([]*x509.Certificate(nil), f.chain...) }
func (f *fakeSigner) Roots() []*x509.Certificate { return append([]*x509.Certificate(nil), f.roots...) }

func TestNewRejectsUnusableSigners(t *testing.T) {
	r := newRelayCA(t, ca.GenerateConfig{})
	foreign := newRelayCA(t, ca.GenerateConfig{})
	tests := []struct {
		name string
		s    ca.Signer
		want string
	}{
		{"no chain", &fakeSigner{roots: []*x509.Certificate{r.Root}}, "no CA certificate or no roots"},
		{"no roots", &fakeSigner{chain: []*x509.Certificate{r.Issuer}}, "no CA certificate or no roots"},
		{"chain does not verify to roots", &fakeSigner{chain: []*x509.Certificate{r.Issuer}, roots: []*x509.Certificate{foreign.Root}}, "does not chain to the roots"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ca.New(ca.Config{Signer: tt.s})
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.Contains(t, err.Error(), tt.want)
			assert.Nil(t, a)
		})
	}
	t.Run("issuing CA expired at the clock", func(t *testing.T) {
		s, err := r.Signer(time.Now())
		require.NoError(t, err)
		a, err := ca.New(ca.Config{Signer: s, Clock: func() time.Time { return r.Issuer.NotAfter.Add(time.Second) }})
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.Contains(t, err.Error(), "expired")
		assert.Nil(t, a)
	})
}

// TestIssueAgentFixedClock: with time injected, validity is exact and does
// not depend on the wall clock.
func TestIssueAgentFixedClock(t *testing.T) {
	r := newRelayCA(t, ca.GenerateConfig{Clock: func() time.Time { return t0 }})
	s, err := r.Signer(t0)
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: s, Clock: func() time.Time { return t0 }})
	require.NoError(t, err)
	assert.Equal(t, 24*time.Hour, a.AgentTTL())

	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.NoError(t, err)
	c := iss.Certificate
	assert.Equal(t, time.Date(2031, 5, 6, 7, 7, 9, 0, time.UTC), c.NotBefore, "now - 1m backdate, whole seconds")
	assert.Equal(t, time.Date(2031, 5, 7, 7, 8, 9, 0, time.UTC), c.NotAfter, "now + 24h, whole seconds")
	catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)
	_, err = c.Verify(x509.VerifyOptions{
		Roots: pool(a.Roots()), Intermediates: pool(iss.Chain), CurrentTime: t0,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	require.NoError(t, err, "verifies at the injected time")
	_, err = c.Verify(x509.VerifyOptions{
		Roots: pool(a.Roots()), Intermediates: pool(iss.Chain), CurrentTime: c.NotAfter.Add(time.Second),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	require.Error(t, err, "expires after AgentTTL")
}

// TestIssueAgentValidityClamped: a certificate never outlives, nor
// predates, its issuing CA, and an expired CA issues nothing.
func TestIssueAgentValidityClamped(t *testing.T) {
	r := newRelayCA(t, ca.GenerateConfig{Clock: func() time.Time { return t0 }, IssuerTTL: 2 * time.Hour})
	require.Equal(t, t0.Add(2*time.Hour).Truncate(time.Second), r.Issuer.NotAfter)
	s, err := r.Signer(t0)
	require.NoError(t, err)
	clk := newClock(t0.Add(90 * time.Minute))
	a, err := ca.New(ca.Config{Signer: s, Clock: clk.Now, Backdate: 10 * time.Minute})
	require.NoError(t, err)
	csr, err := ca.ParseCSR(catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), nil))
	require.NoError(t, err)

	t.Run("NotAfter clamped to the issuer's", func(t *testing.T) {
		clk.Set(t0.Add(90 * time.Minute))
		iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
		require.NoError(t, err)
		assert.Equal(t, r.Issuer.NotAfter, iss.Certificate.NotAfter)
	})
	t.Run("NotBefore clamped to the issuer's", func(t *testing.T) {
		// The generated CA is backdated 10m; 5m before t0 a 10m backdate
		// would reach 15m before t0.
		clk.Set(t0.Add(-5 * time.Minute))
		iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
		require.NoError(t, err)
		assert.Equal(t, r.Issuer.NotBefore, iss.Certificate.NotBefore)
	})
	t.Run("expired issuer issues nothing", func(t *testing.T) {
		clk.Set(r.Issuer.NotAfter.Add(time.Second))
		iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
		require.ErrorIs(t, err, ca.ErrIssuance)
		assert.Contains(t, err.Error(), "expired")
		assert.Nil(t, iss)
	})
}

func TestIssueAgentRejectsBadArguments(t *testing.T) {
	a := newTestAuthority(t)
	csr, err := ca.ParseCSR(catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), nil))
	require.NoError(t, err)

	iss, err := a.IssueAgent(context.Background(), nil, catest.AgentID)
	assert.ErrorIs(t, err, ca.ErrInvalidCSR)
	assert.Nil(t, iss)

	iss, err = a.IssueAgent(context.Background(), csr, spiffeid.ID{})
	assert.ErrorIs(t, err, ca.ErrIssuance)
	assert.Contains(t, err.Error(), "no SPIFFE ID")
	assert.Nil(t, iss)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	iss, err = a.IssueAgent(ctx, csr, catest.AgentID)
	assert.ErrorIs(t, err, ca.ErrIssuance)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Nil(t, iss)
}

// TestIssuanceFailsClosed: a signer that returns anything other than what
// was asked for — an extra name, a CA bit, another key, another issuer —
// gets its certificate rejected.
func TestIssuanceFailsClosed(t *testing.T) {
	r := newRelayCA(t, ca.GenerateConfig{})
	other := newRelayCA(t, ca.GenerateConfig{})
	real, err := r.Signer(time.Now())
	require.NoError(t, err)
	otherKey := catest.NewKey(t, catest.ECDSAP256)
	evilURI := &url.URL{Scheme: "spiffe", Host: "relay.test", Path: "/cluster/other/agent"}

	// mutated signs a changed copy of the template with the given CA.
	mutated := func(issuer *x509.Certificate, key crypto.Signer, mutate func(c *x509.Certificate, pub *crypto.PublicKey)) ca.Signer {
		return &fakeSigner{chain: real.Chain(), roots: real.Roots(), sign: func(_ context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
			c := *tmpl
			mutate(&c, &pub)
			der, err := x509.CreateCertificate(rand.Reader, &c, issuer, pub, key)
			if err != nil {
				return nil, err
			}
			return x509.ParseCertificate(der)
		}}
	}
	mut := func(f func(c *x509.Certificate)) ca.Signer {
		return mutated(r.Issuer, r.IssuerKey, func(c *x509.Certificate, _ *crypto.PublicKey) { f(c) })
	}
	tests := []struct {
		name string
		s    ca.Signer
		want string
	}{
		{"control: unchanged", mut(func(*x509.Certificate) {}), ""},
		{"adds a DNS SAN", mut(func(c *x509.Certificate) { c.DNSNames = []string{"evil.example"} }), "DNS names"},
		{"adds an IP SAN", mut(func(c *x509.Certificate) { c.IPAddresses = []net.IP{net.IPv4(10, 0, 0, 1)} }), "IP addresses"},
		{"adds an email SAN", mut(func(c *x509.Certificate) { c.EmailAddresses = []string{"a@example.com"} }), "email"},
		{"replaces the URI", mut(func(c *x509.Certificate) { c.URIs = []*url.URL{evilURI} }), "URIs"},
		{"adds a URI", mut(func(c *x509.Certificate) { c.URIs = append(c.URIs, evilURI) }), "URIs"},
		{"adds an otherName SAN", mut(func(c *x509.Certificate) {
			c.ExtraExtensions = []pkix.Extension{sanWithOtherName(t, c.URIs[0].String())}
		}), "subject alternative names: 2 entries, want 1"},
		{"makes a CA", mut(func(c *x509.Certificate) { c.IsCA = true; c.KeyUsage |= x509.KeyUsageCertSign }), "CA"},
		{"adds keyCertSign", mut(func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCertSign }), "key usage"},
		{"drops basic constraints", mut(func(c *x509.Certificate) { c.BasicConstraintsValid = false }), "basic constraints"},
		{"adds serverAuth", mut(func(c *x509.Certificate) { c.ExtKeyUsage = append(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) }), "extended key usage"},
		{"adds an unknown EKU", mut(func(c *x509.Certificate) { c.UnknownExtKeyUsage = []asn1.ObjectIdentifier{{1, 2, 3}} }), "extended key usage"},
		{"changes the serial", mut(func(c *x509.Certificate) { c.SerialNumber = big.NewInt(1) }), "serial number"},
		{"extends NotAfter", mut(func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(time.Hour) }), "notAfter"},
		{"moves NotBefore", mut(func(c *x509.Certificate) { c.NotBefore = c.NotBefore.Add(-time.Hour) }), "notBefore"},
		{"changes the subject", mut(func(c *x509.Certificate) { c.Subject.CommonName = "admin" }), "subject"},
		{"adds an extension", mut(func(c *x509.Certificate) {
			c.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Value: []byte{0x05, 0x00}}}
		}), "unexpected extension 1.2.3.4"},
		{"certifies another key", mutated(r.Issuer, r.IssuerKey, func(_ *x509.Certificate, pub *crypto.PublicKey) { *pub = otherKey.Public() }), "public key"},
		{"signed by another CA with the same name", mutated(other.Issuer, other.IssuerKey, func(*x509.Certificate, *crypto.PublicKey) {}), "not signed by the issuing CA"},
		{"returns no certificate", &fakeSigner{chain: real.Chain(), roots: real.Roots(), sign: func(context.Context, *x509.Certificate, crypto.PublicKey) (*x509.Certificate, error) {
			return nil, nil
		}}, "no certificate"},
		{"fails", &fakeSigner{chain: real.Chain(), roots: real.Roots(), sign: func(context.Context, *x509.Certificate, crypto.PublicKey) (*x509.Certificate, error) {
			return nil, errors.New("HSM unplugged")
		}}, "HSM unplugged"},
	}
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ca.New(ca.Config{Signer: tt.s})
			require.NoError(t, err)
			iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
			if tt.want == "" {
				require.NoError(t, err)
				catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)
				return
			}
			require.ErrorIs(t, err, ca.ErrIssuance)
			assert.Contains(t, err.Error(), tt.want)
			assert.Nil(t, iss)
		})
	}
}

func TestIssueServer(t *testing.T) {
	r := newRelayCA(t, ca.GenerateConfig{Clock: func() time.Time { return t0 }})
	s, err := r.Signer(t0)
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: s, Clock: func() time.Time { return t0 }})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP256)

	t.Run("valid", func(t *testing.T) {
		names := []string{"relaymesh-server.relaymesh.svc", "localhost", "Relay-1.Example.test"}
		ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.ParseIP("10.1.2.3")}
		iss, err := a.IssueServer(context.Background(), key.Public(), names, ips)
		require.NoError(t, err)
		c := iss.Certificate
		assert.Equal(t, names, c.DNSNames)
		require.Len(t, c.IPAddresses, 3)
		for i := range ips {
			assert.True(t, ips[i].Equal(c.IPAddresses[i]))
		}
		assert.Empty(t, c.URIs)
		assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, c.ExtKeyUsage)
		assert.Equal(t, x509.KeyUsageDigitalSignature, c.KeyUsage)
		assert.False(t, c.IsCA)
		assert.Equal(t, t0.Add(720*time.Hour).Truncate(time.Second), c.NotAfter, "ServerTTL default 30 days")
		_, err = c.Verify(x509.VerifyOptions{
			DNSName: "relaymesh-server.relaymesh.svc", Roots: pool(iss.Roots), Intermediates: pool(iss.Chain), CurrentTime: t0,
		})
		require.NoError(t, err)
	})
	t.Run("RSA keys get keyEncipherment", func(t *testing.T) {
		iss, err := a.IssueServer(context.Background(), catest.NewKey(t, catest.RSA2048).Public(), []string{"relay"}, nil)
		require.NoError(t, err)
		assert.Equal(t, x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment, iss.Certificate.KeyUsage)
	})

	long := strings.Repeat("a", 64)
	tests := []struct {
		name  string
		pub   crypto.PublicKey
		names []string
		ips   []net.IP
		want  error
		msg   string
	}{
		{"no names", key.Public(), nil, nil, ca.ErrIssuance, "at least one"},
		{"wildcard", key.Public(), []string{"*.example.com"}, nil, ca.ErrIssuance, "character '*'"},
		{"underscore", key.Public(), []string{"bad_name.example"}, nil, ca.ErrIssuance, "character '_'"},
		{"leading hyphen", key.Public(), []string{"-a.example"}, nil, ca.ErrIssuance, "start or end"},
		{"empty label", key.Public(), []string{"a..example"}, nil, ca.ErrIssuance, "1 to 63"},
		{"trailing dot", key.Public(), []string{"a.example."}, nil, ca.ErrIssuance, "1 to 63"},
		{"label too long", key.Public(), []string{long + ".example"}, nil, ca.ErrIssuance, "1 to 63"},
		{"name too long", key.Public(), []string{strings.Repeat("abcdefgh.", 29)}, nil, ca.ErrIssuance, "at most 253"},
		{"empty name", key.Public(), []string{""}, nil, ca.ErrIssuance, "empty"},
		{"URI as name", key.Public(), []string{"spiffe://relay.test/x"}, nil, ca.ErrIssuance, "character ':'"},
		{"duplicate name", key.Public(), []string{"relay", "RELAY"}, nil, ca.ErrIssuance, "twice"},
		{"unspecified IP", key.Public(), nil, []net.IP{net.IPv4zero}, ca.ErrIssuance, "unspecified"},
		{"invalid IP", key.Public(), nil, []net.IP{{1, 2, 3}}, ca.ErrIssuance, "invalid IP"},
		{"duplicate IP", key.Public(), nil, []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP("127.0.0.1").To4()}, ca.ErrIssuance, "twice"},
		{"RSA-1024 key", catest.NewKey(t, catest.RSA1024).Public(), []string{"relay"}, nil, ca.ErrKeyPolicy, "1024 bits"},
		{"P-224 key", catest.NewKey(t, catest.ECDSAP224).Public(), []string{"relay"}, nil, ca.ErrKeyPolicy, "P-224"},
		{"no key", nil, []string{"relay"}, nil, ca.ErrKeyPolicy, "no public key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			iss, err := a.IssueServer(context.Background(), tt.pub, tt.names, tt.ips)
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.msg)
			assert.Nil(t, iss)
		})
	}
}

func TestIssuedPEM(t *testing.T) {
	root := catest.NewRoot(t, catest.CAOptions{})
	issuing := root.NewIntermediate(t, catest.CAOptions{}).NewIntermediate(t, catest.CAOptions{})
	a, err := ca.New(ca.Config{Signer: issuing.Signer(t, time.Now())})
	require.NoError(t, err)
	csr, err := ca.ParseCSR(catest.NewCSR(t, catest.NewKey(t, catest.Ed25519), nil))
	require.NoError(t, err)
	iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.NoError(t, err)

	chain := parsePEMCerts(t, iss.ChainPEM())
	require.Len(t, chain, 3, "leaf, issuing CA, intermediate")
	assert.True(t, chain[0].Equal(iss.Certificate))
	assert.True(t, chain[1].Equal(issuing.Cert))
	assert.True(t, chain[2].Equal(issuing.Parent.Cert))
	roots := parsePEMCerts(t, iss.RootsPEM())
	require.Len(t, roots, 1)
	assert.True(t, roots[0].Equal(root.Cert))
	assert.Equal(t, roots, a.Roots())
}

// sanWithOtherName is a SAN extension with the URI uri and an otherName
// entry, which crypto/x509 parses without reporting.
func sanWithOtherName(t *testing.T, uri string) pkix.Extension {
	t.Helper()
	inner, err := asn1.Marshal("admin")
	require.NoError(t, err)
	oid, err := asn1.Marshal(asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 20, 2, 3})
	require.NoError(t, err)
	value, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: inner})
	require.NoError(t, err)
	v, err := asn1.Marshal([]asn1.RawValue{
		{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(uri)},
		{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: append(oid, value...)},
	})
	require.NoError(t, err)
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: v}
}

func parsePEMCerts(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for len(b) > 0 {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		require.Equal(t, "CERTIFICATE", block.Type)
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		out = append(out, c)
	}
	return out
}

func pool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

func TestIssueAgentForRegistration(t *testing.T) {
	a := newTestAuthority(t)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := ca.ParseCSR(catest.NewCSRPEM(t, key, &x509.CertificateRequest{}))
	require.NoError(t, err)
	iss, err := a.IssueAgentFor(context.Background(), csr, catest.AgentID, "0b5f4c1e-2a9d-4c43-9d6e-1f1f2a3b4c5d")
	require.NoError(t, err)
	assert.Equal(t, []string{"0b5f4c1e-2a9d-4c43-9d6e-1f1f2a3b4c5d"}, iss.Certificate.Subject.OrganizationalUnit)
	assert.Equal(t, []string{"relaymesh"}, iss.Certificate.Subject.Organization)
	for _, bad := range []string{"a,b", "x/y", strings.Repeat("a", 65), "uid\n", "ü"} {
		_, err := a.IssueAgentFor(context.Background(), csr, catest.AgentID, bad)
		assert.ErrorIs(t, err, ca.ErrIssuance, "%q", bad)
	}
	plain, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.NoError(t, err)
	assert.Empty(t, plain.Certificate.Subject.OrganizationalUnit)
	assert.Equal(t, a.Chain()[0].Raw, plain.Chain[0].Raw)
}
