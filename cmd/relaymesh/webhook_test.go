package main

import (
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/relay"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The webhook flags are checked before anything starts, each problem with
// a message naming the flag.
func TestWebhookFlags(t *testing.T) {
	base := serverFlags{auditLog: "a.log", namespace: "relaymesh", logLevel: "info", trustDomain: "relaymesh.local", issuerTTL: 365 * 24 * time.Hour, issuerRenewAt: ca.DefaultIssuerRenewAt, issuerCheck: time.Minute, webhookFailurePolicy: "Fail", dnsNames: "localhost", webhookClientCA: "apiserver-client-ca.pem", debugEndpoints: "authenticated",
		conns: relay.ConnectionLimits{MaxConnections: 1, MaxConnectionsPerAddress: 1, MaxPreAuth: 1, MaxPreAuthPerAddress: 1, StreamsPerSecond: 50}, clusters: relay.ClusterLimits{RenewsPerMinute: 1, MaxSessions: 1}, kubeQPS: 200}
	for _, tc := range []struct {
		name string
		edit func(*serverFlags)
		want string
	}{
		{"url without listen", func(f *serverFlags) { f.webhookURL = "https://127.0.0.1:9443/validate" }, "need --webhook-listen"},
		{"neither url nor service", func(f *serverFlags) { f.webhookListen = ":9443" }, "exactly one of --webhook-url and --webhook-service"},
		{"both", func(f *serverFlags) {
			f.webhookListen, f.webhookURL, f.webhookService = ":9443", "https://x/validate", "relaymesh/hook"
		}, "exactly one of"},
		{"plain http", func(f *serverFlags) { f.webhookListen, f.webhookURL = ":9443", "http://127.0.0.1:9443/validate" }, "an https URL is required"},
		{"service without namespace", func(f *serverFlags) { f.webhookListen, f.webhookService = ":9443", "hook" }, "NAMESPACE/NAME[:PORT]"},
		{"service bad port", func(f *serverFlags) { f.webhookListen, f.webhookService = ":9443", "relaymesh/hook:99999" }, "bad port"},
		{"bad ip", func(f *serverFlags) {
			f.webhookListen, f.webhookURL, f.webhookIPs = ":9443", "https://127.0.0.1:9443/validate", "not-an-ip"
		}, "not an IP address"},
		{"bad failure policy", func(f *serverFlags) {
			f.webhookListen, f.webhookURL, f.webhookFailurePolicy = ":9443", "https://127.0.0.1:9443/validate", "Sometimes"
		}, "use Fail or Ignore"},
		{"no way to authenticate the apiserver", func(f *serverFlags) {
			f.webhookListen, f.webhookURL, f.webhookClientCA = ":9443", "https://127.0.0.1:9443/validate", ""
		}, "needs --webhook-client-ca"},
		{"client CA and unauthenticated both", func(f *serverFlags) {
			f.webhookListen, f.webhookURL, f.webhookAllowUnauthenticated = ":9443", "https://127.0.0.1:9443/validate", true
		}, "not both"},
		{"bad debug endpoints", func(f *serverFlags) { f.debugEndpoints = "public" }, "use authenticated or off"},
		{"no connections", func(f *serverFlags) { f.conns.MaxConnections = 0 }, "--max-connections must be at least 1"},
		{"no renewals", func(f *serverFlags) { f.clusters.RenewsPerMinute = -1 }, "--cluster-renewals-per-minute must be positive"},
		{"no streams", func(f *serverFlags) { f.conns.StreamsPerSecond = 0 }, "--connection-streams-per-second must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := base
			tc.edit(&f)
			err := f.validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	f := base
	f.webhookListen, f.webhookService = ":9443", "relaymesh/relaymesh-webhook:443"
	require.NoError(t, f.validate())
	target, err := f.config().Webhook.Target()
	require.NoError(t, err)
	assert.Equal(t, []string{"relaymesh-webhook.relaymesh.svc", "relaymesh-webhook.relaymesh.svc.cluster.local"}, target.DNSNames)
	assert.Equal(t, int32(443), target.Registration.ServicePort)
	f.webhookListen, f.webhookService, f.webhookURL = ":9443", "", "https://127.0.0.1:9443/validate"
	target, err = f.config().Webhook.Target()
	require.NoError(t, err)
	require.Len(t, target.IPs, 1)
	assert.Equal(t, "127.0.0.1", target.IPs[0].String())
}
