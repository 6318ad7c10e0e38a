package ca_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

// remoteSigner plays a remote CA: it needs a certificate request, declares
// a Leeway, and signs a changed copy of the template with an in-memory CA.
type remoteSigner struct {
	chain, roots []*x509.Certificate
	issuer       *x509.Certificate
	key          crypto.Signer
	leeway       ca.Leeway
	mutate       func(c *x509.Certificate)
	requests     atomic.Int32
}

func newRemoteSigner(t testing.TB, leeway ca.Leeway, mutate func(c *x509.Certificate)) *remoteSigner {
	t.Helper()
	r := newRelayCA(t, ca.GenerateConfig{})
	return &remoteSigner{chain: []*x509.Certificate{r.Issuer}, roots: []*x509.Certificate{r.Root}, issuer: r.Issuer, key: r.IssuerKey, leeway: leeway, mutate: mutate}
}

func (s *remoteSigner) Sign(context.Context, *x509.Certificate, crypto.PublicKey) (*x509.Certificate, error) {
	return nil, ca.ErrNeedsRequest
}

func (s *remoteSigner) SignRequest(_ context.Context, tmpl *x509.Certificate, csr *x509.CertificateRequest) (*x509.Certificate, error) {
	s.requests.Add(1)
	c := *tmpl
	if s.mutate != nil {
		s.mutate(&c)
	}
	der, err := x509.CreateCertificate(rand.Reader, &c, s.issuer, csr.PublicKey, s.key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func (s *remoteSigner) Chain() []*x509.Certificate {
	return append([]*x509.Certificate(nil), s.chain...)
}
func (s *remoteSigner) Roots() []*x509.Certificate {
	return append([]*x509.Certificate(nil), s.roots...)
}
func (s *remoteSigner) Leeway() ca.Leeway { return s.leeway }

// serialOfBits is a random positive serial exactly bits long.
func serialOfBits(t testing.TB, bits int) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), uint(bits-1)))
	require.NoError(t, err)
	return n.SetBit(n, bits-1, 1)
}

// TestLeeway: a signer's Leeway relaxes exactly the fields it names, within
// bounds, and nothing else.
func TestLeeway(t *testing.T) {
	const l = 2 * time.Minute
	both := ca.Leeway{Serial: true, Validity: l}
	tests := []struct {
		name   string
		leeway ca.Leeway
		mutate func(c *x509.Certificate)
		want   string // "" for success
	}{
		{"CA picks a 159-bit serial", both, func(c *x509.Certificate) { c.SerialNumber = serialOfBits(t, 159) }, ""},
		{"CA picks a 96-bit serial", both, func(c *x509.Certificate) { c.SerialNumber = serialOfBits(t, ca.MinRemoteSerialBits) }, ""},
		{"CA picks a 95-bit serial", both, func(c *x509.Certificate) { c.SerialNumber = serialOfBits(t, ca.MinRemoteSerialBits-1) }, "95 bits long, want at least 96"},
		{"CA picks a sequential serial", both, func(c *x509.Certificate) { c.SerialNumber = big.NewInt(1042) }, "sequential or short"},
		{"CA picks a 160-bit serial (21 octets)", both, func(c *x509.Certificate) { c.SerialNumber = serialOfBits(t, 160) }, "more than 20 octets"},
		{"no serial leeway: serial must be ours", ca.Leeway{Validity: l}, func(c *x509.Certificate) { c.SerialNumber = serialOfBits(t, 159) }, "serial number is"},
		// The Authority backdates by 1m, so 59s later is still valid now.
		{"notBefore later within leeway", both, func(c *x509.Certificate) { c.NotBefore = c.NotBefore.Add(59 * time.Second) }, ""},
		{"notBefore later within leeway, but in the future", both, func(c *x509.Certificate) { c.NotBefore = c.NotBefore.Add(l - time.Second) }, "not yet valid"},
		{"notBefore earlier within leeway", both, func(c *x509.Certificate) {
			c.NotBefore = c.NotBefore.Add(-l + time.Second)
		}, ""},
		{"notBefore beyond leeway", both, func(c *x509.Certificate) { c.NotBefore = c.NotBefore.Add(-l - time.Second) }, "notBefore is"},
		{"notAfter shorter within leeway", both, func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(-l + time.Second) }, ""},
		{"notAfter longer within leeway", both, func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(l - time.Second) }, ""},
		{"notAfter much shorter", both, func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(-time.Hour) }, "notAfter is"},
		{"notAfter much longer", both, func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(time.Hour) }, "notAfter is"},
		{"no validity leeway: validity must be ours", ca.Leeway{Serial: true}, func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(-time.Second) }, "notAfter is"},
		// Everything else stays exact.
		{"leeway does not cover the subject", both, func(c *x509.Certificate) { c.Subject.CommonName = "admin" }, "subject"},
		{"leeway does not cover SANs", both, func(c *x509.Certificate) { c.DNSNames = []string{"evil.example.test"} }, "DNS names"},
		{"leeway does not cover key usage", both, func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageKeyEncipherment }, "key usage"},
		{"leeway does not cover extended key usage", both, func(c *x509.Certificate) {
			c.ExtKeyUsage = append(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		}, "extended key usage"},
		{"leeway does not cover basic constraints", both, func(c *x509.Certificate) { c.IsCA = true }, "CA"},
		{"leeway does not cover extensions", both, func(c *x509.Certificate) {
			c.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 37476, 9000, 64, 1}, Value: []byte{0x05, 0x00}}}
		}, "unexpected extension"},
	}
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newRemoteSigner(t, tt.leeway, tt.mutate)
			a, err := ca.New(ca.Config{Signer: s})
			require.NoError(t, err)
			iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
			assert.Equal(t, int32(1), s.requests.Load(), "SignRequest was called once")
			if tt.want == "" {
				require.NoError(t, err)
				catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)
				return
			}
			require.ErrorIs(t, err, ca.ErrIssuance)
			assert.ErrorContains(t, err, tt.want)
			assert.Nil(t, iss)
		})
	}
}

// TestLeewayNeverOutlivesTheChain: even within its leeway, a certificate
// may not start before its issuer or end after any CA of the chain.
func TestLeewayNeverOutlivesTheChain(t *testing.T) {
	s := newRemoteSigner(t, ca.Leeway{Validity: 5 * time.Minute}, func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(time.Minute) })
	end := s.chain[0].NotAfter
	a, err := ca.New(ca.Config{Signer: s, Clock: func() time.Time { return end.Add(-time.Hour) }})
	require.NoError(t, err)
	csr, err := ca.ParseCSR(catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), nil))
	require.NoError(t, err)
	iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.ErrorIs(t, err, ca.ErrIssuance)
	assert.ErrorContains(t, err, "outlives")
	assert.Nil(t, iss)

	s = newRemoteSigner(t, ca.Leeway{Validity: 5 * time.Minute}, func(c *x509.Certificate) { c.NotBefore = c.NotBefore.Add(-time.Minute) })
	start := s.chain[0].NotBefore
	a, err = ca.New(ca.Config{Signer: s, Clock: func() time.Time { return start.Add(time.Second) }})
	require.NoError(t, err)
	iss, err = a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.ErrorIs(t, err, ca.ErrIssuance)
	assert.ErrorContains(t, err, "before the issuing CA's")
	assert.Nil(t, iss)
}

func TestNewRefusesLeewayBeyondBounds(t *testing.T) {
	for _, v := range []time.Duration{-time.Second, ca.MaxValidityLeeway + time.Second} {
		a, err := ca.New(ca.Config{Signer: newRemoteSigner(t, ca.Leeway{Validity: v}, nil)})
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.ErrorContains(t, err, "validity leeway")
		assert.Nil(t, a)
	}
	_, err := ca.New(ca.Config{Signer: newRemoteSigner(t, ca.Leeway{Validity: ca.MaxValidityLeeway}, nil)})
	assert.NoError(t, err)
}

// TestRequestSigner: a signer that needs proof of possession gets the
// checked request, and a bare public key is refused before it is asked.
func TestRequestSigner(t *testing.T) {
	s := newRemoteSigner(t, ca.Leeway{}, nil)
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP256)
	names, ips := []string{"relay.example.test"}, []net.IP{net.IPv4(127, 0, 0, 1)}

	iss, err := a.IssueServer(context.Background(), key.Public(), names, ips)
	require.ErrorIs(t, err, ca.ErrIssuance)
	require.ErrorIs(t, err, ca.ErrNeedsRequest)
	assert.Nil(t, iss)
	assert.Zero(t, s.requests.Load())

	csr, err := ca.ParseCSR(catest.NewCSR(t, key, &x509.CertificateRequest{DNSNames: []string{"evil.example.test"}}))
	require.NoError(t, err)
	iss, err = a.IssueServerRequest(context.Background(), csr, names, ips)
	require.NoError(t, err)
	assert.Equal(t, int32(1), s.requests.Load())
	assert.Equal(t, names, iss.Certificate.DNSNames, "requested names are ignored")
	assert.True(t, key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(iss.Certificate.PublicKey))
}

func TestIssueServerRequest(t *testing.T) {
	a := newTestAuthority(t)
	key := catest.NewKey(t, catest.RSA2048)
	csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	iss, err := a.IssueServerRequest(context.Background(), csr, []string{"relay.example.test"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, iss.Certificate.ExtKeyUsage)
	assert.Equal(t, x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment, iss.Certificate.KeyUsage)

	_, err = a.IssueServerRequest(context.Background(), nil, []string{"relay.example.test"}, nil)
	require.ErrorIs(t, err, ca.ErrInvalidCSR)

	caCSR := catest.NewCSR(t, key, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{catest.BasicConstraintsExtension(t, true)}})
	parsed, err := x509.ParseCertificateRequest(caCSR)
	require.NoError(t, err)
	_, err = a.IssueServerRequest(context.Background(), parsed, []string{"relay.example.test"}, nil)
	require.ErrorIs(t, err, ca.ErrInvalidCSR)

	_, err = a.IssueServerRequest(context.Background(), csr, nil, nil)
	require.ErrorIs(t, err, ca.ErrIssuance)
}
