package agent

import (
	"context"
	"errors"
	"io"
	"sync"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A session is held on one of two protocols (docs/design/2026-12-04-relay-session-v2.md):
// v2, one Relay.Session stream that carries everything, or, against a
// server of an earlier release, v1: Relay.Connect, Discovery.PushChunked
// (or Push) and Discovery.Pull. The session loop, push and pull are written
// against the streams below, which either protocol provides.

// sessionStream is the session's own messages: Connect's, or those Session
// carries besides snapshots and output sets.
type sessionStream interface {
	Send(*relaypb.AgentMessage) error
	Recv() (*relaypb.ServerMessage, error)
	// Context carries the connection's TLS state (the server certificate
	// a trust bundle must verify).
	Context() context.Context
}

// chunkStream is one snapshot stream: PushChunked's, or Session's snapshot
// frames until the server refuses one.
type chunkStream interface {
	Send(*relaypb.SnapshotChunk) error
	Recv() (*relaypb.PushAck, error)
}

// pullStream is where output sets come from and their acks go.
type pullStream interface {
	Send(*relaypb.PullAck) error
	Recv() (*relaypb.OutputSet, error)
}

// dataPath opens a session's snapshot and output-set streams.
type dataPath interface {
	PushChunked(ctx context.Context) (chunkStream, error)
	// Push is the whole-snapshot stream of servers without PushChunked.
	Push(ctx context.Context) (relaypb.Discovery_PushClient, error)
	Pull(ctx context.Context) (pullStream, error)
}

// openSessionV1 opens Connect and exchanges Hello for Welcome.
func openSessionV1(ctx context.Context, conn grpc.ClientConnInterface, hello *relaypb.Hello) (sessionStream, *relaypb.Welcome, error) {
	stream, err := relaypb.NewRelayClient(conn).Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	v1 := proto1Hello(hello)
	if err := stream.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Hello{Hello: v1}}); err != nil {
		if errors.Is(err, io.EOF) {
			_, err = stream.Recv() // the server ended the stream; its status says why
		}
		return nil, nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	w := first.GetWelcome()
	if w == nil {
		return nil, nil, errors.New("server did not answer Hello with Welcome")
	}
	return stream, w, nil
}

// proto1Hello is hello as Connect takes it: pull means nothing there (the
// agent opens Pull or does not).
func proto1Hello(hello *relaypb.Hello) *relaypb.Hello {
	return &relaypb.Hello{AgentVersion: hello.GetAgentVersion(), AgentTimeUnixNano: hello.GetAgentTimeUnixNano(),
		TrustBundles: hello.GetTrustBundles(), PinnedRootsFingerprint: hello.GetPinnedRootsFingerprint()}
}

// dataPathV1 opens PushChunked, Push and Pull streams.
type dataPathV1 struct{ c relaypb.DiscoveryClient }

func (d dataPathV1) PushChunked(ctx context.Context) (chunkStream, error) {
	return d.c.PushChunked(ctx)
}
func (d dataPathV1) Push(ctx context.Context) (relaypb.Discovery_PushClient, error) {
	return d.c.Push(ctx)
}
func (d dataPathV1) Pull(ctx context.Context) (pullStream, error) {
	return d.c.Pull(ctx, grpc.MaxCallRecvMsgSize(MaxOutputBytes))
}

// openSessionV2 opens Session and exchanges Hello for Welcome. A server of
// an earlier release answers Unimplemented.
func openSessionV2(ctx context.Context, conn grpc.ClientConnInterface, hello *relaypb.Hello) (sessionStream, dataPath, *relaypb.Welcome, error) {
	stream, err := relaypb.NewRelayClient(conn).Session(ctx, grpc.MaxCallRecvMsgSize(MaxOutputBytes))
	if err != nil {
		return nil, nil, nil, err
	}
	if err := stream.Send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Hello{Hello: hello}}); err != nil {
		if errors.Is(err, io.EOF) {
			_, err = stream.Recv()
		}
		return nil, nil, nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, nil, err
	}
	w := first.GetWelcome()
	if w == nil {
		return nil, nil, nil, errors.New("server did not answer Hello with Welcome")
	}
	m := &sessionMux{ctx: ctx, stream: stream, session: make(chan *relaypb.ServerMessage, 8), sets: make(chan *relaypb.OutputSet, 1), done: make(chan struct{})}
	go m.run()
	return m, m, w, nil
}

// sessionMux carries a session's streams on one Session stream. Its
// receiver never waits on the session's consumers (except for a trust
// bundle, rare): a pong is dropped when eight wait, only the newest output
// set is kept (each is complete), and acks go to the snapshot stream of
// the moment. So the server's sends always drain, whatever this side is
// busy with, and one stream's flow control cannot stall another's.
type sessionMux struct {
	ctx    context.Context
	stream relaypb.Relay_SessionClient
	sendMu sync.Mutex

	session chan *relaypb.ServerMessage
	sets    chan *relaypb.OutputSet

	mu   sync.Mutex
	push *muxPush

	done chan struct{}
	err  error // why the stream ended, once done is closed
}

func (m *sessionMux) send(f *relaypb.AgentFrame) error {
	m.sendMu.Lock()
	defer m.sendMu.Unlock()
	return m.stream.Send(f)
}

// run receives until the stream ends.
func (m *sessionMux) run() {
	defer close(m.done)
	for {
		f, err := m.stream.Recv()
		if err != nil {
			m.err = err
			return
		}
		switch f.GetFrame().(type) {
		case *relaypb.ServerFrame_Pong:
			select {
			case m.session <- &relaypb.ServerMessage{Msg: &relaypb.ServerMessage_Pong{Pong: f.GetPong()}}:
			default:
			}
		case *relaypb.ServerFrame_TrustBundle:
			select {
			case m.session <- &relaypb.ServerMessage{Msg: &relaypb.ServerMessage_TrustBundle{TrustBundle: f.GetTrustBundle()}}:
			case <-m.ctx.Done():
				m.err = m.ctx.Err()
				return
			}
		case *relaypb.ServerFrame_PushAck, *relaypb.ServerFrame_PushRefused:
			m.mu.Lock()
			p := m.push
			m.mu.Unlock()
			if p != nil {
				p.deliver(f)
			}
		case *relaypb.ServerFrame_OutputSet:
			// The newest set replaces one not yet taken.
			select {
			case <-m.sets:
			default:
			}
			m.sets <- f.GetOutputSet()
		default:
			m.err = status.Error(codes.Internal, "relay session: the server sent an unexpected frame")
			return
		}
	}
}

// ended is why the stream ended.
func (m *sessionMux) ended() error {
	if m.err == nil || errors.Is(m.err, io.EOF) {
		return io.EOF
	}
	return m.err
}

// Send implements sessionStream.
func (m *sessionMux) Send(msg *relaypb.AgentMessage) error {
	f := &relaypb.AgentFrame{}
	switch msg.GetMsg().(type) {
	case *relaypb.AgentMessage_Ping:
		f.Frame = &relaypb.AgentFrame_Ping{Ping: msg.GetPing()}
	case *relaypb.AgentMessage_TrustBundleAck:
		f.Frame = &relaypb.AgentFrame_TrustBundleAck{TrustBundleAck: msg.GetTrustBundleAck()}
	default:
		return errors.New("relay session: Hello goes first and only first")
	}
	return m.send(f)
}

// Recv implements sessionStream.
func (m *sessionMux) Recv() (*relaypb.ServerMessage, error) {
	select {
	case msg := <-m.session:
		return msg, nil
	case <-m.done:
		return nil, m.ended()
	}
}

// Context implements sessionStream.
func (m *sessionMux) Context() context.Context { return m.stream.Context() }

// PushChunked implements dataPath: the snapshot frames from now on, until
// the server refuses one (or ctx ends).
func (m *sessionMux) PushChunked(ctx context.Context) (chunkStream, error) {
	p := &muxPush{m: m, ctx: ctx, acks: make(chan *relaypb.PushAck, 16), refused: make(chan error, 1)}
	m.mu.Lock()
	m.push = p
	m.mu.Unlock()
	return p, nil
}

// Push implements dataPath: a server that knows Session knows PushChunked.
func (m *sessionMux) Push(context.Context) (relaypb.Discovery_PushClient, error) {
	return nil, status.Error(codes.Unimplemented, "relay session v2 carries chunked snapshots only")
}

// Pull implements dataPath.
func (m *sessionMux) Pull(ctx context.Context) (pullStream, error) {
	return muxPull{m: m, ctx: ctx}, nil
}

type muxPush struct {
	m       *sessionMux
	ctx     context.Context
	acks    chan *relaypb.PushAck
	refused chan error
}

// deliver hands an ack or refusal to the stream without waiting: acks
// beyond 16 unread are dropped (the agent reads them as they come).
func (p *muxPush) deliver(f *relaypb.ServerFrame) {
	if r := f.GetPushRefused(); r != nil {
		select {
		case p.refused <- status.Error(codes.Code(r.GetCode()), r.GetMessage()):
		default:
		}
		return
	}
	select {
	case p.acks <- f.GetPushAck():
	default:
	}
}

func (p *muxPush) Send(c *relaypb.SnapshotChunk) error {
	return p.m.send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_Snapshot{Snapshot: c}})
}

func (p *muxPush) Recv() (*relaypb.PushAck, error) {
	select {
	case ack := <-p.acks:
		return ack, nil
	case err := <-p.refused:
		return nil, err
	case <-p.m.done:
		return nil, p.m.ended()
	case <-p.ctx.Done():
		return nil, p.ctx.Err()
	}
}

type muxPull struct {
	m   *sessionMux
	ctx context.Context
}

func (p muxPull) Send(ack *relaypb.PullAck) error {
	return p.m.send(&relaypb.AgentFrame{Frame: &relaypb.AgentFrame_PullAck{PullAck: ack}})
}

func (p muxPull) Recv() (*relaypb.OutputSet, error) {
	select {
	case set := <-p.m.sets:
		return set, nil
	case <-p.m.done:
		return nil, p.m.ended()
	case <-p.ctx.Done():
		return nil, p.ctx.Err()
	}
}
