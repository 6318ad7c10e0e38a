package agent

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// staticSource always has the same snapshot.
type staticSource struct{ s *relaypb.Snapshot }

func (s staticSource) Snapshot() (*relaypb.Snapshot, error) { return s.s, nil }
func (staticSource) Changes() <-chan struct{}               { return nil }

// fakeStream is the client side of a Push or PushChunked stream: what the
// agent sends goes to sent; Recv answers with acks, then fails with
// recvErr once the stream is done.
type fakeStream[Req any] struct {
	grpc.ClientStream
	ctx     context.Context
	mu      sync.Mutex
	sent    []Req
	acks    chan *relaypb.PushAck
	recvErr error
}

func newFakeStream[Req any](ctx context.Context, recvErr error) *fakeStream[Req] {
	return &fakeStream[Req]{ctx: ctx, acks: make(chan *relaypb.PushAck, 16), recvErr: recvErr}
}

func (f *fakeStream[Req]) Send(r Req) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.recvErr != nil {
		return io.EOF
	}
	f.sent = append(f.sent, r)
	return nil
}

func (f *fakeStream[Req]) Recv() (*relaypb.PushAck, error) {
	if f.recvErr != nil {
		return nil, f.recvErr
	}
	select {
	case a := <-f.acks:
		return a, nil
	case <-f.ctx.Done():
		return nil, status.FromContextError(f.ctx.Err()).Err()
	}
}

func (f *fakeStream[Req]) CloseSend() error { return nil }

func (f *fakeStream[Req]) messages() []Req {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Req(nil), f.sent...)
}

// fakeDiscovery answers PushChunked with chunkedErrs in turn (nil: a
// stream that works), and Push with a stream that works.
type fakeDiscovery struct {
	relaypb.DiscoveryClient
	mu          sync.Mutex
	chunkedErrs []error
	chunked     []*fakeStream[*relaypb.SnapshotChunk]
	whole       []*fakeStream[*relaypb.Snapshot]
}

func (f *fakeDiscovery) PushChunked(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[relaypb.SnapshotChunk, relaypb.PushAck], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	if len(f.chunkedErrs) > 0 {
		err, f.chunkedErrs = f.chunkedErrs[0], f.chunkedErrs[1:]
	}
	s := newFakeStream[*relaypb.SnapshotChunk](ctx, err)
	f.chunked = append(f.chunked, s)
	return s, nil
}

func (f *fakeDiscovery) Push(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[relaypb.Snapshot, relaypb.PushAck], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := newFakeStream[*relaypb.Snapshot](ctx, nil)
	f.whole = append(f.whole, s)
	return s, nil
}

func (f *fakeDiscovery) streams() ([]*fakeStream[*relaypb.SnapshotChunk], []*fakeStream[*relaypb.Snapshot]) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeStream[*relaypb.SnapshotChunk](nil), f.chunked...), append([]*fakeStream[*relaypb.Snapshot](nil), f.whole...)
}

// testSession is a session whose push the tests run by hand.
func testSession(t *testing.T, snap *relaypb.Snapshot) *Session {
	s, err := NewSession(SessionConfig{ServerAddress: "unused:1", TLS: func() (*tls.Config, error) { return &tls.Config{}, nil },
		Snapshots: staticSource{snap}, Retry: backoff.Policy{Min: 10 * time.Millisecond, Max: 20 * time.Millisecond}})
	require.NoError(t, err)
	return s
}

// Against a server of an earlier release (PushChunked unimplemented) the
// agent sends its snapshots whole.
func TestPushFallsBackToWholeSnapshots(t *testing.T) {
	snap := relaytest.Snapshot(3)
	sess := testSession(t, snap)
	fake := &fakeDiscovery{chunkedErrs: []error{status.Error(codes.Unimplemented, "unknown method PushChunked")}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sess.push(ctx, dataPathV1{fake}) }()
	require.Eventually(t, func() bool {
		_, whole := fake.streams()
		return len(whole) == 1 && len(whole[0].messages()) == 1
	}, 30*time.Second, time.Millisecond)
	_, whole := fake.streams()
	assert.True(t, proto.Equal(snap, whole[0].messages()[0]), "the snapshot, whole")
	whole[0].acks <- &relaypb.PushAck{Hash: snap.GetHash(), Accepted: true}
	require.Eventually(t, func() bool { return sess.State().PushedHash == snap.GetHash() }, 30*time.Second, time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)

	// A snapshot over the old limit is not sent whole; the agent says why.
	big := relaytest.Snapshot(40000)
	require.Greater(t, proto.Size(big), relay.DefaultMaxSnapshotBytes)
	sess = testSession(t, big)
	fake = &fakeDiscovery{chunkedErrs: []error{status.Error(codes.Unimplemented, "unknown method PushChunked")}}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- sess.push(ctx, dataPathV1{fake}) }()
	require.Eventually(t, func() bool { return sess.State().PushError != "" }, 30*time.Second, time.Millisecond)
	assert.Contains(t, sess.State().PushError, "exceeds the 4194304-byte limit of servers without chunked pushes")
	_, whole = fake.streams()
	require.Len(t, whole, 1)
	assert.Empty(t, whole[0].messages())
}

// The agent sends a snapshot as a header, parts of at most 1 MiB and an
// end; a refused stream is opened again, and the session goes on.
func TestPushSendsPartsAndRetries(t *testing.T) {
	snap := relaytest.Snapshot(15000)
	// Every field of a snapshot, so the parts' order is checked for all.
	snap.Workloads = []*relaypb.Workload{{Name: "app-0", Namespace: "bookinfo", Cluster: "cluster-1", Kind: "Deployment",
		PodLabels: map[string]string{"app": "app-0", "version": "v1"}, MeshName: "istiod", MeshNamespace: "istio-system"}}
	relaytest.Rehash(snap)
	data, hash := relaytest.Encode(t, snap)
	require.Equal(t, snap.GetHash(), hash)
	sess := testSession(t, snap)
	fake := &fakeDiscovery{chunkedErrs: []error{status.Error(codes.ResourceExhausted, "no room"), status.Error(codes.InvalidArgument, "framing")}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sess.push(ctx, dataPathV1{fake}) }()
	require.Eventually(t, func() bool {
		chunked, _ := fake.streams()
		return len(chunked) == 3 && len(chunked[2].messages()) > 0
	}, 30*time.Second, time.Millisecond, "two refused streams, then a third")
	chunked, _ := fake.streams()
	third := chunked[2]
	require.Eventually(t, func() bool { m := third.messages(); return len(m) > 0 && m[len(m)-1].GetEnd() != nil }, 30*time.Second, time.Millisecond)
	msgs := third.messages()
	h := msgs[0].GetHeader()
	require.NotNil(t, h)
	assert.Equal(t, &relaypb.SnapshotHeader{Cluster: "cluster-1", Hash: hash, Size: uint64(len(data)), Parts: uint32(len(msgs) - 2)}, h, "header")
	var got []byte
	for i, m := range msgs[1 : len(msgs)-1] {
		p := m.GetPart()
		require.NotNil(t, p)
		assert.Equal(t, uint32(i), p.GetIndex())
		assert.LessOrEqual(t, len(p.GetData()), relay.MaxSnapshotPartBytes)
		if i < len(msgs)-3 {
			assert.GreaterOrEqual(t, len(p.GetData()), relay.MinSnapshotPartBytes)
		}
		got = append(got, p.GetData()...)
	}
	assert.Equal(t, data, got, "the parts are the deterministic encoding without the hash")
	assert.Equal(t, hash, msgs[len(msgs)-1].GetEnd().GetHash())
	third.acks <- &relaypb.PushAck{Hash: hash, Accepted: true}
	require.Eventually(t, func() bool { return sess.State().PushedHash == hash && sess.State().PushError == "" }, 30*time.Second, time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("push ended: %v", err)
	default:
	}

	// Losing the server ends push (and with it the session).
	fake = &fakeDiscovery{chunkedErrs: []error{status.Error(codes.Unavailable, "gone")}}
	go func() { done <- sess.push(ctx, dataPathV1{fake}) }()
	assert.Equal(t, codes.Unavailable, status.Code(<-done))
}

// earlierDiscovery is the Discovery service of a server of an earlier
// release: it accepts every snapshot pushed whole and knows no
// PushChunked.
type earlierDiscovery struct {
	relaypb.UnimplementedDiscoveryServer
	got chan *relaypb.Snapshot
}

func (e *earlierDiscovery) Push(stream relaypb.Discovery_PushServer) error {
	for {
		s, err := stream.Recv()
		if err != nil {
			return err
		}
		e.got <- s
		if err := stream.Send(&relaypb.PushAck{Hash: s.GetHash(), Accepted: true}); err != nil {
			return err
		}
	}
}

// Over real gRPC, a server whose Discovery service has no PushChunked (as
// servers of earlier releases are registered) answers it with
// Unimplemented, and the agent sends its snapshot whole instead; one over
// the old limit it keeps, saying why.
func TestPushAgainstEarlierServer(t *testing.T) {
	desc := relaypb.Discovery_ServiceDesc
	desc.Streams = slices.DeleteFunc(slices.Clone(desc.Streams), func(s grpc.StreamDesc) bool { return s.StreamName == "PushChunked" })
	require.Len(t, desc.Streams, len(relaypb.Discovery_ServiceDesc.Streams)-1)
	earlier := &earlierDiscovery{got: make(chan *relaypb.Snapshot, 16)}
	srv := grpc.NewServer()
	srv.RegisterService(&desc, earlier)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := relaypb.NewDiscoveryClient(conn)

	snap := relaytest.Snapshot(3)
	sess := testSession(t, snap)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sess.push(ctx, dataPathV1{client}) }()
	select {
	case got := <-earlier.got:
		assert.True(t, proto.Equal(snap, got), "the snapshot, whole")
	case err := <-done:
		t.Fatalf("push ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no snapshot reached the earlier server")
	}
	require.Eventually(t, func() bool { return sess.State().PushedHash == snap.GetHash() }, 30*time.Second, time.Millisecond)
	assert.Empty(t, sess.State().PushError)
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)

	big := relaytest.Snapshot(40000)
	require.Greater(t, proto.Size(big), relay.DefaultMaxSnapshotBytes)
	sess = testSession(t, big)
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- sess.push(ctx, dataPathV1{client}) }()
	require.Eventually(t, func() bool { return sess.State().PushError != "" }, 30*time.Second, time.Millisecond)
	assert.Contains(t, sess.State().PushError, "exceeds the 4194304-byte limit of servers without chunked pushes")
	select {
	case got := <-earlier.got:
		t.Fatalf("a snapshot of %d bytes was sent to a server that cannot take it", proto.Size(got))
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

// Without a Dialer the session leaves dialling to gRPC, whose own dialer
// honours HTTPS_PROXY; a custom one (even a plain net.Dialer) would
// silently bypass an agent's egress proxy.
func TestSessionLeavesDiallingToGRPC(t *testing.T) {
	s, err := NewSession(SessionConfig{ServerAddress: "relay.example:9900", TLS: func() (*tls.Config, error) { return &tls.Config{}, nil }})
	require.NoError(t, err)
	assert.Nil(t, s.cfg.Dialer)
	assert.Zero(t, s.next, "one address: it is the first")
}
