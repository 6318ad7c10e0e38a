package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
)

// holding is how a relaytest.Holder holds: how many parts it sends, the
// pause before each and before a new stream.
type holding struct {
	parts        int
	every, retry time.Duration
}

// startHolders runs a relaytest.Holder of each cluster (registered and
// bootstrapped here) against f until the test ends.
func startHolders(t *testing.T, f *servertest.Server, clusters []string, shape holding) []*relaytest.Holder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var out []*relaytest.Holder
	for _, c := range clusters {
		f.Registry.Set(server.Registration{Name: c, UID: c + "-uid"})
		cred := f.Bootstrap(c)
		h := &relaytest.Holder{Client: relaypb.NewDiscoveryClient(f.Dial(f.MTLS(cred.TLS))), Cluster: c,
			Parts: shape.parts, Every: shape.every, Retry: shape.retry}
		out = append(out, h)
		wg.Add(1)
		go func() { defer wg.Done(); h.Run(ctx) }()
	}
	return out
}

// peakReserved samples the server's memory for snapshots in transit until
// the test ends; the returned function gives the peak so far.
func peakReserved(t *testing.T, f *servertest.Server) func() int64 {
	var peak atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			peak.Store(max(peak.Load(), int64(f.Metric(server.MetricSnapshotAssembly))))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return peak.Load
}

// legitimate registers and bootstraps n legitimate clusters, each with a
// small snapshot (about 2 KiB); push runs their agents' sessions and waits
// until every snapshot is in the view, and returns how long each took,
// from the session taking the snapshot to the view holding it.
func legitimate(t *testing.T, f *servertest.Server, n int) (push func() []time.Duration) {
	t.Helper()
	type cluster struct {
		cred servertest.AgentCred
		src  *source
		snap *relaypb.Snapshot
	}
	var mu sync.Mutex
	at := map[string]time.Time{}
	all := map[string]cluster{}
	f.View.OnSnapshot(func(c string) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if l, ok := all[c]; ok && f.View.Snapshot(c).GetHash() == l.snap.GetHash() {
			if _, seen := at[c]; !seen {
				at[c] = now
			}
		}
	})
	for i := range n {
		c := fmt.Sprintf("legit-%d", i)
		f.Registry.Set(server.Registration{Name: c, UID: c + "-uid"})
		s := snapshot(c, 5)
		l := cluster{cred: f.Bootstrap(c), src: newSource(s), snap: s}
		mu.Lock()
		all[c] = l
		mu.Unlock()
	}
	return func() []time.Duration {
		t.Helper()
		for _, l := range all {
			startSession(t, f, l.cred, l.src)
		}
		require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(at) == n }, 2*time.Minute, 10*time.Millisecond,
			"every legitimate snapshot is accepted")
		var took []time.Duration
		mu.Lock()
		defer mu.Unlock()
		for c, l := range all {
			took = append(took, at[c].Sub(l.src.askedAt(l.snap.GetHash())))
		}
		slices.Sort(took)
		t.Logf("%d legitimate snapshots accepted: latency min %s, median %s, max %s (under -race, on a shared machine)", n,
			took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
		return took
	}
}

// Issue 27's attack: four compromised clusters each send a header
// announcing 64 MiB and nothing more, again whenever refused. A header
// reserves nothing, so every other cluster's snapshot is accepted at once;
// and each holder is dropped once it has gone SnapshotIdle without a part.
func TestHeadersAloneHoldNoSnapshotMemory(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true, SnapshotIdle: time.Second})
	peak := peakReserved(t, f)
	push := legitimate(t, f, 8)
	holders := startHolders(t, f, []string{"hostile-0", "hostile-1", "hostile-2", "hostile-3"}, holding{})
	push()
	require.Eventually(t, func() bool { return f.Metric(server.MetricSnapshotsRefused, "reason", "idle") >= 4 }, time.Minute, 10*time.Millisecond,
		"every holder is dropped for want of parts")
	for _, h := range holders {
		refusals, last := h.Refusals()
		if refusals[codes.DeadlineExceeded] > 0 {
			assert.Contains(t, last, "no part for 1s (0 of 1024 parts)")
		}
	}
	assert.Less(t, peak(), int64(64<<10), "the headers held nothing; only the legitimate snapshots took memory")
	for i := range 4 {
		assert.Nil(t, f.View.Snapshot(fmt.Sprintf("hostile-%d", i)))
	}
}

// A compromised cluster that drips parts, each within the idle limit but
// under the minimum rate, is dropped once its first SnapshotIdle has
// passed, and what it held is returned.
func TestSlowDripIsDropped(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true, SnapshotIdle: time.Second, SnapshotMinRate: 1 << 20})
	// 64 KiB every 300 ms: about 213 KiB/s, under 1 MiB/s.
	holders := startHolders(t, f, []string{"hostile-0"}, holding{parts: 1000, every: 300 * time.Millisecond, retry: time.Minute})
	require.Eventually(t, func() bool { r, _ := holders[0].Refusals(); return len(r) > 0 }, time.Minute, 10*time.Millisecond)
	refusals, last := holders[0].Refusals()
	assert.Equal(t, map[codes.Code]int{codes.DeadlineExceeded: 1}, refusals)
	assert.Contains(t, last, "under the minimum rate of 1024 KiB/s")
	assert.Equal(t, float64(1), f.Metric(server.MetricSnapshotsRefused, "reason", "slow"))
	require.Eventually(t, func() bool { return f.Metric(server.MetricSnapshotAssembly) == 0 }, 30*time.Second, 10*time.Millisecond, "what it held is returned")
}

// Many compromised clusters (12) each send the parts whose decoding takes
// the most memory per byte (about 9 MiB for 64 KiB) and then hold them,
// again whenever refused, filling the server's memory for snapshots in
// transit (32 MiB here); eight legitimate agents push meanwhile. Each
// legitimate snapshot fits its share, so it gets room from the holders
// furthest over theirs: every one is accepted, the memory is never
// exceeded, and no hostile snapshot reaches the view.
func TestManyHostileClustersCannotStarveOthers(t *testing.T) {
	const budget = 32 << 20
	f := servertest.New(t, servertest.Options{DataPath: true, SnapshotMemory: budget, SnapshotBurst: 1000})
	push := legitimate(t, f, 8)
	peak := peakReserved(t, f)
	var hostile []string
	for i := range 12 {
		hostile = append(hostile, fmt.Sprintf("hostile-%d", i))
	}
	start := time.Now()
	holders := startHolders(t, f, hostile, holding{parts: 4, retry: time.Second})
	require.Eventually(t, func() bool { return f.Metric(server.MetricSnapshotAssembly) > budget*3/4 }, time.Minute, 5*time.Millisecond,
		"the holders fill the memory")
	t.Logf("the holders hold %.0f MiB of %d after %s", f.Metric(server.MetricSnapshotAssembly)/(1<<20), budget>>20, time.Since(start).Round(time.Millisecond))
	push()
	assert.LessOrEqual(t, peak(), int64(budget), "the memory is never exceeded")
	assert.Positive(t, f.Metric(server.MetricSnapshotsRefused, "reason", "preempted"), "holders over their share were preempted")
	preempted := 0
	for _, h := range holders {
		refusals, _ := h.Refusals()
		preempted += refusals[codes.ResourceExhausted]
	}
	t.Logf("hostile streams refused for memory or preempted: %d; preempted (server): %.0f", preempted, f.Metric(server.MetricSnapshotsRefused, "reason", "preempted"))
	for _, c := range hostile {
		assert.Nil(t, f.View.Snapshot(c), "no hostile snapshot reached the view")
	}
}
