package server_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/internal/backoff"
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

func chunkedStream(t testing.TB, f *servertest.Server, cred servertest.AgentCred) relaypb.Discovery_PushChunkedClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := relaypb.NewDiscoveryClient(f.Dial(f.MTLS(cred.TLS))).PushChunked(ctx)
	require.NoError(t, err)
	return stream
}

// sendAll sends msgs; a send that fails because the server ended the
// stream is not an error here (Recv tells why).
func sendAll(t testing.TB, stream relaypb.Discovery_PushChunkedClient, msgs []*relaypb.SnapshotChunk) {
	t.Helper()
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return
		}
	}
}

// source is a SnapshotSource whose snapshot a test sets; it records when
// the session asked for each hash.
type source struct {
	mu      sync.Mutex
	snap    *relaypb.Snapshot
	asked   map[string]time.Time
	changes chan struct{}
}

func newSource(s *relaypb.Snapshot) *source {
	return &source{snap: s, asked: map[string]time.Time{}, changes: make(chan struct{}, 1)}
}

func (s *source) Snapshot() (*relaypb.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.asked[s.snap.GetHash()]; !ok {
		s.asked[s.snap.GetHash()] = time.Now()
	}
	return s.snap, nil
}

func (s *source) Changes() <-chan struct{} { return s.changes }

func (s *source) set(snap *relaypb.Snapshot) {
	s.mu.Lock()
	s.snap = snap
	s.mu.Unlock()
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

func (s *source) askedAt(hash string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[hash]
}

// startSession runs the agent's session (agent.Session, the code the real
// agent runs) against f with cred until the test ends.
func startSession(t testing.TB, f *servertest.Server, cred servertest.AgentCred, src agent.SnapshotSource) *agent.Session {
	t.Helper()
	sess, err := agent.NewSession(agent.SessionConfig{ServerAddress: f.Addr, Version: "test",
		TLS:       func() (*tls.Config, error) { return f.MTLS(cred.TLS), nil },
		Snapshots: src, Retry: backoff.Policy{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sess.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return sess
}

// acceptedAt records when the view accepted each hash of cluster.
func acceptedAt(view *server.View, cluster string) func(hash string) (time.Time, bool) {
	var mu sync.Mutex
	at := map[string]time.Time{}
	view.OnSnapshot(func(c string) {
		now := time.Now()
		if c != cluster {
			return
		}
		h := view.Snapshot(c).GetHash()
		mu.Lock()
		if _, ok := at[h]; !ok {
			at[h] = now
		}
		mu.Unlock()
	})
	return func(hash string) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		t, ok := at[hash]
		return t, ok
	}
}

// A 100,000-pod, 10,000-Service snapshot — five times what fits in one
// message — goes from the agent's session to the server's view, checked
// as a snapshot pushed whole is. Under -short (the fast tier) the cluster
// is 30,000 pods, still more than one message holds; make test runs the
// 100,000.
func TestPushChunkedLargeCluster(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	var s *relaypb.Snapshot
	pods, over := relaytest.Rich{Namespaces: 500}.Pods(), 4
	if testing.Short() {
		small := relaytest.Rich{Namespaces: 150}
		s, pods, over = small.Snapshot("cluster-1"), small.Pods(), 1
	} else {
		s = large100k()
	}
	size := proto.Size(s)
	require.Greater(t, size, over*relay.DefaultMaxSnapshotBytes, "more than %d times the old limit", over)
	accepted := acceptedAt(f.View, "cluster-1")
	src := newSource(s)
	sess := startSession(t, f, f.Bootstrap("cluster-1"), src)
	require.Eventually(t, func() bool { _, ok := accepted(s.GetHash()); return ok }, 3*time.Minute, 5*time.Millisecond, "accepted into the view")
	at, _ := accepted(s.GetHash())
	t.Logf("%d pods, %d Services, %d bytes: from the agent's first look at the snapshot to the server's view in %s (under -race)",
		pods, len(s.GetDestinations()), size, at.Sub(src.askedAt(s.GetHash())).Round(time.Millisecond))
	got := f.View.Snapshot("cluster-1")
	assert.True(t, proto.Equal(s, got), "the view holds exactly the agent's snapshot")
	require.NoError(t, relay.ValidateSnapshot("cluster-1", got, relay.SnapshotLimits{MaxBytes: 64 << 20}), "and it passes the checks of a snapshot pushed whole")
	require.Eventually(t, func() bool { return sess.State().PushedHash == s.GetHash() }, 30*time.Second, 5*time.Millisecond, "the agent got the ack")
	assert.Zero(t, f.Metric(server.MetricSnapshotAssembly), "nothing stays reserved")
	assert.Zero(t, sess.State().Reconnects)
}

// Hostile chunked streams are refused with a clear error and leave the
// last accepted snapshot in force.
func TestPushChunkedRefusesHostileStreams(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true, SnapshotBurst: 1000})
	cred := f.Bootstrap("cluster-1")
	good := snapshot("cluster-1", 3)
	data, hash := relaytest.Encode(t, good)
	require.Equal(t, good.GetHash(), hash)
	stream := chunkedStream(t, f, cred)
	sendAll(t, stream, relaytest.Chunked("cluster-1", hash, data, relay.MaxSnapshotPartBytes))
	ack, err := stream.Recv()
	require.NoError(t, err)
	require.True(t, ack.GetAccepted(), ack.GetError())
	require.Equal(t, hash, ack.GetHash())
	last := f.View.Snapshot("cluster-1")
	require.True(t, proto.Equal(good, last))

	// A snapshot of 3 MiB in 3 parts of 1 MiB, to break up.
	big := snapshot("cluster-1", 15000)
	bigData, bigHash := relaytest.Encode(t, big)
	require.Greater(t, len(bigData), 2*relay.MaxSnapshotPartBytes)
	bigFrames := relaytest.Chunked("cluster-1", bigHash, bigData, relay.MaxSnapshotPartBytes)
	require.Len(t, bigFrames, 5)
	hdr, p0, p1, p2, fin := bigFrames[0], bigFrames[1], bigFrames[2], bigFrames[3], bigFrames[4]
	other := snapshot("cluster-2", 3)
	otherData, otherHash := relaytest.Encode(t, other)
	// Another cluster's content under this cluster's header.
	mixed := relaytest.Chunked("cluster-1", otherHash, otherData, relay.MaxSnapshotPartBytes)
	withHash, err := proto.Marshal(good)
	require.NoError(t, err)
	sum := sha256.Sum256(withHash)
	tooLarge := &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Part{Part: &relaypb.SnapshotPart{Index: 0, Data: make([]byte, 2<<20)}}}
	header := func(h *relaypb.SnapshotHeader) *relaypb.SnapshotChunk {
		return &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Header{Header: h}}
	}

	streamRefusals := []struct {
		name   string
		msgs   []*relaypb.SnapshotChunk
		code   codes.Code
		reason string
		want   string
	}{
		{"parts out of order", []*relaypb.SnapshotChunk{hdr, p0, p2}, codes.InvalidArgument, "framing", "part 2, but part 1 comes next"},
		{"a part too large", []*relaypb.SnapshotChunk{hdr, tooLarge}, codes.InvalidArgument, "too_large", "part 0 of 2097152 bytes, at most 1048576"},
		{"a total over the limit", []*relaypb.SnapshotChunk{header(&relaypb.SnapshotHeader{Cluster: "cluster-1", Hash: bigHash, Size: 65 << 20, Parts: 65})}, codes.InvalidArgument, "too_large", "snapshot of 68157440 bytes; at least 1, at most 67108864"},
		{"a header naming another cluster", relaytest.Chunked("cluster-2", otherHash, otherData, relay.MaxSnapshotPartBytes), codes.InvalidArgument, "framing", `header for cluster "cluster-2", but the agent's certificate names "cluster-1"`},
		{"a second header mid-snapshot", []*relaypb.SnapshotChunk{hdr, p0, hdr}, codes.InvalidArgument, "framing", "a second header before the end of snapshot " + bigHash},
		{"an end before the last part", []*relaypb.SnapshotChunk{hdr, p0, p1, fin}, codes.InvalidArgument, "framing", "end after 2 of 3 parts"},
		{"a part before any header", []*relaypb.SnapshotChunk{p0}, codes.InvalidArgument, "framing", "part 0 without a header"},
		{"an empty message", []*relaypb.SnapshotChunk{{}}, codes.InvalidArgument, "framing", "neither a header, a part nor an end"},
	}
	for _, tc := range streamRefusals {
		t.Run(tc.name, func(t *testing.T) {
			before := f.Metric(server.MetricSnapshotsRefused, "reason", tc.reason)
			stream := chunkedStream(t, f, cred)
			sendAll(t, stream, tc.msgs)
			_, err := stream.Recv()
			require.Error(t, err)
			assert.Equal(t, tc.code, status.Code(err), err)
			assert.Contains(t, status.Convert(err).Message(), tc.want)
			assert.Same(t, last, f.View.Snapshot("cluster-1"), "the last accepted snapshot stays")
			assert.Contains(t, f.View.Clusters()["cluster-1"].LastError, tc.want)
			assert.Equal(t, before+1, f.Metric(server.MetricSnapshotsRefused, "reason", tc.reason))
			assert.Zero(t, f.Metric(server.MetricSnapshotAssembly), "nothing stays reserved")
		})
	}

	// A message over gRPC's limit never reaches the assembler.
	t.Run("a message over the message limit", func(t *testing.T) {
		stream := chunkedStream(t, f, cred)
		sendAll(t, stream, []*relaypb.SnapshotChunk{hdr, {Chunk: &relaypb.SnapshotChunk_Part{Part: &relaypb.SnapshotPart{Data: make([]byte, 5<<20)}}}})
		_, err := stream.Recv()
		assert.Equal(t, codes.ResourceExhausted, status.Code(err), err)
		assert.Same(t, last, f.View.Snapshot("cluster-1"))
		require.Eventually(t, func() bool { return f.Metric(server.MetricSnapshotAssembly) == 0 }, 30*time.Second, 10*time.Millisecond, "the header's reservation is returned")
	})

	// Framing kept, content refused: an ack, and the stream goes on.
	ackRefusals := []struct {
		name string
		msgs []*relaypb.SnapshotChunk
		want string
	}{
		{"a hash mismatch", relaytest.Chunked("cluster-1", hash, bigData[:len(bigData)-1], relay.MaxSnapshotPartBytes), "the parts' SHA-256 is not the header's hash"},
		{"garbage", relaytest.Chunked("cluster-1", hexSum([]byte("garbage")), []byte("garbage"), relay.MaxSnapshotPartBytes), "the parts are not a snapshot's encoding"},
		{"another cluster's content", mixed, `cluster "cluster-2", but the agent's certificate names "cluster-1"`},
		{"an encoding that carries its hash", relaytest.Chunked("cluster-1", hex.EncodeToString(sum[:]), withHash, relay.MaxSnapshotPartBytes), "the encoding carries a hash field"},
	}
	stream = chunkedStream(t, f, cred)
	for _, tc := range ackRefusals {
		t.Run(tc.name, func(t *testing.T) {
			before := f.Metric(server.MetricSnapshotsRefused, "reason", "invalid")
			sendAll(t, stream, tc.msgs)
			ack, err := stream.Recv()
			require.NoError(t, err, "the stream goes on")
			assert.False(t, ack.GetAccepted())
			assert.Contains(t, ack.GetError(), tc.want)
			assert.Same(t, last, f.View.Snapshot("cluster-1"), "the last accepted snapshot stays")
			assert.Equal(t, before+1, f.Metric(server.MetricSnapshotsRefused, "reason", "invalid"))
			assert.Zero(t, f.Metric(server.MetricSnapshotAssembly))
		})
	}
	// The same stream then takes a good snapshot in three parts.
	sendAll(t, stream, bigFrames)
	ack, err = stream.Recv()
	require.NoError(t, err)
	require.True(t, ack.GetAccepted(), ack.GetError())
	assert.True(t, proto.Equal(big, f.View.Snapshot("cluster-1")))
	assert.Empty(t, f.View.Clusters()["cluster-1"].LastError)
}

// A snapshot never finished is refused at the server's deadline, and
// what it held is returned.
func TestPushChunkedDeadline(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true, SnapshotDeadline: 2 * time.Second})
	cred := f.Bootstrap("cluster-1")
	good := snapshot("cluster-1", 3)
	require.Equal(t, "", pushChunked(t, f, cred, good).GetError())
	last := f.View.Snapshot("cluster-1")
	big := snapshot("cluster-1", 15000)
	data, hash := relaytest.Encode(t, big)
	msgs := relaytest.Chunked("cluster-1", hash, data, relay.MaxSnapshotPartBytes)
	stream := chunkedStream(t, f, cred)
	sendAll(t, stream, msgs[:2])
	require.Eventually(t, func() bool { return f.Metric(server.MetricSnapshotAssembly) > 0 }, 30*time.Second, 5*time.Millisecond, "the part that came is held")
	start := time.Now()
	_, err := stream.Recv()
	t.Logf("refused %s after the first part arrived", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), err)
	assert.Contains(t, status.Convert(err).Message(), "not complete within 2s (1 of 3 parts)")
	assert.Same(t, last, f.View.Snapshot("cluster-1"))
	assert.Zero(t, f.Metric(server.MetricSnapshotAssembly))
	assert.Equal(t, float64(1), f.Metric(server.MetricSnapshotsRefused, "reason", "deadline"))
}

// pushChunked sends s on a new stream and returns the ack.
func pushChunked(t testing.TB, f *servertest.Server, cred servertest.AgentCred, s *relaypb.Snapshot) *relaypb.PushAck {
	t.Helper()
	data, hash := relaytest.Encode(t, s)
	stream := chunkedStream(t, f, cred)
	sendAll(t, stream, relaytest.Chunked(s.GetCluster(), hash, data, relay.MaxSnapshotPartBytes))
	ack, err := stream.Recv()
	require.NoError(t, err)
	return ack
}

func hexSum(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// An agent whose snapshot stream is refused opens a new one after a pause,
// keeps its session, and gets its snapshot through.
func TestSessionRetriesRefusedStream(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	cred := f.Bootstrap("cluster-1")
	// Another stream of the cluster holds a snapshot in transit (its one
	// part sent, its end not).
	holder := chunkedStream(t, f, cred)
	require.NoError(t, holder.Send(&relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Header{Header: &relaypb.SnapshotHeader{
		Cluster: "cluster-1", Hash: hexSum(nil), Size: 100, Parts: 1}}}))
	require.NoError(t, holder.Send(relaytest.Part(0, relaytest.EmptyWorkloads(50))))
	require.Eventually(t, func() bool { return f.Metric(server.MetricSnapshotAssembly) > 0 }, 30*time.Second, 5*time.Millisecond)
	s := snapshot("cluster-1", 5)
	sess := startSession(t, f, cred, newSource(s))
	require.Eventually(t, func() bool { return sess.State().PushError != "" }, 30*time.Second, 5*time.Millisecond)
	assert.Contains(t, sess.State().PushError, "another stream of this cluster is sending a snapshot")
	assert.Nil(t, f.View.Snapshot("cluster-1"))
	require.NoError(t, holder.CloseSend())
	require.Eventually(t, func() bool { return sess.State().PushedHash == s.GetHash() }, 30*time.Second, 5*time.Millisecond)
	assert.Equal(t, s.GetHash(), f.View.Snapshot("cluster-1").GetHash())
	assert.Empty(t, sess.State().PushError)
	assert.Zero(t, sess.State().Reconnects, "the session itself stayed")
	assert.GreaterOrEqual(t, f.Metric(server.MetricSnapshotsRefused, "reason", "cluster_busy"), float64(1))
}

// BenchmarkPushChunked100k: a changed 100,000-pod, 10,000-Service snapshot
// from the agent's session (agent.Session: encoding, parts, TLS on
// loopback) into the server's view (assembly, decoding, checks,
// acceptance); both ends in this process. s/push (mean, p50, max over the
// pushes) is wall time from the session taking the snapshot to the view
// having it; cpu-s/push the CPU
// both ends spent on it together (what it takes on an idle machine when
// the steps run one after the other); MiB-reserved the peak of the
// server's memory budget for snapshots in transit.
func BenchmarkPushChunked100k(b *testing.B) {
	benchmarkPush(b, large100k(), true)
}

// BenchmarkPushWhole20k: the largest snapshot of the same shape that fits
// one message (20,000 pods, 2,000 Services), pushed whole (Push) as agents
// of earlier releases do — the largest push that worked before.
func BenchmarkPushWhole20k(b *testing.B) {
	benchmarkPush(b, relaytest.Rich{Namespaces: 100}.Snapshot("cluster-1"), false)
}

func benchmarkPush(b *testing.B, a *relaypb.Snapshot, chunked bool) {
	f := servertest.New(b, servertest.Options{DataPath: true, SnapshotBurst: 1 << 20})
	// Two snapshots that differ in one label, so each push is a change.
	variant := func(s *relaypb.Snapshot, n int) *relaypb.Snapshot {
		c := proto.Clone(s).(*relaypb.Snapshot)
		c.Destinations[0].Labels["bench"] = fmt.Sprint(n)
		return relaytest.Rehash(c)
	}
	accepted := acceptedAt(f.View, "cluster-1")
	wait := func(hash string) time.Time {
		for {
			if at, ok := accepted(hash); ok {
				return at
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	cred := f.Bootstrap("cluster-1")
	// push returns how long s took from the agent to the view.
	var push func(*relaypb.Snapshot) time.Duration
	if chunked {
		src := newSource(a)
		startSession(b, f, cred, src)
		wait(a.GetHash())
		push = func(s *relaypb.Snapshot) time.Duration {
			src.set(s)
			at := wait(s.GetHash())
			return at.Sub(src.askedAt(s.GetHash()))
		}
	} else {
		require.LessOrEqual(b, proto.Size(a), relay.DefaultMaxSnapshotBytes)
		stream, err := relaypb.NewDiscoveryClient(f.Dial(f.MTLS(cred.TLS))).Push(context.Background())
		require.NoError(b, err)
		push = func(s *relaypb.Snapshot) time.Duration {
			start := time.Now()
			require.NoError(b, stream.Send(s))
			at := wait(s.GetHash())
			ack, err := stream.Recv()
			require.NoError(b, err)
			require.True(b, ack.GetAccepted(), ack.GetError())
			return at.Sub(start)
		}
		push(a)
	}
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), int64(f.Metric(server.MetricSnapshotAssembly))))
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	var walls []time.Duration
	var cpu time.Duration
	n := 0
	for b.Loop() {
		n++
		b.StopTimer()
		next := variant(a, n)
		runtime.GC()
		cpu0 := processCPU(b)
		b.StartTimer()
		walls = append(walls, push(next))
		cpu += processCPU(b) - cpu0
	}
	close(stop)
	<-sampled
	slices.Sort(walls)
	var wall time.Duration
	for _, w := range walls {
		wall += w
	}
	b.ReportMetric(wall.Seconds()/float64(n), "s/push")
	b.ReportMetric(walls[(len(walls)-1)/2].Seconds(), "s/push-p50")
	b.ReportMetric(walls[len(walls)-1].Seconds(), "s/push-max")
	b.ReportMetric(cpu.Seconds()/float64(n), "cpu-s/push")
	b.ReportMetric(float64(proto.Size(a)), "snapshot-bytes")
	b.ReportMetric(float64(peak.Load())/(1<<20), "MiB-reserved")
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
