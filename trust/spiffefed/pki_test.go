package spiffefed_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testCA is a root (or a name-constrained intermediate) for tests.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

var serial int64 = 100

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

func sign(t testing.TB, tmpl *x509.Certificate, parent *testCA, pub crypto.PublicKey, key crypto.Signer) *x509.Certificate {
	t.Helper()
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	p := tmpl
	if parent != nil {
		p, key = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p, pub, key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// makeRoot is a VirtualMesh-like root: a CA with path length 1.
func makeRoot(t testing.TB, name string) *testCA {
	k := newKey(t)
	c := sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true, MaxPathLen: 1,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}, nil, k.Public(), k)
	return &testCA{cert: c, key: k}
}

// intermediate is a mesh's CA: path length 0, name-constrained to td.
func (ca *testCA) intermediate(t testing.TB, td string) *testCA {
	k := newKey(t)
	c := sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: "mesh " + td}, IsCA: true, BasicConstraintsValid: true, MaxPathLen: 0, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign, PermittedURIDomains: []string{td}, PermittedDNSDomainsCritical: true}, ca, k.Public(), nil)
	return &testCA{cert: c, key: k}
}

// svid is an X509-SVID for id issued by ca.
func (ca *testCA) svid(t testing.TB, id string) ([]*x509.Certificate, crypto.Signer) {
	u, err := url.Parse(id)
	require.NoError(t, err)
	k := newKey(t)
	c := sign(t, &x509.Certificate{URIs: []*url.URL{u}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}, ca, k.Public(), nil)
	return []*x509.Certificate{c}, k
}

// serving is a https_web certificate for 127.0.0.1 issued by ca.
func (ca *testCA) serving(t testing.TB) ([]*x509.Certificate, crypto.Signer) {
	k := newKey(t)
	c := sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: "bundles"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, k.Public(), nil)
	return []*x509.Certificate{c}, k
}
