package server_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/acks"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
)

func registerCluster(t *testing.T, client dynamic.Interface, name string) server.Registration {
	t.Helper()
	o, err := client.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Create(context.Background(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": multiclusterv1alpha1.GroupVersion.String(), "kind": "KubernetesCluster",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"mode": "relay"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return server.Registration{Name: name, UID: string(o.GetUID())}
}

func clusterStatus(t *testing.T, client dynamic.Interface, name string) (multiclusterv1alpha1.KubernetesClusterStatus, string) {
	t.Helper()
	u, err := client.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	var kc multiclusterv1alpha1.KubernetesCluster
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &kc))
	return kc.Status, kc.ResourceVersion
}

func appliedVersion(st multiclusterv1alpha1.KubernetesClusterStatus) string {
	if st.AppliedOutputs == nil {
		return ""
	}
	return st.AppliedOutputs.Version
}

// Issue 31: an ack is not a status write each. On one replica, an ack that
// only moves the version on (nothing new failed, no Secret changed) is
// written with the heartbeat; an ack with other results at once. With
// several replicas, every ack is in the ack ledger within its interval and
// the other replica's Ack reads the new version from it — paired only
// with the results the record was made of, never a new version with an
// older ack's failures — while the status is not written.
func TestAcksAreNotAStatusWriteEach(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, cs, client := localcluster.Management(t, "relaymesh")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	v := func(n uint64) uint64 { return 1_700_000_000_000_000_000 + n }
	failed := []*relaypb.ObjectResult{{ApiVersion: "networking.istio.io/v1", Kind: "VirtualService", Namespace: "x", Name: "a", Outcome: "conflict", Error: "not ours"}}

	t.Run("one replica", func(t *testing.T) {
		registerCluster(t, client, "solo")
		k := server.NewKubeStatus(client, "relaymesh", log, server.StatusConfig{Coalesce: 10 * time.Millisecond, Heartbeat: 3 * time.Second})
		go k.Run(ctx)
		k.SessionChanged("solo", true)
		k.Acked("solo", &relaypb.PullAck{Version: v(1)})
		require.Eventually(t, func() bool {
			st, _ := clusterStatus(t, client, "solo")
			return appliedVersion(st) == strconv.FormatUint(v(1), 10)
		},
			10*time.Second, 20*time.Millisecond, "the first ack is written at once")
		_, rv := clusterStatus(t, client, "solo")
		for n := uint64(2); n <= 20; n++ {
			k.Acked("solo", &relaypb.PullAck{Version: v(n)})
		}
		time.Sleep(time.Second)
		st, rv2 := clusterStatus(t, client, "solo")
		assert.Equal(t, rv, rv2, "19 acks that only moved the version on wrote nothing within a second")
		assert.Equal(t, strconv.FormatUint(v(1), 10), appliedVersion(st))
		require.Eventually(t, func() bool {
			st, _ := clusterStatus(t, client, "solo")
			return appliedVersion(st) == strconv.FormatUint(v(20), 10)
		},
			10*time.Second, 50*time.Millisecond, "the latest version is written with the heartbeat")

		k.Acked("solo", &relaypb.PullAck{Version: v(21), Results: failed})
		start := time.Now()
		require.Eventually(t, func() bool {
			st, _ := clusterStatus(t, client, "solo")
			return appliedVersion(st) == strconv.FormatUint(v(21), 10) && len(st.AppliedOutputs.Results) == 1
		}, 10*time.Second, 20*time.Millisecond, "an ack with a failure is written at once")
		assert.Less(t, time.Since(start), 2*time.Second, "not with the heartbeat")
		k.Acked("solo", &relaypb.PullAck{Version: v(22)})
		require.Eventually(t, func() bool {
			st, _ := clusterStatus(t, client, "solo")
			return appliedVersion(st) == strconv.FormatUint(v(22), 10) && len(st.AppliedOutputs.Results) == 0
		}, 2*time.Second, 20*time.Millisecond, "a failure resolved leaves the status at once (a merge patch keeps what it omits)")
	})

	t.Run("several replicas", func(t *testing.T) {
		registerCluster(t, client, "c1")
		la, lb := acks.New(cs, "relaymesh", log, 50*time.Millisecond), acks.New(cs, "relaymesh", log, 50*time.Millisecond)
		a := server.NewKubeStatus(client, "relaymesh", log, server.StatusConfig{Replica: "a", Coalesce: 10 * time.Millisecond, Heartbeat: time.Hour, Ledger: la})
		b := server.NewKubeStatus(client, "relaymesh", log, server.StatusConfig{Replica: "b", Coalesce: 10 * time.Millisecond, Heartbeat: time.Hour, Ledger: lb})
		var heard atomic.Int32
		a.OnAck(func(c string) {
			if c == "c1" {
				heard.Add(1)
			}
		})
		require.NoError(t, la.Start(ctx))
		require.NoError(t, lb.Start(ctx))
		go a.Run(ctx)
		go b.Run(ctx)
		b.SessionChanged("c1", true)
		b.Acked("c1", &relaypb.PullAck{Version: v(1)})
		require.Eventually(t, func() bool { return a.Ack("c1").GetVersion() == v(1) }, 10*time.Second, 20*time.Millisecond)
		require.Eventually(t, func() bool { st, _ := clusterStatus(t, client, "c1"); return appliedVersion(st) != "" }, 10*time.Second, 20*time.Millisecond)
		_, rv := clusterStatus(t, client, "c1")

		before := heard.Load()
		for n := uint64(2); n <= 20; n++ {
			b.Acked("c1", &relaypb.PullAck{Version: v(n)})
		}
		require.Eventually(t, func() bool { return a.Ack("c1").GetVersion() == v(20) }, 10*time.Second, 20*time.Millisecond,
			"the other replica reads the latest version from the ledger")
		assert.Greater(t, heard.Load(), before, "its listeners heard of it")
		st, rv2 := clusterStatus(t, client, "c1")
		assert.Equal(t, rv, rv2, "19 acks, and not one status write")
		assert.Equal(t, strconv.FormatUint(v(1), 10), appliedVersion(st))

		// An ack with a failure: a must never pair v(21) with no failures.
		b.Acked("c1", &relaypb.PullAck{Version: v(21), Results: failed})
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := a.Ack("c1")
			if got.GetVersion() == v(21) {
				require.Len(t, got.GetResults(), 1, "the new version comes with its own failures")
				break
			}
			require.LessOrEqual(t, got.GetVersion(), v(20))
			require.True(t, time.Now().Before(deadline), "a never read v21")
			time.Sleep(2 * time.Millisecond)
		}
		// The same failure acked again at a later version: from the ledger,
		// with the failures the status shows.
		b.Acked("c1", &relaypb.PullAck{Version: v(22), Results: failed})
		require.Eventually(t, func() bool { g := a.Ack("c1"); return g.GetVersion() == v(22) && len(g.GetResults()) == 1 }, 10*time.Second, 20*time.Millisecond)
		// The failure resolved: no failures, a new version; never v(23)
		// with v(22)'s failure.
		b.Acked("c1", &relaypb.PullAck{Version: v(23)})
		deadline = time.Now().Add(10 * time.Second)
		for {
			got := a.Ack("c1")
			if got.GetVersion() == v(23) {
				require.Empty(t, got.GetResults(), "v23 failed nothing")
				break
			}
			require.True(t, time.Now().Before(deadline), "a never read v23")
			time.Sleep(2 * time.Millisecond)
		}
		// A stale replica's late ack (the agent left it) moves nothing back.
		a.Acked("c1", &relaypb.PullAck{Version: v(5)})
		time.Sleep(300 * time.Millisecond)
		assert.Equal(t, v(23), b.Ack("c1").GetVersion())
		assert.Equal(t, v(23), a.Ack("c1").GetVersion())
	})
}
