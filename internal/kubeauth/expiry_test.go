package kubeauth_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func jwt(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(claims)) + ".c2lnbmF0dXJl"
}

// Expiry reads a JWT's exp claim and names no expiry for anything else:
// opaque, malformed, hostile and oversized tokens.
func TestExpiryReadsOnlyAWellFormedExpClaim(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	got, ok := kubeauth.Expiry(jwt(`{"aud":["relaymesh-dashboard"],"exp":` + "1796119200" + `,"sub":"system:serviceaccount:relaymesh:viewer"}`))
	require.True(t, ok)
	assert.Equal(t, at, got)

	for name, token := range map[string]string{
		"opaque":              "abcdef0123456789",
		"two parts":           "a.b",
		"four parts":          jwt(`{"exp":1}`) + ".x",
		"not base64":          "a.!!!.c",
		"not JSON":            "a." + base64.RawURLEncoding.EncodeToString([]byte("exp=1")) + ".c",
		"no exp":              jwt(`{"sub":"x"}`),
		"exp a string":        jwt(`{"exp":"1796119200"}`),
		"exp null":            jwt(`{"exp":null}`),
		"exp negative":        jwt(`{"exp":-1}`),
		"exp beyond any year": jwt(`{"exp":1e300}`),
		"exp an object":       jwt(`{"exp":{"a":1}}`),
		"oversized claims":    jwt(`{"exp":1796119200,"x":"` + strings.Repeat("a", 9000) + `"}`),
		"oversized token":     strings.Repeat("a", kubeauth.MaxTokenBytes+1),
	} {
		_, ok := kubeauth.Expiry(token)
		assert.False(t, ok, name)
	}
}

// FuzzExpiry: whatever the token, Expiry never panics and names only a
// time after the epoch.
func FuzzExpiry(f *testing.F) {
	f.Add(jwt(`{"exp":1796119200}`))
	f.Add(jwt(`{"exp":1.5}`))
	f.Add("a.b.c")
	f.Add("..")
	f.Fuzz(func(t *testing.T, token string) {
		at, ok := kubeauth.Expiry(token)
		if ok {
			require.False(t, at.Before(time.Unix(0, 0)))
		}
	})
}
