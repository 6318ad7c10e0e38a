package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Issuer is what the relay needs from the certificate authority.
type Issuer interface {
	// IssueAgentFor issues a client certificate for id, bound to one
	// registration of the cluster (subject OU).
	IssueAgentFor(ctx context.Context, csr *x509.CertificateRequest, id spiffeid.ID, registration string) (*ca.Issued, error)
	// Chain is the issuing CA first: client certificates must be issued by
	// it, or, when the Issuer also has AcceptedIssuers() (ca.Authority),
	// by one of those (the previous issuing CAs a renewal keeps).
	Chain() []*x509.Certificate
	Roots() []*x509.Certificate
}

// TokenRedeemer checks and spends a bootstrap token for a cluster, or
// redeems it again for the key that spent it (identity.Tokens).
type TokenRedeemer interface {
	Redeem(ctx context.Context, cluster, token string, by identity.Redeemer) (identity.Redemption, error)
}

// StatusSink hears about agents; the server writes it to KubernetesCluster
// status. Implementations MUST NOT block for long: they are called inline.
type StatusSink interface {
	CertificateIssued(cluster string, cert *x509.Certificate, agentVersion string)
	SessionChanged(cluster string, connected bool)
}

// BootstrapSink is a StatusSink that also hears which certificates were
// issued to a Bootstrap (not a renewal): the agent's first session
// follows (KubeStatus holds the certificate's write for that session, and
// lets the session's status wait for its first snapshot). Called instead
// of CertificateIssued for such a certificate; MUST NOT block.
type BootstrapSink interface {
	CertificateBootstrapped(cluster string, cert *x509.Certificate, agentVersion string)
}

// PresentedSink is a StatusSink that also hears the certificate an agent's
// first session at this replica presented (KubeStatus names it in the
// session's status when it knows no newer one). Called right before
// SessionChanged; MUST NOT block.
type PresentedSink interface {
	CertificatePresented(cluster string, cert *x509.Certificate)
}

// ServerConfig configures a relay Server.
type ServerConfig struct {
	// TrustDomain of agent SPIFFE IDs.
	TrustDomain spiffeid.TrustDomain
	// Issuer signs agent certificates.
	Issuer Issuer
	// Tokens redeems per-cluster bootstrap tokens.
	Tokens TokenRedeemer
	// SharedToken enables the weaker shared-token compatibility mode; nil
	// (the default) leaves it off.
	SharedToken *identity.SharedToken
	// Registry decides which clusters may connect.
	Registry *Registry
	// ServerCertificate returns the current serving certificate.
	ServerCertificate func() (*tls.Certificate, error)
	// Status hears about issuance and sessions; optional.
	Status StatusSink
	// Audit records every token use, issuance, denial and revocation.
	Audit audit.Recorder
	// Logger for operational logs; never given a secret.
	Logger *slog.Logger
	// Metrics; required.
	Metrics *Metrics
	// Clock, default time.Now.
	Clock func() time.Time
	// BootstrapFailuresPerMinute and BootstrapFailureBurst bound failed
	// bootstraps and refused calls per peer IP (IPv6: per /64); defaults
	// 6/min, burst 5.
	BootstrapFailuresPerMinute float64
	BootstrapFailureBurst      int
	// MaxRecvBytes bounds one identity request; default 64 KiB.
	MaxRecvBytes int
	// DataPath enables the Discovery service (snapshots up, outputs down);
	// nil leaves it off.
	DataPath *DataPathConfig
	// SessionV1Only refuses relay session v2 (Relay.Session) with
	// Unimplemented, as servers of earlier releases do: agents then use
	// Connect, PushChunked and Pull. For tests of mixed versions, and for
	// an operator who must keep the earlier protocol while a problem with
	// v2 is found.
	SessionV1Only bool
	// Trust, when set, serves Trust.SignIntermediate: intermediates of the
	// meshes of the caller's cluster (shared trust of VirtualMeshes).
	Trust IntermediateSigner
	// TrustBundles, when set, is the relay trust bundle each session
	// delivers during a relay root rotation, and after one to an agent that
	// pins other roots (server/trustbundle.go).
	TrustBundles TrustBundleSource
	// Connections bound connections before and after authentication.
	Connections relay.ConnectionLimits
	// Clusters bound what one registered cluster may ask for.
	Clusters relay.ClusterLimits
	// GlobalBootstrapFailuresPerMinute and GlobalBootstrapFailureBurst
	// bound failed bootstraps from all peers together (beside the budget of
	// each peer), so a flood from many addresses is not evaluated and
	// audited without end; defaults 60/min, burst 60.
	GlobalBootstrapFailuresPerMinute float64
	GlobalBootstrapFailureBurst      int
}

// IntermediateSigner signs an intermediate CA for a mesh of cluster, the
// authenticated caller's (trust.Controller).
type IntermediateSigner interface {
	SignIntermediate(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error)
}

// trustService serves Trust for authenticated agents.
type trustService struct {
	relaypb.UnimplementedTrustServer
	signer IntermediateSigner
	s      *Server
}

func (t *trustService) SignIntermediate(ctx context.Context, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
	a, ok := agentFrom(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	// A cluster's refused requests (meshes it may not have, bad CSRs) are
	// evaluated and audited within its refusal budget; beyond it they are
	// refused at once and summarised.
	done, ok := t.s.clusterRefusals.Begin(clusterBudgetKey(a.cluster))
	if !ok {
		t.s.cfg.Metrics.refused.WithLabelValues("cluster_refusals").Inc()
		t.s.throttle.add("intermediate", a.cluster)
		return nil, errClusterThrottled
	}
	resp, err := t.signer.SignIntermediate(ctx, a.cluster, req)
	done(err == nil)
	return resp, err
}

// errClusterThrottled answers a cluster that used up a budget of its own.
var errClusterThrottled = status.Error(codes.ResourceExhausted, "this cluster made too many such requests; retry later")

// clusterBudgetKey keys a cluster's budget apart from any address's.
func clusterBudgetKey(cluster string) string { return "cluster:" + cluster }

func (c *ServerConfig) defaults() {
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.BootstrapFailuresPerMinute == 0 {
		c.BootstrapFailuresPerMinute = 6
	}
	if c.BootstrapFailureBurst == 0 {
		c.BootstrapFailureBurst = 5
	}
	if c.MaxRecvBytes == 0 {
		c.MaxRecvBytes = 64 << 10
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.GlobalBootstrapFailuresPerMinute == 0 {
		c.GlobalBootstrapFailuresPerMinute = 60
	}
	if c.GlobalBootstrapFailureBurst == 0 {
		c.GlobalBootstrapFailureBurst = 60
	}
	c.Connections = c.Connections.WithDefaults()
	c.Clusters = c.Clusters.WithDefaults()
}

// Validate reports every missing or bad field.
func (c ServerConfig) Validate() error {
	var errs []error
	if c.TrustDomain.IsZero() {
		errs = append(errs, errors.New("trustDomain: required"))
	}
	if c.Issuer == nil {
		errs = append(errs, errors.New("issuer: required"))
	}
	if c.Tokens == nil {
		errs = append(errs, errors.New("tokens: required"))
	}
	if c.Registry == nil {
		errs = append(errs, errors.New("registry: required"))
	}
	if c.ServerCertificate == nil {
		errs = append(errs, errors.New("serverCertificate: required"))
	}
	if c.Audit == nil {
		errs = append(errs, errors.New("audit: required (use audit.Discard only in tests)"))
	}
	if c.Metrics == nil {
		errs = append(errs, errors.New("metrics: required"))
	}
	if c.BootstrapFailuresPerMinute < 0 || c.BootstrapFailureBurst < 0 {
		errs = append(errs, errors.New("bootstrapFailures: must not be negative"))
	}
	if c.MaxRecvBytes < 0 || c.MaxRecvBytes > 64<<20 {
		errs = append(errs, errors.New("maxRecvBytes: must be in [0, 64 MiB]"))
	}
	if c.GlobalBootstrapFailuresPerMinute < 0 || c.GlobalBootstrapFailureBurst < 0 {
		errs = append(errs, errors.New("globalBootstrapFailures: must not be negative"))
	}
	if err := c.Connections.Validate(); err != nil {
		errs = append(errs, err)
	}
	if l := c.Clusters; l.RenewsPerMinute < 0 || l.RenewBurst < 0 || l.MaxSessions < 0 || l.RefusalsPerMinute < 0 || l.RefusalBurst < 0 {
		errs = append(errs, errors.New("clusters: limits must not be negative"))
	}
	return errors.Join(errs...)
}

// Server is the relay's gRPC server. Its port serves two gRPC servers,
// split at the TLS handshake (see relay.ConnectionLimits): grpc for peers with a
// relay certificate, pre for the rest, which may only bootstrap.
type Server struct {
	relaypb.UnimplementedIdentityServer
	relaypb.UnimplementedRelayServer

	cfg ServerConfig
	log *slog.Logger
	// disc serves the data path (nil without one); Session uses it too.
	disc      *discoveryService
	limiter   *relay.FailureLimiter // failed calls per peer address
	global    *relay.FailureLimiter // failed bootstraps of all peers
	grpc      *grpc.Server
	pre       *grpc.Server
	issuingCA *x509.Certificate
	// bootstraps bounds the bootstraps evaluated at once.
	bootstraps chan struct{}
	// redeemed remembers which key spent each token, for retries.
	redeemed *redemptions
	// renews and clusterRefusals are per-cluster budgets.
	renews          *perCluster
	clusterRefusals *relay.FailureLimiter
	throttle        *throttleLog
	stopTicker      chan struct{}
	tickerDone      chan struct{}
	stopOnce        sync.Once
	// abusers are addresses whose connections were cut for overspending
	// their stream budget: past their budget, their new connections are
	// closed before the TLS handshake.
	abusers *relay.FailureLimiter

	isolated atomic.Bool
	mu       sync.Mutex
	cutOff   map[string]bool // what the replica is cut off from (SetCutOff)
	sessions map[string]map[*session]struct{}
	gates    []*relay.Gate
	lis      []net.Listener
}

type session struct {
	cancel context.CancelCauseFunc
	// counted sessions (Connect) make a cluster "connected"; Push and Pull
	// streams are tracked only so revocation ends them.
	counted bool
}

// connBufferSize is the read and write buffer of each relay connection.
const connBufferSize = 8 << 10

// errRevoked ends the sessions of a deregistered cluster.
var errRevoked = errors.New("cluster deregistered")

// errIsolated ends every session of a replica cut off from the state the
// replicas share: it can no longer learn of a deregistration (the
// management apiserver), or share what its agents push (the snapshot
// store).
var errIsolated = errors.New("this server replica is cut off from the replicas' shared state")

// unavailableIsolated answers calls while the replica is isolated; agents
// then try another replica.
var unavailableIsolated = status.Error(codes.Unavailable, "this server replica is cut off from the replicas' shared state; try another replica")

// What a replica can be cut off from (SetCutOff).
const (
	CutOffAPIServer     = "the management apiserver"
	CutOffSnapshotStore = "the snapshot store"
)

// Isolated reports whether the replica is cut off (SetCutOff).
func (s *Server) Isolated() bool { return s.isolated.Load() }

// CutOff lists what the replica is cut off from, sorted.
func (s *Server) CutOff() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.cutOff))
}

// SetIsolated says whether this replica is cut off from the management
// apiserver (its own Lease could not be renewed for a lease duration):
// SetCutOff(CutOffAPIServer, isolated).
func (s *Server) SetIsolated(isolated bool) { s.SetCutOff(CutOffAPIServer, isolated) }

// SetCutOff says whether this replica is cut off from one part of the
// state the replicas share (CutOffAPIServer, CutOffSnapshotStore). Cut off
// from any, it fails closed: it ends every session and refuses every call
// until it is back, and the agents reconnect to another replica.
func (s *Server) SetCutOff(from string, cut bool) {
	s.mu.Lock()
	if s.cutOff == nil {
		s.cutOff = map[string]bool{}
	}
	if s.cutOff[from] == cut {
		s.mu.Unlock()
		return
	}
	if cut {
		s.cutOff[from] = true
	} else {
		delete(s.cutOff, from)
	}
	isolated := len(s.cutOff) > 0
	was := s.isolated.Swap(isolated)
	ended := 0
	if isolated && !was {
		for _, set := range s.sessions {
			for sess := range set {
				sess.cancel(errIsolated)
				ended++
			}
		}
	}
	s.mu.Unlock()
	switch {
	case cut && !was:
		s.log.Error("cut off from "+from+": ended every agent session and refusing calls until it is back", "streams_ended", ended)
	case cut:
		s.log.Error("cut off from " + from + " too")
	case !isolated:
		s.log.Info(from + " is reachable again: serving agents")
	default:
		s.log.Info(from+" is reachable again; still cut off", "from", s.CutOff())
	}
}

// NewServer builds a Server; call Serve to accept connections.
func NewServer(cfg ServerConfig) (*Server, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("relay server config: %w", err)
	}
	s := &Server{
		cfg:             cfg,
		log:             cfg.Logger.With("component", "relay-server"),
		limiter:         relay.NewFailureLimiter(cfg.BootstrapFailuresPerMinute, cfg.BootstrapFailureBurst, 10000, cfg.Clock),
		global:          relay.NewGlobalFailureLimiter(cfg.GlobalBootstrapFailuresPerMinute, cfg.GlobalBootstrapFailureBurst, cfg.Clock),
		bootstraps:      make(chan struct{}, cfg.Connections.MaxConcurrentBootstraps),
		redeemed:        newRedemptions(),
		renews:          newPerCluster(cfg.Clusters.RenewsPerMinute, cfg.Clusters.RenewBurst),
		clusterRefusals: relay.NewFailureLimiter(cfg.Clusters.RefusalsPerMinute, cfg.Clusters.RefusalBurst, 100000, cfg.Clock),
		throttle:        newThrottleLog(cfg.Audit, 10*time.Second, cfg.Clock),
		stopTicker:      make(chan struct{}),
		tickerDone:      make(chan struct{}),
		abusers:         relay.NewFailureLimiter(3, 3, 10000, cfg.Clock),
		sessions:        map[string]map[*session]struct{}{},
	}
	if cfg.SharedToken != nil {
		s.log.Warn("shared bootstrap token mode is ON: any holder of relay-identity-token-secret can bootstrap any registered cluster; per-cluster single-use tokens are the secure choice")
	}
	cfg.Registry.OnRevoke(s.revoke)
	chain := cfg.Issuer.Chain()
	if len(chain) == 0 {
		return nil, errors.New("relay server config: issuer has no CA chain")
	}
	s.issuingCA = chain[0]
	// The authenticated transport admits the largest message any method
	// takes; each unary method is held to MaxRecvBytes by the interceptor,
	// snapshots to their own limit. The pre-authentication transport admits
	// MaxRecvBytes and refuses anything larger before reading it.
	maxMsg := cfg.MaxRecvBytes
	if dp := cfg.DataPath; dp != nil {
		dp.Limits = dp.Limits.WithDefaults()
		if dp.SnapshotsPerSecond == 0 {
			dp.SnapshotsPerSecond = 2
		}
		if dp.SnapshotBurst == 0 {
			dp.SnapshotBurst = 10
		}
		if dp.View == nil || dp.Outputs == nil {
			return nil, errors.New("relay server config: dataPath needs view and outputs")
		}
		maxMsg = max(maxMsg, dp.Limits.MaxBytes)
	}
	lim := cfg.Connections
	// Idle sessions are most of a fleet: small per-connection buffers (the
	// 32 KiB defaults are sized for throughput). No read buffer at all:
	// the framer reads from the TLS connection, which holds a decrypted
	// record already, so a buffer of its own is a second copy held by
	// every idle agent (8 KiB each, 10 MB of 1,000 agents' heap); the write
	// buffer is shared between flushes (gRPC's default).
	s.grpc = grpc.NewServer(
		grpc.Creds(relay.HandshakenCreds{}),
		grpc.ReadBufferSize(0),
		grpc.WriteBufferSize(connBufferSize),
		grpc.MaxRecvMsgSize(maxMsg),
		grpc.MaxHeaderListSize(64<<10),
		grpc.MaxConcurrentStreams(64),
		grpc.UnaryInterceptor(s.unaryAuth),
		grpc.StreamInterceptor(s.streamAuth),
		grpc.StatsHandler(relay.NewStreamGuard(cfg.Metrics.gate, "authenticated", s.abusers)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Half-open connections are found and closed: ping after 30s of
		// silence, give up 10s later. A connection without a stream for 5
		// minutes is closed (agents hold sessions, so theirs never idle).
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionIdle: 5 * time.Minute}),
	)
	s.pre = grpc.NewServer(
		grpc.Creds(relay.HandshakenCreds{}),
		grpc.ReadBufferSize(connBufferSize),
		grpc.WriteBufferSize(connBufferSize),
		grpc.MaxRecvMsgSize(cfg.MaxRecvBytes),
		grpc.MaxHeaderListSize(16<<10),
		grpc.MaxConcurrentStreams(2),
		grpc.UnaryInterceptor(s.unaryPreAuth),
		grpc.StreamInterceptor(func(_ any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, _ grpc.StreamHandler) error {
			return s.refuseUnauthenticated(ss.Context())
		}),
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error { return s.refuseUnauthenticated(ss.Context()) }),
		grpc.StatsHandler(preAuthGuard{StreamGuard: relay.NewStreamGuard(cfg.Metrics.gate, "preauth", s.abusers), s: s}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second,
			MaxConnectionIdle: lim.PreAuthIdle, MaxConnectionAge: lim.PreAuthAge, MaxConnectionAgeGrace: 5 * time.Second}),
	)
	relaypb.RegisterIdentityServer(s.grpc, s)
	relaypb.RegisterRelayServer(s.grpc, s)
	relaypb.RegisterIdentityServer(s.pre, bootstrapOnly{s: s})
	if cfg.Trust != nil {
		relaypb.RegisterTrustServer(s.grpc, &trustService{signer: cfg.Trust, s: s})
	}
	if cfg.DataPath != nil {
		s.disc = &discoveryService{s: s, cfg: *cfg.DataPath}
		relaypb.RegisterDiscoveryServer(s.grpc, s.disc)
		cfg.Registry.OnRevoke(func(cluster string) {
			if _, ok := cfg.Registry.Lookup(cluster); !ok {
				cfg.DataPath.View.Remove(cluster)
			}
		})
	}
	go s.flushThrottled()
	return s, nil
}

// tlsConfig serves the relay certificate and verifies client certificates
// when given: Bootstrap has none, everything else must (checked per call).
// The client CAs follow Issuer.Roots() at every handshake, so a relay CA
// reloaded with another or a second root (a root rotation) reaches the TLS
// layer without a restart.
func (s *Server) tlsConfig() *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cfg.ServerCertificate()
		},
		ClientAuth: tls.VerifyClientCertIfGiven,
		// gRPC over TLS negotiates HTTP/2 by ALPN.
		NextProtos: []string{"h2"},
	}
	var cached atomic.Pointer[clientCAConfig]
	current := func() *tls.Config {
		roots := s.cfg.Issuer.Roots()
		if c := cached.Load(); c != nil && slices.EqualFunc(c.roots, roots, (*x509.Certificate).Equal) {
			return c.cfg
		}
		cfg := base.Clone()
		cfg.ClientCAs = x509.NewCertPool()
		for _, r := range roots {
			cfg.ClientCAs.AddCert(r)
		}
		cached.Store(&clientCAConfig{roots: slices.Clone(roots), cfg: cfg})
		return cfg
	}
	out := current().Clone()
	out.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return current(), nil }
	return out
}

// clientCAConfig is the TLS configuration for one set of relay roots.
type clientCAConfig struct {
	roots []*x509.Certificate
	cfg   *tls.Config
}

// Serve accepts connections on lis until Stop: it runs the TLS handshake
// under the connection limits and hands each connection to the
// authenticated or the pre-authentication server.
func (s *Server) Serve(lis net.Listener) error {
	g := relay.NewGate(s.cfg.Connections, s.tlsConfig(), s.cfg.Metrics.gate, lis.Addr(), s.abusers)
	s.mu.Lock()
	s.gates = append(s.gates, g)
	s.lis = append(s.lis, lis)
	s.mu.Unlock()
	go func() { _ = s.grpc.Serve(g.Authenticated()) }()
	go func() { _ = s.pre.Serve(g.PreAuth()) }()
	return g.Serve(lis)
}

// Stop ends every session and closes the listeners.
func (s *Server) Stop() {
	s.closeListeners()
	s.grpc.Stop()
	s.pre.Stop()
	s.stopFlushing()
}

// GracefulStop waits for calls to finish (sessions are long-lived: prefer Stop).
func (s *Server) GracefulStop() {
	s.closeListeners()
	s.pre.GracefulStop()
	s.grpc.GracefulStop()
	s.stopFlushing()
}

// stopFlushing writes the last summary of throttled calls and waits for it.
func (s *Server) stopFlushing() {
	s.stopOnce.Do(func() { close(s.stopTicker) })
	<-s.tickerDone
}

func (s *Server) closeListeners() {
	s.mu.Lock()
	lis, gates := s.lis, s.gates
	s.lis, s.gates = nil, nil
	s.mu.Unlock()
	for _, l := range lis {
		_ = l.Close()
	}
	for _, g := range gates {
		g.Close()
	}
}

// flushThrottled writes the summaries of throttled calls every window,
// and drops the redemptions whose retry window ended, until Stop.
func (s *Server) flushThrottled() {
	defer close(s.tickerDone)
	t := time.NewTicker(s.throttle.window)
	defer t.Stop()
	for {
		select {
		case <-s.stopTicker:
			s.throttle.flush()
			return
		case <-t.C:
			s.throttle.flush()
			s.redeemed.sweep(s.cfg.Clock())
		}
	}
}

// bootstrapOnly is the Identity service of the pre-authentication server:
// Bootstrap only; Renew needs a certificate.
type bootstrapOnly struct {
	relaypb.UnimplementedIdentityServer
	s *Server
}

func (b bootstrapOnly) Bootstrap(ctx context.Context, req *relaypb.BootstrapRequest) (*relaypb.CertificateResponse, error) {
	return b.s.Bootstrap(ctx, req)
}

// unaryPreAuth guards the pre-authentication server: Bootstrap alone (the
// transport already refused messages over MaxRecvBytes unread).
func (s *Server) unaryPreAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != methodBootstrap {
		return nil, s.refuseUnauthenticated(ctx)
	}
	return handler(ctx, req)
}

// refuseUnauthenticated answers a call that needs a certificate on a
// connection without one. It costs the peer's address one failure; with
// none left, the answer is that it is throttled. Such calls are counted,
// not audited, so knocking cannot fill the audit log.
func (s *Server) refuseUnauthenticated(ctx context.Context) error {
	accounted(ctx)
	done, ok := s.limiter.Begin(peerIP(ctx))
	if !ok {
		s.cfg.Metrics.refused.WithLabelValues("rate_limited").Inc()
		return errThrottled
	}
	done(false)
	s.cfg.Metrics.refused.WithLabelValues("no_certificate").Inc()
	return errUnauthenticated
}

// preAuthGuard is the pre-authentication server's stats handler: the
// stream budget of relay.StreamGuard, and a failure charged to the peer's address
// for every call that ends in an error before a handler accounted for it
// (an oversized message, an unknown method), so those are not free either.
type preAuthGuard struct {
	relay.StreamGuard
	s *Server
}

type callAccounted struct{ done atomic.Bool }

type callAccountedKey struct{}

func (g preAuthGuard) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, callAccountedKey{}, &callAccounted{})
}

func (g preAuthGuard) HandleRPC(ctx context.Context, st stats.RPCStats) {
	g.StreamGuard.HandleRPC(ctx, st)
	end, ok := st.(*stats.End)
	if !ok || end.Error == nil {
		return
	}
	if a, ok := ctx.Value(callAccountedKey{}).(*callAccounted); ok && a.done.Load() {
		return
	}
	ip := peerIP(ctx)
	if done, ok := g.s.limiter.Begin(ip); ok {
		done(false)
	}
	g.s.cfg.Metrics.refused.WithLabelValues("preauth_" + strings.ToLower(status.Code(end.Error).String())).Inc()
}

// accounted marks a pre-authentication call as charged by its handler.
func accounted(ctx context.Context) {
	if a, ok := ctx.Value(callAccountedKey{}).(*callAccounted); ok {
		a.done.Store(true)
	}
}

const methodBootstrap = "/relaymesh.relay.v1.Identity/Bootstrap"

// unaryAuth authenticates every unary call but Bootstrap.
func (s *Server) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if m, ok := req.(proto.Message); ok {
		if n := proto.Size(m); n > s.cfg.MaxRecvBytes {
			return nil, status.Errorf(codes.ResourceExhausted, "request of %d bytes exceeds the limit of %d", n, s.cfg.MaxRecvBytes)
		}
	}
	if info.FullMethod == methodBootstrap {
		return handler(ctx, req)
	}
	a, err := s.authenticate(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(withAgent(ctx, a), req)
}

// streamAuth authenticates every stream.
func (s *Server) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	a, err := s.authenticate(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &agentStream{ServerStream: ss, ctx: withAgent(ss.Context(), a)})
}

type agentStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (a *agentStream) Context() context.Context { return a.ctx }

// agent is an authenticated peer.
type agent struct {
	cluster      string
	registration string // the KubernetesCluster UID the certificate is bound to
	id           spiffeid.ID
	cert         *x509.Certificate
	peer         string
}

type agentKey struct{}

func withAgent(ctx context.Context, a *agent) context.Context {
	return context.WithValue(ctx, agentKey{}, a)
}

func agentFrom(ctx context.Context) (*agent, bool) {
	a, ok := ctx.Value(agentKey{}).(*agent)
	return a, ok
}

// errUnauthenticated is what an unauthenticated caller learns; the log and
// the metric say why.
var errUnauthenticated = status.Error(codes.Unauthenticated, "a relay client certificate of a registered cluster is required")

// errThrottled answers a peer that used up its refused calls.
var errThrottled = status.Error(codes.ResourceExhausted, "too many refused calls from this address; retry later")

// authenticate maps the verified peer certificate to a registered cluster.
// Every refused call costs the peer one unit of its failure budget, so
// neither probing nor log and audit volume is free. Calls without a relay
// certificate are counted and logged at debug level only; calls with a
// relay certificate that is no longer acceptable are audited.
func (s *Server) authenticate(ctx context.Context, method string) (*agent, error) {
	if s.isolated.Load() {
		return nil, unavailableIsolated
	}
	ip := peerIP(ctx)
	done, ok := s.limiter.Begin(budgetKey(ctx, ip))
	if !ok {
		s.cfg.Metrics.refused.WithLabelValues("rate_limited").Inc()
		return nil, errThrottled
	}
	a, reason, err := s.verifyPeer(ctx)
	done(err == nil)
	if err == nil {
		return a, nil
	}
	s.cfg.Metrics.refused.WithLabelValues(reason).Inc()
	if a == nil {
		s.log.Debug("relay call refused", "peer", ip, "method", method, "reason", reason)
		return nil, err
	}
	s.log.Warn("relay call refused", "cluster", a.cluster, "peer", ip, "method", method, "reason", reason)
	s.record(audit.Event{Type: audit.CertDeny, Result: audit.ResultFailure, Cluster: a.cluster, Subject: a.id.String(),
		Serial: fmt.Sprintf("%x", a.cert.SerialNumber), Peer: ip, Reason: reason, Details: map[string]string{"method": method}})
	return nil, err
}

// budgetKey is whose budget a call spends: a caller with a verified
// certificate spends that certificate's (so an agent whose certificate was
// revoked, retrying behind the same NAT as healthy agents, exhausts only its
// own budget); a caller without one spends its address's.
func budgetKey(ctx context.Context, ip string) string {
	if info, ok := relay.TLSInfo(ctx); ok && len(info.State.VerifiedChains) > 0 && len(info.State.VerifiedChains[0]) > 0 {
		return "certificate:" + fmt.Sprintf("%x", info.State.VerifiedChains[0][0].SerialNumber)
	}
	return ip
}

// acceptedIssuers are the issuing CAs agent certificates may come from:
// the issuer's current one, and, from an issuer that keeps them
// (AcceptedIssuers), the previous ones a renewal keeps until the agent
// certificates they signed have expired.
func (s *Server) acceptedIssuers() []*x509.Certificate {
	if set, ok := s.cfg.Issuer.(ca.IssuerSet); ok {
		if a := set.AcceptedIssuers(); len(a) > 0 {
			return a
		}
	}
	if chain := s.cfg.Issuer.Chain(); len(chain) > 0 {
		return chain[:1]
	}
	return []*x509.Certificate{s.issuingCA}
}

// verifyPeer checks the TLS-verified chain: issued by one of the relay's
// accepted issuing CAs (not merely under the same root), exactly one agent SPIFFE ID, a
// registered cluster, and the certificate's registration (subject OU)
// equal to the cluster's current one. On refusal it returns the reason and,
// when the certificate was a genuine relay agent certificate, the agent it
// named (for the audit record).
func (s *Server) verifyPeer(ctx context.Context) (*agent, string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, "no_peer", errUnauthenticated
	}
	info, ok := relay.TLSInfo(ctx)
	if !ok || len(info.State.VerifiedChains) == 0 {
		return nil, "no_certificate", errUnauthenticated
	}
	accepted := s.acceptedIssuers()
	var leaf *x509.Certificate
	for _, chain := range info.State.VerifiedChains {
		if len(chain) >= 2 && slices.ContainsFunc(accepted, func(c *x509.Certificate) bool { return bytes.Equal(chain[1].Raw, c.Raw) }) {
			leaf = chain[0]
			break
		}
	}
	if leaf == nil {
		return nil, "foreign_issuer", errUnauthenticated
	}
	if len(leaf.URIs) != 1 {
		return nil, "not_agent_id", errUnauthenticated
	}
	id, err := spiffeid.FromURI(leaf.URIs[0])
	if err != nil {
		return nil, "not_agent_id", errUnauthenticated
	}
	cluster, err := identity.ClusterFromID(s.cfg.TrustDomain, id)
	if err != nil {
		return nil, "not_agent_id", errUnauthenticated
	}
	a := &agent{cluster: cluster, id: id, cert: leaf, peer: p.Addr.String()}
	if len(leaf.Subject.OrganizationalUnit) == 1 {
		a.registration = leaf.Subject.OrganizationalUnit[0]
	}
	reg, ok := s.cfg.Registry.Lookup(cluster)
	if !ok {
		return a, "unregistered", status.Error(codes.PermissionDenied, "cluster is not registered")
	}
	if a.registration == "" || a.registration != reg.UID {
		return a, "stale_registration", status.Error(codes.PermissionDenied, "certificate was issued to an earlier registration of this cluster")
	}
	return a, "", nil
}

// record writes an audit event and reports whether it was written.
func (s *Server) record(e audit.Event) bool {
	if err := s.cfg.Audit.Record(e); err != nil {
		s.log.Error("audit log write failed", "type", e.Type, "error", err)
		return false
	}
	return true
}

// errAuditUnavailable refuses an operation whose audit record could not be
// written: nothing is issued that the log does not show.
var errAuditUnavailable = status.Error(codes.Unavailable, "audit log unavailable; refusing to issue")

// peerIP is the address a rate limit applies to.
func peerIP(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "unknown"
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return p.Addr.String()
	}
	return host
}

// errBootstrapDenied is the one answer to every token or registration problem.
var errBootstrapDenied = status.Error(codes.PermissionDenied, "bootstrap denied: the token is unknown, used, expired or not for this cluster, or the cluster is not registered")

// Bootstrap implements relaypb.IdentityServer.
func (s *Server) Bootstrap(ctx context.Context, req *relaypb.BootstrapRequest) (*relaypb.CertificateResponse, error) {
	accounted(ctx)
	if s.isolated.Load() {
		return nil, unavailableIsolated
	}
	ip := peerIP(ctx)
	done, ok := s.limiter.Begin(ip)
	if !ok {
		s.cfg.Metrics.bootstrapFailures.WithLabelValues("rate_limited").Inc()
		s.throttle.add("bootstrap", relay.PeerKey(ip))
		return nil, status.Error(codes.ResourceExhausted, "too many failed bootstrap attempts from this address; retry later")
	}
	// Every peer's failures also spend one budget of all peers, so a flood
	// from many addresses is bounded too (eviction from the table of
	// addresses cannot reset it).
	globalDone, ok := s.global.Begin("*")
	if !ok {
		done(true)
		s.cfg.Metrics.bootstrapFailures.WithLabelValues("rate_limited_global").Inc()
		s.throttle.add("bootstrap_global", relay.PeerKey(ip))
		return nil, status.Error(codes.ResourceExhausted, "too many failed bootstrap attempts from all addresses; retry later")
	}
	select {
	case s.bootstraps <- struct{}{}:
	case <-ctx.Done():
		done(true)
		globalDone(true)
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-time.After(s.cfg.Connections.HandshakeTimeout):
		done(true)
		globalDone(true)
		s.cfg.Metrics.bootstrapFailures.WithLabelValues("busy").Inc()
		return nil, status.Error(codes.ResourceExhausted, "the server is busy with other bootstraps; retry later")
	}
	resp, err := s.bootstrap(ctx, ip, req)
	<-s.bootstraps
	// Being asked to come back later is not a failed attempt.
	ok = err == nil || errors.Is(err, errBootstrapLater)
	done(ok)
	globalDone(ok)
	return resp, err
}

// minBootstrapBudget is the least time a Bootstrap call must have left for
// the server to spend its token: with less, the answer would likely come
// after the caller gave up (it may still retry: see redemptions).
const minBootstrapBudget = time.Second

// bootstrapWorkTimeout bounds the work after a token is spent, which no
// longer depends on the caller still waiting.
const bootstrapWorkTimeout = 30 * time.Second

// errBootstrapLater asks the agent to retry without counting a failure.
var errBootstrapLater = status.Error(codes.Unavailable, "the server cannot complete this bootstrap now; retry with the same key")

func (s *Server) bootstrap(ctx context.Context, ip string, req *relaypb.BootstrapRequest) (*relaypb.CertificateResponse, error) {
	fail := func(reason string, cluster string, err error) error {
		s.cfg.Metrics.bootstrapFailures.WithLabelValues(reason).Inc()
		s.cfg.Metrics.issued.WithLabelValues("bootstrap", "failure").Inc()
		s.log.Warn("bootstrap refused", "cluster", cluster, "peer", ip, "reason", reason)
		s.record(audit.Event{Type: audit.TokenFailure, Result: audit.ResultFailure, Cluster: cluster, Peer: ip, Reason: reason})
		return err
	}
	cluster := req.GetCluster()
	if err := identity.ValidateClusterName(cluster); err != nil {
		return nil, fail("bad_cluster_name", "", status.Error(codes.InvalidArgument, err.Error()))
	}
	csr, err := ca.ParseCSR(req.GetCsr())
	if err != nil {
		return nil, fail("bad_csr", cluster, status.Error(codes.InvalidArgument, err.Error()))
	}
	// A token that cannot be one is refused before anything is read: an
	// unauthenticated caller must not make the server ask the apiserver.
	parsed, perr := identity.ParseToken(req.GetToken())
	if perr != nil && s.cfg.SharedToken == nil {
		return nil, fail(identity.ReasonMalformed, cluster, errBootstrapDenied)
	}
	// Registration is checked before the token is consumed, so a token sent
	// too early (before the KubernetesCluster exists) is not burned; a
	// cluster the watch has not shown yet is read from the apiserver.
	reg, ok := s.cfg.Registry.LookupFresh(ctx, cluster)
	if !ok {
		return nil, fail("unregistered", cluster, errBootstrapDenied)
	}
	// A per-cluster token spent earlier here by this same key (its first
	// call gave up or lost the answer) gets that call's certificate.
	key := keyDigest(csr)
	release := func() {} // un-claims a remembered redemption this call does not complete
	secret := parsed.SecretDigest()
	if perr == nil {
		switch outcome, resp := s.redeemed.retry(parsed.ID, secret, key, cluster, reg.UID, s.cfg.Clock()); outcome {
		case retryAnswer:
			if !s.record(audit.Event{Type: audit.TokenUse, Result: audit.ResultSuccess, Cluster: cluster, Peer: ip, Reason: "retry by the key that spent it",
				Details: map[string]string{"token_id": parsed.ID}}) {
				return nil, errAuditUnavailable
			}
			s.cfg.Metrics.issued.WithLabelValues("bootstrap", "retried").Inc()
			return resp, nil
		case retryInFlight:
			return nil, errBootstrapLater
		case retryIssue:
			// Nothing was issued for it here: the token's record decides
			// below, as on any replica (it may be revoked since).
			release = func() { s.redeemed.done(parsed.ID, nil) }
		case retryNone:
			// Claimed while this call redeems it: a retry by this key
			// here waits for it rather than issuing a second certificate.
			if s.redeemed.claim(parsed.ID, secret, key, cluster, reg.UID, s.cfg.Clock()) {
				release = func() { s.redeemed.unclaim(parsed.ID, secret, key) }
			}
		}
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < minBootstrapBudget {
		release()
		s.cfg.Metrics.bootstrapFailures.WithLabelValues("deadline").Inc()
		return nil, errBootstrapLater
	}
	if err := ctx.Err(); err != nil {
		release()
		return nil, status.FromContextError(err).Err()
	}
	// From here on the token is spent: the work finishes whether or not the
	// caller still waits, and its result is kept for a retry by this key.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bootstrapWorkTimeout)
	defer cancel()
	red, err := s.redeem(wctx, cluster, req.GetToken(), identity.Redeemer{Key: key, Registration: reg.UID})
	if err != nil {
		release()
		reason := "denied"
		var d *identity.DenialError
		if errors.As(err, &d) {
			reason = d.Reason
		}
		return nil, fail(reason, cluster, errBootstrapDenied)
	}
	tokenID, now := red.Record.ID, s.cfg.Clock()
	spentAt := now
	if red.Record.Spent != nil {
		spentAt = red.Record.Spent.At
	}
	remembered := perr == nil && tokenID == parsed.ID
	if remembered {
		// Remembered until the spend's window ends, not this call's.
		s.redeemed.spent(parsed.ID, secret, key, cluster, reg.UID, now, spentAt.Add(identity.RetryWindow))
	}
	used := audit.Event{Type: audit.TokenUse, Result: audit.ResultSuccess, Cluster: cluster, Peer: ip, Details: map[string]string{"token_id": tokenID}}
	if red.Retry {
		// Spent by this key through another replica (or before this
		// process started): a new certificate for the same key.
		used.Reason = "retry by the key that spent it"
		used.Details["spent_at"] = spentAt.UTC().Format(time.RFC3339)
	}
	var resp *relaypb.CertificateResponse
	if s.record(used) {
		resp, err = s.issue(wctx, "bootstrap", cluster, reg.UID, ip, csr, req.GetAgentVersion())
	} else {
		err = errAuditUnavailable
	}
	if remembered {
		s.redeemed.done(parsed.ID, resp)
	}
	return resp, err
}

// redeem checks a per-cluster token, or the shared token when that mode is
// on and the token is not per-cluster shaped (its redemption's record id
// is "shared").
func (s *Server) redeem(ctx context.Context, cluster, token string, by identity.Redeemer) (identity.Redemption, error) {
	if s.cfg.SharedToken != nil {
		if _, perr := identity.ParseToken(token); perr != nil {
			if err := s.cfg.SharedToken.Check(token); err != nil {
				return identity.Redemption{}, err
			}
			return identity.Redemption{Record: identity.TokenRecord{ID: "shared"}}, nil
		}
	}
	return s.cfg.Tokens.Redeem(ctx, cluster, token, by)
}

// Renew implements relaypb.IdentityServer.
func (s *Server) Renew(ctx context.Context, req *relaypb.RenewRequest) (*relaypb.CertificateResponse, error) {
	a, ok := agentFrom(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	if !s.renews.allow(a.cluster, s.cfg.Clock()) {
		s.cfg.Metrics.issued.WithLabelValues("renew", "throttled").Inc()
		s.throttle.add("renew", a.cluster)
		return nil, errClusterThrottled
	}
	csr, err := ca.ParseCSR(req.GetCsr())
	if err != nil {
		s.cfg.Metrics.issued.WithLabelValues("renew", "failure").Inc()
		s.record(audit.Event{Type: audit.CertDeny, Result: audit.ResultFailure, Cluster: a.cluster, Peer: a.peer, Reason: "bad_csr"})
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return s.issue(ctx, "renew", a.cluster, a.registration, a.peer, csr, "")
}

// issue signs a certificate for cluster's agent, bound to registration.
func (s *Server) issue(ctx context.Context, op, cluster, registration, peerAddr string, csr *x509.CertificateRequest, version string) (*relaypb.CertificateResponse, error) {
	id, err := identity.AgentID(s.cfg.TrustDomain, cluster)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// The registration may have ended while the request was on its way.
	if reg, ok := s.cfg.Registry.Lookup(cluster); !ok || reg.UID != registration {
		s.cfg.Metrics.issued.WithLabelValues(op, "failure").Inc()
		s.record(audit.Event{Type: audit.CertDeny, Result: audit.ResultFailure, Cluster: cluster, Peer: peerAddr, Reason: "registration ended", Details: map[string]string{"operation": op}})
		return nil, status.Error(codes.PermissionDenied, "cluster is not registered")
	}
	if n := len(csr.DNSNames) + len(csr.IPAddresses) + len(csr.URIs) + len(csr.EmailAddresses); n > 0 {
		s.log.Debug("ignoring names requested in CSR; the server decides the identity", "cluster", cluster, "requested_names", n)
	}
	issued, err := s.cfg.Issuer.IssueAgentFor(ctx, csr, id, registration)
	if err != nil {
		s.cfg.Metrics.issued.WithLabelValues(op, "failure").Inc()
		s.log.Error("agent certificate issuance failed", "cluster", cluster, "operation", op, "error", err)
		s.record(audit.Event{Type: audit.CertDeny, Result: audit.ResultFailure, Cluster: cluster, Peer: peerAddr, Reason: "issuance failed", Details: map[string]string{"operation": op}})
		return nil, status.Error(codes.Internal, "certificate issuance failed")
	}
	cert := issued.Certificate
	serial := fmt.Sprintf("%x", cert.SerialNumber)
	typ := audit.CertIssue
	if op == "renew" {
		typ = audit.CertRenew
	}
	if !s.record(audit.Event{Type: typ, Result: audit.ResultSuccess, Cluster: cluster, Subject: id.String(), Serial: serial, Peer: peerAddr,
		Details: map[string]string{"not_after": cert.NotAfter.UTC().Format(time.RFC3339), "registration": registration}}) {
		s.cfg.Metrics.issued.WithLabelValues(op, "failure").Inc()
		return nil, errAuditUnavailable
	}
	s.cfg.Metrics.issued.WithLabelValues(op, "success").Inc()
	s.cfg.Metrics.certExpiry.WithLabelValues(cluster).Set(float64(cert.NotAfter.Unix()))
	// Routine: the audit log has the record and relaymesh_ca_issued_certificates_total
	// counts it; at info level a fleet renewing would flood the log.
	s.log.Debug("agent certificate issued", "cluster", cluster, "operation", op, "spiffe_id", id.String(), "serial", serial, "not_after", cert.NotAfter)
	if s.cfg.Status != nil {
		if b, ok := s.cfg.Status.(BootstrapSink); ok && op == "bootstrap" {
			b.CertificateBootstrapped(cluster, cert, version)
		} else {
			s.cfg.Status.CertificateIssued(cluster, cert, version)
		}
	}
	return &relaypb.CertificateResponse{
		CertificateChain: issued.ChainPEM(),
		TrustBundle:      issued.RootsPEM(),
		SpiffeId:         id.String(),
		NotAfterUnix:     cert.NotAfter.Unix(),
	}, nil
}

// helloTimeout bounds the wait for a session's first message.
const helloTimeout = 10 * time.Second

// Connect implements relaypb.RelayServer: one session per agent, ended by
// the agent, by Stop, or by deregistration of its cluster. All sends happen
// on the handler's goroutine; a reader goroutine only forwards messages.
func (s *Server) Connect(stream relaypb.Relay_ConnectServer) error {
	a, ctx, end, err := s.startSession(stream.Context())
	if err != nil {
		return err
	}
	defer end()

	msgs := make(chan *relaypb.AgentMessage)
	recvErr := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	ended := func() error {
		if errors.Is(context.Cause(ctx), errRevoked) {
			s.log.Info("agent session ended: cluster deregistered", "cluster", a.cluster)
			return status.Error(codes.PermissionDenied, "cluster deregistered")
		}
		if errors.Is(context.Cause(ctx), errIsolated) {
			return unavailableIsolated
		}
		return ctx.Err()
	}

	var hello *relaypb.Hello
	select {
	case <-ctx.Done():
		return ended()
	case err := <-recvErr:
		return err
	case <-time.After(helloTimeout):
		return status.Error(codes.DeadlineExceeded, "no Hello within "+helloTimeout.String())
	case first := <-msgs:
		if first.GetHello() == nil {
			return status.Error(codes.InvalidArgument, "the first message of a session must be Hello")
		}
		hello = first.GetHello()
		// Counted before the Welcome: an agent holding one is in the gauge.
		s.cfg.Metrics.sessions.WithLabelValues("1").Inc()
		defer s.cfg.Metrics.sessions.WithLabelValues("1").Dec()
		if err := stream.Send(&relaypb.ServerMessage{Msg: &relaypb.ServerMessage_Welcome{Welcome: &relaypb.Welcome{
			Cluster: a.cluster, SpiffeId: a.id.String(), CertificateNotAfterUnix: a.cert.NotAfter.Unix(),
		}}}); err != nil {
			return err
		}
		s.log.Info("agent session opened", "cluster", a.cluster, "peer", a.peer, "agent_version", first.GetHello().GetAgentVersion())
		s.agentClock(a.cluster, first.GetHello())
	}
	bundles, err := s.newBundleDelivery(a.cluster, hello)
	if err != nil {
		return err
	}
	sendBundle := func(b *relaypb.TrustBundle) error {
		return stream.Send(&relaypb.ServerMessage{Msg: &relaypb.ServerMessage_TrustBundle{TrustBundle: b}})
	}
	if err := bundles.offer(sendBundle); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ended()
		case err := <-recvErr:
			s.log.Info("agent session closed", "cluster", a.cluster, "reason", err)
			return nil
		case msg := <-msgs:
			if ping := msg.GetPing(); ping != nil {
				if err := stream.Send(&relaypb.ServerMessage{Msg: &relaypb.ServerMessage_Pong{Pong: &relaypb.Pong{Nonce: ping.GetNonce()}}}); err != nil {
					return err
				}
				// A changed bundle goes out at the next ping.
				if err := bundles.offer(sendBundle); err != nil {
					return err
				}
			}
			if ack := msg.GetTrustBundleAck(); ack != nil {
				if err := bundles.acknowledged(ack); err != nil {
					return err
				}
			}
		}
	}
}

// startSession registers the session (Connect's or Session's) of the
// agent authenticated on a stream, so that deregistration or isolation
// ends ctx; end undoes it.
func (s *Server) startSession(streamCtx context.Context) (a *agent, ctx context.Context, end func(), err error) {
	a, ok := agentFrom(streamCtx)
	if !ok {
		return nil, nil, nil, errUnauthenticated
	}
	ctx, cancel := context.WithCancelCause(streamCtx)
	sess, err := s.addSession(a, cancel, true)
	if err != nil {
		cancel(nil)
		return nil, nil, nil, err
	}
	return a, ctx, func() { s.removeSession(a.cluster, sess); cancel(nil) }, nil
}

// addSession records a session of a's cluster, unless its registration
// ended (or changed) since a was authenticated. Checked under the same lock
// revoke takes, so no session of a revoked registration survives.
func (s *Server) addSession(a *agent, cancel context.CancelCauseFunc, counted bool) (*session, error) {
	s.mu.Lock()
	if reg, ok := s.cfg.Registry.Lookup(a.cluster); !ok || reg.UID != a.registration {
		s.mu.Unlock()
		return nil, status.Error(codes.PermissionDenied, "cluster is not registered")
	}
	if len(s.sessions[a.cluster]) >= s.cfg.Clusters.MaxSessions {
		s.mu.Unlock()
		s.cfg.Metrics.refused.WithLabelValues("cluster_sessions").Inc()
		s.throttle.add("sessions", a.cluster)
		return nil, status.Errorf(codes.ResourceExhausted, "this cluster holds %d streams already, the most it may", s.cfg.Clusters.MaxSessions)
	}
	set := s.sessions[a.cluster]
	if set == nil {
		set = map[*session]struct{}{}
		s.sessions[a.cluster] = set
	}
	sess := &session{cancel: cancel, counted: counted}
	set[sess] = struct{}{}
	first := counted && s.countedLocked(a.cluster) == 1
	s.mu.Unlock()
	if counted {
		s.cfg.Metrics.connected.Inc()
	}
	if first && s.cfg.Status != nil {
		if p, ok := s.cfg.Status.(PresentedSink); ok && a.cert != nil {
			p.CertificatePresented(a.cluster, a.cert)
		}
		s.cfg.Status.SessionChanged(a.cluster, true)
	}
	return sess, nil
}

func (s *Server) countedLocked(cluster string) int {
	n := 0
	for sess := range s.sessions[cluster] {
		if sess.counted {
			n++
		}
	}
	return n
}

func (s *Server) removeSession(cluster string, sess *session) {
	s.mu.Lock()
	set := s.sessions[cluster]
	_, had := set[sess]
	delete(set, sess)
	last := had && sess.counted && s.countedLocked(cluster) == 0
	if len(set) == 0 {
		delete(s.sessions, cluster)
	}
	s.mu.Unlock()
	if had && sess.counted {
		s.cfg.Metrics.connected.Dec()
	}
	if last && s.cfg.Status != nil {
		s.cfg.Status.SessionChanged(cluster, false)
	}
}

// revoke ends every session of cluster; called by the registry.
func (s *Server) revoke(cluster string) {
	s.mu.Lock()
	var ended int
	for sess := range s.sessions[cluster] {
		sess.cancel(errRevoked)
		ended++
	}
	s.mu.Unlock()
	s.renews.forget(cluster)
	s.cfg.Metrics.certExpiry.DeleteLabelValues(cluster)
	s.cfg.Metrics.snapshotObjects.DeleteLabelValues(cluster)
	s.cfg.Metrics.snapshotAccepted.DeleteLabelValues(cluster)
	s.log.Info("cluster revoked", "cluster", cluster, "sessions_ended", ended)
	s.record(audit.Event{Type: audit.ClusterRevoke, Result: audit.ResultSuccess, Cluster: cluster, Details: map[string]string{"sessions_ended": fmt.Sprint(ended)}})
}

// Sessions returns how many relay sessions (Connect) cluster holds.
func (s *Server) Sessions(cluster string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.countedLocked(cluster)
}
