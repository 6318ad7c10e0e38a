package trust_test

import (
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
