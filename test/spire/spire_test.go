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
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
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

// Relaymesh's fetcher against SPIRE's own bundle endpoint (https_spiffe,
// SPIRE's X509-SVID): bootstrapped with `bundle show`, it accepts SPIRE's
// bundle, and an X509-SVID `x509 mint` signs verifies against what it
// accepted; bootstrapped with another root, it refuses the endpoint.
func TestTheFetcherFetchesASPIREServersBundleEndpoint(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	s, err := spire.Start(ctx, spire.Config{TrustDomain: "spire.example", BundleEndpoint: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })
	td := spiffeid.RequireTrustDomainFromString("spire.example")
	bootstrap, err := s.BundlePEM(ctx)
	require.NoError(t, err)
	roots, err := spiffefed.ParseRoots(bootstrap)
	require.NoError(t, err)
	peer := spiffefed.Peer{TrustDomain: td, URL: s.BundleEndpointURL(), Profile: spiffefed.ProfileSPIFFE,
		EndpointID: spiffeid.RequireFromString(s.EndpointID())}
	f := spiffefed.NewFetcher(spiffefed.FetcherOptions{})

	var got *spiffebundle.Bundle
	require.Eventually(t, func() bool { // the endpoint starts with the server
		got, err = f.Fetch(ctx, peer, spiffebundle.FromX509Authorities(td, roots))
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "fetch: %v\n%s", err, s.LogTail(20))
	require.Len(t, got.X509Authorities(), len(roots))
	for _, r := range roots {
		assert.True(t, got.HasX509Authority(r), "the bundle SPIRE serves holds what bundle show prints")
	}
	hint, ok := got.RefreshHint()
	assert.True(t, ok)
	assert.Equal(t, 10*time.Second, hint)

	chain, err := s.Mint(ctx, "spiffe://spire.example/client")
	require.NoError(t, err)
	id, _, err := x509svid.Verify(chain, got.X509Bundle())
	require.NoError(t, err, "SPIRE's X509-SVID verifies against the imported bundle")
	assert.Equal(t, "spiffe://spire.example/client", id.String())

	other := newCA(t, "not SPIRE's")
	_, err = f.Fetch(ctx, peer, spiffebundle.FromX509Authorities(td, []*x509.Certificate{other.cert}))
	var refused *spiffefed.Refused
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, spiffefed.RefuseFetch, refused.Reason, "an endpoint whose SVID the bootstrap bundle does not verify: %v", err)
}
