package heads_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/heads"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const ns = "relaymesh"

func apiserver(t *testing.T) kubernetes.Interface {
	t.Helper()
	_, cs, _ := localcluster.Management(t, ns)
	return cs
}

func digest(b byte) string { return strings.Repeat(fmt.Sprintf("%02x", b), 32) }

func started(t *testing.T, cs kubernetes.Interface) *heads.Store {
	t.Helper()
	s := heads.New(cs, ns, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, s.Start(ctx))
	return s
}

// Heads are written with the shard's resourceVersion as precondition:
// writers racing on one shard both land, a lower version never replaces a
// higher one, a zero head deletes, and hand-written garbage in a shard is
// ignored without hiding the good entries.
func TestStore(t *testing.T) {
	cs := apiserver(t)
	ctx := context.Background()
	a, b := started(t, cs), started(t, cs)
	var mu sync.Mutex
	changed := map[string]int{}
	b.OnChange(func(c string) { mu.Lock(); changed[c]++; mu.Unlock() })

	var wg sync.WaitGroup
	for w, s := range []*heads.Store{a, b} {
		wg.Go(func() {
			up := map[string]heads.Head{}
			for i := range 40 {
				up[fmt.Sprintf("w%d-cluster-%d", w, i)] = heads.Head{Version: uint64(100 + i), Digest: digest(byte(i))}
			}
			assert.NoError(t, s.Write(ctx, up))
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return len(a.All()) == 80 && len(b.All()) == 80 }, 10*time.Second, 20*time.Millisecond)
	h, ok := b.Head("w0-cluster-7")
	require.True(t, ok)
	assert.Equal(t, heads.Head{Version: 107, Digest: digest(7)}, h)
	mu.Lock()
	assert.Equal(t, 1, changed["w1-cluster-3"])
	mu.Unlock()

	// Never back: a deposed leader's late, lower write changes nothing.
	require.NoError(t, a.Write(ctx, map[string]heads.Head{"w0-cluster-7": {Version: 50, Digest: digest(99)}}))
	require.NoError(t, a.Write(ctx, map[string]heads.Head{"w0-cluster-8": {Version: 500, Digest: digest(98)}}))
	require.Eventually(t, func() bool { h, _ := b.Head("w0-cluster-8"); return h.Version == 500 }, 5*time.Second, 20*time.Millisecond)
	h, _ = b.Head("w0-cluster-7")
	assert.Equal(t, uint64(107), h.Version)

	require.NoError(t, a.Write(ctx, map[string]heads.Head{"w0-cluster-9": {}}))
	require.Eventually(t, func() bool { _, ok := b.Head("w0-cluster-9"); return !ok }, 5*time.Second, 20*time.Millisecond)

	// Garbage written by hand into a shard.
	shard := heads.ShardName("w1-cluster-0")
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, shard, metav1.GetOptions{})
	require.NoError(t, err)
	cm.Data["bad-version"] = "0 " + digest(1)
	cm.Data["bad-digest"] = "12 xyz"
	cm.Data["no-space"] = "12"
	cm.Data["huge"] = "99999999999999999999999 " + digest(1)
	cm.Data["w1-cluster-0"] = "18446744073709551615 " + digest(1) // would freeze the cluster's versions
	for c := range 200 {
		if name := fmt.Sprintf("elsewhere-%d", c); heads.ShardName(name) != shard {
			cm.Data[name] = "5 " + digest(5) // in the wrong shard
			break
		}
	}
	_, err = cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, a.Write(ctx, map[string]heads.Head{"w1-cluster-0": {Version: 1000, Digest: digest(3)}}))
	require.Eventually(t, func() bool { h, _ := b.Head("w1-cluster-0"); return h.Version == 1000 }, 5*time.Second, 20*time.Millisecond)
	for _, c := range []string{"bad-version", "bad-digest", "no-space", "huge"} {
		_, ok := b.Head(c)
		assert.False(t, ok, c)
	}
	assert.Len(t, b.All(), 79)
}

func manifest(name string) []*relaypb.OutputObject {
	return []*relaypb.OutputObject{{Manifest: []byte(`{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"` + name + `","namespace":"x"}}`)}}
}

type replica struct {
	out    *server.Outputs
	store  *heads.Store
	writer *heads.Writer
	cancel context.CancelFunc
	done   chan struct{}
}

func newReplica(t *testing.T, cs kubernetes.Interface, start time.Time) *replica {
	r := &replica{out: server.NewOutputs(start), store: started(t, cs)}
	r.store.OnChange(r.out.HeadChanged)
	r.out.UseHeads(r.store.Head)
	r.writer = heads.NewWriter(r.store, r.out, nil)
	r.out.OnPublish(r.writer.Dirty)
	r.out.MarkReady()
	return r
}

func (r *replica) lead() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() { r.writer.Lead(ctx); close(r.done) }()
}

func (r *replica) stop() { r.cancel(); <-r.done }

// Two replicas with different version counters serve one order of
// versions: the leader's. A replica that has not computed the leader's
// content serves nothing new; a new leader goes on above the old heads.
func TestReplicasServeTheLeadersVersions(t *testing.T) {
	cs := apiserver(t)
	// b's counter is far ahead of a's (started later): without heads an
	// agent moving from b to a would see versions go back.
	a, b := newReplica(t, cs, time.Now()), newReplica(t, cs, time.Now().Add(10*time.Minute))
	a.out.Set("c1", manifest("one"))
	b.out.Set("c1", manifest("one"))
	assert.Nil(t, a.out.Get("c1"), "no head yet: nothing is served")
	a.lead()
	var v1 uint64
	require.Eventually(t, func() bool {
		sa, sb := a.out.Get("c1"), b.out.Get("c1")
		if sa == nil || sb == nil {
			return false
		}
		v1 = sa.GetVersion()
		return sb.GetVersion() == v1
	}, 5*time.Second, 10*time.Millisecond)

	// The leader moves on; b has not seen the edit yet: it serves nothing.
	a.out.Set("c1", manifest("two"))
	require.Eventually(t, func() bool { h, _ := b.store.Head("c1"); return h.Version > v1 }, 5*time.Second, 10*time.Millisecond)
	assert.Nil(t, b.out.Get("c1"), "a replica behind the leader serves nothing new")
	b.out.Set("c1", manifest("two"))
	// The leader serves the new set once its own watch has shown it the
	// head it wrote (the other replica's watch may be first).
	var v2 uint64
	require.Eventually(t, func() bool { v2 = a.out.Get("c1").GetVersion(); return v2 > v1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, v2, b.out.Get("c1").GetVersion())

	// b takes over: its own counter is ahead, but the first thing it does is
	// adopt; content equal to the head keeps the head's version.
	a.stop()
	b.lead()
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, v2, b.out.Get("c1").GetVersion(), "an unchanged set keeps its version across leaders")
	b.out.Set("c1", manifest("three"))
	a.out.Set("c1", manifest("three"))
	// Each serves the new set once its own watch has shown it the head b
	// wrote; a's may come first (make test caught b serving nothing yet).
	require.Eventually(t, func() bool {
		sa, sb := a.out.Get("c1"), b.out.Get("c1")
		return sa != nil && sb != nil && sa.GetVersion() > v2 && sb.GetVersion() == sa.GetVersion()
	}, 5*time.Second, 10*time.Millisecond, "both replicas serve the new leader's version")

	// A cluster removed on the leader loses its head.
	b.out.Set("c2", manifest("x"))
	require.Eventually(t, func() bool { _, ok := a.store.Head("c2"); return ok }, 5*time.Second, 10*time.Millisecond)
	b.out.Remove("c2")
	require.Eventually(t, func() bool { _, ok := a.store.Head("c2"); return !ok }, 5*time.Second, 10*time.Millisecond)
	b.stop()
}

// The writer of a head serves it as soon as its write returns, without
// waiting for its own watch; a set whose head is not written yet wakes
// no stream (it would find nothing to send), the head's arrival does.
func TestALeaderServesTheHeadItWroteAtOnce(t *testing.T) {
	cs := apiserver(t)
	ctx := context.Background()
	r := newReplica(t, cs, time.Now())
	woken, cancel := r.out.Subscribe("c1")
	defer cancel()

	r.out.Set("c1", manifest("one"))
	select {
	case <-woken:
		t.Fatal("a set without its head woke the cluster's streams")
	default:
	}
	local, ok := r.out.Local("c1")
	require.True(t, ok)
	require.NoError(t, r.store.Write(ctx, map[string]heads.Head{"c1": local}))
	require.Equal(t, local.Version, r.out.Get("c1").GetVersion(), "served right after the write returned")
	// The wake comes from whichever applied the head first, the write or
	// the watch; the latter may still be on its way to the listeners.
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("the written head did not wake the cluster's streams")
	}

	// A replica behind its leader: the head names content it computes
	// only later, and that publication is what wakes its streams.
	other := newReplica(t, cs, time.Now())
	wokenOther, cancelOther := other.out.Subscribe("c1")
	defer cancelOther()
	require.Eventually(t, func() bool { h, _ := other.store.Head("c1"); return h == local }, 5*time.Second, 10*time.Millisecond)
	select {
	case <-wokenOther:
	default:
	}
	other.out.Set("c1", manifest("one"))
	select {
	case <-wokenOther:
	default:
		t.Fatal("content matching the head did not wake the streams")
	}
	assert.Equal(t, local.Version, other.out.Get("c1").GetVersion())
}

// A translation's sets reach the head writer in one burst: its listeners
// hear of them when the batch ends, so the writer writes each shard once.
func TestBatchTellsThePublicationsAtItsEnd(t *testing.T) {
	out := server.NewOutputs(time.Now())
	var mu sync.Mutex
	var told []string
	out.OnPublish(func(c string) { mu.Lock(); told = append(told, c); mu.Unlock() })
	out.Batch(func() {
		out.Set("c1", manifest("one"))
		out.Set("c2", manifest("two"))
		out.Set("c1", manifest("one")) // unchanged: not told again
		out.Remove("c3")
		mu.Lock()
		assert.Empty(t, told, "nothing is told while the batch runs")
		mu.Unlock()
	})
	assert.Equal(t, []string{"c1", "c2", "c3"}, told)
	out.Set("c4", manifest("four"))
	assert.Equal(t, []string{"c1", "c2", "c3", "c4"}, told)
}
