package trust_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// events keeps the audit events it is given, after the checks a real log
// makes.
type events struct {
	mu  sync.Mutex
	all []audit.Event
}

func (r *events) Record(e audit.Event) error {
	if err := audit.Discard.Record(e); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, e)
	return nil
}

// count is how many events of type typ (with details reason, if set) were
// recorded.
func (r *events) count(typ audit.EventType, reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.all {
		if e.Type == typ && (reason == "" || e.Details["reason"] == reason) {
			n++
		}
	}
	return n
}

// peerEndpoint is a foreign https_web bundle endpoint whose answer a test
// sets.
type peerEndpoint struct {
	srv    *httptest.Server
	answer atomic.Pointer[func(http.ResponseWriter, *http.Request)]
}

func newPeerEndpoint(t *testing.T) *peerEndpoint {
	p := &peerEndpoint{}
	p.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*p.answer.Load())(w, r) }))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *peerEndpoint) serve(f func(http.ResponseWriter, *http.Request)) { p.answer.Store(&f) }

func (p *peerEndpoint) serveBytes(body []byte) {
	p.serve(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) })
}

func (p *peerEndpoint) rootsPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw}))
}

func bundleDoc(t *testing.T, td string, seq uint64, roots ...*x509.Certificate) []byte {
	t.Helper()
	b := spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString(td), roots)
	b.SetSequenceNumber(seq)
	b.SetRefreshHint(time.Second)
	doc, err := b.Marshal()
	require.NoError(t, err)
	return doc
}

func getFTD(t *testing.T, dyn dynamic.Interface, ns, name string) *networkingv1alpha1.FederatedTrustDomain {
	t.Helper()
	u, err := dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	var f networkingv1alpha1.FederatedTrustDomain
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &f))
	return &f
}

// TestImportKeepsTheLastGoodBundle: the importer accepts a peer's bundle
// and its next version, refuses each hostile answer with the accepted
// bundle kept in the status (also across a restart, as a new Lease holder
// would), audits both, and refuses a trust domain of its own.
func TestImportKeepsTheLastGoodBundle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cl := env.Cluster("cluster-1")
	kube := client(t)
	ns := namespace(t, kube)
	dyn, err := dynamic.NewForConfig(cl.RESTConfig())
	require.NoError(t, err)

	peer := newPeerEndpoint(t)
	r1, r2 := newRoot(t, "spire root 1"), newRoot(t, "spire root 2")
	peer.serveBytes(bundleDoc(t, "spire.example", 1, r1.cert))
	_, err = cl.Apply(ctx, "test", []byte(fmt.Sprintf(`
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: c1, namespace: %s}
spec: {}
`, ns)))
	require.NoError(t, err)
	// importFrom makes FederatedTrustDomain name import trust domain td
	// from peer (https_web).
	importFrom := func(name, td string) {
		t.Helper()
		_, err := cl.Apply(ctx, "test", []byte(fmt.Sprintf(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: FederatedTrustDomain
metadata: {name: %s, namespace: %s}
spec: {trustDomain: %s, bundleEndpointURL: %q, profile: https_web, webRootsPEM: %q}
`, name, ns, td, peer.srv.URL+"/bundle", peer.rootsPEM())))
		require.NoError(t, err)
	}
	importFrom("spire", "spire.example")

	rec := &events{}
	reg := prometheus.NewRegistry()
	hiccup := &atomic.Bool{}
	start := func(reg prometheus.Registerer) context.CancelFunc {
		im, err := trust.NewImporter(trust.ImporterConfig{Dynamic: flakyClusters{dyn, hiccup}, Namespace: ns, Audit: rec, Registerer: reg,
			Reserved:   []string{"relay.example"},
			Fetcher:    spiffefed.NewFetcher(spiffefed.FetcherOptions{Timeout: time.Second, MaxBody: 16 << 10}),
			Refresh:    func(*spiffebundle.Bundle) time.Duration { return 200 * time.Millisecond },
			RetryFirst: 200 * time.Millisecond})
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { im.Run(rctx); close(done) }()
		return func() { stop(); <-done }
	}
	stop := start(reg)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		f := getFTD(t, dyn, ns, "spire")
		assert.Equal(c, networkingv1alpha1.FederatedCurrent, f.Status.State)
		assert.EqualValues(c, 1, f.Status.Sequence)
	}, 20*time.Second, 100*time.Millisecond)
	f := getFTD(t, dyn, ns, "spire")
	require.Len(t, f.Status.Roots, 1)
	assert.Equal(t, trust.Fingerprint(r1.cert), f.Status.Roots[0].Fingerprint)
	assert.Equal(t, string(r1.pem), f.Status.BundlePEM)
	assert.NotNil(t, f.Status.LastAccepted)
	assert.Equal(t, 1, rec.count(audit.TrustBundleAccept, ""), "the first bundle is audited once, however often it is fetched again")

	// The peer adds a root (its own rotation): accepted.
	peer.serveBytes(bundleDoc(t, "spire.example", 2, r1.cert, r2.cert))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		f := getFTD(t, dyn, ns, "spire")
		assert.EqualValues(c, 2, f.Status.Sequence)
		assert.Len(c, f.Status.Roots, 2)
	}, 20*time.Second, 100*time.Millisecond)
	good := getFTD(t, dyn, ns, "spire").Status

	// Each hostile answer is refused; the accepted bundle stays.
	other := newRoot(t, "another trust domain's root")
	inter := newIntermediate(t, r1, "an intermediate")
	alien := newRootWithURI(t, "spiffe://other.example")
	hostile := []struct {
		reason string
		serve  func(http.ResponseWriter, *http.Request)
	}{
		{"sequence", bytesAnswer(bundleDoc(t, "spire.example", 1, other.cert))},
		{"sequence", bytesAnswer(bundleDoc(t, "spire.example", 2, other.cert))},
		{"not_root", bytesAnswer(bundleDoc(t, "spire.example", 3, inter))},
		{"trust_domain", bytesAnswer(bundleDoc(t, "spire.example", 3, alien))},
		{"malformed", bytesAnswer([]byte("<html>not a bundle</html>"))},
		{"too_large", bytesAnswer([]byte(strings.Repeat(" ", 17<<10) + string(bundleDoc(t, "spire.example", 3, other.cert))))},
		{"status", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write(bundleDoc(t, "spire.example", 3, other.cert))
		}},
		{"fetch", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/elsewhere", http.StatusFound) }},
		{"fetch", func(w http.ResponseWriter, r *http.Request) { // a slow loris: cut by the fetch timeout
			w.WriteHeader(http.StatusOK)
			for range 50 {
				if _, err := w.Write([]byte(" ")); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}},
	}
	for _, h := range hostile {
		before := rec.count(audit.TrustBundleRefuse, h.reason)
		peer.serve(h.serve)
		require.Eventually(t, func() bool { return rec.count(audit.TrustBundleRefuse, h.reason) > before },
			20*time.Second, 50*time.Millisecond, "a %s answer is refused", h.reason)
		// (The refusal is audited before its status is written.)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			f := getFTD(t, dyn, ns, "spire")
			assert.Equal(c, networkingv1alpha1.FederatedStale, f.Status.State, h.reason)
			assert.Contains(c, f.Status.Error, "("+h.reason, h.reason)
			assert.Equal(c, good.Sequence, f.Status.Sequence, h.reason)
			assert.Equal(c, good.BundlePEM, f.Status.BundlePEM, "%s: the accepted bundle is kept", h.reason)
			assert.NotContains(c, f.Status.Error, "<html>", "the status never quotes what the endpoint answered")
			assert.NotContains(c, f.Status.Error, "keys", "the status never quotes what the endpoint answered")
		}, 20*time.Second, 50*time.Millisecond)
	}
	assert.Equal(t, 2, rec.count(audit.TrustBundleAccept, ""))
	assert.GreaterOrEqual(t, seriesValue(reg, trust.MetricImportFetches, "spire.example", "accepted"), 2.0)
	assert.GreaterOrEqual(t, seriesValue(reg, trust.MetricImportFetches, "spire.example", "status"), 1.0)

	// A new Lease holder continues from the stored status: a lower
	// sequence is still refused.
	stop()
	before := rec.count(audit.TrustBundleRefuse, "sequence")
	peer.serveBytes(bundleDoc(t, "spire.example", 1, other.cert))
	reg = prometheus.NewRegistry()
	stop = start(reg)
	defer stop()
	require.Eventually(t, func() bool { return rec.count(audit.TrustBundleRefuse, "sequence") > before }, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, good.BundlePEM, getFTD(t, dyn, ns, "spire").Status.BundlePEM)

	// And recovers when the peer answers well again.
	peer.serveBytes(bundleDoc(t, "spire.example", 5, r2.cert))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		f := getFTD(t, dyn, ns, "spire")
		assert.Equal(c, networkingv1alpha1.FederatedCurrent, f.Status.State)
		assert.EqualValues(c, 5, f.Status.Sequence)
		assert.Empty(c, f.Status.Error)
	}, 20*time.Second, 100*time.Millisecond)

	// An apiserver that cannot tell whether the trust domain is one of
	// ours changes nothing: no fetch is accepted, the bundle stays.
	hiccup.Store(true)
	peer.serveBytes(bundleDoc(t, "spire.example", 6, r1.cert))
	require.Eventually(t, func() bool { return seriesValue(reg, trust.MetricImportFetches, "spire.example", "check") >= 2 }, 20*time.Second, 50*time.Millisecond)
	f = getFTD(t, dyn, ns, "spire")
	assert.Equal(t, networkingv1alpha1.FederatedCurrent, f.Status.State)
	assert.EqualValues(t, 5, f.Status.Sequence, "not fetched while it cannot be checked")
	hiccup.Store(false)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.EqualValues(c, 6, getFTD(t, dyn, ns, "spire").Status.Sequence)
	}, 20*time.Second, 100*time.Millisecond)

	// A spec edit that keeps the trust domain (the endpoint moved) keeps
	// the bundle and its sequence: a lower one is still refused.
	before = rec.count(audit.TrustBundleRefuse, "sequence")
	peer.serveBytes(bundleDoc(t, "spire.example", 3, other.cert))
	_, err = dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(ns).Patch(ctx, "spire", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"spec":{"bundleEndpointURL":%q}}`, peer.srv.URL+"/moved")), metav1.PatchOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.count(audit.TrustBundleRefuse, "sequence") > before }, 20*time.Second, 50*time.Millisecond)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		f := getFTD(t, dyn, ns, "spire")
		assert.Equal(c, f.Generation, f.Status.ObservedGeneration)
		assert.Equal(c, networkingv1alpha1.FederatedStale, f.Status.State)
		assert.EqualValues(c, 6, f.Status.Sequence)
	}, 20*time.Second, 100*time.Millisecond)

	// Deleted: its worker stops and its metrics go.
	require.NoError(t, dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(ns).Delete(ctx, "spire", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return seriesValue(reg, trust.MetricImportFetches, "spire.example", "accepted") < 0 }, 20*time.Second, 50*time.Millisecond)

	// The relay's trust domain is never imported.
	importFrom("relay", "relay.example")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		f := getFTD(t, dyn, ns, "relay")
		assert.Equal(c, networkingv1alpha1.FederatedInvalid, f.Status.State)
		assert.Contains(c, f.Status.Error, "trust domain relay.example is this Relaymesh's own")
	}, 20*time.Second, 100*time.Millisecond)

	// A trust domain of this Relaymesh's own (c1's default grant) is never
	// imported.
	importFrom("own", "c1.local")
	peer.serveBytes(bundleDoc(t, "c1.local", 9, other.cert))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		f := getFTD(t, dyn, ns, "own")
		assert.Equal(c, networkingv1alpha1.FederatedInvalid, f.Status.State)
		assert.Contains(c, f.Status.Error, "granted to registered cluster c1")
		assert.Empty(c, f.Status.BundlePEM)
	}, 20*time.Second, 100*time.Millisecond)
}

func bytesAnswer(body []byte) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }
}

// seriesValue is the value of counter name{trust_domain=td,result=result},
// -1 if there is no such series.
func seriesValue(reg *prometheus.Registry, name, td, result string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if mf.GetName() == name && got["trust_domain"] == td && got["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// flakyClusters is a dynamic client whose List of KubernetesClusters
// fails while fail is set, as an apiserver hiccup would.
type flakyClusters struct {
	dynamic.Interface
	fail *atomic.Bool
}

func (f flakyClusters) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	r := f.Interface.Resource(gvr)
	if gvr != multiclusterv1alpha1.KubernetesClusters {
		return r
	}
	return flakyResource{r, f.fail}
}

type flakyResource struct {
	dynamic.NamespaceableResourceInterface
	fail *atomic.Bool
}

func (r flakyResource) Namespace(ns string) dynamic.ResourceInterface {
	return flakyList{r.NamespaceableResourceInterface.Namespace(ns), r.fail}
}

type flakyList struct {
	dynamic.ResourceInterface
	fail *atomic.Bool
}

func (l flakyList) List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	if l.fail.Load() {
		return nil, apierrors.NewServiceUnavailable("an apiserver hiccup")
	}
	return l.ResourceInterface.List(ctx, opts)
}

// newIntermediate is a CA signed by parent: not a root.
func newIntermediate(t *testing.T, parent *testRoot, name string) *x509.Certificate {
	t.Helper()
	k := newRoot(t, "key holder").key
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent.cert, k.Public(), parent.key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// newRootWithURI is a self-signed CA naming a SPIFFE ID.
func newRootWithURI(t *testing.T, id string) *x509.Certificate {
	t.Helper()
	r := newRoot(t, "alien")
	u, err := url.Parse(id)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(8), Subject: pkix.Name{CommonName: "alien"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, URIs: []*url.URL{u}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, r.key.Public(), r.key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}
