package server_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
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

// recordingApplier applies every set (records it) and reports each object
// applied.
type recordingApplier struct {
	mu      sync.Mutex
	applied []uint64
}

func (r *recordingApplier) Apply(_ context.Context, set *relaypb.OutputSet) ([]*relaypb.ObjectResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, set.GetVersion())
	results := make([]*relaypb.ObjectResult, 0, len(set.GetObjects()))
	for i := range set.GetObjects() {
		results = append(results, &relaypb.ObjectResult{Kind: "ConfigMap", Namespace: "default", Name: fmt.Sprint("cm-", i), Outcome: "applied"})
	}
	return results, nil
}

func (r *recordingApplier) last() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) == 0 {
		return 0
	}
	return r.applied[len(r.applied)-1]
}

func outputObjects(n int) []*relaypb.OutputObject {
	var objs []*relaypb.OutputObject
	for i := range n {
		objs = append(objs, &relaypb.OutputObject{Manifest: fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-%d","namespace":"default"}}`, i)})
	}
	return objs
}

// Relay session v2 and the three-stream protocol of earlier releases, in
// every pairing: a new agent on a new server holds one Session stream; a
// new agent on an old server (Session answered Unimplemented) falls back
// to Connect, PushChunked and Pull on the same connection; an old agent on
// a new server keeps using those three. In each, the snapshot reaches the
// view, an output set is applied and acked, a new snapshot and a new set
// follow, and the server counts the session under its protocol.
func TestMixedVersionSessions(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		serverOld, agentOld    bool
		wantProtocol, notProto string
	}{
		{name: "new agent, new server: one stream", wantProtocol: "2", notProto: "1"},
		{name: "new agent, old server: falls back to three streams", serverOld: true, wantProtocol: "1", notProto: "2"},
		{name: "old agent, new server: three streams still served", agentOld: true, wantProtocol: "1", notProto: "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servertest.New(t, servertest.Options{DataPath: true, SessionV1Only: tc.serverOld})
			cred := f.Bootstrap("cluster-1")
			f.Outputs.Set("cluster-1", outputObjects(2))
			first := f.Outputs.Get("cluster-1").GetVersion()
			src := newSource(relaytest.Snapshot(3))
			applier := &recordingApplier{}
			sess, err := agent.NewSession(agent.SessionConfig{ServerAddress: f.Addr, Version: "test",
				TLS:       func() (*tls.Config, error) { return f.MTLS(cred.TLS), nil },
				Snapshots: src, Applier: applier, SessionV1Only: tc.agentOld,
				Retry: backoff.Policy{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond}})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = sess.Run(ctx) }()
			defer func() { cancel(); <-done }()

			require.Eventually(t, func() bool { return f.View.Snapshot("cluster-1").GetHash() == src.snap.GetHash() }, 30*time.Second, 10*time.Millisecond)
			require.Eventually(t, func() bool { return f.View.Ack("cluster-1").GetVersion() == first }, 30*time.Second, 10*time.Millisecond, "the first set is acked")
			assert.Equal(t, first, applier.last())
			assert.Equal(t, 2.0, f.Metric(server.MetricApplyResults, "cluster", "cluster-1", "outcome", "applied"), "the ack's results")
			assert.Equal(t, 1.0, f.Metric(server.MetricSessions, "protocol", tc.wantProtocol))
			assert.Equal(t, 0.0, f.Metric(server.MetricSessions, "protocol", tc.notProto))

			next := relaytest.Snapshot(5)
			src.set(next)
			require.Eventually(t, func() bool { return f.View.Snapshot("cluster-1").GetHash() == next.GetHash() }, 30*time.Second, 10*time.Millisecond)
			f.Outputs.Set("cluster-1", outputObjects(3))
			second := f.Outputs.Get("cluster-1").GetVersion()
			require.Greater(t, second, first)
			require.Eventually(t, func() bool { return f.View.Ack("cluster-1").GetVersion() == second }, 30*time.Second, 10*time.Millisecond)
			assert.Equal(t, 5.0, f.Metric(server.MetricApplyResults, "cluster", "cluster-1", "outcome", "applied"), "both acks' results")
			assert.Zero(t, sess.State().Reconnects, "one session throughout")
			f.CheckNoSecretsLeaked()
		})
	}
}

// A snapshot the server refuses in transit on a Session (here: larger than
// the server's limit) is answered with PushRefused; the session stays
// open, the last accepted snapshot stays in force, and the next snapshot
// is accepted on the same session.
func TestSessionRefusesASnapshotAndGoesOn(t *testing.T) {
	small := relaytest.Snapshot(2)
	big := relaytest.Snapshot(3000)
	limit := proto.Size(big) / 2
	require.Greater(t, limit, proto.Size(small))
	f := servertest.New(t, servertest.Options{DataPath: true, Limits: relay.SnapshotLimits{MaxChunkedBytes: limit}})
	cred := f.Bootstrap("cluster-1")
	src := newSource(small)
	sess := startSessionWith(t, f, cred, src, nil)
	require.Eventually(t, func() bool { return f.View.Snapshot("cluster-1").GetHash() == small.GetHash() }, 30*time.Second, 10*time.Millisecond)

	// A part out of order, sent on a raw Session: refused, and the
	// session answers a ping after it.
	stream := rawSession(t, f, f.Bootstrap("cluster-2"))
	require.NoError(t, stream.Send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Snapshot{Snapshot: &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Part{Part: &relaypb.SnapshotPart{Index: 3, Data: []byte("x")}}}}}))
	got, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, got.GetPushRefused(), "a part without a header is refused: %v", got)
	assert.Equal(t, int32(codes.InvalidArgument), got.GetPushRefused().GetCode())
	// Its remaining parts are dropped silently until a header.
	require.NoError(t, stream.Send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Snapshot{Snapshot: &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Part{Part: &relaypb.SnapshotPart{Index: 4, Data: []byte("y")}}}}}))
	require.NoError(t, stream.Send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Ping{Ping: &relaypb.Ping{Nonce: 7}}}))
	got, err = stream.Recv()
	require.NoError(t, err)
	assert.Equal(t, int64(7), got.GetPong().GetNonce(), "the session goes on: %v", got)

	// The agent's session: a snapshot the server refuses, then one it
	// accepts, on the same session.
	src.set(big)
	require.Eventually(t, func() bool { return sess.State().PushError != "" }, 30*time.Second, 10*time.Millisecond, "the big snapshot is refused")
	assert.Equal(t, small.GetHash(), f.View.Snapshot("cluster-1").GetHash(), "the last accepted snapshot stays")
	assert.True(t, sess.State().Connected)
	again := relaytest.Snapshot(4)
	src.set(again)
	require.Eventually(t, func() bool { return f.View.Snapshot("cluster-1").GetHash() == again.GetHash() }, 30*time.Second, 10*time.Millisecond)
	assert.Zero(t, sess.State().Reconnects, "one session throughout")
	assert.Equal(t, 2.0, f.Metric(server.MetricSessions, "protocol", "2"), "the agent's session and the raw one")
}

// startSessionWith runs agent.Session against f with an applier (nil:
// none).
func startSessionWith(t testing.TB, f *servertest.Server, cred servertest.AgentCred, src agent.SnapshotSource, applier agent.OutputApplier) *agent.Session {
	t.Helper()
	cfg := agent.SessionConfig{ServerAddress: f.Addr, Version: "test",
		TLS:       func() (*tls.Config, error) { return f.MTLS(cred.TLS), nil },
		Snapshots: src, Retry: backoff.Policy{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond}}
	if applier != nil {
		cfg.Applier = applier
	}
	sess, err := agent.NewSession(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sess.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return sess
}

// rawSession opens a Session as cred and exchanges Hello for Welcome.
func rawSession(t testing.TB, f *servertest.Server, cred servertest.AgentCred) relaypb.Relay_SessionClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := relaypb.NewRelayClient(f.Dial(f.MTLS(cred.TLS))).Session(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Hello{Hello: &relaypb.Hello{AgentVersion: "raw"}}}))
	w, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, w.GetWelcome())
	return stream
}

// Hostile or broken Session streams end with a clear status and change
// nothing: no Hello first, a second Hello, an empty frame, an ack with too
// many results, a malformed resume.
func TestSessionRefusesBrokenFrames(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	cred := f.Bootstrap("cluster-1")
	ended := func(stream relaypb.Relay_SessionClient) error {
		for {
			if _, err := stream.Recv(); err != nil {
				return err
			}
		}
	}
	t.Run("no Hello first", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream, err := relaypb.NewRelayClient(f.Dial(f.MTLS(cred.TLS))).Session(ctx)
		require.NoError(t, err)
		require.NoError(t, stream.Send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Ping{Ping: &relaypb.Ping{}}}))
		err = ended(stream)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "first message of a session must be Hello")
	})
	for name, frame := range map[string]*relaypb.AgentFrame{
		"a second Hello":        {Frame: &relaypb.AgentFrame_Hello{Hello: &relaypb.Hello{}}},
		"an empty frame":        {},
		"a huge ack":            {Frame: &relaypb.AgentFrame_PullAck{PullAck: &relaypb.PullAck{Version: 1, Results: make([]*relaypb.ObjectResult, 100001)}}},
		"a resume with results": {Frame: &relaypb.AgentFrame_PullAck{PullAck: &relaypb.PullAck{Version: 1, Resume: true, Results: []*relaypb.ObjectResult{{}}}}},
	} {
		t.Run(name, func(t *testing.T) {
			stream := rawSession(t, f, cred)
			require.NoError(t, stream.Send(frame))
			err := ended(stream)
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		})
	}
	t.Run("refused snapshots at line rate", func(t *testing.T) {
		stream := rawSession(t, f, cred)
		empty := &relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Snapshot{Snapshot: &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Header{Header: &relaypb.SnapshotHeader{Cluster: "cluster-1"}}}}}
		var refused int
		var err error
		for range 50 {
			if err = stream.Send(empty); err != nil {
				break
			}
		}
		for {
			var got *relaypb.ServerFrame
			if got, err = stream.Recv(); err != nil {
				break
			}
			if got.GetPushRefused() != nil {
				refused++
			}
		}
		assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "refused more often than once a second")
		assert.GreaterOrEqual(t, refused, 5, "a burst of refusals is answered")
		assert.Less(t, refused, 10, "then the session ends")
	})
	assert.Nil(t, f.View.Ack("cluster-1"), "no broken ack was recorded")
}

// Deregistration ends a relay session v2 at once, with the status that
// tells the agent why (as it ends Connect).
func TestDeregistrationEndsASession(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	stream := rawSession(t, f, f.Bootstrap("cluster-2"))
	require.Equal(t, 1.0, f.Metric(server.MetricSessions, "protocol", "2"))
	f.Registry.Remove("cluster-2")
	var err error
	for err == nil {
		_, err = stream.Recv()
	}
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "cluster deregistered")
	require.Eventually(t, func() bool { return f.Metric(server.MetricSessions, "protocol", "2") == 0 }, 10*time.Second, 10*time.Millisecond)
}

// A snapshot that never finishes is refused at its deadline on a Session
// (PushRefused, DeadlineExceeded) and the session goes on.
func TestSessionRefusesASnapshotAtItsDeadline(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true, SnapshotDeadline: 300 * time.Millisecond})
	stream := rawSession(t, f, f.Bootstrap("cluster-1"))
	require.NoError(t, stream.Send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Snapshot{Snapshot: &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Header{Header: &relaypb.SnapshotHeader{
		Cluster: "cluster-1", Hash: strings.Repeat("ab", 32), Size: 100, Parts: 1}}}}}))
	got, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, got.GetPushRefused(), "%v", got)
	assert.Equal(t, int32(codes.DeadlineExceeded), got.GetPushRefused().GetCode())
	require.NoError(t, stream.Send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Ping{Ping: &relaypb.Ping{Nonce: 9}}}))
	got, err = stream.Recv()
	require.NoError(t, err)
	assert.Equal(t, int64(9), got.GetPong().GetNonce())
}
