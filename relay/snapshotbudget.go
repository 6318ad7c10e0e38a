package relay

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// SnapshotBudget is the server-wide memory for snapshots in transit: the
// buffered parts of every PushChunked stream, and then the memory their
// decoding takes, until the snapshot is accepted or refused. It is shared
// fairly between clusters (docs/design/2026-12-01-fair-snapshot-budget.md):
//
//   - a reservation grows only with bytes that arrived (twice each part,
//     plus what decoding its fields takes), never with what a header
//     announces, so a header alone holds nothing; the Assembler drops a
//     snapshot whose parts stop coming or come under a minimum rate;
//   - a cluster holds at most one reservation at a time;
//   - a cluster's share is the limit divided by the clusters holding memory
//     (the one asking included). A cluster that asks for room within its
//     share when there is none gets it from the snapshots in transit
//     furthest over their share: they are preempted (their streams are
//     refused, and their agents send them again later). A cluster over its
//     share gets room only while there is some free;
//   - a complete snapshot being checked is never preempted: it is released
//     within one check.
//
// So however many clusters hold reservations, and however long, a cluster
// whose snapshot fits in its share gets it through.
type SnapshotBudget struct {
	limit int64
	gauge prometheus.Gauge

	mu      sync.Mutex
	used    int64
	holders map[string]*reservation
}

// reservation is the memory one snapshot in transit holds.
type reservation struct {
	cluster string
	bytes   int64
	// complete: the snapshot is assembled and being checked; it is not
	// preempted.
	complete bool
	// gone: released, or preempted (then preempted is closed).
	gone      bool
	preempted chan struct{}
}

// NewSnapshotBudget holds limit bytes for snapshots in transit and shows
// what it holds in gauge.
func NewSnapshotBudget(limit int64, gauge prometheus.Gauge) *SnapshotBudget {
	return &SnapshotBudget{limit: limit, gauge: gauge, holders: map[string]*reservation{}}
}

// open starts cluster's one reservation, empty.
func (b *SnapshotBudget) open(cluster string) (*reservation, *ChunkError) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, busy := b.holders[cluster]; busy {
		return nil, &ChunkError{Code: codes.ResourceExhausted, Reason: "cluster_busy", Msg: "another stream of this cluster is sending a snapshot; one at a time"}
	}
	r := &reservation{cluster: cluster, preempted: make(chan struct{})}
	b.holders[cluster] = r
	return r, nil
}

// grow adds n bytes to r. When the budget has no room for them, and r
// stays within its share with them, the snapshots in transit furthest over
// their share are preempted until there is room.
func (b *SnapshotBudget) grow(r *reservation, n int64) *ChunkError {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.gone {
		return b.preemptedError(r)
	}
	if b.used+n > b.limit {
		share := b.share(r)
		if r.bytes+n > share {
			return b.memoryError()
		}
		for b.used+n > b.limit {
			v := b.mostOver(share, r)
			if v == nil {
				return b.memoryError()
			}
			b.preempt(v)
		}
	}
	r.bytes += n
	b.used += n
	b.gauge.Set(float64(b.used))
	return nil
}

// share is what each cluster holding memory, and r, may count on: the
// limit divided among them.
func (b *SnapshotBudget) share(r *reservation) int64 {
	holding := int64(0)
	for _, h := range b.holders {
		if h.bytes > 0 || h == r {
			holding++
		}
	}
	return b.limit / max(holding, 1)
}

// mostOver is the snapshot in transit, other than r, that holds the most
// over share; nil if none does.
func (b *SnapshotBudget) mostOver(share int64, r *reservation) *reservation {
	var v *reservation
	for _, h := range b.holders {
		if h != r && !h.complete && h.bytes > share && (v == nil || h.bytes > v.bytes) {
			v = h
		}
	}
	return v
}

// preempt takes r's memory back at once; r's stream learns of it from
// r.preempted and refuses its snapshot (which frees what decoding
// allocated).
func (b *SnapshotBudget) preempt(r *reservation) {
	b.used -= r.bytes
	r.bytes, r.gone = 0, true
	delete(b.holders, r.cluster)
	close(r.preempted)
	b.gauge.Set(float64(b.used))
}

func (b *SnapshotBudget) memoryError() *ChunkError {
	return &ChunkError{Code: codes.ResourceExhausted, Reason: "memory",
		Msg: fmt.Sprintf("the server's memory for snapshots in transit is in use (%d MiB); retry later", b.limit>>20)}
}

func (b *SnapshotBudget) preemptedError(r *reservation) *ChunkError {
	return &ChunkError{Code: codes.ResourceExhausted, Reason: "preempted",
		Msg: fmt.Sprintf("the server's memory for snapshots in transit (%d MiB) went to clusters within their share, and this snapshot held more than its share; retry later", b.limit>>20)}
}

// held is what r holds.
func (b *SnapshotBudget) held(r *reservation) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return r.bytes
}

// shrink cuts r down to n bytes, if it holds more.
func (b *SnapshotBudget) shrink(r *reservation, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !r.gone && r.bytes > n {
		b.used -= r.bytes - n
		r.bytes = n
		b.gauge.Set(float64(b.used))
	}
}

// complete marks r's snapshot assembled: it is no longer preempted.
func (b *SnapshotBudget) complete(r *reservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r.complete = true
}

// release returns r, unless it is gone already.
func (b *SnapshotBudget) release(r *reservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.gone {
		return
	}
	r.gone = true
	b.used -= r.bytes
	r.bytes = 0
	if b.holders[r.cluster] == r {
		delete(b.holders, r.cluster)
	}
	b.gauge.Set(float64(b.used))
}

// InUse is the memory reserved now.
func (b *SnapshotBudget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Limit is the memory the budget holds.
func (b *SnapshotBudget) Limit() int64 { return b.limit }
