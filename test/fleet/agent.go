package fleet

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/internal/dialer"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"
	"go.step.sm/crypto/x509util"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The real agent's timings (identity.Manager and agent.Session defaults).
const (
	defaultPingInterval = 10 * time.Second
	defaultCallTimeout  = 15 * time.Second
	defaultKeepOutputs  = 16
)

var (
	defaultBootstrapRetry = backoff.Policy{Min: time.Second, Max: time.Minute}
	defaultSessionRetry   = backoff.Policy{Min: time.Second, Max: 30 * time.Second}
)

// AgentConfig configures one simulated agent.
type AgentConfig struct {
	// Cluster is the registered cluster the agent speaks for. Required.
	Cluster string
	// Token is its bootstrap token (a secret: never logged). Required.
	Token string
	// Source is the local address the agent's connections come from; the
	// zero value lets the kernel choose.
	Source netip.Addr
	// Servers are relay addresses (host:port). The agent starts with
	// Servers[FirstServer % len] and moves to the next one whenever a call
	// or session fails (agent.Session's FirstReplica). Required.
	Servers     []string
	FirstServer int
	// ServerName the server certificate must carry; default the host of
	// the first server's address, as the real agent does with one address.
	ServerName string
	// Roots are the pinned relay roots. Required.
	Roots *x509.CertPool
	// Snapshot is pushed at the start of every session (in parts, as the
	// real agent pushes); nil opens no push stream for the agent's life.
	// SetSnapshot replaces it.
	Snapshot *relaypb.Snapshot
	// Version is reported in Bootstrap and Hello.
	Version string
	// PingInterval (default 10s), CallTimeout of Bootstrap and Renew
	// (default 15s), BootstrapRetry (default 1s..1m) and SessionRetry
	// (default 1s..30s) are the real agent's.
	PingInterval                 time.Duration
	CallTimeout                  time.Duration
	BootstrapRetry, SessionRetry backoff.Policy
	// KeepOutputs is how many received output sets State remembers
	// (without their objects); default 16.
	KeepOutputs int
	// Hooks are called on the agent's goroutines; they must not block.
	Hooks Hooks
	// Credentials, when set, hands the certificate Bootstrap gave to the
	// real agent's credential manager (identity.Manager over an in-memory
	// identity.AgentSecrets holding the pinned roots and that certificate,
	// no token), as the agent process finds it after a restart: the
	// manager renews it at identity.RenewalTime over a new connection, the
	// session presents its newest certificate (Manager.ClientTLS), relay
	// trust bundles go through Manager.ApplyTrustBundle (stored beside the
	// roots pinned before, pinned for new connections) and the session
	// acknowledges them, and a refused certificate goes to
	// Manager.Refused, after which it needs a token (counted in
	// AgentState.TokenAsks). Unset, the agent keeps its certificate itself
	// and renews only when told (Renew).
	Credentials *CredentialsConfig
}

// CredentialsConfig configures an agent's credential manager.
type CredentialsConfig struct {
	// RootsPEM are the pinned relay roots as relay-root-tls-secret ca.crt
	// holds them (the same roots as AgentConfig.Roots). Required.
	RootsPEM []byte
	// Retry is the manager's backoff after a failed step; default its own
	// (1s..1m).
	Retry backoff.Policy
}

// Hooks observe an agent. Every field is optional.
type Hooks struct {
	// Certified: the agent holds a certificate from Bootstrap.
	Certified func(a *Agent, at time.Time)
	// SessionOpened: the server answered Hello with Welcome.
	SessionOpened func(a *Agent, server string, at time.Time)
	// SessionEnded: a session ended (err says why).
	SessionEnded func(a *Agent, server string, err error)
	// PushAcked: the server answered a snapshot.
	PushAcked func(a *Agent, r PushResult)
	// Output: an output set arrived (Set holds it, during the call only).
	Output func(a *Agent, o Output)
}

// Timeline is when an agent reached each step, the first time.
type Timeline struct {
	// Started is when Run began: the agent has its token.
	Started time.Time
	// Certified is when Bootstrap gave it a certificate it accepted.
	Certified time.Time
	// Session is when its first session was answered with Welcome.
	Session time.Time
	// Pushed is when the server first accepted its snapshot.
	Pushed time.Time
	// FirstOutput is when the first output set arrived.
	FirstOutput time.Time
}

// Output is one output set an agent received (the session applies and
// acknowledges it unless it is older than the one applied).
type Output struct {
	Version uint64
	// At is when it arrived; Server is where from.
	At     time.Time
	Server string
	// Objects is how many objects it holds.
	Objects int
	// Resent: the version the agent acknowledged last (after a reconnect);
	// Regressed: older than that, which must never happen.
	Resent, Regressed bool
	// Set is the set itself, given to the Output hook only.
	Set *relaypb.OutputSet
}

// PushResult is the server's answer to one snapshot.
type PushResult struct {
	Hash     string
	Accepted bool
	Error    string
	SentAt   time.Time
	AckedAt  time.Time
}

// AgentState is what an agent knows about itself.
type AgentState struct {
	Cluster  string
	Timeline Timeline
	// Connected: a session is open, to Server.
	Connected bool
	Server    string
	// Serial of the current certificate (hex).
	Serial string
	// BootstrapAttempts counts Bootstrap calls; Sessions the sessions
	// opened; Reconnects the sessions that ended while the agent ran.
	BootstrapAttempts, Sessions, Reconnects int
	// Acked is the output version last acknowledged.
	Acked uint64
	// Outputs are the last KeepOutputs sets received, oldest first.
	Outputs []Output
	// Regressions counts sets older than the one acknowledged before.
	Regressions int
	// LastPush is the server's last answer to a snapshot; PushError why a
	// snapshot was not sent.
	LastPush  PushResult
	PushError string
	// Refused: the server refused the agent's certificate (the cluster was
	// deregistered); the agent has stopped. LastError is the latest failure.
	// PushError is the session's (agent.SessionState) too.
	Refused   error
	LastError error
	// Done: Run returned.
	Done bool

	// With Credentials only. Renewals counts the manager's renewals;
	// TokenAsks how often it asked for a bootstrap token (it does only
	// when it holds no usable certificate: one refused or expired); Pinned
	// is the fingerprint (ca.TrustBundleFingerprint) of the roots it pins
	// now; BundlesPinned and BundlesRefused count the trust bundles stored
	// and refused (BundlesStale those refused because the session predates
	// them, after which the session reconnects); CredentialLog counts the
	// manager's WARN and ERROR log lines by message and error;
	// LastCredentialError is its latest error (a success clears it).
	Renewals                                    int
	TokenAsks                                   int
	Pinned                                      string
	BundlesPinned, BundlesRefused, BundlesStale int
	CredentialLog                               map[string]int
	LastCredentialError                         string
}

// ErrNoSession is returned by Renew while no session is open.
var ErrNoSession = errors.New("fleet agent: no open session")

// Agent is one simulated relay agent.
type Agent struct {
	cfg  AgentConfig
	snap chan struct{}

	mu     sync.Mutex
	state  AgentState
	server int
	cert   *tls.Certificate
	// bootKey and bootCSR are kept across Bootstrap attempts until one
	// succeeds, as the real agent keeps them (a server that spent the token
	// on an attempt whose answer was lost answers the same key again).
	bootKey  crypto.Signer
	bootCSR  []byte
	snapshot *relaypb.Snapshot
	// conn is the open session's connection (nil between sessions);
	// session the real agent's session loop, once bootstrapped.
	conn    grpc.ClientConnInterface
	session *agent.Session
	sentAt  map[string]time.Time     // snapshot hash → when it went out
	applied map[string]appliedObject // by apiVersion/kind/namespace/name
	raw     map[*trackedConn]struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	// mgr keeps the credential after Bootstrap when Credentials is set;
	// secrets is its store, mgrLog what it logged.
	mgr     *identity.Manager
	secrets *agentSecrets
	mgrLog  *countingHandler
}

// NewAgent checks cfg and returns an agent; call Start.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	var errs []error
	if err := identity.ValidateClusterName(cfg.Cluster); err != nil {
		errs = append(errs, fmt.Errorf("cluster: %w", err))
	}
	if cfg.Token == "" {
		errs = append(errs, errors.New("token: required"))
	}
	if len(cfg.Servers) == 0 {
		errs = append(errs, errors.New("servers: at least one is required"))
	}
	for i, s := range cfg.Servers {
		if _, _, err := net.SplitHostPort(s); err != nil {
			errs = append(errs, fmt.Errorf("servers[%d]: %q is not host:port", i, s))
		}
	}
	if cfg.Roots == nil {
		errs = append(errs, errors.New("roots: required"))
	}
	if cfg.Credentials != nil {
		if _, err := ca.ParseTrustBundle(cfg.Credentials.RootsPEM); err != nil {
			errs = append(errs, fmt.Errorf("credentials.rootsPEM: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("fleet agent config: %w", err)
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = defaultPingInterval
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = defaultCallTimeout
	}
	if cfg.BootstrapRetry.Min == 0 {
		cfg.BootstrapRetry = defaultBootstrapRetry
	}
	if cfg.SessionRetry.Min == 0 {
		cfg.SessionRetry = defaultSessionRetry
	}
	if cfg.KeepOutputs == 0 {
		cfg.KeepOutputs = defaultKeepOutputs
	}
	if cfg.Version == "" {
		cfg.Version = "fleet"
	}
	a := &Agent{
		cfg: cfg, snap: make(chan struct{}, 1), snapshot: cfg.Snapshot,
		state:   AgentState{Cluster: cfg.Cluster},
		server:  cfg.FirstServer % len(cfg.Servers),
		applied: map[string]appliedObject{}, raw: map[*trackedConn]struct{}{}, sentAt: map[string]time.Time{},
	}
	if cfg.Credentials != nil {
		a.secrets = &agentSecrets{MemAgentSecrets: identitytest.NewMemAgentSecrets(cfg.Credentials.RootsPEM, "")}
		a.mgrLog = &countingHandler{c: &logCounts{byMsg: map[string]int{}}}
	}
	return a, nil
}

// Cluster is the agent's cluster.
func (a *Agent) Cluster() string { return a.cfg.Cluster }

// Start runs the agent on its own goroutine until Stop or ctx ends.
func (a *Agent) Start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	if a.done != nil {
		a.mu.Unlock()
		cancel()
		return
	}
	a.cancel, a.done = cancel, make(chan struct{})
	a.state.Timeline.Started = time.Now()
	a.mu.Unlock()
	go func() {
		defer close(a.done)
		err := a.run(ctx)
		a.mu.Lock()
		a.state.Done = true
		if err != nil && !errors.Is(err, context.Canceled) {
			a.state.LastError = err
		}
		a.mu.Unlock()
	}()
}

// Stop ends the agent and waits for it: its connections close the way a
// process that exits closes them.
func (a *Agent) Stop() {
	a.mu.Lock()
	cancel, done := a.cancel, a.done
	a.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// Kill ends the agent as a crash would: its TCP connections are reset
// (no HTTP/2 or TLS goodbye), then it stops.
func (a *Agent) Kill() {
	a.Drop()
	a.Stop()
}

// Drop resets the agent's open connections (as a cut network would) and
// lets it reconnect, to the next server of its list. It returns how many
// connections it reset.
func (a *Agent) Drop() int {
	a.mu.Lock()
	conns := make([]*trackedConn, 0, len(a.raw))
	for c := range a.raw {
		conns = append(conns, c)
	}
	a.mu.Unlock()
	for _, c := range conns {
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	return len(conns)
}

// Done is closed when the agent stopped.
func (a *Agent) Done() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.done
}

// State returns a copy of the agent's state.
func (a *Agent) State() AgentState {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.state
	st.Outputs = append([]Output(nil), a.state.Outputs...)
	if a.session != nil {
		st.PushError = a.session.State().PushError
	}
	if a.mgr != nil {
		ms := a.mgr.Status()
		st.Serial, st.Renewals, st.LastCredentialError = ms.Serial, ms.Renewals, ms.LastError
	}
	if a.secrets != nil {
		st.TokenAsks = int(a.secrets.tokenAsks.Load())
		if roots, err := a.secrets.Roots(context.Background()); err == nil {
			if certs, err := ca.ParseTrustBundle(roots); err == nil {
				st.Pinned = ca.TrustBundleFingerprint(certs)
			}
		}
		st.CredentialLog = a.mgrLog.c.snapshot()
	}
	return st
}

// SetSnapshot replaces the snapshot; an open session pushes it at once.
func (a *Agent) SetSnapshot(s *relaypb.Snapshot) {
	a.mu.Lock()
	a.snapshot = s
	a.mu.Unlock()
	select {
	case a.snap <- struct{}{}:
	default:
	}
}

func (a *Agent) currentSnapshot() *relaypb.Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.snapshot
}

// snapshots is the agent's agent.SnapshotSource.
type snapshots struct{ a *Agent }

func (s snapshots) Snapshot() (*relaypb.Snapshot, error) { return s.a.currentSnapshot(), nil }
func (s snapshots) Changes() <-chan struct{}             { return s.a.snap }

func (a *Agent) serverAddr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg.Servers[a.server]
}

func (a *Agent) nextServer() {
	a.mu.Lock()
	a.server = (a.server + 1) % len(a.cfg.Servers)
	a.mu.Unlock()
}

func (a *Agent) serverName() string {
	if a.cfg.ServerName != "" {
		return a.cfg.ServerName
	}
	host, _, _ := net.SplitHostPort(a.cfg.Servers[0])
	return host
}

func (a *Agent) fail(err error) {
	a.mu.Lock()
	a.state.LastError = err
	a.mu.Unlock()
}

// run bootstraps, then holds a session with the real agent's loop
// (agent.Session) until ctx ends or the server refuses the agent's
// certificate.
func (a *Agent) run(ctx context.Context) error {
	if err := a.bootstrap(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tlsConfig := a.clientTLS
	var bundles agent.TrustBundleStore
	if a.cfg.Credentials != nil {
		m, done, err := a.startManager(ctx)
		if err != nil {
			return err
		}
		defer func() { cancel(); <-done }()
		tlsConfig, bundles = m.ClientTLS, trustBundles{a}
	}
	cfg := agent.SessionConfig{
		ServerAddress: strings.Join(a.cfg.Servers, ","), Version: a.cfg.Version,
		PingInterval: a.cfg.PingInterval, Retry: a.cfg.SessionRetry,
		TLS: tlsConfig, TrustBundles: bundles, Cluster: a.cfg.Cluster,
		Dialer:       a.dialTCP,
		FirstReplica: func(n int) int { return a.cfg.FirstServer % n },
		Applier:      applier{a},
		OnRefused: func(err error) {
			// The real agent drops the certificate and needs a new token;
			// its used one is gone. It stops talking to the server.
			a.mu.Lock()
			a.state.Refused = err
			a.cert = nil
			m := a.mgr
			a.mu.Unlock()
			if m != nil {
				m.Refused(err)
			}
			cancel()
		},
		Hooks: agent.SessionHooks{Opened: a.opened, Ended: a.ended, Sent: a.sent, PushAnswered: a.pushAnswered, Received: a.received, Acked: a.acked},
	}
	if a.currentSnapshot() != nil {
		cfg.Snapshots = snapshots{a}
	}
	sess, err := agent.NewSession(cfg)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.session = sess
	a.mu.Unlock()
	err = sess.Run(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state.Refused != nil {
		return a.state.Refused
	}
	return err
}

// clientTLS is the session's mTLS configuration: the pinned roots and the
// agent's newest certificate.
func (a *Agent) clientTLS() (*tls.Config, error) {
	return &tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: a.cfg.Roots, ServerName: a.serverName(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.cert == nil {
				return nil, errors.New("no client certificate")
			}
			return a.cert, nil
		},
	}, nil
}

func (a *Agent) opened(server string, conn grpc.ClientConnInterface, _ *relaypb.Welcome) {
	now := time.Now()
	a.mu.Lock()
	a.conn = conn
	a.state.Connected, a.state.Server = true, server
	a.state.Sessions++
	if a.state.Timeline.Session.IsZero() {
		a.state.Timeline.Session = now
	}
	a.mu.Unlock()
	if h := a.cfg.Hooks.SessionOpened; h != nil {
		h(a, server, now)
	}
}

func (a *Agent) ended(server string, err error) {
	a.mu.Lock()
	a.conn = nil
	a.state.Connected = false
	if err != nil && !errors.Is(err, context.Canceled) {
		a.state.LastError = err
	}
	if c := status.Code(err); c != codes.PermissionDenied && c != codes.Unauthenticated && !errors.Is(err, context.Canceled) {
		a.state.Reconnects++
	}
	a.mu.Unlock()
	if h := a.cfg.Hooks.SessionEnded; h != nil {
		h(a, server, err)
	}
}

func (a *Agent) sent(hash string) {
	a.mu.Lock()
	a.sentAt[hash] = time.Now()
	a.mu.Unlock()
}

func (a *Agent) pushAnswered(ack *relaypb.PushAck) {
	now := time.Now()
	a.mu.Lock()
	r := PushResult{Hash: ack.GetHash(), Accepted: ack.GetAccepted(), Error: ack.GetError(), SentAt: a.sentAt[ack.GetHash()], AckedAt: now}
	delete(a.sentAt, ack.GetHash())
	a.state.LastPush = r
	if r.Accepted && a.state.Timeline.Pushed.IsZero() {
		a.state.Timeline.Pushed = now
	}
	a.mu.Unlock()
	if h := a.cfg.Hooks.PushAcked; h != nil {
		h(a, r)
	}
}

// received records an output set on arrival, counting one older than the
// version acknowledged before (the session does not apply it, but the
// server must never send it).
func (a *Agent) received(set *relaypb.OutputSet) {
	at := time.Now()
	a.mu.Lock()
	o := Output{Version: set.GetVersion(), At: at, Server: a.state.Server, Objects: len(set.GetObjects()),
		Resent: set.GetVersion() == a.state.Acked, Regressed: set.GetVersion() < a.state.Acked}
	if o.Regressed {
		a.state.Regressions++
	}
	if a.state.Timeline.FirstOutput.IsZero() {
		a.state.Timeline.FirstOutput = at
	}
	a.state.Outputs = append(a.state.Outputs, o)
	if n := len(a.state.Outputs) - a.cfg.KeepOutputs; n > 0 {
		a.state.Outputs = append(a.state.Outputs[:0:0], a.state.Outputs[n:]...)
	}
	a.mu.Unlock()
	if h := a.cfg.Hooks.Output; h != nil {
		o.Set = set
		h(a, o)
	}
}

func (a *Agent) acked(version uint64, _ []*relaypb.ObjectResult) {
	a.mu.Lock()
	a.state.Acked = version
	a.mu.Unlock()
}

// bootstrap trades the token for a certificate, retrying as the real agent
// does.
func (a *Agent) bootstrap(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		err := a.bootstrapOnce(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.fail(err)
		a.nextServer()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(a.cfg.BootstrapRetry.Delay(attempt)):
		}
	}
}

func (a *Agent) bootstrapOnce(ctx context.Context) error {
	a.mu.Lock()
	a.state.BootstrapAttempts++
	a.mu.Unlock()
	if a.bootKey == nil {
		var err error
		if a.bootKey, a.bootCSR, err = NewCSR(); err != nil {
			return err
		}
	}
	key, csr := a.bootKey, a.bootCSR
	addr := a.serverAddr()
	conn, err := a.dial(addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: a.cfg.Roots, ServerName: a.serverName()})
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, a.cfg.CallTimeout)
	defer cancel()
	resp, err := relaypb.NewIdentityClient(conn).Bootstrap(cctx, &relaypb.BootstrapRequest{
		Cluster: a.cfg.Cluster, Token: a.cfg.Token, Csr: csr, AgentVersion: a.cfg.Version})
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	cert, err := a.accept(resp, key)
	if err != nil {
		return err
	}
	a.bootKey, a.bootCSR = nil, nil
	if a.secrets != nil {
		// What the agent process stores after Bootstrap, for its manager.
		block, err := pemutil.Serialize(key)
		if err != nil {
			return err
		}
		if err := a.secrets.SaveCredential(ctx, resp.GetCertificateChain(), pem.EncodeToMemory(block), a.cfg.Credentials.RootsPEM); err != nil {
			return err
		}
	}
	now := time.Now()
	a.mu.Lock()
	a.cert = cert
	a.state.Serial = fmt.Sprintf("%x", cert.Leaf.SerialNumber)
	a.state.Timeline.Certified = now
	a.mu.Unlock()
	if h := a.cfg.Hooks.Certified; h != nil {
		h(a, now)
	}
	return nil
}

// Renew obtains a new certificate over the open session's connection and
// uses it for new connections, as the credential manager does when a
// certificate reaches 2/3 of its life.
func (a *Agent) Renew(ctx context.Context) error {
	key, csr, err := NewCSR()
	if err != nil {
		return err
	}
	resp, err := a.RenewCSR(ctx, csr)
	if err != nil {
		return err
	}
	cert, err := a.accept(resp, key)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.cert = cert
	a.state.Serial = fmt.Sprintf("%x", cert.Leaf.SerialNumber)
	a.mu.Unlock()
	return nil
}

// RenewCSR calls Identity.Renew with csr over the open session's
// connection and returns the answer unchecked: issuance benchmarks send
// requests made beforehand (CheckCertificate checks an answer).
func (a *Agent) RenewCSR(ctx context.Context, csr []byte) (*relaypb.CertificateResponse, error) {
	a.mu.Lock()
	conn := a.conn
	a.mu.Unlock()
	if conn == nil {
		return nil, ErrNoSession
	}
	cctx, cancel := context.WithTimeout(ctx, a.cfg.CallTimeout)
	defer cancel()
	return relaypb.NewIdentityClient(conn).Renew(cctx, &relaypb.RenewRequest{Csr: csr})
}

// accept checks the server's answer against the key the agent holds and
// the roots it pins, as identity.Manager does.
func (a *Agent) accept(resp *relaypb.CertificateResponse, key crypto.Signer) (*tls.Certificate, error) {
	block, err := pemutil.Serialize(key)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(resp.GetCertificateChain(), pem.EncodeToMemory(block))
	if err != nil {
		return nil, fmt.Errorf("server answered with an unusable certificate: %w", err)
	}
	if err := CheckCertificate(pair.Certificate, a.cfg.Roots, a.cfg.Cluster, time.Now()); err != nil {
		return nil, fmt.Errorf("server answered with an unusable certificate: %w", err)
	}
	return &pair, nil
}

// CheckCertificate checks an agent certificate chain (DER, leaf first): it
// verifies to roots for clientAuth at now and names exactly cluster's agent.
func CheckCertificate(chain [][]byte, roots *x509.CertPool, cluster string, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("no certificate")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, der := range chain[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("does not chain to the pinned relay root: %w", err)
	}
	if len(leaf.URIs) != 1 {
		return errors.New("certificate does not carry exactly one SPIFFE ID")
	}
	id, err := spiffeid.FromURI(leaf.URIs[0])
	if err != nil {
		return err
	}
	if got, err := identity.ClusterFromID(id.TrustDomain(), id); err != nil || got != cluster {
		return fmt.Errorf("certificate names %s, not the agent of %s", id, cluster)
	}
	return nil
}

// NewCSR makes a fresh P-256 key and a PEM certificate request that names
// nothing, as the real agent does: the server decides the identity.
func NewCSR() (crypto.Signer, []byte, error) {
	signer, err := keyutil.GenerateSigner("EC", "P-256", 0)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	csr, err := x509util.CreateCertificateRequest("", nil, signer)
	if err != nil {
		return nil, nil, fmt.Errorf("create CSR: %w", err)
	}
	return signer, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr.Raw}), nil
}

// dial makes a gRPC client (for Bootstrap) as the real agent's credential
// manager does (internal/dialer: its connect timeout and backoff), whose
// connections come from the agent's source address and are tracked for
// Drop.
func (a *Agent) dial(addr string, tlsCfg *tls.Config) (*grpc.ClientConn, error) {
	return dialer.Dial(addr, tlsCfg, grpc.WithContextDialer(a.dialTCP))
}

// dialTCP opens a connection from the agent's source address, tracked for
// Drop.
func (a *Agent) dialTCP(ctx context.Context, target string) (net.Conn, error) {
	d := net.Dialer{}
	if a.cfg.Source.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: a.cfg.Source.AsSlice()}
	}
	c, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, a: a}
	a.mu.Lock()
	a.raw[tc] = struct{}{}
	a.mu.Unlock()
	return tc, nil
}

// trackedConn forgets itself when closed.
type trackedConn struct {
	net.Conn
	a    *Agent
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.a.mu.Lock()
		delete(c.a.raw, c)
		c.a.mu.Unlock()
	})
	return c.Conn.Close()
}

// manifestHead is what an agent reads of an output object to report on it.
type manifestHead struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// appliedObject is what the agent remembers of an object it applied.
type appliedObject struct {
	head   manifestHead
	digest uint64
}

// applier is the agent's agent.OutputApplier.
type applier struct{ a *Agent }

func (p applier) Apply(_ context.Context, set *relaypb.OutputSet) ([]*relaypb.ObjectResult, error) {
	return p.a.apply(set), nil
}

// apply stands in for server-side apply: it reports each object applied
// (new or changed), unchanged, or pruned (gone from the set), as the real
// applier's results do.
func (a *Agent) apply(set *relaypb.OutputSet) []*relaypb.ObjectResult {
	results := make([]*relaypb.ObjectResult, 0, len(set.GetObjects()))
	next := make(map[string]appliedObject, len(set.GetObjects()))
	a.mu.Lock()
	prev := a.applied
	a.mu.Unlock()
	for _, o := range set.GetObjects() {
		var h manifestHead
		r := &relaypb.ObjectResult{Outcome: "applied"}
		if err := json.Unmarshal(o.GetManifest(), &h); err != nil {
			r.Outcome, r.Error = "error", "manifest is not JSON"
			results = append(results, r)
			continue
		}
		r.ApiVersion, r.Kind, r.Namespace, r.Name = h.APIVersion, h.Kind, h.Metadata.Namespace, h.Metadata.Name
		key := h.APIVersion + "/" + h.Kind + "/" + h.Metadata.Namespace + "/" + h.Metadata.Name
		d := fnv.New64a()
		d.Write(o.GetManifest())
		sum := d.Sum64()
		if old, ok := prev[key]; ok && old.digest == sum {
			r.Outcome = "unchanged"
		}
		next[key] = appliedObject{head: h, digest: sum}
		results = append(results, r)
	}
	for key, old := range prev {
		if _, ok := next[key]; !ok {
			h := old.head
			results = append(results, &relaypb.ObjectResult{Outcome: "pruned", ApiVersion: h.APIVersion, Kind: h.Kind, Namespace: h.Metadata.Namespace, Name: h.Metadata.Name})
		}
	}
	a.mu.Lock()
	a.applied = next
	a.mu.Unlock()
	return results
}

// startManager starts the agent's credential manager on the certificate
// Bootstrap stored and waits until it loaded it; done is closed when the
// manager stopped (with ctx).
func (a *Agent) startManager(ctx context.Context) (*identity.Manager, <-chan struct{}, error) {
	m, err := identity.NewManager(identity.ManagerConfig{
		Cluster: a.cfg.Cluster, ServerAddress: strings.Join(a.cfg.Servers, ","), ServerName: a.serverName(),
		Secrets: a.secrets, Version: a.cfg.Version, Logger: slog.New(a.mgrLog), Retry: a.cfg.Credentials.Retry, CallTimeout: a.cfg.CallTimeout,
	})
	if err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	select {
	case <-m.Ready():
	case <-ctx.Done():
		<-done
		return nil, nil, ctx.Err()
	}
	a.mu.Lock()
	a.mgr = m
	a.mu.Unlock()
	return m, done, nil
}

// agentSecrets is the credential manager's store: in memory, with no
// token after Bootstrap, counting how often the manager asks for one (it
// does only when it holds no usable certificate).
type agentSecrets struct {
	*identitytest.MemAgentSecrets
	tokenAsks atomic.Int64
}

func (s *agentSecrets) Token(ctx context.Context) (string, error) {
	s.tokenAsks.Add(1)
	return s.MemAgentSecrets.Token(ctx)
}

// trustBundles is the session's agent.TrustBundleStore: the credential
// manager's ApplyTrustBundle, counted, and its PinnedRootsFingerprint
// (agent.PinnedRootsReporter, which Hello reports).
type trustBundles struct{ a *Agent }

var _ agent.PinnedRootsReporter = trustBundles{}

func (t trustBundles) PinnedRootsFingerprint() string {
	t.a.mu.Lock()
	m := t.a.mgr
	t.a.mu.Unlock()
	if m == nil {
		return ""
	}
	return m.PinnedRootsFingerprint()
}

func (t trustBundles) ApplyTrustBundle(ctx context.Context, rootsPEM []byte, fingerprint string, serverChain []*x509.Certificate) error {
	t.a.mu.Lock()
	m := t.a.mgr
	t.a.mu.Unlock()
	err := m.ApplyTrustBundle(ctx, rootsPEM, fingerprint, serverChain)
	var stale interface{ NeedsNewSession() bool }
	t.a.mu.Lock()
	switch {
	case err == nil:
		t.a.state.BundlesPinned++
	case errors.As(err, &stale) && stale.NeedsNewSession():
		t.a.state.BundlesStale++
	default:
		t.a.state.BundlesRefused++
	}
	t.a.mu.Unlock()
	return err
}

// countingHandler is the credential manager's slog.Handler: it counts WARN
// and ERROR records by message and error (cut to 160 bytes; the manager
// never logs a secret) and drops the rest.
type countingHandler struct{ c *logCounts }

type logCounts struct {
	mu    sync.Mutex
	byMsg map[string]int
}

func (c *logCounts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.byMsg)
}

// maxLogKeys bounds the distinct keys countingHandler keeps; the rest
// are counted under their message alone.
const maxLogKeys = 32

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	key := r.Level.String() + " " + r.Message
	withErr := key
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			withErr = key + ": " + truncate(a.Value.String(), 160)
			return false
		}
		return true
	})
	h.c.mu.Lock()
	if _, ok := h.c.byMsg[withErr]; ok || len(h.c.byMsg) < maxLogKeys {
		key = withErr
	}
	h.c.byMsg[key]++
	h.c.mu.Unlock()
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
