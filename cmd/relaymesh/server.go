package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/relay"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const serverSynopsis = `Runs the management server in the management cluster: the relay CA, the
identity service agents bootstrap and renew with, and their sessions.

On first start it generates the relay root and issuing CA into the secrets
relay-root-tls-secret and relay-tls-signing-secret of --namespace (or uses a
provided CA: --ca-cert/--ca-key/--ca-roots). Every token use, issuance,
renewal, denial, revocation and admission decision goes to --audit-log.

Admission: every VirtualMesh, TrafficPolicy, AccessPolicy and
VirtualDestination is judged by the built-in OPA rules and the rule sets in
ConfigMaps labelled relaymesh.io/admission-policy in --namespace (reloaded
on change). With --webhook-listen and --webhook-url or --webhook-service the
server also registers a ValidatingWebhookConfiguration so kubectl is told at
once; without it, refused objects are created but marked Invalid and never
translated.`

type serverFlags struct {
	namespace, listen, metricsListen, trustDomain     string
	dnsNames, ips, auditLog, logLevel                 string
	caCert, caKey, caRoots, caSecret, caConfig        string
	agentTTL                                          time.Duration
	issuerTTL, issuerCheck, rootGrace                 time.Duration
	issuerRenewAt, rootRenewAt                        float64
	allowSharedToken, allowKubeconfig                 bool
	webhookListen, webhookURL, webhookService         string
	webhookDNSNames, webhookIPs, webhookFailurePolicy string
	webhookClientCA, debugEndpoints                   string
	webhookAllowUnauthenticated                       bool
	dash                                              dashboardServeFlags
	pkcs11Modules                                     []string
	kubeQPS                                           float64
	replicaName                                       string
	leaderElect                                       bool
	leaseDuration, renewDeadline, retryPeriod         time.Duration
	conns                                             relay.ConnectionLimits
	clusters                                          relay.ClusterLimits
	store                                             snapshotStoreFlags
	metricsTLS                                        app.MetricsTLSConfig
	metricsDNSNames, metricsIPs                       string
	bundle                                            spiffeBundleFlags
}

func newServerCommand(d deps, g *globals) *cobra.Command {
	var f serverFlags
	c := &cobra.Command{
		Use:   "server",
		Short: "Run the management server (relay gRPC :9900, metrics/health/debug :9091)",
		Long:  serverSynopsis,
		Example: `  # In the management cluster (the chart runs this); the relay CA is generated at first start
  relaymesh server --audit-log /var/log/relaymesh/audit.log

  # On a workstation against a management cluster context, with the admission webhook
  relaymesh server --context mgmt --audit-log audit.log --webhook-listen :9443 \
    --webhook-url https://relaymesh.example.com:9443/validate --webhook-client-ca apiserver-webhook-client-ca.pem`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			f.namespace = g.namespace
			if err := f.validate(); err != nil {
				return usageError{err}
			}
			src, err := g.source()
			if err != nil {
				return err
			}
			src.QPS, src.Burst = float32(f.kubeQPS), int(2*f.kubeQPS)
			kube, err := src.Load()
			if err != nil {
				return err
			}
			return runServer(c.Context(), f, kube, d)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.listen, "listen", ":9900", "relay gRPC address")
	fs.StringVar(&f.metricsListen, "metrics-listen", ":9091", "metrics, health and debug address (/metrics, /healthz, /readyz, /debug/*), served over TLS (see --metrics-tls-cert)")
	fs.StringVar(&f.metricsTLS.CertFile, "metrics-tls-cert", "", "PEM file of the metrics port's serving certificate (then its intermediates), reloaded when it changes; default: a certificate from the relay CA for --metrics-dns-names and --metrics-ips, renewed like the relay port's (Prometheus and relaymesh verify it against the relay root, relay-root-tls-secret ca.crt)")
	fs.StringVar(&f.metricsTLS.KeyFile, "metrics-tls-key", "", "PEM file of the private key of --metrics-tls-cert")
	fs.StringVar(&f.metricsDNSNames, "metrics-dns-names", "", "comma-separated DNS names of the metrics port's relay-CA certificate (default: --server-dns-names and localhost)")
	fs.StringVar(&f.metricsIPs, "metrics-ips", "", "comma-separated IPs of the metrics port's relay-CA certificate (default: --server-ips, 127.0.0.1 and ::1)")
	fs.BoolVar(&f.metricsTLS.PlainHTTP, "metrics-plain-http", false, "WEAKER: serve the metrics port over plain HTTP, without TLS; allowed only on a loopback --metrics-listen (e.g. 127.0.0.1:9091); relaymesh then sends a /debug token only to a loopback address")
	fs.StringVar(&f.trustDomain, "trust-domain", "relaymesh.local", "SPIFFE trust domain of agent identities")
	fs.StringVar(&f.dnsNames, "server-dns-names", "localhost,relaymesh-server,relaymesh-server.relaymesh.svc", "comma-separated DNS names in the server certificate (agents verify one of them)")
	fs.StringVar(&f.ips, "server-ips", "127.0.0.1", "comma-separated IP addresses in the server certificate")
	fs.StringVar(&f.auditLog, "audit-log", "", "path of the hash-chained audit log (required)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	f.registerCA(fs)
	fs.BoolVar(&f.allowSharedToken, "allow-shared-token", false, "WEAKER: also accept the shared token of relay-identity-token-secret (seed-product compatibility)")
	fs.StringVar(&f.webhookListen, "webhook-listen", "", "serve the admission webhook (HTTPS) on this address, e.g. :9443; empty: no webhook, only the in-process check before translation")
	fs.StringVar(&f.webhookURL, "webhook-url", "", "URL the kube-apiserver calls the webhook at (https://…/validate); or --webhook-service")
	fs.StringVar(&f.webhookService, "webhook-service", "", "Service the kube-apiserver calls the webhook through, NAMESPACE/NAME[:PORT]; or --webhook-url")
	fs.StringVar(&f.webhookDNSNames, "webhook-dns-names", "", "comma-separated DNS names of the webhook's certificate (default: the URL's host, or the Service's names)")
	fs.StringVar(&f.webhookIPs, "webhook-ips", "", "comma-separated IPs of the webhook's certificate (default: the URL's host if it is an IP)")
	fs.StringVar(&f.webhookFailurePolicy, "webhook-failure-policy", "Fail", "Fail (an unreachable webhook blocks changes) or WEAKER Ignore (changes pass while it is down; the in-process check still marks refused objects Invalid)")
	fs.StringArrayVar(&f.pkcs11Modules, "pkcs11-module", nil, "a PKCS#11 module a VirtualMesh's spec.mtls.shared.rootCA.pkcs11.modulePath may name (repeatable; none: pkcs11 roots are refused, so a VirtualMesh cannot make the server load an arbitrary library)")
	fs.BoolVar(&f.allowKubeconfig, "allow-kubeconfig-clusters", false, "WEAKER: manage clusters registered in kubeconfig mode, with the kubeconfig in their Secret (the server then holds their credentials)")
	fs.Float64Var(&f.kubeQPS, "kube-qps", 200, "requests per second the server's Kubernetes client may send to the management apiserver (burst twice that); size it for the fleet, with the apiserver's API Priority and Fairness in mind; the typed and the dynamic client have one each; the KubernetesClusters' status writes (the sessions' and the trust domain verdicts) have a budget of their own as large, and with --leader-elect the Leases and coordination shards theirs")
	fs.IntVar(&f.conns.MaxConnections, "max-connections", 32768, "relay connections open at once, all peers")
	fs.IntVar(&f.conns.MaxConnectionsPerAddress, "max-connections-per-address", 256, "relay connections open at once from one address (IPv6: /64); agents behind one NAT share it")
	fs.IntVar(&f.conns.MaxPreAuth, "max-preauth-connections", 1024, "relay connections open at once that have not authenticated (handshaking or bootstrapping)")
	fs.IntVar(&f.conns.MaxPreAuthPerAddress, "max-preauth-connections-per-address", 16, "unauthenticated relay connections open at once from one address")
	fs.Float64Var(&f.clusters.RenewsPerMinute, "cluster-renewals-per-minute", 6, "certificate renewals a cluster may ask for per minute (burst 10)")
	fs.IntVar(&f.clusters.MaxSessions, "cluster-max-streams", 32, "relay streams (sessions, snapshots, outputs) one cluster may hold open at once")
	fs.Float64Var(&f.conns.StreamsPerSecond, "connection-streams-per-second", 50, "streams an authenticated relay connection may open per second (burst 4x); beyond, the connection is closed (what an HTTP/2 rapid-reset flood meets); raise it with --cluster-renewals-per-minute")
	fs.StringVar(&f.debugEndpoints, "debug-endpoints", "authenticated", "authenticated: /debug/* on the metrics port answers only bearer tokens the apiserver accepts (TokenReview) whose user may get relaymesh.io/debug (SubjectAccessReview); off: not served")
	fs.StringVar(&f.webhookClientCA, "webhook-client-ca", "", "PEM file of the CA that issued the kube-apiserver's client certificate for admission webhooks (its --admission-control-config-file kubeconfig): the webhook then answers only callers with such a certificate; required with --webhook-listen unless --webhook-allow-unauthenticated")
	f.dash.register(fs)
	fs.BoolVar(&f.webhookAllowUnauthenticated, "webhook-allow-unauthenticated", false, "WEAKER: serve the webhook to callers without a client certificate; decisions record the caller as unauthenticated and each source address has its own budget")
	fs.StringVar(&f.replicaName, "replica-name", "", "this replica's name in the server's Leases and in KubernetesCluster status (unique per replica; default: $POD_NAME, else the host name and process ID)")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "run as one of several replicas: the once-only work (output heads, statuses, the rotation driver, orphan collection, the session sweep, the token-mint audit, the webhook's configuration, the in-process agents of kubeconfig-mode clusters) runs only while holding the Lease relaymesh-server in --namespace; off: this process does it unconditionally and serves its own output versions (run exactly one replica)")
	fs.DurationVar(&f.leaseDuration, "leader-lease-duration", 8*time.Second, "how long the server's Lease lasts without renewal (another replica takes over after it)")
	fs.DurationVar(&f.renewDeadline, "leader-renew-deadline", 5*time.Second, "how long the leading replica retries renewing before it stops its once-only work")
	fs.DurationVar(&f.retryPeriod, "leader-retry-period", time.Second, "how often replicas try to acquire or renew the Lease")
	f.store.register(fs)
	f.bundle.register(fs)
	for name, values := range map[string][]string{"log-level": {"debug", "info", "warn", "error"}, "webhook-failure-policy": {"Fail", "Ignore"}, "debug-endpoints": {"authenticated", "off"},
		"snapshot-store": {snapshotStoreAPIServer, snapshotStoreRedis}} {
		_ = c.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
	}
	return c
}

// registerCA registers the relay CA's flags: its source (generated, or
// --ca-cert/--ca-key/--ca-roots, --ca-secret, --ca-config) and lifetimes.
func (f *serverFlags) registerCA(fs *pflag.FlagSet) {
	fs.StringVar(&f.caCert, "ca-cert", "", "provided relay CA: PEM of the issuing CA certificate (then intermediates)")
	fs.StringVar(&f.caKey, "ca-key", "", "provided relay CA: PEM of its private key")
	fs.StringVar(&f.caRoots, "ca-roots", "", "provided relay CA: PEM of the root(s) it chains to")
	fs.StringVar(&f.caSecret, "ca-secret", "", "provided relay CA from a Secret in --namespace (keys tls.crt, tls.key, ca.crt)")
	fs.StringVar(&f.caConfig, "ca-config", "", "relay CA on an enterprise back end: a YAML file with type pkcs11 (key on an HSM), cfssl or stepca and its section (docs/install.md); secrets (PIN, auth key, provisioner key and password) only by file or environment variable, never in the file. Re-read every --relay-issuer-check-interval: a new issuing CA there becomes current and the replaced one stays accepted until its agent certificates have expired")
	fs.DurationVar(&f.agentTTL, "agent-cert-ttl", 24*time.Hour, "lifetime of agent client certificates (renewed at about 2/3)")
	fs.DurationVar(&f.issuerTTL, "relay-issuer-ttl", 365*24*time.Hour, "lifetime of a generated relay issuing CA (at least 1m); the Lease holder replaces it at --relay-issuer-renew-at of its life, under the same root, and agents notice nothing")
	fs.Float64Var(&f.issuerRenewAt, "relay-issuer-renew-at", ca.DefaultIssuerRenewAt, "fraction of its life, in [0.1, 0.9], at which the generated relay issuing CA is renewed; the rest must cover --agent-cert-ttl, during which the replaced one stays accepted. A provided CA (--ca-cert, --ca-secret) is not renewed: past this point the server warns and relaymesh_relay_issuer_renewal_due is 1")
	fs.DurationVar(&f.issuerCheck, "relay-issuer-check-interval", time.Minute, "how often replicas reload the relay issuing CA and the Lease holder checks whether its renewal is due, in [1s, 1h]")
	fs.Float64Var(&f.rootRenewAt, "relay-root-renew-at", ca.DefaultIssuerRenewAt, "fraction of its life, in [0.1, 0.9], after which the generated relay root's rotation starts by itself (docs/design/2026-12-02-relay-root-rotation.md); 0: never by itself, only by relaymesh ca relay rotate start")
	fs.DurationVar(&f.rootGrace, "relay-root-grace", 0, "how long both relay roots stay accepted after a root rotation's switch, so that an agent offline through it reconnects without a new token; at least --agent-cert-ttl plus two --relay-issuer-check-interval (a shorter grace is refused), which 0 means")
}

// runServer runs the management server assembled by server/app.
func runServer(ctx context.Context, f serverFlags, kube *kubeclient.Clients, d deps) error {
	log, err := newLogger(d.stderr, f.logLevel)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	deps := app.Deps{Kube: kube, Logger: log, Registry: reg}
	if f.dash.listen != "" {
		deps.Dashboard = func(ctx context.Context, p app.DashboardParts) (func(), error) {
			return serveDashboard(ctx, f, kube, dashboardParts{view: p.View, pki: p.Signer, serving: p.Serving, auditLog: p.AuditLog,
				shared: p.Shared, authority: p.Authority, reg: p.Registry}, log.With("component", "server"))
		}
	}
	return app.Run(ctx, f.config(), deps)
}

// config maps the flags to the server's Config.
func (f serverFlags) config() app.Config {
	return app.Config{
		Namespace: f.namespace, Listen: f.listen, MetricsListen: f.metricsListen, MetricsTLS: f.metricsTLSConfig(), TrustDomain: f.trustDomain,
		ServerDNSNames: splitList(f.dnsNames), ServerIPs: splitList(f.ips), AuditLog: f.auditLog, LogLevel: f.logLevel,
		CA: app.CAConfig{CertFile: f.caCert, KeyFile: f.caKey, RootsFile: f.caRoots, Secret: f.caSecret, ConfigFile: f.caConfig,
			IssuerTTL: f.issuerTTL, IssuerRenewAt: f.issuerRenewAt, IssuerCheck: f.issuerCheck, RootRenewAt: f.rootRenewAt, RootGrace: f.rootGrace},
		AgentCertTTL: f.agentTTL, AllowSharedToken: f.allowSharedToken, AllowKubeconfigClusters: f.allowKubeconfig,
		Webhook: app.WebhookConfig{Listen: f.webhookListen, URL: f.webhookURL, Service: f.webhookService,
			DNSNames: splitList(f.webhookDNSNames), IPs: splitList(f.webhookIPs), FailurePolicy: f.webhookFailurePolicy,
			ClientCAFile: f.webhookClientCA, AllowUnauthenticated: f.webhookAllowUnauthenticated},
		DebugEndpoints: f.debugEndpoints, PKCS11Modules: f.pkcs11Modules, KubeQPS: f.kubeQPS,
		ReplicaName: f.replicaName, LeaderElect: f.leaderElect,
		LeaseDuration: f.leaseDuration, RenewDeadline: f.renewDeadline, RetryPeriod: f.retryPeriod,
		Connections: f.conns, Clusters: f.clusters, SnapshotStore: f.store.store(), SPIFFEBundle: f.bundle.config(),
	}
}

// metricsTLSConfig is the metrics port's transport from the flags.
func (f serverFlags) metricsTLSConfig() app.MetricsTLSConfig {
	m := f.metricsTLS
	m.DNSNames, m.IPs = splitList(f.metricsDNSNames), splitList(f.metricsIPs)
	return m
}

// validate checks every flag (app.Config.Validate, and the dashboard's).
func (f serverFlags) validate() error {
	return errors.Join(append([]error{f.config().Validate()}, f.dash.validate()...)...)
}

// replicaHeartbeat is how often a replica renews its own Lease.
const replicaHeartbeat = app.ReplicaHeartbeat
