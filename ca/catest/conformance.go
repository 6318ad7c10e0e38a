package catest

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
)

// AgentID is the SPIFFE ID tests issue agent certificates for.
var AgentID = spiffeid.RequireFromString("spiffe://relay.test/cluster/c1/agent")

// Intermediate is the request tests issue mesh intermediates for.
var Intermediate = ca.IntermediateRequest{VirtualMesh: "vm1", Mesh: "istiod-istio-system-c1", TrustDomain: WorkloadID.TrustDomain().Name()}

// WorkloadID is the SPIFFE ID of the workload certificates tests sign with
// an intermediate, as istiod would.
var WorkloadID = spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/sleep")

// conformanceIssuances is how many certificates the serial number check
// issues.
const conformanceIssuances = 50

// RunSignerConformance checks that a ca.Signer back end keeps the Signer
// contract, by issuing through a ca.Authority. newSigner is called once per
// subtest and must return a signer valid now, with a chain that is valid
// for at least another two hours.
//
// Every certificate the suite issues must pass Lint. The "intermediate"
// subtest issues a mesh intermediate for each of IntermediateKeyTypes,
// signs a workload certificate with its key (as istiod does) and checks
// that it verifies to the roots through the chain and the intermediate,
// and that a CA below the intermediate is refused by path validation. A
// signer whose chain cannot sign another CA (see CanSignCA) must instead
// refuse with ca.ErrInvalidSigner; the suite then checks only that.
//
// The suite is strict: certificates must be exactly what was asked for.
// Only a signer that declares a ca.Leeway gets it, and only for what it
// declares: serial numbers then need ca.MinRemoteSerialBits instead of
// 128 bits, and with a validity leeway the issuing CA uses its own clock,
// so an Authority whose clock is an hour off is refused rather than
// clamped. A ca.RequestSigner is given certificate requests, and must
// refuse a bare public key with ca.ErrNeedsRequest.
func RunSignerConformance(t *testing.T, newSigner func(t *testing.T) ca.Signer) {
	t.Run("chain and roots", func(t *testing.T) {
		s := newSigner(t)
		chain, roots := s.Chain(), s.Roots()
		require.NotEmpty(t, chain, "Chain")
		require.NotEmpty(t, roots, "Roots")
		assert.True(t, chain[0].IsCA && chain[0].BasicConstraintsValid, "Chain()[0] is a CA")
		assert.NotZero(t, chain[0].KeyUsage&x509.KeyUsageCertSign, "Chain()[0] has keyCertSign")
		_, err := chain[0].Verify(x509.VerifyOptions{
			Roots:         pool(roots),
			Intermediates: pool(chain[1:]),
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		})
		require.NoError(t, err, "Chain verifies to Roots")

		// The slices are the caller's to modify.
		chain[0], roots[0] = nil, nil
		assert.NotNil(t, s.Chain()[0], "Chain returns a new slice")
		assert.NotNil(t, s.Roots()[0], "Roots returns a new slice")
	})

	t.Run("agent certificates for every allowed key type", func(t *testing.T) {
		s := newSigner(t)
		a := newAuthority(t, ca.Config{Signer: s})
		for _, kt := range AllowedKeyTypes {
			t.Run(string(kt), func(t *testing.T) {
				key := NewKey(t, kt)
				csr := parseCSR(t, NewCSR(t, key, nil))
				iss, err := a.IssueAgent(context.Background(), csr, AgentID)
				require.NoError(t, err)
				CheckAgentCertificate(t, iss, key.Public(), AgentID)
				assert.Equal(t, x509.KeyUsageDigitalSignature, iss.Certificate.KeyUsage, "digitalSignature only, for every key type (RFC 5280, 4.2.1.12)")
			})
		}
	})

	t.Run("serial numbers are random, unique and long", func(t *testing.T) {
		s := newSigner(t)
		a := newAuthority(t, ca.Config{Signer: s})
		minBits := 128
		if ca.SignerLeeway(s).Serial {
			minBits = ca.MinRemoteSerialBits
		}
		key := NewKey(t, ECDSAP256)
		csr := parseCSR(t, NewCSR(t, key, nil))
		seen := map[string]bool{}
		var prev *x509.Certificate
		for range conformanceIssuances {
			iss, err := a.IssueAgent(context.Background(), csr, AgentID)
			require.NoError(t, err)
			sn := iss.Certificate.SerialNumber
			require.Positive(t, sn.Sign(), "serial is positive")
			require.GreaterOrEqual(t, sn.BitLen(), minBits, "serial bits")
			require.False(t, seen[sn.String()], "serial %v issued twice", sn)
			Lint(t, iss.Certificate)
			seen[sn.String()] = true
			if prev != nil {
				d := new(big.Int).Sub(sn, prev.SerialNumber)
				require.False(t, d.IsInt64() && d.Int64() >= -1000 && d.Int64() <= 1000, "serials %v and %v are close: not random", prev.SerialNumber, sn)
			}
			prev = iss.Certificate
		}
	})

	t.Run("NotAfter is clamped to the issuing CA", func(t *testing.T) {
		s := newSigner(t)
		chain, roots := s.Chain(), s.Roots()
		caEnd := chain[0].NotAfter
		for _, c := range chain {
			if c.NotAfter.Before(caEnd) {
				caEnd = c.NotAfter
			}
		}
		for _, r := range roots {
			if r.NotAfter.Before(caEnd) {
				t.Skip("a root expires before the issuing CA; nothing to clamp to")
			}
		}
		// An hour before the CA expires, a 24h certificate must end with it.
		now := caEnd.Add(-time.Hour)
		a := newAuthority(t, ca.Config{Signer: s, Clock: func() time.Time { return now }, AgentTTL: 24 * time.Hour})
		key := NewKey(t, ECDSAP256)
		iss, err := a.IssueAgent(context.Background(), parseCSR(t, NewCSR(t, key, nil)), AgentID)
		if ca.SignerLeeway(s).Validity > 0 {
			// The CA sets the validity from its own clock, which is
			// months away from this Authority's: fail closed.
			require.ErrorIs(t, err, ca.ErrIssuance)
			assert.ErrorContains(t, err, "notBefore")
			assert.Nil(t, iss)
			return
		}
		require.NoError(t, err)
		Lint(t, iss.Certificate)
		assert.True(t, iss.Certificate.NotAfter.Equal(caEnd), "NotAfter %v, want the CA's %v", iss.Certificate.NotAfter, caEnd)
		verify(t, iss, now, x509.ExtKeyUsageClientAuth)
	})

	t.Run("server certificate", func(t *testing.T) {
		s := newSigner(t)
		a := newAuthority(t, ca.Config{Signer: s})
		key := NewKey(t, ECDSAP256)
		names, ips := []string{"relay.example.test"}, []net.IP{net.IPv4(127, 0, 0, 1)}
		iss, err := a.IssueServer(context.Background(), key.Public(), names, ips)
		if _, ok := s.(ca.RequestSigner); ok {
			require.ErrorIs(t, err, ca.ErrNeedsRequest, "a bare public key needs proof of possession")
			assert.Nil(t, iss)
			iss, err = a.IssueServerRequest(context.Background(), parseCSR(t, NewCSR(t, key, nil)), names, ips)
		}
		require.NoError(t, err)
		c := iss.Certificate
		Lint(t, c)
		assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, c.ExtKeyUsage)
		assert.Equal(t, []string{"relay.example.test"}, c.DNSNames)
		assert.Empty(t, c.URIs)
		assert.False(t, c.IsCA)
		assert.NoError(t, c.VerifyHostname("relay.example.test"))
		assert.NoError(t, c.VerifyHostname("127.0.0.1"))
		verify(t, iss, time.Now(), x509.ExtKeyUsageServerAuth)
		_, err = c.Verify(verifyOptions(iss, time.Now(), x509.ExtKeyUsageClientAuth))
		assert.Error(t, err, "a server certificate must not verify for clientAuth")
	})

	t.Run("leaves of another CA do not verify", func(t *testing.T) {
		s := newSigner(t)
		a := newAuthority(t, ca.Config{Signer: s})
		other, err := ca.GenerateRelayCA(ca.GenerateConfig{})
		require.NoError(t, err)
		otherSigner, err := other.Signer(time.Now())
		require.NoError(t, err)
		b := newAuthority(t, ca.Config{Signer: otherSigner})
		csr := parseCSR(t, NewCSR(t, NewKey(t, ECDSAP256), nil))

		ours, err := a.IssueAgent(context.Background(), csr, AgentID)
		require.NoError(t, err)
		Lint(t, ours.Certificate)
		theirs, err := b.IssueAgent(context.Background(), csr, AgentID)
		require.NoError(t, err)

		both := append(s.Chain(), otherSigner.Chain()...)
		_, err = theirs.Certificate.Verify(x509.VerifyOptions{
			Roots: pool(s.Roots()), Intermediates: pool(both),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		assert.Error(t, err, "another CA's leaf verified against this signer's roots")
		_, err = ours.Certificate.Verify(x509.VerifyOptions{
			Roots: pool(otherSigner.Roots()), Intermediates: pool(both),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		assert.Error(t, err, "this signer's leaf verified against another CA's roots")
	})

	t.Run("Sign honours a done context", func(t *testing.T) {
		s := newSigner(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		key := NewKey(t, ECDSAP256)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1),
			NotBefore:    time.Now().Add(-time.Minute),
			NotAfter:     time.Now().Add(time.Hour),
		}
		c, err := s.Sign(ctx, tmpl, key.Public())
		assert.Error(t, err)
		assert.Nil(t, c)
		if rs, ok := s.(ca.RequestSigner); ok {
			c, err := rs.SignRequest(ctx, tmpl, parseCSR(t, NewCSR(t, key, nil)))
			assert.Error(t, err)
			assert.Nil(t, c)
		}
	})

	t.Run("concurrent issuance", func(t *testing.T) {
		s := newSigner(t)
		a := newAuthority(t, ca.Config{Signer: s})
		csr := parseCSR(t, NewCSR(t, NewKey(t, ECDSAP256), nil))
		var wg sync.WaitGroup
		errs := make(chan error, 8*4)
		certs := make(chan *x509.Certificate, 8*4)
		for range 8 {
			wg.Go(func() {
				for range 4 {
					iss, err := a.IssueAgent(context.Background(), csr, AgentID)
					errs <- err
					if err == nil {
						certs <- iss.Certificate
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		close(certs)
		for err := range errs {
			require.NoError(t, err)
		}
		for c := range certs {
			Lint(t, c)
		}
	})

	t.Run("intermediate", func(t *testing.T) {
		s := newSigner(t)
		a := newAuthority(t, ca.Config{Signer: s})
		if err := CanSignCA(s.Chain(), s.Roots()); err != nil {
			t.Logf("the signer's chain cannot sign another CA (%v): checking that it refuses, and nothing more", err)
			csr := parseIntermediateCSR(t, NewIntermediateCSR(t, NewKey(t, ECDSAP256)))
			iss, err := a.IssueIntermediate(context.Background(), csr, Intermediate)
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.ErrorContains(t, err, "pathLen")
			assert.Nil(t, iss)
			return
		}
		for _, kt := range IntermediateKeyTypes {
			t.Run(string(kt), func(t *testing.T) {
				key := NewKey(t, kt)
				csr := parseIntermediateCSR(t, NewIntermediateCSR(t, key))
				iss, err := a.IssueIntermediate(context.Background(), csr, Intermediate)
				require.NoError(t, err)
				CheckIntermediateCertificate(t, iss, key.Public(), Intermediate)

				// istiod signs a workload certificate with the
				// intermediate's key; it verifies to the roots through the
				// intermediate and the signer's chain.
				now := time.Now()
				leaf := NewWorkloadCertificate(t, iss.Certificate, key, WorkloadID)
				opts := x509.VerifyOptions{
					Roots:         pool(iss.Roots),
					Intermediates: pool(append([]*x509.Certificate{iss.Certificate}, iss.Chain...)),
					CurrentTime:   now,
					KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
				}
				_, err = leaf.Verify(opts)
				require.NoError(t, err, "a workload certificate of the intermediate verifies to the roots")

				// Name constraints: an identity of another trust domain
				// (or a subdomain of the mesh's) signed with the
				// intermediate's key does not verify.
				for _, other := range []string{"spiffe://other-mesh.local/ns/bookinfo/sa/reviews", "spiffe://evil." + Intermediate.TrustDomain + "/ns/bookinfo/sa/reviews"} {
					foreign := NewWorkloadCertificate(t, iss.Certificate, key, spiffeid.RequireFromString(other))
					_, err = foreign.Verify(opts)
					var invalid x509.CertificateInvalidError
					require.ErrorAs(t, err, &invalid, "%s signed by the intermediate of %s must not verify", other, Intermediate.TrustDomain)
					assert.Equal(t, x509.CANotAuthorizedForThisName, invalid.Reason, other)
				}

				// pathLen 0: a CA below the intermediate (which its key
				// can technically sign) breaks path validation, and so does
				// every certificate below it.
				sub := (&CA{Cert: iss.Certificate, Key: key}).NewIntermediate(t, CAOptions{Name: "second-level CA"})
				subLeaf := NewWorkloadCertificate(t, sub.Cert, sub.Key, WorkloadID)
				opts.Intermediates = pool(append([]*x509.Certificate{sub.Cert, iss.Certificate}, iss.Chain...))
				_, err = subLeaf.Verify(opts)
				var invalid x509.CertificateInvalidError
				require.ErrorAs(t, err, &invalid, "a certificate below a CA below the intermediate must not verify")
				assert.Equal(t, x509.TooManyIntermediates, invalid.Reason)
			})
		}
	})
}

// CanSignCA reports why a CA certificate issued by chain[0] would break a
// path length constraint of chain, or of the root chain verifies to: the
// suite's own reading of RFC 5280's rule, independent of ca's.
func CanSignCA(chain, roots []*x509.Certificate) error {
	constrained := func(c *x509.Certificate) bool {
		return c.BasicConstraintsValid && (c.MaxPathLen > 0 || c.MaxPathLen == 0 && c.MaxPathLenZero)
	}
	for i, c := range chain {
		// chain[i-1] … chain[0] and the new CA follow chain[i].
		if constrained(c) && c.MaxPathLen < i+1 {
			return fmt.Errorf("chain[%d] %q has pathLen %d", i, c.Subject, c.MaxPathLen)
		}
	}
	paths, err := chain[0].Verify(x509.VerifyOptions{Roots: pool(roots), Intermediates: pool(chain[1:]), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return err
	}
	for _, p := range paths {
		root := p[len(p)-1]
		if len(p) == len(chain) || !constrained(root) || root.MaxPathLen >= len(chain)+1 {
			return nil
		}
	}
	return fmt.Errorf("the root %q has pathLen %d", paths[0][len(paths[0])-1].Subject, paths[0][len(paths[0])-1].MaxPathLen)
}

// CheckIntermediateCertificate asserts everything a mesh's intermediate
// must be: a CA with pathLen 0, keyCertSign and cRLSign only, no extended
// key usage and no subject alternative name, subject O=<VirtualMesh>,
// CN=<Mesh> intermediate, for pub, with key identifiers that chain it to
// Chain[0], within the issuing CA's validity, verifying to the roots, and
// passing Lint.
func CheckIntermediateCertificate(t testing.TB, iss *ca.Issued, pub crypto.PublicKey, req ca.IntermediateRequest) {
	t.Helper()
	c := iss.Certificate
	require.NotNil(t, c)
	require.NotEmpty(t, iss.Chain)
	assert.True(t, c.BasicConstraintsValid && c.IsCA, "a CA")
	assert.True(t, c.MaxPathLen == 0 && c.MaxPathLenZero, "pathLen 0")
	assert.Equal(t, x509.KeyUsageCertSign|x509.KeyUsageCRLSign, c.KeyUsage)
	assert.Empty(t, c.ExtKeyUsage, "extended key usages")
	assert.Empty(t, c.UnknownExtKeyUsage, "extended key usages")
	assert.Empty(t, c.DNSNames, "DNS SANs")
	assert.Empty(t, c.IPAddresses, "IP SANs")
	assert.Empty(t, c.URIs, "URI SANs")
	assert.Empty(t, c.EmailAddresses, "email SANs")
	for _, ext := range c.Extensions {
		assert.False(t, ext.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}), "no subjectAltName extension")
	}
	assert.Equal(t, []string{req.TrustDomain}, c.PermittedURIDomains, "permits its trust domain's URIs only")
	assert.Equal(t, []string{"." + req.TrustDomain}, c.ExcludedURIDomains, "and none of its subdomains")
	assert.True(t, c.PermittedDNSDomainsCritical, "name constraints are critical (RFC 5280)")
	assert.Empty(t, c.PermittedDNSDomains, "no DNS constraints")
	assert.Equal(t, []string{req.VirtualMesh}, c.Subject.Organization)
	assert.Equal(t, req.Mesh+" intermediate", c.Subject.CommonName)
	assert.Empty(t, c.Subject.OrganizationalUnit)
	eq, ok := pub.(interface{ Equal(crypto.PublicKey) bool })
	if assert.True(t, ok, "public key type has Equal") {
		assert.True(t, eq.Equal(c.PublicKey), "certificate is for the requested key")
	}
	assert.NotEmpty(t, c.SubjectKeyId, "subject key identifier")
	if len(iss.Chain[0].SubjectKeyId) > 0 {
		assert.Equal(t, iss.Chain[0].SubjectKeyId, c.AuthorityKeyId, "authority key identifier names the issuing CA")
	}
	assert.False(t, c.NotAfter.After(iss.Chain[0].NotAfter), "NotAfter within the issuing CA's")
	assert.False(t, c.NotBefore.Before(iss.Chain[0].NotBefore), "NotBefore within the issuing CA's")
	_, err := c.Verify(x509.VerifyOptions{
		Roots:         pool(iss.Roots),
		Intermediates: pool(iss.Chain),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	require.NoError(t, err, "the intermediate verifies to the roots")
	Lint(t, c)
}

// NewIntermediateCSR is what an agent sends for its mesh's intermediate: a
// request without subject that asks for the name constraints of
// Intermediate's trust domain.
func NewIntermediateCSR(t testing.TB, key crypto.Signer) []byte {
	t.Helper()
	ext, err := ca.NameConstraintsRequest(Intermediate.TrustDomain)
	require.NoError(t, err)
	return NewCSR(t, key, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{ext}})
}

// IssueIntermediate wraps s in a ca.Authority, as the server does, and
// issues the mesh intermediate Intermediate for a fresh P-256 key; the
// result must pass CheckIntermediateCertificate.
func IssueIntermediate(t testing.TB, s ca.Signer) *ca.Issued {
	t.Helper()
	a := newAuthority(t, ca.Config{Signer: s})
	key := NewKey(t, ECDSAP256)
	iss, err := a.IssueIntermediate(context.Background(), parseIntermediateCSR(t, NewIntermediateCSR(t, key)), Intermediate)
	require.NoError(t, err)
	CheckIntermediateCertificate(t, iss, key.Public(), Intermediate)
	return iss
}

// NewWorkloadCertificate is what istiod signs with a plugged-in CA: a
// certificate for a fresh P-256 key with id as its only SAN, serverAuth
// and clientAuth, valid from a minute ago for an hour, issued by issuer
// with key.
func NewWorkloadCertificate(t testing.TB, issuer *x509.Certificate, key crypto.Signer, id spiffeid.ID) *x509.Certificate {
	t.Helper()
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber:          randomSerial(t),
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		URIs:                  []*url.URL{id.URL()},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}, issuer, NewKey(t, ECDSAP256).Public(), key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// CheckAgentCertificate asserts everything an agent certificate must be:
// it verifies to the roots through the chain for clientAuth and not for
// serverAuth, has exactly the SPIFFE ID id as URI SAN and no other SAN, is
// not a CA, is for pub, lies within the issuing CA's validity, and passes
// Lint.
func CheckAgentCertificate(t testing.TB, iss *ca.Issued, pub crypto.PublicKey, id spiffeid.ID) {
	t.Helper()
	c := iss.Certificate
	require.NotNil(t, c)
	require.Len(t, c.URIs, 1, "URI SANs")
	assert.Equal(t, id.String(), c.URIs[0].String())
	assert.Empty(t, c.DNSNames, "DNS SANs")
	assert.Empty(t, c.IPAddresses, "IP SANs")
	assert.Empty(t, c.EmailAddresses, "email SANs")
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, c.ExtKeyUsage)
	assert.Empty(t, c.UnknownExtKeyUsage)
	assert.True(t, c.BasicConstraintsValid, "basic constraints present")
	assert.False(t, c.IsCA, "not a CA")
	assert.NotZero(t, c.KeyUsage&x509.KeyUsageDigitalSignature, "digitalSignature")
	assert.Zero(t, c.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign), "no certSign/cRLSign")
	assert.Equal(t, []string{"relaymesh"}, c.Subject.Organization)
	assert.Empty(t, c.Subject.CommonName)
	eq, ok := pub.(interface{ Equal(crypto.PublicKey) bool })
	if assert.True(t, ok, "public key type has Equal") {
		assert.True(t, eq.Equal(c.PublicKey), "certificate is for the requested key")
	}
	require.NotEmpty(t, iss.Chain)
	assert.False(t, c.NotAfter.After(iss.Chain[0].NotAfter), "NotAfter within the issuing CA's")
	assert.False(t, c.NotBefore.Before(iss.Chain[0].NotBefore), "NotBefore within the issuing CA's")
	now := time.Now()
	if c.NotBefore.After(now) || c.NotAfter.Before(now) {
		now = c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) / 2)
	}
	Lint(t, c)
	verify(t, iss, now, x509.ExtKeyUsageClientAuth)
	_, err := c.Verify(verifyOptions(iss, now, x509.ExtKeyUsageServerAuth))
	assert.Error(t, err, "an agent certificate must not verify for serverAuth")
}

func verify(t testing.TB, iss *ca.Issued, now time.Time, eku x509.ExtKeyUsage) {
	t.Helper()
	_, err := iss.Certificate.Verify(verifyOptions(iss, now, eku))
	require.NoError(t, err, "certificate verifies to the roots")
}

func verifyOptions(iss *ca.Issued, now time.Time, eku x509.ExtKeyUsage) x509.VerifyOptions {
	return x509.VerifyOptions{
		Roots:         pool(iss.Roots),
		Intermediates: pool(iss.Chain),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{eku},
	}
}

func newAuthority(t testing.TB, cfg ca.Config) *ca.Authority {
	t.Helper()
	a, err := ca.New(cfg)
	require.NoError(t, err)
	return a
}

func parseCSR(t testing.TB, der []byte) *x509.CertificateRequest {
	t.Helper()
	csr, err := ca.ParseCSR(der)
	require.NoError(t, err)
	return csr
}

func parseIntermediateCSR(t testing.TB, der []byte) *x509.CertificateRequest {
	t.Helper()
	csr, err := ca.ParseIntermediateCSR(der)
	require.NoError(t, err)
	return csr
}

func pool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		if c != nil {
			p.AddCert(c)
		}
	}
	return p
}
