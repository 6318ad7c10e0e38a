// Package servertest runs a real relay server in-process for tests: loopback
// TCP, real TLS, a generated relay CA, an in-memory token store, an audit
// log in a temporary directory, and clusters cluster-1 and cluster-2
// registered. It is imported only from _test.go files.
package servertest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TrustDomain of the test relay.
var TrustDomain = spiffeid.RequireTrustDomainFromString("relaymesh.test")

// Server is a relay server on loopback with real TLS, a generated relay CA,
// an in-memory token store and clusters cluster-1 and cluster-2 registered.
type Server struct {
	t         testing.TB
	Srv       *server.Server
	Addr      string
	Authority *ca.Authority
	// RelayCA is the generated CA (root and issuing CA with their keys).
	RelayCA *ca.RelayCA
	// View and Outputs of the data path, when enabled.
	View      *server.View
	Outputs   *server.Outputs
	RootsPEM  []byte
	Roots     *x509.CertPool
	Registry  *server.Registry
	Tokens    *identity.Tokens
	Store     *identitytest.MemTokenStore
	AuditPath string
	Logs      *syncbuf.Buffer
	Metrics   *prometheus.Registry
	minted    []string // every token minted, to check none leaks
}

type Options struct {
	AgentTTL time.Duration
	// Backdate is how far the CA backdates NotBefore (default 1m); short
	// lifetimes in renewal tests want a short one.
	Backdate time.Duration
	// failureBurst bounds failed bootstraps per peer; tests that are not
	// about rate limiting get a large one, since every peer is 127.0.0.1.
	FailureBurst int
	// DataPath enables Push and Pull with a fresh View and (ready) Outputs.
	DataPath bool
	// Limits for snapshots (defaults when zero).
	Limits relay.SnapshotLimits
	// SnapshotBurst bounds the snapshots one agent may push at once
	// (default: the server's).
	SnapshotBurst int
	Shared        string
	MaxRecv       int
	// Trust serves Trust.SignIntermediate when set.
	Trust server.IntermediateSigner
	// TrustBundles: the relay trust bundle sessions deliver, when set.
	TrustBundles server.TrustBundleSource
	// Connections: limits of connections; tests that are not about them get
	// per-address limits far above the defaults, since every peer is
	// 127.0.0.1.
	Connections relay.ConnectionLimits
	// Clusters: per-cluster limits (defaults when zero).
	Clusters relay.ClusterLimits
	// GlobalFailureBurst bounds failed bootstraps of all peers (default:
	// as large as FailureBurst); GlobalFailuresPerMinute is its refill
	// (default: the server's).
	GlobalFailureBurst      int
	GlobalFailuresPerMinute float64

	// SnapshotDeadline, SnapshotIdle, SnapshotMinRate and SnapshotMemory
	// bound chunked pushes (default: the server's).
	SnapshotDeadline time.Duration
	SnapshotIdle     time.Duration
	SnapshotMinRate  int64
	SnapshotMemory   int64
	// SessionV1Only serves only the relay protocol of earlier releases
	// (Session answers Unimplemented).
	SessionV1Only bool
	// Store, when set, is the token store to share (another fixture's
	// Store: two replicas); else a new one.
	Store *identitytest.MemTokenStore
	// Clock is the server's and its tokens' clock (default time.Now).
	Clock func() time.Time
}

func New(t testing.TB, o Options) *Server {
	t.Helper()
	ctx := context.Background()
	if o.AgentTTL == 0 {
		o.AgentTTL = time.Hour
	}
	if o.FailureBurst == 0 {
		o.FailureBurst = 1000
	}
	if o.GlobalFailureBurst == 0 {
		o.GlobalFailureBurst = max(o.FailureBurst, 60)
	}
	if o.Connections.MaxPreAuthPerAddress == 0 {
		o.Connections.MaxPreAuthPerAddress = 1024
	}
	if o.Connections.MaxConnectionsPerAddress == 0 {
		o.Connections.MaxConnectionsPerAddress = 4096
	}
	relayCA, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	signer, err := relayCA.Signer(time.Now())
	require.NoError(t, err)
	authority, err := ca.New(ca.Config{Signer: signer, AgentTTL: o.AgentTTL, Backdate: o.Backdate})
	require.NoError(t, err)
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	serving, err := server.NewServingCert(ctx, authority, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, nil, log)
	require.NoError(t, err)
	store := o.Store
	if store == nil {
		store = identitytest.NewMemTokenStore()
	}
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: store, Clock: o.Clock})
	require.NoError(t, err)
	auditPath := filepath.Join(t.TempDir(), "audit.log")
	auditLog, err := audit.Open(audit.Config{Path: auditPath})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	metrics, err := server.NewMetrics(reg)
	require.NoError(t, err)
	registry := server.NewRegistry()
	for _, c := range []string{"cluster-1", "cluster-2"} {
		registry.Set(server.Registration{Name: c, UID: c + "-uid"})
	}
	var shared *identity.SharedToken
	if o.Shared != "" {
		shared, err = identity.NewSharedToken(o.Shared)
		require.NoError(t, err)
	}
	var dp *server.DataPathConfig
	if o.DataPath {
		dp = &server.DataPathConfig{View: server.NewView(), Outputs: server.NewOutputs(time.Now()), Limits: o.Limits, SnapshotBurst: o.SnapshotBurst,
			SnapshotDeadline: o.SnapshotDeadline, SnapshotIdle: o.SnapshotIdle, SnapshotMinRate: o.SnapshotMinRate, SnapshotMemory: o.SnapshotMemory}
		dp.Outputs.MarkReady()
	}
	srv, err := server.NewServer(server.ServerConfig{
		DataPath: dp, SessionV1Only: o.SessionV1Only,
		TrustDomain: TrustDomain, Issuer: authority, Tokens: tokens, SharedToken: shared, Registry: registry,
		ServerCertificate: serving.Certificate, Audit: auditLog, Logger: log, Metrics: metrics, MaxRecvBytes: o.MaxRecv,
		BootstrapFailureBurst: o.FailureBurst, Trust: o.Trust, TrustBundles: o.TrustBundles, Connections: o.Connections, Clusters: o.Clusters,
		GlobalBootstrapFailureBurst: o.GlobalFailureBurst, GlobalBootstrapFailuresPerMinute: o.GlobalFailuresPerMinute,
		Clock: o.Clock,
	})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	var rootsPEM []byte
	pool := x509.NewCertPool()
	for _, r := range authority.Roots() {
		rootsPEM = append(rootsPEM, catest.CertsPEM(r)...)
		pool.AddCert(r)
	}
	f := &Server{t: t, Srv: srv, Addr: lis.Addr().String(), Authority: authority, RelayCA: relayCA,
		View: viewOf(dp), Outputs: outputsOf(dp), RootsPEM: rootsPEM, Roots: pool,
		Registry: registry, Tokens: tokens, Store: store, AuditPath: auditPath, Logs: logs, Metrics: reg}
	t.Cleanup(func() {
		srv.Stop()
		require.NoError(t, auditLog.Close())
		f.CheckNoSecretsLeaked()
	})
	return f
}

// checkNoSecretsLeaked fails the test if any minted token or private key
// appears in the logs or the audit log.
func (f *Server) CheckNoSecretsLeaked() {
	b, err := os.ReadFile(f.AuditPath)
	require.NoError(f.t, err)
	_, err = audit.Verify(bytes.NewReader(b))
	require.NoError(f.t, err, "audit log must verify")
	for name, text := range map[string]string{"logs": f.Logs.String(), "audit log": string(b)} {
		for _, tok := range f.minted {
			assert.NotContains(f.t, text, tok[17:], "%s contain a token secret", name)
		}
		assert.NotContains(f.t, text, "PRIVATE KEY", "%s contain a private key", name)
	}
}

func (f *Server) Mint(cluster string, ttl time.Duration) string {
	tok, _, err := f.Tokens.Mint(context.Background(), cluster, ttl)
	require.NoError(f.t, err)
	f.minted = append(f.minted, tok)
	return tok
}

// NewConn returns a client connection the caller closes.
func (f *Server) NewConn(tlsCfg *tls.Config) (*grpc.ClientConn, error) {
	return grpc.NewClient(f.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
}

// Dial returns a client connection closed when the test ends.
func (f *Server) Dial(tlsCfg *tls.Config) *grpc.ClientConn {
	conn, err := grpc.NewClient(f.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	require.NoError(f.t, err)
	f.t.Cleanup(func() { conn.Close() })
	return conn
}

// serverOnly is the TLS an agent bootstraps with: pinned roots, no client certificate.
func (f *Server) ServerOnly() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: f.Roots, ServerName: "localhost"}
}

func (f *Server) MTLS(cert tls.Certificate) *tls.Config {
	c := f.ServerOnly()
	c.Certificates = []tls.Certificate{cert}
	return c
}

func (f *Server) BootstrapClient() relaypb.IdentityClient {
	return relaypb.NewIdentityClient(f.Dial(f.ServerOnly()))
}

// AgentCred is a key and the certificate the server issued for it.
type AgentCred struct {
	TLS  tls.Certificate
	Leaf *x509.Certificate
	Resp *relaypb.CertificateResponse
}

func CSRPEM(t testing.TB) ([]byte, []byte) {
	key := catest.NewKey(t, catest.ECDSAP256)
	return catest.NewCSRPEM(t, key, &x509.CertificateRequest{}), catest.KeyPEM(t, key)
}

func (f *Server) Bootstrap(cluster string) AgentCred {
	f.t.Helper()
	csr, keyPEM := CSRPEM(f.t)
	resp, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: cluster, Token: f.Mint(cluster, time.Hour), Csr: csr})
	require.NoError(f.t, err)
	return f.Cred(resp, keyPEM)
}

func (f *Server) Cred(resp *relaypb.CertificateResponse, keyPEM []byte) AgentCred {
	pair, err := tls.X509KeyPair(resp.GetCertificateChain(), keyPEM)
	require.NoError(f.t, err)
	return AgentCred{TLS: pair, Leaf: pair.Leaf, Resp: resp}
}

func (f *Server) Metric(name string, labels ...string) float64 {
	mfs, err := f.Metrics.Gather()
	require.NoError(f.t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := true
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				match = match && found
			}
			if match {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func viewOf(dp *server.DataPathConfig) *server.View {
	if dp == nil {
		return nil
	}
	return dp.View
}

func outputsOf(dp *server.DataPathConfig) *server.Outputs {
	if dp == nil {
		return nil
	}
	return dp.Outputs
}
