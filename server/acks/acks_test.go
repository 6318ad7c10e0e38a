package acks_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/server/acks"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const ns = "relaymesh"

// isWrite: a write of a shard (created, then patched).
func isWrite(a k8stesting.Action) bool {
	return a.GetVerb() == "create" || a.GetVerb() == "update" || a.GetVerb() == "patch"
}

func digest(b byte) string { return strings.Repeat(fmt.Sprintf("%02x", b), 32) }

// version is a plausible output version (versions start at a replica's
// start time in nanoseconds).
func version(n uint64) uint64 { return base + n }

var base = uint64(time.Now().Add(-time.Hour).UnixNano())

func started(t *testing.T, cs kubernetes.Interface, interval time.Duration) *acks.Ledger {
	t.Helper()
	l := acks.New(cs, ns, nil, interval)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, l.Start(ctx))
	return l
}

// Two replicas record acks at once on a real apiserver: every record lands
// and both read all of them; a stale ack (a lower version, from the
// replica the agent left) never replaces a newer one; the same version
// with other results does; Forget deletes; hand-written garbage in a shard
// is ignored without hiding the good records, and Read sees what the
// replicas see.
func TestLedger(t *testing.T) {
	_, cs, _ := localcluster.Management(t, ns)
	a, b := started(t, cs, 50*time.Millisecond), started(t, cs, 50*time.Millisecond)
	var mu sync.Mutex
	changed := map[string]int{}
	b.OnChange(func(c string) { mu.Lock(); changed[c]++; mu.Unlock() })

	for w, l := range []*acks.Ledger{a, b} {
		for i := range 40 {
			l.Record(fmt.Sprintf("w%d-cluster-%d", w, i), acks.Entry{Version: version(uint64(i + 1)), Digest: digest(byte(i))})
		}
	}
	for _, l := range []*acks.Ledger{a, b} {
		require.Eventually(t, func() bool {
			for w := range 2 {
				for i := range 40 {
					if e, ok := l.Entry(fmt.Sprintf("w%d-cluster-%d", w, i)); !ok || e.Version != version(uint64(i+1)) || e.Digest != digest(byte(i)) {
						return false
					}
				}
			}
			return true
		}, 20*time.Second, 20*time.Millisecond, "both replicas read all 80 records")
	}
	mu.Lock()
	assert.Equal(t, 1, changed["w0-cluster-7"], "b heard of a's record once")
	mu.Unlock()

	newer := acks.Entry{Version: version(100), Digest: digest(1)}
	b.Record("moved", newer)
	require.Eventually(t, func() bool { e, _ := a.Entry("moved"); return e == newer }, 10*time.Second, 20*time.Millisecond)
	a.Record("moved", acks.Entry{Version: version(99), Digest: digest(2)}) // the replica the agent left, late
	a.Record("marker", acks.Entry{Version: version(1), Digest: digest(3)})
	require.Eventually(t, func() bool { _, ok := b.Entry("marker"); return ok }, 10*time.Second, 20*time.Millisecond)
	e, _ := b.Entry("moved")
	assert.Equal(t, newer, e, "an older ack never replaces a newer one")

	reacked := acks.Entry{Version: version(100), Digest: digest(9)}
	a.Record("moved", reacked)
	require.Eventually(t, func() bool { e, _ := b.Entry("moved"); return e == reacked }, 10*time.Second, 20*time.Millisecond,
		"the same version acked again with other results is recorded")

	b.Forget("moved")
	require.Eventually(t, func() bool { _, ok := a.Entry("moved"); return !ok }, 10*time.Second, 20*time.Millisecond, "Forget deletes")

	// Garbage written by hand into a shard: skipped, the rest stays.
	shard := acks.ShardName("w0-cluster-3")
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(context.Background(), shard, metav1.GetOptions{})
	require.NoError(t, err)
	cm.Data["garbage"] = "not a record"
	cm.Data["future"] = fmt.Sprintf("%d %s", uint64(time.Now().Add(1000*time.Hour).UnixNano()), digest(4))
	for i := 0; ; i++ {
		if other := fmt.Sprintf("elsewhere-%d", i); acks.ShardName(other) != shard {
			cm.Data[other] = fmt.Sprintf("%d %s", version(5), digest(5)) // a record in another cluster's shard
			break
		}
	}
	_, err = cs.CoreV1().ConfigMaps(ns).Update(context.Background(), cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, _ := cs.CoreV1().ConfigMaps(ns).Get(context.Background(), shard, metav1.GetOptions{})
		return c != nil && c.Data["garbage"] != ""
	}, 5*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // the watch
	_, ok := a.Entry("garbage")
	assert.False(t, ok, "a record that does not parse is not read")
	for c := range cm.Data {
		if strings.HasPrefix(c, "elsewhere-") {
			_, ok = a.Entry(c)
			assert.False(t, ok, "a record in another cluster's shard is not read")
		}
	}
	_, ok = a.Entry("future")
	assert.False(t, ok, "a version of no replica's making is not read (it would block every later ack)")
	e, ok = a.Entry("w0-cluster-3")
	assert.True(t, ok && e.Version == version(4), "the shard's good records stay")
	// A later record of a cluster whose stored record is garbage replaces it.
	a.Record("garbage", acks.Entry{Version: version(1), Digest: digest(6)})
	require.Eventually(t, func() bool { _, ok := b.Entry("garbage"); return ok }, 10*time.Second, 20*time.Millisecond)

	all, err := acks.Read(context.Background(), cs, ns)
	require.NoError(t, err)
	assert.Equal(t, version(1), all["w1-cluster-0"].Version)
	assert.NotContains(t, all, "future")
}

// A burst of acks is a few writes, not one per ack: 1,000 clusters'
// records, recorded over a burst, reach the apiserver in at most one write
// per shard per interval.
func TestLedgerBatchesABurst(t *testing.T) {
	cs, writes := countingWrites()
	l := started(t, cs, 200*time.Millisecond)
	start := time.Now()
	for i := range 1000 {
		l.Record(fmt.Sprintf("cluster-%04d", i), acks.Entry{Version: version(1), Digest: digest(0)})
		if i%100 == 99 {
			time.Sleep(20 * time.Millisecond) // acks arrive over ~200 ms
		}
	}
	require.Eventually(t, func() bool {
		all, err := acks.Read(context.Background(), cs, ns)
		return err == nil && len(all) == 1000
	}, 10*time.Second, 20*time.Millisecond)
	took := time.Since(start)
	time.Sleep(300 * time.Millisecond) // the last batch's count
	batches, n := l.Flushes(), writes()
	assert.LessOrEqual(t, n, batches*acks.Shards, "at most one write per shard per batch")
	assert.LessOrEqual(t, batches, int(took/(200*time.Millisecond))+2, "batches at most every interval")
	assert.Less(t, n, 100, "1,000 acks are a few dozen writes")
	t.Logf("1,000 acks: %d writes in %d batches over %v", n, batches, took.Round(time.Millisecond))
}

// The first ack of a burst waits for the rest: 1,000 acks arriving over
// ~100 ms, less than the interval, are one batch, one write per shard.
// Written 20 ms after the first ack, as before, the first few were a batch
// of their own: up to 16 more writes, during the edit's delivery.
func TestLedgerGathersABurstIntoOneBatch(t *testing.T) {
	cs, writes := countingWrites()
	const interval = time.Second
	l := started(t, cs, interval)
	start := time.Now()
	for i := range 1000 {
		l.Record(fmt.Sprintf("cluster-%04d", i), acks.Entry{Version: version(1), Digest: digest(0)})
		if i%100 == 99 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	require.Less(t, time.Since(start), interval, "the burst was recorded within the interval")
	require.Eventually(t, func() bool {
		all, err := acks.Read(context.Background(), cs, ns)
		return err == nil && len(all) == 1000
	}, 10*time.Second, 20*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), interval, "the burst waited the interval")
	time.Sleep(300 * time.Millisecond) // the batch's count, after its writes
	assert.Equal(t, 1, l.Flushes(), "one batch")
	assert.LessOrEqual(t, writes(), acks.Shards, "one write per shard")
}

// countingWrites is a fake clientset and the number of shard writes made
// through it so far.
func countingWrites() (*fake.Clientset, func() int) {
	cs := fake.NewClientset()
	var n atomic.Int64
	cs.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if isWrite(a) {
			n.Add(1)
		}
		return false, nil, nil
	})
	return cs, func() int { return int(n.Load()) }
}

// A write that fails (here: the shard's create) is read again and retried,
// and a failing apiserver is retried until it answers, without losing a
// record queued meanwhile. (A record another replica changed meanwhile:
// server/shardedcm TestAStaleCopyIsReadAgain.)
func TestLedgerRetries(t *testing.T) {
	cs := fake.NewClientset()
	var mu sync.Mutex
	failing := 3
	cs.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failing > 0 {
			failing--
			return true, nil, fmt.Errorf("apiserver unavailable")
		}
		return false, nil, nil
	})
	l := started(t, cs, 10*time.Millisecond)
	l.Record("c1", acks.Entry{Version: version(1), Digest: digest(1)})
	time.Sleep(50 * time.Millisecond)
	l.Record("c2", acks.Entry{Version: version(2), Digest: digest(2)})
	require.Eventually(t, func() bool {
		all, _ := acks.Read(context.Background(), cs, ns)
		return all["c1"].Version == version(1) && all["c2"].Version == version(2)
	}, 10*time.Second, 20*time.Millisecond)
}

func TestParse(t *testing.T) {
	good := fmt.Sprintf("%d %s", version(1), digest(1))
	e, err := acks.Parse(good)
	require.NoError(t, err)
	assert.Equal(t, version(1), e.Version)
	for _, bad := range []string{"", " ", "1", "0 " + digest(1), "-1 " + digest(1), "x " + digest(1), fmt.Sprintf("%d %s", version(1), digest(1)[:63]),
		fmt.Sprintf("%d %s", version(1), strings.ToUpper(digest(0xab))), fmt.Sprintf("%d %sff", version(1), digest(1)),
		"18446744073709551615 " + digest(1), good + " ", strings.Repeat("9", 1<<20)} {
		_, err := acks.Parse(bad)
		assert.Error(t, err, "%.80q", bad)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(fmt.Sprintf("%d %s", version(1), digest(1)))
	f.Add("0 x")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := acks.Parse(s)
		if err != nil {
			return
		}
		// What parses encodes back to itself.
		if got := fmt.Sprintf("%d %s", e.Version, e.Digest); got != s {
			t.Fatalf("%q parsed to %q", s, got)
		}
	})
}

// A new Lease holder sweeps the records of clusters deregistered between
// two terms (only the Lease holder forgets a deregistered cluster's
// record): what the registry no longer has is deleted, the rest stays.
func TestPruneForgetsUnregisteredClusters(t *testing.T) {
	cs := fake.NewClientset()
	l := started(t, cs, 10*time.Millisecond)
	for _, c := range []string{"kept", "gone-1", "gone-2"} {
		l.Record(c, acks.Entry{Version: version(1), Digest: digest(1)})
	}
	require.Eventually(t, func() bool { all, _ := acks.Read(context.Background(), cs, ns); return len(all) == 3 }, 10*time.Second, 20*time.Millisecond)
	// Prune sweeps what this replica's map shows: every record, not just
	// one of them (the three may be in different shards, applied apart).
	require.Eventually(t, func() bool { return len(l.Clusters()) == 3 }, 10*time.Second, 20*time.Millisecond)

	assert.Equal(t, 2, l.Prune(func(c string) bool { return c == "kept" }))
	require.Eventually(t, func() bool {
		all, _ := acks.Read(context.Background(), cs, ns)
		_, kept := all["kept"]
		return len(all) == 1 && kept
	}, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return len(l.Clusters()) == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Zero(t, l.Prune(func(c string) bool { return c == "kept" }), "nothing left to sweep")
}

// A replica that is not the Lease holder drops what it queued for a
// deregistered cluster without writing; if the cluster's record was being
// written when it was dropped, that write's record is deleted after it, so
// a late write does not bring a deregistered cluster's record back.
func TestDropDeletesARecordItWasWriting(t *testing.T) {
	cs := fake.NewClientset()
	var mu sync.Mutex
	writes := 0
	var hold chan struct{}
	entered := make(chan struct{}, 1)
	cs.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !isWrite(a) {
			return false, nil, nil
		}
		mu.Lock()
		writes++
		h := hold
		mu.Unlock()
		if h != nil {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-h
		}
		return false, nil, nil
	})
	l := started(t, cs, 10*time.Millisecond)

	// Queued and dropped before its batch: never written.
	l.Record("queued", acks.Entry{Version: version(1), Digest: digest(1)})
	l.Drop("queued")
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	assert.Zero(t, writes, "a dropped record is not written")
	mu.Unlock()

	// Dropped while its batch is being written: deleted after it.
	mu.Lock()
	hold = make(chan struct{})
	release := hold
	mu.Unlock()
	l.Record("flying", acks.Entry{Version: version(2), Digest: digest(2)})
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch was not written")
	}
	l.Drop("flying")
	mu.Lock()
	hold = nil
	mu.Unlock()
	close(release)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return writes >= 2
	}, 10*time.Second, 20*time.Millisecond, "the record written late is deleted")
	require.Eventually(t, func() bool {
		all, err := acks.Read(context.Background(), cs, ns)
		_, ok := all["flying"]
		return err == nil && !ok
	}, 10*time.Second, 20*time.Millisecond)
}
