package main

import (
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/trust"
	discoveryclient "k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/logging"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const agentSynopsis = `Runs the relay agent in a workload cluster. It dials out to the management
server: once with the bootstrap token of relay-identity-token-secret over
server-authenticated TLS pinned to relay-root-tls-secret, then always with
mTLS and the client certificate it keeps in relay-client-tls-secret and
renews at about 2/3 of its life. It never falls back to an insecure
connection.

--cluster and --server-address default to the values 'relaymesh cluster
register' wrote into the ConfigMap relaymesh-agent-config.`

// Agent metric names (docs/metrics.md).
const (
	metricAgentCertExpiry = "relaymesh_agent_client_certificate_expiry_timestamp_seconds"
	metricAgentConnected  = "relaymesh_agent_relay_connected"
)

// agentConfigMap is where registration leaves the agent's settings.
const agentConfigMap = "relaymesh-agent-config"

// agentFlags are the agent's flags.
type agentFlags struct {
	cluster, serverAddr, serverName, healthListen, metricsListen, logLevel, leaseName, identityName string
	leaderElect                                                                                     bool
	leaseDuration, renewDeadline, retryPeriod                                                       time.Duration
}

func newAgentCommand(d deps, g *globals) *cobra.Command {
	var f agentFlags
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
			if f.leaderElect && !(f.retryPeriod > 0 && f.retryPeriod < f.renewDeadline && f.renewDeadline < f.leaseDuration) {
				return usagef("leader election needs 0 < --leader-retry-period < --leader-renew-deadline < --leader-lease-duration")
			}
			if _, err := logging.ParseLevel(f.logLevel); err != nil {
				return usagef("--log-level %q: want debug, info, warn or error", text.Truncate(f.logLevel, 40))
			}
			kube, err := g.clients()
			if err != nil {
				return err
			}
			return runAgent(c.Context(), f, g.namespace, kube, d)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.cluster, "cluster", "", "this cluster's registered name (default: from "+agentConfigMap+")")
	fs.StringVar(&f.serverAddr, "server-address", "", "relay server host:port, or the replicas' addresses comma-separated (each session dials one: the first a random one, and after a session ends or fails the next one; then --server-name is required) (default: from "+agentConfigMap+")")
	fs.StringVar(&f.serverName, "server-name", "", "name the server certificate must carry (default: host of --server-address; required with several addresses)")
	fs.StringVar(&f.healthListen, "health-listen", defaultAgentHealth, "health address (/healthz, /readyz with JSON status); the default is loopback only, and another free loopback port (logged) when a second agent on this machine holds it; the chart sets :9988")
	fs.StringVar(&f.metricsListen, "metrics-listen", defaultAgentMetrics, "metrics address (/metrics); the default is loopback only, and another free loopback port (logged) when a second agent on this machine holds it; the chart sets :9977")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "run as one of several replicas: only the holder of the Lease --lease-name talks to the server and applies")
	fs.StringVar(&f.leaseName, "lease-name", "relaymesh-agent", "name of the leader-election Lease in --namespace")
	fs.StringVar(&f.identityName, "identity", "", "this replica's leader-election identity (default: hostname and a random suffix)")
	fs.DurationVar(&f.leaseDuration, "leader-lease-duration", 15*time.Second, "how long a lease lasts without renewal (a standby takes over after it)")
	fs.DurationVar(&f.renewDeadline, "leader-renew-deadline", 10*time.Second, "how long the leader retries renewing before it gives up")
	fs.DurationVar(&f.retryPeriod, "leader-retry-period", 2*time.Second, "how often candidates try to acquire or renew the lease")
	_ = c.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]string{"debug", "info", "warn", "error"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

// The agent's operations addresses when no flag names them: loopback only
// (the charts set :9988 and :9977 for the kubelet's probes and scrapes).
const (
	defaultAgentHealth  = "127.0.0.1:9988"
	defaultAgentMetrics = "127.0.0.1:9977"
)

// listenOps listens on addr for flag. At the default address, held by
// another agent on this machine (by-hand use), it takes a free loopback
// port instead and logs it; an address given explicitly is never replaced.
func listenOps(flag, addr, def string, log *slog.Logger) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err == nil {
		log.Info("listening", "flag", flag, "address", lis.Addr().String())
		return lis, nil
	}
	if addr != def || !errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("%s %s: %w (another process on this machine holds it? give each agent its own %s)", flag, addr, err, flag)
	}
	lis, err2 := net.Listen("tcp", "127.0.0.1:0")
	if err2 != nil {
		return nil, fmt.Errorf("%s %s: %w; and no free loopback port: %w", flag, addr, err, err2)
	}
	log.Warn("the default address is in use (another agent on this machine?): listening on a free loopback port instead; set the flag to choose one",
		"flag", flag, "default", def, "address", lis.Addr().String())
	return lis, nil
}

// agentOwner is the value of the owner label (relaymesh.io/owner) on
// everything the agent applies: its Istio objects and cacerts Secrets.
// cluster deregister removes what carries it.
const agentOwner = "relaymesh-agent"

func runAgent(ctx context.Context, f agentFlags, namespace string, kube *kubeclient.Clients, d deps) error {
	stderr := d.stderr
	cluster, serverAddr, serverName, healthListen, metricsListen := f.cluster, f.serverAddr, f.serverName, f.healthListen, f.metricsListen
	leaderElect, leaseName, identityName := f.leaderElect, f.leaseName, f.identityName
	leaseDuration, renewDeadline, retryPeriod := f.leaseDuration, f.renewDeadline, f.retryPeriod
	log, err := newLogger(stderr, f.logLevel)
	if err != nil {
		return err
	}
	if cluster == "" || serverAddr == "" {
		cm, err := kube.Typed.CoreV1().ConfigMaps(namespace).Get(ctx, agentConfigMap, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("read %s/%s: %w", namespace, agentConfigMap, err)
		}
		if err == nil {
			if cluster == "" {
				cluster = cm.Data["cluster"]
			}
			if serverAddr == "" {
				serverAddr = cm.Data["serverAddress"]
			}
		}
	}
	if cluster == "" || serverAddr == "" {
		return usagef("--cluster and --server-address are required (or register the cluster first: relaymesh cluster register)")
	}
	log = log.With("cluster", cluster)
	secrets, err := identity.NewKubeAgentSecrets(kube.Typed, namespace)
	if err != nil {
		return err
	}
	creds, err := identity.NewManager(identity.ManagerConfig{
		Cluster: cluster, ServerAddress: serverAddr, ServerName: serverName, Secrets: secrets, Version: version(), Logger: log,
	})
	if err != nil {
		return err
	}
	disc, err := discovery.New(discovery.Config{Client: kube.Typed, Cluster: cluster, Logger: log})
	if err != nil {
		return err
	}
	dc, err := discoveryclient.NewDiscoveryClientForConfig(kube.Config)
	if err != nil {
		return err
	}
	applier, err := apply.New(apply.Config{Dynamic: kube.Dynamic, Mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), Owner: agentOwner, Logger: log})
	if err != nil {
		return err
	}
	session, err := agent.NewSession(agent.SessionConfig{ServerAddress: serverAddr, TLS: creds.ClientTLS, Version: version(), Logger: log,
		OnRefused: creds.Refused, Snapshots: disc, Applier: applier, Clock: d.agentClock,
		Trust: &trust.Agent{Client: kube.Typed, Owner: agentOwner, Logger: log}})
	if err != nil {
		return err
	}
	var leading atomic.Bool

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricAgentCertExpiry, Help: "Expiry (Unix seconds) of the agent's current client certificate; 0 when it has none."},
			func() float64 {
				if st := creds.Status(); st.Ready {
					return float64(st.NotAfter.Unix())
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricAgentConnected, Help: "1 while the agent holds an open relay session."},
			func() float64 {
				if session.State().Connected {
					return 1
				}
				return 0
			}))
	status := func() (any, error) {
		st := struct {
			Leader     bool               `json:"leader"`
			Credential identity.Status    `json:"credential"`
			Session    agent.SessionState `json:"session"`
		}{leading.Load() || !leaderElect, creds.Status(), session.State()}
		switch {
		case !st.Leader:
			return st, nil // a healthy standby
		case !st.Credential.Ready:
			return st, errors.New(st.Credential.Message)
		case !st.Session.Connected:
			return st, errors.New("not connected to the relay server")
		}
		return st, nil
	}
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st, err := status()
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": err == nil, "error": errString(err), "status": st})
	})
	for _, l := range []struct {
		flag, addr, def string
		h               http.Handler
	}{
		{"--health-listen", healthListen, defaultAgentHealth, health},
		{"--metrics-listen", metricsListen, defaultAgentMetrics, opsMux(reg, func() error { _, err := status(); return err })},
	} {
		lis, err := listenOps(l.flag, l.addr, l.def, log)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: l.h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(lis) }()
		defer srv.Close()
	}

	log.Info("relay agent starting", "server", serverAddr, "namespace", namespace, "leader_elect", leaderElect)
	work := func(ctx context.Context) error {
		leading.Store(true)
		go func() { _ = creds.Run(ctx) }()
		go func() { _ = disc.Run(ctx) }()
		for _, ready := range []<-chan struct{}{creds.Ready(), disc.Synced()} {
			select {
			case <-ctx.Done():
				return nil
			case <-ready:
			}
		}
		if err := session.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	if !leaderElect {
		log.Warn("leader election is off: run exactly one agent replica per cluster")
		return work(ctx)
	}
	if identityName == "" {
		host, _ := os.Hostname()
		identityName = fmt.Sprintf("%s-%d", host, time.Now().UnixNano()%100000)
	}
	return leadAndWork(ctx, kube, namespace, leaseName, identityName, leaseDuration, renewDeadline, retryPeriod, log, work)
}

// leadAndWork runs work while this replica holds the Lease. Losing the lease
// ends the process's work (it exits with an error, and its supervisor
// restarts it as a standby), so two replicas never apply at once. On
// shutdown the work is stopped and waited for before the lease is released,
// so a standby never starts while this replica is still applying.
func leadAndWork(ctx context.Context, kube *kubeclient.Clients, namespace, lease, id string, leaseDuration, renewDeadline, retryPeriod time.Duration, log *slog.Logger, work func(context.Context) error) error {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, namespace, lease, kube.Typed.CoreV1(), kube.Typed.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return err
	}
	lost := errors.New("lost leadership")
	result := make(chan error, 2)
	workDone := make(chan struct{})
	var started atomic.Bool
	// The elector's context outlives ctx until the work has stopped.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod, ReleaseOnCancel: true, Name: lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				started.Store(true)
				defer close(workDone)
				log.Info("leading: this replica talks to the server and applies", "identity", id)
				wctx, cancel := context.WithCancel(lctx)
				defer cancel()
				go func() {
					select {
					case <-ctx.Done():
						cancel()
					case <-wctx.Done():
					}
				}()
				result <- work(wctx)
			},
			OnStoppedLeading: func() { result <- lost },
			OnNewLeader: func(leader string) {
				if leader != id {
					log.Info("standing by", "leader", leader)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	elected := make(chan struct{})
	go func() { le.Run(leCtx); close(elected) }()
	var first error
	select {
	case <-ctx.Done():
	case first = <-result:
	case <-elected:
	}
	// Stop the work (ctx, or a lost lease, already cancelled it) and wait,
	// then let the elector release the lease.
	if started.Load() {
		select {
		case <-workDone:
		case <-time.After(30 * time.Second):
			log.Error("work did not stop within 30s; releasing the lease anyway")
		}
	}
	leCancel()
	<-elected
	if first == nil || (errors.Is(first, lost) && ctx.Err() != nil) {
		return nil
	}
	return first
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
