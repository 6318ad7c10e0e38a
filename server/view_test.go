package server_test

import (
	"context"
	"reflect"
	"testing"
	"time"
	"unsafe"

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

// The view tells listeners about every ack and keeps the last one; the
// outputs report each cluster's current version. Translation builds the
// per-cluster apply status of user objects from the two.
func TestAcksAndVersions(t *testing.T) {
	v := server.NewView()
	var acked []string
	v.OnAck(func(cluster string) { acked = append(acked, cluster) })
	assert.Nil(t, v.Ack("c1"))

	ack := &relaypb.PullAck{Version: 7, Results: []*relaypb.ObjectResult{{Kind: "VirtualService", Namespace: "ns", Name: "vs", Outcome: "conflict"}}}
	v.Acked("c1", ack, time.Now())
	assert.Equal(t, []string{"c1"}, acked)
	require.NotNil(t, v.Ack("c1"))
	assert.Equal(t, uint64(7), v.Ack("c1").GetVersion())
	assert.Len(t, v.Clusters()["c1"].Conflicts, 1)

	o := server.NewOutputs(time.Now())
	assert.Zero(t, o.Version("c1"), "no set yet")
	o.SetFrom("translation", "c1", []*relaypb.OutputObject{{Manifest: []byte(`{"kind":"VirtualService"}`)}})
	first := o.Version("c1")
	assert.NotZero(t, first)
	o.SetFrom("translation", "c1", []*relaypb.OutputObject{{Manifest: []byte(`{"kind":"VirtualService"}`)}})
	assert.Equal(t, first, o.Version("c1"), "an unchanged set keeps its version")
	o.SetFrom("translation", "c1", nil)
	assert.Greater(t, o.Version("c1"), first)
}

// TrustVersion is the version in which a cluster's current trust requests
// were first published: later object changes do not move it, a change of
// the trust requests does (an ack at or after it proves the agent holds
// them).
func TestTrustVersion(t *testing.T) {
	o := server.NewOutputs(time.Now())
	assert.Zero(t, o.TrustVersion("c1"), "nothing published")
	req := &relaypb.TrustRequest{Mesh: "m", Namespace: "istio-system", Issuer: "aa", RootBundle: []byte("pem")}
	o.SetTrust("c1", []*relaypb.TrustRequest{req})
	since := o.TrustVersion("c1")
	assert.Equal(t, o.Version("c1"), since)
	o.SetFrom("translation", "c1", []*relaypb.OutputObject{{Manifest: []byte(`{"kind":"VirtualService"}`)}})
	assert.Greater(t, o.Version("c1"), since)
	assert.Equal(t, since, o.TrustVersion("c1"), "an object change is no trust change")
	o.SetTrust("c1", []*relaypb.TrustRequest{req})
	assert.Equal(t, since, o.TrustVersion("c1"), "the same requests again")
	o.SetTrust("c1", []*relaypb.TrustRequest{{Mesh: "m", Namespace: "istio-system", Hold: true}})
	assert.Greater(t, o.TrustVersion("c1"), since, "a hold is a trust change")
	assert.Equal(t, o.Version("c1"), o.TrustVersion("c1"))
	o.Remove("c1")
	assert.Zero(t, o.TrustVersion("c1"))
}

// signerFunc adapts a function to server.IntermediateSigner.
type signerFunc func(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error)

func (f signerFunc) SignIntermediate(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
	return f(ctx, cluster, req)
}

// Trust.SignIntermediate is for authenticated agents only, and the cluster
// it signs for is the one the client certificate names, never a field of
// the request.
func TestSignIntermediateNeedsAnAgentCertificate(t *testing.T) {
	var clusters []string
	f := servertest.New(t, servertest.Options{Trust: signerFunc(func(_ context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
		clusters = append(clusters, cluster+"/"+req.GetMesh())
		return &relaypb.IntermediateResponse{Issuer: "x"}, nil
	})})
	ctx := context.Background()
	c1 := f.Bootstrap("cluster-1")
	resp, err := relaypb.NewTrustClient(f.Dial(f.MTLS(c1.TLS))).SignIntermediate(ctx, &relaypb.IntermediateRequest{Mesh: "istiod-cluster-2"})
	require.NoError(t, err)
	assert.Equal(t, "x", resp.GetIssuer())
	assert.Equal(t, []string{"cluster-1/istiod-cluster-2"}, clusters, "the caller's cluster comes from its certificate")

	_, err = relaypb.NewTrustClient(f.Dial(f.ServerOnly())).SignIntermediate(ctx, &relaypb.IntermediateRequest{Mesh: "istiod-cluster-1"})
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Len(t, clusters, 1, "an unauthenticated call never reaches the signer")
}

// An accepted snapshot's endpoints with equal labels share one map: the
// pods of one Deployment, behind each Service that selects them. The
// snapshot says what it said before, and its objects are the same.
func TestAcceptSharesEqualEndpointLabels(t *testing.T) {
	snap := relaytest.Rich{Namespaces: 3}.Snapshot("c1")
	before := proto.Clone(snap).(*relaypb.Snapshot)
	objsBefore, err := server.DiscoveredObjects(before, "relaymesh")
	require.NoError(t, err)

	v := server.NewView()
	v.Accept("c1", snap, time.Now())
	got := v.Snapshot("c1")
	assert.True(t, proto.Equal(before, got), "the same snapshot")
	assert.Equal(t, before.GetHash(), got.GetHash())

	maps, endpoints := map[unsafe.Pointer]bool{}, 0
	for _, d := range got.GetDestinations() {
		for _, e := range d.GetEndpoints() {
			maps[reflect.ValueOf(e.GetLabels()).UnsafePointer()] = true
			endpoints++
		}
	}
	assert.Equal(t, 1200, endpoints, "600 pods, behind two Services each")
	assert.Len(t, maps, 3*10*2, "one map per namespace, app and version")

	objsAfter, err := server.DiscoveredObjects(got, "relaymesh")
	require.NoError(t, err)
	require.Len(t, objsAfter, len(objsBefore))
	for i := range objsBefore {
		assert.Equal(t, objsBefore[i].Object.Object, objsAfter[i].Object.Object, "the objects the mirror writes")
	}
}

// BenchmarkShareLabels100k: what sharing the labels of a 100,000-pod
// snapshot's 200,000 endpoints adds to its acceptance: decoded whole (a
// push of an earlier agent, or in process), or shared already as its parts
// were decoded (a chunked push).
func BenchmarkShareLabels100k(b *testing.B) {
	wire, err := proto.Marshal(relaytest.Rich{Namespaces: 500}.Snapshot("c1"))
	require.NoError(b, err)
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "decoded", true: "shared"}[shared], func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				var s relaypb.Snapshot
				require.NoError(b, proto.Unmarshal(wire, &s))
				if shared {
					relay.ShareLabels(&s)
				}
				b.StartTimer()
				relay.ShareLabels(&s)
			}
		})
	}
}

// A large snapshot the mirror has written is held packed: every read
// gives back the snapshot as accepted, the cheap questions (is there one,
// which) do not decode it, and only the snapshot still held is packed.
func TestViewPacksALargeSnapshot(t *testing.T) {
	small := relaytest.Rich{Namespaces: 1}.Snapshot("c1")
	large := relaytest.Rich{Namespaces: 32}.Snapshot("c1")
	require.Less(t, proto.Size(small), server.PackAbove)
	require.Greater(t, proto.Size(large), server.PackAbove)
	want := proto.Clone(large).(*relaypb.Snapshot)

	v := server.NewView()
	changed := 0
	v.OnSnapshot(func(string) { changed++ })
	v.Accept("c1", small, time.Now())
	assert.False(t, v.Pack("c1", small), "a small snapshot stays decoded")
	assert.Same(t, small, v.Snapshot("c1"))

	v.Accept("c1", large, time.Now())
	v.Accept("c1", proto.Clone(large).(*relaypb.Snapshot), time.Now()) // the agent reconnected meanwhile
	assert.Same(t, large, v.Snapshot("c1"), "the same snapshot again: the one held stays")
	assert.False(t, v.Pack("c1", small), "only the snapshot the view holds is packed")
	assert.False(t, v.Pack("c1", proto.Clone(large).(*relaypb.Snapshot)), "not an equal copy either")
	require.True(t, v.Pack("c1", large))
	assert.False(t, v.Pack("c1", large), "packed once")
	assert.True(t, v.HasSnapshot("c1"))
	hash, ok := v.SnapshotHash("c1")
	assert.True(t, ok)
	assert.Equal(t, want.GetHash(), hash)

	got, err := v.Load("c1")
	require.NoError(t, err)
	assert.NotSame(t, large, got, "decoded again")
	assert.True(t, proto.Equal(want, got), "the snapshot as accepted")
	maps := map[unsafe.Pointer]bool{}
	for _, d := range got.GetDestinations() {
		for _, e := range d.GetEndpoints() {
			maps[reflect.ValueOf(e.GetLabels()).UnsafePointer()] = true
		}
	}
	assert.Len(t, maps, 32*10*2, "its equal labels shared again")
	cv, ok := v.State("c1")
	require.True(t, ok)
	assert.Nil(t, cv.Snapshot, "State does not decode it")
	assert.Positive(t, cv.PackedBytes)
	assert.Less(t, cv.PackedBytes, proto.Size(want)/4, "packed: %d bytes of %d", cv.PackedBytes, proto.Size(want))
	assert.True(t, proto.Equal(want, v.Clusters()["c1"].Snapshot), "the debug endpoint's copy too")
	assert.ElementsMatch(t, []string{"c1"}, v.Names())

	// The same snapshot again changes nothing; another one replaces the
	// packed one.
	changed = 0
	v.Accept("c1", proto.Clone(want).(*relaypb.Snapshot), time.Now())
	assert.Zero(t, changed, "same hash: no listener called")
	cv, _ = v.State("c1")
	assert.Positive(t, cv.PackedBytes, "the same snapshot again stays packed")
	v.Accept("c1", small, time.Now())
	assert.Equal(t, 1, changed)
	assert.Same(t, small, v.Snapshot("c1"))
	cv, _ = v.State("c1")
	assert.Zero(t, cv.PackedBytes)

	v.Accept("c1", large, time.Now())
	require.True(t, v.Pack("c1", large))
	v.Remove("c1")
	assert.False(t, v.HasSnapshot("c1"))
	_, ok = v.SnapshotHash("c1")
	assert.False(t, ok)
	got, err = v.Load("c1")
	assert.NoError(t, err)
	assert.Nil(t, got)
}

// BenchmarkPackLargeSnapshot: what holding a 100,000-pod snapshot packed
// costs once (Pack) and at each read of it (Load), and what it is held in.
func BenchmarkPackLargeSnapshot(b *testing.B) {
	snap := relaytest.Rich{Namespaces: 500}.Snapshot("c1")
	relay.ShareLabels(snap)
	b.Run("pack", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			v := server.NewView()
			v.Accept("c1", snap, time.Now())
			b.StartTimer()
			require.True(b, v.Pack("c1", snap))
		}
	})
	v := server.NewView()
	v.Accept("c1", snap, time.Now())
	require.True(b, v.Pack("c1", snap))
	cv, _ := v.State("c1")
	b.Run("load", func(b *testing.B) {
		for b.Loop() {
			_, err := v.Load("c1")
			require.NoError(b, err)
		}
		b.ReportMetric(float64(cv.PackedBytes), "packed-bytes")
		b.ReportMetric(float64(proto.Size(snap)), "encoded-bytes")
	})
}
