package debugreport

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRedact(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	pkcs8PEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
	cert := "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIRAKk=\n-----END CERTIFICATE-----\n"
	jwt := "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEyMyJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
	bootstrap := "0123456789abcdef." + strings.Repeat("A", 43)
	password := []byte("correct-horse-battery-staple")

	r := &Redactor{}
	r.Add(password)
	r.Add([]byte("short")) // too short to redact by content
	r.Add([]byte(cert))    // public
	in := "key:\n" + string(keyPEM) + "pkcs8:\n" + string(pkcs8PEM) + "cert:\n" + cert +
		"token " + jwt + "\nAuthorization: Bearer abcdefgh12345678\nbootstrap " + bootstrap +
		"\npassword " + string(password) + " as base64 " + base64.StdEncoding.EncodeToString(password) + "\nshort stays\n"
	out := string(r.Redact([]byte(in)))
	for _, secret := range []string{string(keyPEM), string(pkcs8PEM), "PRIVATE KEY-----\nM", jwt, "abcdefgh12345678", strings.Repeat("A", 43), string(password), base64.StdEncoding.EncodeToString(password)} {
		assert.NotContains(t, out, secret)
	}
	for _, kept := range []string{cert, "0123456789abcdef." + Redacted, "Bearer " + Redacted, "-----REDACTED EC PRIVATE KEY-----", "-----REDACTED PRIVATE KEY-----", "short stays"} {
		assert.Contains(t, out, kept)
	}
}

func TestOnlyCertificates(t *testing.T) {
	cert := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	assert.True(t, onlyCertificates([]byte(cert+cert)))
	assert.False(t, onlyCertificates([]byte(cert+"trailing secret")))
	assert.False(t, onlyCertificates([]byte(cert+"-----BEGIN EC PRIVATE KEY-----\nMIIB\n-----END EC PRIVATE KEY-----\n")))
	assert.False(t, onlyCertificates([]byte("not pem at all")))
	assert.False(t, onlyCertificates(nil))
}

// FuzzRedact: redaction never panics, and a registered value never
// survives it, whatever surrounds it.
func FuzzRedact(f *testing.F) {
	f.Add([]byte("prefix"), []byte("s3cr3t-value-123"), []byte("suffix"))
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\n"), []byte("MIIBabcdefgh"), []byte("\n-----END EC PRIVATE KEY-----"))
	f.Add([]byte("Bearer "), []byte("eyJabcdefghij.abcdefghij.abc"), []byte(""))
	f.Fuzz(func(t *testing.T, before, secret, after []byte) {
		r := &Redactor{}
		r.Add(secret)
		out := r.Redact(append(append(append([]byte{}, before...), secret...), after...))
		s := bytes.TrimSpace(secret)
		if len(s) >= minValue && !onlyCertificates(s) && bytes.Contains(out, s) {
			t.Fatalf("%q survived in %q", s, out)
		}
	})
}
