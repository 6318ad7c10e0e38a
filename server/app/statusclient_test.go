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

	// The server's clients at 20/s.
	rc := mgmt.RESTConfig()
	rc.QPS, rc.Burst = 20, 20
	kube, err := kubeclient.NewClients(rc, "")
	require.NoError(t, err)
	cfg := Default()
	cfg.Namespace = ns
	p := &process{cfg: cfg, kube: kube, log: slog.New(slog.DiscardHandler), reps: &replicas{}, registry: server.NewRegistry(),
		informers: kubeinformers.NewShared(kube.Dynamic, ns)}
	require.NoError(t, p.newStatus(ctx))
	p.status.SessionChanged("west", true)
	require.Eventually(t, func() bool { return connected("west") }, 10*time.Second, 20*time.Millisecond, "the status writer runs")

	// 100 requests waiting at any time in the server's client: each
	// waits about 5 s in its limiter.
	floodCtx, stopFlood := context.WithCancel(ctx)
	var flood sync.WaitGroup
	for range 100 {
		flood.Go(func() {
			for floodCtx.Err() == nil {
				_, _ = kube.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns).Get(floodCtx, "east", metav1.GetOptions{})
			}
		})
	}
	defer func() { stopFlood(); flood.Wait() }()
	time.Sleep(time.Second)
	probe := time.Now()
	_, err = kube.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns).Get(ctx, "east", metav1.GetOptions{})
	require.NoError(t, err)
	queued := time.Since(probe)
	require.Greater(t, queued, 2*time.Second, "the flood queues the server's client")

	start := time.Now()
	p.status.SessionChanged("east", true)
	require.Eventually(t, func() bool { return connected("east") }, 10*time.Second, 20*time.Millisecond)
	assert.Less(t, time.Since(start), queued/2, "the status write does not wait in the server's queue (%s deep)", queued)
}
