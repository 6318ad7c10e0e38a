package server

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Labels and annotations on discovered objects in the management cluster.
const (
	// LabelCluster is the cluster a discovered object came from.
	LabelCluster   = discoveryv1alpha1.LabelCluster
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// AnnotationSpecSum is the SHA-256 of a discovered object's spec (its
	// JSON), which the mirror compares instead of the spec.
	AnnotationSpecSum = "relaymesh.io/spec-sha256"
	mirrorManager     = "relaymesh-server"
)

// Mirror writes each cluster's accepted snapshot as Mesh, Workload and
// Destination objects in the management cluster, in one namespace, labelled
// with the cluster: it applies what changed (by a hash of the spec kept in
// an annotation) and deletes what disappeared, comparing against an
// informer's cache rather than listing. A keyed work queue coalesces a
// cluster's snapshots (the latest wins), retries failures with backoff, and
// several workers write clusters in parallel, each cluster's writes in
// parallel too, so a thousand clusters arriving at once are written at the
// rate the Kubernetes client allows rather than one cluster at a time.
type Mirror struct {
	client    dynamic.Interface
	shared    *kubeinformers.Shared
	namespace string
	view      *View
	log       *slog.Logger
	cfg       MirrorConfig

	informers map[schema.GroupVersionResource]cache.SharedIndexInformer
	queue     workqueue.TypedRateLimitingInterface[string]
	started   chan struct{}
	writes    *prometheus.CounterVec

	// expected holds the writes made but not yet seen in the cache, so a
	// sync before the watch catches up does not write them again.
	expMu    sync.Mutex
	expected map[string]expectation

	// Clusters that left, whose objects go in a few DeleteCollections
	// for many clusters at once: pending waits for the collector,
	// collected were sent (by when), until the cache shows them gone.
	colMu      sync.Mutex
	pending    map[string]bool
	collected  map[string]time.Time
	collectNow chan struct{}
	// perObject: DeleteCollection was refused (an older chart's Role);
	// objects are deleted one by one, with delete.
	perObject atomic.Bool

	// unchanged: clusters whose last sync found every object as their
	// snapshot has it, by that snapshot's hash and the cluster's last
	// event then. events: the sequence number (eventSeq, never reused) of
	// the last event the informers saw of each cluster's objects: a
	// delete, or an add or update that is not the cache showing a write
	// of the mirror's own. The resync skips a marked cluster while both
	// hold.
	uncMu     sync.Mutex
	unchanged map[string]unchangedMark
	events    map[string]uint64
	eventSeq  uint64
}

type unchangedMark struct {
	hash   string
	events uint64
}

// touched counts an event of the informers for the cluster of obj: it
// must be compared at the next resync.
func (m *Mirror) touched(obj any) {
	c := clusterOf(obj)
	if c == "" {
		return
	}
	m.uncMu.Lock()
	m.eventSeq++
	m.events[c] = m.eventSeq
	delete(m.unchanged, c)
	m.uncMu.Unlock()
}

// pruneEvents forgets the events and marks of clusters not in live
// (neither objects nor a snapshot left of them). A cluster that comes
// back has no mark; its events are numbered on from eventSeq.
func (m *Mirror) pruneEvents(live []string) {
	keep := make(map[string]bool, len(live))
	for _, c := range live {
		keep[c] = true
	}
	m.uncMu.Lock()
	defer m.uncMu.Unlock()
	maps.DeleteFunc(m.events, func(c string, _ uint64) bool { return !keep[c] })
	maps.DeleteFunc(m.unchanged, func(c string, _ unchangedMark) bool { return !keep[c] })
}

func (m *Mirror) eventsOf(cluster string) uint64 {
	m.uncMu.Lock()
	defer m.uncMu.Unlock()
	return m.events[cluster]
}

// markUnchanged records that a sync of cluster, begun when it had seen
// events events, found every object as snapshot hash has them; an event
// since (the sync did not see it) leaves it unmarked.
func (m *Mirror) markUnchanged(cluster, hash string, events uint64) {
	m.uncMu.Lock()
	defer m.uncMu.Unlock()
	if m.events[cluster] == events && hash != "" {
		m.unchanged[cluster] = unchangedMark{hash: hash, events: events}
	}
}

// isUnchanged reports whether cluster was found unchanged for the
// snapshot the view holds, with no event since.
func (m *Mirror) isUnchanged(cluster string) bool {
	hash, ok := m.view.SnapshotHash(cluster)
	m.uncMu.Lock()
	defer m.uncMu.Unlock()
	mark, marked := m.unchanged[cluster]
	if !ok || !marked || mark.hash != hash || mark.events != m.events[cluster] {
		delete(m.unchanged, cluster)
		return false
	}
	return true
}

// expectation is a write the cache has not shown yet: an apply of spec sum
// sum, or (sum empty) the delete of the object uid.
type expectation struct {
	sum string
	uid types.UID
	at  time.Time
}

// expectationTTL bounds how long a write not seen in the cache is trusted;
// after it the object is compared (and written) again.
const expectationTTL = time.Minute

// MirrorConfig tunes a Mirror; the zero value is the default.
type MirrorConfig struct {
	// Workers is the number of clusters written at once (default 16).
	Workers int
	// Writes is the number of a cluster's objects written at once
	// (default 8).
	Writes int
	// Resync compares every cluster again at this interval, repairing
	// objects changed or deleted by hand (default 5m), except those found
	// unchanged with nothing seen of them since (isUnchanged).
	Resync time.Duration
	// Registerer, if set, gets relaymesh_mirror_writes_total.
	Registerer prometheus.Registerer
	// Owns, if set, says which clusters this replica writes: with several
	// server replicas, the one holding a cluster's session writes its
	// objects, and the leader deletes those of clusters no longer
	// registered. A cluster it does not own is never written nor deleted
	// here, whatever this replica's view holds. Nil: every cluster (one
	// replica).
	Owns func(cluster string) bool
	// WorkloadsElsewhere: the Workloads live in the replicas' shared
	// snapshot store (SharedSnapshots), not in the apiserver; Workload
	// objects left from before are deleted like those of a cluster that
	// has none.
	WorkloadsElsewhere bool
	// Informers, when set, are the process's shared informers
	// (kubeinformers.Shared). Nil: the mirror watches on its own.
	Informers *kubeinformers.Shared
}

func (c MirrorConfig) withDefaults() MirrorConfig {
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.Writes <= 0 {
		c.Writes = 8
	}
	if c.Resync <= 0 {
		c.Resync = 5 * time.Minute
	}
	return c
}

// indexCluster indexes discovered objects by the cluster they came from.
const indexCluster = "cluster"

// NewMirror returns a mirror of view with the default configuration; call
// Run.
func NewMirror(client dynamic.Interface, namespace string, view *View, log *slog.Logger) *Mirror {
	return NewMirrorWithConfig(client, namespace, view, log, MirrorConfig{})
}

// NewMirrorWithConfig returns a mirror of view; call Run.
func NewMirrorWithConfig(client dynamic.Interface, namespace string, view *View, log *slog.Logger, cfg MirrorConfig) *Mirror {
	m := &Mirror{client: client, namespace: namespace, view: view, log: log.With("component", "discovery-mirror"), cfg: cfg.withDefaults(),
		informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "discovery-mirror"}),
		started:  make(chan struct{}),
		expected: map[string]expectation{},
		pending:  map[string]bool{}, collected: map[string]time.Time{}, collectNow: make(chan struct{}, 1),
		unchanged: map[string]unchangedMark{}, events: map[string]uint64{},
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "relaymesh_mirror_writes_total",
			Help: "Writes of discovered objects to the management cluster, by operation (apply, delete, delete-collection) and result (ok, error)."}, []string{"operation", "result"}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(m.writes)
	}
	// Every object of the namespace, not only labelled ones: a hand-made
	// object under a discovered name must be seen to be left alone.
	m.shared = cfg.Informers.OrNew(client, namespace)
	for _, gvr := range discoveredResources {
		inf := m.shared.Local.Informer(gvr)
		if err := inf.AddIndexers(cache.Indexers{indexCluster: func(obj any) ([]string, error) {
			if o, ok := obj.(metav1.Object); ok {
				if c := o.GetLabels()[LabelCluster]; c != "" {
					return []string{c}, nil
				}
			}
			return nil, nil
		}}); err != nil {
			panic(err) // only fails on a stopped informer or a duplicate index name
		}
		// An object seen as the mirror wrote it ends the expectation of
		// that write; any other add or update is counted against its
		// cluster (touched), which the next resync then compares.
		seen := func(obj any) {
			ours := false
			if u, ok := obj.(metav1.Object); ok {
				m.expMu.Lock()
				key := expectKey(gvr, u.GetName())
				if e, ok := m.expected[key]; ok && e.sum != "" && e.sum == u.GetAnnotations()[AnnotationSpecSum] {
					delete(m.expected, key)
					ours = true
				}
				m.expMu.Unlock()
			}
			if !ours {
				m.touched(obj)
			}
		}
		// No resync of the shared informer: the mirror's own resync
		// (m.cfg.Resync) compares the clusters itself.
		if _, err := inf.AddEventHandlerWithResyncPeriod(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(old, obj any) {
			if clusterOf(old) != clusterOf(obj) {
				m.touched(old) // an object taken from its cluster
			}
			seen(obj)
		}, DeleteFunc: func(obj any) {
			// A delete seen ends any expectation of the object: if it was
			// deleted by someone else, it is written again.
			m.touched(obj)
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				_, name, _ := cache.SplitMetaNamespaceKey(key)
				m.expMu.Lock()
				delete(m.expected, expectKey(gvr, name))
				m.expMu.Unlock()
			}
			// The object of a cluster still in the view went: deleted by
			// hand, or by a collection that raced the cluster's return.
			// Its cluster is compared again now, not at the resync.
			if c := clusterOf(obj); c != "" && m.view.HasSnapshot(c) {
				m.queue.Add(c)
			}
		}}, 0); err != nil {
			panic(err)
		}
		m.informers[gvr] = inf
	}
	view.OnSnapshot(m.queue.Add)
	return m
}

var discoveredResources = []schema.GroupVersionResource{discoveryv1alpha1.Meshes, discoveryv1alpha1.Workloads, discoveryv1alpha1.Destinations}

// Run syncs clusters until ctx ends: each one whose snapshot changed or
// that left the view, failed ones again after a backoff, and at each
// resync every cluster with objects or a snapshot that is not marked
// unchanged.
func (m *Mirror) Run(ctx context.Context) {
	defer m.queue.ShutDown()
	synced := make([]cache.InformerSynced, 0, len(m.informers))
	m.shared.Start(ctx.Done())
	for _, inf := range m.informers {
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	close(m.started)
	go m.collect(ctx)
	for range m.cfg.Workers {
		go func() {
			for m.processNext(ctx) {
			}
		}()
	}
	t := time.NewTicker(m.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.pruneCollected()
			// A cluster whose objects were all as its snapshot has them
			// and nothing touched since is not compared again: for a
			// 100,000-pod cluster that is its snapshot decoded and 20,001
			// objects' sums worked out every resync for nothing.
			compared, skipped := 0, 0
			clusters := slices.Concat(m.clustersWithObjects(), m.view.Names())
			slices.Sort(clusters)
			clusters = slices.Compact(clusters)
			m.pruneEvents(clusters)
			for _, c := range clusters {
				if m.isUnchanged(c) {
					skipped++
					continue
				}
				compared++
				m.queue.Add(c)
			}
			m.log.Debug("mirror resync", "clusters_compared", compared, "clusters_unchanged", skipped)
		}
	}
}

func (m *Mirror) processNext(ctx context.Context) bool {
	return processKey(ctx, m.queue, m.sync, m.log, "could not write discovered objects; will retry")
}

// processKey takes one cluster from q and syncs it: a failure is logged
// (failed) and retried after q's backoff, a success forgets the cluster's
// failures. It returns false once q shuts down or ctx ends.
func processKey(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error, log *slog.Logger, failed string) bool {
	cluster, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(cluster)
	if err := sync(ctx, cluster); err != nil {
		if ctx.Err() != nil {
			return false
		}
		log.Warn(failed, "cluster", cluster, "retries", q.NumRequeues(cluster), "error", err)
		q.AddRateLimited(cluster)
		return true
	}
	q.Forget(cluster)
	return true
}

// clustersWithObjects lists the clusters that have discovered objects in
// the cache.
func (m *Mirror) clustersWithObjects() []string {
	seen := map[string]bool{}
	for _, inf := range m.informers {
		for _, c := range inf.GetIndexer().ListIndexFuncValues(indexCluster) {
			seen[c] = true
		}
	}
	out := make([]string, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// mirrorWrite is one apply (want set) or delete (want nil) of a sync.
type mirrorWrite struct {
	gvr  schema.GroupVersionResource
	name string
	want *discovered   // the object to create or update; nil: delete
	uid  types.UID     // of the object to delete
	cur  metav1.Object // the cached object an apply replaces, nil if none
	// cluster is the label of the object to delete.
	cluster string
}

// sync makes the discovered objects of cluster match its snapshot (none if
// the cluster left the view), comparing against the cache. A stale cache
// costs at most a repeated, idempotent write.
func (m *Mirror) sync(ctx context.Context, cluster string) error {
	if m.cfg.Owns != nil && !m.cfg.Owns(cluster) {
		return nil
	}
	desired := map[schema.GroupVersionResource]map[string]*discovered{}
	for _, gvr := range discoveredResources {
		desired[gvr] = map[string]*discovered{}
	}
	events := m.eventsOf(cluster) // before the cache is read
	snap, err := m.view.Load(cluster)
	if err != nil {
		return err
	}
	if snap == nil && !m.perObject.Load() {
		return m.departed(cluster)
	}
	m.colMu.Lock()
	delete(m.collected, cluster) // back (or never gone): its objects are compared one by one
	m.colMu.Unlock()
	if snap != nil {
		objs, err := discoveredObjects(snap, m.namespace)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if o.resource == discoveryv1alpha1.Workloads && m.cfg.WorkloadsElsewhere {
				continue
			}
			desired[o.resource][o.meta.Name] = o
		}
	}
	var writes []mirrorWrite
	var errs []error
	awaited := 0 // writes made but not in the cache yet
	for _, gvr := range discoveredResources {
		want, idx := desired[gvr], m.informers[gvr].GetIndexer()
		// The cache holds typed objects (kubeinformers.Typed), or one as
		// read if it did not convert: the mirror reads their metadata.
		have := map[string]metav1.Object{}
		objs, err := idx.ByIndex(indexCluster, cluster)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if o, ok := obj.(metav1.Object); ok {
				have[o.GetName()] = o
			}
		}
		for name, obj := range want {
			cur := have[name]
			if cur == nil {
				if other, ok, _ := idx.GetByKey(m.namespace + "/" + name); ok {
					cur, _ = other.(metav1.Object)
				}
			}
			if cur != nil && !sameOrigin(cur, obj.meta.Labels) {
				// Names are a hash of the exact origin, so only a hash
				// collision or a hand-made object gets here: never take
				// over an object of another origin.
				m.log.Error("a discovered object of another origin has this name; not written", "cluster", cluster, "kind", gvr.Resource, "name", name,
					"owner_cluster", cur.GetLabels()[LabelCluster], "owner_namespace", cur.GetLabels()[discoveryv1alpha1.LabelNamespace])
				errs = append(errs, fmt.Errorf("%s %s: the name belongs to an object of another origin", gvr.Resource, name))
				continue
			}
			sum := obj.sum
			if cur != nil && cur.GetAnnotations()[AnnotationSpecSum] == sum {
				m.observed(gvr, name)
				continue
			}
			if m.awaiting(gvr, name, expectation{sum: sum}) {
				awaited++
				continue
			}
			writes = append(writes, mirrorWrite{gvr: gvr, name: name, want: obj, cur: cur})
		}
		for name, cur := range have {
			if _, ok := want[name]; ok {
				continue
			}
			if m.awaiting(gvr, name, expectation{uid: cur.GetUID()}) {
				awaited++
				continue
			}
			writes = append(writes, mirrorWrite{gvr: gvr, name: name, uid: cur.GetUID(), cluster: cluster})
		}
	}
	if len(writes) == 0 {
		if len(errs) == 0 && snap != nil && awaited == 0 {
			m.markUnchanged(cluster, snap.GetHash(), events)
			m.view.Pack(cluster, snap)
		}
		return errors.Join(errs...)
	}
	start := time.Now()
	var created, updated, deleted atomic.Int64
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(m.cfg.Writes)
	superseded := 0
	for i, w := range writes {
		// A changed snapshot, or the cluster gone from the view, ends the
		// writes of this one. The cluster is queued again: by the view's
		// listener for a new snapshot or a removal, by Kick after a
		// Release (its session moved to another replica). The next sync
		// skips, by sum, what this one wrote. A large cluster's writes
		// take minutes at the client's budget; without this they would
		// go on from, and keep alive, a snapshot nobody holds any more.
		if hash, held := m.view.SnapshotHash(cluster); held != (snap != nil) || hash != snap.GetHash() {
			superseded = len(writes) - i
			break
		}
		g.Go(func() error {
			err := m.write(ctx, w)
			if err == nil {
				e := expectation{uid: w.uid, at: time.Now()}
				if w.want != nil {
					e = expectation{sum: w.want.sum, at: e.at}
				}
				m.expMu.Lock()
				m.expected[expectKey(w.gvr, w.name)] = e
				m.expMu.Unlock()
			}
			switch {
			case err != nil:
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			case w.want == nil:
				deleted.Add(1)
			case w.cur != nil:
				updated.Add(1)
			default:
				created.Add(1)
			}
			return nil
		})
	}
	_ = g.Wait()
	m.log.Debug("discovered objects written", "cluster", cluster, "created", created.Load(), "updated", updated.Load(), "deleted", deleted.Load(),
		"failed", len(errs), "superseded", superseded, "took", time.Since(start).Round(time.Millisecond))
	if len(errs) == 0 && superseded == 0 {
		// Written: the view may hold a large snapshot packed from now on.
		// The cluster is not marked unchanged yet: the next sync, once the
		// cache shows these writes, confirms them first.
		m.view.Pack(cluster, snap)
	}
	// One bad object does not hold up the others; the failures are retried.
	return errors.Join(errs...)
}

// collectBatch bounds the clusters of one DeleteCollection (the label
// selector names each); collectParallel is how many batches are deleted
// at once (the API server deletes a collection's objects one after the
// other, so a departing fleet's objects go as fast as several collections
// in flight let it); collectLinger is how long the collector waits for
// more departures after the first.
const (
	collectBatch    = 50
	collectParallel = 8
	collectLinger   = 50 * time.Millisecond
)

// departed queues the objects of cluster, which left the view, for the
// collector: a deregistration of many clusters is a few DeleteCollections
// of all their objects, not a delete per object. A cluster collected within
// expectationTTL whose objects the cache still shows is not sent again.
func (m *Mirror) departed(cluster string) error {
	has := false
	for _, gvr := range discoveredResources {
		objs, err := m.informers[gvr].GetIndexer().ByIndex(indexCluster, cluster)
		if err != nil {
			return err
		}
		has = has || len(objs) > 0
	}
	m.colMu.Lock()
	defer m.colMu.Unlock()
	if at, ok := m.collected[cluster]; !has || (ok && time.Since(at) < expectationTTL) {
		if !has {
			delete(m.collected, cluster)
		}
		return nil
	}
	m.pending[cluster] = true
	select {
	case m.collectNow <- struct{}{}:
	default:
	}
	return nil
}

// collect deletes the objects of departed clusters until ctx ends, up to
// collectBatch clusters per DeleteCollection of each kind, collectParallel
// batches at once.
func (m *Mirror) collect(ctx context.Context) {
	sem := make(chan struct{}, collectParallel)
	var inFlight sync.WaitGroup
	defer inFlight.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.collectNow:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(collectLinger):
		}
		for {
			batch := m.takePending()
			if len(batch) == 0 {
				break
			}
			select {
			case <-ctx.Done():
				m.requeue(batch, false)
				return
			case sem <- struct{}{}:
			}
			inFlight.Add(1)
			go func() {
				defer inFlight.Done()
				defer func() { <-sem }()
				m.collectBatch(ctx, batch)
			}()
		}
	}
}

// takePending takes up to collectBatch pending clusters that are still
// departed and this replica's to delete.
func (m *Mirror) takePending() []string {
	m.colMu.Lock()
	defer m.colMu.Unlock()
	var batch []string
	now := time.Now()
	for c := range m.pending {
		if len(batch) == collectBatch {
			break
		}
		delete(m.pending, c)
		if !m.view.HasSnapshot(c) && (m.cfg.Owns == nil || m.cfg.Owns(c)) {
			// Sent from now on: a sync meanwhile does not queue it again.
			m.collected[c] = now
			batch = append(batch, c)
		}
	}
	sort.Strings(batch)
	return batch
}

// collectBatch deletes every discovered object labelled with one of
// clusters, one DeleteCollection per kind. Refused as forbidden (a Role
// without deletecollection), the mirror deletes object by object from then
// on; any other failure queues the clusters again with backoff.
func (m *Mirror) collectBatch(ctx context.Context, clusters []string) {
	req, err := labels.NewRequirement(LabelCluster, selection.In, clusters)
	if err != nil {
		// Not reached: a cluster with objects is a value of their label,
		// and the registry's names are label values.
		m.log.Error("departed clusters' names do not make a label selector; their objects are not deleted", "error", err)
		return
	}
	sel := labels.NewSelector().Add(*req).String()
	start := time.Now()
	var g errgroup.Group
	errs := make([]error, len(discoveredResources))
	for i, gvr := range discoveredResources {
		g.Go(func() error {
			errs[i] = m.client.Resource(gvr).Namespace(m.namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
			result := "ok"
			if errs[i] != nil {
				result = "error"
			}
			m.writes.WithLabelValues("delete-collection", result).Inc()
			return nil
		})
	}
	_ = g.Wait()
	err = errors.Join(errs...)
	switch {
	case err == nil:
		m.log.Debug("departed clusters' discovered objects deleted", "clusters", len(clusters), "took", time.Since(start).Round(time.Millisecond))
	case apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err):
		m.byObjectFrom(err)
		m.requeue(clusters, false)
	case ctx.Err() == nil:
		m.log.Warn("could not delete departed clusters' discovered objects; will retry", "clusters", len(clusters), "error", err)
		m.requeue(clusters, true)
	}
}

// byObjectFrom switches the mirror to deleting object by object, with
// delete, after err refused a DeleteCollection (a Role of a release before
// this one grants delete only).
func (m *Mirror) byObjectFrom(err error) {
	if !m.perObject.Swap(true) {
		m.log.Warn("cannot delete discovered objects by collection (the Role lacks deletecollection on meshes, workloads and destinations); deleting them one by one with delete", "error", err)
	}
}

// requeue hands clusters back to the work queue (with its backoff when
// limited), as not collected.
func (m *Mirror) requeue(clusters []string, limited bool) {
	m.colMu.Lock()
	for _, c := range clusters {
		delete(m.collected, c)
	}
	m.colMu.Unlock()
	for _, c := range clusters {
		if limited {
			m.queue.AddRateLimited(c)
		} else {
			m.queue.Add(c)
		}
	}
}

// pruneCollected forgets collections sent longer than expectationTTL ago:
// a cluster whose objects are still there is then collected again at its
// next sync (a cluster with objects but no snapshot is never marked
// unchanged, so the resync queues it).
func (m *Mirror) pruneCollected() {
	m.colMu.Lock()
	defer m.colMu.Unlock()
	for c, at := range m.collected {
		if time.Since(at) >= expectationTTL {
			delete(m.collected, c)
		}
	}
}

// clusterOf is the cluster label of an object the informer handed over,
// deleted or not.
func clusterOf(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if o, ok := obj.(metav1.Object); ok {
		return o.GetLabels()[LabelCluster]
	}
	return ""
}

func expectKey(gvr schema.GroupVersionResource, name string) string {
	return gvr.Resource + "/" + name
}

// awaiting reports whether a write equal to want (same spec sum, or the
// delete of the same object) was made recently and is not in the cache
// yet.
func (m *Mirror) awaiting(gvr schema.GroupVersionResource, name string, want expectation) bool {
	m.expMu.Lock()
	defer m.expMu.Unlock()
	key := expectKey(gvr, name)
	e, ok := m.expected[key]
	if !ok {
		return false
	}
	if time.Since(e.at) > expectationTTL {
		delete(m.expected, key)
		return false
	}
	return e.sum == want.sum && e.uid == want.uid
}

// observed ends the expectation of an object the cache now shows as
// written.
func (m *Mirror) observed(gvr schema.GroupVersionResource, name string) {
	m.expMu.Lock()
	delete(m.expected, expectKey(gvr, name))
	m.expMu.Unlock()
}

// write applies or deletes one object.
func (m *Mirror) write(ctx context.Context, w mirrorWrite) error {
	op := "apply"
	if w.want == nil {
		op = "delete"
	}
	err := m.writeOne(ctx, w)
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.writes.WithLabelValues(op, result).Inc()
	return err
}

func (m *Mirror) writeOne(ctx context.Context, w mirrorWrite) error {
	ri := m.client.Resource(w.gvr).Namespace(m.namespace)
	switch {
	case w.want == nil && !m.perObject.Load():
		// One object, by its name and its cluster's label, through the
		// verb departed clusters' objects are deleted with: the server's
		// Role grants deletecollection, not delete.
		err := ri.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{
			LabelSelector: LabelCluster + "=" + w.cluster, FieldSelector: "metadata.name=" + w.name})
		if apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err) {
			m.byObjectFrom(err)
			return m.writeOne(ctx, w)
		}
		if err != nil {
			return fmt.Errorf("delete %s %s: %w", w.gvr.Resource, w.name, err)
		}
	case w.want == nil:
		uid := w.uid
		err := ri.Delete(ctx, w.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s %s: %w", w.gvr.Resource, w.name, err)
		}
	case w.cur == nil:
		// A create, not a server-side apply: the apiserver does about
		// half the work, which is what bounds a fleet arriving at once.
		// If the cache was stale the create fails and the retry updates.
		obj, err := w.want.object()
		if err != nil {
			return fmt.Errorf("create %s %s: %w", w.gvr.Resource, w.name, err)
		}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{FieldManager: mirrorManager}); err != nil {
			return fmt.Errorf("create %s %s: %w", w.gvr.Resource, w.name, err)
		}
	default:
		// An update from the cached object, conditional on its
		// resourceVersion: the spec and our labels and annotations are
		// replaced, anything else someone added is kept. A conflict
		// (the cache was stale) is retried.
		next, err := unstructuredCopy(w.cur)
		if err != nil {
			return fmt.Errorf("update %s %s: %w", w.gvr.Resource, w.name, err)
		}
		obj, err := w.want.object()
		if err != nil {
			return fmt.Errorf("update %s %s: %w", w.gvr.Resource, w.name, err)
		}
		next.SetAPIVersion(obj.GetAPIVersion())
		next.SetKind(obj.GetKind())
		next.Object["spec"] = obj.Object["spec"]
		next.SetLabels(merged(next.GetLabels(), obj.GetLabels(), discoveredLabels))
		next.SetAnnotations(merged(next.GetAnnotations(), obj.GetAnnotations(), []string{AnnotationSpecSum}))
		if _, err := ri.Update(ctx, next, metav1.UpdateOptions{FieldManager: mirrorManager}); err != nil {
			return fmt.Errorf("update %s %s: %w", w.gvr.Resource, w.name, err)
		}
	}
	return nil
}

// unstructuredCopy is a copy of a cached object to update: the cache
// holds typed objects (kubeinformers.Typed), or one as read.
func unstructuredCopy(o metav1.Object) (*unstructured.Unstructured, error) {
	switch o := o.(type) {
	case *unstructured.Unstructured:
		return o.DeepCopy(), nil
	case runtime.Object:
		fields, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		return &unstructured.Unstructured{Object: fields}, err
	}
	return nil, fmt.Errorf("a cached object of type %T", o)
}

// discoveredLabels are the labels the mirror owns on discovered objects.
var discoveredLabels = []string{LabelCluster, discoveryv1alpha1.LabelNamespace, discoveryv1alpha1.LabelName, LabelManagedBy}

// merged is have with the keys owned set as in want (or removed where want
// lacks them); other keys are kept.
func merged(have, want map[string]string, owned []string) map[string]string {
	out := make(map[string]string, len(have)+len(want))
	for k, v := range have {
		out[k] = v
	}
	for _, k := range owned {
		if v, ok := want[k]; ok {
			out[k] = v
		} else {
			delete(out, k)
		}
	}
	return out
}

// Kick queues cluster for a sync (e.g. it was deregistered: the replica
// that owns its deletion may not have had it in its view).
func (m *Mirror) Kick(cluster string) { m.queue.Add(cluster) }

// CollectOrphans deletes discovered objects of clusters that are not
// registered (deregistered while the server was down, or a mode that is no
// longer managed). Call it once at start, after the registries synced; it
// waits for Run's cache and queues each orphaned cluster, whose objects the
// workers then delete like those of any cluster that left the view.
func (m *Mirror) CollectOrphans(ctx context.Context, registered func(cluster string) bool) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-m.started:
	}
	n := 0
	for _, c := range m.clustersWithObjects() {
		if !registered(c) && !m.view.HasSnapshot(c) {
			m.log.Info("deleting the discovered objects of an unregistered cluster", "cluster", c)
			m.queue.Add(c)
			n++
		}
	}
	if n > 0 {
		m.log.Info("unregistered clusters with discovered objects queued for deletion", "clusters", n)
	}
	return nil
}

// sameOrigin reports whether cur, found under want's name, came from the
// same cluster and namespace (its labels).
func sameOrigin(cur metav1.Object, want map[string]string) bool {
	for _, k := range []string{LabelCluster, discoveryv1alpha1.LabelNamespace} {
		if cur.GetLabels()[k] != want[k] {
			return false
		}
	}
	return true
}

// DiscoveredObject is a Mesh, Workload or Destination object to write.
type DiscoveredObject struct {
	Resource schema.GroupVersionResource
	Object   *unstructured.Unstructured
}

// DiscoveredObjects turns a snapshot into the Mesh, Workload and Destination
// objects of the management cluster (a pure function). Each is named by
// discoveryv1alpha1.Name from exactly where it came from, and labelled with
// it.
func DiscoveredObjects(snap *relaypb.Snapshot, namespace string) ([]DiscoveredObject, error) {
	objs, err := discoveredObjects(snap, namespace)
	if err != nil {
		return nil, err
	}
	out := make([]DiscoveredObject, 0, len(objs))
	for _, o := range objs {
		u, err := o.object()
		if err != nil {
			return nil, err
		}
		out = append(out, DiscoveredObject{Resource: o.resource, Object: u})
	}
	return out, nil
}

// discovered is a discovered object before it is written: its metadata, its
// typed spec (which shares the snapshot's maps and slices of strings) and
// the sum of the spec's JSON. The unstructured object is built only for a
// write: a sync compares sums, so a cluster of 100,000 pods is held as typed
// specs while its writes go out, not as maps of maps.
type discovered struct {
	resource schema.GroupVersionResource
	kind     string
	meta     metav1.ObjectMeta
	spec     any
	sum      string
}

// object is d as the unstructured object the API server is sent.
func (d *discovered) object() (*unstructured.Unstructured, error) {
	specJSON, err := json.Marshal(d.spec)
	if err != nil {
		return nil, err
	}
	var specMap map[string]any
	if err := json.Unmarshal(specJSON, &specMap); err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": specMap}}
	u.SetAPIVersion(discoveryv1alpha1.GroupVersion.String())
	u.SetKind(d.kind)
	u.SetName(d.meta.Name)
	u.SetNamespace(d.meta.Namespace)
	u.SetLabels(d.meta.Labels)
	u.SetAnnotations(map[string]string{AnnotationSpecSum: d.sum})
	return u, nil
}

// discoveredObjects is DiscoveredObjects before the objects are built.
func discoveredObjects(snap *relaypb.Snapshot, namespace string) ([]*discovered, error) {
	cluster := snap.GetCluster()
	var out []*discovered
	add := func(gvr schema.GroupVersionResource, kind string, meta metav1.ObjectMeta, spec any) error {
		specJSON, err := json.Marshal(spec)
		if err != nil {
			return err
		}
		out = append(out, &discovered{resource: gvr, kind: kind, meta: meta, spec: spec, sum: specSum(specJSON)})
		return nil
	}
	modes := meshDataPlaneModes(snap)
	for _, m := range snap.GetMeshes() {
		spec := discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
			Installation: discoveryv1alpha1.MeshInstallation{Name: m.GetName(), Namespace: m.GetNamespace(), Cluster: cluster, Revision: m.GetRevision(), Version: m.GetVersion(), PodLabels: m.GetPodLabels()},
			TrustDomain:  m.GetTrustDomain(), IstiodServiceAccount: m.GetIstiodServiceAccount(), SmartDNSProxying: m.GetSmartDnsProxying(),
			Ambient: ambientMesh(m), DataPlaneModes: modes[m.GetNamespace()+"/"+m.GetName()],
		}}
		for _, g := range m.GetGateways() {
			spec.Istio.Gateways = append(spec.Istio.Gateways, discoveryv1alpha1.GatewayInfo{Name: g.GetName(), Namespace: g.GetNamespace(), Kind: g.GetKind(),
				WorkloadLabels: g.GetWorkloadLabels(), ExternalAddress: g.GetExternalAddress(), TLSPort: g.GetTlsPort()})
		}
		if err := add(discoveryv1alpha1.Meshes, "Mesh", discoveredMeta(discoveryv1alpha1.OriginMesh, cluster, m.GetNamespace(), m.GetName(), namespace), spec); err != nil {
			return nil, err
		}
	}
	for _, w := range snap.GetWorkloads() {
		if err := add(discoveryv1alpha1.Workloads, "Workload", discoveredMeta(w.GetKind(), cluster, w.GetNamespace(), w.GetName(), namespace), workloadSpec(cluster, namespace, w)); err != nil {
			return nil, err
		}
	}
	for _, d := range snap.GetDestinations() {
		ks := discoveryv1alpha1.KubeService{Ref: common.ClusterObjectRef{Name: d.GetName(), Namespace: d.GetNamespace(), ClusterName: cluster},
			WorkloadSelectorLabels: d.GetSelector(), Labels: d.GetLabels(), ServiceType: d.GetServiceType(), ExternalAddresses: d.GetExternalAddresses()}
		for _, p := range d.GetPorts() {
			ks.Ports = append(ks.Ports, discoveryv1alpha1.ServicePort{Port: p.GetPort(), Name: p.GetName(), Protocol: p.GetProtocol(), AppProtocol: p.GetAppProtocol(), TargetPort: p.GetTargetPort()})
		}
		for _, e := range d.GetEndpoints() {
			ks.Endpoints = append(ks.Endpoints, discoveryv1alpha1.Endpoint{IP: e.GetIp(), Labels: e.GetLabels(), Ambient: e.GetAmbient()})
		}
		ks.Waypoint = waypointRef(d.GetWaypoint())
		ks.DataPlaneMode = cmp.Or(d.GetDataPlaneMode(), discoveryv1alpha1.DataPlaneSidecar)
		ks.Headless = d.GetHeadless()
		if len(d.GetSubsets()) > 0 {
			ks.Subsets = map[string][]string{}
			for k, v := range d.GetSubsets() {
				ks.Subsets[k] = v.GetValues()
			}
		}
		spec := discoveryv1alpha1.DestinationSpec{KubeService: ks, Mesh: meshRef(cluster, namespace, d.GetMeshName(), d.GetMeshNamespace())}
		if err := add(discoveryv1alpha1.Destinations, "Destination", discoveredMeta(discoveryv1alpha1.OriginService, cluster, d.GetNamespace(), d.GetName(), namespace), spec); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// discoveredMeta is the name, namespace and labels of a discovered object:
// named by discoveryv1alpha1.Name from exactly where it came from (origin
// kind, cluster, namespace, name) and labelled with it.
func discoveredMeta(origin, cluster, objNamespace, objName, namespace string) metav1.ObjectMeta {
	labels := map[string]string{LabelCluster: cluster, discoveryv1alpha1.LabelNamespace: objNamespace, LabelManagedBy: "relaymesh"}
	if len(validation.IsValidLabelValue(objName)) == 0 {
		labels[discoveryv1alpha1.LabelName] = objName
	}
	return metav1.ObjectMeta{Name: discoveryv1alpha1.Name(origin, cluster, objNamespace, objName), Namespace: namespace, Labels: labels}
}

// workloadSpec is the spec of a discovered workload of cluster.
func workloadSpec(cluster, namespace string, w *relaypb.Workload) discoveryv1alpha1.WorkloadSpec {
	return discoveryv1alpha1.WorkloadSpec{
		Kubernetes: discoveryv1alpha1.KubernetesWorkload{Controller: common.ClusterObjectRef{Name: w.GetName(), Namespace: w.GetNamespace(), ClusterName: cluster},
			Kind: w.GetKind(), PodLabels: w.GetPodLabels(), ServiceAccountName: w.GetServiceAccount(),
			DataPlaneMode: workloadMode(w), Waypoint: waypointRef(w.GetWaypoint())},
		Mesh: meshRef(cluster, namespace, w.GetMeshName(), w.GetMeshNamespace()),
	}
}

// workloadMode is a workload's data-plane mode in the API: the wire's
// empty mode (what agents before ambient send) is a sidecar.
func workloadMode(w *relaypb.Workload) string {
	return cmp.Or(w.GetDataPlaneMode(), discoveryv1alpha1.DataPlaneSidecar)
}

// meshDataPlaneModes is, per mesh (namespace/name), the sorted modes its
// workloads run in: both during a migration.
func meshDataPlaneModes(snap *relaypb.Snapshot) map[string][]string {
	out := map[string][]string{}
	for _, w := range snap.GetWorkloads() {
		key, mode := w.GetMeshNamespace()+"/"+w.GetMeshName(), workloadMode(w)
		if !slices.Contains(out[key], mode) {
			out[key] = append(out[key], mode)
			slices.Sort(out[key])
		}
	}
	return out
}

func ambientMesh(m *relaypb.Mesh) *discoveryv1alpha1.AmbientMesh {
	if !m.GetAmbient() {
		return nil
	}
	a := &discoveryv1alpha1.AmbientMesh{Ztunnel: m.GetZtunnel()}
	for _, w := range m.GetWaypoints() {
		a.Waypoints = append(a.Waypoints, discoveryv1alpha1.WaypointInfo{Name: w.GetName(), Namespace: w.GetNamespace(),
			TrafficType: w.GetTrafficType(), ServiceAccount: w.GetServiceAccount(), Ready: w.GetReady()})
	}
	a.Network, a.MultiNetwork, a.GlobalServiceScope = m.GetNetwork(), m.GetMultiNetwork(), m.GetGlobalServiceScope()
	for _, g := range m.GetEastWestGateways() {
		a.EastWestGateways = append(a.EastWestGateways, discoveryv1alpha1.EastWestGatewayInfo{Name: g.GetName(), Namespace: g.GetNamespace(),
			Network: g.GetNetwork(), Addresses: g.GetAddresses(), HBONEPort: g.GetHbonePort(), ServiceAccount: g.GetServiceAccount()})
	}
	return a
}

func waypointRef(r *relaypb.WaypointRef) *discoveryv1alpha1.WaypointRef {
	if r == nil {
		return nil
	}
	return &discoveryv1alpha1.WaypointRef{Name: r.GetName(), Namespace: r.GetNamespace()}
}

// meshRef names the Mesh object of the istiod name in meshNamespace of
// cluster.
func meshRef(cluster, namespace, name, meshNamespace string) common.ObjectRef {
	return common.ObjectRef{Name: MeshObjectName(cluster, meshNamespace, name), Namespace: namespace}
}

// specSum is the hex SHA-256 of a spec's JSON: what the mirror compares.
func specSum(specJSON []byte) string {
	sum := sha256.Sum256(specJSON)
	return hex.EncodeToString(sum[:])
}

// MeshObjectName is the name of the Mesh object of the istiod name in
// namespace of cluster.
func MeshObjectName(cluster, namespace, name string) string {
	return discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, cluster, namespace, name)
}
