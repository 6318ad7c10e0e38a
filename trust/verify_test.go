package trust_test

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// VerifyAgainst passes only when one mesh's intermediate chains to the other
// mesh's bundle; ParseMeshCA refuses Secrets that are not certificates.
func TestVerifyAgainst(t *testing.T) {
	rootA, rootB := newRoot(t, "a"), newRoot(t, "b")
	mesh := func(name string, signer, bundle *testRoot) *trust.MeshCA {
		cert := signer.sign(t, csrPEM(t), time.Hour, nil)
		m, err := trust.ParseMeshCA(name, "istio-system", map[string][]byte{trust.KeyCACert: cert, trust.KeyChain: append(append([]byte(nil), cert...), signer.pem...),
			trust.KeyRootCert: bundle.pem})
		require.NoError(t, err)
		return m
	}
	one, two, stranger := mesh("one", rootA, rootA), mesh("two", rootA, rootA), mesh("three", rootB, rootB)
	now := time.Now()
	assert.NoError(t, one.VerifyAgainst(two, now))
	assert.NoError(t, two.VerifyAgainst(one, now))
	assert.Error(t, one.VerifyAgainst(stranger, now), "another root")
	assert.Error(t, stranger.VerifyAgainst(one, now))
	assert.Error(t, one.VerifyAgainst(two, now.Add(48*time.Hour)), "expired")

	_, err := trust.ParseMeshCA("x", "istio-system", map[string][]byte{trust.KeyCACert: []byte("nope")})
	assert.ErrorContains(t, err, "ca-cert.pem")
}

// An intermediate that is not name-constrained to its mesh's trust domain is
// reported: unconstrained, another domain, subdomains allowed, not critical.
func TestCheckTrustDomain(t *testing.T) {
	mk := func(mutate func(*x509.Certificate)) *trust.MeshCA {
		c := &x509.Certificate{PermittedURIDomains: []string{"c1.local"}, ExcludedURIDomains: []string{".c1.local"}, PermittedDNSDomainsCritical: true}
		if mutate != nil {
			mutate(c)
		}
		return &trust.MeshCA{Cluster: "c1", Namespace: "istio-system", Intermediate: c}
	}
	require.NoError(t, mk(nil).CheckTrustDomain("c1.local"))
	for _, tc := range []struct {
		name   string
		mutate func(*x509.Certificate)
		want   string
	}{
		{"unconstrained", func(c *x509.Certificate) { *c = x509.Certificate{} }, "not name-constrained"},
		{"another trust domain", func(c *x509.Certificate) { c.PermittedURIDomains = []string{"c2.local"} }, `may sign identities of ["c2.local"], but the mesh's trust domain is "c1.local"`},
		{"subdomains", func(c *x509.Certificate) { c.ExcludedURIDomains = nil }, "does not exclude the subdomains"},
		{"not critical", func(c *x509.Certificate) { c.PermittedDNSDomainsCritical = false }, "not critical"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorContains(t, mk(tc.mutate).CheckTrustDomain("c1.local"), tc.want)
		})
	}
}
