package app

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Issue 31: KubernetesCluster statuses are written through a client of
// their own. At a storm's end the mirror's creates queue the server's
// client (--kube-qps) seconds deep, and statuses written through it came
// 15 s after their sessions opened. The status writer newStatus builds
// writes a session's status at once while the server's client is queued
// 5 s deep.
func TestStatusWritesDoNotQueueBehindTheServersClient(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, _, admin := localcluster.Management(t, ns)
	kcs := admin.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns)
	for _, name := range []string{"east", "west"} {
		_, err := kcs.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": multiclusterv1alpha1.GroupVersion.String(), "kind": "KubernetesCluster",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"mode": "relay"}}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	connected := func(name string) bool {
		got, err := kcs.Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		c, _, _ := unstructured.NestedBool(got.Object, "status", "connected")
		return c
	}

	p, kube := slowClientProcess(t, mgmt, ns)
	p.reps, p.registry, p.informers = &replicas{}, server.NewRegistry(), kubeinformers.NewShared(kube.Dynamic, ns)
	require.NoError(t, p.newStatus(ctx))
	p.status.SessionChanged("west", true)
	require.Eventually(t, func() bool { return connected("west") }, 10*time.Second, 20*time.Millisecond, "the status writer runs")

	queued := floodServersClient(t, func(ctx context.Context) error {
		_, err := kube.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns).Get(ctx, "east", metav1.GetOptions{})
		return err
	})

	start := time.Now()
	p.status.SessionChanged("east", true)
	require.Eventually(t, func() bool { return connected("east") }, 10*time.Second, 20*time.Millisecond)
	assert.Less(t, time.Since(start), queued/2, "the status write does not wait in the server's queue (%s deep)", queued)
}

// slowClientProcess is a server process in namespace ns of mgmt whose
// Kubernetes clients (kube) send 20 requests a second.
func slowClientProcess(t *testing.T, mgmt *localcluster.Cluster, ns string) (*process, *kubeclient.Clients) {
	t.Helper()
	rc := mgmt.RESTConfig()
	rc.QPS, rc.Burst = 20, 20
	kube, err := kubeclient.NewClients(rc, "")
	require.NoError(t, err)
	cfg := Default()
	cfg.Namespace = ns
	return &process{cfg: cfg, kube: kube, log: slog.New(slog.DiscardHandler)}, kube
}

// floodServersClient keeps 100 calls of get waiting in the server's
// client (built with 20/s) until the test ends, each waiting about 5 s in
// its limiter, and returns how long one more call then waited.
func floodServersClient(t *testing.T, get func(context.Context) error) time.Duration {
	t.Helper()
	ctx, stop := context.WithCancel(t.Context())
	var flood sync.WaitGroup
	t.Cleanup(func() { stop(); flood.Wait() })
	for range 100 {
		flood.Go(func() {
			for ctx.Err() == nil {
				_ = get(ctx)
			}
		})
	}
	time.Sleep(time.Second)
	probe := time.Now()
	require.NoError(t, get(ctx))
	queued := time.Since(probe)
	require.Greater(t, queued, 2*time.Second, "the flood queues the server's client")
	return queued
}
