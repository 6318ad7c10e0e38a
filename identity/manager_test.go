package identity_test

import (
	"context"
	"crypto/x509"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRenewalTime(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	na := nb.Add(24 * time.Hour)
	assert.Equal(t, nb.Add(16*time.Hour), identity.RenewalTime(nb, na, 0))
	assert.Equal(t, nb.Add(16*time.Hour-144*time.Minute), identity.RenewalTime(nb, na, 1))
	got := identity.RenewalTime(nb, na, 0.5)
	assert.True(t, got.After(nb.Add(14*time.Hour)) && got.Before(nb.Add(16*time.Hour)))
	assert.Equal(t, nb, identity.RenewalTime(nb, nb, 0.3), "zero lifetime: renew now")
	assert.Equal(t, nb.Add(16*time.Hour), identity.RenewalTime(nb, na, -5), "jitter is clamped")
}

func TestNewManagerValidates(t *testing.T) {
	_, err := identity.NewManager(identity.ManagerConfig{Cluster: "Bad", ServerAddress: "nohost"})
	require.Error(t, err)
	for _, want := range []string{"cluster:", "serverAddress:", "secrets: required"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestNewManagerRefusesReplicasItCannotVerifyOrPick(t *testing.T) {
	secrets := identitytest.NewMemAgentSecrets(nil, "")
	_, err := identity.NewManager(identity.ManagerConfig{Cluster: "c1", ServerAddress: "a.test:1,b.test:2", Secrets: secrets})
	assert.ErrorContains(t, err, "serverName:", "several replicas need the name every one's certificate carries")
	for _, first := range []int{-1, 2} {
		_, err = identity.NewManager(identity.ManagerConfig{Cluster: "c1", ServerAddress: "a.test:1,b.test:2", ServerName: "relay.test", Secrets: secrets,
			FirstReplica: func(int) int { return first }})
		assert.ErrorContains(t, err, "firstReplica:", "first replica %d", first)
	}
	_, err = identity.NewManager(identity.ManagerConfig{Cluster: "c1", ServerAddress: "a.test:1,b.test:2", ServerName: "relay.test", Secrets: secrets,
		FirstReplica: func(n int) int { return n - 1 }})
	assert.NoError(t, err)
}

func startManager(t *testing.T, srv *servertest.Server, secrets identity.AgentSecrets, cluster string) (*identity.Manager, context.CancelFunc) {
	t.Helper()
	return runManager(t, identity.ManagerConfig{Cluster: cluster, ServerAddress: srv.Addr, ServerName: "localhost", Secrets: secrets})
}

// runManager runs a manager of cfg, with no jitter and a fast retry, until
// the test ends or the returned cancel is called.
func runManager(t *testing.T, cfg identity.ManagerConfig) (*identity.Manager, context.CancelFunc) {
	t.Helper()
	cfg.Jitter = func() float64 { return 0 }
	cfg.Retry = backoff.Policy{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond}
	m, err := identity.NewManager(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return m, cancel
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestManagerBootstrapsThenReloads(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	secrets := identitytest.NewMemAgentSecrets(srv.RootsPEM, srv.Mint("cluster-1", time.Hour))
	m, cancel := startManager(t, srv, secrets, "cluster-1")
	select {
	case <-m.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("not ready: %+v", m.Status())
	}
	st := m.Status()
	assert.True(t, st.Ready)
	assert.Equal(t, "spiffe://relaymesh.test/cluster/cluster-1/agent", st.SPIFFEID)
	assert.Contains(t, st.Message, "bootstrapped")
	assert.False(t, secrets.HasToken(), "the used token is deleted")
	assert.Equal(t, 1, secrets.Saves())
	cancel()

	// A restarted agent uses the stored certificate: no token needed.
	m2, _ := startManager(t, srv, secrets, "cluster-1")
	<-m2.Ready()
	assert.Contains(t, m2.Status().Message, "loaded stored client certificate")
	assert.Equal(t, 1, secrets.Saves(), "nothing re-issued")
}

func TestManagerCannotBootstrap(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	tests := []struct {
		name    string
		secrets *identitytest.MemAgentSecrets
		cluster string
		want    string
	}{
		{"no token", identitytest.NewMemAgentSecrets(srv.RootsPEM, ""), "cluster-1", "no bootstrap token"},
		{"token rejected", identitytest.NewMemAgentSecrets(srv.RootsPEM, srv.Mint("cluster-2", time.Hour)), "cluster-1", "bootstrap token rejected"},
		{"no pinned root", identitytest.NewMemAgentSecrets(nil, srv.Mint("cluster-1", time.Hour)), "cluster-1", "no relay root CA"},
		{"server not trusted", identitytest.NewMemAgentSecrets(catest.CertsPEM(catest.NewRoot(t, catest.CAOptions{}).Cert), srv.Mint("cluster-1", time.Hour)), "cluster-1", "certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := startManager(t, srv, tt.secrets, tt.cluster)
			waitFor(t, 5*time.Second, "an error in status", func() bool { return m.Status().LastError != "" })
			st := m.Status()
			assert.False(t, st.Ready)
			assert.Contains(t, st.Message, tt.want, "the status says why")
			_, err := m.ClientTLS()
			if tt.name == "no pinned root" {
				assert.Error(t, err, "no TLS config without pinned roots")
			}
			assert.Equal(t, 0, tt.secrets.Saves(), "nothing stored")
			select {
			case <-m.Ready():
				t.Fatal("must not become ready")
			default:
			}
		})
	}
}

// TestRenewalKeepsTheSession renews a 12-second certificate while a relay
// session made with the first certificate stays open. The agent pins a
// second root besides the server's (as in a relay root rotation): the
// renewed credential is stored with the roots the agent pins, never with
// the trust_bundle of the server's answer.
func TestRenewalKeepsTheSession(t *testing.T) {
	srv := servertest.New(t, servertest.Options{AgentTTL: 12 * time.Second, Backdate: time.Second})
	pinned := append(append([]byte{}, srv.RootsPEM...), catest.NewRoot(t, catest.CAOptions{Name: "another relay root"}).RootsPEM()...)
	secrets := identitytest.NewMemAgentSecrets(pinned, srv.Mint("cluster-1", time.Hour))
	m, _ := startManager(t, srv, secrets, "cluster-1")
	<-m.Ready()
	first := m.Status()

	sess, err := agent.NewSession(agent.SessionConfig{ServerAddress: srv.Addr, TLS: m.ClientTLS, PingInterval: 500 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sess.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, 5*time.Second, "session", func() bool { return sess.State().Connected })
	since := sess.State().Since

	waitFor(t, 20*time.Second, "a renewal", func() bool { return m.Status().Renewals >= 1 })
	renewed := m.Status()
	assert.NotEqual(t, first.Serial, renewed.Serial)
	assert.True(t, renewed.NotAfter.After(first.NotAfter))
	t.Logf("second certificate issued %s after the first (13s lifetime incl. 1s backdate; 2/3 is 8.7s)", renewed.NotAfter.Sub(first.NotAfter))

	// Past the first certificate's expiry the session is still the same one.
	time.Sleep(time.Until(first.NotAfter) + time.Second)
	st := sess.State()
	assert.True(t, st.Connected, "session dropped: %+v", st)
	assert.Equal(t, int64(0), st.Reconnects, "no reconnect")
	assert.Equal(t, since, st.Since)
	assert.Equal(t, 1, srv.Srv.Sessions("cluster-1"))

	// New connections use the new certificate.
	tlsCfg, err := m.ClientTLS()
	require.NoError(t, err)
	cert, err := tlsCfg.GetClientCertificate(nil)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	require.NoError(t, err)
	assert.Equal(t, renewed.Serial, strings.TrimLeft(leaf.SerialNumber.Text(16), "0"))
	assert.Equal(t, string(pinned), string(secrets.SavedRoots()), "stored with the pinned roots, not the server's answer")
	assert.Equal(t, float64(1), srv.Metric(server.MetricIssued, "operation", "renew", "result", "success"))
}

// A cluster registered again gets a new registration: the server refuses
// the old certificate, the agent drops it, says it needs a token, and
// bootstraps again as soon as one arrives — without a restart.
func TestManagerRebootstrapsAfterReregistration(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	secrets := identitytest.NewMemAgentSecrets(srv.RootsPEM, srv.Mint("cluster-1", time.Hour))
	m, _ := startManager(t, srv, secrets, "cluster-1")
	<-m.Ready()
	first := m.Status().Serial
	sess, err := agent.NewSession(agent.SessionConfig{ServerAddress: srv.Addr, TLS: m.ClientTLS, OnRefused: m.Refused,
		Retry: backoff.Policy{Min: 50 * time.Millisecond, Max: 100 * time.Millisecond}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sess.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, 5*time.Second, "session", func() bool { return sess.State().Connected })

	srv.Registry.Set(server.Registration{Name: "cluster-1", UID: "registered-again"})
	waitFor(t, 5*time.Second, "the agent to drop the refused certificate", func() bool { return !m.Status().Ready })
	waitFor(t, 5*time.Second, "the status to ask for a token", func() bool { return strings.Contains(m.Status().Message, "no bootstrap token") })

	secrets.SetToken(srv.Mint("cluster-1", time.Hour))
	waitFor(t, 10*time.Second, "a new certificate", func() bool { st := m.Status(); return st.Ready && st.Serial != first })
	waitFor(t, 10*time.Second, "the session to come back", func() bool { return sess.State().Connected })
	assert.Equal(t, 1, srv.Srv.Sessions("cluster-1"))
}

// A certificate whose storing fails is used anyway (its token is spent) and
// stored on a later attempt.
func TestManagerRetriesStoringTheCertificate(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	secrets := identitytest.NewMemAgentSecrets(srv.RootsPEM, srv.Mint("cluster-1", time.Hour))
	secrets.FailSaves(2)
	m, _ := startManager(t, srv, secrets, "cluster-1")
	<-m.Ready()
	waitFor(t, 5*time.Second, "the certificate to be stored", func() bool { return secrets.Saves() == 1 })
	assert.True(t, m.Status().Ready)
	assert.Equal(t, float64(1), srv.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success"), "issued once, not re-bootstrapped")
}

// TestManagerBootstrapRetriesWithTheSameKey: the server spends the token
// but the answer comes after the manager's call gave up (a busy server);
// the manager calls again with the same key and gets the certificate
// instead of needing a new token.
func TestManagerBootstrapRetriesWithTheSameKey(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	release := make(chan struct{})
	var calls atomic.Int32
	srv.Store.AfterSpend = func() {
		if calls.Add(1) == 1 {
			<-release
		}
	}
	secrets := identitytest.NewMemAgentSecrets(srv.RootsPEM, srv.Mint("cluster-1", time.Hour))
	m, _ := runManager(t, identity.ManagerConfig{Cluster: "cluster-1", ServerAddress: srv.Addr, ServerName: "localhost", Secrets: secrets, CallTimeout: 2 * time.Second})

	waitFor(t, 10*time.Second, "the first call to give up", func() bool { return m.Status().LastError != "" })
	close(release)
	select {
	case <-m.Ready():
	case <-time.After(15 * time.Second):
		t.Fatalf("not ready: %+v", m.Status())
	}
	assert.Equal(t, int32(1), calls.Load(), "the token was spent once, by the first call")
	assert.Equal(t, float64(1), srv.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success"), "one certificate")
	assert.False(t, secrets.HasToken())
}
