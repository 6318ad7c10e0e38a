package server

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"golang.org/x/time/rate"
)

// perCluster holds one token bucket per cluster; a deregistered cluster's
// bucket is dropped.
type perCluster struct {
	mu    sync.Mutex
	limit rate.Limit
	burst int
	by    map[string]*rate.Limiter
}

func newPerCluster(perMinute float64, burst int) *perCluster {
	return &perCluster{limit: rate.Limit(perMinute / 60), burst: burst, by: map[string]*rate.Limiter{}}
}

func (p *perCluster) allow(cluster string, now time.Time) bool {
	p.mu.Lock()
	l := p.by[cluster]
	if l == nil {
		l = rate.NewLimiter(p.limit, p.burst)
		p.by[cluster] = l
	}
	p.mu.Unlock()
	return l.AllowN(now, 1)
}

func (p *perCluster) forget(cluster string) {
	p.mu.Lock()
	delete(p.by, cluster)
	p.mu.Unlock()
}

// throttleLog summarises refusals that a limit stopped before they were
// evaluated: instead of one audit record per call (which a flood would turn
// into a full disk), one Throttled record per window and kind, with the
// count and the peers.
type throttleLog struct {
	rec    audit.Recorder
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	start time.Time
	kinds map[string]*throttled
}

type throttled struct {
	count int
	peers map[string]bool
}

// maxSummarisedPeers bounds the peers one summary names.
const maxSummarisedPeers = 16

func newThrottleLog(rec audit.Recorder, window time.Duration, now func() time.Time) *throttleLog {
	return &throttleLog{rec: rec, window: window, now: now, kinds: map[string]*throttled{}}
}

// add counts one throttled call of kind (e.g. "bootstrap") from peer (an
// address or a cluster), and writes the summary of the window that ended.
func (t *throttleLog) add(kind, peer string) {
	t.mu.Lock()
	now := t.now()
	if t.start.IsZero() {
		t.start = now
	}
	k := t.kinds[kind]
	if k == nil {
		k = &throttled{peers: map[string]bool{}}
		t.kinds[kind] = k
	}
	k.count++
	if len(k.peers) < 10000 {
		k.peers[peer] = true
	}
	due := now.Sub(t.start) >= t.window
	t.mu.Unlock()
	if due {
		t.flush()
	}
}

// flush writes one record per kind seen since the last flush.
func (t *throttleLog) flush() {
	t.mu.Lock()
	kinds, start, end := t.kinds, t.start, t.now()
	t.kinds, t.start = map[string]*throttled{}, time.Time{}
	t.mu.Unlock()
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		k := kinds[name]
		peers := make([]string, 0, len(k.peers))
		for p := range k.peers {
			peers = append(peers, p)
		}
		sort.Strings(peers)
		shown := peers[:min(len(peers), maxSummarisedPeers)]
		_ = t.rec.Record(audit.Event{Type: audit.Throttled, Result: audit.ResultFailure, Reason: name,
			Details: map[string]string{"count": fmt.Sprint(k.count), "peers": fmt.Sprint(len(peers)), "first_peers": fmt.Sprint(shown),
				"from": start.UTC().Format(time.RFC3339), "to": end.UTC().Format(time.RFC3339)}})
	}
}
