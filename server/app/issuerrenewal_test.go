package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/server/app/apptest"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTwoIssuerRenewalsStrandNoAgent runs three whole-server replicas with
// issuing CAs of 150s renewed every 23s, and agent certificates of two
// minutes: the agents bootstrap from the first issuing CA and renew with
// that certificate after the second renewal. Real credential managers (identity.Manager)
// renew their certificates against every replica, the Lease holder's and
// the others', and simulated agents hold sessions, through two renewals:
// no Renew is refused, nobody bootstraps again, no session ends, and every
// replica issues from the newest issuing CA.
func TestTwoIssuerRenewalsStrandNoAgent(t *testing.T) {
	ctx := context.Background()
	ns := "issuer-renewal"
	kube := apptest.Management(t, ns)
	var apps []*apptest.App
	for i := range 3 {
		cfg := apptest.AppConfig(t, ns, fmt.Sprintf("replica-%d", i))
		// Agent certificates are backdated by a minute: two minutes of
		// life renew after one. Issuing CAs of 150s renewed at 0.15 of
		// their life turn over every 23s, keeping each replaced one for
		// the 2m2s its certificates may live.
		cfg.AgentCertTTL = 2 * time.Minute
		cfg.CA.IssuerTTL, cfg.CA.IssuerRenewAt, cfg.CA.IssuerCheck = 150*time.Second, 0.15, time.Second
		apps = append(apps, apptest.LaunchApp(t, kube, cfg))
	}
	var addrs []string
	for _, a := range apps {
		a.WaitServing(t)
		addrs = append(addrs, a.Addrs.Relay)
	}
	rootSecret, err := kube.Typed.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	rootsPEM := rootSecret.Data["ca.crt"]

	mgmt, err := fleet.NewManagement(ctx, kube.Config, ns)
	require.NoError(t, err)
	members, err := mgmt.Register(ctx, fleet.ClusterNames("renew", 6), time.Hour, 3)
	require.NoError(t, err)

	// Three credential managers, one per replica.
	type managed struct {
		m       *identity.Manager
		secrets *identitytest.MemAgentSecrets
	}
	var managers []managed
	var agentLogs syncbuf.Buffer
	defer func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", agentLogs.String())
			for i, a := range apps {
				for _, l := range strings.Split(a.Logs.String(), "\n") {
					if strings.Contains(l, "WARN") || strings.Contains(l, "ERROR") || strings.Contains(l, "issuing CA") || strings.Contains(l, "refused") {
						t.Logf("replica-%d: %s", i, l)
					}
				}
			}
		}
	}()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, mem := range members[:3] {
		secrets := identitytest.NewMemAgentSecrets(rootsPEM, mem.Token)
		m, err := identity.NewManager(identity.ManagerConfig{Cluster: mem.Cluster, ServerAddress: addrs[i], ServerName: "localhost",
			Secrets: secrets, Logger: slog.New(slog.NewTextHandler(&agentLogs, nil)), Jitter: func() float64 { return 0 }, Retry: backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}})
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { _ = m.Run(runCtx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		managers = append(managers, managed{m, secrets})
	}
	// Three agents holding sessions, one per replica.
	roots, err := mgmt.RelayRoots(ctx)
	require.NoError(t, err)
	f, err := fleet.NewFleet(fleet.FleetConfig{Servers: addrs, ServerName: "localhost", Roots: roots, Members: members[3:], SourceOffset: 9100})
	require.NoError(t, err)
	f.Start(runCtx)
	defer f.Stop()
	require.NoError(t, f.Wait(ctx, "sessions", fleet.Connected))

	generation := func(a *apptest.App) float64 { return a.Series(t, app.MetricRelayIssuerGeneration, "")[""] }
	require.Eventually(t, func() bool {
		for _, a := range apps {
			if generation(a) < 3 {
				return false
			}
		}
		for _, mm := range managers {
			if mm.m.Status().Renewals < 1 {
				return false
			}
		}
		return true
	}, 4*time.Minute, 500*time.Millisecond, "every replica reaches the third issuing CA, and every manager renews its first certificate after that")

	renewals := 0.0
	for _, a := range apps {
		renewals += a.Series(t, app.MetricRelayIssuerRenewals, "")[""]
		assert.Zero(t, a.Series(t, server.MetricRefusedCalls, "reason")["foreign_issuer"], "no agent certificate refused as foreign")
	}
	assert.GreaterOrEqual(t, renewals, 2.0, "two renewals, by the Lease holders")
	for _, mm := range managers {
		st := mm.m.Status()
		assert.True(t, st.Ready, "%+v", st)
		assert.GreaterOrEqual(t, st.Renewals, 1, "renewed with its first certificate, of a replaced issuing CA")
		assert.Empty(t, st.LastError, "no renewal was refused")
		assert.False(t, mm.secrets.HasToken(), "bootstrapped once")
		assert.Equal(t, 1+st.Renewals, mm.secrets.Saves(), "one bootstrap, then renewals only")
	}
	for _, st := range f.States() {
		assert.True(t, st.Connected, "%s holds its session", st.Cluster)
		assert.Zero(t, st.Reconnects, "%s lost no session", st.Cluster)
		assert.Equal(t, 1, st.BootstrapAttempts, "%s bootstrapped once", st.Cluster)
		assert.NoError(t, st.Refused)
	}
	signing, err := kube.Typed.CoreV1().Secrets(ns).Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, string(signing.Data["previous.crt"]), "BEGIN CERTIFICATE", "the replaced issuing CA is kept")
	assert.False(t, strings.Contains(string(signing.Data["previous.crt"]), "PRIVATE KEY"), "never its key")
}
