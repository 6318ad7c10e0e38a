// Package app assembles the relay agent's process: `relaymesh agent` maps
// its flags to a Config and calls Run, which builds the parts top-down —
// the credential manager (identity), discovery, the applier, the relay
// session — serves health and metrics, and runs the work, under the
// agent's Lease (internal/lease, the election loop the server shares) when
// several replicas run.
//
// It imports nothing of the server (internal/layering checks it).
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/lease"
	"github.com/relaymesh/relaymesh/internal/logging"
	"github.com/relaymesh/relaymesh/trust"
	"k8s.io/apimachinery/pkg/api/meta"
	discoveryclient "k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Env is what the process gives the agent.
type Env struct {
	// Kube reaches the workload cluster.
	Kube *kubeclient.Clients
	// Stderr receives the JSON log.
	Stderr io.Writer
	// Clock is the clock the agent reports to the server in Hello; nil:
	// time.Now.
	Clock func() time.Time
	// Version is this build's version (Hello, relaymesh_build_info).
	Version string
}

// leaseStopWait is how long a term's end waits for the work to stop
// before the Lease is released anyway.
const leaseStopWait = 30 * time.Second

// Run runs the agent until ctx is done. With leader election it returns
// an error when this replica loses the Lease: its supervisor restarts it
// as a standby, so two replicas never apply at once.
func Run(ctx context.Context, cfg Config, env Env) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if env.Kube == nil || env.Kube.Config == nil || env.Kube.Typed == nil || env.Kube.Dynamic == nil {
		return errors.New("agent: no client of the workload cluster (its configuration, typed and dynamic clients are all required)")
	}
	log, err := newLogger(env.Stderr, cfg.LogLevel)
	if err != nil {
		return err
	}
	if cfg, err = cfg.resolve(ctx, env.Kube.Typed); err != nil {
		return err
	}
	log = log.With("cluster", cfg.Cluster)
	leases, err := leaseClient(env.Kube.Config)
	if err != nil {
		return err
	}
	p, err := build(cfg, env, log)
	if err != nil {
		return err
	}
	stop, err := p.serveOps(cfg, env.Version, log)
	if err != nil {
		return err
	}
	defer stop()
	log.Info("relay agent starting", "server", cfg.ServerAddress, "namespace", cfg.Namespace, "leader_elect", cfg.LeaderElect)
	if !cfg.LeaderElect {
		log.Warn("leader election is off: run exactly one agent replica per cluster")
		return p.work(ctx)
	}
	return p.lead(ctx, cfg, leases, log)
}

// Request budget of the agent's Lease client (leaseClient): a renewal
// every RetryPeriod (2 s by default) and a read now and then.
const leaseQPS, leaseBurst = 5, 10

// leaseClient is the client that renews the agent's Lease, with a rate
// limiter of its own. The agent's typed client (50/s, burst 100) is shared
// by the credential Secrets, discovery's typed informers (a relist of a
// large cluster is hundreds of pages) and the trust agent: a renewal
// queued behind their requests waits out its deadline, and the leader
// loses the Lease and exits while the apiserver is answering.
func leaseClient(cfg *rest.Config) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(kubeclient.OwnBudget(cfg, leaseQPS, leaseBurst))
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	l, err := logging.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	log := logging.New(w, l)
	logging.RouteKlog(log)
	return log, nil
}

// parts are the agent's components.
type parts struct {
	creds       *identity.Manager
	disc        *discovery.Discoverer
	session     *agent.Session
	leaderElect bool
	// leading: this replica has started its work (it never stops leading
	// but by exiting).
	leading atomic.Bool
}

// build makes the agent's components: its credentials, discovery, the
// applier and the relay session over them.
func build(cfg Config, env Env, log *slog.Logger) (*parts, error) {
	kube := env.Kube
	secrets, err := identity.NewKubeAgentSecrets(kube.Typed, cfg.Namespace)
	if err != nil {
		return nil, err
	}
	creds, err := identity.NewManager(identity.ManagerConfig{
		Cluster: cfg.Cluster, ServerAddress: cfg.ServerAddress, ServerName: cfg.ServerName, Secrets: secrets, Version: env.Version, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	// Dynamic: discovery reads the waypoints (Gateway API Gateways of
	// class istio-waypoint) where the cluster serves Gateways.
	disc, err := discovery.New(discovery.Config{Client: kube.Typed, Dynamic: kube.Dynamic, Cluster: cfg.Cluster, Logger: log})
	if err != nil {
		return nil, err
	}
	if cfg.AmbientFederation {
		log.Info("ambient federation on: applying global Services, WorkloadEntries and istio-remote Gateways (only objects labelled " + outputs.OwnerLabel + " are changed)")
	}
	var localNetworks func() []string
	if cfg.AmbientFailover {
		log.Warn("ambient failover on: WorkloadEntries of other networks may join a Service of this cluster that its owner labelled istio.io/global=true and that selects exactly their labels")
		localNetworks = func() []string { return snapshotNetworks(disc) }
	}
	applier, err := newApplier(kube, log, cfg.AmbientFederation, localNetworks)
	if err != nil {
		return nil, err
	}
	session, err := agent.NewSession(agent.SessionConfig{ServerAddress: cfg.ServerAddress, Cluster: cfg.Cluster, TLS: creds.ClientTLS, Version: env.Version, Logger: log,
		OnRefused: creds.Refused, TrustBundles: creds, Snapshots: disc, Applier: applier, Clock: env.Clock,
		Trust: &trust.Agent{Client: kube.Typed, Owner: Owner, Logger: log}})
	if err != nil {
		return nil, err
	}
	return &parts{creds: creds, disc: disc, session: session, leaderElect: cfg.LeaderElect}, nil
}

// newApplier applies with server-side apply through a cached discovery
// REST mapper, as Owner.
func newApplier(kube *kubeclient.Clients, log *slog.Logger, ambientFederation bool, localNetworks func() []string) (*apply.Applier, error) {
	dc, err := discoveryclient.NewDiscoveryClientForConfig(kube.Config)
	if err != nil {
		return nil, err
	}
	cfg := applierConfig(kube, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), log, ambientFederation)
	cfg.LocalNetworks = localNetworks
	return apply.New(cfg)
}

// snapshotNetworks are the networks of the meshes discovery reports in
// this cluster (istiod namespaces' topology.istio.io/network); none while
// discovery has not synced or fails (an entry that joins a Service is then
// refused: fail closed).
func snapshotNetworks(disc *discovery.Discoverer) []string {
	s, err := disc.Snapshot()
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range s.GetMeshes() {
		if n := m.GetNetwork(); n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// applierConfig is what the agent applies: the Istio kinds, and the
// Gateway API routes of ambient Destinations where the cluster serves
// them (optional kinds: a cluster without Gateway API's CRDs is not an
// error until a set holds a route); with ambientFederation, also what
// ambient federation writes (apply.AmbientFederationKinds).
func applierConfig(kube *kubeclient.Clients, mapper meta.RESTMapper, log *slog.Logger, ambientFederation bool) apply.Config {
	cfg := apply.Config{
		Dynamic: kube.Dynamic, Mapper: mapper, Owner: Owner, Logger: log,
		Kinds:         append(slices.Clone(apply.DefaultKinds), apply.GatewayRouteKinds...),
		OptionalKinds: slices.Clone(apply.GatewayRouteKinds),
	}
	if ambientFederation {
		cfg.Kinds = append(cfg.Kinds, apply.AmbientFederationKinds...)
		cfg.OptionalKinds = append(cfg.OptionalKinds, apply.AmbientFederationGateway)
	}
	return cfg
}

// work is the leader's: renew the credential, discover, and once both are
// ready hold the relay session (pull, apply, push) until ctx is done.
func (p *parts) work(ctx context.Context) error {
	p.leading.Store(true)
	go func() { _ = p.creds.Run(ctx) }()
	go func() { _ = p.disc.Run(ctx) }()
	for _, ready := range []<-chan struct{}{p.creds.Ready(), p.disc.Synced()} {
		select {
		case <-ctx.Done():
			return nil
		case <-ready:
		}
	}
	if err := p.session.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// lead runs the work while this replica holds the Lease, for one term
// (lease.Elector.RunOneTerm). Losing the Lease ends the process's work: it
// returns lease.ErrLost, the process exits with it, and its supervisor
// restarts it as a standby, so two replicas never apply at once. Work that
// ends on its own ends the term, and Run returns its error. On shutdown
// the work is stopped and waited for before the Lease is released, so a
// standby never starts while this replica is still applying.
func (p *parts) lead(ctx context.Context, cfg Config, client kubernetes.Interface, log *slog.Logger) error {
	id := cfg.Identity
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", host, time.Now().UnixNano()%100000)
	}
	e, err := lease.New(lease.Config{Client: client, Namespace: cfg.Namespace, Name: cfg.LeaseName, Identity: id,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod, StopWait: leaseStopWait, Logger: log})
	if err != nil {
		return err
	}
	termCtx, endTerm := context.WithCancel(ctx)
	defer endTerm()
	var (
		mu      sync.Mutex
		workErr error
	)
	e.Add(lease.Task{Name: "relay-session", Run: func(wctx context.Context) {
		log.Info("leading: this replica talks to the server and applies", "identity", id)
		err := p.work(wctx)
		if wctx.Err() == nil { // the work ended on its own: so does the term
			mu.Lock()
			workErr = err
			mu.Unlock()
			endTerm()
		}
	}})
	err = e.RunOneTerm(termCtx)
	mu.Lock()
	defer mu.Unlock()
	if workErr != nil {
		return workErr
	}
	return err
}
