package dataplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Names istiod and gRPC agree on for a proxyless workload.
const (
	// Generator is the node metadata GENERATOR that selects istiod's `grpc`
	// generator (pilot/pkg/networking/grpcgen).
	Generator = "grpc"
	// ServerListenerTemplate is the name a gRPC xDS server asks for its
	// inbound listener; gRPC replaces %s with the address it listens on, and
	// istiod finds the Pod's service port by that port.
	ServerListenerTemplate = "xds.istio.io/grpc/lds/inbound/%s"
	// CertificateProvider is the certificate provider instance istiod's TLS
	// contexts name ("default" for both the certificate and the roots).
	CertificateProvider = "default"
	// DomainSuffix is the cluster's DNS domain, istiod's default.
	DomainSuffix = "cluster.local"
)

// Files of a workload's certificate directory, as istio-agent writes them.
const (
	CertChainFile = "cert-chain.pem"
	KeyFile       = "key.pem"
	RootCertFile  = "root-cert.pem"
)

// DefaultRefresh is how often the file_watcher provider rereads the
// certificate files: short, so a test sees re-issued certificates quickly.
const DefaultRefresh = time.Second

var (
	dnsLabel    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdom   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	labelKey    = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValue  = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	clusterName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
)

// Node is what a workload tells istiod about itself.
type Node struct {
	// IP is the workload's address, the Pod's status.podIP: an IPv4
	// address of the pod network (Address).
	IP string
	// Pod and Namespace name the Pod istiod looks up by the node id.
	Pod, Namespace string
	// ServiceAccount is the Pod's service account.
	ServiceAccount string
	// ClusterID is the cluster's Istio cluster ID (istiod's --clusterID);
	// istiod ignores a proxy that names another cluster.
	ClusterID string
	// Labels are the Pod's labels. istiod reads them from the Pod; sent in
	// the metadata too, they serve until the Pod is in istiod's cache.
	Labels map[string]string
	// Port is the Pod's container port named PortName, 0 for none; sent
	// as POD_PORTS, as istio-agent does, it lets istiod find the Pod's
	// service targets before the Pod is in its cache.
	Port int
}

// ID is the xDS node id istio-agent would give the Pod:
// sidecar~IP~pod.namespace~namespace.svc.cluster.local.
func (n Node) ID() string {
	return "sidecar~" + n.IP + "~" + n.Pod + "." + n.Namespace + "~" + n.Namespace + ".svc." + DomainSuffix
}

// Validate reports every problem with n at once.
func (n Node) Validate() error {
	var errs []error
	if ip := net.ParseIP(n.IP); ip == nil || ip.To4() == nil || !ip.IsPrivate() {
		errs = append(errs, fmt.Errorf("ip: %q is not a private IPv4 address", n.IP))
	}
	if len(n.Pod) > 63 || !dnsLabel.MatchString(n.Pod) {
		errs = append(errs, fmt.Errorf("pod: %q is not a DNS label", n.Pod))
	}
	if len(n.Namespace) > 63 || !dnsLabel.MatchString(n.Namespace) {
		errs = append(errs, fmt.Errorf("namespace: %q is not a DNS label", n.Namespace))
	}
	if len(n.ServiceAccount) > 253 || !dnsSubdom.MatchString(n.ServiceAccount) {
		errs = append(errs, fmt.Errorf("serviceAccount: %q is not a DNS subdomain", n.ServiceAccount))
	}
	if len(n.ClusterID) > 253 || !clusterName.MatchString(n.ClusterID) {
		errs = append(errs, fmt.Errorf("clusterID: %q must be letters, digits, '-', '_' or '.'", n.ClusterID))
	}
	if n.Port < 0 || n.Port > 65535 {
		errs = append(errs, fmt.Errorf("port: %d is not a port", n.Port))
	}
	errs = append(errs, validateLabels("labels", n.Labels)...)
	return errors.Join(errs...)
}

func validateLabels(field string, labels map[string]string) []error {
	var errs []error
	for _, k := range sortedKeys(labels) {
		if len(k) > 316 || !labelKey.MatchString(k) {
			errs = append(errs, fmt.Errorf("%s: key %q is not a label key", field, k))
		}
		if v := labels[k]; len(v) > 63 || !labelValue.MatchString(v) {
			errs = append(errs, fmt.Errorf("%s[%s]: %q is not a label value", field, k, v))
		}
	}
	return errs
}

// BootstrapConfig is what a proxyless workload's bootstrap says.
type BootstrapConfig struct {
	// Node is the workload.
	Node Node
	// XDSAddress is istiod's plaintext xDS address, host:port.
	XDSAddress string
	// CertDir holds CertChainFile, KeyFile and RootCertFile; empty: no
	// certificate provider (the workload cannot do mTLS).
	CertDir string
	// Refresh is how often gRPC rereads the certificate files; default
	// DefaultRefresh.
	Refresh time.Duration
}

// bootstrap is gRPC-Go's bootstrap file format (gRFC A27, A29, A36): the
// fields gRPC reads, in its JSON names.
type bootstrap struct {
	XDSServers           []xdsServer                    `json:"xds_servers"`
	Node                 bootstrapNode                  `json:"node"`
	CertificateProviders map[string]certificateProvider `json:"certificate_providers,omitempty"`
	ServerListenerName   string                         `json:"server_listener_resource_name_template"`
}

type xdsServer struct {
	ServerURI    string         `json:"server_uri"`
	ChannelCreds []channelCreds `json:"channel_creds"`
}

type channelCreds struct {
	Type string `json:"type"`
}

type bootstrapNode struct {
	ID       string         `json:"id"`
	Metadata map[string]any `json:"metadata"`
}

type certificateProvider struct {
	PluginName string          `json:"plugin_name"`
	Config     fileWatcherConf `json:"config"`
}

type fileWatcherConf struct {
	CertificateFile   string `json:"certificate_file"`
	PrivateKeyFile    string `json:"private_key_file"`
	CACertificateFile string `json:"ca_certificate_file"`
	// RefreshInterval is a protobuf Duration in its JSON form ("1s").
	RefreshInterval string `json:"refresh_interval"`
}

// Bootstrap returns the bootstrap JSON gRPC-Go reads (what
// GRPC_XDS_BOOTSTRAP would point to): istiod as the only xDS server, the
// node id and metadata istiod needs (GENERATOR=grpc, NAMESPACE,
// CLUSTER_ID, INSTANCE_IPS, SERVICE_ACCOUNT, LABELS), the server listener
// template, and a file_watcher certificate provider named "default" over
// CertDir.
func Bootstrap(cfg BootstrapConfig) ([]byte, error) {
	var errs []error
	if err := cfg.Node.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("node: %w", err))
	}
	if host, port, err := net.SplitHostPort(cfg.XDSAddress); err != nil || host == "" || port == "" {
		errs = append(errs, fmt.Errorf("xdsAddress: %q is not host:port", cfg.XDSAddress))
	}
	if cfg.CertDir != "" && !strings.HasPrefix(cfg.CertDir, "/") {
		errs = append(errs, fmt.Errorf("certDir: %q must be absolute", cfg.CertDir))
	}
	if cfg.Refresh < 0 || cfg.Refresh > 0 && cfg.Refresh < time.Millisecond {
		errs = append(errs, fmt.Errorf("refresh: %v is not a positive duration of at least 1ms", cfg.Refresh))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = DefaultRefresh
	}
	n := cfg.Node
	labels := map[string]any{}
	for k, v := range n.Labels {
		labels[k] = v
	}
	b := bootstrap{
		XDSServers: []xdsServer{{ServerURI: cfg.XDSAddress, ChannelCreds: []channelCreds{{Type: "insecure"}}}},
		Node: bootstrapNode{ID: n.ID(), Metadata: map[string]any{
			"GENERATOR":       Generator,
			"NAMESPACE":       n.Namespace,
			"CLUSTER_ID":      n.ClusterID,
			"INSTANCE_IPS":    n.IP,
			"SERVICE_ACCOUNT": n.ServiceAccount,
			"WORKLOAD_NAME":   n.Pod,
			"LABELS":          labels,
		}},
		ServerListenerName: ServerListenerTemplate,
	}
	if n.Port != 0 {
		ports, err := json.Marshal([]map[string]any{{"name": PortName, "containerPort": n.Port, "protocol": "TCP"}})
		if err != nil {
			return nil, err
		}
		b.Node.Metadata["POD_PORTS"] = string(ports)
	}
	if cfg.CertDir != "" {
		b.CertificateProviders = map[string]certificateProvider{CertificateProvider: {
			PluginName: "file_watcher",
			Config: fileWatcherConf{
				CertificateFile:   cfg.CertDir + "/" + CertChainFile,
				PrivateKeyFile:    cfg.CertDir + "/" + KeyFile,
				CACertificateFile: cfg.CertDir + "/" + RootCertFile,
				RefreshInterval:   durationJSON(cfg.Refresh),
			},
		}}
	}
	return json.MarshalIndent(b, "", "  ")
}

// durationJSON is d in protobuf's Duration JSON form: seconds with up to
// nine fractional digits and an "s".
func durationJSON(d time.Duration) string {
	s := fmt.Sprintf("%d.%09d", d/time.Second, d%time.Second)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + "s"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
