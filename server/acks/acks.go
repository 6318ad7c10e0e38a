// Package acks keeps the fleet's acks for the management server's replicas:
// for each cluster, the output version its agent applied last and a digest
// of the results the cluster's status keeps of it. The replica holding a
// cluster's session records every ack; the records are written in batches,
// at most every Interval, into a few ConfigMaps (shards) of the server's
// namespace — one write per changed shard, however many agents acked,
// where each ack used to be a KubernetesCluster status write — and every
// replica reads them from a watch. A policy edit that reaches 1,000 agents
// costs a few dozen writes, not a thousand.
//
// The record says which version was applied; what was applied (the failed
// objects, the mesh CA Secrets) stays in the KubernetesCluster status,
// written when it changes. The digest ties the two: a reader takes the
// record's version only with results whose digest it matches (server.
// KubeStatus.Ack), so it never pairs a new version with old results.
package acks

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/server/heads"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Shards is the number of ConfigMaps the records are spread over: about
// 95 bytes per cluster, so 10,000 clusters are about 60 KB per shard.
const Shards = 16

// Label marks the records' ConfigMaps.
const Label = "relaymesh.io/acks"

// namePrefix starts every shard's name.
const namePrefix = "relaymesh-acks-"

// DefaultInterval is the least time between two writes of the records.
const DefaultInterval = 250 * time.Millisecond

// ShardName is the ConfigMap holding cluster's record.
func ShardName(cluster string) string {
	h := fnv.New32a()
	h.Write([]byte(cluster))
	return fmt.Sprintf("%s%02d", namePrefix, h.Sum32()%Shards)
}

// Entry is one cluster's record: the output version its agent acked and
// the hex SHA-256 of the results kept of that ack.
type Entry struct {
	Version uint64
	Digest  string
}

func (e Entry) encode() string { return strconv.FormatUint(e.Version, 10) + " " + e.Digest }

// Parse reads "VERSION DIGEST". A version of no replica's making (zero, or
// ahead of every replica's clock) is refused: kept, it would stop every
// later ack from being recorded, since records never go back.
func Parse(s string) (Entry, error) {
	if len(s) > 100 {
		return Entry{}, errors.New("longer than any record")
	}
	v, d, ok := strings.Cut(s, " ")
	if !ok || len(d) != 64 || strings.Trim(d, "0123456789abcdef") != "" {
		return Entry{}, errors.New("not VERSION SHA256HEX")
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		return Entry{}, errors.New("version is not a positive integer")
	}
	if !heads.Plausible(n, time.Now()) {
		return Entry{}, errors.New("version is ahead of every replica's clock")
	}
	return Entry{Version: n, Digest: d}, nil
}

// supersedes reports whether e is to be written over stored: a later
// version, or the same version with other results (the agent acked it
// again after a re-apply). An earlier version never is, so a replica that
// held a session before the agent moved on never writes its stale ack
// over the new holder's.
func (e Entry) supersedes(stored Entry, ok bool) bool {
	return !ok || e.Version > stored.Version || (e.Version == stored.Version && e.Digest != stored.Digest)
}

// Ledger records acks and reads everyone's.
type Ledger struct {
	client    kubernetes.Interface
	namespace string
	log       *slog.Logger
	interval  time.Duration
	informer  cache.SharedIndexInformer

	mu        sync.RWMutex
	entries   map[string]Entry // as the watch shows them
	pending   map[string]Entry // recorded, not yet written; a zero Entry deletes
	listeners []func(cluster string)
	wake      chan struct{}
	flushes   int
}

// New returns a Ledger writing at most every interval (DefaultInterval if
// zero); call Start.
func New(client kubernetes.Interface, namespace string, log *slog.Logger, interval time.Duration) *Ledger {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = Label + "=true" }))
	return &Ledger{client: client, namespace: namespace, log: log.With("component", "acks"), interval: interval,
		informer: f.Core().V1().ConfigMaps().Informer(), entries: map[string]Entry{}, pending: map[string]Entry{},
		wake: make(chan struct{}, 1)}
}

// OnChange registers f, called with each cluster whose record changed (on
// the watch's goroutine). Register before Start.
func (l *Ledger) OnChange(f func(cluster string)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.listeners = append(l.listeners, f)
}

// Start watches the records, returns once the first list is in, and writes
// what is recorded until ctx ends.
func (l *Ledger) Start(ctx context.Context) error {
	h := func(any) { l.reload() }
	if _, err := l.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: h, UpdateFunc: func(_, o any) { h(o) }, DeleteFunc: h}); err != nil {
		return err
	}
	go l.informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), l.informer.HasSynced) {
		return fmt.Errorf("acks: watch of ConfigMaps labelled %s=true did not sync: %w", Label, ctx.Err())
	}
	l.reload()
	go l.run(ctx)
	return nil
}

// reload rebuilds the records from the cache and tells listeners what
// changed. An entry that does not parse, or sits in another cluster's
// shard, is skipped and logged: only replicas write records, and no
// record means "not known to be applied".
func (l *Ledger) reload() {
	next := map[string]Entry{}
	malformed := 0
	for _, o := range l.informer.GetStore().List() {
		cm, ok := o.(*corev1.ConfigMap)
		if !ok || !strings.HasPrefix(cm.Name, namePrefix) {
			continue
		}
		for cluster, v := range cm.Data {
			e, err := Parse(v)
			if err != nil || ShardName(cluster) != cm.Name {
				if malformed == 0 {
					l.log.Warn("ignoring a malformed ack record", "configmap", cm.Name, "cluster", text.Truncate(cluster, 80))
				}
				malformed++
				continue
			}
			next[cluster] = e
		}
	}
	l.mu.Lock()
	var changed []string
	for c, e := range next {
		if l.entries[c] != e {
			changed = append(changed, c)
		}
	}
	for c := range l.entries {
		if _, ok := next[c]; !ok {
			changed = append(changed, c)
		}
	}
	l.entries = next
	listeners := l.listeners
	l.mu.Unlock()
	sort.Strings(changed)
	for _, c := range changed {
		for _, f := range listeners {
			f(c)
		}
	}
}

// Entry returns cluster's record as the watch last showed it.
func (l *Ledger) Entry(cluster string) (Entry, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	e, ok := l.entries[cluster]
	return e, ok
}

// Record queues cluster's ack for the next write.
func (l *Ledger) Record(cluster string, e Entry) {
	l.mu.Lock()
	l.pending[cluster] = e
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Forget queues the removal of a deregistered cluster's record.
func (l *Ledger) Forget(cluster string) { l.Record(cluster, Entry{}) }

// Flushes is how many batches were written (for tests and benchmarks).
func (l *Ledger) Flushes() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.flushes
}

// run writes the pending records in batches: the first after a quiet spell
// at once (well, 20 ms later, to gather a burst), the next no sooner than
// interval after the last. A failed batch is retried with back-off unless
// a newer record of the cluster was queued meanwhile.
func (l *Ledger) run(ctx context.Context) {
	var last time.Time
	retry := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		wait := max(20*time.Millisecond, l.interval-time.Since(last))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		l.mu.Lock()
		batch := l.pending
		l.pending = map[string]Entry{}
		l.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		last = time.Now()
		err := l.write(ctx, batch)
		if err == nil {
			retry = 0
			l.mu.Lock()
			l.flushes++
			l.mu.Unlock()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		retry = min(max(2*retry, 100*time.Millisecond), 5*time.Second)
		l.log.Warn("could not write ack records; retrying", "clusters", len(batch), "error", err, "retry_in", retry)
		l.mu.Lock()
		for c, e := range batch {
			if _, newer := l.pending[c]; !newer {
				l.pending[c] = e
			}
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// write stores entries, each changed shard in one write, shards in
// parallel, each with the shard's resourceVersion as precondition
// (conflicts are read again and retried).
func (l *Ledger) write(ctx context.Context, entries map[string]Entry) error {
	byShard := map[string]map[string]Entry{}
	for c, e := range entries {
		n := ShardName(c)
		if byShard[n] == nil {
			byShard[n] = map[string]Entry{}
		}
		byShard[n][c] = e
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for name, es := range byShard {
		wg.Go(func() {
			if err := l.writeShard(ctx, name, es); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (l *Ledger) writeShard(ctx context.Context, name string, es map[string]Entry) error {
	cms := l.client.CoreV1().ConfigMaps(l.namespace)
	// The watch's copy first: usually current, it saves a read per write.
	var cm *corev1.ConfigMap
	if o, ok, _ := l.informer.GetStore().GetByKey(l.namespace + "/" + name); ok {
		if c, ok := o.(*corev1.ConfigMap); ok {
			cm = c.DeepCopy()
		}
	}
	for attempt := 0; ; attempt++ {
		create := false
		if cm == nil {
			got, err := cms.Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				create = true
				got = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.namespace,
					Labels: map[string]string{Label: "true", "app.kubernetes.io/managed-by": "relaymesh"}}}
			case err != nil:
				return err
			}
			cm = got
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		dirty := false
		for c, e := range es {
			if e == (Entry{}) {
				if _, ok := cm.Data[c]; ok {
					delete(cm.Data, c)
					dirty = true
				}
				continue
			}
			old, err := Parse(cm.Data[c])
			if !e.supersedes(old, err == nil) {
				continue
			}
			cm.Data[c] = e.encode()
			dirty = true
		}
		if !dirty {
			return nil
		}
		var err error
		if create {
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: "relaymesh-server"})
		} else {
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "relaymesh-server"})
		}
		if err == nil {
			return nil
		}
		if (!apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err)) || attempt >= 5 {
			return err
		}
		cm = nil // read it again
	}
}

// Read returns every record stored in namespace, as a reader outside the
// server (a test, an operator's tool) sees them; malformed ones are left
// out.
func Read(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]Entry, error) {
	list, err := client.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: Label + "=true"})
	if err != nil {
		return nil, err
	}
	out := map[string]Entry{}
	for _, cm := range list.Items {
		if !strings.HasPrefix(cm.Name, namePrefix) {
			continue
		}
		for c, v := range cm.Data {
			if e, err := Parse(v); err == nil && ShardName(c) == cm.Name {
				out[c] = e
			}
		}
	}
	return out, nil
}
