package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// budgetSnapshot is one cluster of the HA design's budget: 100 Services,
// each selecting 10 workloads (Deployments) with 3 ready pods each, so 30
// endpoints per Service.
func budgetSnapshot(cluster string) *relaypb.Snapshot {
	s := fleet.SnapshotSpec{Services: 100, PodsPerService: 30}.Snapshot(cluster)
	base := s.GetWorkloads()
	for _, w := range base {
		for i := 1; i < 10; i++ {
			c := &relaypb.Workload{Name: fmt.Sprintf("%s-v%d", w.GetName(), i), Namespace: w.GetNamespace(), Cluster: w.GetCluster(), Kind: w.GetKind(),
				PodLabels: w.GetPodLabels(), ServiceAccount: w.GetServiceAccount(), MeshName: w.GetMeshName(), MeshNamespace: w.GetMeshNamespace()}
			s.Workloads = append(s.Workloads, c)
		}
	}
	return relaytest.Rehash(s)
}

// etcdBytes reads the apiserver's apiserver_storage_size_bytes: the size
// of etcd's database file.
func etcdBytes(b *testing.B, cs kubernetes.Interface) float64 {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	require.NoError(b, err)
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "apiserver_storage_size_bytes{") {
			v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
			require.NoError(b, err)
			return v
		}
	}
	b.Fatal("apiserver_storage_size_bytes not exported")
	return 0
}

// BenchmarkMirrorStoreBudget mirrors clusters of the HA budget's shape
// into a real apiserver and etcd and reports what one cluster costs the
// store: bytes per Workload and per Destination as the apiserver returns
// them (JSON with managedFields, what etcd holds for a custom resource),
// the growth of etcd's database per cluster, and the writes of one
// cluster's first mirror. The design note multiplies them by 1,000.
func BenchmarkMirrorStoreBudget(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, cs, _ := localcluster.Management(b, ns)
	cfg := mgmt.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(b, err)
	view := server.NewView()
	reg := prometheus.NewRegistry()
	mirror := server.NewMirrorWithConfig(client, ns, view, slog.New(slog.NewTextHandler(io.Discard, nil)), server.MirrorConfig{Registerer: reg})
	go mirror.Run(ctx)

	const clusters = 3
	before := etcdBytes(b, cs)
	for i := range clusters {
		view.Accept(fmt.Sprintf("budget-%d", i), budgetSnapshot(fmt.Sprintf("budget-%d", i)), time.Now())
	}
	count := func(gvr schema.GroupVersionResource) (n, size int) {
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/apis", gvr.Group, gvr.Version, "namespaces", ns, gvr.Resource).DoRaw(ctx)
		require.NoError(b, err)
		var l struct {
			Items []json.RawMessage `json:"items"`
		}
		require.NoError(b, json.Unmarshal(raw, &l))
		for _, it := range l.Items {
			size += len(it)
		}
		return len(l.Items), size
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		w, _ := count(discoveryv1alpha1.Workloads)
		d, _ := count(discoveryv1alpha1.Destinations)
		if w == clusters*1000 && d == clusters*100 {
			break
		}
		require.True(b, time.Now().Before(deadline), "mirror did not finish: %d workloads, %d destinations", w, d)
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // let etcd account for the last writes
	after := etcdBytes(b, cs)
	var wBytes, dBytes float64
	for b.Loop() {
		w, wb := count(discoveryv1alpha1.Workloads)
		d, db := count(discoveryv1alpha1.Destinations)
		wBytes, dBytes = float64(wb)/float64(w), float64(db)/float64(d)
	}
	b.ReportMetric(wBytes, "B/workload")
	b.ReportMetric(dBytes, "B/destination")
	b.ReportMetric((after-before)/clusters, "etcd-B/cluster")
	mfs, err := reg.Gather()
	require.NoError(b, err)
	total := 0.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue()
		}
	}
	require.Positive(b, total)
	b.ReportMetric(total/clusters, "writes/cluster")
}
