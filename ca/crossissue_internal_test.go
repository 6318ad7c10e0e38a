package ca

import (
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cross-issued CA is the issuing CA under another parent and nothing
// else; checkCrossIssued refuses anything that differs from that.
func TestCrossIssuedIsTheIssuingCAUnderTheOtherRoot(t *testing.T) {
	now := time.Now()
	cfg := GenerateConfig{}.Default()
	old, err := GenerateRelayCA(cfg)
	require.NoError(t, err)
	next, err := GenerateRelayCA(cfg)
	require.NoError(t, err)

	c, err := crossIssue(rand.Reader, next.Issuer, old.Root, old.RootKey, now)
	require.NoError(t, err)
	assert.Equal(t, next.Issuer.RawSubject, c.RawSubject)
	assert.Equal(t, next.Issuer.SubjectKeyId, c.SubjectKeyId)
	assert.Equal(t, old.Root.SubjectKeyId, c.AuthorityKeyId)
	assert.False(t, c.NotAfter.After(old.Root.NotAfter), "never outlives the root that signed it")
	assert.False(t, c.NotAfter.After(next.Issuer.NotAfter), "nor the issuing CA")
	assert.True(t, c.MaxPathLenZero && c.MaxPathLen == 0)

	for name, tc := range map[string]struct {
		c, issuing, parent *x509.Certificate
		at                 time.Time
		want               string
	}{
		"signed by another root":     {c, next.Issuer, next.Root, now, "not signed by the other root"},
		"another issuing CA":         {c, old.Issuer, old.Root, now, "key identifier"},
		"the issuing CA itself":      {next.Issuer, next.Issuer, old.Root, now, "not signed by the other root"},
		"a root, not a pathLen 0 CA": {old.Root, old.Root, old.Root, now, "pathLen 0"},
		"expired":                    {c, next.Issuer, old.Root, c.NotAfter, "not valid now"},
		"not yet valid":              {c, next.Issuer, old.Root, c.NotBefore.Add(-time.Second), "not valid now"},
	} {
		t.Run(name, func(t *testing.T) {
			assert.ErrorContains(t, checkCrossIssued(tc.c, tc.issuing, tc.parent, tc.at), tc.want)
		})
	}

	constrained := *next.Issuer
	constrained.PermittedDNSDomains = []string{"example.com"}
	_, err = crossIssue(rand.Reader, &constrained, old.Root, old.RootKey, now)
	assert.ErrorContains(t, err, "name constraints", "a constrained issuing CA is not copied without its constraints")
}
