package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/relaymesh/relaymesh/internal/backoff"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// SessionConfig configures an agent's session with the server.
type SessionConfig struct {
	// ServerAddress is host:port of the relay server.
	ServerAddress string
	// TLS returns the mTLS client config (pinned roots, newest certificate).
	TLS func() (*tls.Config, error)
	// Version is sent in Hello.
	Version string
	// PingInterval between keepalive pings; default 10s.
	PingInterval time.Duration
	// Retry bounds reconnect backoff; default 1s..30s with jitter.
	Retry backoff.Policy
	// Snapshots, if set, are pushed to the server (Discovery.Push) on every
	// change of their hash and once per connection.
	Snapshots SnapshotSource
	// Applier, if set, applies the output sets the server sends
	// (Discovery.Pull) and the session acks them.
	Applier OutputApplier
	// Trust, when set, keeps the mesh CAs output sets ask for, signing
	// through this session's connection.
	Trust TrustApplier
	// OnRefused is called when the server refuses the agent's certificate
	// (PermissionDenied or Unauthenticated), so the credential manager can
	// drop it; optional.
	OnRefused func(error)
	Logger    *slog.Logger
	// Clock is the agent's clock, whose time Hello reports; default time.Now.
	Clock func() time.Time
}

// SnapshotSource is the agent's discovery.
type SnapshotSource interface {
	Snapshot() (*relaypb.Snapshot, error)
	Changes() <-chan struct{}
}

// OutputApplier makes the cluster match an output set.
type OutputApplier interface {
	Apply(ctx context.Context, set *relaypb.OutputSet) ([]*relaypb.ObjectResult, error)
}

// TrustApplier keeps the mesh CAs an output set asks for (trust.Agent). It
// returns one result per CA and when to run again (renewal; zero: never).
type TrustApplier interface {
	Apply(ctx context.Context, set *relaypb.OutputSet, sign func(context.Context, *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error)) ([]*relaypb.ObjectResult, time.Time)
}

// SessionState is what the agent knows about its session.
type SessionState struct {
	Connected  bool      `json:"connected"`
	Cluster    string    `json:"cluster,omitempty"`
	SPIFFEID   string    `json:"spiffeID,omitempty"`
	Since      time.Time `json:"since,omitzero"`
	Reconnects int64     `json:"reconnects"`
	LastError  string    `json:"lastError,omitempty"`
	// PushedHash is the hash of the last snapshot the server accepted;
	// PushError why the last one was refused.
	PushedHash string `json:"pushedHash,omitempty"`
	PushError  string `json:"pushError,omitempty"`
	// AppliedVersion is the last output version applied; Outcomes counts
	// its per-object results.
	AppliedVersion uint64         `json:"appliedVersion,omitempty"`
	Outcomes       map[string]int `json:"outcomes,omitempty"`
}

// Session keeps one relay session open, reconnecting with backoff.
type Session struct {
	cfg        SessionConfig
	log        *slog.Logger
	mu         sync.RWMutex
	state      SessionState
	reconnects atomic.Int64
}

// NewSession validates cfg.
func NewSession(cfg SessionConfig) (*Session, error) {
	if cfg.ServerAddress == "" || cfg.TLS == nil {
		return nil, errors.New("relay session: serverAddress and tls are required")
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 10 * time.Second
	}
	if cfg.Retry.Min == 0 {
		cfg.Retry = backoff.Policy{Min: time.Second, Max: 30 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Session{cfg: cfg, log: cfg.Logger.With("component", "relay-session")}, nil
}

// State returns the session state.
func (s *Session) State() SessionState {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.state
	st.Reconnects = s.reconnects.Load()
	return st
}

// Run holds the session until ctx ends.
func (s *Session) Run(ctx context.Context) error {
	attempt := 0
	for {
		start := time.Now()
		err := s.once(ctx)
		s.mu.Lock()
		s.state.Connected = false
		if err != nil {
			s.state.LastError = err.Error()
		}
		s.mu.Unlock()
		if c := status.Code(err); (c == codes.PermissionDenied || c == codes.Unauthenticated) && s.cfg.OnRefused != nil {
			s.cfg.OnRefused(err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(start) > time.Minute {
			attempt = 0 // a long session resets the backoff
		}
		delay := s.cfg.Retry.Delay(attempt)
		attempt++
		s.reconnects.Add(1)
		s.log.Warn("relay session ended; reconnecting", "error", err, "retry_in", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

func (s *Session) once(ctx context.Context) error {
	tlsCfg, err := s.cfg.TLS()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(s.cfg.ServerAddress, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := relaypb.NewRelayClient(conn).Connect(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Hello{Hello: &relaypb.Hello{AgentVersion: s.cfg.Version, AgentTimeUnixNano: s.now().UnixNano()}}}); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	w := first.GetWelcome()
	if w == nil {
		return errors.New("server did not answer Hello with Welcome")
	}
	s.mu.Lock()
	prev := s.state
	s.state = SessionState{Connected: true, Cluster: w.GetCluster(), SPIFFEID: w.GetSpiffeId(), Since: time.Now(),
		AppliedVersion: prev.AppliedVersion, Outcomes: prev.Outcomes}
	s.mu.Unlock()
	s.log.Info("relay session open", "cluster", w.GetCluster(), "spiffe_id", w.GetSpiffeId())

	errc := make(chan error, 3)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				errc <- err
				return
			}
		}
	}()
	disc := relaypb.NewDiscoveryClient(conn)
	if s.cfg.Snapshots != nil {
		go func() { errc <- s.push(ctx, disc) }()
	}
	if s.cfg.Applier != nil {
		go func() { errc <- s.pull(ctx, disc, conn) }()
	}
	tick := time.NewTicker(s.cfg.PingInterval)
	defer tick.Stop()
	var nonce int64
	for {
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			nonce++
			if err := stream.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Ping{Ping: &relaypb.Ping{Nonce: nonce}}}); err != nil {
				return err
			}
		}
	}
}

// push sends the current snapshot at once (every connection starts the
// server's view afresh) and then each time its hash changes.
func (s *Session) push(ctx context.Context, c relaypb.DiscoveryClient) error {
	stream, err := c.Push(ctx)
	if err != nil {
		return err
	}
	acks := make(chan *relaypb.PushAck)
	recvErr := make(chan error, 1)
	go func() {
		for {
			ack, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case acks <- ack:
			case <-ctx.Done():
				return
			}
		}
	}()
	var sent string
	var retry <-chan time.Time
	sendIfChanged := func() error {
		snap, err := s.cfg.Snapshots.Snapshot()
		if err != nil {
			return fmt.Errorf("build snapshot: %w", err)
		}
		if snap.GetHash() == sent {
			return nil
		}
		if n := proto.Size(snap); n > MaxSnapshotBytes {
			// Sending it would only end the session; say so and keep the
			// rest of the session (Pull, Connect) working.
			msg := fmt.Sprintf("snapshot of %d bytes exceeds the %d-byte limit; the server keeps the last accepted one", n, MaxSnapshotBytes)
			s.mu.Lock()
			s.state.PushError = msg
			s.mu.Unlock()
			s.log.Error("snapshot too large to push", "bytes", n, "limit", MaxSnapshotBytes)
			sent = snap.GetHash()
			return nil
		}
		if err := stream.Send(snap); err != nil {
			if errors.Is(err, io.EOF) {
				// The server ended the stream; its status says why.
				_, err = stream.Recv()
			}
			return fmt.Errorf("push stream: %w", err)
		}
		sent = snap.GetHash()
		return nil
	}
	if err := sendIfChanged(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return fmt.Errorf("push stream: %w", err)
		case <-s.cfg.Snapshots.Changes():
			if err := sendIfChanged(); err != nil {
				return err
			}
		case <-retry:
			retry = nil
			if err := sendIfChanged(); err != nil {
				return err
			}
		case ack := <-acks:
			s.mu.Lock()
			if ack.GetAccepted() {
				s.state.PushedHash, s.state.PushError = ack.GetHash(), ""
			} else {
				s.state.PushError = ack.GetError()
			}
			s.mu.Unlock()
			if !ack.GetAccepted() && ack.GetHash() == truncateHash(sent) {
				// The server keeps the last accepted snapshot; send the
				// current one again after a pause (a refusal for rate is
				// transient, and the view must not stay stale).
				s.log.Warn("server refused a snapshot; will send again", "error", ack.GetError())
				sent = ""
				retry = time.After(snapshotRetry)
			}
		}
	}
}

// Data path limits on the agent's side.
const (
	// MaxSnapshotBytes is the largest snapshot the agent sends (the
	// server's default limit).
	MaxSnapshotBytes = 4 << 20
	// MaxOutputBytes is the largest output set the agent accepts.
	MaxOutputBytes = 64 << 20
	snapshotRetry  = time.Second
	applyRetry     = 5 * time.Second
)

func truncateHash(h string) string { return text.Truncate(h, 80) }

// pull applies every output set the server sends and acks it; a set with
// failed objects is applied again after a pause until it applies cleanly or
// a newer one arrives.
func (s *Session) pull(ctx context.Context, c relaypb.DiscoveryClient, conn grpc.ClientConnInterface) error {
	stream, err := c.Pull(ctx, grpc.MaxCallRecvMsgSize(MaxOutputBytes))
	if err != nil {
		return err
	}
	sets := make(chan *relaypb.OutputSet)
	recvErr := make(chan error, 1)
	go func() {
		for {
			set, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case sets <- set:
			case <-ctx.Done():
				return
			}
		}
	}()
	var current *relaypb.OutputSet
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return fmt.Errorf("pull stream: %w", err)
		case current = <-sets:
		case <-retry:
		}
		retry = nil
		set := current
		results, err := s.cfg.Applier.Apply(ctx, set)
		if err != nil {
			results = []*relaypb.ObjectResult{{Outcome: "error", Error: "whole set refused: " + err.Error()}}
			s.log.Error("output set refused", "version", set.GetVersion(), "error", err)
		}
		var renew time.Time
		if s.cfg.Trust != nil {
			var trust []*relaypb.ObjectResult
			trust, renew = s.cfg.Trust.Apply(ctx, set, func(ctx context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
				return relaypb.NewTrustClient(conn).SignIntermediate(ctx, r)
			})
			results = append(results, trust...)
		}
		outcomes := map[string]int{}
		for _, r := range results {
			outcomes[r.GetOutcome()]++
		}
		switch {
		case outcomes["error"] > 0:
			retry = time.After(applyRetry)
		case !renew.IsZero():
			// Renew each intermediate in time, even if no new set comes.
			retry = time.After(max(time.Until(renew), time.Second))
		}
		s.mu.Lock()
		s.state.AppliedVersion, s.state.Outcomes = set.GetVersion(), outcomes
		s.mu.Unlock()
		s.log.Info("output set applied", "version", set.GetVersion(), "objects", len(set.GetObjects()), "outcomes", fmt.Sprint(outcomes))
		if err := stream.Send(&relaypb.PullAck{Version: set.GetVersion(), Results: results}); err != nil {
			return err
		}
	}
}
