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
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/server/shardedcm"
	"k8s.io/client-go/kubernetes"
)

// Shards is the number of ConfigMaps the heads are spread over; a write
// touches only the shards of the clusters it changes.
const Shards = shardedcm.Shards

// Label marks the heads' ConfigMaps.
const Label = "relaymesh.io/output-heads"

// kind is the heads' map.
var kind = shardedcm.Kind{Prefix: "relaymesh-output-heads-", Label: Label, What: "output head"}

// ShardName is the ConfigMap holding cluster's head.
func ShardName(cluster string) string { return kind.ShardName(cluster) }

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
	m *shardedcm.Map[Head]
}

// New returns a Store; call Start.
func New(client kubernetes.Interface, namespace string, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	codec := shardedcm.Codec[Head]{Parse: parse, Encode: Head.encode,
		// A head whose version is not above the stored one is not written:
		// versions never go back, even if a deposed leader writes late.
		Replaces: func(h, stored Head, ok bool) bool { return !ok || h.Version > stored.Version }}
	return &Store{m: shardedcm.New(client, namespace, kind, codec, log.With("component", "output-heads"))}
}

// OnChange registers f, called with each cluster whose head changed, on
// the watch's goroutine or on the goroutines of this replica's own writes
// (concurrently): f must be safe for that. Register before Start.
func (s *Store) OnChange(f func(cluster string)) { s.m.OnChange(f) }

// Start watches the heads and returns once the first list is in.
func (s *Store) Start(ctx context.Context) error { return s.m.Start(ctx) }

// Head returns cluster's head as last seen.
func (s *Store) Head(cluster string) (Head, bool) { return s.m.Get(cluster) }

// All returns a copy of every head.
func (s *Store) All() map[string]Head { return s.m.All() }

// Write stores heads (a zero Head deletes the cluster's), each shard with
// its resourceVersion as precondition, retrying conflicts; a head whose
// version is not above the stored one is not written (versions never go
// back, even if a deposed leader writes late). It returns the heads it
// could not write.
func (s *Store) Write(ctx context.Context, heads map[string]Head) error { return s.m.Write(ctx, heads) }

// Clusters returns the clusters that have heads, sorted.
func (s *Store) Clusters() []string { return s.m.Clusters() }

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
		// Coalesce a burst (a policy edit touches many clusters at once;
		// Outputs.Batch hands a translation's sets over together).
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
