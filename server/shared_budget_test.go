package server_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// redisUsedMemory reads INFO memory's used_memory.
func redisUsedMemory(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "memory").Result()
	require.NoError(b, err)
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			n, err := strconv.ParseFloat(v, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatal("no used_memory in INFO")
	return 0
}

// BenchmarkSnapshotStoreBudget is BenchmarkMirrorStoreBudget with
// --snapshot-store=redis: clusters of the HA budget's shape (1,000
// Workloads, 100 Destinations of 30 endpoints) are mirrored into a real
// apiserver and etcd (Meshes and Destinations only) and stored in a real
// Redis (TLS, a password) as full snapshots. It reports what one cluster
// costs each store: etcd's growth and the apiserver writes of its first
// mirror, Redis's memory and writes, and the record's size.
func BenchmarkSnapshotStoreBudget(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, cs, _ := localcluster.Management(b, ns)
	cfg := mgmt.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(b, err)
	rds, err := localcluster.StartRedis(ctx, localcluster.RedisConfig{Dir: b.TempDir()})
	require.NoError(b, err)
	b.Cleanup(func() { _ = rds.Stop() })
	raw := redis.NewClient(&redis.Options{Addr: rds.Address(), Password: rds.Password(), TLSConfig: rds.TLS(), Protocol: 2, DisableIdentity: true})
	defer raw.Close()

	view := server.NewView()
	reg := prometheus.NewRegistry()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mirror := server.NewMirrorWithConfig(client, ns, view, quiet, server.MirrorConfig{Registerer: reg, WorkloadsElsewhere: true})
	go mirror.Run(ctx)
	storeReg := prometheus.NewRegistry()
	store, err := snapshots.New(snapshots.Config{Address: rds.Address(), Password: rds.Password(), TLS: rds.TLS(), Key: bytes.Repeat([]byte{9}, 32), Registerer: storeReg})
	require.NoError(b, err)
	defer store.Close()
	shared, err := server.NewSharedSnapshots(server.SharedConfig{Store: store, View: view, Namespace: ns, Replica: "r", Registered: func(string) bool { return true }, Logger: quiet})
	require.NoError(b, err)
	go shared.Run(ctx)
	require.NoError(b, shared.WaitSynced(ctx))

	const clusters = 3
	etcdBefore, redisBefore := etcdBytes(b, cs), redisUsedMemory(b, raw)
	for i := range clusters {
		view.Accept(fmt.Sprintf("budget-%d", i), budgetSnapshot(fmt.Sprintf("budget-%d", i)), time.Now())
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		d, err := client.Resource(discoveryv1alpha1.Destinations).Namespace(ns).List(ctx, metav1.ListOptions{})
		require.NoError(b, err)
		w := len(shared.Workloads())
		if len(d.Items) == clusters*100 && w == clusters*1000 {
			break
		}
		require.True(b, time.Now().Before(deadline), "not stored: %d destinations, %d workloads", len(d.Items), w)
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // let etcd account for the last writes
	etcdAfter, redisAfter := etcdBytes(b, cs), redisUsedMemory(b, raw)
	w, err := client.Resource(discoveryv1alpha1.Workloads).Namespace(ns).List(ctx, metav1.ListOptions{})
	require.NoError(b, err)
	require.Empty(b, w.Items, "no Workload object in the apiserver")

	var recordBytes float64
	for b.Loop() {
		n, err := raw.HStrLen(ctx, "relaymesh:snapshot:budget-0", "rec").Result()
		require.NoError(b, err)
		recordBytes = float64(n)
	}
	b.ReportMetric((etcdAfter-etcdBefore)/clusters, "etcd-B/cluster")
	b.ReportMetric(counterSum(b, reg)/clusters, "apiserver-writes/cluster")
	b.ReportMetric((redisAfter-redisBefore)/clusters, "redis-B/cluster")
	b.ReportMetric(recordBytes, "record-B")
	b.ReportMetric(counterSum(b, storeReg, `operation="put"`)/clusters, "redis-writes/cluster")
}

// counterSum adds up every counter of reg (whose labels contain match, if
// given).
func counterSum(b *testing.B, reg *prometheus.Registry, match ...string) float64 {
	mfs, err := reg.Gather()
	require.NoError(b, err)
	total := 0.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += fmt.Sprintf("%s=%q,", l.GetName(), l.GetValue())
			}
			if len(match) > 0 && !strings.Contains(labels, match[0]) {
				continue
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

var sharedClusters = flag.Int("shared.clusters", 100, "clusters of the budget's shape BenchmarkSharedSnapshotsRead puts in Redis (the design's budget: 1000)")

// BenchmarkSharedSnapshotsRead stores -shared.clusters clusters of the
// budget's shape in a real Redis and measures what a replica pays to read
// them all at start (or after the store came back): the time until it
// holds every cluster's Workloads, and the heap they take.
func BenchmarkSharedSnapshotsRead(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rds, err := localcluster.StartRedis(ctx, localcluster.RedisConfig{Dir: b.TempDir()})
	require.NoError(b, err)
	b.Cleanup(func() { _ = rds.Stop() })
	key := bytes.Repeat([]byte{9}, 32)
	open := func() *snapshots.Store {
		s, err := snapshots.New(snapshots.Config{Address: rds.Address(), Password: rds.Password(), TLS: rds.TLS(), Key: key, Timeout: 30 * time.Second})
		require.NoError(b, err)
		return s
	}
	writer := open()
	defer writer.Close()
	for i := range *sharedClusters {
		c := fmt.Sprintf("budget-%d", i)
		s := budgetSnapshot(c)
		_, err := writer.Put(ctx, snapshots.Record{Cluster: c, Snapshot: s, Replica: "w", AcceptedAt: time.Now()})
		require.NoError(b, err)
	}
	want := *sharedClusters * 1000
	var took time.Duration
	var heap uint64
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		store := open()
		shared, err := server.NewSharedSnapshots(server.SharedConfig{Store: store, View: server.NewView(), Namespace: "relaymesh", Registered: func(string) bool { return true }})
		require.NoError(b, err)
		rctx, stop := context.WithCancel(ctx)
		start := time.Now()
		go shared.Run(rctx)
		require.NoError(b, shared.WaitSynced(rctx))
		took = time.Since(start)
		require.Len(b, shared.Workloads(), want)
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		heap = after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc)
		runtime.KeepAlive(shared)
		stop()
		_ = store.Close()
	}
	b.ReportMetric(float64(*sharedClusters), "clusters")
	b.ReportMetric(took.Seconds(), "s-to-read-all")
	b.ReportMetric(float64(heap)/float64(want), "heap-B/workload")
}
