package spiffefed_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func bundlePEM(t testing.TB, cas ...*testCA) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, c := range cas {
		require.NoError(t, pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw}))
	}
	return b.Bytes()
}

// A mesh's root bundle may end in cross-certificates of foreign roots
// (issued by its own root): the bundle endpoint publishes its self-issued
// roots only, however many cross-certificates follow; what is not PEM, or
// no root at all, is still refused.
func TestParseMeshRootsKeepsTheMeshsOwnRoots(t *testing.T) {
	old, next := makeRoot(t, "old"), makeRoot(t, "new")
	bundle := bundlePEM(t, old, next)
	for range 12 { // more than MaxRoots cross-certificates
		bundle = append(bundle, bundlePEM(t, old.intermediate(t, "spire.example"))...)
	}
	// A cross-certificate of a foreign root with our root's subject: self-
	// issued, not self-signed.
	signer := newKey(t)
	twin := &testCA{cert: sign(t, &x509.Certificate{RawSubject: old.cert.RawSubject, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign},
		&testCA{cert: &x509.Certificate{RawSubject: old.cert.RawSubject, PublicKey: signer.Public()}, key: signer}, newKey(t).Public(), nil)}
	require.Equal(t, twin.cert.RawIssuer, twin.cert.RawSubject)
	bundle = append(bundle, bundlePEM(t, twin)...)
	roots, err := spiffefed.ParseMeshRoots(bundle)
	require.NoError(t, err)
	require.Len(t, roots, 2)
	for _, r := range roots {
		assert.True(t, r.Equal(old.cert) || r.Equal(next.cert))
	}
	_, err = spiffefed.ParseRoots(bundle)
	assert.Error(t, err, "ParseRoots takes every CA as a root")

	for name, b := range map[string][]byte{
		"cross-certificates only": bundlePEM(t, old.intermediate(t, "spire.example")),
		"garbage after the roots": append(bundlePEM(t, old), []byte("not pem")...),
		"a key block":             append(bundlePEM(t, old), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})...),
		"empty":                   nil,
	} {
		_, err := spiffefed.ParseMeshRoots(b)
		assert.Error(t, err, name)
	}
}
