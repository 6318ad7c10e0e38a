package app_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/server/app/apptest"
	"github.com/relaymesh/relaymesh/test/fleet"
)

// TestCFSSLIssuingCAReplacedStrandsNoAgent runs a whole server whose relay
// CA is a real cfssl (--ca-config) with agent certificates of five minutes.
// A credential manager bootstraps and an agent holds a session; then the
// issuing CA is replaced (a second cfssl under the same root, the file
// pointed at it). The server reloads it, and the manager renews with its
// certificate of the replaced issuing CA: nothing is refused, nobody
// bootstraps again, no session ends, and the new certificate comes from
// the new issuing CA.
func TestCFSSLIssuingCAReplacedStrandsNoAgent(t *testing.T) {
	ctx := context.Background()
	first := catest.StartCFSSL(t, catest.CFSSLOptions{ClientExpiry: "5m"})
	second := catest.StartCFSSL(t, catest.CFSSLOptions{ClientExpiry: "5m", Root: first.Issuing.Root()})
	file := filepath.Join(t.TempDir(), "ca.yaml")
	write := func(s *catest.CFSSL) {
		y := fmt.Sprintf("type: cfssl\ncfssl:\n  url: %s\n  authKeyFile: %s\n  chainFile: %s\n  rootsFile: %s\n", s.URL, s.AuthKeyFile, s.ChainFile, s.RootsFile)
		require.NoError(t, os.WriteFile(file, []byte(y), 0o600))
	}
	write(first)

	ns := "cfssl-relay-ca"
	kube := apptest.Management(t, ns)
	cfg := apptest.AppConfig(t, ns, "replica-0")
	// cfssl counts its profile's expiry from its backdated NotBefore,
	// rounded to the minute: five minutes leave the agent a renewal
	// point a minute or two ahead, where two would leave none.
	cfg.AgentCertTTL, cfg.CA.ConfigFile, cfg.CA.IssuerCheck = 5*time.Minute, file, time.Second
	a := apptest.StartApp(t, kube, cfg)
	rootSecret, err := kube.Typed.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, catest.CertsPEM(first.Issuing.Root().Cert), rootSecret.Data["ca.crt"], "the back end's root is the relay root agents pin")
	assert.Empty(t, rootSecret.Data["tls.key"], "no key in the cluster")

	mgmt, err := fleet.NewManagement(ctx, kube.Config, ns)
	require.NoError(t, err)
	members, err := mgmt.Register(ctx, fleet.ClusterNames("cfssl", 2), time.Hour, 1)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var agentLogs syncbuf.Buffer
	defer func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s\nserver logs:\n%s", agentLogs.String(), a.Logs.String())
		}
	}()
	secrets := identitytest.NewMemAgentSecrets(rootSecret.Data["ca.crt"], members[0].Token)
	m, err := identity.NewManager(identity.ManagerConfig{Cluster: members[0].Cluster, ServerAddress: a.Addrs.Relay, ServerName: "localhost",
		Secrets: secrets, Logger: slog.New(slog.NewTextHandler(&agentLogs, nil)), Jitter: func() float64 { return 0 }, Retry: backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { _ = m.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	roots, err := mgmt.RelayRoots(ctx)
	require.NoError(t, err)
	f, err := fleet.NewFleet(fleet.FleetConfig{Servers: []string{a.Addrs.Relay}, ServerName: "localhost", Roots: roots, Members: members[1:], SourceOffset: 9300})
	require.NoError(t, err)
	f.Start(runCtx)
	defer f.Stop()
	require.NoError(t, f.Wait(ctx, "sessions", fleet.Connected))
	require.Eventually(t, func() bool { return m.Status().Ready }, time.Minute, 200*time.Millisecond, "the manager bootstraps from the first issuing CA")
	firstSerial := m.Status().Serial

	write(second)
	generation := func() float64 { return a.Series(t, app.MetricRelayIssuerGeneration, "")[""] }
	require.Eventually(t, func() bool { return generation() == 2 }, 30*time.Second, 200*time.Millisecond, "the server reloads the new issuing CA")
	assert.Equal(t, 2.0, a.Series(t, app.MetricRelayIssuersAccepted, "")[""], "the current and the replaced issuing CA are accepted")
	require.Eventually(t, func() bool { return m.Status().Renewals >= 1 }, 5*time.Minute, 500*time.Millisecond,
		"the manager renews with its certificate of the replaced issuing CA")

	st := m.Status()
	assert.NotEqual(t, firstSerial, st.Serial)
	assert.Empty(t, st.LastError, "no renewal was refused")
	assert.False(t, secrets.HasToken(), "bootstrapped once")
	assert.Equal(t, 1+st.Renewals, secrets.Saves(), "one bootstrap, then renewals only")
	certPEM, _, err := secrets.LoadCredential(ctx)
	require.NoError(t, err)
	block, _ := pem.Decode(certPEM)
	require.NotNil(t, block)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	assert.NoError(t, cert.CheckSignatureFrom(second.Issuing.Cert), "the renewed certificate comes from the new issuing CA")
	assert.Zero(t, a.Series(t, server.MetricRefusedCalls, "reason")["foreign_issuer"], "no agent certificate refused as foreign")
	for _, s := range f.States() {
		assert.True(t, s.Connected, "%s holds its session", s.Cluster)
		assert.Zero(t, s.Reconnects, "%s lost no session", s.Cluster)
		assert.Equal(t, 1, s.BootstrapAttempts, "%s bootstrapped once", s.Cluster)
	}
}
