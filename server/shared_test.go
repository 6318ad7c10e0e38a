package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
)

// replica is one server replica's shared snapshots: its own View, its own
// store client, the registrations every replica sees.
type replica struct {
	view   *server.View
	shared *server.SharedSnapshots
	kicks  atomic.Int64
	stop   context.CancelFunc
	done   chan struct{}
}

type registrations struct {
	mu    sync.Mutex
	names map[string]bool
}

func (r *registrations) has(c string) bool { r.mu.Lock(); defer r.mu.Unlock(); return r.names[c] }
func (r *registrations) set(c string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names[c] = on
}

func startReplica(t *testing.T, redis *localcluster.Redis, name string, regs *registrations) *replica {
	t.Helper()
	store, err := snapshots.New(snapshots.Config{Address: redis.Address(), Password: redis.Password(), TLS: redis.TLS(), Key: bytes.Repeat([]byte{1}, 32), Timeout: time.Second})
	require.NoError(t, err)
	r := &replica{view: server.NewView(), done: make(chan struct{})}
	r.shared, err = server.NewSharedSnapshots(server.SharedConfig{Store: store, View: r.view, Namespace: "relaymesh", Replica: name,
		Owns: r.view.Has, Registered: regs.has, Resync: time.Second, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	r.shared.OnChange(func() { r.kicks.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.shared.Run(ctx); _ = store.Close(); close(r.done) }()
	t.Cleanup(func() { r.stop(); <-r.done })
	waitCtx, cancelWait := context.WithTimeout(ctx, 10*time.Second)
	defer cancelWait()
	require.NoError(t, r.shared.WaitSynced(waitCtx))
	return r
}

// names lists the Workloads a replica reads, by cluster.
func names(r *replica) map[string][]string {
	out := map[string][]string{}
	for _, w := range r.shared.Workloads() {
		c := w.Labels[discoveryv1alpha1.LabelCluster]
		out[c] = append(out[c], w.Spec.Kubernetes.Controller.Name)
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}

// Replicas share snapshots through Redis: the replica holding a cluster's
// session writes it and every replica reads it as Workloads (the objects
// the mirror would write); a store restarted empty is refilled by the
// replicas that hold the sessions, and a replica started afterwards reads
// everything; a deregistered cluster's Workloads disappear at once and the
// Lease holder deletes its record.
func TestSharedSnapshotsAcrossReplicas(t *testing.T) {
	localcluster.SkipIfShort(t)
	redis, err := localcluster.StartRedis(t.Context(), localcluster.RedisConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = redis.Stop() })
	regs := &registrations{names: map[string]bool{"east": true, "west": true}}
	a := startReplica(t, redis, "a", regs)
	b := startReplica(t, redis, "b", regs)

	east := fleet.SnapshotSpec{Services: 4}.Snapshot("east")
	west := fleet.SnapshotSpec{Services: 3}.Snapshot("west")
	a.view.Accept("east", east, time.Now())
	b.view.Accept("west", west, time.Now())
	want := map[string][]string{}
	for _, w := range east.GetWorkloads() {
		want["east"] = append(want["east"], w.GetName())
	}
	for _, w := range west.GetWorkloads() {
		want["west"] = append(want["west"], w.GetName())
	}
	for _, v := range want {
		sort.Strings(v)
	}
	for _, r := range []*replica{a, b} {
		require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, names(r)) }, 10*time.Second, 20*time.Millisecond)
		assert.Positive(t, r.kicks.Load(), "translation is told")
	}

	// The same object the mirror writes, but for the version.
	objs, err := server.DiscoveredObjects(east, "relaymesh")
	require.NoError(t, err)
	mirrored := map[string]discoveryv1alpha1.Workload{}
	for _, o := range objs {
		if o.Resource != discoveryv1alpha1.Workloads {
			continue
		}
		var w discoveryv1alpha1.Workload
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object.Object, &w))
		mirrored[w.Name] = w
	}
	for _, w := range b.shared.Workloads() {
		if m, ok := mirrored[w.Name]; ok {
			assert.Equal(t, m.Spec, w.Spec)
			assert.Equal(t, m.Labels, w.Labels)
			assert.NotEmpty(t, w.UID)
			delete(mirrored, w.Name)
		}
	}
	assert.Empty(t, mirrored, "every mirrored Workload is read from the store")

	// The store restarts empty: the replicas keep what they read, and write
	// back the snapshots they hold; a new replica then reads both.
	require.NoError(t, redis.Restart(t.Context()))
	c := startReplicaEventually(t, redis, "c", regs)
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, names(c)) }, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, want, names(a))

	// A change of east reaches b.
	east2 := fleet.SnapshotSpec{Services: 6}.Snapshot("east")
	a.view.Accept("east", east2, time.Now())
	require.Eventually(t, func() bool { return len(names(b)["east"]) == len(east2.GetWorkloads()) }, 10*time.Second, 20*time.Millisecond)

	// Deregistered: gone from every replica at once (before any delete),
	// and the Lease holder's Collect deletes the record.
	regs.set("west", false)
	b.view.Remove("west")
	for _, r := range []*replica{a, b, c} {
		assert.NotContains(t, names(r), "west")
	}
	require.NoError(t, a.shared.Collect(t.Context()))
	store, err := snapshots.New(snapshots.Config{Address: redis.Address(), Password: redis.Password(), TLS: redis.TLS(), Key: bytes.Repeat([]byte{1}, 32)})
	require.NoError(t, err)
	defer store.Close()
	stored, err := store.Clusters(t.Context())
	require.NoError(t, err)
	assert.Contains(t, stored, "east")
	assert.NotContains(t, stored, "west")
}

// startReplicaEventually starts a replica once the store answers again.
func startReplicaEventually(t *testing.T, redis *localcluster.Redis, name string, regs *registrations) *replica {
	t.Helper()
	store, err := snapshots.New(snapshots.Config{Address: redis.Address(), Password: redis.Password(), TLS: redis.TLS(), Key: bytes.Repeat([]byte{1}, 32)})
	require.NoError(t, err)
	defer store.Close()
	require.Eventually(t, func() bool { return store.Ping(t.Context()) == nil }, 10*time.Second, 50*time.Millisecond)
	return startReplica(t, redis, name, regs)
}

// A replica that lost the store counts itself cut off only when another
// replica said it reaches the store after it had lost it (by detect) and it
// failed again since; when none does, the store is down and it keeps
// serving; back in touch, it is no longer cut off.
func TestGuardTellsACutFromAStoreThatIsDown(t *testing.T) {
	localcluster.SkipIfShort(t)
	redis, err := localcluster.StartRedis(t.Context(), localcluster.RedisConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = redis.Stop() })
	// Not running: only the test reports the store lost or back, so no
	// resubscription of a loaded machine's watch interleaves.
	store, err := snapshots.New(snapshots.Config{Address: redis.Address(), Password: redis.Password(), TLS: redis.TLS(), Key: bytes.Repeat([]byte{1}, 32), Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	view := server.NewView()
	shared, err := server.NewSharedSnapshots(server.SharedConfig{Store: store, View: view, Namespace: "relaymesh", Replica: "a",
		Owns: view.Has, Registered: (&registrations{names: map[string]bool{}}).has, Resync: time.Second, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	r := &replica{view: view, shared: shared}

	var reached atomic.Pointer[time.Time]
	var asked atomic.Int64
	cuts := make(chan bool, 10)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const grace, detect = 200 * time.Millisecond, 300 * time.Millisecond
	go r.shared.Guard(ctx, grace, detect, func(context.Context) (time.Time, error) {
		asked.Add(1)
		if at := reached.Load(); at != nil {
			return *at, nil
		}
		return time.Time{}, nil
	}, func(cut bool) { cuts <- cut })

	r.shared.Lost(errors.New("test: connection lost"))
	ok, _ := r.shared.Reachable()
	assert.False(t, ok)
	require.Eventually(t, func() bool { return asked.Load() > 0 }, 10*time.Second, 10*time.Millisecond, "asked after the grace")
	select {
	case c := <-cuts:
		t.Fatalf("no other replica reaches the store (it is down), yet cut=%v", c)
	case <-time.After(3 * grace):
	}
	// Another replica reaches it (the store came back); this one's next
	// attempt is closed by the store as it starts: the store failing, not
	// a cut.
	now := time.Now()
	reached.Store(&now)
	time.Sleep(10 * time.Millisecond)
	r.shared.Lost(fmt.Errorf("snapshot store x: %w", io.EOF))
	select {
	case c := <-cuts:
		t.Fatalf("the store closed the connection (it answered), yet cut=%v", c)
	case <-time.After(3 * grace):
	}
	// It fails again to reach it at all, while the other does.
	r.shared.Lost(errors.New("test: still unreachable"))
	select {
	case c := <-cuts:
		assert.True(t, c, "another replica reaches the store: this one is cut off")
	case <-time.After(10 * time.Second):
		t.Fatal("not cut off")
	}
	// It stays cut off while it does not reach the store, however the
	// others' reports and its own failures interleave.
	later := time.Now().Add(time.Hour)
	reached.Store(&later)
	select {
	case c := <-cuts:
		t.Fatalf("cut=%v while still unreachable", c)
	case <-time.After(3 * grace):
	}
	r.shared.Synced()
	select {
	case c := <-cuts:
		assert.False(t, c, "back in touch")
	case <-time.After(10 * time.Second):
		t.Fatal("still cut off")
	}
	ok, _ = r.shared.Reachable()
	assert.True(t, ok)
}

// storeOf is a store client of the replicas' Redis, as a replica opens one
// (a fresh one has seen nothing).
func storeOf(t *testing.T, redis *localcluster.Redis) *snapshots.Store {
	t.Helper()
	store, err := snapshots.New(snapshots.Config{Address: redis.Address(), Password: redis.Password(), TLS: redis.TLS(), Key: bytes.Repeat([]byte{1}, 32), Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
}

// rawRedis is someone with write access to Redis, without the replicas'
// key.
func rawRedis(t *testing.T, redis *localcluster.Redis) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: redis.Address(), Password: redis.Password(), TLSConfig: redis.TLS(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// syncAll makes every replica handle what was published before: a new
// snapshot of west on a, which each delivers after what came before it.
func syncAll(t *testing.T, a *replica, n int, all ...*replica) {
	t.Helper()
	west := fleet.SnapshotSpec{Services: n}.Snapshot("west")
	a.view.Accept("west", west, time.Now())
	for _, r := range all {
		require.Eventually(t, func() bool { return len(names(r)["west"]) == len(west.GetWorkloads()) }, 10*time.Second, 10*time.Millisecond)
	}
}

// A bare PUBLISH of a delete announcement for a registered cluster (no
// record touched, no key) removes none of its Workloads on any replica;
// nor does deleting its record as well (someone with write access to
// Redis): the replicas keep its last verified Workloads, and the replica
// holding its session writes the record again at once.
func TestAForgedAnnouncementRemovesNoWorkload(t *testing.T) {
	localcluster.SkipIfShort(t)
	redis, err := localcluster.StartRedis(t.Context(), localcluster.RedisConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = redis.Stop() })
	regs := &registrations{names: map[string]bool{"east": true, "west": true}}
	a := startReplica(t, redis, "a", regs)
	b := startReplica(t, redis, "b", regs)
	east := fleet.SnapshotSpec{Services: 4}.Snapshot("east")
	a.view.Accept("east", east, time.Now())
	for _, r := range []*replica{a, b} {
		require.Eventually(t, func() bool { return len(names(r)["east"]) == len(east.GetWorkloads()) }, 10*time.Second, 10*time.Millisecond)
	}
	want := names(b)["east"]
	c := rawRedis(t, redis)
	ctx := t.Context()

	require.NoError(t, c.Publish(ctx, "relaymesh:snapshots", "del east").Err())
	syncAll(t, a, 1, a, b)
	for _, r := range []*replica{a, b} {
		assert.Equal(t, want, names(r)["east"], "a forged delete announcement removes nothing")
	}

	require.NoError(t, c.Del(ctx, "relaymesh:snapshot:east").Err())
	require.NoError(t, c.Publish(ctx, "relaymesh:snapshots", "del east").Err())
	syncAll(t, a, 2, a, b)
	for _, r := range []*replica{a, b} {
		assert.Equal(t, want, names(r)["east"], "nor does deleting the record of a registered cluster")
	}
	store := storeOf(t, redis)
	require.Eventually(t, func() bool {
		rec, _, err := store.Get(ctx, "east")
		return err == nil && rec.Snapshot.GetHash() == east.GetHash()
	}, 10*time.Second, 20*time.Millisecond, "the replica holding east's session wrote it again")
}

// An older, genuine record of a cluster written back to Redis does not
// bring back a workload the cluster no longer has, on any replica that
// had read the newer one; the replica holding the session writes the
// newer record again at once. A replica started after a replay that was
// not announced has seen nothing, and takes the replayed record (the
// residual): until the session's replica compares the store with what it
// wrote (every Resync, 1 s here) and writes it again.
func TestAReplayedRecordBringsNoWorkloadBack(t *testing.T) {
	localcluster.SkipIfShort(t)
	redis, err := localcluster.StartRedis(t.Context(), localcluster.RedisConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = redis.Stop() })
	regs := &registrations{names: map[string]bool{"east": true, "west": true}}
	a := startReplica(t, redis, "a", regs)
	b := startReplica(t, redis, "b", regs)
	ctx := t.Context()
	c := rawRedis(t, redis)

	before := fleet.SnapshotSpec{Services: 4}.Snapshot("east")
	a.view.Accept("east", before, time.Now())
	require.Eventually(t, func() bool { return len(names(b)["east"]) == len(before.GetWorkloads()) }, 10*time.Second, 10*time.Millisecond)
	old, err := c.HGet(ctx, "relaymesh:snapshot:east", "rec").Result()
	require.NoError(t, err)
	// A workload is removed from east.
	after := fleet.SnapshotSpec{Services: 3}.Snapshot("east")
	a.view.Accept("east", after, time.Now())
	for _, r := range []*replica{a, b} {
		require.Eventually(t, func() bool { return len(names(r)["east"]) == len(after.GetWorkloads()) }, 10*time.Second, 10*time.Millisecond)
	}
	want := names(b)["east"]

	// Written back, and announced as a replica would.
	require.NoError(t, c.HSet(ctx, "relaymesh:snapshot:east", "rec", old, "at", "9999999999999999", "hash", before.GetHash()).Err())
	require.NoError(t, c.Publish(ctx, "relaymesh:snapshots", "put 9999999999999999 x east").Err())
	syncAll(t, a, 1, a, b)
	for _, r := range []*replica{a, b} {
		assert.Equal(t, want, names(r)["east"], "the removed workload did not come back")
	}
	store := storeOf(t, redis)
	require.Eventually(t, func() bool {
		rec, _, err := store.Get(ctx, "east")
		return err == nil && rec.Snapshot.GetHash() == after.GetHash()
	}, 10*time.Second, 20*time.Millisecond, "the replica holding east's session wrote the newer record again")

	// Written back without an announcement: no replica reads it; one
	// started now does, until a's next comparison rewrites it.
	require.NoError(t, c.HSet(ctx, "relaymesh:snapshot:east", "rec", old).Err())
	start := time.Now()
	fresh := startReplica(t, redis, "c", regs)
	tookReplay := len(names(fresh)["east"]) == len(before.GetWorkloads())
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, names(fresh)["east"]) }, 20*time.Second, 20*time.Millisecond,
		"the replica started after the replay converges once the record is written again")
	t.Logf("a replica started after an unannounced replay: took the replayed record at start: %v; had the current one %s after it started",
		tookReplay, time.Since(start).Round(time.Millisecond))
	for _, r := range []*replica{a, b} {
		assert.Equal(t, want, names(r)["east"], "the replicas that had read the newer record never took the replay")
	}
}
