package app

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/lease"
	"github.com/relaymesh/relaymesh/server/leader"
)

// setup is what decides which once-only work a process has.
type setup struct {
	// several: one of several replicas (--leader-elect); else the only one.
	several bool
	// redis: the snapshot store is Redis.
	redis bool
	// kubeconfig: kubeconfig-mode clusters are allowed.
	kubeconfig bool
	// webhook: the admission webhook is served.
	webhook bool
}

// Which processes have a piece of once-only work.
func always(setup) bool               { return true }
func severalReplicas(s setup) bool    { return s.several }
func redisStore(s setup) bool         { return s.redis }
func kubeconfigClusters(s setup) bool { return s.kubeconfig }
func webhookServed(s setup) bool      { return s.webhook }

// onceOnlyTask is work that must run on one replica at a time: under the
// Lease relaymesh-server with several replicas, unconditionally on the
// only one.
type onceOnlyTask struct {
	name string
	// when says which processes have it.
	when func(setup) bool
	run  func(*process, context.Context)
}

// onceOnlyWork is all of the server's once-only work. With several
// replicas only the Lease holder runs it; every replica serves agents, the
// webhook and its own output versions in any case.
var onceOnlyWork = []onceOnlyTask{
	// One audit record per minted token, not one per replica.
	{name: "token-mint-audit", when: always, run: (*process).auditTokenMints},
	// Token records that are done with: spent ones once their retry window
	// is over, unspent ones a day after they expired (the task keeps its
	// first name, a metric label value).
	{name: "spent-token-collection", when: always, run: (*process).collectTokens},
	// The sessions of replicas that are gone (their Lease expired).
	{name: "session-sweep", when: severalReplicas, run: (*process).sweepSessions},
	// Pods get new names on every rollout: the Leases of replicas gone
	// for long are deleted, so they do not pile up.
	{name: "replica-lease-collection", when: severalReplicas, run: (*process).collectReplicaLeases},
	// relay-server-tls-secret has one writer: the only replica writes it at
	// once (newServing), with several the Lease holder.
	{name: "serving-secret", when: severalReplicas, run: (*process).publishServingSecret},
	// The relay issuing CA has one renewer: it signs the next issuing CA
	// with the root, or warns that a provided one must be replaced.
	{name: "relay-issuer-renewal", when: always, run: (*process).renewRelayIssuer},
	// The relay root has one rotator: it steps the rotation once every
	// connected agent stored the bundle and every replica loaded it.
	{name: "relay-root-rotation", when: always, run: (*process).rotateRelayRoot},
	{name: "snapshot-store-collection", when: redisStore, run: (*process).collectSharedSnapshots},
	// Discovered objects of clusters that are no longer registered.
	{name: "orphan-collection", when: always, run: (*process).collectOrphans},
	// Ack records of clusters that are no longer registered (only the Lease
	// holder forgets them, so some may be left from between two terms).
	{name: "ack-ledger-collection", when: severalReplicas, run: (*process).pruneAckLedger},
	// Replicas serve one order of output versions: the leader's heads.
	{name: "output-heads", when: severalReplicas, run: (*process).leadHeads},
	{name: "status-and-rotation", when: always, run: (*process).driveStatusAndRotation},
	// Foreign SPIFFE bundles (FederatedTrustDomains) have one fetcher and
	// one status writer.
	{name: "spiffe-import", when: always, run: (*process).importForeignBundles},
	// One replica at a time discovers and applies to a kubeconfig-mode
	// cluster.
	{name: "kubeconfig-clusters", when: kubeconfigClusters, run: (*process).runInProcessAgents},
	// Every replica serves the webhook; one writes its configuration.
	{name: "webhook-configuration", when: webhookServed, run: (*process).registerWebhook},
}

// tasksFor is the once-only work of a process set up as s.
func tasksFor(s setup) []onceOnlyTask {
	var out []onceOnlyTask
	for _, t := range onceOnlyWork {
		if t.when(s) {
			out = append(out, t)
		}
	}
	return out
}

// Metrics of the once-only work, by task label: every task this process
// has is listed from the start (0).
const (
	// MetricOnceOnlyRunning is 1 while the task runs on this replica.
	MetricOnceOnlyRunning = "relaymesh_server_once_only_running"
	// MetricOnceOnlyStarts counts the times this replica started the task.
	MetricOnceOnlyStarts = "relaymesh_server_once_only_starts_total"
)

// addOnceOnlyWork registers this process's once-only work with its
// replicas, each task reported by relaymesh_server_once_only_running and
// relaymesh_server_once_only_starts_total.
func (p *process) addOnceOnlyWork() {
	running := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricOnceOnlyRunning,
		Help: "1 while this replica runs the once-only task (task label); with several replicas only the Lease holder runs them."}, []string{"task"})
	starts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricOnceOnlyStarts,
		Help: "Times this replica started the once-only task (task label): at each term it leads, or once on the only replica."}, []string{"task"})
	p.reg.MustRegister(running, starts)
	for _, t := range tasksFor(p.setup()) {
		g, c := running.WithLabelValues(t.name), starts.WithLabelValues(t.name)
		g.Set(0)
		p.reps.add(lease.Task{Name: t.name, Run: func(ctx context.Context) {
			c.Inc()
			g.Set(1)
			defer g.Set(0)
			t.run(p, ctx)
		}})
	}
}

// setup is what this process was built with.
func (p *process) setup() setup {
	return setup{several: p.reps.several, redis: p.sharedSnaps != nil, kubeconfig: p.inProcess != nil, webhook: p.webhook != nil}
}

// runOnceOnlyWork runs the once-only work until ctx ends; Run waits (up to
// the renew deadline) for it to stop, which lets the elector release the
// Lease, so another replica takes over at once instead of after the lease
// duration.
func (p *process) runOnceOnlyWork(ctx context.Context) {
	done := make(chan struct{})
	go func() { p.reps.run(ctx); close(done) }()
	p.waitFor(done, p.cfg.RenewDeadline, "once-only work did not stop in time; the Lease expires on its own")
}

// The tasks of onceOnlyWork.

func (p *process) auditTokenMints(ctx context.Context) {
	// The token store's watch of the records (newTokens), not one of its own.
	if err := identity.AuditTokenMints(ctx, p.tokenStore.Records(), p.kube.Typed, p.cfg.Namespace, p.audit, p.log); err != nil && ctx.Err() == nil {
		p.log.Error("cannot watch bootstrap tokens: their minting is not audited", "error", err)
	}
	<-ctx.Done()
}

// tokenCollection is how often the token records are looked at: a spent
// one goes at most this long after its retry window, one that expired
// unspent at most this long after its retention.
const tokenCollection = time.Minute

func (p *process) collectTokens(ctx context.Context) {
	lastErr := "" // a record that stays malformed is reported once, not every minute
	for {
		n, err := p.tokenStore.Collect(ctx, time.Now())
		switch {
		case err != nil && ctx.Err() == nil && err.Error() != lastErr:
			lastErr = err.Error()
			p.log.Warn("could not delete every finished bootstrap token record", "deleted", n, "error", err)
		case err == nil:
			lastErr = ""
		}
		if n > 0 {
			p.log.Info("deleted bootstrap token records spent past their retry window or expired unspent past their retention",
				"records", n, "retry_window", identity.RetryWindow, "expired_retention", identity.ExpiredRetention)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(tokenCollection):
		}
	}
}

func (p *process) sweepSessions(ctx context.Context) {
	p.status.Sweep(ctx, ReplicaHeartbeat, func(ctx context.Context) (map[string]bool, error) {
		return leader.Alive(ctx, p.reps.leases, p.cfg.Namespace)
	})
}

func (p *process) collectReplicaLeases(ctx context.Context) {
	for {
		if gone, err := leader.CollectGone(ctx, p.reps.leases, p.cfg.Namespace, time.Now()); err != nil && ctx.Err() == nil {
			p.log.Warn("could not delete the Leases of gone replicas", "error", err)
		} else if len(gone) > 0 {
			p.log.Info("deleted the Leases of replicas gone for long", "leases", gone, "gone_for", leader.GoneAfter)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Minute):
		}
	}
}

func (p *process) publishServingSecret(ctx context.Context) {
	if err := p.serving.Publish(ctx); err != nil && ctx.Err() == nil {
		p.log.Warn("could not store the serving certificate's secret", "error", err)
	}
	<-ctx.Done()
}

func (p *process) collectOrphans(ctx context.Context) {
	if err := p.mirror.CollectOrphans(ctx, p.registered); err != nil {
		p.log.Warn("could not delete discovered objects of unregistered clusters", "error", err)
	}
}

func (p *process) pruneAckLedger(context.Context) {
	if n := p.ledger.Prune(p.registered); n > 0 {
		p.log.Info("forgetting the ack records of clusters no longer registered", "clusters", n)
	}
}

func (p *process) leadHeads(ctx context.Context) { p.heads.Lead(ctx) }

// driveStatusAndRotation starts a term's statuses and rotations: without
// heads (the only replica) nothing else does; at a term's end, a follower
// re-reads what it follows.
func (p *process) driveStatusAndRotation(ctx context.Context) {
	p.ctl.Kick()
	p.trust.Kick()
	<-ctx.Done()
	p.ctl.Kick()
	p.trust.Kick()
}

// runInProcessAgents discovers and applies to the kubeconfig-mode clusters;
// at the end of its term the next leader's mirror takes the clusters'
// discovered objects over.
func (p *process) runInProcessAgents(ctx context.Context) {
	for _, cluster := range p.inProcess.Run(ctx) {
		p.mirror.Kick(cluster)
	}
}

func (p *process) importForeignBundles(ctx context.Context) { p.importer.Run(ctx) }
