package ca_test

import (
	"bytes"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
)

func TestParseTrustBundleAcceptsTwoRootsInAnyOrderWithOneFingerprint(t *testing.T) {
	a, b := newRelayCA(t, ca.GenerateConfig{}), newRelayCA(t, ca.GenerateConfig{})
	ab, err := ca.ParseTrustBundle(ca.CertsPEM(a.Root, b.Root))
	require.NoError(t, err)
	ba, err := ca.ParseTrustBundle(append([]byte("\n"), ca.CertsPEM(b.Root, a.Root)...))
	require.NoError(t, err)
	require.Len(t, ab, 2)
	assert.Equal(t, ca.TrustBundleFingerprint(ab), ca.TrustBundleFingerprint(ba))
	assert.Equal(t, ca.BundleFingerprint([]string{ca.RootFingerprint(a.Root), ca.RootFingerprint(b.Root)}), ca.TrustBundleFingerprint(ab))
	assert.NotEqual(t, ca.TrustBundleFingerprint(ab[:1]), ca.TrustBundleFingerprint(ab))
}

func TestParseTrustBundleRefusesMalformedHostileAndOversizedBundles(t *testing.T) {
	r := newRelayCA(t, ca.GenerateConfig{})
	root := ca.CertsPEM(r.Root)
	var five []byte
	for range 5 {
		five = append(five, ca.CertsPEM(newRelayCA(t, ca.GenerateConfig{}).Root)...)
	}
	keyBlock := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte("secret-key-bytes")})
	withHeader := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: r.Root.Raw})
	for name, tc := range map[string]struct {
		in   []byte
		want string
	}{
		"empty":                   {nil, "no root"},
		"only whitespace":         {[]byte(" \n\t"), "no root"},
		"not PEM":                 {[]byte("hello"), "not PEM"},
		"trailing garbage":        {append(append([]byte{}, root...), "garbage"...), "not PEM after certificate 1"},
		"a private key block":     {keyBlock, "not a plain CERTIFICATE"},
		"a block with headers":    {withHeader, "not a plain CERTIFICATE"},
		"garbage DER":             {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{0x30, 0x03, 1, 2, 3}}), "certificate 1"},
		"an issuing CA, not root": {ca.CertsPEM(r.Issuer), "not self-signed"},
		"the same root twice":     {append(append([]byte{}, root...), root...), "listed twice"},
		"more than four roots":    {five, "more than 4 roots"},
		"oversized":               {append(append([]byte{}, root...), bytes.Repeat([]byte(" "), ca.MaxTrustBundleBytes)...), "more than"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ca.ParseTrustBundle(tc.in)
			require.Error(t, err)
			assert.Nil(t, got)
			assert.True(t, errors.Is(err, ca.ErrTrustBundle), "%v does not wrap ErrTrustBundle", err)
			assert.Contains(t, err.Error(), tc.want)
			assert.False(t, strings.Contains(err.Error(), "secret-key-bytes"), "the error echoes the input")
		})
	}
}

func FuzzParseTrustBundle(f *testing.F) {
	a, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ca.CertsPEM(a.Root))
	f.Add(ca.CertsPEM(a.Root, a.Issuer))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		roots, err := ca.ParseTrustBundle(b)
		if err != nil {
			if roots != nil || !errors.Is(err, ca.ErrTrustBundle) {
				t.Fatalf("refused with roots %d or an unmarked error %v", len(roots), err)
			}
			return
		}
		if len(roots) == 0 || len(roots) > ca.MaxTrustBundleRoots || len(b) > ca.MaxTrustBundleBytes {
			t.Fatalf("accepted %d roots from %d bytes", len(roots), len(b))
		}
		for _, c := range roots {
			if !c.IsCA || c.CheckSignatureFrom(c) != nil {
				t.Fatalf("accepted %v, not a self-signed CA", c.Subject)
			}
		}
	})
}
