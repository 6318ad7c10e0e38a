package spiffefed_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/require"
)

var (
	peerTD     = spiffeid.RequireTrustDomainFromString("spire.example")
	peerServer = spiffeid.RequireFromString("spiffe://spire.example/spire/server")
)

// bundleDoc is the bundle document of td: roots, sequence seq (none if
// 0), a refresh hint of a minute.
func bundleDoc(t testing.TB, td spiffeid.TrustDomain, seq uint64, roots ...*x509.Certificate) []byte {
	t.Helper()
	b := spiffebundle.FromX509Authorities(td, roots)
	if seq > 0 {
		b.SetSequenceNumber(seq)
	}
	b.SetRefreshHint(time.Minute)
	doc, err := b.Marshal()
	require.NoError(t, err)
	return doc
}

// acceptedBundle is what the importer holds after accepting roots at seq.
func acceptedBundle(t testing.TB, seq uint64, roots ...*x509.Certificate) *spiffebundle.Bundle {
	t.Helper()
	b, err := spiffebundle.Parse(peerTD, bundleDoc(t, peerTD, seq, roots...))
	require.NoError(t, err)
	return b
}

// docServer answers every GET with the status and body last set, and
// counts requests.
type docServer struct {
	body     atomic.Pointer[[]byte]
	status   atomic.Int32
	requests atomic.Int32
}

func newDocServer(body []byte) *docServer {
	d := &docServer{}
	d.set(http.StatusOK, body)
	return d
}

func (d *docServer) set(status int, body []byte) {
	d.status.Store(int32(status))
	d.body.Store(&body)
}

func (d *docServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	d.requests.Add(1)
	w.Header().Set("Content-Type", "text/plain") // ignored by the importer
	w.WriteHeader(int(d.status.Load()))
	_, _ = w.Write(*d.body.Load())
}

// webPeer serves h over https_web and is the Peer that trusts it.
func webPeer(t *testing.T, h http.Handler) spiffefed.Peer {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return spiffefed.Peer{TrustDomain: peerTD, URL: srv.URL + "/bundle", Profile: spiffefed.ProfileWeb, WebRoots: pool}
}

// spiffePeer serves h over https_spiffe with the X509-SVID svid holds and
// is the Peer expecting peerServer.
func spiffePeer(t *testing.T, h http.Handler, svid *atomic.Pointer[x509svid.SVID]) spiffefed.Peer {
	t.Helper()
	u := serveTLS(t, h, spiffefed.SPIFFETLS(svidSource{svid}))
	return spiffefed.Peer{TrustDomain: peerTD, URL: u + "/bundle", Profile: spiffefed.ProfileSPIFFE, EndpointID: peerServer}
}

// endpointSVID is an X509-SVID for id issued by root.
func endpointSVID(t *testing.T, root *testCA, id spiffeid.ID) *atomic.Pointer[x509svid.SVID] {
	t.Helper()
	chain, key := root.svid(t, id.String())
	p := &atomic.Pointer[x509svid.SVID]{}
	p.Store(&x509svid.SVID{ID: id, Certificates: chain, PrivateKey: key})
	return p
}

// requireRefused asserts Fetch or Accept refused with reason and returned
// no bundle.
func requireRefused(t *testing.T, b *spiffebundle.Bundle, err error, reason spiffefed.RefuseReason) *spiffefed.Refused {
	t.Helper()
	require.Nil(t, b, "a refusal returns no bundle")
	var r *spiffefed.Refused
	require.True(t, errors.As(err, &r), "want a *Refused, got %v", err)
	require.Equal(t, reason, r.Reason, "error: %v", err)
	require.Equal(t, peerTD, r.TrustDomain)
	require.Contains(t, err.Error(), `"spire.example"`)
	require.Contains(t, err.Error(), string(reason))
	return r
}

func TestFetchAcceptsABundleOverHTTPSWebVerifiedWithTheGivenRoots(t *testing.T) {
	root := makeRoot(t, "spire root")
	p := webPeer(t, newDocServer(bundleDoc(t, peerTD, 7, root.cert)))
	b, err := spiffefed.NewFetcher(spiffefed.FetcherOptions{}).Fetch(context.Background(), p, nil)
	require.NoError(t, err)
	require.Equal(t, peerTD, b.TrustDomain())
	require.Equal(t, certs(root), b.X509Authorities())
	seq, ok := b.SequenceNumber()
	require.True(t, ok)
	require.Equal(t, uint64(7), seq)

	// Without the server's root in WebRoots, the endpoint is not
	// authenticated.
	p.WebRoots = x509.NewCertPool()
	b, err = spiffefed.NewFetcher(spiffefed.FetcherOptions{}).Fetch(context.Background(), p, nil)
	requireRefused(t, b, err, spiffefed.RefuseFetch)
}

func TestFetchAcceptsABundleOverHTTPSSPIFFEAuthenticatedWithTheLastBundle(t *testing.T) {
	root := makeRoot(t, "spire root")
	p := spiffePeer(t, newDocServer(bundleDoc(t, peerTD, 8, root.cert)), endpointSVID(t, root, peerServer))
	b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), p, acceptedBundle(t, 7, root.cert))
	require.NoError(t, err)
	require.Equal(t, certs(root), b.X509Authorities())
}

func TestFetchRefusesAnHTTPSSPIFFEEndpointWithAnotherSPIFFEID(t *testing.T) {
	root := makeRoot(t, "spire root")
	other := spiffeid.RequireFromString("spiffe://spire.example/someone-else")
	d := newDocServer(bundleDoc(t, peerTD, 8, root.cert))
	p := spiffePeer(t, d, endpointSVID(t, root, other))
	b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), p, acceptedBundle(t, 7, root.cert))
	requireRefused(t, b, err, spiffefed.RefuseFetch)
	require.Zero(t, d.requests.Load(), "nothing is asked of an unauthenticated endpoint")
}

func TestFetchRefusesAnHTTPSSPIFFEEndpointWhoseSVIDIsNotUnderTheLastBundle(t *testing.T) {
	root, stranger := makeRoot(t, "spire root"), makeRoot(t, "stranger")
	d := newDocServer(bundleDoc(t, peerTD, 8, stranger.cert))
	p := spiffePeer(t, d, endpointSVID(t, stranger, peerServer))
	b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), p, acceptedBundle(t, 7, root.cert))
	requireRefused(t, b, err, spiffefed.RefuseFetch)
	require.Zero(t, d.requests.Load())
}

// The peer rotates: it publishes old+new, the importer accepts that, the
// endpoint then serves an SVID under the new root, and the importer
// authenticates it with the bundle it accepted last, then drops the old
// root when the peer does.
func TestFetchFollowsThePeersRotationOverHTTPSSPIFFE(t *testing.T) {
	ctx := context.Background()
	oldRoot, newRoot := makeRoot(t, "old"), makeRoot(t, "new")
	d := newDocServer(bundleDoc(t, peerTD, 10, oldRoot.cert, newRoot.cert))
	svid := endpointSVID(t, oldRoot, peerServer)
	p := spiffePeer(t, d, svid)
	f := spiffefed.NewFetcher(spiffefed.FetcherOptions{})

	b1 := acceptedBundle(t, 9, oldRoot.cert) // the bootstrap bundle
	b2, err := f.Fetch(ctx, p, b1)
	require.NoError(t, err)
	require.ElementsMatch(t, certs(oldRoot, newRoot), b2.X509Authorities())

	svid.Store(endpointSVID(t, newRoot, peerServer).Load())
	d.set(http.StatusOK, bundleDoc(t, peerTD, 11, newRoot.cert))
	_, err = f.Fetch(ctx, p, b1)
	requireRefused(t, nil, err, spiffefed.RefuseFetch) // the old bundle alone cannot authenticate the new SVID
	b3, err := f.Fetch(ctx, p, b2)
	require.NoError(t, err)
	require.Equal(t, certs(newRoot), b3.X509Authorities())
}

func TestFetchRefusesHostileDocuments(t *testing.T) {
	root, other := makeRoot(t, "spire root"), makeRoot(t, "other root")
	otherTD := spiffeid.RequireTrustDomainFromString("other.example")
	leafChain, _ := root.svid(t, "spiffe://spire.example/workload")
	inter := root.intermediate(t, "spire.example")
	forged := forgedSelfIssued(t)
	var nine []*x509.Certificate
	for range spiffefed.MaxRoots + 1 {
		nine = append(nine, makeRoot(t, "many").cert)
	}
	last := acceptedBundle(t, 10, root.cert)
	jwtOnly, err := spiffebundle.FromJWTAuthorities(peerTD, map[string]crypto.PublicKey{"k1": newKey(t).Public()}).Marshal()
	require.NoError(t, err)
	huge := append([]byte(`{"keys":[`), []byte(strings.Repeat(" ", int(spiffefed.DefaultMaxBody)))...)

	for name, c := range map[string]struct {
		status int
		body   []byte
		last   *spiffebundle.Bundle
		want   spiffefed.RefuseReason
	}{
		"another trust domain's root":        {200, bundleDoc(t, otherTD, 11, spiffeRoot(t, "spiffe://other.example")), last, spiffefed.RefuseTrustDomain},
		"a lower sequence":                   {200, bundleDoc(t, peerTD, 9, root.cert), last, spiffefed.RefuseSequence},
		"the same sequence with other roots": {200, bundleDoc(t, peerTD, 10, root.cert, other.cert), last, spiffefed.RefuseSequence},
		"no sequence after one":              {200, bundleDoc(t, peerTD, 0, root.cert), last, spiffefed.RefuseSequence},
		"an intermediate CA":                 {200, bundleDoc(t, peerTD, 11, inter.cert), last, spiffefed.RefuseNotRoot},
		"a leaf":                             {200, bundleDoc(t, peerTD, 11, leafChain[0]), last, spiffefed.RefuseNotRoot},
		"a root and a leaf":                  {200, bundleDoc(t, peerTD, 11, root.cert, leafChain[0]), last, spiffefed.RefuseNotRoot},
		"self-issued, signed by another key": {200, bundleDoc(t, peerTD, 11, forged), last, spiffefed.RefuseNotRoot},
		"garbage":                            {200, []byte("\x00\x01<html>not a bundle</html>"), last, spiffefed.RefuseMalformed},
		"a JSON array":                       {200, []byte(`[1,2]`), nil, spiffefed.RefuseMalformed},
		"an x5c that is not a certificate":   {200, []byte(`{"keys":[{"use":"x509-svid","kty":"EC","crv":"P-256","x5c":["AAAA"]}]}`), nil, spiffefed.RefuseMalformed},
		"an empty JSON object":               {200, []byte(`{}`), last, spiffefed.RefuseEmpty},
		"an empty key set":                   {200, []byte(`{"keys":[]}`), last, spiffefed.RefuseEmpty},
		"JWT authorities only":               {200, jwtOnly, nil, spiffefed.RefuseEmpty},
		"nine roots":                         {200, bundleDoc(t, peerTD, 11, nine...), last, spiffefed.RefuseTooManyRoots},
		"a body of MaxBody+1 bytes":          {200, huge, last, spiffefed.RefuseTooLarge},
		"a valid bundle with status 404":     {404, bundleDoc(t, peerTD, 11, root.cert), last, spiffefed.RefuseStatus},
		"a valid bundle with status 500":     {500, bundleDoc(t, peerTD, 11, root.cert), last, spiffefed.RefuseStatus},
		"a valid bundle with status 204":     {204, nil, last, spiffefed.RefuseStatus},
	} {
		t.Run(name, func(t *testing.T) {
			d := &docServer{}
			d.set(c.status, c.body)
			b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), webPeer(t, d), c.last)
			requireRefused(t, b, err, c.want)
		})
	}
}

func TestFetchAcceptsTheSameSequenceWithTheSameRootsAndAJump(t *testing.T) {
	root := makeRoot(t, "spire root")
	last := acceptedBundle(t, 10, root.cert)
	for name, body := range map[string][]byte{
		"the same":        bundleDoc(t, peerTD, 10, root.cert),
		"a jump":          bundleDoc(t, peerTD, 1<<40, root.cert),
		"after bootstrap": bundleDoc(t, peerTD, 3, root.cert),
	} {
		t.Run(name, func(t *testing.T) {
			l := last
			if name == "after bootstrap" {
				l = spiffebundle.FromX509Authorities(peerTD, certs(root)) // no sequence: nothing to order by
			}
			b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), webPeer(t, newDocServer(body)), l)
			require.NoError(t, err)
			require.Equal(t, certs(root), b.X509Authorities())
		})
	}
}

// A document carries no trust domain: another trust domain's bundle
// whose roots name none is indistinguishable and is parsed as the peer's.
// It is accepted only as the peer's roots; over https_spiffe the endpoint
// must still authenticate as the peer under the last bundle first.
func TestAnotherTrustDomainsDocumentWithoutASPIFFERootIsReadAsThePeers(t *testing.T) {
	other := makeRoot(t, "other.example root")
	otherTD := spiffeid.RequireTrustDomainFromString("other.example")
	b, err := spiffefed.Accept(peerTD, nil, bundleDoc(t, otherTD, 3, other.cert))
	require.NoError(t, err)
	require.Equal(t, peerTD, b.TrustDomain())

	b, err = spiffefed.Accept(peerTD, nil, bundleDoc(t, peerTD, 3, spiffeRoot(t, "spiffe://spire.example")))
	require.NoError(t, err, "a root naming the peer's own trust domain is fine")
	require.Len(t, b.X509Authorities(), 1)
}

// A 302 to a server with a valid bundle is refused and never followed.
func TestFetchRefusesARedirectAndNeverFollowsIt(t *testing.T) {
	root := makeRoot(t, "spire root")
	target := newDocServer(bundleDoc(t, peerTD, 11, root.cert))
	targetSrv := httptest.NewTLSServer(target)
	t.Cleanup(targetSrv.Close)
	p := webPeer(t, http.RedirectHandler(targetSrv.URL+"/bundle", http.StatusFound))
	p.WebRoots.AddCert(targetSrv.Certificate())

	b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), p, nil)
	requireRefused(t, b, err, spiffefed.RefuseFetch)
	require.Contains(t, err.Error(), "redirect refused")
	require.Zero(t, target.requests.Load(), "the redirect target got no request")
}

// Headers at once, then a byte every 200 ms: the timeout cuts the body.
func TestFetchCutsASlowBodyAtTheTimeout(t *testing.T) {
	done := make(chan struct{})
	p := webPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		for {
			if _, err := w.Write([]byte(" ")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(func() { close(done) })
	start := time.Now()
	b, err := spiffefed.NewFetcher(spiffefed.FetcherOptions{Timeout: 500 * time.Millisecond}).Fetch(context.Background(), p, nil)
	requireRefused(t, b, err, spiffefed.RefuseFetch)
	require.Less(t, time.Since(start), 2*time.Second)
}

func TestFetchRefusesABodyOverTheConfiguredMaxBody(t *testing.T) {
	root := makeRoot(t, "spire root")
	doc := bundleDoc(t, peerTD, 11, root.cert)
	p := webPeer(t, newDocServer(doc))
	b, err := spiffefed.NewFetcher(spiffefed.FetcherOptions{MaxBody: int64(len(doc))}).Fetch(context.Background(), p, nil)
	require.NoError(t, err, "exactly MaxBody bytes is fine")
	require.NotNil(t, b)
	b, err = spiffefed.NewFetcher(spiffefed.FetcherOptions{MaxBody: int64(len(doc)) - 1}).Fetch(context.Background(), p, nil)
	requireRefused(t, b, err, spiffefed.RefuseTooLarge)
}

func TestFetchSendsNoClientCertificate(t *testing.T) {
	root := makeRoot(t, "spire root")
	var sawCert atomic.Bool
	doc := bundleDoc(t, peerTD, 11, root.cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawCert.Store(len(r.TLS.PeerCertificates) > 0)
		_, _ = w.Write(doc)
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	p := spiffefed.Peer{TrustDomain: peerTD, URL: srv.URL, Profile: spiffefed.ProfileWeb, WebRoots: pool}
	b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), p, nil)
	require.NoError(t, err)
	require.NotNil(t, b)
	require.False(t, sawCert.Load())
}

func TestFetchRefusesAPeerItCannotUse(t *testing.T) {
	root := makeRoot(t, "spire root")
	last := acceptedBundle(t, 1, root.cert)
	ok := spiffefed.Peer{TrustDomain: peerTD, URL: "https://127.0.0.1:1/bundle", Profile: spiffefed.ProfileSPIFFE, EndpointID: peerServer}
	for name, c := range map[string]struct {
		edit func(*spiffefed.Peer)
		last *spiffebundle.Bundle
	}{
		"plain http":                       {func(p *spiffefed.Peer) { p.URL = "http://127.0.0.1:1/bundle" }, last},
		"no host":                          {func(p *spiffefed.Peer) { p.URL = "https:///bundle" }, last},
		"user info":                        {func(p *spiffefed.Peer) { p.URL = "https://u:p@127.0.0.1:1/" }, last},
		"an unknown profile":               {func(p *spiffefed.Peer) { p.Profile = "https_maybe" }, last},
		"https_spiffe without a last":      {func(*spiffefed.Peer) {}, nil},
		"https_spiffe without an ID":       {func(p *spiffefed.Peer) { p.EndpointID = spiffeid.ID{} }, last},
		"an endpoint ID of another domain": {func(p *spiffefed.Peer) { p.EndpointID = spiffeid.RequireFromString("spiffe://other.example/server") }, last},
		"a last of another trust domain":   {func(*spiffefed.Peer) {}, spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("other.example"), certs(root))},
	} {
		t.Run(name, func(t *testing.T) {
			p := ok
			c.edit(&p)
			b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), p, c.last)
			requireRefused(t, b, err, spiffefed.RefuseInvalidPeer)
		})
	}
}

// Hostile bytes reach an error only as a short, quoted, printable prefix.
func TestRefusalsQuoteOnlyAShortPrintablePrefixOfTheBody(t *testing.T) {
	hostile := "\x1b[31mSECRET-LOOKING" + strings.Repeat("A", 500) + "\n\x00TAIL"
	for name, c := range map[string]struct {
		status int
		want   spiffefed.RefuseReason
	}{"malformed": {200, spiffefed.RefuseMalformed}, "status": {404, spiffefed.RefuseStatus}} {
		t.Run(name, func(t *testing.T) {
			d := &docServer{}
			d.set(c.status, []byte(hostile))
			b, err := (&spiffefed.Fetcher{}).Fetch(context.Background(), webPeer(t, d), nil)
			requireRefused(t, b, err, c.want)
			msg := err.Error()
			require.NotContains(t, msg, "\x1b")
			require.NotContains(t, msg, "TAIL")
			require.NotContains(t, msg, strings.Repeat("A", 100))
			require.Contains(t, msg, ".[31mSECRET-LOOKING")
		})
	}
	// A go-jose message quoting a long hostile value is cut too.
	b, err := spiffefed.Accept(peerTD, nil, []byte(`{"keys":[{"use":"x509-svid","kty":"`+strings.Repeat("Z", 1000)+`"}]}`))
	requireRefused(t, b, err, spiffefed.RefuseMalformed)
	require.Less(t, len(err.Error()), 400)

	// Whatever the detail, Error bounds it.
	long := &spiffefed.Refused{TrustDomain: peerTD, Reason: spiffefed.RefuseFetch, Err: errors.New("x509: valid for " + strings.Repeat("\x7fpeer.example ", 200))}
	require.Less(t, len(long.Error()), 450)
	require.NotContains(t, long.Error(), "\x7f")
}

func TestNextRefreshIsTheHintClamped(t *testing.T) {
	for name, c := range map[string]struct {
		hint *time.Duration
		want time.Duration
	}{
		"no hint":   {nil, spiffefed.DefaultRefresh},
		"in range":  {ptr(10 * time.Minute), 10 * time.Minute},
		"too short": {ptr(time.Second), spiffefed.MinRefresh},
		"zero":      {ptr(time.Duration(0)), spiffefed.MinRefresh},
		"negative":  {ptr(-time.Hour), spiffefed.MinRefresh},
		"too long":  {ptr(48 * time.Hour), spiffefed.MaxRefresh},
	} {
		t.Run(name, func(t *testing.T) {
			b := spiffebundle.New(peerTD)
			if c.hint != nil {
				b.SetRefreshHint(*c.hint)
			}
			require.Equal(t, c.want, spiffefed.NextRefresh(b))
		})
	}
	require.Equal(t, spiffefed.DefaultRefresh, spiffefed.NextRefresh(nil))
	// A hint that overflows time.Duration in go-spiffe's parse.
	b, err := spiffebundle.Parse(peerTD, []byte(`{"keys":[],"spiffe_refresh_hint":9223372036854775807}`))
	require.NoError(t, err)
	got := spiffefed.NextRefresh(b)
	require.True(t, got >= spiffefed.MinRefresh && got <= spiffefed.MaxRefresh, "%v", got)
}

func ptr[T any](v T) *T { return &v }

// spiffeRoot is a self-signed CA whose URI SAN is uri (as SPIRE's roots
// name their trust domain).
func spiffeRoot(t testing.TB, uri string) *x509.Certificate {
	t.Helper()
	u, err := url.Parse(uri)
	require.NoError(t, err)
	k := newKey(t)
	return sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: uri}, URIs: []*url.URL{u}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}, nil, k.Public(), k)
}

// forgedSelfIssued is a CA whose issuer is its subject but whose
// signature is another key's.
func forgedSelfIssued(t testing.TB) *x509.Certificate {
	t.Helper()
	name := pkix.Name{CommonName: "forged"}
	signer := &testCA{cert: &x509.Certificate{Subject: name}, key: newKey(t)}
	k := newKey(t)
	return sign(t, &x509.Certificate{Subject: name, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, signer, k.Public(), nil)
}
