package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/internal/dialer"
	"github.com/relaymesh/relaymesh/internal/relaytrust"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// SessionConfig configures an agent's session with the server.
type SessionConfig struct {
	// ServerAddress is host:port of the relay server, or a comma-separated
	// list of its replicas' (each session dials one, see FirstReplica; the
	// TLS configuration must then name the server).
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
	// TrustBundles, when set, stores the relay trust bundles the server
	// sends during a relay root rotation; the session then says so in
	// Hello and acknowledges each bundle. Unset, the agent is listed as
	// unable to acknowledge and the rotation waits for it.
	TrustBundles TrustBundleStore
	// Cluster is the agent's cluster, named in the recovery a broken relay
	// trust calls for (relaytrust.Reason).
	Cluster string
	// OnRefused is called when the server refuses the agent's certificate
	// (PermissionDenied or Unauthenticated), so the credential manager can
	// drop it; optional.
	OnRefused func(error)
	Logger    *slog.Logger
	// Clock is the agent's clock, whose time Hello reports; default time.Now.
	Clock func() time.Time
	// Dialer, if set, opens the TCP connection to one address (the
	// in-process fleet agents choose their source address); nil leaves it
	// to gRPC, whose own dialer honours HTTPS_PROXY (a custom one does not).
	Dialer func(ctx context.Context, address string) (net.Conn, error)
	// SessionV1Only holds the session on Connect, PushChunked and Pull
	// (three streams) even against a server that knows relay session v2
	// (Relay.Session, one stream): an agent of an earlier release, for
	// tests of mixed versions. Unset, the session tries v2 first and falls
	// back when the server answers Unimplemented.
	SessionV1Only bool
	// FirstReplica is the index of the address the first session tries,
	// given how many there are; default random, so agents spread over the
	// replicas. After a session fails the next one starts at the next
	// address, so a replica that accepts connections but cannot serve
	// sessions is left at once instead of being picked again by chance.
	FirstReplica func(n int) int
	// Hooks observe the session; optional.
	Hooks SessionHooks
}

// TrustBundleStore stores a relay trust bundle that came over a session.
// ApplyTrustBundle MUST refuse (and change nothing) a bundle that does
// not verify serverChain, the certificate chain of the server the session
// is with (leaf first), and MUST have stored the roots and pinned them for
// new connections when it returns nil (identity.Manager does).
type TrustBundleStore interface {
	ApplyTrustBundle(ctx context.Context, rootsPEM []byte, fingerprint string, serverChain []*x509.Certificate) error
}

// PinnedRootsReporter is a TrustBundleStore that can say which relay roots
// it pins (ca.TrustBundleFingerprint, "" if none yet): Hello reports it, so
// that a server outside a root rotation sends its roots to an agent that
// was away when the rotation's last bundle went out (identity.Manager is
// one).
type PinnedRootsReporter interface {
	PinnedRootsFingerprint() string
}

// pinnedRoots is what Hello reports of the roots store pins.
func pinnedRoots(store TrustBundleStore) string {
	if r, ok := store.(PinnedRootsReporter); ok {
		return r.PinnedRootsFingerprint()
	}
	return ""
}

// SessionHooks observe a session: for the in-process fleet agents of the
// tests, which run this same loop. Each is optional, runs on one of the
// session's goroutines and must not block.
type SessionHooks struct {
	// Opened: the server at address (as configured) answered Hello; conn
	// is the session's connection until Ended.
	Opened func(address string, conn grpc.ClientConnInterface, w *relaypb.Welcome)
	// Ended: the session at address (empty if none opened) ended.
	Ended func(address string, err error)
	// Sent: a snapshot went out; hash is what its ack will carry.
	Sent func(hash string)
	// PushAnswered: the server answered a snapshot.
	PushAnswered func(ack *relaypb.PushAck)
	// Received: an output set arrived, before the session decides to
	// apply it (one older than the version applied is not).
	Received func(set *relaypb.OutputSet)
	// Acked: the session acknowledged version with results.
	Acked func(version uint64, results []*relaypb.ObjectResult)
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
	Connected bool   `json:"connected"`
	Cluster   string `json:"cluster,omitempty"`
	SPIFFEID  string `json:"spiffeID,omitempty"`
	// Server is the replica address the session is (or was last) open to.
	Server     string    `json:"server,omitempty"`
	Since      time.Time `json:"since,omitzero"`
	Reconnects int64     `json:"reconnects"`
	LastError  string    `json:"lastError,omitempty"`
	// RelayTrust is why the last session failed when the relay trust is
	// broken (relaytrust.Reason: the server not under the pinned
	// root, or this agent's certificate refused as from an untrusted
	// issuer), with the recovery; empty otherwise.
	RelayTrust string `json:"relayTrust,omitempty"`
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
	addrs      []string // the parsed ServerAddress
	log        *slog.Logger
	mu         sync.RWMutex
	state      SessionState
	reconnects atomic.Int64
	// next is the index of the address the next session tries first
	// (Run's goroutine only).
	next int
	// reconnectedFor is the fingerprint of the last trust bundle the agent
	// reconnected for (errSessionPredatesBundle), so it does so once per
	// bundle: refused again on the new session, it is refused and says why.
	reconnectedFor atomic.Pointer[string]
}

// NewSession validates cfg.
func NewSession(cfg SessionConfig) (*Session, error) {
	if cfg.ServerAddress == "" || cfg.TLS == nil {
		return nil, errors.New("relay session: serverAddress and tls are required")
	}
	addrs, err := dialer.Parse(cfg.ServerAddress)
	if err != nil {
		return nil, fmt.Errorf("relay session: %w", err)
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
	next := 0
	if cfg.FirstReplica != nil {
		next = cfg.FirstReplica(len(addrs))
	} else {
		next = rand.IntN(len(addrs))
	}
	if next < 0 || next >= len(addrs) {
		return nil, fmt.Errorf("relay session: first replica %d is not one of %d addresses", next, len(addrs))
	}
	return &Session{cfg: cfg, addrs: addrs, next: next, log: cfg.Logger.With("component", "relay-session")}, nil
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
		server, err := s.once(ctx)
		// A broken relay trust is said first, with its recovery: retrying
		// does not end it.
		reason := relaytrust.Reason(s.cfg.Cluster, err)
		s.mu.Lock()
		s.state.Connected = false
		s.state.RelayTrust = reason
		if err != nil {
			s.state.LastError = err.Error()
			if reason != "" {
				s.state.LastError = reason + " (" + err.Error() + ")"
			}
		}
		s.mu.Unlock()
		// The next session starts at the next replica.
		s.next = (s.next + 1) % len(s.addrs)
		if h := s.cfg.Hooks.Ended; h != nil {
			h(server, err)
		}
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
		if reason != "" {
			s.log.Error("relay session refused: relay trust broken; reconnecting cannot fix it", "reason", reason, "error", err, "retry_in", delay.Round(time.Millisecond))
		} else {
			s.log.Warn("relay session ended; reconnecting", "error", err, "retry_in", delay.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// once holds one session; it returns the address it was open to (empty if
// none opened) and why it ended.
func (s *Session) once(ctx context.Context) (string, error) {
	tlsCfg, err := s.cfg.TLS()
	if err != nil {
		return "", err
	}
	// One replica per session: the one at s.next. Handing gRPC the whole
	// list would let its pick_first dial the next replica too whenever a
	// handshake takes over 250 ms — every agent of a dead replica dialling
	// two of the others at once, doubling the handshakes of the reconnect
	// storm (measured: reconnects 2.5x slower at 1,000 agents) and
	// skewing where agents land. A replica that refuses or stays silent
	// (3 s) fails the session, and the next starts at the next replica.
	server := s.addrs[s.next]
	var opts []grpc.DialOption
	if s.cfg.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(s.cfg.Dialer))
	}
	conn, err := dialer.Dial(server, tlsCfg, opts...)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hello := &relaypb.Hello{AgentVersion: s.cfg.Version, AgentTimeUnixNano: s.now().UnixNano(),
		TrustBundles: s.cfg.TrustBundles != nil, PinnedRootsFingerprint: pinnedRoots(s.cfg.TrustBundles), Pull: s.cfg.Applier != nil}
	var stream sessionStream
	var data dataPath
	var w *relaypb.Welcome
	if !s.cfg.SessionV1Only {
		stream, data, w, err = openSessionV2(ctx, conn, hello)
		if status.Code(err) == codes.Unimplemented {
			s.log.Info("the server does not know relay session v2; holding the session on Connect, PushChunked and Pull", "server", server)
			stream = nil
		} else if err != nil {
			return "", err
		}
	}
	if stream == nil {
		if stream, w, err = openSessionV1(ctx, conn, hello); err != nil {
			return "", err
		}
		data = dataPathV1{relaypb.NewDiscoveryClient(conn)}
	}
	s.mu.Lock()
	prev := s.state
	s.state = SessionState{Connected: true, Cluster: w.GetCluster(), SPIFFEID: w.GetSpiffeId(), Server: server, Since: time.Now(),
		AppliedVersion: prev.AppliedVersion, Outcomes: prev.Outcomes}
	s.mu.Unlock()
	s.log.Info("relay session open", "cluster", w.GetCluster(), "spiffe_id", w.GetSpiffeId(), "server", server)
	if h := s.cfg.Hooks.Opened; h != nil {
		h(server, conn, w)
	}

	errc := make(chan error, 3)
	// Acknowledgements go out through the loop below: one sender.
	acks := make(chan *relaypb.TrustBundleAck, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			if b := msg.GetTrustBundle(); b != nil {
				ack, err := s.applyTrustBundle(ctx, stream.Context(), b)
				if err != nil {
					errc <- err
					return
				}
				select {
				case acks <- ack:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	if s.cfg.Snapshots != nil {
		go func() { errc <- s.push(ctx, data) }()
	}
	if s.cfg.Applier != nil {
		go func() { errc <- s.pull(ctx, data, conn) }()
	}
	tick := time.NewTicker(s.cfg.PingInterval)
	defer tick.Stop()
	var nonce int64
	for {
		select {
		case err := <-errc:
			return server, err
		case <-ctx.Done():
			return server, ctx.Err()
		case ack := <-acks:
			if err := stream.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_TrustBundleAck{TrustBundleAck: ack}}); err != nil {
				return server, err
			}
		case <-tick.C:
			nonce++
			if err := stream.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Ping{Ping: &relaypb.Ping{Nonce: nonce}}}); err != nil {
				if errors.Is(err, io.EOF) {
					// The server ended the stream: the receiving side
					// reports its status.
					select {
					case err = <-errc:
					case <-ctx.Done():
					}
				}
				return server, err
			}
		}
	}
}

// maxAckError bounds the reason a refused trust bundle's acknowledgement
// carries.
const maxAckError = 512

// errSessionPredatesBundle ends a session whose server certificate the
// bundle it carried does not verify, when the store says a new session may
// (NeedsNewSession): the last step of a relay root rotation reaches
// sessions opened under the old root, and the agent reconnects — verified
// by the roots it pins now, which hold the new one — instead of refusing
// the bundle that ends the rotation.
var errSessionPredatesBundle = errors.New("the relay trust bundle the server sent does not verify this session's server certificate, which predates it: reconnecting")

// applyTrustBundle stores a trust bundle the server sent, if it verifies
// the server of this session (streamCtx carries its TLS state), and says
// so in the acknowledgement; a refused bundle changed nothing. A bundle
// refused only because the session predates it returns
// errSessionPredatesBundle and no acknowledgement, once per bundle: the
// next session gets the bundle again.
func (s *Session) applyTrustBundle(ctx, streamCtx context.Context, b *relaypb.TrustBundle) (*relaypb.TrustBundleAck, error) {
	ack := &relaypb.TrustBundleAck{Fingerprint: b.GetFingerprint(), Revision: b.GetRevision()}
	var err error
	switch {
	case s.cfg.TrustBundles == nil:
		err = errors.New("this agent does not store trust bundles")
	default:
		var chain []*x509.Certificate
		if p, ok := peer.FromContext(streamCtx); ok {
			if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
				chain = info.State.PeerCertificates
			}
		}
		err = s.cfg.TrustBundles.ApplyTrustBundle(ctx, b.GetRootsPem(), b.GetFingerprint(), chain)
	}
	var stale interface{ NeedsNewSession() bool }
	if fp := b.GetFingerprint(); errors.As(err, &stale) && stale.NeedsNewSession() && s.reconnectFor(fp) {
		s.log.Info("the relay trust bundle the server sent predates this session's server certificate; reconnecting to verify it", "revision", b.GetRevision())
		return nil, errSessionPredatesBundle
	}
	if err != nil {
		ack.Error = text.Truncate(err.Error(), maxAckError)
		s.log.Warn("refused the relay trust bundle the server sent; still pinning the roots before", "error", err, "revision", b.GetRevision())
		return ack, nil
	}
	s.log.Info("pinned the relay trust bundle the server sent", "fingerprint", b.GetFingerprint(), "revision", b.GetRevision())
	return ack, nil
}

// reconnectFor reports whether the agent has not yet reconnected for the
// bundle with fingerprint fp, and records that it now does.
func (s *Session) reconnectFor(fp string) bool {
	if last := s.reconnectedFor.Load(); last != nil && *last == fp {
		return false
	}
	s.reconnectedFor.Store(&fp)
	return true
}

// push keeps the server's view of the cluster current: it sends the
// current snapshot at once (every connection starts the server's view
// afresh) and then each time its hash changes, in parts (PushChunked), or
// whole (Push, up to relay.DefaultMaxSnapshotBytes) to a server that does
// not know PushChunked. A stream the server refused (framing, deadline, no room or
// rate: InvalidArgument, DeadlineExceeded, ResourceExhausted) is opened
// again after a backoff pause, and the rest of the session goes on; other
// errors end the session.
func (s *Session) push(ctx context.Context, c dataPath) error {
	chunked := true
	attempt := 0
	for {
		accepted, err := s.pushStream(ctx, c, chunked)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if accepted {
			attempt = 0
		}
		switch status.Code(err) {
		case codes.Unimplemented:
			if !chunked {
				return fmt.Errorf("push stream: %w", err)
			}
			chunked = false
			s.log.Info("the server does not know chunked pushes; sending snapshots whole", "limit", relay.DefaultMaxSnapshotBytes)
			continue
		case codes.InvalidArgument, codes.DeadlineExceeded, codes.ResourceExhausted:
		default:
			return fmt.Errorf("push stream: %w", err)
		}
		delay := s.cfg.Retry.Delay(attempt)
		attempt++
		s.mu.Lock()
		s.state.PushError = status.Convert(err).Message()
		s.mu.Unlock()
		s.log.Warn("server refused the snapshot stream; opening a new one", "error", err, "retry_in", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// pushStream runs one Push or PushChunked stream until it fails; accepted
// reports whether the server accepted a snapshot on it.
func (s *Session) pushStream(ctx context.Context, c dataPath, chunked bool) (accepted bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var send func(*relaypb.Snapshot) (string, error)
	var recv func() (*relaypb.PushAck, error)
	if chunked {
		stream, err := c.PushChunked(ctx)
		if err != nil {
			return false, err
		}
		send, recv = func(snap *relaypb.Snapshot) (string, error) { return s.sendChunked(stream, snap) }, stream.Recv
	} else {
		stream, err := c.Push(ctx)
		if err != nil {
			return false, err
		}
		send = func(snap *relaypb.Snapshot) (string, error) {
			if n := proto.Size(snap); n > relay.DefaultMaxSnapshotBytes {
				return "", fmt.Errorf("%w: snapshot of %d bytes exceeds the %d-byte limit of servers without chunked pushes; the server keeps the last accepted one", relay.ErrSnapshotTooLarge, n, relay.DefaultMaxSnapshotBytes)
			}
			return snap.GetHash(), stream.Send(snap)
		}
		recv = stream.Recv
	}
	acks := make(chan *relaypb.PushAck)
	recvErr := make(chan error, 1)
	go func() {
		for {
			ack, err := recv()
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
	// sent is the hash of the snapshot last sent (or found too large), as
	// its source has it; wire the hash its ack carries.
	var sent, wire string
	var retry <-chan time.Time
	onAck := func(ack *relaypb.PushAck) {
		if h := s.cfg.Hooks.PushAnswered; h != nil {
			h(ack)
		}
		s.mu.Lock()
		if ack.GetAccepted() {
			accepted = true
			s.state.PushedHash, s.state.PushError = ack.GetHash(), ""
		} else {
			s.state.PushError = ack.GetError()
		}
		s.mu.Unlock()
		if !ack.GetAccepted() && ack.GetHash() == truncateHash(wire) {
			// The server keeps the last accepted snapshot; send the
			// current one again after a pause (a refusal for rate is
			// transient, and the view must not stay stale).
			s.log.Warn("server refused a snapshot; will send again", "error", ack.GetError())
			sent = ""
			retry = time.After(snapshotRetry)
		}
	}
	sendIfChanged := func() error {
		snap, err := s.cfg.Snapshots.Snapshot()
		if err != nil {
			return fmt.Errorf("build snapshot: %w", err)
		}
		if snap.GetHash() == sent {
			return nil
		}
		h, err := send(snap)
		if errors.Is(err, relay.ErrSnapshotTooLarge) {
			// Sending it would only end the stream; say so and keep the
			// rest of the session (Pull, Connect) working.
			s.mu.Lock()
			s.state.PushError = err.Error()
			s.mu.Unlock()
			s.log.Error("snapshot too large to push", "error", err)
			sent = snap.GetHash()
			return nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// The server ended the stream; its status says why.
				for {
					select {
					case ack := <-acks:
						onAck(ack)
						continue
					case err = <-recvErr:
					case <-ctx.Done():
						err = ctx.Err()
					}
					break
				}
			}
			return err
		}
		sent, wire = snap.GetHash(), h
		if hk := s.cfg.Hooks.Sent; hk != nil {
			hk(truncateHash(h))
		}
		return nil
	}
	if err := sendIfChanged(); err != nil {
		return accepted, err
	}
	for {
		select {
		case <-ctx.Done():
			return accepted, ctx.Err()
		case err := <-recvErr:
			return accepted, err
		case <-s.cfg.Snapshots.Changes():
			if err := sendIfChanged(); err != nil {
				return accepted, err
			}
		case <-retry:
			retry = nil
			if err := sendIfChanged(); err != nil {
				return accepted, err
			}
		case ack := <-acks:
			onAck(ack)
		}
	}
}

// sendChunked sends snap in parts (relay.SendChunked) and returns the hash
// the server's ack will carry.
func (s *Session) sendChunked(stream relay.ChunkSender, snap *relaypb.Snapshot) (string, error) {
	sent, err := relay.SendChunked(stream, snap, relay.DefaultMaxChunkedSnapshotBytes)
	if sent.Sum != "" && sent.Sum != sent.Hash {
		// The server will refuse it (the hash does not match); a
		// snapshot source MUST set the hash snapshothash.Of computes.
		s.log.Error("snapshot hash is not the SHA-256 of its encoding; the server will refuse it", "hash", sent.Hash, "sha256", sent.Sum)
	}
	return sent.Hash, err
}

// Data path limits on the agent's side. The largest snapshot it sends
// whole (Push, to a server without chunked pushes) or in parts is the
// server's default limit: relay.DefaultMaxSnapshotBytes and
// relay.DefaultMaxChunkedSnapshotBytes.
const (
	// MaxOutputBytes is the largest output set the agent accepts.
	MaxOutputBytes = 64 << 20
	snapshotRetry  = time.Second
	applyRetry     = 5 * time.Second
)

func truncateHash(h string) string { return text.Truncate(h, 80) }

// pull applies every output set the server sends and acks it; a set with
// failed objects is applied again after a pause until it applies cleanly or
// a newer one arrives.
func (s *Session) pull(ctx context.Context, c dataPath, conn grpc.ClientConnInterface) error {
	stream, err := c.Pull(ctx)
	if err != nil {
		return err
	}
	// Say what we hold: a replica we failed over to then sends only a
	// newer set, and an older one it sends first is not applied.
	s.mu.RLock()
	applied := s.state.AppliedVersion
	s.mu.RUnlock()
	if applied > 0 {
		if err := stream.Send(&relaypb.PullAck{Version: applied, Resume: true}); err != nil {
			return err
		}
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
		case set := <-sets:
			if h := s.cfg.Hooks.Received; h != nil {
				h(set)
			}
			if set.GetVersion() < applied {
				s.log.Info("output set older than the one applied; waiting for a newer one", "version", set.GetVersion(), "applied", applied)
				continue
			}
			current = set
		case <-retry:
		}
		retry = nil
		set := current
		applied = set.GetVersion()
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
		if h := s.cfg.Hooks.Acked; h != nil {
			h(set.GetVersion(), results)
		}
	}
}
