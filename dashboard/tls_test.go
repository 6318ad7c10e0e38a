package dashboard_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// servingPKI issues serving certificates from a test CA.
type servingPKI struct {
	t    *testing.T
	root *catest.CA
	auth *ca.Authority
}

func newServingPKI(t *testing.T) *servingPKI {
	root := catest.NewRoot(t, catest.CAOptions{})
	inter := root.NewIntermediate(t, catest.CAOptions{})
	auth, err := ca.New(ca.Config{Signer: inter.Signer(t, time.Now())})
	require.NoError(t, err)
	return &servingPKI{t: t, root: root, auth: auth}
}

// issue returns the PEM chain and key of a certificate for 127.0.0.1,
// localhost and the extra IP addresses (a server's private loopback
// address).
func (p *servingPKI) issue(extraIPs ...string) (chainPEM, keyPEM []byte, leaf *x509.Certificate) {
	key := catest.NewKey(p.t, catest.ECDSAP256)
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	for _, ip := range extraIPs {
		ips = append(ips, net.ParseIP(ip))
	}
	issued, err := p.auth.IssueServer(context.Background(), key.Public(), []string{"localhost"}, ips)
	require.NoError(p.t, err)
	return issued.ChainPEM(), catest.KeyPEM(p.t, key), issued.Certificate
}

type settableClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *settableClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *settableClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// served is the leaf a TLS client verifying against roots for 127.0.0.1
// is presented at addr.
func served(t *testing.T, addr string, roots *x509.CertPool) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	require.NoError(t, err, "the chain verifies against the CA for the address")
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// A provided certificate is served with its chain, verified by a client
// that trusts only the CA; new files are served once written, and files
// that do not load leave the last good certificate in place.
func TestCertificateFilesServeAndReload(t *testing.T) {
	pki := newServingPKI(t)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(chain, key []byte) {
		require.NoError(t, os.WriteFile(certPath, chain, 0o600))
		require.NoError(t, os.WriteFile(keyPath, key, 0o600))
	}
	chain1, key1, leaf1 := pki.issue()
	write(chain1, key1)
	clock := &settableClock{now: time.Now()}
	files, err := dashboard.LoadCertificateFiles(certPath, keyPath, clock.Now, nil)
	require.NoError(t, err)
	// The way the server serves it: ServerTLS alone, no fallback certificate.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.NotFoundHandler(), TLSConfig: dashboard.ServerTLS(files.Certificate), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	defer srv.Close()
	addr := lis.Addr().String()
	roots := x509.NewCertPool()
	roots.AddCert(pki.root.Cert)
	assert.Equal(t, leaf1.SerialNumber, served(t, addr, roots).SerialNumber)

	// A client that does not trust the CA refuses the connection.
	_, err = tls.Dial("tcp", addr, &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "127.0.0.1"})
	require.Error(t, err)

	// Renewed files are served after the next look.
	chain2, key2, leaf2 := pki.issue()
	write(chain2, key2)
	clock.Add(2 * time.Second)
	assert.Equal(t, leaf2.SerialNumber, served(t, addr, roots).SerialNumber, "the renewed certificate is served")

	// Files that do not load keep the last good certificate.
	other, otherKey, _ := pki.issue()
	for name, pair := range map[string][2][]byte{
		"garbage":          {[]byte("not PEM"), []byte("not PEM")},
		"mismatched key":   {chain1, otherKey},
		"certificate only": {other, nil},
		"oversized":        {append(other, make([]byte, 1<<20)...), otherKey},
	} {
		write(pair[0], pair[1])
		clock.Add(2 * time.Second)
		assert.Equal(t, leaf2.SerialNumber, served(t, addr, roots).SerialNumber, name)
	}
}

// Files that cannot be served are refused at load with a clear error that
// quotes no key: mismatched, expired, not yet valid, a CA, not for
// serverAuth, oversized, missing.
func TestLoadCertificateFilesRefusesWhatCannotBeServed(t *testing.T) {
	pki := newServingPKI(t)
	chain, key, leaf := pki.issue()
	_, otherKey, _ := pki.issue()
	caCert := catest.NewRoot(t, catest.CAOptions{})
	clientOnly, clientKey := clientCertificate(t, pki.root)
	for _, tc := range []struct {
		name       string
		chain, key []byte
		at         time.Time
		want       string
	}{
		{"mismatched key", chain, otherKey, time.Now(), "private key does not match"},
		{"expired", chain, key, leaf.NotAfter.Add(time.Second), "expired"},
		{"not yet valid", chain, key, leaf.NotBefore.Add(-time.Second), "not valid before"},
		{"a CA", caCert.ChainPEM(), caCert.KeyPEM(t), time.Now(), "CA certificate"},
		{"not for serverAuth", clientOnly, clientKey, time.Now(), "not for serverAuth"},
		{"garbage", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), key, time.Now(), "dashboard certificate"},
		{"oversized", append(chain, make([]byte, 1<<20)...), key, time.Now(), "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "c"), tc.chain, 0o600))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "k"), tc.key, 0o600))
			_, err := dashboard.LoadCertificateFiles(filepath.Join(dir, "c"), filepath.Join(dir, "k"), func() time.Time { return tc.at }, nil)
			require.ErrorIs(t, err, dashboard.ErrCertificate)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "PRIVATE KEY")
			if lines := strings.Split(string(tc.key), "\n"); len(lines) > 1 {
				assert.NotContains(t, err.Error(), lines[1], "no key material in the error")
			}
		})
	}
	_, err := dashboard.LoadCertificateFiles("/nonexistent/tls.crt", "/nonexistent/tls.key", nil, nil)
	require.ErrorIs(t, err, dashboard.ErrCertificate)
}

// clientCertificate is a certificate for clientAuth only, and its key.
func clientCertificate(t *testing.T, root *catest.CA) (certPEM, keyPEM []byte) {
	key := catest.NewKey(t, catest.ECDSAP256)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "client"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root.Cert, key.Public(), root.Key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), catest.KeyPEM(t, key)
}
