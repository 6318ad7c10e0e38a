package ca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The memory of verified self-signatures is per parsed request: the same
// bytes parsed again are a new request whose signature is verified again
// (a client resending one CSR gets no shortcut), and the entry goes when
// its request is collected.
func TestPossessionIsRememberedPerRequestObject(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	require.NoError(t, err)
	raw := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})

	first, err := ParseCSR(raw)
	require.NoError(t, err)
	k1, ok := possessionKey(first)
	require.True(t, ok)
	assert.True(t, possessionSeen(first, k1), "ParseCSR's verification is remembered for its request")

	second, err := x509.ParseCertificateRequest(der)
	require.NoError(t, err)
	k2, _ := possessionKey(second)
	require.Equal(t, k1, k2, "same bytes, same digest")
	assert.False(t, possessionSeen(second, k2), "another parse of the same bytes is verified again")

	wp := weak.Make(first)
	_, ok = possessions.Load(wp)
	require.True(t, ok)
	first = nil
	require.Eventually(t, func() bool {
		runtime.GC()
		_, ok := possessions.Load(wp)
		return !ok
	}, 10*time.Second, 50*time.Millisecond, "the entry goes with its request")
}
