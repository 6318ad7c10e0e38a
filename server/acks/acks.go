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
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/server/heads"
	"github.com/relaymesh/relaymesh/server/shardedcm"
	"k8s.io/client-go/kubernetes"
)

// Shards is the number of ConfigMaps the records are spread over: about
// 95 bytes per cluster, so 10,000 clusters are about 60 KB per shard.
const Shards = shardedcm.Shards

// Label marks the records' ConfigMaps.
const Label = "relaymesh.io/acks"

// kind is the ledger's map.
var kind = shardedcm.Kind{Prefix: "relaymesh-acks-", Label: Label, What: "ack record"}

// ShardName is the ConfigMap holding cluster's record.
func ShardName(cluster string) string { return kind.ShardName(cluster) }

// DefaultInterval is how long a record waits for others before it is
// written, and the least time between two writes of the records. An edit's
// acks arrive over 100–300 ms at 1,000 clusters: gathered, they are
// usually one write per shard, landing after the edit reached most of the
// fleet rather than during it.
const DefaultInterval = 250 * time.Millisecond

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
	m        *shardedcm.Map[Entry]
	log      *slog.Logger
	interval time.Duration

	mu      sync.Mutex
	pending map[string]Entry // recorded, not yet written; a zero Entry deletes
	flying  map[string]Entry // the batch being written
	dropped map[string]bool  // clusters of flying dropped meanwhile: deleted after it
	wake    chan struct{}
	flushes int
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
	log = log.With("component", "acks")
	codec := shardedcm.Codec[Entry]{Parse: Parse, Encode: Entry.encode, Replaces: Entry.supersedes}
	return &Ledger{m: shardedcm.New(client, namespace, kind, codec, log), log: log, interval: interval,
		pending: map[string]Entry{}, dropped: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// OnChange registers f, called with each cluster whose record changed, on
// the watch's goroutine or on the goroutines of this replica's own writes
// (concurrently): f must be safe for that. Register before Start.
func (l *Ledger) OnChange(f func(cluster string)) { l.m.OnChange(f) }

// Start watches the records, returns once the first list is in, and writes
// what is recorded until ctx ends.
func (l *Ledger) Start(ctx context.Context) error {
	if err := l.m.Start(ctx); err != nil {
		return err
	}
	go l.run(ctx)
	return nil
}

// Entry returns cluster's record as the watch last showed it.
func (l *Ledger) Entry(cluster string) (Entry, bool) { return l.m.Get(cluster) }

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

// Clusters returns the clusters with a record, sorted.
func (l *Ledger) Clusters() []string { return l.m.Clusters() }

// Forget queues the removal of a deregistered cluster's record. One
// replica (the Lease holder) is enough: every replica forgetting the same
// records would race on the same shards, one write landing and the others
// conflicting, read again and found to have nothing left to write.
func (l *Ledger) Forget(cluster string) { l.Record(cluster, Entry{}) }

// Drop forgets what this replica queued for a deregistered cluster,
// without writing: the Lease holder deletes the record (Forget). If a batch
// holding the cluster's record is being written, the record is deleted
// after it, so that this replica's late write does not bring it back.
func (l *Ledger) Drop(cluster string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, cluster)
	if _, ok := l.flying[cluster]; ok {
		l.dropped[cluster] = true
	}
}

// Prune queues the removal of the record of every cluster keep refuses: a
// new Lease holder's sweep of the records of clusters deregistered while
// no replica held the Lease. It returns how many it queued.
func (l *Ledger) Prune(keep func(cluster string) bool) int {
	n := 0
	for _, c := range l.Clusters() {
		if !keep(c) {
			l.Forget(c)
			n++
		}
	}
	return n
}

// Flushes is how many batches were written (for tests and benchmarks).
func (l *Ledger) Flushes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.flushes
}

// run writes the pending records in batches, each interval after the first
// record it holds: a burst (an edit's acks from a whole fleet) is gathered
// into one write per shard, and two batches are at least interval apart.
// Gathering for only 20 ms after a quiet spell, as before, wrote the first
// few acks of every edit in a batch of their own, in the middle of the
// edit's delivery: up to 16 more ConfigMap writes per replica per edit
// (docs/benchmarks.md, "Ack records gathered and patched"). No reader
// waits on a record for less than that: rotations and statuses move on
// acks in seconds. A failed batch is retried with back-off unless a newer
// record of the cluster was queued meanwhile.
func (l *Ledger) run(ctx context.Context) {
	retry := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(l.interval):
		}
		l.mu.Lock()
		batch := l.pending
		l.pending = map[string]Entry{}
		l.flying = batch
		l.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		err := l.m.Write(ctx, batch)
		l.mu.Lock()
		// A cluster dropped while its record was being written: what this
		// write stored (even in part, if it failed) is deleted next.
		for c := range l.dropped {
			if _, newer := l.pending[c]; !newer {
				l.pending[c] = Entry{}
			}
		}
		dropped := l.dropped
		l.flying, l.dropped = nil, map[string]bool{}
		if err == nil {
			l.flushes++
		}
		l.mu.Unlock()
		if err == nil {
			retry = 0
			if len(dropped) > 0 {
				select {
				case l.wake <- struct{}{}:
				default:
				}
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		retry = min(max(2*retry, 100*time.Millisecond), 5*time.Second)
		l.log.Warn("could not write ack records; retrying", "clusters", len(batch), "error", err, "retry_in", retry)
		l.mu.Lock()
		for c, e := range batch {
			if _, newer := l.pending[c]; !newer && !dropped[c] {
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

// Read returns every record stored in namespace, as a reader outside the
// server (a test, an operator's tool) sees them; malformed ones are left
// out.
func Read(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]Entry, error) {
	return shardedcm.Read(ctx, client, namespace, kind, Parse)
}
