// Package heads keeps the output heads of the management server's
// replicas: for each cluster, the version and digest of the output set the
// leader decided last. Every replica computes every cluster's outputs from
// the apiserver's state; a replica serves a cluster's set only when its own
// set has the head's digest, and with the head's version. So all replicas
// serve one order of versions, decided by one writer (the Lease holder),
// that goes on across leaders and restarts: the heads live in the
// management cluster's apiserver, in a few ConfigMaps (shards) of the
// server's namespace, about 100 bytes per cluster.
package heads

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
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Shards is the number of ConfigMaps the heads are spread over; a write
// touches only the shards of the clusters it changes.
const Shards = 16

// Label marks the heads' ConfigMaps.
const Label = "relaymesh.io/output-heads"

// ShardName is the ConfigMap holding cluster's head.
func ShardName(cluster string) string {
	return fmt.Sprintf("relaymesh-output-heads-%02d", shardOf(cluster))
}

func shardOf(cluster string) int {
	h := fnv.New32a()
	h.Write([]byte(cluster))
	return int(h.Sum32() % Shards)
}

// Head is what the leader decided for one cluster.
type Head struct {
	Version uint64
	Digest  string // hex SHA-256 of the set's content
}

func (h Head) encode() string { return strconv.FormatUint(h.Version, 10) + " " + h.Digest }

// parse reads "VERSION DIGEST"; anything else is not a head.
func parse(s string) (Head, error) {
	v, d, ok := strings.Cut(s, " ")
	if !ok || len(d) != 64 || strings.Trim(d, "0123456789abcdef") != "" {
		return Head{}, errors.New("not VERSION SHA256HEX")
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		return Head{}, errors.New("version is not a positive integer")
	}
	if !Plausible(n, time.Now()) {
		// Kept, it would stop the leader from ever writing a higher one.
		return Head{}, errors.New("version is ahead of every replica's clock")
	}
	return Head{Version: n, Digest: d}, nil
}

// maxAhead bounds how far past the wall clock, in nanoseconds, an output
// version may be: about 73 minutes of clock skew and changes.
const maxAhead = 1 << 42

// Plausible reports whether some replica can have made output version v by
// now: versions start at a replica's start time in nanoseconds and grow by
// one per change, so one far past the wall clock was made by no replica.
func Plausible(v uint64, now time.Time) bool { return v <= uint64(now.UnixNano())+maxAhead }

// Store reads the heads from a watch and writes them with the shard's
// resourceVersion as precondition.
type Store struct {
	client    kubernetes.Interface
	namespace string
	log       *slog.Logger
	informer  cache.SharedIndexInformer
	mu        sync.RWMutex
	heads     map[string]Head
	listeners []func(cluster string)
}

// New returns a Store; call Start.
func New(client kubernetes.Interface, namespace string, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = Label + "=true" }))
	return &Store{client: client, namespace: namespace, log: log.With("component", "output-heads"),
		informer: f.Core().V1().ConfigMaps().Informer(), heads: map[string]Head{}}
}

// OnChange registers f, called with each cluster whose head changed (on the
// watch's goroutine). Register before Start.
func (s *Store) OnChange(f func(cluster string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, f)
}

// Start watches the heads and returns once the first list is in.
func (s *Store) Start(ctx context.Context) error {
	h := func(any) { s.reload() }
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: h, UpdateFunc: func(_, o any) { h(o) }, DeleteFunc: h}); err != nil {
		return err
	}
	go s.informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return fmt.Errorf("output heads: watch of ConfigMaps labelled %s=true did not sync: %w", Label, ctx.Err())
	}
	s.reload()
	return nil
}

// reload rebuilds the map from the cache and tells listeners what changed.
// An entry that does not parse is skipped (and logged): a head is only
// ever written by a replica, and no head means "serve nothing new".
func (s *Store) reload() {
	next := map[string]Head{}
	for _, o := range s.informer.GetStore().List() {
		cm, ok := o.(*corev1.ConfigMap)
		if !ok || !strings.HasPrefix(cm.Name, "relaymesh-output-heads-") {
			continue
		}
		for cluster, v := range cm.Data {
			h, err := parse(v)
			if err != nil || ShardName(cluster) != cm.Name {
				s.log.Warn("ignoring a malformed output head", "configmap", cm.Name, "cluster", text.Truncate(cluster, 80))
				continue
			}
			next[cluster] = h
		}
	}
	s.mu.Lock()
	var changed []string
	for c, h := range next {
		if s.heads[c] != h {
			changed = append(changed, c)
		}
	}
	for c := range s.heads {
		if _, ok := next[c]; !ok {
			changed = append(changed, c)
		}
	}
	s.heads = next
	listeners := s.listeners
	s.mu.Unlock()
	sort.Strings(changed)
	for _, c := range changed {
		for _, f := range listeners {
			f(c)
		}
	}
}

// Head returns cluster's head as last seen.
func (s *Store) Head(cluster string) (Head, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h, ok := s.heads[cluster]
	return h, ok
}

// All returns a copy of every head.
func (s *Store) All() map[string]Head {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]Head, len(s.heads))
	for k, v := range s.heads {
		out[k] = v
	}
	return out
}

// Write stores heads (a zero Head deletes the cluster's). It reads each
// shard it touches from the apiserver and writes it with that
// resourceVersion as precondition, retrying conflicts; a head whose version
// is not above the stored one is not written (versions never go back, even
// if a deposed leader writes late). It returns the heads it could not
// write.
func (s *Store) Write(ctx context.Context, heads map[string]Head) error {
	byShard := map[string]map[string]Head{}
	for c, h := range heads {
		n := ShardName(c)
		if byShard[n] == nil {
			byShard[n] = map[string]Head{}
		}
		byShard[n][c] = h
	}
	// Shards are written in parallel: a new leader's first heads (every
	// cluster whose content changed during the election) reach the agents
	// in one round trip, not sixteen.
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for name, hs := range byShard {
		wg.Go(func() {
			if err := s.writeShard(ctx, name, hs); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (s *Store) writeShard(ctx context.Context, name string, hs map[string]Head) error {
	cms := s.client.CoreV1().ConfigMaps(s.namespace)
	for attempt := 0; ; attempt++ {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		create := apierrors.IsNotFound(err)
		if create {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace,
				Labels: map[string]string{Label: "true", "app.kubernetes.io/managed-by": "relaymesh"}}}
		} else if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		dirty := false
		for c, h := range hs {
			if h == (Head{}) {
				if _, ok := cm.Data[c]; ok {
					delete(cm.Data, c)
					dirty = true
				}
				continue
			}
			if old, err := parse(cm.Data[c]); err == nil && old.Version >= h.Version {
				continue // a newer head is stored: never go back
			}
			cm.Data[c] = h.encode()
			dirty = true
		}
		if !dirty {
			return nil
		}
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
	}
}

// Clusters returns the clusters that have heads, sorted.
func (s *Store) Clusters() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.heads))
	for c := range s.heads {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// Source is the leader's own outputs (relay's Outputs).
type Source interface {
	// Local is the version and digest of cluster's set as computed here.
	Local(cluster string) (Head, bool)
	// Clusters are the clusters with a set.
	Clusters() []string
	// Adopt starts a term: versions from now on are above every head, and
	// sets equal to their head take its version.
	Adopt(map[string]Head)
}

// Writer writes the leader's decisions as heads. Feed it every change with
// Dirty from the start (it only remembers them while following); Lead runs
// while this replica holds the Lease.
type Writer struct {
	// Adopted, if set, is called when a term's adoption is done: versions
	// (and the trust versions a rotation waits for acks of) changed to the
	// heads' numbering, so whatever compares acks with them looks again.
	Adopted func()
	store   *Store
	src     Source
	log     *slog.Logger
	mu      sync.Mutex
	dirty   map[string]bool
	wake    chan struct{}
}

// NewWriter returns a Writer of src's sets to store.
func NewWriter(store *Store, src Source, log *slog.Logger) *Writer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Writer{store: store, src: src, log: log.With("component", "output-heads"), dirty: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Dirty notes that cluster's set changed (or went away).
func (w *Writer) Dirty(cluster string) {
	w.mu.Lock()
	w.dirty[cluster] = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Lead adopts the stored heads and then writes a head for every cluster
// whose set differs from it, and deletes the heads of clusters without a
// set, until ctx is done (the term ended). Failed writes are retried.
func (w *Writer) Lead(ctx context.Context) {
	w.src.Adopt(w.store.All())
	if w.Adopted != nil {
		w.Adopted()
	}
	for _, c := range w.src.Clusters() {
		w.Dirty(c)
	}
	for _, c := range w.store.Clusters() {
		w.Dirty(c)
	}
	w.log.Info("writing output heads")
	retry := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		// Coalesce a burst (a policy edit touches many clusters at once).
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
		w.mu.Lock()
		batch := w.dirty
		w.dirty = map[string]bool{}
		w.mu.Unlock()
		updates := map[string]Head{}
		for c := range batch {
			local, ok := w.src.Local(c)
			head, stored := w.store.Head(c)
			switch {
			case !ok && stored:
				updates[c] = Head{}
			case ok && head != local:
				updates[c] = local
			}
		}
		if len(updates) == 0 {
			continue
		}
		if err := w.store.Write(ctx, updates); err != nil {
			if ctx.Err() != nil {
				return
			}
			retry = min(max(2*retry, 100*time.Millisecond), 5*time.Second)
			w.log.Warn("could not write output heads; retrying", "clusters", len(updates), "error", err, "retry_in", retry)
			for c := range updates {
				w.Dirty(c)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			continue
		}
		retry = 0
	}
}
