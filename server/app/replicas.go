package app

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/lease"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/leader"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ReplicaHeartbeat is how often a replica renews its own Lease, and how
// often the leader looks for clusters of replicas that are gone (their
// Lease lasts 3 heartbeats).
const ReplicaHeartbeat = 5 * time.Second

// replicas is how this process works beside other replicas of the server.
type replicas struct {
	// several: one of several replicas under the Lease (--leader-elect);
	// false: the only one.
	several bool
	// name of this replica ("" when it is the only one).
	name string
	// add registers work that must run on one replica at a time; run runs
	// it (under the Lease, or unconditionally when this is the only
	// replica) until ctx ends.
	add func(lease.Task)
	run func(context.Context)
	// coord is the client of the output heads and the ack ledger (nil for
	// the only replica).
	coord kubernetes.Interface
	// leases is the client of the Leases (nil for the only replica): the
	// leader's and this replica's own, renewed and released, and the
	// replicas' Leases read (who is alive) and collected. A limiter of its
	// own, so a burst of head and ledger writes queued in coord's limiter
	// can neither hold a renewal past its deadline nor make a liveness
	// check seconds late.
	leases kubernetes.Interface
	// leading reports whether this replica runs the once-only work now.
	leading func() bool
	// abstain gives up the Lease and stops campaigning while true (nil for
	// the only replica).
	abstain func(bool)
	// root is this replica's part in a relay root rotation: the revision
	// it loaded, published on its Lease, and the task's metrics.
	root *rootRotation
}

// ReplicaName is name if set, else podName, else the host name and the
// process ID (two processes on one host must not share an identity: both
// would think they hold the Lease), made a DNS subdomain.
func ReplicaName(name, podName, host string, pid int) string {
	if name == "" {
		name = podName
	}
	if name == "" {
		name = fmt.Sprintf("%s-%d", host, pid)
	}
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, name)
	return strings.Trim(text.Truncate(name, 200), "-.")
}

// newReplicas sets up the replicas: the Lease relaymesh-server
// (LeaderElect, the default), or this process alone.
func (p *process) newReplicas(ctx context.Context) error {
	if err := p.newElection(ctx); err != nil {
		return err
	}
	var loaded func() (ca.RootRotationState, bool)
	if r, ok := p.signer.(*ca.RelayIssuers); ok {
		loaded = r.LoadedRootRotation
	}
	p.reps.root = newRootRotation(p.reg, loaded)
	return nil
}

// newElection sets up the Lease relaymesh-server, or this process alone.
func (p *process) newElection(context.Context) error {
	if !p.cfg.LeaderElect {
		p.log.Warn("leader election is off (--leader-elect=false): this process runs the once-only work; run exactly one server replica")
		var tasks []lease.Task
		p.reps = &replicas{add: func(t lease.Task) { tasks = append(tasks, t) }, run: func(ctx context.Context) {
			for _, t := range tasks {
				go t.Run(ctx)
			}
		}, leading: func() bool { return true }}
		return nil
	}
	coord, leases, err := coordinationClients(p.kube.Config)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	name := ReplicaName(p.cfg.ReplicaName, os.Getenv("POD_NAME"), host, os.Getpid())
	e, err := lease.New(lease.Config{Client: leases, Namespace: p.cfg.Namespace, Name: leader.ServerLease, Identity: name,
		LeaseDuration: p.cfg.LeaseDuration, RenewDeadline: p.cfg.RenewDeadline, RetryPeriod: p.cfg.RetryPeriod, Logger: p.log, Registerer: p.reg, Metrics: leader.Metrics()})
	if err != nil {
		return err
	}
	p.log.Info("leader election on: once-only work runs while this replica holds the Lease", "lease", p.cfg.Namespace+"/"+leader.ServerLease, "replica", name)
	p.reps = &replicas{several: true, name: name, add: e.Add, run: e.Run, leading: e.Leading, abstain: e.Abstain, coord: coord, leases: leases}
	return nil
}

// Request budgets of the replicas' coordination clients (coordinationClients).
const (
	coordQPS, coordBurst   = 50, 100
	leasesQPS, leasesBurst = 10, 20
)

// coordinationClients returns the clients of the replicas' coordination,
// each with a rate limiter of its own and none shared with cfg's (the
// server's clients, behind which a storm's thousands of status and mirror
// writes queue):
//   - coord writes the output heads and the ack ledger: at most a few
//     shard writes per batch, but a storm or a fleet's removal is many
//     batches;
//   - leases renews the leader Lease and this replica's own, a few
//     requests every RetryPeriod and ReplicaHeartbeat, and reads and
//     collects the replicas' Leases now and then. When the Leases shared
//     coord, a renewal queued behind its writes waited out its deadline:
//     the replica lost the Lease, or counted itself cut off and ended its
//     agents' sessions, while the apiserver was answering.
func coordinationClients(cfg *rest.Config) (coord, leases kubernetes.Interface, err error) {
	client := func(qps float32, burst int) (kubernetes.Interface, error) {
		return kubernetes.NewForConfig(kubeclient.OwnBudget(cfg, qps, burst))
	}
	if coord, err = client(coordQPS, coordBurst); err != nil {
		return nil, nil, err
	}
	if leases, err = client(leasesQPS, leasesBurst); err != nil {
		return nil, nil, err
	}
	return coord, leases, nil
}

// heartbeat renews this replica's own Lease (several replicas only). A
// replica cut off from the apiserver cannot learn of deregistrations: it
// fails closed and its agents move on. As it stops, it deletes its Lease:
// waiting for that lets the leader sweep its sessions at once.
func (p *process) heartbeat(ctx context.Context) {
	if !p.reps.several {
		return
	}
	hb := p.heartbeatConfig(p.srv.SetIsolated)
	if p.sharedSnaps != nil {
		hb.Store = func() string { return storeState(p.sharedSnaps) }
		go p.sharedSnaps.Guard(ctx, storeCutGrace, storeDetect, p.othersReachStore, func(cut bool) {
			p.srv.SetCutOff(server.CutOffSnapshotStore, cut)
			p.reps.abstain(cut)
		})
	}
	done := make(chan struct{})
	go func() {
		leader.Heartbeat(ctx, hb)
		close(done)
	}()
	p.waitFor(done, 3*time.Second, "")
}

// heartbeatConfig is how this replica renews its own Lease; isolated hears
// when it counts itself cut off from the apiserver, and back.
func (p *process) heartbeatConfig(isolated func(bool)) leader.HeartbeatConfig {
	return leader.HeartbeatConfig{Client: p.reps.leases, Namespace: p.cfg.Namespace, Replica: p.reps.name, Period: ReplicaHeartbeat, Logger: p.log, Isolated: isolated,
		Annotations: p.reps.root.load.annotations}
}
