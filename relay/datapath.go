package relay

import (
	"context"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// DataPathConfig enables the Discovery service (Push and Pull).
type DataPathConfig struct {
	View    *View
	Outputs *Outputs
	Limits  SnapshotLimits
	// SnapshotsPerSecond and SnapshotBurst bound how often one agent may
	// push; defaults 2/s, burst 10. Extra snapshots are refused, not queued.
	SnapshotsPerSecond float64
	SnapshotBurst      int
}

// discoveryService implements relaypb.DiscoveryServer on a Server.
type discoveryService struct {
	relaypb.UnimplementedDiscoveryServer
	s   *Server
	cfg DataPathConfig

	mu       sync.Mutex
	limiters map[string]*rate.Limiter // per cluster, so new streams get no fresh budget
}

func (d *discoveryService) limiter(cluster string) *rate.Limiter {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.limiters == nil {
		d.limiters = map[string]*rate.Limiter{}
	}
	l := d.limiters[cluster]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(d.cfg.SnapshotsPerSecond), d.cfg.SnapshotBurst)
		d.limiters[cluster] = l
	}
	return l
}

// open registers a data-path stream of the authenticated agent as a session
// (so deregistration ends it) and counts it in gauge; done undoes both.
func (d *discoveryService) open(streamCtx context.Context, gauge prometheus.Gauge) (*agent, context.Context, func(), error) {
	a, ok := agentFrom(streamCtx)
	if !ok {
		return nil, nil, nil, errUnauthenticated
	}
	ctx, done, err := d.s.session(streamCtx, a)
	if err != nil {
		return nil, nil, nil, err
	}
	gauge.Inc()
	return a, ctx, func() { gauge.Dec(); done() }, nil
}

// Push implements relaypb.DiscoveryServer.
func (d *discoveryService) Push(stream relaypb.Discovery_PushServer) error {
	m := d.s.cfg.Metrics
	a, ctx, done, err := d.open(stream.Context(), m.pushClients)
	if err != nil {
		return err
	}
	defer done()
	lim := d.limiter(a.cluster)
	msgs, recvErr := recvLoop(ctx, stream.Recv)
	for {
		var snap *relaypb.Snapshot
		select {
		case <-ctx.Done():
			return d.s.sessionEnded(ctx, a)
		case err := <-recvErr:
			return ignoreEOF(err)
		case snap = <-msgs:
		}
		ack := &relaypb.PushAck{Hash: text.Truncate(snap.GetHash(), 80), Accepted: true}
		size := proto.Size(snap)
		reason := ""
		switch {
		case !lim.Allow():
			reason = "rate_limited"
			ack.Accepted, ack.Error = false, fmt.Sprintf("%v: more than %.0f snapshots per second; the last accepted snapshot stays in force", ErrSnapshotRefused, d.cfg.SnapshotsPerSecond)
		default:
			if err := ValidateSnapshot(a.cluster, snap, d.cfg.Limits); err != nil {
				reason = "invalid"
				ack.Accepted, ack.Error = false, err.Error()
			}
		}
		now := d.s.cfg.Clock()
		if ack.Accepted {
			// The registration may have ended while the snapshot was checked;
			// a deregistered cluster must not reappear in the view.
			if reg, ok := d.s.cfg.Registry.Lookup(a.cluster); !ok || reg.UID != a.registration {
				return status.Error(codes.PermissionDenied, "cluster deregistered")
			}
			d.cfg.View.Accept(a.cluster, snap, now)
			m.snapshotBytes.Observe(float64(size))
			m.snapshotObjects.WithLabelValues(a.cluster).Set(float64(len(snap.GetMeshes()) + len(snap.GetWorkloads()) + len(snap.GetDestinations())))
			m.snapshotAccepted.WithLabelValues(a.cluster).Set(float64(now.Unix()))
		} else {
			m.snapshotsRefused.WithLabelValues(reason).Inc()
			d.cfg.View.Refused(a.cluster, ack.Error)
			d.s.log.Warn("snapshot refused", "cluster", a.cluster, "reason", ack.Error)
		}
		if err := stream.Send(ack); err != nil {
			return err
		}
	}
}

// Pull implements relaypb.DiscoveryServer: the current set at once, then
// every new version; acks are recorded in the view.
func (d *discoveryService) Pull(stream relaypb.Discovery_PullServer) error {
	m := d.s.cfg.Metrics
	a, ctx, done, err := d.open(stream.Context(), m.pullClients)
	if err != nil {
		return err
	}
	defer done()
	// No set goes out before the outputs are complete: an agent prunes what
	// is missing, so a half-loaded set would delete good configuration.
	select {
	case <-ctx.Done():
		return d.s.sessionEnded(ctx, a)
	case <-d.cfg.Outputs.Ready():
	}
	changed, cancel := d.cfg.Outputs.Subscribe(a.cluster)
	defer cancel()
	acks, recvErr := recvLoop(ctx, stream.Recv)
	var sent uint64
	send := func() error {
		set := d.cfg.Outputs.Get(a.cluster)
		if set == nil || set.GetVersion() == sent {
			return nil // nothing published for this cluster yet: send nothing, never an empty set
		}
		sent = set.GetVersion()
		return stream.Send(set)
	}
	if err := send(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return d.s.sessionEnded(ctx, a)
		case err := <-recvErr:
			return ignoreEOF(err)
		case <-changed:
			if err := send(); err != nil {
				return err
			}
		case ack := <-acks:
			if len(ack.GetResults()) > 100000 {
				return status.Error(codes.InvalidArgument, "ack has too many results")
			}
			d.cfg.View.Acked(a.cluster, ack, d.s.cfg.Clock())
			logged := 0
			for _, r := range ack.GetResults() {
				m.applyResults.WithLabelValues(a.cluster, outcomeLabel(r.GetOutcome())).Inc()
				if (r.GetOutcome() == "conflict" || r.GetOutcome() == "error") && logged < maxLoggedResults {
					logged++
					d.s.log.Warn("agent could not apply an object", "cluster", a.cluster, "version", ack.GetVersion(),
						"object", text.Truncate(r.GetKind()+"/"+r.GetNamespace()+"/"+r.GetName(), 300), "outcome", r.GetOutcome(), "error", text.Truncate(r.GetError(), 300))
				}
			}
		}
	}
}

// maxLoggedResults bounds the log lines one ack can cause; the metric and
// /debug/snapshots/input have the rest.
const maxLoggedResults = 20

// outcomeLabel keeps the metric's label set closed.
func outcomeLabel(o string) string {
	switch o {
	case "applied", "unchanged", "pruned", "conflict", "error":
		return o
	}
	return "other"
}

// recvLoop forwards messages from recv on a goroutine until it fails or ctx ends.
func recvLoop[T any](ctx context.Context, recv func() (T, error)) (<-chan T, <-chan error) {
	msgs := make(chan T)
	errc := make(chan error, 1)
	go func() {
		for {
			msg, err := recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return msgs, errc
}

func ignoreEOF(err error) error {
	if errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
		return nil
	}
	if err != nil && err.Error() == "EOF" {
		return nil
	}
	return err
}

// session registers a stream of an authenticated agent so deregistration
// ends it; done unregisters it.
func (s *Server) session(ctx context.Context, a *agent) (context.Context, func(), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	sess, err := s.addSession(a, cancel, false)
	if err != nil {
		cancel(nil)
		return nil, nil, err
	}
	return ctx, func() { s.removeSession(a.cluster, sess); cancel(nil) }, nil
}

// sessionEnded is the status a stream ends with when its context is done.
func (s *Server) sessionEnded(ctx context.Context, a *agent) error {
	if errors.Is(context.Cause(ctx), errRevoked) {
		return status.Error(codes.PermissionDenied, "cluster deregistered")
	}
	return ctx.Err()
}
