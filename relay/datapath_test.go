package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// snapshot builds a hashed snapshot of cluster with n destinations.
func snapshot(cluster string, n int) *relaypb.Snapshot {
	s := &relaypb.Snapshot{Cluster: cluster, Meshes: []*relaypb.Mesh{{Name: "istiod", Namespace: "istio-system", Cluster: cluster, TrustDomain: cluster + ".local"}}}
	for i := range n {
		s.Workloads = append(s.Workloads, &relaypb.Workload{Name: fmt.Sprintf("app-%d", i), Namespace: "bookinfo", Cluster: cluster, Kind: "Deployment",
			PodLabels: map[string]string{"app": fmt.Sprintf("app-%d", i)}, MeshName: "istiod", MeshNamespace: "istio-system"})
		s.Destinations = append(s.Destinations, &relaypb.Destination{Name: fmt.Sprintf("app-%d", i), Namespace: "bookinfo", Cluster: cluster,
			Selector: map[string]string{"app": fmt.Sprintf("app-%d", i)}, Ports: []*relaypb.ServicePort{{Port: 9080, Name: "http"}},
			MeshName: "istiod", MeshNamespace: "istio-system"})
	}
	s.Hash = discovery.Hash(s)
	return s
}

func rehash(s *relaypb.Snapshot) *relaypb.Snapshot {
	s.Hash = discovery.Hash(s)
	return s
}

func pushStream(t *testing.T, f *relaytest.Server, cred relaytest.AgentCred) relaypb.Discovery_PushClient {
	t.Helper()
	stream, err := relaypb.NewDiscoveryClient(f.Dial(f.MTLS(cred.TLS))).Push(context.Background())
	require.NoError(t, err)
	return stream
}

func push(t *testing.T, stream relaypb.Discovery_PushClient, s *relaypb.Snapshot) *relaypb.PushAck {
	t.Helper()
	require.NoError(t, stream.Send(s))
	ack, err := stream.Recv()
	require.NoError(t, err)
	return ack
}

func TestPushValidation(t *testing.T) {
	f := relaytest.New(t, relaytest.Options{DataPath: true, Limits: relay.SnapshotLimits{MaxObjects: 100, MaxBytes: 64 << 10}})
	stream := pushStream(t, f, f.Bootstrap("cluster-1"))
	good := snapshot("cluster-1", 3)
	ack := push(t, stream, good)
	require.True(t, ack.GetAccepted(), ack.GetError())
	require.Equal(t, good.GetHash(), f.View.Snapshot("cluster-1").GetHash())

	tests := []struct {
		name string
		snap func() *relaypb.Snapshot
		want string
	}{
		{"another cluster's snapshot", func() *relaypb.Snapshot { return snapshot("cluster-2", 1) }, `cluster "cluster-2", but the agent's certificate names "cluster-1"`},
		{"an object of another cluster", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 2)
			s.Destinations[1].Cluster = "cluster-2"
			return rehash(s)
		}, `destinations[1]: cluster "cluster-2" is not the agent's cluster`},
		{"hash does not match", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 2)
			s.Workloads[0].ServiceAccount = "changed-after-hashing"
			return s
		}, "does not match the content"},
		{"invalid name", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Destinations[0].Name = "../../etc"
			return rehash(s)
		}, `destinations[0]: name "../../etc"`},
		{"invalid label", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Workloads[0].PodLabels["bad key!"] = "x"
			return rehash(s)
		}, "label key"},
		{"duplicate", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Destinations = append(s.Destinations, proto.Clone(s.Destinations[0]).(*relaypb.Destination))
			return rehash(s)
		}, "appears twice"},
		{"unknown workload kind", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Workloads[0].Kind = "Pod"
			return rehash(s)
		}, `kind "Pod"`},
		{"too many objects", func() *relaypb.Snapshot { return snapshot("cluster-1", 60) }, "objects, at most 100"},
		{"discovered name too long", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Destinations[0].Name = strings.Repeat("a", 250)
			return rehash(s)
		}, "longer than 253"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ack := push(t, stream, tt.snap())
			assert.False(t, ack.GetAccepted())
			assert.Contains(t, ack.GetError(), tt.want)
			assert.Equal(t, good.GetHash(), f.View.Snapshot("cluster-1").GetHash(), "the last good snapshot stays")
			assert.Contains(t, f.View.Clusters()["cluster-1"].LastError, tt.want)
		})
	}
	assert.Equal(t, float64(len(tests)), f.Metric(relay.MetricSnapshotsRefused, "reason", "invalid"))
}

func TestValidateSnapshotSize(t *testing.T) {
	s := snapshot("cluster-1", 1)
	s.Meshes[0].Version = strings.Repeat("v", 2000)
	err := relay.ValidateSnapshot("cluster-1", rehash(s), relay.SnapshotLimits{MaxBytes: 1024})
	require.ErrorIs(t, err, relay.ErrSnapshotRefused)
	assert.Contains(t, err.Error(), "bytes, at most 1024")
	assert.ErrorIs(t, relay.ValidateSnapshot("cluster-1", nil, relay.SnapshotLimits{}), relay.ErrSnapshotRefused)
}

// A message larger than the transport admits ends the stream with
// ResourceExhausted; nothing is accepted.
func TestPushOversizedMessage(t *testing.T) {
	f := relaytest.New(t, relaytest.Options{DataPath: true})
	cred := f.Bootstrap("cluster-1")
	good := snapshot("cluster-1", 1)
	require.True(t, push(t, pushStream(t, f, cred), good).GetAccepted())
	stream := pushStream(t, f, cred)
	s := snapshot("cluster-1", 1)
	s.Meshes[0].Version = strings.Repeat("v", 5<<20)
	require.NoError(t, stream.Send(rehash(s)))
	_, err := stream.Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "larger than max")
	assert.Equal(t, good.GetHash(), f.View.Snapshot("cluster-1").GetHash(), "the last good snapshot stays")
}

func TestPushFlood(t *testing.T) {
	f := relaytest.New(t, relaytest.Options{DataPath: true})
	stream := pushStream(t, f, f.Bootstrap("cluster-1"))
	var accepted, refused int
	var lastGood string
	for i := range 30 {
		s := snapshot("cluster-1", 1)
		s.Meshes[0].Version = fmt.Sprint(i)
		ack := push(t, stream, rehash(s))
		if ack.GetAccepted() {
			accepted++
			lastGood = s.GetHash()
		} else {
			refused++
			assert.Contains(t, ack.GetError(), "snapshots per second")
		}
	}
	assert.Positive(t, refused, "a flood is refused")
	assert.LessOrEqual(t, accepted, 12)
	assert.Equal(t, lastGood, f.View.Snapshot("cluster-1").GetHash(), "the last accepted snapshot stays")
	assert.Equal(t, float64(refused), f.Metric(relay.MetricSnapshotsRefused, "reason", "rate_limited"))
}

func TestPullDeliversVersionsAndRecordsAcks(t *testing.T) {
	f := relaytest.New(t, relaytest.Options{DataPath: true})
	c1 := f.Bootstrap("cluster-1")
	f.Outputs.Set("cluster-1", []*relaypb.OutputObject{{Manifest: []byte(`{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"a","namespace":"x"}}`), Parents: []string{"TrafficPolicy/x/p"}}})
	f.Outputs.Set("cluster-2", []*relaypb.OutputObject{{Manifest: []byte(`{"secret":"for cluster-2 only"}`)}})
	stream, err := relaypb.NewDiscoveryClient(f.Dial(f.MTLS(c1.TLS))).Pull(context.Background())
	require.NoError(t, err)
	set, err := stream.Recv()
	require.NoError(t, err)
	require.Len(t, set.GetObjects(), 1, "only cluster-1's set")
	assert.Contains(t, string(set.GetObjects()[0].GetManifest()), `"name":"a"`)
	require.NoError(t, stream.Send(&relaypb.PullAck{Version: set.GetVersion(), Results: []*relaypb.ObjectResult{{Kind: "VirtualService", Namespace: "x", Name: "a", Outcome: "conflict", Error: "exists and is not managed by relaymesh"}}}))
	require.Eventually(t, func() bool { return f.View.Clusters()["cluster-1"].Ack != nil }, 2*time.Second, 10*time.Millisecond)
	assert.Len(t, f.View.Clusters()["cluster-1"].Conflicts, 1)
	assert.Equal(t, float64(1), f.Metric(relay.MetricApplyResults, "cluster", "cluster-1", "outcome", "conflict"))

	f.Outputs.Set("cluster-1", nil)
	next, err := stream.Recv()
	require.NoError(t, err)
	assert.Greater(t, next.GetVersion(), set.GetVersion())
	assert.Empty(t, next.GetObjects())

	// Deregistration ends the stream.
	f.Registry.Remove("cluster-1")
	_, err = stream.Recv()
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
}

func TestDataPathNeedsAClientCertificate(t *testing.T) {
	f := relaytest.New(t, relaytest.Options{DataPath: true})
	stream, err := relaypb.NewDiscoveryClient(f.Dial(f.ServerOnly())).Push(context.Background())
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
}

// BenchmarkSnapshotIngestion measures validation (incl. hashing) and
// acceptance of a 10,000-destination snapshot (20,001 objects).
func BenchmarkSnapshotIngestion(b *testing.B) {
	s := snapshot("cluster-1", 10000)
	view := relay.NewView()
	objects := len(s.GetMeshes()) + len(s.GetWorkloads()) + len(s.GetDestinations())
	for b.Loop() {
		if err := relay.ValidateSnapshot("cluster-1", s, relay.SnapshotLimits{}); err != nil {
			b.Fatal(err)
		}
		view.Accept("cluster-1", s, time.Now())
	}
	b.ReportMetric(float64(objects*b.N)/b.Elapsed().Seconds(), "objects/s")
	b.ReportMetric(float64(proto.Size(s)), "bytes/snapshot")
}

// FuzzValidateSnapshot feeds arbitrary wire bytes through the protobuf
// decoder and the validator: nothing may panic, and an accepted snapshot
// must name only the agent's cluster.
func FuzzValidateSnapshot(f *testing.F) {
	good, _ := proto.Marshal(snapshot("cluster-1", 2))
	f.Add(good)
	f.Add([]byte{})
	f.Add(good[:len(good)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		s := &relaypb.Snapshot{}
		if proto.Unmarshal(b, s) != nil {
			return
		}
		if relay.ValidateSnapshot("cluster-1", s, relay.SnapshotLimits{}) != nil {
			return
		}
		for _, d := range s.GetDestinations() {
			require.Equal(t, "cluster-1", d.GetCluster())
		}
		for _, w := range s.GetWorkloads() {
			require.Equal(t, "cluster-1", w.GetCluster())
		}
	})
}

func TestValidateSnapshotAmbiguousNames(t *testing.T) {
	s := snapshot("cluster-1", 0)
	s.Destinations = []*relaypb.Destination{
		{Name: "a-b", Namespace: "c", Cluster: "cluster-1", MeshName: "istiod", MeshNamespace: "istio-system"},
		{Name: "a", Namespace: "b-c", Cluster: "cluster-1", MeshName: "istiod", MeshNamespace: "istio-system"},
	}
	err := relay.ValidateSnapshot("cluster-1", rehash(s), relay.SnapshotLimits{})
	require.ErrorIs(t, err, relay.ErrSnapshotRefused)
	assert.Contains(t, err.Error(), "map to the same discovered name a-b-c-cluster-1")

	s = snapshot("cluster-1", 0)
	s.Workloads = []*relaypb.Workload{{Name: strings.Repeat("w", 225), Namespace: "bookinfo", Cluster: "cluster-1", Kind: "StatefulSet", MeshName: "istiod", MeshNamespace: "istio-system"}}
	err = relay.ValidateSnapshot("cluster-1", rehash(s), relay.SnapshotLimits{})
	require.ErrorIs(t, err, relay.ErrSnapshotRefused, "the -statefulset suffix counts")
	assert.Contains(t, err.Error(), "longer than 253")
}
