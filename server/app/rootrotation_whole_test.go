package app_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/server/app/apptest"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// rotationWorld is a whole server (one replica under the Lease, its
// Lease heartbeat publishing the loaded revision) with short intervals,
// and one registered cluster whose real credential manager and agent
// session store and acknowledge trust bundles.
type rotationWorld struct {
	t       *testing.T
	ns      string
	app     *apptest.App
	kube    *kubeclient.Clients
	mgmt    *fleet.Management
	m       *identity.Manager
	secrets *identitytest.MemAgentSecrets
	sess    *agent.Session
	logs    *syncbuf.Buffer
	runCtx  context.Context
	// endSession ends the current agent session and waits for it.
	endSession func()
}

func newRotationWorld(t *testing.T, ns string) *rotationWorld {
	ctx := context.Background()
	kube := apptest.Management(t, ns)
	cfg := apptest.AppConfig(t, ns, "replica-0")
	// Agent certificates live 45s (backdated a minute, renewed every
	// ~10s); the grace is 45s + 2 x 1s.
	cfg.AgentCertTTL, cfg.CA.IssuerCheck = 45*time.Second, time.Second
	cfg.Clusters.RenewsPerMinute = 60
	a := apptest.StartApp(t, kube, cfg)
	rootsPEM, err := ca.RelayRootsPEM(ctx, kube.Typed, ns)
	require.NoError(t, err)
	mgmt, err := fleet.NewManagement(ctx, kube.Config, ns)
	require.NoError(t, err)
	members, err := mgmt.Register(ctx, fleet.ClusterNames("rot", 1), time.Hour, 1)
	require.NoError(t, err)
	w := &rotationWorld{t: t, ns: ns, app: a, kube: kube, mgmt: mgmt, logs: &syncbuf.Buffer{}}
	w.secrets = identitytest.NewMemAgentSecrets(rootsPEM, members[0].Token)
	log := slog.New(slog.NewTextHandler(w.logs, nil))
	w.m, err = identity.NewManager(identity.ManagerConfig{Cluster: members[0].Cluster, ServerAddress: a.Addrs.Relay, ServerName: "localhost",
		Secrets: w.secrets, Logger: log, Jitter: func() float64 { return 0 }, Retry: backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	mDone := make(chan struct{})
	go func() { _ = w.m.Run(runCtx); close(mDone) }()
	<-w.m.Ready()
	w.runCtx = runCtx
	w.startSession(log)
	t.Cleanup(func() { cancel(); w.endSession(); <-mDone })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", w.logs.String())
			for _, l := range strings.Split(a.Logs.String(), "\n") {
				if strings.Contains(l, "root rotation") || strings.Contains(l, "bundle") || strings.Contains(l, "WARN") || strings.Contains(l, "ERROR") {
					t.Logf("server: %s", l)
				}
			}
		}
	})
	return w
}

// startSession starts an agent session that stores and acknowledges
// bundles, and waits until it is connected.
func (w *rotationWorld) startSession(log *slog.Logger) {
	var err error
	w.sess, err = agent.NewSession(agent.SessionConfig{ServerAddress: w.app.Addrs.Relay, TLS: w.m.ClientTLS, TrustBundles: w.m,
		PingInterval: 200 * time.Millisecond, Logger: log, Retry: backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}})
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(w.runCtx)
	done := make(chan struct{})
	go func() { _ = w.sess.Run(ctx); close(done) }()
	w.endSession = func() { cancel(); <-done }
	require.Eventually(w.t, func() bool { return w.sess.State().Connected }, 30*time.Second, 100*time.Millisecond)
}

// state is the rotation state in the relay root Secret.
func (w *rotationWorld) state() ca.RootRotationState {
	s, err := w.kube.Typed.CoreV1().Secrets(w.ns).Get(context.Background(), ca.RootSecretName, metav1.GetOptions{})
	require.NoError(w.t, err)
	st, _, err := ca.DecodeRootRotation(s)
	require.NoError(w.t, err)
	return st
}

// phases waits until the Secret's state satisfies done, and returns the
// phases it passed through.
func (w *rotationWorld) phases(timeout time.Duration, done func(ca.RootRotationState) bool) []ca.RootPhase {
	var seen []ca.RootPhase
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		st := w.state()
		if len(seen) == 0 || seen[len(seen)-1] != st.Phase {
			seen = append(seen, st.Phase)
		}
		if done(st) {
			return seen
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.t.Fatalf("the rotation did not get there in %s; phases %v, now %+v", timeout, seen, w.state())
	return nil
}

// The relay root rotation runs by itself from `start`: the task stages a
// new root, the agent stores both roots and acknowledges, the replica
// switches, the old root leaves after the grace window. The agent keeps
// its session from start through Switching into RemovingOldRoot and
// renews under the new root after the switch. The bundle without the old
// root then reaches that same session, whose server chain (from before the
// switch) is under the old root: the agent reconnects once by itself —
// the new session verifies the server under the new root — acknowledges,
// and the rotation ends Idle on the new root, the agent pinning only that
// one and renewing.
//
// A second agent, offline through AddingNewRoot, comes back in Switching
// pinning only the old root, while issuance (the serving certificate
// included) has moved to the new one. The server's chain carries the new
// issuing CA cross-issued by the old root, so it verifies the server with
// the bundle it has, keeps its certificate (no token, no re-bootstrap),
// acknowledges the bundle with both roots, renews under the new root, and
// the rotation ends Idle with it connected, pinning only the new root.
func TestRelayRootRotationRunsFromStartToIdleWithAnAcknowledgingAgent(t *testing.T) {
	w := newRotationWorld(t, "root-rotation")
	ctx := context.Background()
	late := w.lateAgent("rot-late")
	require.False(t, late.secrets.HasToken(), "the late agent bootstrapped before the rotation")
	before := w.state()
	require.Equal(t, ca.RootIdle, before.Phase)
	require.NoError(t, ca.RequestRootRotation(ctx, w.kube.Typed, w.ns, ca.RootRequestStart))
	seen := w.phases(2*time.Minute, func(st ca.RootRotationState) bool { return st.Phase == ca.RootSwitching })
	newRoot := w.state().New
	stored, err := late.secrets.Roots(ctx)
	require.NoError(t, err)
	pinned, err := ca.ParseTrustBundle(stored)
	require.NoError(t, err)
	require.Len(t, pinned, 1, "offline through AddingNewRoot: the late agent pins only the old root")
	require.NotEqual(t, newRoot, ca.RootFingerprint(pinned[0]))
	// The replica renews its serving certificate within a check of the
	// switch: wait for it (through the first agent, which pins both), so
	// that the late agent meets the new root's chain.
	require.Eventually(t, func() bool {
		chain := w.serverChain(w.m)
		return len(chain) > 1 && ca.RootFingerprint(w.rootOf(chain[1])) == newRoot
	}, 30*time.Second, 200*time.Millisecond, "the server serves under the new root")
	require.True(t, time.Now().Before(late.m.Status().NotAfter),
		"the late agent's certificate (45s) expired before Switching: AddingNewRoot took too long for this test (%v)", seen)
	late.start(w, "rot-late")
	chain := w.serverChain(late.m)
	require.Len(t, chain, 3, "leaf, issuing CA, cross-issued CA")
	assert.Equal(t, chain[1].RawSubjectPublicKeyInfo, chain[2].RawSubjectPublicKeyInfo, "the cross-issued CA is the same CA")
	assert.Equal(t, ca.RootFingerprint(pinned[0]), ca.RootFingerprint(w.rootOf(chain[2])), "under the old root")

	seen = append(seen, w.phases(2*time.Minute, func(st ca.RootRotationState) bool { return st.Phase == ca.RootRemovingOld })...)
	assert.Subset(t, seen, []ca.RootPhase{ca.RootAddingNew, ca.RootSwitching, ca.RootRemovingOld})
	assert.Equal(t, newRoot, ca.RootFingerprint(w.certRootOf(late.m)), "the late agent renewed under the new root before the old one left")
	renewals := w.m.Status().Renewals
	require.Eventually(t, func() bool { return w.m.Status().Renewals > renewals }, 30*time.Second, 200*time.Millisecond)
	ss := w.sess.State()
	assert.True(t, ss.Connected)
	// At most the one reconnect RemovingOldRoot's bundle asks for (counted
	// exactly below): the session was never lost through AddingNewRoot and
	// Switching.
	assert.LessOrEqual(t, ss.Reconnects, int64(1))
	assert.Empty(t, w.m.Status().LastError, "every Renew was accepted")
	root := w.certRoot()
	assert.Equal(t, newRoot, ca.RootFingerprint(root), "renewed under the new root")

	w.phases(30*time.Second, func(st ca.RootRotationState) bool { return st.Phase == ca.RootIdle })
	end := w.state()
	assert.Equal(t, newRoot, end.Old, "the new root is the relay root")
	assert.Equal(t, before.Revision+4, end.Revision)
	stored, err = w.secrets.Roots(ctx)
	require.NoError(t, err)
	roots, err := ca.ParseTrustBundle(stored)
	require.NoError(t, err)
	require.Len(t, roots, 1)
	assert.Equal(t, newRoot, ca.RootFingerprint(roots[0]), "the agent pins only the new root")
	renewals = w.m.Status().Renewals
	require.Eventually(t, func() bool { return w.m.Status().Renewals > renewals }, 30*time.Second, 200*time.Millisecond, "the agent renews after the old root left")
	assert.Empty(t, w.m.Status().LastError)
	assert.False(t, w.secrets.HasToken(), "bootstrapped once, never again")
	assert.True(t, w.sess.State().Connected)
	assert.Equal(t, int64(1), w.sess.State().Reconnects, "one reconnect: the session that predated the last bundle")
	assert.Contains(t, w.logs.String(), "reconnecting to verify it")
	assert.Equal(t, 4.0, w.app.Series(t, app.MetricRelayRootRotationSteps, "")[""], "one count per transition")
	assert.Zero(t, w.app.Series(t, app.MetricRelayRootRotationErrors, "")[""])
	assert.Equal(t, 1.0, w.app.Series(t, app.MetricRelayRootRotationPhase, "phase")[string(ca.RootIdle)])
	assert.NotContains(t, w.app.Logs.String(), "PRIVATE KEY")

	stored, err = late.secrets.Roots(ctx)
	require.NoError(t, err)
	pinned, err = ca.ParseTrustBundle(stored)
	require.NoError(t, err)
	require.Len(t, pinned, 1)
	assert.Equal(t, newRoot, ca.RootFingerprint(pinned[0]), "the late agent ends pinning only the new root")
	assert.False(t, late.secrets.HasToken(), "no token was needed: no re-bootstrap")
	assert.Empty(t, late.m.Status().LastError, "every Renew of the late agent was accepted")
	assert.True(t, late.sess.State().Connected)
}

// lateAgent is a second registered cluster's agent that bootstraps on the
// relay root of now and then goes offline; start brings it back with the
// secrets it kept (a certificate and the bundle of then) and a session
// that stores and acknowledges bundles.
type lateAgent struct {
	secrets *identitytest.MemAgentSecrets
	m       *identity.Manager
	sess    *agent.Session
	logs    *syncbuf.Buffer
	stop    func()
}

func (w *rotationWorld) lateAgent(name string) *lateAgent {
	ctx := context.Background()
	rootsPEM, err := ca.RelayRootsPEM(ctx, w.kube.Typed, w.ns)
	require.NoError(w.t, err)
	members, err := w.mgmt.Register(ctx, []string{name}, time.Hour, 1)
	require.NoError(w.t, err)
	l := &lateAgent{secrets: identitytest.NewMemAgentSecrets(rootsPEM, members[0].Token), logs: &syncbuf.Buffer{}}
	l.start(w, name)
	l.stop()
	return l
}

func (l *lateAgent) start(w *rotationWorld, name string) {
	log := slog.New(slog.NewTextHandler(l.logs, nil))
	var err error
	l.m, err = identity.NewManager(identity.ManagerConfig{Cluster: name, ServerAddress: w.app.Addrs.Relay, ServerName: "localhost",
		Secrets: l.secrets, Logger: log, Jitter: func() float64 { return 0 }, Retry: backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}})
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	mDone, sDone := make(chan struct{}), make(chan struct{})
	go func() { _ = l.m.Run(ctx); close(mDone) }()
	<-l.m.Ready()
	l.sess, err = agent.NewSession(agent.SessionConfig{ServerAddress: w.app.Addrs.Relay, TLS: l.m.ClientTLS, TrustBundles: l.m,
		PingInterval: 200 * time.Millisecond, Logger: log, Retry: backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}})
	require.NoError(w.t, err)
	go func() { _ = l.sess.Run(ctx); close(sDone) }()
	l.stop = func() { cancel(); <-sDone; <-mDone }
	w.t.Cleanup(l.stop)
	w.t.Cleanup(func() {
		if w.t.Failed() {
			w.t.Logf("%s agent logs:\n%s", name, l.logs.String())
		}
	})
	require.Eventually(w.t, func() bool { return l.sess.State().Connected }, 30*time.Second, 100*time.Millisecond, "%s connects", name)
}

// serverChain is the chain the server presents to an agent dialling with
// m's TLS configuration (its pinned roots), verified as the agent does.
func (w *rotationWorld) serverChain(m *identity.Manager) []*x509.Certificate {
	cfg, err := m.ClientTLS()
	require.NoError(w.t, err)
	conn, err := tls.Dial("tcp", w.app.Addrs.Relay, cfg)
	require.NoError(w.t, err)
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates
}

// rootOf is the root (of the relay root Secret's two) that signed c.
func (w *rotationWorld) rootOf(c *x509.Certificate) *x509.Certificate {
	s, err := w.kube.Typed.CoreV1().Secrets(w.ns).Get(context.Background(), ca.RootSecretName, metav1.GetOptions{})
	require.NoError(w.t, err)
	current, staged, err := ca.RootRotationRoots(s)
	require.NoError(w.t, err)
	for _, r := range []*x509.Certificate{current, staged} {
		if r != nil && c.CheckSignatureFrom(r) == nil {
			return r
		}
	}
	w.t.Fatal("signed by neither root")
	return nil
}

// certRoot is the root (of the relay root Secret's two) the agent's current
// certificate's issuing CA is signed by.
func (w *rotationWorld) certRoot() *x509.Certificate { return w.certRootOf(w.m) }

// certRootOf is certRoot for the agent of m.
func (w *rotationWorld) certRootOf(m *identity.Manager) *x509.Certificate {
	cfg, err := m.ClientTLS()
	require.NoError(w.t, err)
	cert, err := cfg.GetClientCertificate(nil)
	require.NoError(w.t, err)
	s, err := w.kube.Typed.CoreV1().Secrets(w.ns).Get(context.Background(), ca.RootSecretName, metav1.GetOptions{})
	require.NoError(w.t, err)
	current, staged, err := ca.RootRotationRoots(s)
	require.NoError(w.t, err)
	issuer, err := x509.ParseCertificate(cert.Certificate[1])
	require.NoError(w.t, err)
	for _, r := range []*x509.Certificate{current, staged} {
		if r != nil && issuer.CheckSignatureFrom(r) == nil {
			return r
		}
	}
	w.t.Fatal("the agent's certificate chains to neither root")
	return nil
}

// A rollback from AddingNewRoot returns to Idle on the old root at once,
// the staged root gone; a second rollback is refused and changes nothing.
func TestRelayRootRotationRollsBackFromAddingNewRoot(t *testing.T) {
	w := newRotationWorld(t, "root-rollback")
	ctx := context.Background()
	before := w.state()
	require.NoError(t, ca.RequestRootRotation(ctx, w.kube.Typed, w.ns, ca.RootRequestStart))
	w.phases(20*time.Second, func(st ca.RootRotationState) bool { return st.Phase == ca.RootAddingNew })
	require.NoError(t, ca.RequestRootRotation(ctx, w.kube.Typed, w.ns, ca.RootRequestRollback))
	w.phases(20*time.Second, func(st ca.RootRotationState) bool { return st.Phase == ca.RootIdle })
	end := w.state()
	assert.Equal(t, before.Old, end.Old, "the old root stays the relay root")
	assert.True(t, end.RolledBack)
	s, err := w.kube.Typed.CoreV1().Secrets(w.ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, s.Data, "next.crt", "the staged root is discarded")
	assert.True(t, w.sess.State().Connected)
	assert.Zero(t, w.sess.State().Reconnects)

	require.NoError(t, ca.RequestRootRotation(ctx, w.kube.Typed, w.ns, ca.RootRequestRollback))
	require.Eventually(t, func() bool { return strings.Contains(w.app.Logs.String(), "nothing to roll back") }, 20*time.Second, 100*time.Millisecond)
	assert.Equal(t, end, w.state(), "a refused rollback changes nothing")
}
