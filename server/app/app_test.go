package app

import (
	"context"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/backend"
	"github.com/relaymesh/relaymesh/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
)

// names are the names of tasks.
func names(tasks []onceOnlyTask) []string {
	var out []string
	for _, t := range tasks {
		out = append(out, t.name)
	}
	return out
}

// The once-only table is the whole difference between one replica and
// several: the only replica runs the work every setup needs (and writes
// its serving secret at once, outside the table); several replicas add the
// session sweep, the replica Leases' collection, the serving secret and
// the output heads; Redis, kubeconfig-mode clusters and the webhook add
// their own rows.
func TestOnceOnlyWorkDependsOnlyOnTheSetup(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup setup
		want  []string
	}{
		{"the only replica", setup{}, []string{"token-mint-audit", "spent-token-collection", "relay-issuer-renewal", "relay-root-rotation", "orphan-collection", "status-and-rotation", "spiffe-import"}},
		{"several replicas", setup{several: true}, []string{"token-mint-audit", "spent-token-collection", "session-sweep", "replica-lease-collection",
			"serving-secret", "relay-issuer-renewal", "relay-root-rotation", "orphan-collection", "ack-ledger-collection", "output-heads", "status-and-rotation", "spiffe-import"}},
		{"the only replica with everything", setup{redis: true, kubeconfig: true, webhook: true}, []string{"token-mint-audit", "spent-token-collection",
			"relay-issuer-renewal", "relay-root-rotation", "snapshot-store-collection", "orphan-collection", "status-and-rotation", "spiffe-import", "kubeconfig-clusters", "webhook-configuration"}},
		{"several replicas with everything", setup{several: true, redis: true, kubeconfig: true, webhook: true}, []string{"token-mint-audit", "spent-token-collection",
			"session-sweep", "replica-lease-collection", "serving-secret", "relay-issuer-renewal", "relay-root-rotation", "snapshot-store-collection", "orphan-collection",
			"ack-ledger-collection", "output-heads", "status-and-rotation", "spiffe-import", "kubeconfig-clusters", "webhook-configuration"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, names(tasksFor(tc.setup)))
		})
	}
	seen := map[string]bool{}
	for _, task := range onceOnlyWork {
		assert.False(t, seen[task.name], "task %s is in the table twice", task.name)
		seen[task.name] = true
		require.NotNil(t, task.when, task.name)
		require.NotNil(t, task.run, task.name)
	}
}

// With several replicas, the replica holding a cluster's session writes its
// discovered objects; the leader deletes those of a cluster registered in
// neither mode; no one else touches them.
func TestOnlyTheSessionHolderOrTheLeaderOwnsDiscoveredObjects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		place clusterPlace
		owns  bool
	}{
		{"session here", clusterPlace{session: true, relay: true}, true},
		{"session here while leading", clusterPlace{session: true, relay: true, leading: true}, true},
		{"registered, session elsewhere", clusterPlace{relay: true}, false},
		{"registered, session elsewhere, leading", clusterPlace{relay: true, leading: true}, false},
		{"kubeconfig mode, run by another leader", clusterPlace{kubeconfig: true}, false},
		{"kubeconfig mode while leading but not yet discovered", clusterPlace{kubeconfig: true, leading: true}, false},
		{"deregistered, following", clusterPlace{}, false},
		{"deregistered, leading: the leader deletes", clusterPlace{leading: true}, true},
		{"deregistered, last snapshot still here", clusterPlace{session: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.owns, ownsDiscovered(tc.place))
		})
	}
	assert.True(t, isRegistered(clusterPlace{relay: true}))
	assert.True(t, isRegistered(clusterPlace{kubeconfig: true}))
	assert.False(t, isRegistered(clusterPlace{session: true, leading: true}), "a session alone does not register a cluster")
}

// Several replicas read acknowledgements from the clusters' status (the
// leader sees every agent's) and forget a snapshot when its session moves
// on; the only replica reads its own view and keeps nothing to release.
func TestSeveralReplicasShareAcksThroughStatusAndReleaseMovedSessions(t *testing.T) {
	view := server.NewView()
	status := server.NewKubeStatus(nil, "relaymesh", slog.New(slog.DiscardHandler), server.StatusConfig{Replica: "r1"})
	assert.Same(t, status, acksFrom(true, view, status))
	assert.Same(t, view, acksFrom(false, view, status))
	_, releases := sessionSink(true, status, view, nil).(releasingSink)
	assert.True(t, releases)
	assert.Same(t, status, sessionSink(false, status, view, nil))
}

// A replica's name is the flag, else $POD_NAME, else host and process ID,
// made a DNS subdomain; two processes on one host get two names.
func TestReplicaNameIsUniquePerProcessAndADNSSubdomain(t *testing.T) {
	for _, tc := range []struct {
		flag, pod, host string
		pid             int
		want            string
	}{
		{"server-0", "pod-1", "host", 7, "server-0"},
		{"", "relaymesh-server-5d8f", "host", 7, "relaymesh-server-5d8f"},
		{"", "", "Build_Host.local", 42, "build-host.local-42"},
		{"", "", "", 9, "9"},
		{"", "", "-.x.-", 1, "x.--1"},
	} {
		assert.Equal(t, tc.want, ReplicaName(tc.flag, tc.pod, tc.host, tc.pid), "%+v", tc)
	}
	long := ReplicaName(strings.Repeat("a", 500), "", "", 0)
	assert.LessOrEqual(t, len(long), 200)
}

// The default Config validates once an audit log is named, and every bad
// field is reported with the flag it comes from.
func TestConfigErrorsNameTheirFlag(t *testing.T) {
	ok := Default()
	ok.AuditLog = "audit.log"
	require.NoError(t, ok.Validate())
	require.ErrorContains(t, Default().Validate(), "--audit-log is required")
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.LogLevel = "loud" }, "--log-level"},
		{func(c *Config) { c.TrustDomain = "Not A Domain" }, "--trust-domain"},
		{func(c *Config) { c.RenewDeadline = c.LeaseDuration }, "--leader-renew-deadline < --leader-lease-duration"},
		{func(c *Config) { c.ReplicaName = "Replica_0" }, "--replica-name"},
		{func(c *Config) { c.Namespace = "" }, "--namespace"},
		{func(c *Config) { c.Webhook.URL = "https://x/validate" }, "--webhook-url and --webhook-service need --webhook-listen"},
		{func(c *Config) { c.Webhook.Listen, c.Webhook.Service = ":9443", "x/y:0" }, "--webhook-service"},
		{func(c *Config) { c.DebugEndpoints = "public" }, "--debug-endpoints"},
		{func(c *Config) { c.CA.CertFile = "c.pem" }, "--ca-cert, --ca-key and --ca-roots go together"},
		{func(c *Config) { c.CA = CAConfig{CertFile: "c", KeyFile: "k", RootsFile: "r", Secret: "s"} }, "--ca-secret"},
		{func(c *Config) { c.CA.Secret, c.CA.ConfigFile = "s", "ca.yaml" }, "--ca-cert/--ca-key/--ca-roots, --ca-secret and --ca-config are alternatives"},
		{func(c *Config) {
			c.CA.CertFile, c.CA.KeyFile, c.CA.RootsFile, c.CA.ConfigFile = "c", "k", "r", "ca.yaml"
		}, "--ca-config are alternatives"},
		{func(c *Config) { c.CA.ConfigFile = " ca.yaml" }, "--ca-config"},
		{func(c *Config) { c.ServerDNSNames, c.ServerIPs = nil, nil }, "--server-dns-names or --server-ips"},
		{func(c *Config) { c.ServerIPs = []string{"10.0.0.300"} }, "--server-ips"},
		{func(c *Config) { c.Connections.MaxPreAuthPerAddress = 0 }, "--max-preauth-connections-per-address"},
		{func(c *Config) { c.KubeQPS = 0 }, "--kube-qps"},
		{func(c *Config) { c.Clusters.MaxSessions = -1 }, "--cluster-max-streams"},
		{func(c *Config) { c.SnapshotStore.Kind = "etcd2" }, "--snapshot-store"},
		{func(c *Config) { c.SnapshotStore.Address = "redis:6379" }, "--redis-address needs --snapshot-store=redis"},
		{func(c *Config) { c.CA.IssuerTTL = 30 * time.Second }, "--relay-issuer-ttl 30s: must be at least 1m"},
		{func(c *Config) { c.CA.IssuerRenewAt = 0.95 }, "--relay-issuer-renew-at"},
		{func(c *Config) { c.CA.IssuerRenewAt = 0 }, "--relay-issuer-renew-at"},
		{func(c *Config) { c.CA.IssuerCheck = 0 }, "--relay-issuer-check-interval"},
		{func(c *Config) { c.CA.IssuerTTL = 48 * time.Hour }, "less than --agent-cert-ttl 24h0m0s plus two --relay-issuer-check-interval"},
		{func(c *Config) { c.CA.RootRenewAt = 0.95 }, "--relay-root-renew-at 0.95: must be 0 (no automatic start) or in [0.1, 0.9]"},
		{func(c *Config) { c.CA.RootRenewAt = 0.05 }, "--relay-root-renew-at 0.05"},
		{func(c *Config) { c.CA.RootRenewAt = -0.5 }, "--relay-root-renew-at -0.5"},
		{func(c *Config) { c.CA.RootRenewAt = math.NaN() }, "--relay-root-renew-at NaN"},
		{func(c *Config) { c.CA.RootRenewAt = math.Inf(1) }, "--relay-root-renew-at +Inf"},
		{func(c *Config) { c.CA.RootGrace = -time.Hour }, "--relay-root-grace -1h0m0s: must not be negative"},
		{func(c *Config) { c.CA.RootGrace = time.Nanosecond }, "--relay-root-grace 1ns: shorter than --agent-cert-ttl 24h0m0s plus two --relay-issuer-check-interval 1m0s (24h2m0s)"},
		// One second short of the least grace strands the agents that
		// renewed just before a replica noticed the switch.
		{func(c *Config) { c.CA.RootGrace = 24*time.Hour + 2*time.Minute - time.Second }, "--relay-root-grace 24h1m59s: shorter than --agent-cert-ttl"},
		{func(c *Config) { c.CA.RootGrace, c.AgentCertTTL = 48*time.Hour, 72*time.Hour }, "--relay-root-grace 48h0m0s: shorter than --agent-cert-ttl 72h0m0s"},
		{func(c *Config) { c.CA.RootGrace, c.CA.IssuerCheck = 24*time.Hour+time.Hour, time.Hour }, "plus two --relay-issuer-check-interval 1h0m0s (26h0m0s)"},
	} {
		c := ok
		tc.edit(&c)
		err := c.Validate()
		require.Error(t, err, tc.want)
		assert.Contains(t, err.Error(), tc.want)
	}
	noElection := ok
	noElection.LeaderElect, noElection.LeaseDuration, noElection.RenewDeadline, noElection.RetryPeriod = false, 0, 0, 0
	assert.NoError(t, noElection.Validate(), "the only replica needs no Lease timing")
}

// The relay root rotation's knobs: 0 turns the automatic start off, an
// unset grace is the least one that strands no agent, and the once-only
// task gets exactly what was configured.
func TestRelayRootRotationConfigFromTheFlags(t *testing.T) {
	base := Default()
	base.AuditLog = "audit.log"
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want ca.RootRotationConfig
	}{
		{"defaults", func(*Config) {}, ca.RootRotationConfig{RenewAt: ca.DefaultIssuerRenewAt, Grace: 24*time.Hour + 2*time.Minute}},
		{"grace follows the agent lifetime and the check", func(c *Config) { c.AgentCertTTL, c.CA.IssuerCheck = time.Hour, 10*time.Second },
			ca.RootRotationConfig{RenewAt: ca.DefaultIssuerRenewAt, Grace: time.Hour + 20*time.Second}},
		{"the least grace given", func(c *Config) { c.CA.RootGrace = 24*time.Hour + 2*time.Minute },
			ca.RootRotationConfig{RenewAt: ca.DefaultIssuerRenewAt, Grace: 24*time.Hour + 2*time.Minute}},
		{"a longer grace and renew-at", func(c *Config) { c.CA.RootGrace, c.CA.RootRenewAt = 72*time.Hour, 0.5 },
			ca.RootRotationConfig{RenewAt: 0.5, Grace: 72 * time.Hour}},
		{"bounds", func(c *Config) { c.CA.RootRenewAt = 0.9 }, ca.RootRotationConfig{RenewAt: 0.9, Grace: 24*time.Hour + 2*time.Minute}},
		{"no automatic start", func(c *Config) { c.CA.RootRenewAt = 0 },
			ca.RootRotationConfig{Manual: true, Grace: 24*time.Hour + 2*time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			require.NoError(t, c.Validate())
			got := c.CA.rootRotation(c.AgentCertTTL)
			assert.Equal(t, tc.want, got)
			require.NoError(t, got.Default().Validate(), "what the task hands ca.StepRootRotation is valid there")
		})
	}
}

// The webhook's target comes from exactly one of URL and Service, and its
// certificate names default to theirs.
func TestWebhookTargetNamesWhatTheAPIServerDials(t *testing.T) {
	w := WebhookConfig{Listen: ":9443", FailurePolicy: "Fail", Service: "relaymesh/relaymesh-webhook:443"}
	target, err := w.Target()
	require.NoError(t, err)
	assert.Equal(t, []string{"relaymesh-webhook.relaymesh.svc", "relaymesh-webhook.relaymesh.svc.cluster.local"}, target.DNSNames)
	assert.Equal(t, int32(443), target.Registration.ServicePort)
	w.Service, w.URL = "", "https://127.0.0.1:9443/validate"
	target, err = w.Target()
	require.NoError(t, err)
	require.Len(t, target.IPs, 1)
	assert.Equal(t, "127.0.0.1", target.IPs[0].String())
	w.DNSNames, w.IPs = []string{"hook.example"}, []string{"10.0.0.1"}
	target, err = w.Target()
	require.NoError(t, err)
	assert.Equal(t, []string{"hook.example"}, target.DNSNames)
	assert.Equal(t, "10.0.0.1", target.IPs[0].String())
	w.IPs = []string{strings.Repeat("x", 10000)}
	_, err = w.Target()
	require.ErrorContains(t, err, "--webhook-ips")
	assert.Less(t, len(err.Error()), 200, "a hostile value is truncated in the error")
}

// The relay CA's signer comes from the one back-end list: the generated
// CA by default, the secret back end for provided files or a Secret; each
// selection is a valid ca/backend configuration.
func TestRelayCASignerComesFromTheBackendList(t *testing.T) {
	client := fake.NewClientset()
	for _, tc := range []struct {
		name string
		ca   CAConfig
		want backend.Type
	}{
		{"generated", CAConfig{}, backend.Generated},
		{"files", CAConfig{CertFile: "c.pem", KeyFile: "k.pem", RootsFile: "r.pem"}, backend.Secret},
		{"secret", CAConfig{Secret: "corp-ca"}, backend.Secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.CA = tc.ca
			b := c.signerBackend(client, time.Now)
			assert.Equal(t, tc.want, b.Type)
			assert.NoError(t, b.Default().Validate())
		})
	}
	c := Default()
	c.CA.Secret = "corp-ca"
	b := c.signerBackend(client, time.Now)
	assert.Equal(t, "corp-ca", b.Secret.Name)
	assert.Equal(t, c.Namespace, b.Secret.Namespace)
	assert.Equal(t, []string{"corp-ca"}, c.reservedSecrets(), "a provided CA's Secret can never become a mesh root")
}

// A --ca-config that does not build fails the start with the flag, the
// file and the field named, a secret written into it never echoed, and
// nothing published.
func TestBadCAConfigFailsTheStartNamingTheFlag(t *testing.T) {
	dir := t.TempDir()
	const secret = "5ecret-0f9e8d7c6b5a"
	for _, tc := range []struct{ name, file, want string }{
		{"missing", "", "no such file"},
		{"inline PIN", "type: pkcs11\npkcs11:\n  pin: " + secret + "\n", "pkcs11.pin: a secret is never written in the file"},
		{"generated", "type: generated\n", "has its own flags"},
		{"no PIN source", "type: pkcs11\npkcs11:\n  modulePath: /m.so\n  tokenLabel: t\n  keyLabel: k\n  chainFile: c\n  rootsFile: r\n", "pkcs11.pinFile, pinEnv: one is required"},
		{"cfssl over plain http off-host", "type: cfssl\ncfssl:\n  url: http://cfssl.example\n  authKeyEnv: K\n  chainFile: c\n  rootsFile: r\n", "cfssl.url"},
		{"a chain file that is not there", "type: stepca\nstepca:\n  url: https://127.0.0.1:1\n  provisioner: p\n  provisionerKeyFile: k\n  chainFile: /nonexistent/chain.pem\n  rootsFile: r\n", "chainFile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if tc.file != "" {
				require.NoError(t, os.WriteFile(path, []byte(tc.file), 0o600))
			}
			c := Default()
			c.AuditLog = "audit.log"
			c.CA.ConfigFile = path
			require.NoError(t, c.Validate(), "the flags are valid; the file is read at start")
			p := &process{cfg: c, log: slog.New(slog.DiscardHandler)}
			err := p.newSigner(context.Background())
			require.Error(t, err)
			assert.Contains(t, err.Error(), "--ca-config")
			assert.Contains(t, err.Error(), path)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), secret)
			assert.Nil(t, p.signer, "nothing is used")
		})
	}
}
