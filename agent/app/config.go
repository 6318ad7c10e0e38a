package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/relaymesh/relaymesh/internal/logging"
	"github.com/relaymesh/relaymesh/internal/text"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Config is the agent's configuration; each field names the flag of
// `relaymesh agent` that sets it.
type Config struct {
	// Namespace is Relaymesh's namespace in the workload cluster
	// (--namespace): the agent's secrets, ConfigMap and Lease live there.
	Namespace string
	// Cluster is this cluster's registered name (--cluster); empty: from
	// the ConfigMap registration wrote (ConfigMapName).
	Cluster string
	// ServerAddress is the relay server's host:port, or the replicas'
	// addresses comma-separated (--server-address); empty: from the
	// ConfigMap.
	ServerAddress string
	// ServerName is the name the server certificate must carry
	// (--server-name); empty: the host of ServerAddress.
	ServerName string
	// HealthListen (--health-listen) and MetricsListen (--metrics-listen)
	// are the operations addresses.
	HealthListen, MetricsListen string
	// LogLevel is debug, info, warn or error (--log-level).
	LogLevel string
	// LeaderElect (--leader-elect): only the holder of the Lease LeaseName
	// (--lease-name) talks to the server and applies.
	LeaderElect bool
	LeaseName   string
	// AmbientFederation (--ambient-federation) lets the agent apply what
	// ambient federation writes into this cluster: global Services,
	// WorkloadEntries and istio-remote Gateways (apply.AmbientFederationKinds).
	// Off by default: writing Services is a privilege the agent otherwise
	// does without (the chart grants it with ambientFederation.enabled).
	AmbientFederation bool
	// AmbientFailover (--ambient-failover, needs --ambient-federation) lets
	// the agent write WorkloadEntries of other networks that join a Service
	// of this cluster, for VirtualDestination failover of ambient meshes
	// (docs/design/2026-12-04-ambient-failover.md): only when the Service's
	// owner labelled it istio.io/global=true and it selects exactly the
	// entry's labels, and never on this cluster's own network
	// (apply.Config.LocalNetworks). Off by default.
	AmbientFailover bool
	// Identity is this replica's leader-election identity (--identity);
	// empty: the host name and a random suffix.
	Identity string
	// LeaseDuration (--leader-lease-duration), RenewDeadline
	// (--leader-renew-deadline) and RetryPeriod (--leader-retry-period)
	// time the election.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// The agent's operations addresses when no flag names them: loopback only
// (the charts set :9988 and :9977 for the kubelet's probes and scrapes).
const (
	defaultAgentHealth  = "127.0.0.1:9988"
	defaultAgentMetrics = "127.0.0.1:9977"
)

// ConfigMapName is where registration leaves the agent's settings
// (cluster, serverAddress).
const ConfigMapName = "relaymesh-agent-config"

// Owner is the value of the owner label (relaymesh.io/owner) on everything
// the agent applies: its Istio objects and cacerts Secrets. cluster
// deregister removes what carries it.
const Owner = "relaymesh-agent"

// Default is the configuration of `relaymesh agent` without flags.
func Default() Config {
	return Config{
		Namespace:     "relaymesh",
		HealthListen:  defaultAgentHealth,
		MetricsListen: defaultAgentMetrics,
		LogLevel:      "info",
		LeaderElect:   true,
		LeaseName:     "relaymesh-agent",
		LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
	}
}

// Validate reports every bad field, each with its flag. Cluster and
// ServerAddress may still be empty: Run reads them from the ConfigMap.
func (c Config) Validate() error {
	var errs []error
	if c.LeaderElect && !(c.RetryPeriod > 0 && c.RetryPeriod < c.RenewDeadline && c.RenewDeadline < c.LeaseDuration) {
		errs = append(errs, errors.New("leader election needs 0 < --leader-retry-period < --leader-renew-deadline < --leader-lease-duration"))
	}
	if _, err := logging.ParseLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", text.Truncate(c.LogLevel, 40)))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("--namespace: required"))
	}
	if c.LeaderElect && c.LeaseName == "" {
		errs = append(errs, errors.New("--lease-name: required with --leader-elect"))
	}
	if c.AmbientFailover && !c.AmbientFederation {
		errs = append(errs, errors.New("--ambient-failover needs --ambient-federation (the entries it allows are ambient federation's WorkloadEntries)"))
	}
	return errors.Join(errs...)
}

// ErrUnconfigured: neither the flags nor the ConfigMap name the cluster
// and the server.
var ErrUnconfigured = errors.New("--cluster and --server-address are required (or register the cluster first: relaymesh cluster register)")

// resolve fills Cluster and ServerAddress, where no flag set them, from
// the ConfigMap registration wrote; ErrUnconfigured if either is still
// missing.
func (c Config) resolve(ctx context.Context, client kubernetes.Interface) (Config, error) {
	if c.Cluster == "" || c.ServerAddress == "" {
		cm, err := client.CoreV1().ConfigMaps(c.Namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return c, fmt.Errorf("read %s/%s: %w", c.Namespace, ConfigMapName, err)
		}
		if err == nil {
			if c.Cluster == "" {
				c.Cluster = cm.Data["cluster"]
			}
			if c.ServerAddress == "" {
				c.ServerAddress = cm.Data["serverAddress"]
			}
		}
	}
	if c.Cluster == "" || c.ServerAddress == "" {
		return c, ErrUnconfigured
	}
	return c, nil
}
