package main

import (
	"errors"

	agentapp "github.com/relaymesh/relaymesh/agent/app"
	"github.com/spf13/cobra"
)

const agentSynopsis = `Runs the relay agent in a workload cluster. It dials out to the management
server: once with the bootstrap token of relay-identity-token-secret over
server-authenticated TLS pinned to relay-root-tls-secret, then always with
mTLS and the client certificate it keeps in relay-client-tls-secret and
renews at about 2/3 of its life. It never falls back to an insecure
connection.

--cluster and --server-address default to the values 'relaymesh cluster
register' wrote into the ConfigMap relaymesh-agent-config.`

// agentConfigMap is where registration leaves the agent's settings.
const agentConfigMap = agentapp.ConfigMapName

// agentOwner is the value of the owner label (relaymesh.io/owner) on
// everything the agent applies; cluster deregister removes what carries it.
const agentOwner = agentapp.Owner

func newAgentCommand(d deps, g *globals) *cobra.Command {
	cfg := agentapp.Default()
	c := &cobra.Command{
		Use:   "agent",
		Short: "Run the relay agent in a workload cluster (metrics 127.0.0.1:9977, health 127.0.0.1:9988)",
		Long:  agentSynopsis,
		Example: `  # In the workload cluster (the relaymesh-agent chart runs this), after relaymesh cluster register
  relaymesh agent

  # On a workstation against a workload cluster context, one replica
  relaymesh agent --context cluster-1 --leader-elect=false`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg.Namespace = g.namespace
			if err := cfg.Validate(); err != nil {
				return usagef("%w", err)
			}
			kube, err := g.clients()
			if err != nil {
				return err
			}
			err = agentapp.Run(c.Context(), cfg, agentapp.Env{Kube: kube, Stderr: d.stderr, Clock: d.agentClock, Version: version()})
			if errors.Is(err, agentapp.ErrUnconfigured) {
				return usagef("%w", err)
			}
			return err
		},
	}
	addAgentFlags(c, &cfg)
	return c
}

// addAgentFlags binds the agent's flags to cfg, whose values are their
// defaults.
func addAgentFlags(c *cobra.Command, cfg *agentapp.Config) {
	fs := c.Flags()
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "this cluster's registered name (default: from "+agentConfigMap+")")
	fs.StringVar(&cfg.ServerAddress, "server-address", cfg.ServerAddress, "relay server host:port, or the replicas' addresses comma-separated (each session dials one, the first a random one and the next after it ends or fails; each certificate call likewise, moving on only after a failed call; then --server-name is required) (default: from "+agentConfigMap+")")
	fs.StringVar(&cfg.ServerName, "server-name", cfg.ServerName, "name the server certificate must carry (default: host of --server-address; required with several addresses)")
	fs.StringVar(&cfg.HealthListen, "health-listen", cfg.HealthListen, "health address (/healthz, /readyz with JSON status); the default is loopback only, and another free loopback port (logged) when a second agent on this machine holds it; the chart sets :9988")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "metrics address (/metrics); the default is loopback only, and another free loopback port (logged) when a second agent on this machine holds it; the chart sets :9977")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.BoolVar(&cfg.LeaderElect, "leader-elect", cfg.LeaderElect, "run as one of several replicas: only the holder of the Lease --lease-name talks to the server and applies; the Lease is renewed through a client with a request budget of its own (5/s), so the agent's other requests queued in its client never delay a renewal")
	fs.StringVar(&cfg.LeaseName, "lease-name", cfg.LeaseName, "name of the leader-election Lease in --namespace")
	fs.BoolVar(&cfg.AmbientFederation, "ambient-federation", cfg.AmbientFederation, "apply what ambient federation writes into this cluster: global Services (istio.io/global), WorkloadEntries on other networks and istio-remote Gateways; only objects labelled relaymesh.io/owner are changed. Needs write access to Services, WorkloadEntries and Gateway API Gateways (chart: ambientFederation.enabled). Off: those objects are reported as not managed by the agent")
	fs.BoolVar(&cfg.AmbientFailover, "ambient-failover", cfg.AmbientFailover, "with --ambient-federation, also apply WorkloadEntries of other networks that join a Service of this cluster, for VirtualDestination failover between ambient meshes: only for a Service its owner labelled istio.io/global=true that selects exactly the entry's labels, and never on this cluster's own network (chart: ambientFederation.failover). Off: such entries are refused")
	fs.StringVar(&cfg.Identity, "identity", cfg.Identity, "this replica's leader-election identity (default: hostname and a random suffix)")
	fs.DurationVar(&cfg.LeaseDuration, "leader-lease-duration", cfg.LeaseDuration, "how long a lease lasts without renewal (a standby takes over after it)")
	fs.DurationVar(&cfg.RenewDeadline, "leader-renew-deadline", cfg.RenewDeadline, "how long the leader retries renewing before it gives up")
	fs.DurationVar(&cfg.RetryPeriod, "leader-retry-period", cfg.RetryPeriod, "how often candidates try to acquire or renew the lease")
	_ = c.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]string{"debug", "info", "warn", "error"}, cobra.ShellCompDirectiveNoFileComp))
}
