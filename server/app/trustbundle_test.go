package app

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// fakeRotation is a replica's loaded relay CA: roots and rotation state.
type fakeRotation struct {
	mu    sync.Mutex
	roots []*x509.Certificate
	st    *ca.RootRotationState
}

func (f *fakeRotation) Roots() []*x509.Certificate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.roots
}

func (f *fakeRotation) LoadedRootRotation() (ca.RootRotationState, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st == nil {
		return ca.RootRotationState{}, false
	}
	return *f.st, true
}

func (f *fakeRotation) set(st *ca.RootRotationState, roots ...*x509.Certificate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st, f.roots = st, roots
}

type countingTransport struct {
	next    http.RoundTripper
	mu      sync.Mutex
	patches map[string]int // by cluster
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPatch {
		c.mu.Lock()
		c.patches[r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]]++
		c.mu.Unlock()
	}
	return c.next.RoundTrip(r)
}

func (c *countingTransport) count(cluster string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.patches[cluster]
}

// Outside a rotation no bundle is offered and nothing is written; during
// one the bundle is the loaded roots, and each cluster's answer lands on
// its KubernetesCluster once however often it is repeated: an
// acknowledgement as the fingerprint, an older agent and a refusal as the
// reason (printable and bounded, whatever the agent sent), and a later
// acknowledgement clears the refusal.
func TestTrustBundleAnswersAreWrittenOncePerClusterAndBundle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, _, admin := localcluster.Management(t, "relaymesh")
	for _, name := range []string{"acks", "old-agent", "refuses"} {
		_, err := admin.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": multiclusterv1alpha1.GroupVersion.String(), "kind": "KubernetesCluster",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"mode": "relay"}}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	counter := &countingTransport{patches: map[string]int{}}
	cfg := mgmt.RESTConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter }
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)

	oldCA, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	newCA, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	loaded := &fakeRotation{}
	loaded.set(nil, oldCA.Root)
	b := newTrustBundles(loaded, client, "relaymesh", slog.New(slog.DiscardHandler))
	go b.run(ctx)

	// Idle: nothing offered, an older agent is nothing to record.
	assert.Nil(t, b.Current())
	b.Acknowledged("old-agent", false, nil)

	loaded.set(&ca.RootRotationState{Phase: ca.RootAddingNew, Old: ca.RootFingerprint(oldCA.Root), New: ca.RootFingerprint(newCA.Root), Revision: 3}, oldCA.Root, newCA.Root)
	bundle := b.Current()
	require.NotNil(t, bundle)
	assert.Same(t, bundle, b.Current(), "the bundle is built once per loaded state")
	assert.EqualValues(t, 3, bundle.GetRevision())
	roots, err := ca.ParseTrustBundle(bundle.GetRootsPem())
	require.NoError(t, err)
	assert.Len(t, roots, 2)
	fp := ca.BundleFingerprint([]string{ca.RootFingerprint(oldCA.Root), ca.RootFingerprint(newCA.Root)})
	assert.Equal(t, fp, bundle.GetFingerprint())

	for range 5 {
		b.Acknowledged("acks", true, &relaypb.TrustBundleAck{Fingerprint: fp})
		b.Acknowledged("old-agent", false, nil)
		b.Acknowledged("refuses", true, &relaypb.TrustBundleAck{Fingerprint: fp, Error: "bad\nroot\x1b[31m" + strings.Repeat("x", 2000)})
		b.Acknowledged("deregistered", true, &relaypb.TrustBundleAck{Fingerprint: fp})
	}
	annotations := func(name string) map[string]string {
		u, err := admin.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		return u.GetAnnotations()
	}
	require.Eventually(t, func() bool {
		return annotations("acks")[AnnotationBundleAck] == fp && annotations("old-agent")[AnnotationBundleRefused] != "" &&
			annotations("refuses")[AnnotationBundleRefused] != ""
	}, 30*time.Second, 100*time.Millisecond)
	assert.Equal(t, fp+": "+BundleCannotAck, annotations("old-agent")[AnnotationBundleRefused])
	refusal := annotations("refuses")[AnnotationBundleRefused]
	assert.True(t, strings.HasPrefix(refusal, fp+": bad root"), refusal)
	assert.LessOrEqual(t, len(refusal), len(fp)+2+maxRefusalLen)
	assert.NotContains(t, refusal, "\x1b")
	assert.NotContains(t, annotations("refuses"), AnnotationBundleAck, "a refusal is no acknowledgement")

	// The old agent is upgraded and acknowledges: the refusal goes.
	b.Acknowledged("old-agent", true, &relaypb.TrustBundleAck{Fingerprint: fp})
	require.Eventually(t, func() bool { return annotations("old-agent")[AnnotationBundleAck] == fp }, 30*time.Second, 100*time.Millisecond)
	assert.NotContains(t, annotations("old-agent"), AnnotationBundleRefused)

	// Repeats were not written again, not even while the first write was
	// in flight.
	assert.Equal(t, 1, counter.count("acks"))
	assert.Equal(t, 1, counter.count("refuses"))
	assert.Equal(t, 2, counter.count("old-agent"))
	assert.Equal(t, 1, counter.count("deregistered"), "a cluster that is gone is tried once, not retried")
}
