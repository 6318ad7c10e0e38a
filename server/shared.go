package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server/snapshots"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
)

// SnapshotStore is the replicas' shared store of snapshots
// (snapshots.Store, in Redis).
type SnapshotStore interface {
	Put(ctx context.Context, r snapshots.Record) (string, error)
	Stamp(ctx context.Context, cluster string) (string, error)
	Delete(ctx context.Context, cluster string) error
	Clusters(ctx context.Context) (map[string]string, error)
	Watch(ctx context.Context, h snapshots.Handler) error
}

// SharedSnapshots shares the snapshots every replica accepts through a
// SnapshotStore, for a fleet whose discovered Workloads do not fit the
// management cluster's etcd (docs/design/2026-11-25-high-availability.md,
// "The budget"):
//
//   - the replica holding a cluster's session writes each snapshot it
//     accepts (a keyed work queue: the latest wins, failures are retried,
//     and every Resync, or when the store comes back, a record that is not
//     the one it wrote is written again — an emptied store is refilled by
//     the replicas that hold the sessions). It writes it again at once when
//     a replica of its own refuses the stored one (forged, or an older one
//     written back) or the record is announced deleted while the cluster
//     is registered;
//   - every replica watches the store and keeps every cluster's Workloads,
//     which translation and the dashboard read instead of Workload objects
//     (Workloads, OnChange). While the store is unreachable it keeps the
//     last ones it read: translation goes on with them rather than with a
//     view that has holes. It drops a cluster's Workloads only when its
//     registry says the cluster is gone: a record deleted from the store,
//     or a forged delete announcement, changes nothing of a registered
//     cluster;
//   - the Lease holder deletes the records of clusters no longer registered
//     (Collect).
//
// Meshes and Destinations stay in the apiserver (the Mirror writes them),
// and every cluster's status counts what its snapshot holds.
type SharedSnapshots struct {
	cfg   SharedConfig
	log   *slog.Logger
	queue workqueue.TypedRateLimitingInterface[string]

	mu        sync.RWMutex
	clusters  map[string]*sharedCluster
	written   map[string]string // cluster → mark of this replica's last write (snapshots.Store.Put)
	listeners []func()
	version   atomic.Uint64
	synced    chan struct{}
	once      sync.Once
	lost      atomic.Bool
	// lostAt is when the store stopped answering (nil: it answers);
	// failedAt when this replica last failed to reach it.
	lostAt   atomic.Pointer[time.Time]
	failedAt atomic.Pointer[time.Time]
}

// SharedConfig configures SharedSnapshots.
type SharedConfig struct {
	Store SnapshotStore
	// View holds the snapshots this replica accepted. Required.
	View *View
	// Namespace of the discovered objects the Workloads are named in.
	// Required.
	Namespace string
	// Replica names this replica in the records it writes.
	Replica string
	// Owns says which clusters this replica writes (it holds their
	// session); nil: every cluster in View.
	Owns func(cluster string) bool
	// Registered says which clusters are registered: Workloads lists only
	// theirs, and Collect deletes the records of the others. Required.
	Registered func(cluster string) bool
	// Resync compares this replica's records with the store's this often
	// (default 1m).
	Resync time.Duration
	Logger *slog.Logger
}

// sharedCluster is what a replica read of one cluster from the store.
type sharedCluster struct {
	at        string
	hash      string
	workloads []discoveryv1alpha1.Workload
}

// NewSharedSnapshots returns the shared snapshots of cfg; call Run.
func NewSharedSnapshots(cfg SharedConfig) (*SharedSnapshots, error) {
	switch {
	case cfg.Store == nil:
		return nil, fmt.Errorf("shared snapshots: Store is required")
	case cfg.View == nil:
		return nil, fmt.Errorf("shared snapshots: View is required")
	case cfg.Namespace == "":
		return nil, fmt.Errorf("shared snapshots: Namespace is required")
	case cfg.Registered == nil:
		return nil, fmt.Errorf("shared snapshots: Registered is required")
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &SharedSnapshots{cfg: cfg, log: cfg.Logger.With("component", "shared-snapshots"),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "shared-snapshots"}),
		clusters: map[string]*sharedCluster{}, written: map[string]string{}, synced: make(chan struct{})}
	cfg.View.OnSnapshot(s.queue.Add)
	return s, nil
}

// Run writes and watches until ctx ends.
func (s *SharedSnapshots) Run(ctx context.Context) {
	defer s.queue.ShutDown()
	go func() { _ = s.cfg.Store.Watch(ctx, s) }()
	for range 8 {
		go func() {
			for s.processNext(ctx) {
			}
		}()
	}
	t := time.NewTicker(s.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.resync(ctx)
		}
	}
}

// WaitSynced waits until the first read of the store completed.
func (s *SharedSnapshots) WaitSynced(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("the snapshot store was not read: %w", ctx.Err())
	case <-s.synced:
		return nil
	}
}

func (s *SharedSnapshots) processNext(ctx context.Context) bool {
	return processKey(ctx, s.queue, s.write, s.log, "could not write a snapshot to the store; will retry")
}

// write stores cluster's snapshot if this replica holds its session.
func (s *SharedSnapshots) write(ctx context.Context, cluster string) error {
	if s.cfg.Owns != nil && !s.cfg.Owns(cluster) {
		return nil
	}
	cv, _ := s.cfg.View.State(cluster)
	snap, err := s.cfg.View.Load(cluster) // an error, not "left the view"
	if err != nil {
		return err
	}
	if snap == nil {
		// Left the view: deregistered (Collect deletes its record) or moved
		// to another replica (which writes it).
		return nil
	}
	written, err := s.cfg.Store.Put(ctx, snapshots.Record{Cluster: cluster, Snapshot: snap, Replica: s.cfg.Replica, AcceptedAt: cv.AcceptedAt})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.written[cluster] = written
	s.mu.Unlock()
	return nil
}

// resync queues every cluster this replica holds whose record in the
// store is not the one it wrote (the store was emptied, another replica's
// late write replaced it, or someone wrote an older record back): the
// marks differ.
func (s *SharedSnapshots) resync(ctx context.Context) {
	for _, cluster := range s.cfg.View.Names() {
		if !s.cfg.View.HasSnapshot(cluster) || (s.cfg.Owns != nil && !s.cfg.Owns(cluster)) {
			continue
		}
		stored, err := s.cfg.Store.Stamp(ctx, cluster)
		if err != nil {
			s.log.Warn("could not compare with the snapshot store", "error", err)
			return
		}
		s.mu.RLock()
		mine := s.written[cluster]
		s.mu.RUnlock()
		if stored == "" || stored != mine {
			s.queue.Add(cluster)
		}
	}
}

// Collect deletes the records of clusters that are not registered; the
// Lease holder calls it (at start, every Resync, and when a cluster is
// deregistered).
func (s *SharedSnapshots) Collect(ctx context.Context) error {
	stored, err := s.cfg.Store.Clusters(ctx)
	if err != nil {
		return err
	}
	for cluster := range stored {
		if s.cfg.Registered(cluster) {
			continue
		}
		if err := s.cfg.Store.Delete(ctx, cluster); err != nil {
			return err
		}
		s.log.Info("deleted the stored snapshot of an unregistered cluster", "cluster", cluster)
	}
	return nil
}

// Changed implements snapshots.Handler.
func (s *SharedSnapshots) Changed(e snapshots.Event) {
	if e.Record == nil {
		if s.cfg.Registered(e.Cluster) {
			// Deleted, though the cluster is registered: not Collect's
			// doing. Keep its last verified Workloads; the replica holding
			// its session writes the record again.
			s.log.Warn("the stored snapshot of a registered cluster was deleted; keeping its last verified one", "cluster", e.Cluster)
			s.rewrite(e.Cluster)
			return
		}
		s.mu.Lock()
		_, had := s.clusters[e.Cluster]
		delete(s.clusters, e.Cluster)
		s.mu.Unlock()
		if had {
			s.changed()
		}
		return
	}
	snap := e.Record.Snapshot
	s.mu.RLock()
	cur := s.clusters[e.Cluster]
	s.mu.RUnlock()
	if cur != nil && cur.hash == snap.GetHash() {
		s.mu.Lock()
		cur.at = e.At
		s.mu.Unlock()
		return
	}
	ws := make([]discoveryv1alpha1.Workload, 0, len(snap.GetWorkloads()))
	for _, w := range snap.GetWorkloads() {
		wl, err := SharedWorkload(e.Cluster, s.cfg.Namespace, w)
		if err != nil {
			s.log.Error("could not read a workload of a stored snapshot; keeping this cluster's last ones", "cluster", e.Cluster, "error", err)
			return
		}
		ws = append(ws, wl)
	}
	s.mu.Lock()
	s.clusters[e.Cluster] = &sharedCluster{at: e.At, hash: snap.GetHash(), workloads: ws}
	s.mu.Unlock()
	s.changed()
}

// Refused implements snapshots.RefusedHandler: the store holds a record
// of cluster that does not verify or is older than one read before. The
// Workloads stay as they were; if this replica holds the cluster's
// session, it writes the record again now.
func (s *SharedSnapshots) Refused(cluster string, err error) {
	s.rewrite(cluster)
}

// rewrite queues cluster's snapshot for writing if this replica holds it.
func (s *SharedSnapshots) rewrite(cluster string) {
	if s.cfg.Owns != nil && !s.cfg.Owns(cluster) || !s.cfg.View.Has(cluster) {
		return
	}
	s.log.Info("writing this replica's snapshot of the cluster to the store again", "cluster", cluster)
	s.queue.Add(cluster)
}

// Synced implements snapshots.Handler.
func (s *SharedSnapshots) Synced() {
	s.once.Do(func() { close(s.synced) })
	s.lostAt.Store(nil)
	if s.lost.Swap(false) {
		// The store may have been emptied (a restart without persistence):
		// write back what this replica holds now, not at the next Resync.
		s.log.Info("snapshot store back; writing this replica's snapshots again where the store lacks them")
		go s.resync(context.Background())
	}
}

// Lost implements snapshots.Handler.
func (s *SharedSnapshots) Lost(err error) {
	s.lost.Store(true)
	now := time.Now()
	s.lostAt.CompareAndSwap(nil, &now)
	if !snapshots.StoreAnswered(err) {
		// Only a failure to reach the store is evidence of a cut: one the
		// store answered (closed, reset, an error reply) is the store
		// failing, as when it restarts while others already reconnected.
		s.failedAt.Store(&now)
	}
}

// Reachable reports whether this replica is subscribed to the store, and
// if not, for how long it has not been.
func (s *SharedSnapshots) Reachable() (bool, time.Duration) {
	if at := s.lostAt.Load(); at != nil {
		return false, time.Since(*at)
	}
	return true, 0
}

// Guard decides, every grace/4 until ctx ends, whether this replica is cut
// off from the store (storeCutOff): unreachable from here while another
// live replica reaches it. Then what its agents push reaches no other
// replica, and a leader would decide every cluster's outputs on a stale
// view: cut(true) makes it fail closed (its agents move on) and give up
// leading. A store that no replica reaches is down, not cut off: every
// replica keeps serving what it read. cut(false) once it reaches the store
// again.
//
// othersReach returns when another live replica last said it reaches the
// store (zero: none does).
func (s *SharedSnapshots) Guard(ctx context.Context, grace, detect time.Duration, othersReach func(context.Context) (time.Time, error), cut func(bool)) {
	isCut := false
	t := time.NewTicker(grace / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lost, failed := s.lostAt.Load(), s.failedAt.Load()
		next := false
		switch {
		case lost == nil:
		case isCut:
			next = true // cut off until it reaches the store again
		case failed != nil && time.Since(*lost) >= grace:
			reached, err := othersReach(ctx)
			if err != nil {
				continue // cannot tell: stay as decided
			}
			next = storeCutOff(*lost, *failed, reached, detect)
		}
		if next != isCut {
			isCut = next
			if next {
				s.log.Error("cut off from the snapshot store while other replicas reach it", "unreachable_for", time.Since(*lost).Round(time.Millisecond))
			}
			cut(next)
		}
	}
}

// storeCutOff decides whether a replica that lost the store at lost, and
// last failed to reach it at failed, is cut off from it, given that another
// replica last said it reaches it at reached (zero: none). Only a report
// made once this replica had been unreachable for detect (how long any
// replica may take to notice a loss) counts, so replicas that notice a
// store's outage one after the other do not take each other's stale
// reports for a cut; and this replica must have failed again after it, so
// one that is only waiting out its back-off when the store returns is not
// cut off.
func storeCutOff(lost, failed, reached time.Time, detect time.Duration) bool {
	return !reached.IsZero() && reached.After(lost.Add(detect)) && failed.After(reached)
}

func (s *SharedSnapshots) changed() {
	s.version.Add(1)
	s.mu.RLock()
	ls := slices.Clone(s.listeners)
	s.mu.RUnlock()
	for _, f := range ls {
		f()
	}
}

// OnChange registers f to be called (without locks held) whenever what
// Workloads returns may have changed.
func (s *SharedSnapshots) OnChange(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, f)
}

// Version changes whenever what Workloads returns may have changed.
func (s *SharedSnapshots) Version() string {
	return "shared-" + strconv.FormatUint(s.version.Load(), 10)
}

// Workloads lists the Workloads of every registered cluster, as the store
// last showed them.
func (s *SharedSnapshots) Workloads() []discoveryv1alpha1.Workload {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, c := range s.clusters {
		n += len(c.workloads)
	}
	out := make([]discoveryv1alpha1.Workload, 0, n)
	for cluster, c := range s.clusters {
		if s.cfg.Registered(cluster) {
			out = append(out, c.workloads...)
		}
	}
	return out
}

// SharedWorkload is the Workload a discovered workload of cluster is: the
// object the Mirror would write but for its version, which is the spec's
// hash (UID, generation 1), so translation sees it change exactly when its
// spec does.
func SharedWorkload(cluster, namespace string, w *relaypb.Workload) (discoveryv1alpha1.Workload, error) {
	spec := workloadSpec(cluster, namespace, w)
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return discoveryv1alpha1.Workload{}, err
	}
	meta := discoveredMeta(w.GetKind(), cluster, w.GetNamespace(), w.GetName(), namespace)
	meta.UID, meta.Generation = types.UID("spec-"+specSum(specJSON)[:32]), 1
	return discoveryv1alpha1.Workload{TypeMeta: metav1.TypeMeta{APIVersion: discoveryv1alpha1.GroupVersion.String(), Kind: "Workload"}, ObjectMeta: meta, Spec: spec}, nil
}
