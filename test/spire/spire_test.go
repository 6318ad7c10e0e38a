package spire_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/test/spire"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The harness itself: a real spire-server federating (https_web) with an
// endpoint served here holds the bundle the endpoint serves, follows a
// change after a refresh, and refuses an endpoint whose certificate its
// web roots do not trust.
func TestASPIREServerHoldsTheBundleItFederatesWith(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	td := spiffeid.RequireTrustDomainFromString("peer.example")
	webCA := newCA(t, "web root")
	addr, err := localcluster.ListenAddr()
	require.NoError(t, err)
	host, _, _ := net.SplitHostPort(addr)
	serving := webCA.leaf(t, net.ParseIP(host))

	rootA, rootB := newCA(t, "a"), newCA(t, "b")
	var mu sync.Mutex
	served := spiffebundle.FromX509Authorities(td, []*x509.Certificate{rootA.cert})
	served.SetSequenceNumber(1)
	served.SetRefreshHint(time.Hour)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		doc, err := served.Marshal()
		mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(doc)
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{serving}, MinVersion: tls.VersionTLS12}, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)} // the untrusting server's failed handshakes, expected
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })

	roots := filepath.Join(t.TempDir(), "web-roots.pem")
	require.NoError(t, os.WriteFile(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: webCA.cert.Raw}), 0o600))
	s, err := spire.Start(ctx, spire.Config{TrustDomain: "spire.example", WebRoots: roots,
		FederatesWith: []spire.Federation{{TrustDomain: td.Name(), URL: "https://" + addr + "/"}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })

	holds := func(want ...*x509.Certificate) func() bool {
		return func() bool {
			b, err := s.FederatedBundle(ctx, td.Name())
			return err == nil && len(b.X509Authorities()) == len(want) && b.HasX509Authority(want[0]) && b.HasX509Authority(want[len(want)-1])
		}
	}
	require.Eventually(t, holds(rootA.cert), 60*time.Second, 250*time.Millisecond, "spire-server fetched the bundle\n%s", s.LogTail(20))

	mu.Lock()
	served = spiffebundle.FromX509Authorities(td, []*x509.Certificate{rootA.cert, rootB.cert})
	served.SetSequenceNumber(2)
	served.SetRefreshHint(time.Hour)
	mu.Unlock()
	require.NoError(t, s.Refresh(ctx, td.Name()))
	require.Eventually(t, holds(rootA.cert, rootB.cert), 30*time.Second, 250*time.Millisecond, "spire-server follows the endpoint\n%s", s.LogTail(20))

	// The check can fail: a server whose web roots do not include the
	// endpoint's issuer fetches nothing.
	untrusting, err := spire.Start(ctx, spire.Config{TrustDomain: "other.example",
		FederatesWith: []spire.Federation{{TrustDomain: td.Name(), URL: "https://" + addr + "/"}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = untrusting.Stop() })
	assert.Error(t, untrusting.Refresh(ctx, td.Name()), "an endpoint it cannot authenticate")
	_, err = untrusting.FederatedBundle(ctx, td.Name())
	assert.Error(t, err, "no bundle held")
}

type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: c, key: k}
}

// leaf is a serving certificate for ip.
func (ca *testCA) leaf(t *testing.T, ip net.IP) tls.Certificate {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "bundle endpoint"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{ip},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, k.Public(), ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}
