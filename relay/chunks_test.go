package relay

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// testSnapshot is a valid snapshot of cluster-1 with n destinations.
func testSnapshot(n int) *relaypb.Snapshot {
	s := &relaypb.Snapshot{Cluster: "cluster-1", Meshes: []*relaypb.Mesh{{Name: "istiod", Namespace: "istio-system", Cluster: "cluster-1", TrustDomain: "cluster-1.local"}}}
	for i := range n {
		s.Destinations = append(s.Destinations, &relaypb.Destination{Name: fmt.Sprintf("app-%d", i), Namespace: "bookinfo", Cluster: "cluster-1",
			Selector: map[string]string{"app": fmt.Sprintf("app-%d", i)}, Ports: []*relaypb.ServicePort{{Port: 9080, Name: "http"}},
			MeshName: "istiod", MeshNamespace: "istio-system",
			Endpoints: []*relaypb.Endpoint{{Ip: fmt.Sprintf("10.0.%d.%d", i>>8&255, i&255), Labels: map[string]string{"app": fmt.Sprintf("app-%d", i)}}}})
	}
	s.Hash = discovery.Hash(s)
	return s
}

// encoding is what the agent sends of s: the deterministic encoding
// without the hash, and its SHA-256.
func encoding(t testing.TB, s *relaypb.Snapshot) ([]byte, string) {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(withoutHash(s))
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// chunked frames data as a header, parts of partSize and an end.
func chunked(cluster, hash string, data []byte, partSize int) []*relaypb.SnapshotChunk {
	parts := (len(data) + partSize - 1) / partSize
	out := []*relaypb.SnapshotChunk{header(cluster, hash, len(data), parts)}
	for i := range parts {
		out = append(out, part(i, data[i*partSize:min(len(data), (i+1)*partSize)]))
	}
	return append(out, end(hash))
}

func header(cluster, hash string, size, parts int) *relaypb.SnapshotChunk {
	return &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Header{Header: &relaypb.SnapshotHeader{Cluster: cluster, Hash: hash, Size: uint64(size), Parts: uint32(parts)}}}
}

func part(i int, data []byte) *relaypb.SnapshotChunk {
	return &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Part{Part: &relaypb.SnapshotPart{Index: uint32(i), Data: data}}}
}

func end(hash string) *relaypb.SnapshotChunk {
	return &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_End{End: &relaypb.SnapshotEnd{Hash: hash}}}
}

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// testAssembler assembles for cluster-1 with parts of 64 to 256 bytes.
func testAssembler(budget *snapshotBudget, clock *fakeClock) *assembler {
	return newAssembler(assemblerConfig{cluster: "cluster-1", budget: budget, deadline: 10 * time.Second, now: clock.now,
		limits: SnapshotLimits{MaxChunkedBytes: 64 << 10}, maxPart: 256, minPart: 64})
}

func newTestBudget(limit int64) *snapshotBudget {
	return newSnapshotBudget(limit, prometheus.NewGauge(prometheus.GaugeOpts{Name: "test"}))
}

func TestAssemblerAssemblesInOrder(t *testing.T) {
	s := testSnapshot(20)
	data, hash := encoding(t, s)
	require.Equal(t, s.GetHash(), hash, "the agent's hash is discovery.Hash")
	budget := newTestBudget(1 << 20)
	a := testAssembler(budget, &fakeClock{t: time.Unix(1000, 0)})
	msgs := chunked("cluster-1", hash, data, 256)
	require.Greater(t, len(msgs), 4, "several parts")
	for i, m := range msgs {
		out, err := a.add(m)
		require.NoError(t, err)
		if i < len(msgs)-1 {
			require.Nil(t, out)
			continue
		}
		require.NotNil(t, out)
		require.NoError(t, out.err)
		assert.True(t, proto.Equal(s, out.snapshot), "the assembled snapshot is the one sent")
		assert.Equal(t, len(data), out.size)
		assert.NoError(t, validateSnapshot("cluster-1", out.snapshot, SnapshotLimits{}.withDefaults(), discovery.Hash), "and passes ValidateSnapshot's checks, its hash included")
	}
	assert.Positive(t, budget.inUse(), "reserved until released")
	a.release()
	assert.Zero(t, budget.inUse())

	// The stream goes on: a second snapshot after the first.
	s2 := testSnapshot(3)
	data2, hash2 := encoding(t, s2)
	var out *assembled
	for _, m := range chunked("cluster-1", hash2, data2, 256) {
		var err error
		out, err = a.add(m)
		require.NoError(t, err)
	}
	require.NotNil(t, out)
	assert.True(t, proto.Equal(s2, out.snapshot))
	a.close()
	assert.Zero(t, budget.inUse())
}

// Every broken framing refuses the stream with its code, and the
// assembler keeps nothing.
func TestAssemblerRefusesBrokenFraming(t *testing.T) {
	data, hash := encoding(t, testSnapshot(20))
	require.Greater(t, len(data), 4*256)
	good := chunked("cluster-1", hash, data, 256)
	hdr, p0, p1, p2, last := good[0], good[1], good[2], good[3], good[len(good)-1]
	n := len(good) - 2
	big, bigHash := encoding(t, testSnapshot(2000))
	tests := []struct {
		name   string
		msgs   []*relaypb.SnapshotChunk
		code   codes.Code
		reason string
		want   string
	}{
		{"parts out of order", []*relaypb.SnapshotChunk{hdr, p0, p2}, codes.InvalidArgument, "framing", "part 2, but part 1 comes next"},
		{"a part twice", []*relaypb.SnapshotChunk{hdr, p0, p0}, codes.InvalidArgument, "framing", "part 0, but part 1 comes next"},
		{"a part too large", []*relaypb.SnapshotChunk{hdr, part(0, data[:257])}, codes.InvalidArgument, "too_large", "part 0 of 257 bytes, at most 256"},
		{"a small part before the last", []*relaypb.SnapshotChunk{hdr, part(0, data[:10])}, codes.InvalidArgument, "framing", "all parts but the last carry at least 64"},
		{"an empty part", []*relaypb.SnapshotChunk{hdr, part(0, nil)}, codes.InvalidArgument, "framing", "part 0 of 0 bytes"},
		{"more bytes than announced", []*relaypb.SnapshotChunk{header("cluster-1", hash, 300, 2), p0, part(1, data[256:512])}, codes.InvalidArgument, "too_large", "more than the 300 bytes the header announced"},
		{"more parts than announced", append(append([]*relaypb.SnapshotChunk{hdr}, good[1:n+1]...), part(n, data[:256])), codes.InvalidArgument, "framing", fmt.Sprintf("part %d, but the header announced %d", n, n)},
		{"total over the limit", []*relaypb.SnapshotChunk{header("cluster-1", bigHash, len(big), (len(big)+255)/256)}, codes.InvalidArgument, "too_large", fmt.Sprintf("snapshot of %d bytes; at least 1, at most 65536", len(big))},
		{"an empty snapshot", []*relaypb.SnapshotChunk{header("cluster-1", hash, 0, 0)}, codes.InvalidArgument, "too_large", "snapshot of 0 bytes"},
		{"too few parts for the size", []*relaypb.SnapshotChunk{header("cluster-1", hash, len(data), 1)}, codes.InvalidArgument, "framing", "1 parts for"},
		{"too many parts for the size", []*relaypb.SnapshotChunk{header("cluster-1", hash, 1000, 100)}, codes.InvalidArgument, "framing", "100 parts for 1000 bytes"},
		{"a header for another cluster", []*relaypb.SnapshotChunk{header("cluster-2", hash, len(data), n)}, codes.InvalidArgument, "framing", `header for cluster "cluster-2", but the agent's certificate names "cluster-1"`},
		{"a header with a bad hash", []*relaypb.SnapshotChunk{header("cluster-1", "not-a-hash", len(data), n)}, codes.InvalidArgument, "framing", "is not 64 lower-case hex digits"},
		{"an upper-case hash", []*relaypb.SnapshotChunk{header("cluster-1", "A"+hash[1:], len(data), n)}, codes.InvalidArgument, "framing", "is not 64 lower-case hex digits"},
		{"a second header mid-snapshot", []*relaypb.SnapshotChunk{hdr, p0, hdr}, codes.InvalidArgument, "framing", "a second header before the end of snapshot " + hash},
		{"a part without a header", []*relaypb.SnapshotChunk{p0}, codes.InvalidArgument, "framing", "part 0 without a header"},
		{"an end without a header", []*relaypb.SnapshotChunk{last}, codes.InvalidArgument, "framing", "an end without a header"},
		{"an end before the last part", []*relaypb.SnapshotChunk{hdr, p0, p1, last}, codes.InvalidArgument, "framing", fmt.Sprintf("end after 2 of %d parts", n)},
		{"an end of another snapshot", []*relaypb.SnapshotChunk{hdr, end(bigHash)}, codes.InvalidArgument, "framing", "but snapshot " + hash + " is in transit"},
		{"an empty message", []*relaypb.SnapshotChunk{hdr, {}}, codes.InvalidArgument, "framing", "neither a header, a part nor an end"},
		{"a nil message", []*relaypb.SnapshotChunk{nil}, codes.InvalidArgument, "framing", "neither a header, a part nor an end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			budget := newTestBudget(1 << 20)
			a := testAssembler(budget, &fakeClock{t: time.Unix(1000, 0)})
			var err error
			for i, m := range tc.msgs {
				var out *assembled
				out, err = a.add(m)
				if i < len(tc.msgs)-1 {
					require.NoError(t, err, "message %d", i)
					require.Nil(t, out)
				}
			}
			var ce *chunkError
			require.ErrorAs(t, err, &ce)
			assert.ErrorIs(t, err, ErrSnapshotRefused)
			assert.Equal(t, tc.code, ce.code)
			assert.Equal(t, tc.reason, ce.reason)
			assert.Contains(t, err.Error(), tc.want)
			assert.Zero(t, budget.inUse(), "nothing stays reserved")
			_, inTransit := a.deadline()
			assert.False(t, inTransit, "nothing stays in transit")
		})
	}
}

func TestAssemblerDeadline(t *testing.T) {
	data, hash := encoding(t, testSnapshot(20))
	msgs := chunked("cluster-1", hash, data, 256)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	budget := newTestBudget(1 << 20)
	a := testAssembler(budget, clock)
	_, err := a.add(msgs[0])
	require.NoError(t, err)
	dl, ok := a.deadline()
	require.True(t, ok)
	assert.Equal(t, clock.t.Add(10*time.Second), dl)

	// A part that comes too late refuses the snapshot.
	clock.t = clock.t.Add(11 * time.Second)
	_, err = a.add(msgs[1])
	var ce *chunkError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.DeadlineExceeded, ce.code)
	assert.Contains(t, err.Error(), "not complete within 10s (0 of")
	assert.Zero(t, budget.inUse())

	// No part at all: the stream's timer calls expire.
	_, err = a.add(msgs[0])
	require.NoError(t, err)
	err = a.expire()
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.DeadlineExceeded, ce.code)
	assert.Zero(t, budget.inUse())
}

func TestAssemblerBudget(t *testing.T) {
	data, hash := encoding(t, testSnapshot(20))
	msgs := chunked("cluster-1", hash, data, 256)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	size := int64(len(data))

	// No room for the parts.
	budget := newTestBudget(2*size - 1)
	_, err := testAssembler(budget, clock).add(msgs[0])
	var ce *chunkError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.ResourceExhausted, ce.code)
	assert.Equal(t, "memory", ce.reason)
	assert.Contains(t, err.Error(), "the server's memory for snapshots in transit is in use")
	assert.Zero(t, budget.inUse())

	// Room for the parts, not for decoding them while another cluster
	// holds the rest.
	budget = newTestBudget(40 * size)
	require.Nil(t, budget.reserve("cluster-2", 37*size))
	a := testAssembler(budget, clock)
	_, err = a.add(msgs[0])
	require.NoError(t, err)
	for _, m := range msgs[1:] {
		if _, err = a.add(m); err != nil {
			break
		}
	}
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.ResourceExhausted, ce.code)
	assert.Equal(t, 37*size, budget.inUse(), "only the other cluster's reservation is left")
	budget.release("cluster-2")

	// One snapshot of a cluster at a time, whatever the stream.
	a, b := testAssembler(budget, clock), testAssembler(budget, clock)
	_, err = a.add(msgs[0])
	require.NoError(t, err)
	_, err = b.add(msgs[0])
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.ResourceExhausted, ce.code)
	assert.Equal(t, "cluster_busy", ce.reason)
	a.close()
	_, err = b.add(msgs[0])
	require.NoError(t, err, "free again once the first stream is gone")
	b.close()
	assert.Zero(t, budget.inUse())

	// A snapshot that could never be decoded within the whole budget is
	// refused with an ack, not retried for ever; decoding stops there.
	budget = newTestBudget(2*size + 100)
	a = testAssembler(budget, clock)
	var out *assembled
	for _, m := range msgs {
		out, err = a.add(m)
		require.NoError(t, err)
		assert.LessOrEqual(t, budget.inUse(), 2*size+100)
	}
	require.NotNil(t, out)
	require.ErrorIs(t, out.err, ErrSnapshotRefused)
	assert.Contains(t, out.err.Error(), "decoding would take more than the server's memory for snapshots in transit")
	assert.Zero(t, budget.inUse())
}

// What the assembler reserves bounds what assembling allocates: parts,
// pending bytes and the decoded snapshot.
func TestAssemblerReservationBoundsAllocation(t *testing.T) {
	for name, s := range map[string]*relaypb.Snapshot{
		"realistic":       testSnapshot(5000),
		"empty endpoints": {Cluster: "cluster-1", Destinations: []*relaypb.Destination{{Endpoints: repeat(20000, func() *relaypb.Endpoint { return &relaypb.Endpoint{} })}}},
		"many workloads":  {Cluster: "cluster-1", Workloads: repeat(20000, func() *relaypb.Workload { return &relaypb.Workload{PodLabels: map[string]string{"": ""}} })},
	} {
		data, hash := encoding(t, s)
		msgs := chunked("cluster-1", hash, data, 256)
		var reserved int64
		allocated := allocatedBy(func() {
			budget := newTestBudget(1 << 30)
			a := testAssembler(budget, &fakeClock{t: time.Unix(1000, 0)})
			a.cfg.limits.MaxChunkedBytes = 64 << 20
			var out *assembled
			for _, m := range msgs {
				var err error
				out, err = a.add(m)
				require.NoError(t, err)
			}
			require.NotNil(t, out.snapshot, "%v", out.err)
			reserved = budget.inUse()
			a.release()
		})
		t.Logf("%-16s %8d bytes: assembly allocates %9d, reserved %9d (%.2fx)", name, len(data), allocated, reserved, float64(reserved)/float64(allocated))
		assert.GreaterOrEqual(t, reserved, int64(allocated), name)
	}
}

// A snapshot whose framing is right but whose content is not is answered
// with an ack; the stream goes on.
func TestAssemblerRefusesContent(t *testing.T) {
	s := testSnapshot(20)
	data, hash := encoding(t, s)
	withHash, err := proto.Marshal(s)
	require.NoError(t, err)
	garbage := append([]byte{0x0a, 0xff}, data[:200]...) // a length past the end
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }
	tests := []struct {
		name string
		hash string
		data []byte
		want string
	}{
		{"a hash mismatch", sum(data[1:]), data, "the parts' SHA-256 is not the header's hash"},
		{"bytes that are no snapshot", sum(garbage), garbage, "the parts are not a snapshot's encoding"},
		{"an encoding that carries the hash", sum(withHash), withHash, "the encoding carries a hash field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			budget := newTestBudget(1 << 20)
			a := testAssembler(budget, &fakeClock{t: time.Unix(1000, 0)})
			var out *assembled
			for _, m := range chunked("cluster-1", tc.hash, tc.data, 256) {
				var err error
				out, err = a.add(m)
				require.NoError(t, err)
			}
			require.NotNil(t, out)
			require.Nil(t, out.snapshot)
			require.ErrorIs(t, out.err, ErrSnapshotRefused)
			assert.Contains(t, out.err.Error(), tc.want)
			assert.Equal(t, tc.hash, out.hash, "the ack names the snapshot")
			assert.Zero(t, budget.inUse())
			for _, m := range chunked("cluster-1", hash, data, 256) {
				out, err = a.add(m)
				require.NoError(t, err)
			}
			assert.True(t, proto.Equal(s, out.snapshot), "the stream goes on")
		})
	}
}

// decodeCost bounds what decoding allocates, for honest snapshots and for
// encodings made to decode into as much memory per byte as they can.
func TestDecodeCostBoundsAllocation(t *testing.T) {
	const n = 20000
	shapes := map[string]*relaypb.Snapshot{
		"realistic":          testSnapshot(n / 4),
		"empty destinations": {Destinations: repeat(n, func() *relaypb.Destination { return &relaypb.Destination{} })},
		"empty endpoints":    {Destinations: []*relaypb.Destination{{Endpoints: repeat(n, func() *relaypb.Endpoint { return &relaypb.Endpoint{} })}}},
		"one label each":     {Destinations: []*relaypb.Destination{{Endpoints: repeat(n, func() *relaypb.Endpoint { return &relaypb.Endpoint{Labels: map[string]string{"": ""}} })}}},
		"four labels each":   {Destinations: []*relaypb.Destination{{Endpoints: repeat(n, func() *relaypb.Endpoint { return &relaypb.Endpoint{Labels: labelsOf(4)} })}}},
		"nine labels each":   {Destinations: []*relaypb.Destination{{Endpoints: repeat(n/4, func() *relaypb.Endpoint { return &relaypb.Endpoint{Labels: labelsOf(9)} })}}},
		"one large map":      {Destinations: []*relaypb.Destination{{Labels: labelsOf(n)}}},
		"empty strings":      {Destinations: []*relaypb.Destination{{ExternalAddresses: make([]string, n)}}},
		"subsets": {Destinations: repeat(n/10, func() *relaypb.Destination {
			return &relaypb.Destination{Subsets: map[string]*relaypb.LabelValues{"": {Values: []string{""}}}}
		})},
		"empty gateways":       {Meshes: []*relaypb.Mesh{{Gateways: repeat(n, func() *relaypb.Gateway { return &relaypb.Gateway{} })}}},
		"empty ports":          {Destinations: []*relaypb.Destination{{Ports: repeat(n, func() *relaypb.ServicePort { return &relaypb.ServicePort{} })}}},
		"empty workloads":      {Workloads: repeat(n, func() *relaypb.Workload { return &relaypb.Workload{} })},
		"workloads with label": {Workloads: repeat(n, func() *relaypb.Workload { return &relaypb.Workload{PodLabels: map[string]string{"": ""}} })},
	}
	for name, s := range shapes {
		b, err := proto.Marshal(s)
		require.NoError(t, err)
		cost, err := decodeCost(b)
		require.NoError(t, err)
		allocated := allocatedBy(func() {
			d := &relaypb.Snapshot{}
			require.NoError(t, proto.Unmarshal(b, d))
			runtime.KeepAlive(d)
		})
		t.Logf("%-20s %8d bytes: decoding allocates %9d, estimated %9d (%.2fx)", name, len(b), allocated, cost, float64(cost)/float64(allocated))
		assert.GreaterOrEqual(t, cost, int64(allocated), name)
	}

	// Malformed wire data is reported, never decoded.
	for _, bad := range [][]byte{{0x0a}, {0x0a, 0x05, 0x01}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, protowire.AppendTag(nil, 1, 7)} {
		_, err := decodeCost(bad)
		assert.Error(t, err, "%x", bad)
	}
}

// decodeCost is what the assembler reserves for decoding b as a whole
// snapshot, beyond the parts themselves.
func decodeCost(b []byte) (int64, error) {
	c, err := messageCost(b, (&relaypb.Snapshot{}).ProtoReflect().Descriptor(), structCosts(), 0)
	return int64(len(b)) + c, err
}

func repeat[T any](n int, f func() T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = f()
	}
	return out
}

func labelsOf(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprint(i)] = ""
	}
	return m
}

// allocatedBy is the heap f allocated (the minimum of three runs, so a
// concurrent allocation elsewhere does not count).
func allocatedBy(f func()) uint64 {
	least := ^uint64(0)
	for range 3 {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// chunkHarness is the server's side of PushChunked streams of cluster-1
// without their transport: the handler the server runs for each message
// (chunkedStream.take), with a real View, Registry, memory budget and
// metrics, small parts (64 to 256 bytes, at most 64 KiB in all) and a
// fake clock.
type chunkHarness struct {
	d     *discoveryService
	view  *View
	clock *fakeClock
	agent *agent
}

func newChunkHarness(t testing.TB) *chunkHarness {
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	reg := NewRegistry()
	reg.Set(Registration{Name: "cluster-1", UID: "uid-1"})
	h := &chunkHarness{view: NewView(), clock: &fakeClock{t: time.Unix(1000, 0)}, agent: &agent{cluster: "cluster-1", registration: "uid-1"}}
	h.d = &discoveryService{
		s: &Server{cfg: ServerConfig{Registry: reg, Metrics: m, Clock: h.clock.now}, log: slog.New(slog.DiscardHandler)},
		cfg: DataPathConfig{View: h.view, Limits: SnapshotLimits{MaxChunkedBytes: 64 << 10}.withDefaults(),
			SnapshotsPerSecond: 1000, SnapshotBurst: 1000, SnapshotDeadline: 10 * time.Second, SnapshotMemory: 1 << 20},
	}
	return h
}

// stream opens a stream of cluster-1's agent.
func (h *chunkHarness) stream() *chunkedStream {
	c := h.d.newChunkedStream(h.agent, h.clock.now)
	c.asm.cfg.maxPart, c.asm.cfg.minPart = 256, 64
	return c
}

// FuzzSnapshotChunks feeds the server's handler of a PushChunked stream
// (chunkedStream.take, what PushChunked runs for every message) any
// sequence of messages — the input is length-delimited SnapshotChunk
// encodings: out of order, oversized, repeated, never finished, naming
// or carrying another cluster — and checks the server's state after each:
// a snapshot the view accepts is exactly the decoding of the parts sent
// since its header, carries their SHA-256 and passes the server's checks
// (ValidateSnapshot's too when the encoding is the deterministic one);
// anything refused (the stream ended, or an ack that refuses) leaves the
// view's snapshot of the cluster as it was and says why in its LastError;
// another cluster's snapshot never changes; nothing stays reserved
// between snapshots; a snapshot never finished is refused at its deadline
// without a change; and a new stream of the cluster then gets a good
// snapshot through as if nothing had happened.
func FuzzSnapshotChunks(f *testing.F) {
	good := testSnapshot(8)
	data, hash := encoding(f, good)
	seed := func(msgs ...*relaypb.SnapshotChunk) []byte {
		var b []byte
		for _, m := range msgs {
			mb, err := proto.Marshal(m)
			require.NoError(f, err)
			b = protowire.AppendBytes(b, mb)
		}
		return b
	}
	msgs := chunked("cluster-1", hash, data, 256)
	f.Add(seed(msgs...))
	f.Add(seed(append(msgs, msgs...)...))
	f.Add(seed(msgs[0], msgs[2], msgs[1]))
	f.Add(seed(msgs[:3]...))
	f.Add(seed(header("cluster-2", hash, len(data), len(msgs)-2)))
	small, smallHash := encoding(f, testSnapshot(1))
	f.Add(seed(chunked("cluster-1", smallHash, small, 256)...))
	f.Add(seed(chunked("cluster-1", smallHash, small[:len(small)-1], 256)...))
	other := testSnapshot(2)
	other.Cluster = "cluster-2"
	for _, d := range other.Destinations {
		d.Cluster = "cluster-2"
	}
	otherData, otherHash := encoding(f, other)
	f.Add(seed(chunked("cluster-1", otherHash, otherData, 256)...))
	f.Add(seed(msgs[0], part(0, make([]byte, 257))))
	f.Add([]byte{})
	next := testSnapshot(5)
	nextData, nextHash := encoding(f, next)
	nextMsgs := chunked("cluster-1", nextHash, nextData, 256)
	f.Fuzz(func(t *testing.T, in []byte) {
		h := newChunkHarness(t)
		budget := h.d.snapshotBudget()
		limits := h.d.cfg.Limits
		h.view.Accept("cluster-1", good, h.clock.t)
		h.view.Accept("cluster-2", other, h.clock.t)
		otherBefore := h.view.Snapshot("cluster-2")
		c := h.stream()
		var sent []byte // the data of the parts since the last header
		ended := false
		for i := 0; len(in) > 0 && i < 64 && !ended; i++ {
			mb, n := protowire.ConsumeBytes(in)
			if n < 0 {
				break
			}
			in = in[n:]
			m := &relaypb.SnapshotChunk{}
			if proto.Unmarshal(mb, m) != nil {
				break
			}
			h.clock.t = h.clock.t.Add(time.Second)
			before := h.view.Snapshot("cluster-1")
			ack, err := c.take(m)
			switch {
			case err != nil:
				require.Contains(t, []codes.Code{codes.InvalidArgument, codes.DeadlineExceeded, codes.ResourceExhausted}, status.Code(err), err)
				require.Same(t, before, h.view.Snapshot("cluster-1"), "a refused stream changes nothing")
				require.Contains(t, h.view.Clusters()["cluster-1"].LastError, ErrSnapshotRefused.Error())
				ended = true
			case ack != nil && !ack.GetAccepted():
				require.Same(t, before, h.view.Snapshot("cluster-1"), "a refused snapshot changes nothing")
				require.Contains(t, ack.GetError(), ErrSnapshotRefused.Error())
				require.Equal(t, ack.GetError(), h.view.Clusters()["cluster-1"].LastError)
			case ack != nil:
				got := h.view.Snapshot("cluster-1")
				sum := sha256.Sum256(sent)
				require.Equal(t, hex.EncodeToString(sum[:]), ack.GetHash())
				require.Equal(t, ack.GetHash(), got.GetHash())
				decoded := &relaypb.Snapshot{}
				require.NoError(t, proto.Unmarshal(sent, decoded))
				decoded.Hash = ack.GetHash()
				require.True(t, proto.Equal(decoded, got), "accepted: exactly the parts sent")
				require.NoError(t, validateSnapshot("cluster-1", got, limits, func(*relaypb.Snapshot) string { return ack.GetHash() }))
				if canonical, err := (proto.MarshalOptions{Deterministic: true}).Marshal(withoutHash(got)); err == nil && string(canonical) == string(sent) {
					require.NoError(t, ValidateSnapshot("cluster-1", got, SnapshotLimits{MaxBytes: 64 << 20}))
				}
			case m.GetHeader() != nil:
				sent = nil
			case m.GetPart() != nil:
				sent = append(sent, m.GetPart().GetData()...)
			}
			if ack == nil && err == nil {
				require.Same(t, before, h.view.Snapshot("cluster-1"), "nothing changes before a snapshot is complete")
			}
			require.Same(t, otherBefore, h.view.Snapshot("cluster-2"), "a stream of cluster-1 never touches cluster-2")
			if _, inTransit := c.asm.deadline(); !inTransit {
				require.Zero(t, budget.inUse(), "nothing reserved between snapshots")
			}
		}
		if _, inTransit := c.asm.deadline(); inTransit && !ended {
			// Never finished: the stream's timer refuses it.
			before := h.view.Snapshot("cluster-1")
			require.Equal(t, codes.DeadlineExceeded, status.Code(c.expire()))
			require.Same(t, before, h.view.Snapshot("cluster-1"))
		}
		c.close()
		require.Zero(t, budget.inUse(), "the stream ended: nothing reserved")

		// Nothing left behind: a new stream of the cluster gets a good
		// snapshot through.
		c = h.stream()
		var ack *relaypb.PushAck
		for _, m := range nextMsgs {
			var err error
			ack, err = c.take(m)
			require.NoError(t, err)
		}
		require.True(t, ack.GetAccepted(), ack.GetError())
		require.True(t, proto.Equal(next, h.view.Snapshot("cluster-1")))
		c.close()
		require.Zero(t, budget.inUse())
	})
}
