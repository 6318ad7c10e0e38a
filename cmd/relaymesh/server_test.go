package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/server/app"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// `relaymesh server` without flags is app.Default(): every flag's default
// is the Config field it maps to, so the flags and the composition root
// cannot drift apart.
func TestServerFlagDefaultsAreTheAppDefaults(t *testing.T) {
	c := newServerCommand(deps{}, &globals{})
	d := app.Default()
	for flag, want := range map[string]string{
		"listen":                              d.Listen,
		"metrics-listen":                      d.MetricsListen,
		"trust-domain":                        d.TrustDomain,
		"server-dns-names":                    strings.Join(d.ServerDNSNames, ","),
		"server-ips":                          strings.Join(d.ServerIPs, ","),
		"log-level":                           d.LogLevel,
		"agent-cert-ttl":                      d.AgentCertTTL.String(),
		"relay-issuer-ttl":                    d.CA.IssuerTTL.String(),
		"relay-issuer-renew-at":               fmt.Sprint(d.CA.IssuerRenewAt),
		"relay-issuer-check-interval":         d.CA.IssuerCheck.String(),
		"relay-root-renew-at":                 fmt.Sprint(d.CA.RootRenewAt),
		"relay-root-grace":                    d.CA.RootGrace.String(),
		"webhook-failure-policy":              d.Webhook.FailurePolicy,
		"debug-endpoints":                     d.DebugEndpoints,
		"kube-qps":                            fmt.Sprint(d.KubeQPS),
		"leader-elect":                        fmt.Sprint(d.LeaderElect),
		"leader-lease-duration":               d.LeaseDuration.String(),
		"leader-renew-deadline":               d.RenewDeadline.String(),
		"leader-retry-period":                 d.RetryPeriod.String(),
		"max-connections":                     fmt.Sprint(d.Connections.MaxConnections),
		"max-connections-per-address":         fmt.Sprint(d.Connections.MaxConnectionsPerAddress),
		"max-preauth-connections":             fmt.Sprint(d.Connections.MaxPreAuth),
		"max-preauth-connections-per-address": fmt.Sprint(d.Connections.MaxPreAuthPerAddress),
		"connection-streams-per-second":       fmt.Sprint(d.Connections.StreamsPerSecond),
		"cluster-renewals-per-minute":         fmt.Sprint(d.Clusters.RenewsPerMinute),
		"cluster-max-streams":                 fmt.Sprint(d.Clusters.MaxSessions),
		"snapshot-store":                      d.SnapshotStore.Kind,
		"allow-shared-token":                  fmt.Sprint(d.AllowSharedToken),
		"allow-kubeconfig-clusters":           fmt.Sprint(d.AllowKubeconfigClusters),
		"metrics-plain-http":                  fmt.Sprint(d.MetricsTLS.PlainHTTP),
	} {
		f := c.Flags().Lookup(flag)
		require.NotNil(t, f, flag)
		assert.Equal(t, want, f.DefValue, "--%s", flag)
	}
}

// The flags map onto the Config field by field: a Config made from flags
// validates exactly when the flags do, and carries their values.
func TestServerFlagsMapOntoTheConfig(t *testing.T) {
	f := serverFlags{namespace: "relaymesh", listen: "127.0.0.1:0", metricsListen: "127.0.0.1:0", trustDomain: "example.org",
		dnsNames: "a, b", ips: "10.0.0.1", auditLog: "a.log", logLevel: "debug", caSecret: "corp-ca", replicaName: "server-1",
		webhookListen: ":9443", webhookService: "relaymesh/hook", webhookDNSNames: "hook.example", webhookFailurePolicy: "Ignore",
		webhookAllowUnauthenticated: true, debugEndpoints: "off", kubeQPS: 50, leaderElect: true}
	f.conns = app.Default().Connections
	f.clusters = app.Default().Clusters
	f.leaseDuration, f.renewDeadline, f.retryPeriod = app.Default().LeaseDuration, app.Default().RenewDeadline, app.Default().RetryPeriod
	f.store.kind = snapshotStoreAPIServer
	f.issuerTTL, f.issuerRenewAt, f.issuerCheck = time.Hour, 0.5, 5*time.Second
	f.rootRenewAt, f.rootGrace = 0.75, time.Hour
	f.agentTTL = 10 * time.Minute
	require.NoError(t, f.validate())
	cfg := f.config()
	assert.Equal(t, []string{"a", "b"}, cfg.ServerDNSNames)
	assert.Equal(t, []string{"10.0.0.1"}, cfg.ServerIPs)
	assert.Equal(t, "corp-ca", cfg.CA.Secret)
	assert.Equal(t, []string{"hook.example"}, cfg.Webhook.DNSNames)
	assert.Equal(t, "Ignore", cfg.Webhook.FailurePolicy)
	assert.True(t, cfg.Webhook.AllowUnauthenticated)
	assert.Equal(t, "server-1", cfg.ReplicaName)
	assert.Equal(t, app.CAConfig{Secret: "corp-ca", IssuerTTL: time.Hour, IssuerRenewAt: 0.5, IssuerCheck: 5 * time.Second,
		RootRenewAt: 0.75, RootGrace: time.Hour}, cfg.CA)
	f.ips = "10.0.0.1,not-an-ip"
	require.ErrorContains(t, f.validate(), "--server-ips")
}
