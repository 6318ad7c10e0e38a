package spiffefed_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pemOf(c *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
}

func tlsCert(chain []*x509.Certificate, key crypto.Signer) *tls.Certificate {
	c := &tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, x := range chain {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

// endpoint serves the bundles of a State that tests change, as the server
// does when the stored state changes.
type endpoint struct {
	snap atomic.Pointer[spiffefed.Snapshot]
	st   spiffefed.State
	now  time.Time
}

func (e *endpoint) publish(t *testing.T, in []spiffefed.Member) spiffefed.Report {
	t.Helper()
	e.now = e.now.Add(time.Second)
	var rep spiffefed.Report
	e.st, rep = spiffefed.Next(e.st, in, e.now)
	snap, err := spiffefed.NewSnapshot(e.st, time.Minute)
	require.NoError(t, err)
	e.snap.Store(snap)
	return rep
}

func (e *endpoint) handler() http.Handler { return spiffefed.Handler(e.snap.Load) }

// serveTLS serves h as the server does (spiffefed.Server) on a loopback
// port.
func serveTLS(t *testing.T, h http.Handler, cfg *tls.Config) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := spiffefed.Server(h, cfg)
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + lis.Addr().String()
}

// go-spiffe's federation client fetches each trust domain's bundle over
// https_web (a serving certificate under a root the client trusts) and
// https_spiffe (an X509-SVID of the endpoint's SPIFFE ID, verified with
// the bundle the client holds for its trust domain), through a rotation:
// the client holding the old root's bundle authenticates the endpoint
// serving an SVID from the new root while both are published (which is
// how a federation survives a rotation), and the sequence moves with the
// roots only.
func TestFederationClientsFetchEachTrustDomainsBundleOverBothProfiles(t *testing.T) {
	ctx := context.Background()
	oldRoot, newRoot := makeRoot(t, "old"), makeRoot(t, "new")
	web := makeRoot(t, "web")
	e := &endpoint{now: t0}
	e.publish(t, append(members("ns/vm", certs(oldRoot), "east.example", "west.example"), members("ns/other", certs(web), "other.example")...))
	east := spiffeid.RequireTrustDomainFromString("east.example")

	ep := serveBothProfiles(t, e, web, oldRoot)
	webURL, pool, spiffeURL, endpointID, setSVID := ep.webURL, ep.pool, ep.spiffeURL, ep.id, ep.setSVID

	fetchWeb := func(td spiffeid.TrustDomain) (*x509bundle.Bundle, uint64) {
		t.Helper()
		b, err := federation.FetchBundle(ctx, td, webURL+spiffefed.PathPrefix+td.Name(), federation.WithWebPKIRoots(pool))
		require.NoError(t, err)
		seq, ok := b.SequenceNumber()
		require.True(t, ok)
		hint, ok := b.RefreshHint()
		require.True(t, ok)
		assert.Equal(t, time.Minute, hint)
		return b.X509Bundle(), seq
	}
	held := x509bundle.FromX509Authorities(east, certs(oldRoot)) // what the client fetched last
	fetchSPIFFE := func() (*x509bundle.Bundle, uint64) {
		t.Helper()
		b, err := federation.FetchBundle(ctx, east, spiffeURL+spiffefed.PathPrefix+"east.example", federation.WithSPIFFEAuth(held, endpointID))
		require.NoError(t, err)
		seq, _ := b.SequenceNumber()
		held = b.X509Bundle()
		return b.X509Bundle(), seq
	}

	b, seq0 := fetchWeb(east)
	assert.Equal(t, certs(oldRoot), b.X509Authorities())
	b, otherSeq := fetchWeb(spiffeid.RequireTrustDomainFromString("other.example"))
	assert.Equal(t, certs(web), b.X509Authorities(), "each trust domain its own bundle")
	b, s := fetchSPIFFE()
	assert.Equal(t, certs(oldRoot), b.X509Authorities())
	assert.Equal(t, seq0, s, "one sequence, whichever profile")

	// Nothing changed: the same sequence.
	e.publish(t, append(members("ns/vm", certs(oldRoot), "east.example", "west.example"), members("ns/other", certs(web), "other.example")...))
	_, s = fetchWeb(east)
	assert.Equal(t, seq0, s)

	// AddingNewRoot: both published, a higher sequence.
	e.publish(t, append(members("ns/vm", certs(oldRoot, newRoot), "east.example", "west.example"), members("ns/other", certs(web), "other.example")...))
	b, seq1 := fetchSPIFFE()
	assert.Greater(t, seq1, seq0)
	assert.ElementsMatch(t, certs(oldRoot, newRoot), b.X509Authorities())
	_, s = fetchWeb(spiffeid.RequireTrustDomainFromString("other.example"))
	assert.Equal(t, otherSeq, s, "another trust domain's sequence does not move")

	// The endpoint now serves an SVID from the new root; the client
	// verifies it with the bundle it fetched last (old + new).
	setSVID(newRoot)
	e.publish(t, append(members("ns/vm", certs(newRoot), "east.example", "west.example"), members("ns/other", certs(web), "other.example")...))
	b, seq2 := fetchSPIFFE()
	assert.Greater(t, seq2, seq1)
	assert.Equal(t, certs(newRoot), b.X509Authorities(), "the old root left last")

	// A client that still holds only the old root cannot authenticate an
	// SVID from the new root: https_spiffe fails closed.
	_, err := federation.FetchBundle(ctx, east, spiffeURL+spiffefed.PathPrefix+"east.example",
		federation.WithSPIFFEAuth(x509bundle.FromX509Authorities(east, certs(oldRoot)), endpointID))
	require.Error(t, err)
	// Nor with another endpoint ID.
	_, err = federation.FetchBundle(ctx, east, spiffeURL+spiffefed.PathPrefix+"east.example",
		federation.WithSPIFFEAuth(held, spiffeid.RequireFromString("spiffe://east.example/someone-else")))
	require.Error(t, err)
	// An https_web client without the serving root refuses the endpoint.
	_, err = federation.FetchBundle(ctx, east, webURL+spiffefed.PathPrefix+"east.example", federation.WithWebPKIRoots(x509.NewCertPool()))
	require.Error(t, err)
	// An unknown trust domain is not a bundle.
	_, err = federation.FetchBundle(ctx, east, webURL+spiffefed.PathPrefix+"nowhere.example", federation.WithWebPKIRoots(pool))
	require.Error(t, err)
}

// bothProfiles is e served twice: https_web with a serving certificate
// of web, and https_spiffe with an X509-SVID for id, issued by a root
// (setSVID) through an intermediate name-constrained to east.example.
type bothProfiles struct {
	webURL, spiffeURL string
	pool              *x509.CertPool // trusts web
	id                spiffeid.ID
	setSVID           func(root *testCA)
}

func serveBothProfiles(t *testing.T, e *endpoint, web, svidRoot *testCA) bothProfiles {
	t.Helper()
	servingChain, servingKey := web.serving(t)
	b := bothProfiles{pool: x509.NewCertPool(), id: spiffeid.RequireFromString("spiffe://east.example/relaymesh/bundle-endpoint")}
	b.webURL = serveTLS(t, e.handler(), spiffefed.WebTLS(func() (*tls.Certificate, error) { return tlsCert(servingChain, servingKey), nil }))
	b.pool.AddCert(web.cert)
	var svid atomic.Pointer[x509svid.SVID]
	b.setSVID = func(root *testCA) {
		inter := root.intermediate(t, "east.example")
		chain, key := inter.svid(t, b.id.String())
		svid.Store(&x509svid.SVID{ID: b.id, Certificates: append(chain, inter.cert), PrivateKey: key})
	}
	b.setSVID(svidRoot)
	b.spiffeURL = serveTLS(t, e.handler(), spiffefed.SPIFFETLS(svidSource{&svid}))
	return b
}

type svidSource struct {
	p *atomic.Pointer[x509svid.SVID]
}

func (s svidSource) GetX509SVID() (*x509svid.SVID, error) { return s.p.Load(), nil }

// Requests that are not a GET of a published trust domain get a clear
// status and the same 404 body whether the trust domain is unpublished or
// not a name at all.
func TestTheHandlerRefusesWhatIsNotAGetOfAPublishedTrustDomain(t *testing.T) {
	e := &endpoint{now: t0}
	e.publish(t, members("ns/vm", certs(makeRoot(t, "r")), "a.example"))
	h := e.handler()
	do := func(method, target string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
		return rec
	}
	ok := do(http.MethodGet, "/bundles/a.example")
	require.Equal(t, http.StatusOK, ok.Code)
	assert.Equal(t, "application/json", ok.Header().Get("Content-Type"))
	assert.Equal(t, "nosniff", ok.Header().Get("X-Content-Type-Options"))
	assert.Equal(t, http.StatusOK, do(http.MethodGet, "/bundles/a.example?x=1").Code, "a query changes nothing")

	notFound := do(http.MethodGet, "/bundles/b.example").Body.String()
	for name, c := range map[string]struct {
		method, target string
		code           int
	}{
		"unpublished":         {http.MethodGet, "/bundles/b.example", http.StatusNotFound},
		"root":                {http.MethodGet, "/", http.StatusNotFound},
		"prefix only":         {http.MethodGet, "/bundles/", http.StatusNotFound},
		"uppercase":           {http.MethodGet, "/bundles/A.example", http.StatusNotFound},
		"a SPIFFE ID":         {http.MethodGet, "/bundles/spiffe:%2F%2Fa.example", http.StatusNotFound},
		"a sub-path":          {http.MethodGet, "/bundles/a.example/x", http.StatusNotFound},
		"an encoded slash":    {http.MethodGet, "/bundles/a.example%2Fx", http.StatusNotFound},
		"a trailing slash":    {http.MethodGet, "/bundles/a.example/", http.StatusNotFound},
		"dot-dot":             {http.MethodGet, "/bundles/../bundles/a.example", http.StatusNotFound},
		"a NUL":               {http.MethodGet, "/bundles/a.example%00", http.StatusNotFound},
		"unicode":             {http.MethodGet, "/bundles/%C3%A4.example", http.StatusNotFound},
		"too long":            {http.MethodGet, "/bundles/" + strings.Repeat("a", 300), http.StatusRequestURITooLong},
		"POST":                {http.MethodPost, "/bundles/a.example", http.StatusMethodNotAllowed},
		"PUT":                 {http.MethodPut, "/bundles/a.example", http.StatusMethodNotAllowed},
		"DELETE":              {http.MethodDelete, "/bundles/a.example", http.StatusMethodNotAllowed},
		"HEAD":                {http.MethodHead, "/bundles/a.example", http.StatusMethodNotAllowed},
		"OPTIONS":             {http.MethodOptions, "/bundles/a.example", http.StatusMethodNotAllowed},
		"POST to unpublished": {http.MethodPost, "/bundles/b.example", http.StatusMethodNotAllowed},
	} {
		t.Run(name, func(t *testing.T) {
			rec := do(c.method, c.target)
			assert.Equal(t, c.code, rec.Code)
			assert.NotContains(t, rec.Body.String(), "a.example", "no response names a published trust domain")
			if c.code == http.StatusNotFound {
				assert.Equal(t, notFound, rec.Body.String(), "one 404 for every trust domain not published")
			}
			if c.code == http.StatusMethodNotAllowed {
				assert.Equal(t, http.MethodGet, rec.Header().Get("Allow"))
			}
		})
	}
}

// The server's limits: oversized headers and request bodies are refused
// before the handler runs.
func TestTheServerRefusesOversizedRequests(t *testing.T) {
	e := &endpoint{now: t0}
	e.publish(t, members("ns/vm", certs(makeRoot(t, "r")), "a.example"))
	srv := spiffefed.Server(e.handler(), nil)
	ts := httptest.NewUnstartedServer(srv.Handler)
	ts.Config.MaxHeaderBytes = srv.MaxHeaderBytes
	ts.Start()
	defer ts.Close()
	req, err := http.NewRequest(http.MethodGet, ts.URL+"/bundles/a.example", nil)
	require.NoError(t, err)
	req.Header.Set("X-Pad", strings.Repeat("x", 64<<10))
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, res.StatusCode)
	res, err = http.Get(ts.URL + "/bundles/a.example")
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, string(body), `"spiffe_sequence"`)
}
