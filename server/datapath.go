package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/internal/text"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaymesh/relaymesh/relay"
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
	Limits  relay.SnapshotLimits
	// SnapshotsPerSecond and SnapshotBurst bound how often one agent may
	// push; defaults 2/s, burst 10. Extra snapshots are refused, not queued.
	SnapshotsPerSecond float64
	SnapshotBurst      int
	// SnapshotDeadline bounds the time from a chunked snapshot's header to
	// its end (PushChunked); default 60 s, room for 64 MiB at 10 Mbit/s.
	SnapshotDeadline time.Duration
	// SnapshotIdle is how long a chunked snapshot in transit may go
	// without a part, and SnapshotMinRate (bytes per second) the least
	// average rate of its parts after its first SnapshotIdle; defaults
	// relay.DefaultSnapshotIdle (10 s) and relay.DefaultSnapshotMinRate
	// (64 KiB/s). A snapshot that stalls is refused (DeadlineExceeded).
	SnapshotIdle    time.Duration
	SnapshotMinRate int64
	// SnapshotMemory is the server-wide memory for snapshots in transit:
	// the buffered parts of every chunked push, then the memory decoding
	// them takes, until each is accepted or refused; default 512 MiB. It
	// is reserved as parts arrive, never for what a header announces, and
	// shared fairly: a cluster whose snapshot fits its share (the memory
	// divided by the clusters holding some) gets room, from the snapshots
	// furthest over their share if need be (relay.SnapshotBudget). A
	// snapshot that finds no room is refused (ResourceExhausted) and the
	// agent sends it again later. A 100,000-pod snapshot takes about
	// 200 MiB of it for the moment it is decoded and checked.
	SnapshotMemory int64
}

// Defaults of DataPathConfig beyond those NewServer applies.
const (
	defaultSnapshotDeadline = 60 * time.Second
	defaultSnapshotMemory   = 512 << 20
)

// discoveryService implements relaypb.DiscoveryServer on a Server.
type discoveryService struct {
	relaypb.UnimplementedDiscoveryServer
	s   *Server
	cfg DataPathConfig

	mu       sync.Mutex
	limiters map[string]*rate.Limiter // per cluster, so new streams get no fresh budget

	budgetOnce sync.Once
	budget     *relay.SnapshotBudget
}

// snapshotBudget returns the server-wide budget of snapshots in transit.
func (d *discoveryService) snapshotBudget() *relay.SnapshotBudget {
	d.budgetOnce.Do(func() {
		limit := d.cfg.SnapshotMemory
		if limit <= 0 {
			limit = defaultSnapshotMemory
		}
		d.budget = relay.NewSnapshotBudget(limit, d.s.cfg.Metrics.snapshotAssembly)
	})
	return d.budget
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

// Push implements relaypb.DiscoveryServer: snapshots of up to
// Limits.MaxBytes, each in one message (agents of earlier releases, and
// agents facing servers of earlier releases).
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
		var problem error
		reason := "invalid"
		if !lim.Allow() {
			problem, reason = d.rateLimited(), "rate_limited"
		} else {
			problem = relay.ValidateSnapshot(a.cluster, snap, d.cfg.Limits)
		}
		ack, err := d.ingest(a, snap, snap.GetHash(), proto.Size(snap), problem, reason)
		if err != nil {
			return err
		}
		if err := stream.Send(ack); err != nil {
			return err
		}
	}
}

func (d *discoveryService) rateLimited() error {
	return fmt.Errorf("%w: %s", relay.ErrSnapshotRefused, d.rateMessage())
}

func (d *discoveryService) rateMessage() string {
	return fmt.Sprintf("more than %.0f snapshots per second; the last accepted snapshot stays in force", d.cfg.SnapshotsPerSecond)
}

// ingest puts a checked snapshot into the view, or records why it was
// refused (problem, counted under reason); either way it returns the ack.
// The last accepted snapshot stays unless snap replaces it. An error ends
// the stream: the cluster was deregistered meanwhile.
func (d *discoveryService) ingest(a *agent, snap *relaypb.Snapshot, hash string, size int, problem error, reason string) (*relaypb.PushAck, error) {
	m := d.s.cfg.Metrics
	ack := &relaypb.PushAck{Hash: text.Truncate(hash, 80), Accepted: problem == nil}
	if problem != nil {
		ack.Error = problem.Error()
		m.snapshotsRefused.WithLabelValues(reason).Inc()
		d.cfg.View.Refused(a.cluster, ack.Error)
		d.s.log.Warn("snapshot refused", "cluster", a.cluster, "reason", ack.Error)
		return ack, nil
	}
	// The registration may have ended while the snapshot was checked; a
	// deregistered cluster must not reappear in the view.
	if reg, ok := d.s.cfg.Registry.Lookup(a.cluster); !ok || reg.UID != a.registration {
		return nil, status.Error(codes.PermissionDenied, "cluster deregistered")
	}
	now := d.s.cfg.Clock()
	d.cfg.View.Accept(a.cluster, snap, now)
	m.snapshotBytes.Observe(float64(size))
	m.snapshotObjects.WithLabelValues(a.cluster).Set(float64(len(snap.GetMeshes()) + len(snap.GetWorkloads()) + len(snap.GetDestinations())))
	m.snapshotAccepted.WithLabelValues(a.cluster).Set(float64(now.Unix()))
	return ack, nil
}

// PushChunked implements relaypb.DiscoveryServer: snapshots of up to
// Limits.MaxChunkedBytes in parts (see relay.proto and chunks.go). A
// broken framing, a missed deadline, a stall, no room or rate for a
// snapshot, or its memory preempted for a cluster within its share ends
// the stream (the agent opens a new one after a pause); a complete
// snapshot is checked like one pushed whole and answered with an ack.
func (d *discoveryService) PushChunked(stream relaypb.Discovery_PushChunkedServer) error {
	m := d.s.cfg.Metrics
	a, ctx, done, err := d.open(stream.Context(), m.pushClients)
	if err != nil {
		return err
	}
	defer done()
	c := d.newChunkedStream(a, time.Now)
	defer c.close()
	msgs, recvErr := recvLoop(ctx, stream.Recv)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var chunk *relaypb.SnapshotChunk
		select {
		case <-ctx.Done():
			return d.s.sessionEnded(ctx, a)
		case err := <-recvErr:
			return ignoreEOF(err)
		case <-timer.C:
			return c.expire()
		case <-c.asm.Preempted():
			return c.expire()
		case chunk = <-msgs:
		}
		ack, err := c.take(chunk)
		if err != nil {
			return err
		}
		timer.Stop()
		if dl, ok := c.asm.Deadline(); ok {
			timer.Reset(time.Until(dl))
		}
		if ack == nil {
			continue
		}
		if err := stream.Send(ack); err != nil {
			return err
		}
	}
}

// chunkedStream is the server's side of one PushChunked stream apart from
// its transport: the stream's messages in turn, and its deadline. It puts
// a snapshot into the view only once it is complete and valid.
type chunkedStream struct {
	d   *discoveryService
	a   *agent
	lim *rate.Limiter
	asm *relay.Assembler
}

// newChunkedStream starts a stream of the authenticated agent a; now is
// the clock of its deadline.
func (d *discoveryService) newChunkedStream(a *agent, now func() time.Time) *chunkedStream {
	return &chunkedStream{d: d, a: a, lim: d.limiter(a.cluster), asm: relay.NewAssembler(d.assemblerConfig(a.cluster, now))}
}

// assemblerConfig is how the chunked snapshots of cluster are put
// together.
func (d *discoveryService) assemblerConfig(cluster string, now func() time.Time) relay.AssemblerConfig {
	deadline := d.cfg.SnapshotDeadline
	if deadline <= 0 {
		deadline = defaultSnapshotDeadline
	}
	return relay.AssemblerConfig{Cluster: cluster, Limits: d.cfg.Limits, Budget: d.snapshotBudget(), Deadline: deadline,
		Idle: d.cfg.SnapshotIdle, MinRate: d.cfg.SnapshotMinRate, Now: now}
}

// take handles the stream's next message. It returns the ack of the
// snapshot the message completes (nil if it completes none), or the
// status error that ends the stream, refused and recorded; the last
// accepted snapshot stays unless an accepted one replaces it.
func (c *chunkedStream) take(chunk *relaypb.SnapshotChunk) (*relaypb.PushAck, error) {
	d, a := c.d, c.a
	if _, inTransit := c.asm.Deadline(); chunk.GetHeader() != nil && !inTransit && !c.lim.Allow() {
		return nil, d.refuseStream(a, &relay.ChunkError{Code: codes.ResourceExhausted, Reason: "rate_limited", Msg: d.rateMessage()})
	}
	out, err := c.asm.Add(chunk)
	if err != nil {
		return nil, d.refuseStream(a, err)
	}
	if out == nil {
		return nil, nil
	}
	defer c.asm.Release()
	problem := out.Err
	if problem == nil {
		problem = relay.ValidateAssembled(a.cluster, out.Snapshot, d.cfg.Limits, out.Hash)
	}
	return d.ingest(a, out.Snapshot, out.Hash, out.Size, problem, "invalid")
}

// expire refuses the snapshot in transit: a limit of its time passed, or
// its memory was preempted.
func (c *chunkedStream) expire() error { return c.d.refuseStream(c.a, c.asm.Expire()) }

// close returns what the stream held; it ended.
func (c *chunkedStream) close() { c.asm.Close() }

// refuseStream ends a PushChunked stream for err (a *relay.ChunkError), records
// the refusal, and leaves the last accepted snapshot in force.
func (d *discoveryService) refuseStream(a *agent, err error) error {
	ce := &relay.ChunkError{Code: codes.Internal, Reason: "framing", Msg: err.Error()}
	errors.As(err, &ce)
	d.s.cfg.Metrics.snapshotsRefused.WithLabelValues(ce.Reason).Inc()
	d.cfg.View.Refused(a.cluster, ce.Error())
	d.s.log.Warn("snapshot stream refused", "cluster", a.cluster, "reason", ce.Reason, "error", ce.Error())
	return status.Error(ce.Code, ce.Error())
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
			if err := d.pullAck(a, ack); err != nil {
				return err
			}
		}
	}
}

// pullAck records an agent's ack of an output set (or, first, the version
// it resumes from); a malformed one is the status error that ends the
// stream.
func (d *discoveryService) pullAck(a *agent, ack *relaypb.PullAck) error {
	m := d.s.cfg.Metrics
	if len(ack.GetResults()) > 100000 {
		return status.Error(codes.InvalidArgument, "ack has too many results")
	}
	if ack.GetResume() {
		// What the agent held before this stream: not a new apply.
		if len(ack.GetResults()) > 0 {
			return status.Error(codes.InvalidArgument, "a resume ack carries no results")
		}
		if err := d.cfg.Outputs.Resume(a.cluster, ack.GetVersion(), d.s.cfg.Clock()); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		return nil
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
	return nil
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
	if errors.Is(context.Cause(ctx), errIsolated) {
		return unavailableIsolated
	}
	return ctx.Err()
}
