package controller_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A TrafficPolicy that applies in 2,000 clusters — more than the 1,024
// entries the CRD allows in status.clusters — gets a status the apiserver
// accepts: counts of every cluster by state, at most 100 clusters listed
// (the failed ones first), at most 256 Destinations and 64 workloads with
// their counts; 2,000 agents acking within a second cost a handful of
// status writes, not one per ack.
func TestPolicyStatusAtFleetScale(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, _, _ := localcluster.Management(t, ns)
	cfg := mgmt.RESTConfig()
	cfg.QPS, cfg.Burst = 1000, 1000
	admin, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)

	// 2,000 clusters' Workload and Destination (one Service each).
	const clusters = 2000
	names := make([]string, clusters)
	for i := range names {
		names[i] = fmt.Sprintf("c%04d", i)
	}
	start := time.Now()
	work := make(chan server.DiscoveredObject)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				_, err := admin.Resource(o.Resource).Namespace(ns).Create(ctx, o.Object, metav1.CreateOptions{})
				assert.NoError(t, err)
			}
		}()
	}
	for _, name := range names {
		objs, err := server.DiscoveredObjects(fleet.SnapshotSpec{}.Snapshot(name), ns)
		require.NoError(t, err)
		for _, o := range objs {
			if o.Resource != discoveryv1alpha1.Meshes {
				work <- o
			}
		}
	}
	close(work)
	wg.Wait()
	t.Logf("%d clusters' Workloads and Destinations created in %s", clusters, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	tpGVR := networkingv1alpha1.TrafficPolicies
	_, err = admin.Resource(tpGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": networkingv1alpha1.GroupVersion.String(), "kind": "TrafficPolicy",
		"metadata": map[string]any{"name": "timeouts"}, "spec": map[string]any{"policy": map[string]any{"requestTimeout": "5s"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// The controller, counting its status writes.
	var statusWrites atomic.Int64
	ccfg := mgmt.RESTConfig()
	ccfg.QPS, ccfg.Burst = 200, 400
	ccfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") {
				statusWrites.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	client, err := dynamic.NewForConfig(ccfg)
	require.NoError(t, err)
	view, outputs := server.NewView(), server.NewOutputs(time.Now())
	_, err = controller.Start(ctx, controller.Config{Client: client, Namespace: ns, Outputs: outputs, Acks: view,
		Clusters: func() []string { return names }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)

	status := func() map[string]any {
		o, err := admin.Resource(tpGVR).Namespace(ns).Get(ctx, "timeouts", metav1.GetOptions{})
		require.NoError(t, err)
		st, _, _ := unstructured.NestedMap(o.Object, "status")
		return st
	}
	counts := func(st map[string]any) string {
		c, _, _ := unstructured.NestedMap(st, "clusterCounts")
		return fmt.Sprintf("total=%v applied=%v pending=%v failed=%v", c["total"], c["applied"], c["pending"], c["failed"])
	}
	require.Eventually(t, func() bool { return counts(status()) == "total=2000 applied=0 pending=2000 failed=0" }, time.Minute, 200*time.Millisecond)
	t.Logf("controller started and status written in %s", time.Since(start).Round(time.Millisecond))
	st := status()
	assert.Equal(t, "Accepted", st["state"])
	assert.EqualValues(t, clusters, st["destinationCount"])
	assert.EqualValues(t, clusters, st["workloadCount"])
	assert.Len(t, st["destinations"], 256)
	workloads, _, _ := unstructured.NestedStringSlice(st, "workloads")
	require.Len(t, workloads, 65)
	assert.Equal(t, "… and 1936 more", workloads[64])
	assert.Len(t, st["clusters"], 100)

	// Every agent acks the set that carries the policy's VirtualService;
	// five report a conflict on it.
	failing := map[string]bool{"c0007": true, "c0500": true, "c1000": true, "c1500": true, "c1999": true}
	before := statusWrites.Load()
	for _, name := range names {
		ack := &relaypb.PullAck{Version: outputs.Version(name)}
		if failing[name] {
			ack.Results = []*relaypb.ObjectResult{{ApiVersion: "networking.istio.io/v1", Kind: "VirtualService", Namespace: "apps-0",
				Name: "relaymesh-svc-0", Outcome: "conflict", Error: "exists and is not Relaymesh's"}}
		}
		view.Acked(name, ack, time.Now())
	}
	require.Eventually(t, func() bool { return counts(status()) == "total=2000 applied=1995 pending=0 failed=5" }, time.Minute, 200*time.Millisecond)
	time.Sleep(2 * time.Second) // let any write still queued land, to count it
	writes := statusWrites.Load() - before
	t.Logf("2,000 acks → %d status writes", writes)
	assert.LessOrEqual(t, writes, int64(20), "acks coalesce into few status writes")

	st = status()
	assert.Equal(t, "Failed", st["state"])
	errs, _, _ := unstructured.NestedStringSlice(st, "errors")
	require.Len(t, errs, 1)
	assert.Equal(t, "outputs not applied in clusters c0007, c0500, c1000, c1500, c1999 (see status.clusters)", errs[0])
	listed, _, _ := unstructured.NestedSlice(st, "clusters")
	require.Len(t, listed, 100)
	failedListed := 0
	for _, c := range listed {
		m := c.(map[string]any)
		if m["state"] == "Failed" {
			failedListed++
			assert.True(t, failing[m["cluster"].(string)], "%v", m)
			assert.Contains(t, fmt.Sprint(m["errors"]), "VirtualService apps-0/relaymesh-svc-0: conflict")
		}
	}
	assert.Equal(t, 5, failedListed, "every failed cluster is listed")
}
