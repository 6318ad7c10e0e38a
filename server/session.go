package server

import (
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Session implements relaypb.RelayServer: relay session v2, an agent's
// whole session on one stream (docs/design/2026-12-04-relay-session-v2.md).
// It is Connect, PushChunked and Pull in one select loop: one handler and
// one receiving goroutine per agent instead of three of each. A snapshot
// refused in transit is answered with PushRefused and the session goes on.
func (s *Server) Session(stream relaypb.Relay_SessionServer) error {
	if s.cfg.SessionV1Only {
		return status.Error(codes.Unimplemented, "relay session v2 is turned off on this server: use Connect, PushChunked and Pull")
	}
	a, ctx, end, err := s.startSession(stream.Context())
	if err != nil {
		return err
	}
	defer end()
	frames, recvErr := recvLoop(ctx, stream.Recv)

	var hello *relaypb.Hello
	select {
	case <-ctx.Done():
		return s.sessionEnded(ctx, a)
	case err := <-recvErr:
		return ignoreEOF(err)
	case <-time.After(helloTimeout):
		return status.Error(codes.DeadlineExceeded, "no Hello within "+helloTimeout.String())
	case first := <-frames:
		if hello = first.GetHello(); hello == nil {
			return status.Error(codes.InvalidArgument, "the first message of a session must be Hello")
		}
	}
	bundles, err := s.newBundleDelivery(a.cluster, hello)
	if err != nil {
		return err
	}
	send := func(f *relaypb.ServerFrame) error { return stream.Send(f) }
	// Counted before the Welcome: an agent holding one is in the gauge.
	s.cfg.Metrics.sessions.WithLabelValues("2").Inc()
	defer s.cfg.Metrics.sessions.WithLabelValues("2").Dec()
	if err := send(&relaypb.ServerFrame{Frame: &relaypb.ServerFrame_Welcome{Welcome: s.welcome(a)}}); err != nil {
		return err
	}
	s.log.Info("agent session opened", "cluster", a.cluster, "peer", a.peer, "agent_version", hello.GetAgentVersion(), "protocol", 2)
	s.agentClock(a.cluster, hello)
	sendBundle := func(b *relaypb.TrustBundle) error {
		return send(&relaypb.ServerFrame{Frame: &relaypb.ServerFrame_TrustBundle{TrustBundle: b}})
	}
	if err := bundles.offer(sendBundle); err != nil {
		return err
	}

	d := s.disc
	var push *sessionPush
	if d != nil {
		m := d.s.cfg.Metrics
		m.pushClients.Inc()
		defer m.pushClients.Dec()
		push = newSessionPush(a, func() *chunkedStream { return d.newChunkedStream(a, time.Now) })
		defer func() {
			push.c.close()
			if push.timer != nil {
				push.timer.Stop()
			}
		}()
	}
	// Output sets go out only once the outputs are complete (see Pull),
	// and only to an agent that applies them.
	var ready <-chan struct{}
	var changed <-chan struct{}
	var sent uint64
	sendSet := func() error {
		set := d.cfg.Outputs.Get(a.cluster)
		if set == nil || set.GetVersion() == sent {
			return nil
		}
		sent = set.GetVersion()
		return send(&relaypb.ServerFrame{Frame: &relaypb.ServerFrame_OutputSet{OutputSet: set}})
	}
	if d != nil && hello.GetPull() {
		m := d.s.cfg.Metrics
		m.pullClients.Inc()
		defer m.pullClients.Dec()
		ready = d.cfg.Outputs.Ready()
	}
	for {
		var deadline <-chan time.Time
		var preempted <-chan struct{}
		if push != nil {
			deadline, preempted = push.deadline(), push.c.asm.Preempted()
		}
		select {
		case <-ctx.Done():
			return s.sessionEnded(ctx, a)
		case err := <-recvErr:
			if ignoreEOF(err) == nil {
				s.log.Info("agent session closed", "cluster", a.cluster, "reason", err)
			}
			return ignoreEOF(err)
		case <-ready:
			ready = nil
			var unsubscribe func()
			changed, unsubscribe = d.cfg.Outputs.Subscribe(a.cluster)
			defer unsubscribe()
			if err := sendSet(); err != nil {
				return err
			}
		case <-changed:
			if err := sendSet(); err != nil {
				return err
			}
		case <-deadline:
			if err := push.refuse(send, push.c.expire()); err != nil {
				return err
			}
		case <-preempted:
			if err := push.refuse(send, push.c.expire()); err != nil {
				return err
			}
		case f := <-frames:
			if err := s.sessionFrame(a, f, bundles, push, send, sendBundle); err != nil {
				return err
			}
		}
	}
}

// welcome answers a's Hello.
func (s *Server) welcome(a *agent) *relaypb.Welcome {
	return &relaypb.Welcome{Cluster: a.cluster, SpiffeId: a.id.String(), CertificateNotAfterUnix: a.cert.NotAfter.Unix()}
}

// sessionFrame handles one frame of a Session after Hello; the error ends
// the session.
func (s *Server) sessionFrame(a *agent, f *relaypb.AgentFrame, bundles *bundleDelivery, push *sessionPush, send func(*relaypb.ServerFrame) error, sendBundle func(*relaypb.TrustBundle) error) error {
	switch f.GetFrame().(type) {
	case *relaypb.AgentFrame_Ping:
		if err := send(&relaypb.ServerFrame{Frame: &relaypb.ServerFrame_Pong{Pong: &relaypb.Pong{Nonce: f.GetPing().GetNonce()}}}); err != nil {
			return err
		}
		// A changed bundle goes out at the next ping.
		return bundles.offer(sendBundle)
	case *relaypb.AgentFrame_TrustBundleAck:
		return bundles.acknowledged(f.GetTrustBundleAck())
	case *relaypb.AgentFrame_Snapshot:
		if push == nil {
			return status.Error(codes.Unimplemented, "this server takes no snapshots")
		}
		return push.take(send, f.GetSnapshot())
	case *relaypb.AgentFrame_PullAck:
		if s.disc == nil {
			return status.Error(codes.Unimplemented, "this server sends no output sets")
		}
		return s.disc.pullAck(a, f.GetPullAck())
	case *relaypb.AgentFrame_Hello:
		return status.Error(codes.InvalidArgument, "Hello is a session's first message, and only its first")
	default:
		return status.Error(codes.InvalidArgument, "empty or unknown session frame")
	}
}

// sessionPush is the snapshot side of a Session: PushChunked's
// chunkedStream, started afresh after each refusal, and, after one, the
// refused snapshot's remaining parts dropped until the next header.
type sessionPush struct {
	a *agent
	c *chunkedStream
	// open starts the stream of the next snapshot.
	open func() *chunkedStream
	// discarding: a snapshot was refused; its parts still in flight are
	// dropped until a SnapshotHeader starts the next.
	discarding bool
	// refusals paces refused snapshots: on PushChunked each refusal ended
	// the stream, and new streams are paced by the connection's stream
	// guard; here the session ends once refusals come faster than one a
	// second beyond a burst, so a broken or hostile agent cannot make the
	// server log and record refusals at line rate.
	refusals *rate.Limiter
	// timer fires at armed, the deadline of the snapshot in transit.
	timer *time.Timer
	armed time.Time
}

func newSessionPush(a *agent, open func() *chunkedStream) *sessionPush {
	return &sessionPush{a: a, c: open(), open: open, refusals: rate.NewLimiter(rate.Every(time.Second), maxRefusalBurst)}
}

// maxRefusalBurst is how many refused snapshots a session may have in a
// row before their rate (one a second) applies.
const maxRefusalBurst = 5

// deadline fires when the snapshot in transit runs out of time; nil when
// none is in transit.
//
// One timer for the session, moved only when the deadline moves: the loop
// asks at every frame, and a new timer per frame (every part of a large
// snapshot, every ping) was garbage on the data path.
func (p *sessionPush) deadline() <-chan time.Time {
	dl, ok := p.c.asm.Deadline()
	if !ok {
		return nil
	}
	switch {
	case p.timer == nil:
		p.timer = time.NewTimer(time.Until(dl))
	case !dl.Equal(p.armed):
		p.timer.Reset(time.Until(dl))
	}
	p.armed = dl
	return p.timer.C
}

// take handles one chunk: an ack when it completes a snapshot, a
// PushRefused when it breaks one.
func (p *sessionPush) take(send func(*relaypb.ServerFrame) error, chunk *relaypb.SnapshotChunk) error {
	if p.discarding {
		if chunk.GetHeader() == nil {
			return nil
		}
		p.discarding = false
	}
	ack, err := p.c.take(chunk)
	if err != nil {
		return p.refuse(send, err)
	}
	if ack == nil {
		return nil
	}
	return send(&relaypb.ServerFrame{Frame: &relaypb.ServerFrame_PushAck{PushAck: ack}})
}

// refuse answers a refused snapshot (err is the status chunkedStream
// recorded) with PushRefused, and starts afresh: what the refused one
// held is released, the last accepted snapshot stays.
func (p *sessionPush) refuse(send func(*relaypb.ServerFrame) error, err error) error {
	st := status.Convert(err)
	if !p.refusals.Allow() {
		return status.Error(codes.ResourceExhausted, "snapshots refused more often than once a second: "+st.Message()+"; the last accepted snapshot stays; reconnect after a pause")
	}
	p.c.close()
	p.c = p.open()
	p.discarding = true
	return send(&relaypb.ServerFrame{Frame: &relaypb.ServerFrame_PushRefused{PushRefused: &relaypb.PushRefused{Code: int32(st.Code()), Message: st.Message()}}})
}
