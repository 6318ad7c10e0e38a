package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
)

// ConnectionLimits bound what a peer can hold open before and after it
// authenticates. The relay port splits connections at the TLS handshake:
// one that presents a certificate of the relay CA goes to the authenticated
// server (every service), one without a client certificate to the
// pre-authentication server, which serves Identity.Bootstrap only, reads at
// most MaxRecvBytes per message before decoding anything, and lives briefly.
type ConnectionLimits struct {
	// HandshakeTimeout bounds the TLS handshake; default 10s.
	HandshakeTimeout time.Duration
	// MaxConnections open at once, all peers; default 32,768.
	MaxConnections int
	// MaxConnectionsPerAddress open at once from one address (IPv6: /64);
	// default 256 (agents of many clusters may share a NAT).
	MaxConnectionsPerAddress int
	// MaxPreAuth connections open at once that have not authenticated
	// (handshaking, or without a client certificate); default 1,024.
	MaxPreAuth int
	// MaxPreAuthPerAddress: the same from one address; default 16.
	MaxPreAuthPerAddress int
	// PreAuthStreams is how many streams one unauthenticated connection may
	// open in its life (a bootstrap takes one); more closes it, which is
	// what a rapid-reset flood meets; default 8.
	PreAuthStreams int
	// PreAuthIdle and PreAuthAge close unauthenticated connections idle
	// for, or open longer than, this; defaults 15s and 1m.
	PreAuthIdle, PreAuthAge time.Duration
	// StreamsPerSecond and StreamBurst bound the streams an authenticated
	// connection opens (an agent opens a handful); beyond them the
	// connection is closed; defaults 50/s, burst 200.
	StreamsPerSecond float64
	StreamBurst      int
	// MaxConcurrentBootstraps bounds bootstraps being evaluated at once,
	// all peers; default 256. More wait up to HandshakeTimeout, then are
	// refused (ResourceExhausted).
	MaxConcurrentBootstraps int
}

// WithDefaults fills the zero fields of l with their defaults.
func (l ConnectionLimits) WithDefaults() ConnectionLimits {
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = 10 * time.Second
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defInt(&l.MaxConnections, 32768)
	defInt(&l.MaxConnectionsPerAddress, 256)
	defInt(&l.MaxPreAuth, 1024)
	defInt(&l.MaxPreAuthPerAddress, 16)
	defInt(&l.PreAuthStreams, 8)
	defInt(&l.StreamBurst, 200)
	defInt(&l.MaxConcurrentBootstraps, 256)
	if l.PreAuthIdle == 0 {
		l.PreAuthIdle = 15 * time.Second
	}
	if l.PreAuthAge == 0 {
		l.PreAuthAge = time.Minute
	}
	if l.StreamsPerSecond == 0 {
		l.StreamsPerSecond = 50
	}
	return l
}

// Validate reports every negative or out-of-range field.
func (l ConnectionLimits) Validate() error {
	var errs []error
	if l.HandshakeTimeout < 0 || l.HandshakeTimeout > time.Minute {
		errs = append(errs, errors.New("connectionLimits.handshakeTimeout: must be in [0, 1m]"))
	}
	for name, v := range map[string]int{"maxConnections": l.MaxConnections, "maxConnectionsPerAddress": l.MaxConnectionsPerAddress,
		"maxPreAuth": l.MaxPreAuth, "maxPreAuthPerAddress": l.MaxPreAuthPerAddress, "preAuthStreams": l.PreAuthStreams,
		"streamBurst": l.StreamBurst, "maxConcurrentBootstraps": l.MaxConcurrentBootstraps} {
		if v < 0 {
			errs = append(errs, errors.New("connectionLimits."+name+": must not be negative"))
		}
	}
	if l.StreamsPerSecond < 0 || l.PreAuthIdle < 0 || l.PreAuthAge < 0 {
		errs = append(errs, errors.New("connectionLimits: rates and durations must not be negative"))
	}
	return errors.Join(errs...)
}

// GateMetrics are the metrics the gate and its stream guards write; the
// server registers them (docs/metrics.md). Labels never carry a token, key
// or certificate.
type GateMetrics struct {
	// ConnsRefused counts connections closed by a limit, by reason
	// (relaymesh_relay_connections_refused_total).
	ConnsRefused *prometheus.CounterVec
	// OpenConns counts open connections, by state: preauth or
	// authenticated (relaymesh_relay_open_connections).
	OpenConns *prometheus.GaugeVec
}

// Gate accepts relay connections, enforces the connection limits, runs the
// TLS handshake under a deadline and hands each connection to the
// pre-authentication or the authenticated gRPC server.
type Gate struct {
	limits  ConnectionLimits
	tls     *tls.Config
	metrics *GateMetrics
	// abusers: addresses whose connections were cut for abuse; with no
	// budget left, their new connections are closed before the handshake.
	abusers *FailureLimiter
	pre     *connQueue
	auth    *connQueue

	mu         sync.Mutex
	total      int
	perAddr    map[string]int
	preTotal   int
	prePerAddr map[string]int
	closed     bool
}

// NewGate makes the gate of one listener: connections it admits and
// handshakes come out of PreAuth or Authenticated, to be served by the
// pre-authentication and the authenticated gRPC server; m counts what it
// refuses and holds; abusers, optional, are addresses refused before the
// handshake while their budget is spent.
func NewGate(limits ConnectionLimits, cfg *tls.Config, m *GateMetrics, addr net.Addr, abusers *FailureLimiter) *Gate {
	return &Gate{limits: limits, tls: cfg, metrics: m, abusers: abusers,
		pre: newConnQueue(addr), auth: newConnQueue(addr), perAddr: map[string]int{}, prePerAddr: map[string]int{}}
}

// Serve accepts from lis until it fails or the gate is closed.
func (g *Gate) Serve(lis net.Listener) error {
	var delay time.Duration
	for {
		raw, err := lis.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// EMFILE and friends: back off as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			g.Close()
			return err
		}
		delay = 0
		g.admit(raw)
	}
}

// admit counts raw against the limits and starts its handshake, or closes
// it at once.
func (g *Gate) admit(raw net.Conn) {
	addr := PeerKey(hostOf(raw.RemoteAddr()))
	reason := ""
	g.mu.Lock()
	switch {
	case g.closed:
		reason = "closed"
	case g.abusers != nil && g.abusers.Exhausted(addr):
		reason = "abuse"
	case g.total >= g.limits.MaxConnections:
		reason = "connection_limit"
	case g.perAddr[addr] >= g.limits.MaxConnectionsPerAddress:
		reason = "address_connection_limit"
	case g.preTotal >= g.limits.MaxPreAuth:
		reason = "preauth_limit"
	case g.prePerAddr[addr] >= g.limits.MaxPreAuthPerAddress:
		reason = "address_preauth_limit"
	default:
		g.total++
		g.perAddr[addr]++
		g.preTotal++
		g.prePerAddr[addr]++
		g.metrics.OpenConns.WithLabelValues("preauth").Inc()
	}
	g.mu.Unlock()
	if reason != "" {
		g.metrics.ConnsRefused.WithLabelValues(reason).Inc()
		_ = raw.Close()
		return
	}
	go g.handshake(raw, addr)
}

// handshake completes TLS within the deadline and routes the connection by
// whether the peer proved a relay certificate.
func (g *Gate) handshake(raw net.Conn, addr string) {
	c := &gatedConn{g: g, addr: addr, preAuth: true}
	tc := tls.Server(raw, g.tls)
	c.Conn = tc
	ctx, cancel := context.WithTimeout(context.Background(), g.limits.HandshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		g.metrics.ConnsRefused.WithLabelValues("handshake").Inc()
		_ = c.Close()
		return
	}
	c.state = tc.ConnectionState()
	if len(c.state.VerifiedChains) > 0 {
		g.mu.Lock()
		c.preAuth = false
		g.preTotal--
		g.prePerAddr[addr]--
		if g.prePerAddr[addr] <= 0 {
			delete(g.prePerAddr, addr)
		}
		g.metrics.OpenConns.WithLabelValues("preauth").Dec()
		g.metrics.OpenConns.WithLabelValues("authenticated").Inc()
		g.mu.Unlock()
		c.streams = newStreamBudget(g.limits.StreamsPerSecond, g.limits.StreamBurst)
		g.auth.push(c)
		return
	}
	c.streams = &streamBudget{max: g.limits.PreAuthStreams}
	g.pre.push(c)
}

// release undoes admit's counts.
func (g *Gate) release(addr string, preAuth bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total--
	if g.perAddr[addr]--; g.perAddr[addr] <= 0 {
		delete(g.perAddr, addr)
	}
	if preAuth {
		g.preTotal--
		if g.prePerAddr[addr]--; g.prePerAddr[addr] <= 0 {
			delete(g.prePerAddr, addr)
		}
		g.metrics.OpenConns.WithLabelValues("preauth").Dec()
	} else {
		g.metrics.OpenConns.WithLabelValues("authenticated").Dec()
	}
}

// PreAuth is the listener of connections without a client certificate,
// for the pre-authentication server.
func (g *Gate) PreAuth() net.Listener { return g.pre }

// Authenticated is the listener of connections that proved a certificate
// of the relay CA, for the authenticated server.
func (g *Gate) Authenticated() net.Listener { return g.auth }

// Close refuses new connections and closes both listeners.
func (g *Gate) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.pre.close()
	g.auth.close()
}

func hostOf(a net.Addr) string {
	if a == nil {
		return "unknown"
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// gatedConn is a handshaken connection the gate counts until it closes.
type gatedConn struct {
	net.Conn
	g       *Gate
	addr    string
	state   tls.ConnectionState
	streams *streamBudget
	once    sync.Once
	// preAuth is set until the handshake proved a certificate; read under
	// g.mu only when closing.
	preAuth bool
}

func (c *gatedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.g.mu.Lock()
		pre := c.preAuth
		c.g.mu.Unlock()
		c.g.release(c.addr, pre)
	})
	return err
}

// connQueue is a net.Listener fed by the gate.
type connQueue struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) push(c net.Conn) {
	select {
	case q.conns <- c:
	case <-q.done:
		_ = c.Close()
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) close() { q.once.Do(func() { close(q.done) }) }

func (q *connQueue) Close() error { q.close(); return nil }

func (q *connQueue) Addr() net.Addr { return q.addr }

// HandshakenCreds are the transport credentials of a connection the gate
// already handshook: they report its TLS state (which authentication
// reads) without a second handshake.
type HandshakenCreds struct{}

// gatedInfo is the peer's AuthInfo: the TLS state, and the connection so
// its stream budget can be charged.
type gatedInfo struct {
	credentials.TLSInfo
	conn *gatedConn
}

func (HandshakenCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, ok := raw.(*gatedConn)
	if !ok {
		return nil, nil, errors.New("relay: connection did not come through the gate")
	}
	return c, gatedInfo{TLSInfo: credentials.TLSInfo{State: c.state, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, conn: c}, nil
}

func (HandshakenCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("relay: server-side credentials")
}

func (HandshakenCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (h HandshakenCreds) Clone() credentials.TransportCredentials { return h }

func (HandshakenCreds) OverrideServerName(string) error { return nil }

// TLSInfo is the verified TLS state of a call's peer.
func TLSInfo(ctx context.Context) (credentials.TLSInfo, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return credentials.TLSInfo{}, false
	}
	switch info := p.AuthInfo.(type) {
	case gatedInfo:
		return info.TLSInfo, true
	case credentials.TLSInfo:
		return info, true
	}
	return credentials.TLSInfo{}, false
}

// streamBudget limits the streams of one connection: a lifetime total
// (max > 0) or a token bucket (rate > 0).
type streamBudget struct {
	mu     sync.Mutex
	max    int
	used   int
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
	cut    atomic.Bool
}

func newStreamBudget(perSecond float64, burst int) *streamBudget {
	return &streamBudget{rate: perSecond, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// take charges one stream; false means the connection is over budget.
func (b *streamBudget) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.max > 0 {
		b.used++
		return b.used <= b.max
	}
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// StreamGuard is a stats.Handler that charges every stream to its
// connection's budget and closes a connection that overspends it: a client
// that opens and resets streams as fast as it can (HTTP/2 rapid reset) is
// cut off after a few, whatever the streams ask for.
type StreamGuard struct {
	metrics *GateMetrics
	kind    string // "preauth" or "authenticated", for the metric
	// abusers is charged the address of every connection cut.
	abusers *FailureLimiter
}

// NewStreamGuard charges the streams of the gate's connections; kind
// ("preauth" or "authenticated") labels the connections it cuts, whose
// addresses are charged to abusers (optional).
func NewStreamGuard(m *GateMetrics, kind string, abusers *FailureLimiter) StreamGuard {
	return StreamGuard{metrics: m, kind: kind, abusers: abusers}
}

func (StreamGuard) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (g StreamGuard) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InHeader); !ok {
		return
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return
	}
	info, ok := p.AuthInfo.(gatedInfo)
	if !ok || info.conn.streams == nil {
		return
	}
	if !info.conn.streams.take(time.Now()) && info.conn.streams.cut.CompareAndSwap(false, true) {
		g.metrics.ConnsRefused.WithLabelValues(g.kind + "_stream_budget").Inc()
		if g.abusers != nil {
			if done, ok := g.abusers.Begin(info.conn.addr); ok {
				done(false)
			}
		}
		_ = info.conn.Close()
	}
}

func (StreamGuard) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (StreamGuard) HandleConn(context.Context, stats.ConnStats) {}
