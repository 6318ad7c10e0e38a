// Package app assembles the management server process: a typed Config with
// Default and Validate, and Run, which builds the component graph top-down
// (one newX per component, in the order they depend on each other) and
// serves until its context ends.
//
// cmd/relaymesh only maps flags to a Config and calls Run; tests build the
// same assembly in-process (server/servertest). The work that must happen
// once across the replicas is one table (onceOnlyWork, once.go); which
// replica owns what is a set of named rules (rules.go).
package app

import (
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/ca"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/internal/logging"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/relay"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Config is the management server's configuration. Every field has the
// flag of `relaymesh server` it comes from; Validate names that flag.
type Config struct {
	// Namespace of the server's Secrets, Leases and user config (--namespace).
	Namespace string
	// Listen is the relay gRPC address (--listen); MetricsListen serves
	// /metrics, /healthz, /readyz and /debug (--metrics-listen), over
	// TLS as MetricsTLS says.
	Listen, MetricsListen string
	// MetricsTLS is the metrics port's transport.
	MetricsTLS MetricsTLSConfig
	// TrustDomain of agent identities (--trust-domain).
	TrustDomain string
	// ServerDNSNames and ServerIPs name the server in its certificate
	// (--server-dns-names, --server-ips).
	ServerDNSNames, ServerIPs []string
	// AuditLog is the hash-chained audit log's path (--audit-log). Required.
	AuditLog string
	// LogLevel is debug, info, warn or error (--log-level).
	LogLevel string
	// CA is the relay CA: generated, or provided.
	CA CAConfig
	// AgentCertTTL is the lifetime of agent client certificates
	// (--agent-cert-ttl).
	AgentCertTTL time.Duration
	// AllowSharedToken (WEAKER, --allow-shared-token) also accepts the
	// shared token of relay-identity-token-secret.
	AllowSharedToken bool
	// AllowKubeconfigClusters (WEAKER, --allow-kubeconfig-clusters)
	// manages clusters registered in kubeconfig mode.
	AllowKubeconfigClusters bool
	// Webhook is the admission webhook (off without Listen).
	Webhook WebhookConfig
	// DebugEndpoints is "authenticated" or "off" (--debug-endpoints).
	DebugEndpoints string
	// PKCS11Modules a VirtualMesh's PKCS#11 root may name (--pkcs11-module).
	PKCS11Modules []string
	// KubeQPS the server's Kubernetes client may send (--kube-qps); the
	// caller builds the clients with it.
	KubeQPS float64
	// ReplicaName names this replica in Leases and statuses
	// (--replica-name; empty: $POD_NAME, else host name and process ID).
	ReplicaName string
	// LeaderElect: one of several replicas, the once-only work under the
	// Lease relaymesh-server (--leader-elect); false: the only replica.
	LeaderElect bool
	// LeaseDuration, RenewDeadline and RetryPeriod of the Lease
	// (--leader-lease-duration, --leader-renew-deadline,
	// --leader-retry-period).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Connections and Clusters are the relay's limits (--max-connections…,
	// --cluster-…).
	Connections relay.ConnectionLimits
	Clusters    relay.ClusterLimits
	// SnapshotStore is where the replicas keep full snapshots.
	SnapshotStore SnapshotStoreConfig
	// SPIFFEBundle is the SPIFFE bundle endpoint (bundleendpoint.go).
	SPIFFEBundle BundleEndpointConfig
}

// CAConfig selects the relay CA: generated (all empty), three PEM files,
// a Secret in the namespace, or an enterprise back end (pkcs11, cfssl,
// stepca) described by a file.
type CAConfig struct {
	// CertFile, KeyFile and RootsFile (--ca-cert, --ca-key, --ca-roots).
	CertFile, KeyFile, RootsFile string
	// Secret in Namespace with tls.crt, tls.key and ca.crt (--ca-secret).
	Secret string
	// ConfigFile is a CA back-end file (--ca-config, backend.File): the
	// relay CA on pkcs11, cfssl or stepca, re-read every IssuerCheck.
	ConfigFile string
	// IssuerTTL is the lifetime of a generated issuing CA
	// (--relay-issuer-ttl), at least 1m.
	IssuerTTL time.Duration
	// IssuerRenewAt is the fraction of its life at which the Lease holder
	// replaces the issuing CA (--relay-issuer-renew-at), in [0.1, 0.9].
	IssuerRenewAt float64
	// IssuerCheck is how often replicas look for a new issuing CA and the
	// Lease holder for a due renewal (--relay-issuer-check-interval).
	IssuerCheck time.Duration
	// RootRenewAt is the fraction of the generated relay root's life after
	// which the Lease holder starts its rotation by itself
	// (--relay-root-renew-at), in [0.1, 0.9]; 0 turns the automatic start
	// off: only `relaymesh ca relay rotate start` starts one.
	RootRenewAt float64
	// RootGrace is how long both relay roots stay accepted after the
	// rotation's switch (--relay-root-grace): at least AgentCertTTL plus
	// two IssuerCheck (issuerKeep), which 0 means.
	RootGrace time.Duration
}

// MetricsTLSConfig is how the metrics port is served: over TLS with a
// certificate from the relay CA (the default), or with provided files, or
// (WEAKER, loopback only) over plain HTTP.
type MetricsTLSConfig struct {
	// CertFile and KeyFile are a provided certificate and key, reloaded
	// when they change (--metrics-tls-cert, --metrics-tls-key).
	CertFile, KeyFile string
	// DNSNames and IPs of the relay-CA certificate (--metrics-dns-names,
	// --metrics-ips); empty: the server's names and IPs, and localhost,
	// 127.0.0.1 and ::1 (a port-forward's address).
	DNSNames, IPs []string
	// PlainHTTP (WEAKER, --metrics-plain-http) serves without TLS; allowed
	// on a loopback MetricsListen only.
	PlainHTTP bool
}

// WebhookConfig configures the admission webhook.
type WebhookConfig struct {
	// Listen serves the webhook (--webhook-listen); empty: no webhook.
	Listen string
	// URL or Service (NAMESPACE/NAME[:PORT]) the kube-apiserver calls
	// (--webhook-url, --webhook-service): exactly one with Listen.
	URL, Service string
	// DNSNames and IPs of its certificate (--webhook-dns-names,
	// --webhook-ips); empty: derived from URL or Service.
	DNSNames, IPs []string
	// FailurePolicy is Fail or (WEAKER) Ignore (--webhook-failure-policy).
	FailurePolicy string
	// ClientCAFile authenticates the apiserver (--webhook-client-ca);
	// AllowUnauthenticated (WEAKER) is the alternative.
	ClientCAFile         string
	AllowUnauthenticated bool
}

// Default is the configuration of `relaymesh server` without flags (no
// audit log yet: Validate requires one).
func Default() Config {
	return Config{
		Namespace:      "relaymesh",
		Listen:         ":9900",
		MetricsListen:  ":9091",
		TrustDomain:    "relaymesh.local",
		ServerDNSNames: []string{"localhost", "relaymesh-server", "relaymesh-server.relaymesh.svc"},
		ServerIPs:      []string{"127.0.0.1"},
		LogLevel:       "info",
		AgentCertTTL:   24 * time.Hour,
		CA: CAConfig{IssuerTTL: 365 * 24 * time.Hour, IssuerRenewAt: ca.DefaultIssuerRenewAt, IssuerCheck: time.Minute,
			RootRenewAt: ca.DefaultIssuerRenewAt},
		Webhook:        WebhookConfig{FailurePolicy: "Fail"},
		DebugEndpoints: DebugAuthenticated,
		KubeQPS:        200,
		LeaderElect:    true,
		LeaseDuration:  8 * time.Second,
		RenewDeadline:  5 * time.Second,
		RetryPeriod:    time.Second,
		Connections: relay.ConnectionLimits{MaxConnections: 32768, MaxConnectionsPerAddress: 256, MaxPreAuth: 1024,
			MaxPreAuthPerAddress: 16, StreamsPerSecond: 50},
		Clusters:      relay.ClusterLimits{RenewsPerMinute: 6, MaxSessions: 32},
		SnapshotStore: SnapshotStoreConfig{Kind: StoreAPIServer},
		SPIFFEBundle:  BundleEndpointConfig{RefreshHint: spiffefed.DefaultRefreshHint, PeerPoll: DefaultPeerPoll},
	}
}

// Values of Config.DebugEndpoints.
const (
	DebugAuthenticated = "authenticated"
	DebugOff           = "off"
)

// Validate reports every problem of c, each naming its flag. It reads no
// file and makes no request.
func (c Config) Validate() error {
	var errs []error
	if _, err := logging.ParseLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", text.Truncate(c.LogLevel, 40)))
	}
	if _, err := spiffeid.TrustDomainFromString(c.TrustDomain); err != nil {
		errs = append(errs, fmt.Errorf("--trust-domain: %w", err))
	}
	if c.LeaderElect && !(c.RetryPeriod > 0 && c.RetryPeriod < c.RenewDeadline && c.RenewDeadline < c.LeaseDuration) {
		errs = append(errs, errors.New("leader election needs 0 < --leader-retry-period < --leader-renew-deadline < --leader-lease-duration"))
	}
	if c.ReplicaName != "" && len(validation.IsDNS1123Subdomain(c.ReplicaName)) > 0 {
		errs = append(errs, fmt.Errorf("--replica-name %q: must be a DNS subdomain (lowercase letters, digits, '-' and '.')", text.Truncate(c.ReplicaName, 80)))
	}
	if c.AuditLog == "" {
		errs = append(errs, errors.New("--audit-log is required: every issuance and denial must be recorded"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("--namespace must not be empty"))
	}
	errs = append(errs, c.Webhook.validate()...)
	errs = append(errs, c.validateLimits()...)
	switch c.DebugEndpoints {
	case DebugAuthenticated, DebugOff:
	default:
		errs = append(errs, fmt.Errorf("--debug-endpoints %q: use authenticated or off", c.DebugEndpoints))
	}
	errs = append(errs, c.CA.validate()...)
	errs = append(errs, c.CA.validateIssuer(c.AgentCertTTL)...)
	errs = append(errs, c.CA.validateRoot(c.AgentCertTTL)...)
	errs = append(errs, c.MetricsTLS.validate(c.MetricsListen)...)
	if len(c.ServerDNSNames) == 0 && len(c.ServerIPs) == 0 {
		errs = append(errs, errors.New("--server-dns-names or --server-ips must name the server"))
	}
	if _, err := parseIPs("--server-ips", c.ServerIPs); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.SnapshotStore.Check("--snapshot-store=redis")...)
	errs = append(errs, c.SPIFFEBundle.validate()...)
	return errors.Join(errs...)
}

// validateLimits checks the relay's limits and the client's rate.
func (c Config) validateLimits() []error {
	var errs []error
	for _, l := range []struct {
		flag string
		v    int
	}{
		{"--max-connections", c.Connections.MaxConnections}, {"--max-connections-per-address", c.Connections.MaxConnectionsPerAddress},
		{"--max-preauth-connections", c.Connections.MaxPreAuth}, {"--max-preauth-connections-per-address", c.Connections.MaxPreAuthPerAddress},
		{"--cluster-max-streams", c.Clusters.MaxSessions},
	} {
		if l.v < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1", l.flag))
		}
	}
	for _, l := range []struct {
		flag string
		v    float64
	}{
		{"--kube-qps", c.KubeQPS}, {"--connection-streams-per-second", c.Connections.StreamsPerSecond},
		{"--cluster-renewals-per-minute", c.Clusters.RenewsPerMinute},
	} {
		if l.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", l.flag))
		}
	}
	return errs
}

func (c CAConfig) validate() []error {
	var errs []error
	provided := 0
	for _, v := range []string{c.CertFile, c.KeyFile, c.RootsFile} {
		if v != "" {
			provided++
		}
	}
	if provided != 0 && provided != 3 {
		errs = append(errs, errors.New("--ca-cert, --ca-key and --ca-roots go together"))
	}
	sources := 0
	for _, set := range []bool{provided != 0, c.Secret != "", c.ConfigFile != ""} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		errs = append(errs, errors.New("--ca-cert/--ca-key/--ca-roots, --ca-secret and --ca-config are alternatives: give at most one relay CA source"))
	}
	if c.ConfigFile != "" && strings.TrimSpace(c.ConfigFile) != c.ConfigFile {
		errs = append(errs, fmt.Errorf("--ca-config %q: leading or trailing white space", c.ConfigFile))
	}
	return errs
}

// validateIssuer checks the renewal of a generated issuing CA: a replaced
// issuing CA must stay valid (and accepted) for an agent certificate
// lifetime and two checks after the switch.
func (c CAConfig) validateIssuer(agentTTL time.Duration) []error {
	var errs []error
	if c.IssuerTTL < time.Minute {
		errs = append(errs, fmt.Errorf("--relay-issuer-ttl %v: must be at least 1m", c.IssuerTTL))
	}
	if !(c.IssuerRenewAt >= 0.1 && c.IssuerRenewAt <= 0.9) {
		errs = append(errs, fmt.Errorf("--relay-issuer-renew-at %v: must be in [0.1, 0.9]", c.IssuerRenewAt))
	}
	if c.IssuerCheck < time.Second || c.IssuerCheck > time.Hour {
		errs = append(errs, fmt.Errorf("--relay-issuer-check-interval %v: must be in [1s, 1h]", c.IssuerCheck))
	}
	if len(errs) == 0 {
		if rest := time.Duration(float64(c.IssuerTTL) * (1 - c.IssuerRenewAt)); rest < c.issuerKeep(agentTTL) {
			errs = append(errs, fmt.Errorf("--relay-issuer-ttl %v renewed at %v leaves %v: less than --agent-cert-ttl %v plus two --relay-issuer-check-interval for the old issuing CA's certificates to expire",
				c.IssuerTTL, c.IssuerRenewAt, rest, agentTTL))
		}
	}
	return errs
}

// validateRoot checks the relay root rotation's knobs: a grace shorter
// than an agent certificate lifetime and two checks strands the agents
// that were offline through the switch.
func (c CAConfig) validateRoot(agentTTL time.Duration) []error {
	var errs []error
	if c.RootRenewAt != 0 && !(c.RootRenewAt >= 0.1 && c.RootRenewAt <= 0.9) {
		errs = append(errs, fmt.Errorf("--relay-root-renew-at %v: must be 0 (no automatic start) or in [0.1, 0.9]", c.RootRenewAt))
	}
	if c.RootGrace < 0 {
		errs = append(errs, fmt.Errorf("--relay-root-grace %v: must not be negative (0: --agent-cert-ttl plus two --relay-issuer-check-interval)", c.RootGrace))
	} else if least := c.issuerKeep(agentTTL); c.RootGrace != 0 && c.RootGrace < least {
		errs = append(errs, fmt.Errorf("--relay-root-grace %v: shorter than --agent-cert-ttl %v plus two --relay-issuer-check-interval %v (%v); an agent offline through the switch would be stranded",
			c.RootGrace, agentTTL, c.IssuerCheck, least))
	}
	return errs
}

// rootRotation is the relay root rotation's configuration: the grace
// (default: issuerKeep), and the automatic start at RootRenewAt of the
// root's life, or none (Manual) when it is 0.
func (c CAConfig) rootRotation(agentTTL time.Duration) ca.RootRotationConfig {
	cfg := ca.RootRotationConfig{RenewAt: c.RootRenewAt, Grace: c.RootGrace, Manual: c.RootRenewAt == 0}
	if cfg.Grace == 0 {
		cfg.Grace = c.issuerKeep(agentTTL)
	}
	return cfg
}

// issuerKeep is how long a replaced issuing CA stays accepted: every
// agent certificate it signed has expired by then, including those a
// replica issued before it noticed the switch.
func (c CAConfig) issuerKeep(agentTTL time.Duration) time.Duration {
	return agentTTL + 2*c.IssuerCheck
}

func (w WebhookConfig) validate() []error {
	var errs []error
	if w.Listen == "" && (w.URL != "" || w.Service != "") {
		errs = append(errs, errors.New("--webhook-url and --webhook-service need --webhook-listen"))
	}
	if w.Listen != "" {
		if _, err := w.Target(); err != nil {
			errs = append(errs, err)
		}
		if (w.ClientCAFile == "") == !w.AllowUnauthenticated {
			errs = append(errs, errors.New("--webhook-listen needs --webhook-client-ca (the apiserver authenticates with its client certificate) or, WEAKER, --webhook-allow-unauthenticated, not both"))
		}
	}
	return errs
}

// parseIPs parses the IP addresses of flag.
func parseIPs(flag string, list []string) ([]net.IP, error) {
	var ips []net.IP
	for _, s := range list {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, fmt.Errorf("%s: %q is not an IP address", flag, text.Truncate(s, 80))
		}
		ips = append(ips, ip)
	}
	return ips, nil
}

// streamLimits are the relay's connection limits, with the stream burst
// that goes with --connection-streams-per-second.
func (c Config) streamLimits() relay.ConnectionLimits {
	l := c.Connections
	l.StreamBurst = int(min(4*l.StreamsPerSecond, 1<<20))
	return l
}

// reservedSecrets are the Secrets of the namespace no VirtualMesh may use
// as a root: a provided relay CA's (the generated relay CA's are always
// reserved).
func (c Config) reservedSecrets() []string {
	if c.CA.Secret == "" {
		return nil
	}
	return []string{c.CA.Secret}
}

func (m MetricsTLSConfig) validate(listen string) []error {
	var errs []error
	if (m.CertFile == "") != (m.KeyFile == "") {
		errs = append(errs, errors.New("--metrics-tls-cert and --metrics-tls-key go together"))
	}
	if m.PlainHTTP {
		if m.CertFile != "" {
			errs = append(errs, errors.New("--metrics-plain-http and --metrics-tls-cert are alternatives"))
		}
		if !loopbackAddress(listen) {
			errs = append(errs, fmt.Errorf("--metrics-plain-http is allowed only on a loopback --metrics-listen (e.g. 127.0.0.1:9091), not %q: off loopback the metrics port needs TLS (the default: a certificate from the relay CA; or --metrics-tls-cert and --metrics-tls-key)", text.Truncate(listen, 80)))
		}
	}
	if _, err := parseIPs("--metrics-ips", m.IPs); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// metricsNames are the names of the metrics port's relay-CA certificate:
// --metrics-dns-names and --metrics-ips, or else the server's names and
// loopback's (a port-forward's address), each once.
func (c Config) metricsNames() ([]string, []net.IP, error) {
	names, ipList := c.MetricsTLS.DNSNames, c.MetricsTLS.IPs
	if len(names) == 0 && len(ipList) == 0 {
		names = append(slices.Clone(c.ServerDNSNames), "localhost")
		ipList = append(slices.Clone(c.ServerIPs), "127.0.0.1", "::1")
	}
	ips, err := parseIPs("--metrics-ips", ipList)
	if err != nil {
		return nil, nil, err
	}
	slices.Sort(names)
	names = slices.Compact(names)
	var unique []net.IP
	for _, ip := range ips {
		if !slices.ContainsFunc(unique, ip.Equal) {
			unique = append(unique, ip)
		}
	}
	return names, unique, nil
}

// loopbackAddress reports whether host:port names a loopback address
// (an empty host, every interface, is not one).
func loopbackAddress(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}
