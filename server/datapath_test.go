package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// snapshot is a hashed snapshot of cluster with n apps, each a Workload
// and a Destination (without endpoints).
func snapshot(cluster string, n int) *relaypb.Snapshot {
	return relaytest.Spec{Cluster: cluster, Workloads: n, Destinations: n}.Snapshot()
}

func pushStream(t *testing.T, f *servertest.Server, cred servertest.AgentCred) relaypb.Discovery_PushClient {
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
	f := servertest.New(t, servertest.Options{DataPath: true, Limits: relay.SnapshotLimits{MaxObjects: 100, MaxBytes: 256 << 10}, SnapshotBurst: 100})
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
			return relaytest.Rehash(s)
		}, `destinations[1].cluster: "cluster-2" is not the agent's cluster`},
		{"hash does not match", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 2)
			s.Workloads[0].ServiceAccount = "changed-after-hashing"
			return s
		}, "does not match the content"},
		{"invalid name", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Destinations[0].Name = "../../etc"
			return relaytest.Rehash(s)
		}, `destinations[0].name: "../../etc"`},
		{"invalid label", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Workloads[0].PodLabels["bad key!"] = "x"
			return relaytest.Rehash(s)
		}, "label key"},
		{"duplicate", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Destinations = append(s.Destinations, proto.Clone(s.Destinations[0]).(*relaypb.Destination))
			return relaytest.Rehash(s)
		}, "appears twice"},
		{"unknown workload kind", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Workloads[0].Kind = "Pod"
			return relaytest.Rehash(s)
		}, `workloads[0].kind: "Pod"`},
		{"too many objects", func() *relaypb.Snapshot { return snapshot("cluster-1", 60) }, "objects, at most 100"},
		{"service name too long", func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			s.Destinations[0].Name = strings.Repeat("a", 250)
			return relaytest.Rehash(s)
		}, "destinations[0].name"},
	}
	// What a compromised agent sent to the server of the previous release
	// (issue 14), each now refused with the field path.
	hostile := []struct {
		name   string
		mutate func(s *relaypb.Snapshot)
		want   string
	}{
		{"port 70000", func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].Port = 70000 }, "destinations[0].ports[0].port: 70000 is not a port"},
		{"negative port", func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].Port = -1 }, "destinations[0].ports[0].port: -1 is not a port"},
		{"zero port", func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].Port = 0 }, "destinations[0].ports[0].port: 0 is not a port"},
		{"garbage protocol", func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].Protocol = "QUIC\x00" }, "destinations[0].ports[0].protocol"},
		{"garbage app protocol", func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].AppProtocol = "h2 c" }, "destinations[0].ports[0].appProtocol"},
		{"target port 0", func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].TargetPort = "0" }, "destinations[0].ports[0].targetPort: 0 is not a port"},
		{"target port garbage", func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].TargetPort = "x-y-z-very-long-port-name" }, "destinations[0].ports[0].targetPort"},
		{"garbage port name", func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].Name = "HTTP Port" }, "destinations[0].ports[0].name"},
		{"garbage service type", func(s *relaypb.Snapshot) { s.Destinations[0].ServiceType = "Magic" }, "destinations[0].serviceType"},
		{"garbage external address", func(s *relaypb.Snapshot) { s.Destinations[0].ExternalAddresses = []string{"not an address!"} }, "destinations[0].externalAddresses[0]"},
		{"too many external addresses", func(s *relaypb.Snapshot) {
			for i := range 17 {
				s.Destinations[0].ExternalAddresses = append(s.Destinations[0].ExternalAddresses, fmt.Sprintf("10.0.0.%d", i))
			}
		}, "destinations[0].externalAddresses: 17 addresses, at most 16"},
		{"5,000 subset keys", func(s *relaypb.Snapshot) {
			s.Destinations[0].Subsets = map[string]*relaypb.LabelValues{}
			for i := range 5000 {
				s.Destinations[0].Subsets[fmt.Sprintf("k%d", i)] = &relaypb.LabelValues{Values: []string{"v"}}
			}
		}, "destinations[0].subsets: 5000 subset keys, at most 16"},
		{"subset key garbage", func(s *relaypb.Snapshot) {
			s.Destinations[0].Subsets = map[string]*relaypb.LabelValues{"bad key": {Values: []string{"v1"}}}
		}, "destinations[0].subsets[bad key]"},
		{"empty subset value", func(s *relaypb.Snapshot) {
			s.Destinations[0].Subsets = map[string]*relaypb.LabelValues{"version": {Values: []string{""}}}
		}, "destinations[0].subsets[version]"},
		{"invalid gateway label key", func(s *relaypb.Snapshot) {
			s.Meshes[0].Gateways = []*relaypb.Gateway{{Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest", WorkloadLabels: map[string]string{"-bad-": "x"}}}
		}, "meshes[0].gateways[0].workloadLabels: label key"},
		{"gateway kind", func(s *relaypb.Snapshot) {
			s.Meshes[0].Gateways = []*relaypb.Gateway{{Name: "gw", Namespace: "istio-system", Kind: "Egress"}}
		}, "meshes[0].gateways[0].kind"},
		{"gateway TLS port", func(s *relaypb.Snapshot) {
			s.Meshes[0].Gateways = []*relaypb.Gateway{{Name: "gw", Namespace: "istio-system", Kind: "EastWest", TlsPort: 99999}}
		}, "meshes[0].gateways[0].tlsPort"},
		{"gateway address", func(s *relaypb.Snapshot) {
			s.Meshes[0].Gateways = []*relaypb.Gateway{{Name: "gw", Namespace: "istio-system", Kind: "EastWest", ExternalAddress: "http://x"}}
		}, "meshes[0].gateways[0].externalAddress"},
		{"garbage trust domain", func(s *relaypb.Snapshot) { s.Meshes[0].TrustDomain = "Cluster 1/../x" }, "meshes[0].trustDomain"},
		{"empty trust domain", func(s *relaypb.Snapshot) { s.Meshes[0].TrustDomain = "" }, "meshes[0].trustDomain: empty"},
		{"garbage service account", func(s *relaypb.Snapshot) { s.Workloads[0].ServiceAccount = "Admin!" }, "workloads[0].serviceAccount"},
		{"garbage istiod service account", func(s *relaypb.Snapshot) { s.Meshes[0].IstiodServiceAccount = "a/b" }, "meshes[0].istiodServiceAccount"},
		{"60 KiB mesh version", func(s *relaypb.Snapshot) { s.Meshes[0].Version = strings.Repeat("1", 60<<10) }, "meshes[0].version"},
		{"long mesh version", func(s *relaypb.Snapshot) { s.Meshes[0].Version = strings.Repeat("1", 129) }, "meshes[0].version"},
		{"mesh version garbage", func(s *relaypb.Snapshot) { s.Meshes[0].Version = "1.2\n3" }, "meshes[0].version"},
		{"revision garbage", func(s *relaypb.Snapshot) { s.Meshes[0].Revision = "canary/1" }, "meshes[0].revision"},
		{"endpoint IP not an IP", func(s *relaypb.Snapshot) {
			s.Destinations[0].Endpoints = []*relaypb.Endpoint{{Ip: "10.0.0.1"}, {Ip: "not-an-ip"}}
		}, "destinations[0].endpoints[1].ip"},
		{"endpoint IP with zone", func(s *relaypb.Snapshot) {
			s.Destinations[0].Endpoints = []*relaypb.Endpoint{{Ip: "fe80::1%eth0"}}
		}, "destinations[0].endpoints[0].ip"},
		{"workload of an unknown mesh", func(s *relaypb.Snapshot) { s.Workloads[0].MeshName = "other" }, "workloads[0].mesh: mesh istio-system/other is not a mesh of this snapshot"},
		{"destination of an unknown mesh", func(s *relaypb.Snapshot) { s.Destinations[0].MeshNamespace = "nowhere" }, "destinations[0].mesh"},
		{"mesh name garbage", func(s *relaypb.Snapshot) { s.Meshes[0].Name = "Istiod" }, "meshes[0].name"},
	}
	for _, h := range hostile {
		tests = append(tests, struct {
			name string
			snap func() *relaypb.Snapshot
			want string
		}{h.name, func() *relaypb.Snapshot {
			s := snapshot("cluster-1", 1)
			h.mutate(s)
			return relaytest.Rehash(s)
		}, h.want})
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
	assert.Equal(t, float64(len(tests)), f.Metric(server.MetricSnapshotsRefused, "reason", "invalid"))
}

func TestValidateSnapshotSize(t *testing.T) {
	s := snapshot("cluster-1", 1)
	s.Meshes[0].Version = strings.Repeat("v", 2000)
	err := relay.ValidateSnapshot("cluster-1", relaytest.Rehash(s), relay.SnapshotLimits{MaxBytes: 1024})
	require.ErrorIs(t, err, relay.ErrSnapshotRefused)
	assert.Contains(t, err.Error(), "bytes, at most 1024")
	assert.ErrorIs(t, relay.ValidateSnapshot("cluster-1", nil, relay.SnapshotLimits{}), relay.ErrSnapshotRefused)
}

// A message larger than the transport admits ends the stream with
// ResourceExhausted; nothing is accepted.
func TestPushOversizedMessage(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	cred := f.Bootstrap("cluster-1")
	good := snapshot("cluster-1", 1)
	require.True(t, push(t, pushStream(t, f, cred), good).GetAccepted())
	stream := pushStream(t, f, cred)
	s := snapshot("cluster-1", 1)
	s.Meshes[0].Version = strings.Repeat("v", 5<<20)
	require.NoError(t, stream.Send(relaytest.Rehash(s)))
	_, err := stream.Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "larger than max")
	assert.Equal(t, good.GetHash(), f.View.Snapshot("cluster-1").GetHash(), "the last good snapshot stays")
}

func TestPushFlood(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	stream := pushStream(t, f, f.Bootstrap("cluster-1"))
	var accepted, refused int
	var lastGood string
	for i := range 30 {
		s := snapshot("cluster-1", 1)
		s.Meshes[0].Version = fmt.Sprint(i)
		ack := push(t, stream, relaytest.Rehash(s))
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
	assert.Equal(t, float64(refused), f.Metric(server.MetricSnapshotsRefused, "reason", "rate_limited"))
}

func TestPullDeliversVersionsAndRecordsAcks(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
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
	assert.Equal(t, float64(1), f.Metric(server.MetricApplyResults, "cluster", "cluster-1", "outcome", "conflict"))

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

// A hostile agent acks thousands of conflicts with huge error texts: the
// server keeps at most 1,000, each cut to 256 bytes, plus the results for
// Secrets (mesh CAs), and serves no more than that from /debug.
func TestAckContentsAreBounded(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	c1 := f.Bootstrap("cluster-1")
	f.Outputs.Set("cluster-1", []*relaypb.OutputObject{{Manifest: []byte(`{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"a","namespace":"x"}}`)}})
	stream, err := relaypb.NewDiscoveryClient(f.Dial(f.MTLS(c1.TLS))).Pull(context.Background())
	require.NoError(t, err)
	set, err := stream.Recv()
	require.NoError(t, err)
	ack := &relaypb.PullAck{Version: set.GetVersion()}
	huge := strings.Repeat("é", 400) // 800 bytes, cut on a rune boundary
	for i := range 3000 {
		ack.Results = append(ack.Results, &relaypb.ObjectResult{Kind: "VirtualService", Namespace: "x", Name: fmt.Sprintf("vs-%d", i), Outcome: "conflict", Error: huge})
	}
	ack.Results = append(ack.Results, &relaypb.ObjectResult{Kind: "Secret", Namespace: "istio-system", Name: "cacerts", Outcome: "applied"},
		&relaypb.ObjectResult{Kind: "VirtualService", Namespace: "x", Name: "fine", Outcome: "applied"})
	require.NoError(t, stream.Send(ack))
	require.Eventually(t, func() bool { return f.View.Ack("cluster-1") != nil }, 2*time.Second, 10*time.Millisecond)
	cv := f.View.Clusters()["cluster-1"]
	assert.Len(t, cv.Conflicts, 1000)
	for _, r := range cv.Conflicts {
		require.LessOrEqual(t, len(r.GetError()), 256)
		require.True(t, utf8.ValidString(r.GetError()))
	}
	kept := f.View.Ack("cluster-1")
	assert.Equal(t, set.GetVersion(), kept.GetVersion())
	assert.Len(t, kept.GetResults(), 1001, "1,000 failures and the Secret result; not the applied VirtualService")
	assert.Equal(t, "cacerts", kept.GetResults()[1000].GetName())
}

func TestDataPathNeedsAClientCertificate(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	stream, err := relaypb.NewDiscoveryClient(f.Dial(f.ServerOnly())).Push(context.Background())
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
}

// BenchmarkSnapshotIngestion measures validation (incl. hashing) and
// acceptance of a 10,000-destination snapshot (20,001 objects).
func BenchmarkSnapshotIngestion(b *testing.B) {
	s := snapshot("cluster-1", 10000)
	view := server.NewView()
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
// decoder and the validator: nothing may panic; an accepted snapshot names
// only the agent's cluster, and every discovered object it becomes is one
// the apiserver stores (metadata and CRD schema), so the mirror never
// retries a write the apiserver refuses.
func FuzzValidateSnapshot(f *testing.F) {
	good, _ := proto.Marshal(richSnapshot())
	f.Add(good)
	plain, _ := proto.Marshal(snapshot("cluster-1", 2))
	f.Add(plain)
	ambient, _ := proto.Marshal(relaytest.Ambient())
	f.Add(ambient)
	f.Add([]byte{})
	f.Add(good[:len(good)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		s := &relaypb.Snapshot{}
		if proto.Unmarshal(b, s) != nil {
			return
		}
		// The fuzzer rarely gets a hash right: fix it, so that what
		// follows the hash check is explored.
		relaytest.Rehash(s)
		if relay.ValidateSnapshot("cluster-1", s, relay.SnapshotLimits{}) != nil {
			return
		}
		objs, err := server.DiscoveredObjects(s, "relaymesh")
		require.NoError(t, err)
		for _, o := range objs {
			require.Equal(t, "cluster-1", o.Object.GetLabels()[server.LabelCluster])
			require.Empty(t, schemaErrors(t, o.Object), "accepted snapshot, refused object %s %s", o.Object.GetKind(), o.Object.GetName())
		}
	})
}

// richSnapshot uses every field at the edge of what is accepted.
func richSnapshot() *relaypb.Snapshot {
	s := snapshot("cluster-1", 1)
	m := s.Meshes[0]
	m.Revision, m.Version, m.IstiodServiceAccount, m.SmartDnsProxying = "canary-1", "1.24.2-distroless", "istiod", true
	m.PodLabels = map[string]string{"app.kubernetes.io/name": "istiod", "istio.io/rev": "canary-1"}
	m.Gateways = []*relaypb.Gateway{
		{Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest", WorkloadLabels: map[string]string{"istio": "eastwestgateway"}, ExternalAddress: "a1b2.elb.amazonaws.com", TlsPort: 15443},
		{Name: "istio-ingressgateway", Namespace: "istio-system", Kind: "Ingress", ExternalAddress: "2001:db8::1", TlsPort: 443},
	}
	d := s.Destinations[0]
	d.ServiceType, d.ExternalAddresses = "LoadBalancer", []string{"203.0.113.7", "svc.example.com"}
	d.Ports = []*relaypb.ServicePort{{Port: 65535, Name: "grpc-web", Protocol: "TCP", AppProtocol: "kubernetes.io/h2c", TargetPort: "8080"}, {Port: 1, Protocol: "UDP", TargetPort: "dns"}, {Port: 9, Protocol: "SCTP"}}
	d.Subsets = map[string]*relaypb.LabelValues{"version": {Values: []string{"v1", "v2"}}, "topology.kubernetes.io/zone": {Values: []string{"eu-west-1a"}}}
	d.Endpoints = []*relaypb.Endpoint{{Ip: "10.0.0.7", Labels: map[string]string{"version": "v1"}}, {Ip: "fd00::7"}}
	s.Workloads[0].Kind, s.Workloads[0].ServiceAccount = "StatefulSet", "reviews.v1"
	return relaytest.Rehash(s)
}

// The snapshot at the edge of the rules is accepted, and becomes objects the
// apiserver stores; a name of 253 characters still gives a short object name.
func TestAcceptedSnapshotsBecomeStorableObjects(t *testing.T) {
	s := richSnapshot()
	s.Workloads[0].Name = strings.Repeat("w", 253)
	s.Workloads[0].PodLabels = map[string]string{"example.com/" + strings.Repeat("k", 63): strings.Repeat("v", 63)}
	relaytest.Rehash(s)
	require.NoError(t, relay.ValidateSnapshot("cluster-1", s, relay.SnapshotLimits{}))
	objs, err := server.DiscoveredObjects(s, "relaymesh")
	require.NoError(t, err)
	require.Len(t, objs, 3)
	for _, o := range objs {
		assert.Empty(t, schemaErrors(t, o.Object), "%s %s", o.Object.GetKind(), o.Object.GetName())
		assert.LessOrEqual(t, len(o.Object.GetName()), 51)
	}
}
