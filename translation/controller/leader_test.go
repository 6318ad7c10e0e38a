package controller_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// Two replicas translate the same management cluster; only the one holding
// the Lease writes statuses. When the Lease moves, a change made while
// nobody led (the old leader stopped, the new one still followed) is
// written by the new leader at the start of its term, and the old one
// writes nothing more.
func TestOnlyTheLeaderWritesStatus(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, _, admin := localcluster.Management(t, ns)
	tpGVR := networkingv1alpha1.TrafficPolicies
	_, err := admin.Resource(tpGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": networkingv1alpha1.GroupVersion.String(), "kind": "TrafficPolicy",
		"metadata": map[string]any{"name": "timeouts"}, "spec": map[string]any{"policy": map[string]any{"requestTimeout": "5s"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)

	type replica struct {
		lead   atomic.Bool
		writes atomic.Int64 // requests other than GET
		ctl    *controller.Controller
	}
	start := func(leading bool) *replica {
		r := &replica{}
		r.lead.Store(leading)
		cfg := mgmt.RESTConfig()
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.Method != http.MethodGet {
					r.writes.Add(1)
				}
				return rt.RoundTrip(req)
			})
		}
		client, err := dynamic.NewForConfig(cfg)
		require.NoError(t, err)
		r.ctl, err = controller.Start(ctx, controller.Config{Client: client, Namespace: ns, Outputs: server.NewOutputs(time.Now()),
			Clusters: func() []string { return []string{"c1"} }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Leading: r.lead.Load})
		require.NoError(t, err)
		return r
	}
	a, b := start(true), start(false)
	observed := func() int64 {
		o, err := admin.Resource(tpGVR).Namespace(ns).Get(ctx, "timeouts", metav1.GetOptions{})
		require.NoError(t, err)
		g, _, _ := unstructured.NestedInt64(o.Object, "status", "observedGeneration")
		return g
	}
	require.Eventually(t, func() bool { return observed() == 1 }, 30*time.Second, 50*time.Millisecond, "the leader writes the status")
	b.ctl.Kick()
	time.Sleep(time.Second) // b translates too
	assert.Zero(t, b.writes.Load(), "the follower wrote")
	assert.NotZero(t, a.writes.Load())

	// The Lease moves: a stops leading; before b starts, the policy
	// changes. Both translate it; neither writes.
	a.lead.Store(false)
	a.ctl.Kick()
	time.Sleep(300 * time.Millisecond)
	aWrites := a.writes.Load()
	_, err = admin.Resource(tpGVR).Namespace(ns).Patch(ctx, "timeouts", types.MergePatchType, []byte(`{"spec":{"policy":{"requestTimeout":"7s"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	time.Sleep(1500 * time.Millisecond)
	assert.Equal(t, int64(1), observed(), "nobody leads: nobody writes")
	assert.Zero(t, b.writes.Load())
	assert.Equal(t, aWrites, a.writes.Load())

	// b's term starts: it writes what changed while it followed.
	b.lead.Store(true)
	b.ctl.Kick()
	require.Eventually(t, func() bool { return observed() == 2 }, 30*time.Second, 50*time.Millisecond, "the new leader writes the status")
	assert.NotZero(t, b.writes.Load())
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, aWrites, a.writes.Load(), "the old leader wrote after it stopped leading")
}

// A status is decided on the object at one resourceVersion and written only
// onto that version: when the object changes between the decision and the
// write (another replica wrote, the user edited), the write is refused with
// a Conflict instead of overwriting, and the status is decided again.
func TestStatusWriteIsConditional(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, _, admin := localcluster.Management(t, ns)
	tpGVR := networkingv1alpha1.TrafficPolicies
	_, err := admin.Resource(tpGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": networkingv1alpha1.GroupVersion.String(), "kind": "TrafficPolicy",
		"metadata": map[string]any{"name": "timeouts"}, "spec": map[string]any{"policy": map[string]any{"requestTimeout": "5s"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)

	var intercepted atomic.Bool
	var codes []int
	var mu sync.Mutex
	cfg := mgmt.RESTConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			isStatus := req.Method == http.MethodPatch && strings.HasSuffix(req.URL.Path, "/timeouts/status")
			if isStatus && intercepted.CompareAndSwap(false, true) {
				// Between the decision and the write, the object changes.
				_, err := admin.Resource(tpGVR).Namespace(ns).Patch(req.Context(), "timeouts", types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"edited":"meanwhile"}}}`), metav1.PatchOptions{})
				if err != nil {
					return nil, err
				}
			}
			resp, err := rt.RoundTrip(req)
			if isStatus && err == nil {
				mu.Lock()
				codes = append(codes, resp.StatusCode)
				mu.Unlock()
			}
			return resp, err
		})
	}
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = controller.Start(ctx, controller.Config{Client: client, Namespace: ns, Outputs: server.NewOutputs(time.Now()),
		Clusters: func() []string { return []string{"c1"} }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Leading: func() bool { return true }})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		o, err := admin.Resource(tpGVR).Namespace(ns).Get(ctx, "timeouts", metav1.GetOptions{})
		require.NoError(t, err)
		g, _, _ := unstructured.NestedInt64(o.Object, "status", "observedGeneration")
		return g == 1 && o.GetLabels()["edited"] == "meanwhile"
	}, 30*time.Second, 50*time.Millisecond, "the status is written after the edit, and the edit kept")
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, codes)
	assert.Equal(t, http.StatusConflict, codes[0], "the write decided before the edit is refused: %v", codes)
	assert.Equal(t, http.StatusOK, codes[len(codes)-1], "the status decided again is written: %v", codes)
}
