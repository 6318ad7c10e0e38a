package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// SnapshotLimitConfig finds the largest snapshot an agent can send.
type SnapshotLimitConfig struct {
	Options
	// PodsPerService shapes the cluster (one Deployment of that many ready
	// pods per Service); default 10.
	PodsPerService int
}

// SnapshotLimitResult is the largest snapshot of each cluster shape the
// server accepted, and what happened to a bigger one.
type SnapshotLimitResult struct {
	// Limit is the agent's and the server's message limit in bytes.
	Limit  int
	Shapes []ShapeLimit
	// OverBytes is the first shape one step bigger; OverResult what the
	// server did when it was sent anyway (the real agent does not send it).
	OverBytes  int
	OverResult string
}

// ShapeLimit is the largest snapshot of one shape under the limit.
type ShapeLimit struct {
	// Shape names the cluster's shape: "services-of-N-pods" (SnapshotSpec)
	// or "discovery-bench" (relaytest.Rich, 200 pods per namespace).
	Shape string
	// Services, Pods and Bytes of the largest snapshot under Limit;
	// Accepted says whether the server accepted it, AckAfter how long
	// after it was sent.
	Services, Pods, Bytes int
	Accepted              bool
	AckAfter              time.Duration
	Error                 string
}

// shape grows a cluster in steps.
type shape struct {
	name     string
	snapshot func(cluster string, n int) *relaypb.Snapshot
}

// SnapshotLimit searches, for each shape, for the largest cluster whose
// snapshot fits the limit (by encoded size), pushes it from one agent, and
// then pushes the first shape one step bigger past the agent's own check.
func SnapshotLimit(ctx context.Context, cfg SnapshotLimitConfig) (*SnapshotLimitResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.PodsPerService == 0 {
		cfg.PodsPerService = 10
	}
	shapes := []shape{
		{fmt.Sprintf("services-of-%d-pods", cfg.PodsPerService), func(c string, n int) *relaypb.Snapshot {
			return SnapshotSpec{Services: n, PodsPerService: cfg.PodsPerService}.Snapshot(c)
		}},
		{"discovery-bench", func(c string, n int) *relaypb.Snapshot { return relaytest.Rich{Namespaces: n}.Snapshot(c) }},
	}
	srv, err := cfg.startServer(ctx, "snapshot-server")
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	members, _, _, err := cfg.registerFleet(ctx, "big", 1)
	if err != nil {
		return nil, err
	}
	cluster := members[0].Cluster
	roots, err := cfg.Env.Mgmt.RelayRoots(ctx)
	if err != nil {
		return nil, err
	}
	// The agent holds a session (the real loop) without pushing; the
	// probe sends whole snapshots on a Push stream of its own over that
	// session's connection, including one the real agent would not send.
	a, err := NewAgent(AgentConfig{Cluster: cluster, Token: members[0].Token, Source: SourceAddr(0), Servers: []string{srv.Addr}, Roots: roots})
	if err != nil {
		return nil, err
	}
	a.Start(ctx)
	defer a.Stop()
	var conn grpc.ClientConnInterface
	if _, err := pollUntil(ctx, 10*time.Millisecond, func() (bool, error) {
		a.mu.Lock()
		conn = a.conn
		a.mu.Unlock()
		return conn != nil, nil
	}); err != nil {
		return nil, fmt.Errorf("agent session: %w (last error %v)", err, a.State().LastError)
	}
	probe, err := newWholePush(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer probe.close()
	if p, err := probe.push(SnapshotSpec{}.Snapshot(cluster)); err != nil || !p.Accepted {
		return nil, fmt.Errorf("first snapshot: %v %s", err, p.Error)
	}
	r := &SnapshotLimitResult{Limit: relay.DefaultMaxSnapshotBytes}
	var over *relaypb.Snapshot
	for i, sh := range shapes {
		size := func(n int) int { return proto.Size(sh.snapshot(cluster, n)) }
		lo, hi := 1, 2
		for size(hi) <= r.Limit {
			lo, hi = hi, hi*2
		}
		for hi-lo > 1 { // size(lo) fits, size(hi) does not
			mid := (lo + hi) / 2
			if size(mid) <= r.Limit {
				lo = mid
			} else {
				hi = mid
			}
		}
		snap := sh.snapshot(cluster, lo)
		pods := 0
		for _, d := range snap.GetDestinations() {
			pods += len(d.GetEndpoints())
		}
		sl := ShapeLimit{Shape: sh.name, Services: len(snap.GetDestinations()), Pods: pods, Bytes: proto.Size(snap)}
		if sh.name == "discovery-bench" {
			sl.Pods = relaytest.Rich{Namespaces: lo}.Pods() // two Services select each pod
		}
		cfg.Logf("snapshot: %s: %d Services, %d pods: %d bytes (limit %d)", sh.name, sl.Services, sl.Pods, sl.Bytes, r.Limit)
		if i == 0 {
			over = sh.snapshot(cluster, lo+1)
			r.OverBytes = proto.Size(over)
		}
		stop := cfg.during(ctx, srv)
		p, err := probe.push(snap)
		stop()
		if err != nil {
			return nil, err
		}
		sl.Accepted, sl.AckAfter, sl.Error = p.Accepted, p.AckedAt.Sub(p.SentAt), p.Error
		r.Shapes = append(r.Shapes, sl)
	}
	if p, err := probe.push(over); err != nil {
		r.OverResult = fmt.Sprintf("stream ended: %s: %s", status.Code(err), truncate(status.Convert(err).Message(), 200))
	} else {
		r.OverResult = fmt.Sprintf("answered: accepted=%v %s", p.Accepted, p.Error)
	}
	return r, nil
}

// wholePush is one Discovery.Push stream: whole snapshots, each answered
// before the next is sent.
type wholePush struct {
	ctx    context.Context
	cancel context.CancelFunc
	stream relaypb.Discovery_PushClient
}

func newWholePush(ctx context.Context, conn grpc.ClientConnInterface) (*wholePush, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := relaypb.NewDiscoveryClient(conn).Push(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return &wholePush{ctx: ctx, cancel: cancel, stream: stream}, nil
}

// push sends snap and returns the server's answer to it, or why the stream
// ended (within two minutes).
func (w *wholePush) push(snap *relaypb.Snapshot) (PushResult, error) {
	sent := time.Now()
	if err := w.stream.Send(snap); err != nil {
		if errors.Is(err, io.EOF) {
			_, err = w.stream.Recv() // the stream's status says why
		}
		return PushResult{}, err
	}
	timer := time.AfterFunc(2*time.Minute, w.cancel)
	defer timer.Stop()
	for {
		ack, err := w.stream.Recv()
		if err != nil {
			return PushResult{}, err
		}
		if ack.GetHash() == snap.GetHash() {
			return PushResult{Hash: ack.GetHash(), Accepted: ack.GetAccepted(), Error: ack.GetError(), SentAt: sent, AckedAt: time.Now()}, nil
		}
	}
}

func (w *wholePush) close() { w.cancel() }
