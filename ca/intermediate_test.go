package ca_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

// countingSigner counts the calls that reach the signer: "nothing issued"
// means zero.
type countingSigner struct {
	ca.Signer
	calls atomic.Int32
}

func (s *countingSigner) Sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	s.calls.Add(1)
	return s.Signer.Sign(ctx, tmpl, pub)
}

func newMeshRoot(t testing.TB, clock func() time.Time) *ca.MeshRoot {
	t.Helper()
	r, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "vm1", Clock: clock})
	require.NoError(t, err)
	return r
}

func intermediateCSR(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) *x509.CertificateRequest {
	t.Helper()
	csr, err := x509.ParseCertificateRequest(catest.NewCSR(t, key, tmpl))
	require.NoError(t, err)
	return csr
}

// TestIssueIntermediate: with time injected, the intermediate is exactly
// the server's template.
func TestIssueIntermediate(t *testing.T) {
	root := newMeshRoot(t, func() time.Time { return t0 })
	s, err := root.Signer(t0)
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: s, Clock: func() time.Time { return t0 }})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP384)
	req := ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "istiod-istio-system-c1", TrustDomain: "c1.local"}

	iss, err := a.IssueIntermediate(context.Background(), intermediateCSR(t, key, nil), req)
	require.NoError(t, err)
	c := iss.Certificate
	assert.Equal(t, "CN=istiod-istio-system-c1 intermediate,O=vm1", c.Subject.String())
	assert.Equal(t, time.Date(2031, 5, 6, 7, 7, 9, 0, time.UTC), c.NotBefore, "now - 1m backdate, whole seconds")
	assert.Equal(t, time.Date(2032, 5, 5, 7, 8, 9, 0, time.UTC), c.NotAfter, "now + 1 year (365 days), whole seconds")
	assert.Equal(t, 129, c.SerialNumber.BitLen(), "128 random bits")
	assert.Equal(t, []*x509.Certificate{root.Cert}, iss.Chain)
	assert.Equal(t, []*x509.Certificate{root.Cert}, iss.Roots)
	var exts []string
	for _, e := range c.Extensions {
		exts = append(exts, e.Id.String())
	}
	assert.ElementsMatch(t, []string{"2.5.29.15", "2.5.29.19", "2.5.29.14", "2.5.29.35", "2.5.29.30"}, exts, "key usage, basic constraints, key identifiers, name constraints: nothing else")
	for _, e := range c.Extensions {
		if e.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 19}) || e.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 15}) || e.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 30}) {
			assert.True(t, e.Critical, "%v is critical", e.Id)
		}
	}
	_, err = c.Verify(x509.VerifyOptions{Roots: pool(iss.Roots), CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	require.NoError(t, err)
	catest.Lint(t, c)

	t.Run("TTL from the request", func(t *testing.T) {
		r := req
		r.TTL = 90 * 24 * time.Hour
		iss, err := a.IssueIntermediate(context.Background(), intermediateCSR(t, key, nil), r)
		require.NoError(t, err)
		assert.Equal(t, t0.Add(90*24*time.Hour).Truncate(time.Second), iss.Certificate.NotAfter)
	})
	t.Run("TTL from the config", func(t *testing.T) {
		a, err := ca.New(ca.Config{Signer: s, Clock: func() time.Time { return t0 }, IntermediateTTL: 30 * 24 * time.Hour})
		require.NoError(t, err)
		iss, err := a.IssueIntermediate(context.Background(), intermediateCSR(t, key, nil), req)
		require.NoError(t, err)
		assert.Equal(t, t0.Add(30*24*time.Hour).Truncate(time.Second), iss.Certificate.NotAfter)
	})
	t.Run("clamped to the chain", func(t *testing.T) {
		now := root.Cert.NotAfter.Add(-48 * time.Hour)
		a, err := ca.New(ca.Config{Signer: s, Clock: func() time.Time { return now }})
		require.NoError(t, err)
		iss, err := a.IssueIntermediate(context.Background(), intermediateCSR(t, key, nil), req)
		require.NoError(t, err)
		assert.Equal(t, root.Cert.NotAfter, iss.Certificate.NotAfter)
	})
	t.Run("a request with exactly the server's subject", func(t *testing.T) {
		csr := intermediateCSR(t, key, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"vm1"}, CommonName: "istiod-istio-system-c1 intermediate"}})
		_, err := a.IssueIntermediate(context.Background(), csr, req)
		require.NoError(t, err)
	})
	t.Run("a request for what the server issues anyway", func(t *testing.T) {
		csr := intermediateCSR(t, key, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{
			catest.BasicConstraintsPathLenExtension(t, true, 0),
			catest.KeyUsageExtension(t, x509.KeyUsageCertSign|x509.KeyUsageCRLSign),
			{Id: asn1.ObjectIdentifier{2, 5, 29, 14}, Value: []byte{0x04, 0x02, 0x01, 0x02}},
		}})
		iss, err := a.IssueIntermediate(context.Background(), csr, req)
		require.NoError(t, err)
		assert.NotEqual(t, []byte{0x01, 0x02}, iss.Certificate.SubjectKeyId, "the requested SKI is not copied")
	})
	t.Run("a chain of any depth", func(t *testing.T) {
		for _, depth := range []int{1, 2, 4} {
			issuing := catest.NewRoot(t, catest.CAOptions{})
			for range depth - 1 {
				issuing = issuing.NewIntermediate(t, catest.CAOptions{})
			}
			a, err := ca.New(ca.Config{Signer: issuing.Signer(t, time.Now())})
			require.NoError(t, err)
			iss, err := a.IssueIntermediate(context.Background(), intermediateCSR(t, key, nil), req)
			require.NoError(t, err, "depth %d", depth)
			catest.CheckIntermediateCertificate(t, iss, key.Public(), req)
			assert.Len(t, iss.Chain, max(depth-1, 1))
		}
	})
}

// TestIssueIntermediateRejects: a request for anything but the server's
// intermediate, or a key Istio cannot use, fails with a clear error and
// nothing reaches the signer.
func ncRequest(t *testing.T, td string) pkix.Extension {
	t.Helper()
	e, err := ca.NameConstraintsRequest(td)
	require.NoError(t, err)
	return e
}

func TestIssueIntermediateRejects(t *testing.T) {
	root := newMeshRoot(t, nil)
	base, err := root.Signer(time.Now())
	require.NoError(t, err)
	s := &countingSigner{Signer: base}
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(t, err)
	good := ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local"}
	p256 := catest.NewKey(t, catest.ECDSAP256)
	ext := func(e ...pkix.Extension) *x509.CertificateRequest {
		return &x509.CertificateRequest{ExtraExtensions: e}
	}
	tampered, err := x509.ParseCertificateRequest(catest.TamperSignature(catest.NewCSR(t, p256, nil)))
	require.NoError(t, err)

	tests := []struct {
		name string
		csr  *x509.CertificateRequest
		req  ca.IntermediateRequest
		is   error
		want string
	}{
		{"no request", nil, good, ca.ErrInvalidCSR, "no certificate request"},
		{"a DNS name", intermediateCSR(t, p256, &x509.CertificateRequest{DNSNames: []string{"istiod.istio-system.svc"}}), good, ca.ErrInvalidCSR, "subject alternative names"},
		{"a SPIFFE ID", intermediateCSR(t, p256, &x509.CertificateRequest{URIs: []*url.URL{{Scheme: "spiffe", Host: "cluster.local"}}}), good, ca.ErrInvalidCSR, "subject alternative names"},
		{"an IP address", intermediateCSR(t, p256, &x509.CertificateRequest{IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}}), good, ca.ErrInvalidCSR, "subject alternative names"},
		{"an email address", intermediateCSR(t, p256, &x509.CertificateRequest{EmailAddresses: []string{"a@example.test"}}), good, ca.ErrInvalidCSR, "subject alternative names"},
		{"another mesh's subject", intermediateCSR(t, p256, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"vm1"}, CommonName: "mesh2 intermediate"}}), good, ca.ErrInvalidCSR, `requests subject "CN=mesh2 intermediate,O=vm1"; the server issues "CN=mesh1 intermediate,O=vm1"`},
		{"another VirtualMesh's subject", intermediateCSR(t, p256, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"vm2"}, CommonName: "mesh1 intermediate"}}), good, ca.ErrInvalidCSR, "requests subject"},
		{"a subject with more", intermediateCSR(t, p256, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"vm1"}, OrganizationalUnit: []string{"x"}, CommonName: "mesh1 intermediate"}}), good, ca.ErrInvalidCSR, "requests subject"},
		{"pathLen 5", intermediateCSR(t, p256, ext(catest.BasicConstraintsPathLenExtension(t, true, 5))), good, ca.ErrInvalidCSR, "requests pathLen 5; an intermediate gets pathLen 0"},
		{"pathLen 1", intermediateCSR(t, p256, ext(catest.BasicConstraintsPathLenExtension(t, true, 1))), good, ca.ErrInvalidCSR, "requests pathLen 1"},
		{"a CA without path length limit", intermediateCSR(t, p256, ext(catest.BasicConstraintsExtension(t, true))), good, ca.ErrInvalidCSR, "without a path length limit"},
		{"not a CA", intermediateCSR(t, p256, ext(catest.BasicConstraintsExtension(t, false))), good, ca.ErrInvalidCSR, "not a CA"},
		{"digitalSignature", intermediateCSR(t, p256, ext(catest.KeyUsageExtension(t, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature))), good, ca.ErrInvalidCSR, "requests digitalSignature key usage"},
		{"keyEncipherment", intermediateCSR(t, p256, ext(catest.KeyUsageExtension(t, x509.KeyUsageKeyEncipherment))), good, ca.ErrInvalidCSR, "requests keyEncipherment key usage"},
		{"an extended key usage", intermediateCSR(t, p256, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 37}, Value: mustMarshal(t, []asn1.ObjectIdentifier{{1, 3, 6, 1, 5, 5, 7, 3, 1}})}}}), good, ca.ErrInvalidCSR, "extended key usages"},
		{"a malformed basicConstraints", intermediateCSR(t, p256, ext(pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Value: []byte{0x30, 0x03, 0x01, 0x01}})), good, ca.ErrInvalidCSR, "malformed basicConstraints"},
		{"a bad self-signature", tampered, good, ca.ErrInvalidCSR, "no proof of possession"},
		{"a P-224 key", intermediateCSR(t, catest.NewKey(t, catest.ECDSAP224), nil), good, ca.ErrKeyPolicy, "ECDSA curve P-224"},
		{"a P-521 key", intermediateCSR(t, catest.NewKey(t, catest.ECDSAP521), nil), good, ca.ErrKeyPolicy, "ECDSA curve P-521"},
		{"an RSA-2048 key", intermediateCSR(t, catest.NewKey(t, catest.RSA2048), nil), good, ca.ErrKeyPolicy, "RSA key of 2048 bits (allowed for intermediates: ECDSA P-256, P-384, RSA of 3072 to 8192 bits)"},
		{"an RSA-1024 key", intermediateCSR(t, catest.NewKey(t, catest.RSA1024), nil), good, ca.ErrKeyPolicy, "RSA key of 1024 bits"},
		{"an Ed25519 key", intermediateCSR(t, catest.NewKey(t, catest.Ed25519), nil), good, ca.ErrKeyPolicy, "Ed25519 keys are not supported for Istio's plugged-in CA"},
		{"no VirtualMesh", intermediateCSR(t, p256, nil), ca.IntermediateRequest{Mesh: "mesh1"}, ca.ErrIssuance, "VirtualMesh name \"\": empty"},
		{"no mesh", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1"}, ca.ErrIssuance, "mesh name \"\": empty"},
		{"a mesh name too long for the common name", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: strings.Repeat("m", ca.MaxMeshNameLen+1), TrustDomain: "cluster.local"}, ca.ErrIssuance, "52 bytes long, at most 51"},
		{"a mesh name with a comma", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1,O=evil"}, ca.ErrIssuance, "character ',' is not allowed"},
		{"a TTL too long", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local", TTL: 3 * 365 * 24 * time.Hour}, ca.ErrIssuance, "intermediate TTL 26280h0m0s is outside"},
		{"a TTL too short", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local", TTL: time.Second}, ca.ErrIssuance, "intermediate TTL 1s is outside"},
		{"no trust domain", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1"}, ca.ErrIssuance, "trust domain: empty"},
		{"a trust domain with a path", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local/ns"}, ca.ErrIssuance, "is not a SPIFFE trust domain"},
		{"an upper-case trust domain", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "Cluster.Local"}, ca.ErrIssuance, "is not a SPIFFE trust domain"},
		{"a trust domain too long", intermediateCSR(t, p256, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: strings.Repeat("a", 256)}, ca.ErrIssuance, "256 bytes long, at most 255"},
		// Name constraints in the request are the issuer's to check: only
		// exactly the trust domain's are accepted.
		{"empty name constraints", intermediateCSR(t, p256, ext(pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 30}, Critical: true, Value: []byte{0x30, 0x00}})), good, ca.ErrInvalidCSR, "name constraints: requests other name constraints"},
		{"another trust domain's name constraints", intermediateCSR(t, p256, ext(ncRequest(t, "other.local"))), good, ca.ErrInvalidCSR, `name constraints: requests other name constraints than the server issues (URIs of trust domain "cluster.local" only`},
		{"non-critical name constraints", intermediateCSR(t, p256, ext(func() pkix.Extension { e := ncRequest(t, "cluster.local"); e.Critical = false; return e }())), good, ca.ErrInvalidCSR, "name constraints: requests other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			iss, err := a.IssueIntermediate(context.Background(), tt.csr, tt.req)
			require.Error(t, err)
			t.Logf("error: %v", err)
			assert.ErrorIs(t, err, tt.is)
			assert.ErrorContains(t, err, tt.want)
			assert.Nil(t, iss)
			assert.Zero(t, s.calls.Load(), "nothing reached the signer")
			if tt.csr != nil && tt.is != ca.ErrIssuance {
				_, perr := ca.ParseIntermediateCSR(tt.csr.Raw)
				if strings.Contains(tt.name, "subject") || strings.Contains(tt.name, "name constraints") {
					assert.NoError(t, perr, "the subject and name constraints are IssueIntermediate's to check")
				} else {
					assert.ErrorIs(t, perr, tt.is, "ParseIntermediateCSR refuses it too")
				}
			}
		})
	}
	t.Run("an agent's request parser refuses what an intermediate request asks", func(t *testing.T) {
		_, err := ca.ParseCSR(catest.NewCSR(t, p256, ext(catest.BasicConstraintsPathLenExtension(t, true, 0))))
		require.ErrorIs(t, err, ca.ErrInvalidCSR)
	})
}

// TestIssueIntermediateSignerCannotSignCA: a chain whose path length
// constraints leave no room for one more CA is refused before anything is
// signed, with a message that names the certificate in the way.
func TestIssueIntermediateSignerCannotSignCA(t *testing.T) {
	relay := newRelayCA(t, ca.GenerateConfig{})
	relaySigner, err := relay.Signer(time.Now())
	require.NoError(t, err)
	rootPathLen1 := catest.NewRoot(t, catest.CAOptions{Name: "root pathLen 1", MaxPathLen: 1})
	underRoot1 := rootPathLen1.NewIntermediate(t, catest.CAOptions{Name: "issuing, no pathLen"})
	interPathLen1 := catest.NewRoot(t, catest.CAOptions{}).NewIntermediate(t, catest.CAOptions{Name: "intermediate pathLen 1", MaxPathLen: 1})
	underInter1 := interPathLen1.NewIntermediate(t, catest.CAOptions{Name: "issuing below it"})

	tests := []struct {
		name string
		s    ca.Signer
		want string
	}{
		{"the relay CA's issuing CA (pathLen 0)", relaySigner, `the issuing CA certificate "CN=relaymesh relay issuing CA,O=relaymesh"`},
		{"an issuing CA with pathLen 0", catest.NewRoot(t, catest.CAOptions{}).NewIntermediate(t, catest.CAOptions{Name: "zero", PathLenZero: true}).Signer(t, time.Now()), "has pathLen 0: it may not sign another CA"},
		{"a root with pathLen 1 above an issuing CA", underRoot1.Signer(t, time.Now()), `"CN=root pathLen 1,O=catest"`},
		{"an intermediate with pathLen 1 above an issuing CA", underInter1.Signer(t, time.Now()), `"CN=intermediate pathLen 1,O=catest"`},
	}
	key := catest.NewKey(t, catest.ECDSAP256)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := &countingSigner{Signer: tt.s}
			a, err := ca.New(ca.Config{Signer: cs})
			require.NoError(t, err)
			iss, err := a.IssueIntermediate(context.Background(), intermediateCSR(t, key, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local"})
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			t.Logf("error: %v", err)
			assert.ErrorContains(t, err, tt.want)
			assert.ErrorContains(t, err, "cannot issue intermediates")
			assert.Nil(t, iss)
			assert.Zero(t, cs.calls.Load(), "nothing reached the signer")

			// It still issues leaves.
			_, err = a.IssueAgent(context.Background(), parseCSR(t, key), catest.AgentID)
			assert.NoError(t, err)
		})
	}

	t.Run("a root with pathLen 2 above an issuing CA leaves room", func(t *testing.T) {
		issuing := catest.NewRoot(t, catest.CAOptions{MaxPathLen: 2}).NewIntermediate(t, catest.CAOptions{MaxPathLen: 1})
		a, err := ca.New(ca.Config{Signer: issuing.Signer(t, time.Now())})
		require.NoError(t, err)
		_, err = a.IssueIntermediate(context.Background(), intermediateCSR(t, key, nil), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local"})
		require.NoError(t, err)
	})
}

// TestIssueIntermediateFailsClosed: a signer that returns anything but the
// intermediate that was asked for gets it rejected.
func TestIssueIntermediateFailsClosed(t *testing.T) {
	root := newMeshRoot(t, nil)
	other := newMeshRoot(t, nil)
	real, err := root.Signer(time.Now())
	require.NoError(t, err)
	mutated := func(issuer *x509.Certificate, key crypto.Signer, f func(c *x509.Certificate)) ca.Signer {
		return &fakeSigner{chain: real.Chain(), roots: real.Roots(), sign: func(_ context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
			c := *tmpl
			f(&c)
			der, err := x509.CreateCertificate(rand.Reader, &c, issuer, pub, key)
			if err != nil {
				return nil, err
			}
			return x509.ParseCertificate(der)
		}}
	}
	mut := func(f func(c *x509.Certificate)) ca.Signer { return mutated(root.Cert, root.Key, f) }
	tests := []struct {
		name string
		s    ca.Signer
		want string
	}{
		{"control: unchanged", mut(func(*x509.Certificate) {}), ""},
		{"not a CA", mut(func(c *x509.Certificate) { c.IsCA, c.MaxPathLenZero = false, false }), "is not a CA"},
		{"pathLen 1", mut(func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = 1, false }), "pathLen is 1, want 0"},
		{"no pathLen", mut(func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = -1, false }), "pathLen is unset, want 0"},
		{"adds digitalSignature", mut(func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageDigitalSignature }), "key usage"},
		{"drops cRLSign", mut(func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageCertSign }), "key usage"},
		{"adds serverAuth", mut(func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }), "extended key usages"},
		{"adds a DNS name", mut(func(c *x509.Certificate) { c.DNSNames = []string{"istiod.istio-system.svc"} }), "subject alternative names"},
		{"adds a SPIFFE ID", mut(func(c *x509.Certificate) { c.URIs = []*url.URL{{Scheme: "spiffe", Host: "cluster.local"}} }), "subject alternative names"},
		{"adds DNS name constraints", mut(func(c *x509.Certificate) { c.PermittedDNSDomains = []string{"example.test"} }), "want URI constraints only"},
		{"drops the name constraints", mut(func(c *x509.Certificate) {
			c.PermittedURIDomains, c.ExcludedURIDomains, c.PermittedDNSDomainsCritical = nil, nil, false
		}), "name constraints permit URIs of []"},
		{"widens the name constraints", mut(func(c *x509.Certificate) { c.PermittedURIDomains = []string{"local"} }), `name constraints permit URIs of ["local"]`},
		{"drops the subdomain exclusion", mut(func(c *x509.Certificate) { c.ExcludedURIDomains = nil }), "exclude []"},
		{"makes the name constraints non-critical", mut(func(c *x509.Certificate) { c.PermittedDNSDomainsCritical = false }), "name constraints critical is false"},
		{"adds an AIA", mut(func(c *x509.Certificate) { c.IssuingCertificateURL = []string{"http://ca.example.test/ca.crt"} }), "unexpected extension 1.3.6.1.5.5.7.1.1"},
		{"changes the subject", mut(func(c *x509.Certificate) { c.Subject.CommonName = "mesh2 intermediate" }), "subject"},
		{"changes the serial", mut(func(c *x509.Certificate) { c.SerialNumber = big.NewInt(7) }), "serial number"},
		{"extends NotAfter", mut(func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(time.Hour) }), "notAfter"},
		{"signed by another root with the same name", mutated(other.Cert, other.Key, func(*x509.Certificate) {}), "not signed by the issuing CA"},
		{"fails", &fakeSigner{chain: real.Chain(), roots: real.Roots(), sign: func(context.Context, *x509.Certificate, crypto.PublicKey) (*x509.Certificate, error) {
			return nil, errors.New("HSM unplugged")
		}}, "HSM unplugged"},
	}
	key := catest.NewKey(t, catest.ECDSAP256)
	req := ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ca.New(ca.Config{Signer: tt.s})
			require.NoError(t, err)
			iss, err := a.IssueIntermediate(context.Background(), intermediateCSR(t, key, nil), req)
			if tt.want == "" {
				require.NoError(t, err)
				catest.CheckIntermediateCertificate(t, iss, key.Public(), req)
				return
			}
			require.ErrorIs(t, err, ca.ErrIssuance)
			assert.ErrorContains(t, err, tt.want)
			assert.Nil(t, iss)
		})
	}
}

// TestIntermediateLeeway: a remote CA's Leeway applies to intermediates as
// to leaves, and covers nothing of the CA fields.
func TestIntermediateLeeway(t *testing.T) {
	root := newMeshRoot(t, nil)
	const l = 2 * time.Minute
	both := ca.Leeway{Serial: true, Validity: l}
	tests := []struct {
		name   string
		mutate func(c *x509.Certificate)
		want   string
	}{
		{"the CA picks the serial", func(c *x509.Certificate) { c.SerialNumber = serialOfBits(t, 120) }, ""},
		{"the CA moves NotAfter within the leeway", func(c *x509.Certificate) { c.NotAfter = c.NotAfter.Add(-l + time.Second) }, ""},
		{"the CA issues a sequential serial", func(c *x509.Certificate) { c.SerialNumber = big.NewInt(12) }, "sequential or short"},
		{"the CA drops pathLen 0", func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = -1, false }, "pathLen is unset"},
		{"the CA adds its own extension", func(c *x509.Certificate) {
			c.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 37476, 9000, 64, 1}, Value: []byte{0x05, 0x00}}}
		}, "unexpected extension"},
	}
	key := catest.NewKey(t, catest.RSA3072)
	csr := intermediateCSR(t, key, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &remoteSigner{chain: []*x509.Certificate{root.Cert}, roots: []*x509.Certificate{root.Cert}, issuer: root.Cert, key: root.Key, leeway: both, mutate: tt.mutate}
			a, err := ca.New(ca.Config{Signer: s})
			require.NoError(t, err)
			iss, err := a.IssueIntermediate(context.Background(), csr, ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local"})
			assert.Equal(t, int32(1), s.requests.Load(), "SignRequest was called once, with the request")
			if tt.want == "" {
				require.NoError(t, err)
				catest.CheckIntermediateCertificate(t, iss, key.Public(), ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "mesh1", TrustDomain: "cluster.local"})
				return
			}
			require.ErrorIs(t, err, ca.ErrIssuance)
			assert.ErrorContains(t, err, tt.want)
			assert.Nil(t, iss)
		})
	}
}

func FuzzParseIntermediateCSR(f *testing.F) {
	for _, kt := range append(append([]catest.KeyType{}, catest.IntermediateKeyTypes...), catest.Ed25519, catest.RSA2048, catest.ECDSAP224) {
		der := catest.NewCSR(f, catest.NewKey(f, kt), nil)
		f.Add(der)
		f.Add(catest.CSRPEM(der))
		f.Add(catest.TamperSignature(der))
		f.Add(der[:len(der)-7])
	}
	key := catest.NewKey(f, catest.ECDSAP256)
	for _, e := range []pkix.Extension{
		catest.BasicConstraintsPathLenExtension(f, true, 0),
		catest.BasicConstraintsPathLenExtension(f, true, 5),
		catest.BasicConstraintsExtension(f, true),
		catest.KeyUsageExtension(f, x509.KeyUsageCertSign|x509.KeyUsageCRLSign),
		catest.KeyUsageExtension(f, x509.KeyUsageDigitalSignature),
	} {
		f.Add(catest.NewCSR(f, key, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{e}}))
	}
	f.Add(catest.NewCSR(f, key, &x509.CertificateRequest{DNSNames: []string{"a.example"}, Subject: pkix.Name{CommonName: "mesh1 intermediate"}}))
	f.Add([]byte{})
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"))

	f.Fuzz(func(t *testing.T, b []byte) {
		csr, err := ca.ParseIntermediateCSR(b)
		if err != nil {
			if csr != nil {
				t.Fatal("a request was returned with an error")
			}
			if !errors.Is(err, ca.ErrInvalidCSR) && !errors.Is(err, ca.ErrKeyPolicy) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("accepted a request with a bad signature: %v", err)
		}
		if !allowedKey(csr.PublicKey) || isEd25519OrSmallRSA(csr.PublicKey) {
			t.Fatalf("accepted a %T key", csr.PublicKey)
		}
		if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.URIs)+len(csr.EmailAddresses) != 0 {
			t.Fatal("accepted a request for names")
		}
		if len(b) > ca.MaxCSRSize {
			t.Fatalf("accepted %d bytes", len(b))
		}
	})
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := asn1.Marshal(v)
	require.NoError(t, err)
	return b
}

func parseCSR(t testing.TB, key crypto.Signer) *x509.CertificateRequest {
	t.Helper()
	csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	return csr
}
