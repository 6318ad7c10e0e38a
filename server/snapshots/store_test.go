package snapshots_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var key = bytes.Repeat([]byte{7}, 32)

func startRedis(t *testing.T) *localcluster.Redis {
	t.Helper()
	localcluster.SkipIfShort(t)
	r, err := localcluster.StartRedis(t.Context(), localcluster.RedisConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

func open(t *testing.T, r *localcluster.Redis, mod func(*snapshots.Config)) (*snapshots.Store, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	cfg := snapshots.Config{Address: r.Address(), Password: r.Password(), TLS: r.TLS(), Key: key, Timeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Registerer: prometheus.NewRegistry()}
	if mod != nil {
		mod(&cfg)
	}
	s, err := snapshots.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s, logs
}

// snapshot is a valid snapshot of cluster with n workloads.
func snapshot(cluster string, n int) *relaypb.Snapshot {
	return relaytest.Spec{Cluster: cluster, Workloads: n}.Snapshot()
}

// raw is a plain client of the same server, as someone who can write to
// the store (but does not hold the replicas' key) would be.
func raw(t *testing.T, r *localcluster.Redis) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Address(), Password: r.Password(), TLSConfig: r.TLS(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestPutGetDelete(t *testing.T) {
	r := startRedis(t)
	s, logs := open(t, r, nil)
	ctx := t.Context()
	require.NoError(t, s.Ping(ctx))

	_, _, err := s.Get(ctx, "east")
	assert.ErrorIs(t, err, snapshots.ErrNotFound)

	snap := snapshot("east", 3)
	accepted := time.Unix(1_800_000_000, 5)
	before := time.Now()
	mark, err := s.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: snap, Replica: "replica-0", AcceptedAt: accepted})
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{72}$`, mark, "magic and MAC")

	got, at, err := s.Get(ctx, "east")
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9]{16,}$`, at, "the store's own time")
	assert.Equal(t, "east", got.Cluster)
	assert.Equal(t, "replica-0", got.Replica)
	assert.True(t, accepted.Equal(got.AcceptedAt))
	assert.Equal(t, snap.GetHash(), got.Snapshot.GetHash())
	assert.Len(t, got.Snapshot.GetWorkloads(), 3)
	assert.GreaterOrEqual(t, got.Sequence, uint64(before.UnixNano()), "the writer's clock in nanoseconds")

	stamp, err := s.Stamp(ctx, "east")
	require.NoError(t, err)
	assert.Equal(t, mark, stamp, "Stamp reads back the mark of the record Put wrote")

	// A later write has a later sequence and another mark, whatever the
	// time it says it was accepted.
	mark2, err := s.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: snapshot("east", 4), Replica: "replica-1", AcceptedAt: accepted.Add(-time.Hour)})
	require.NoError(t, err)
	assert.NotEqual(t, mark, mark2)
	got2, at2, err := s.Get(ctx, "east")
	require.NoError(t, err)
	assert.Greater(t, got2.Sequence, got.Sequence)
	assert.Greater(t, at2, at)

	_, err = s.Put(ctx, snapshots.Record{Cluster: "west", Snapshot: snapshot("west", 1)})
	require.NoError(t, err)
	list, err := s.Clusters(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"east": at2, "west": list["west"]}, list)

	require.NoError(t, s.Delete(ctx, "east"))
	_, _, err = s.Get(ctx, "east")
	assert.ErrorIs(t, err, snapshots.ErrNotFound)
	stamp, err = s.Stamp(ctx, "east")
	require.NoError(t, err)
	assert.Empty(t, stamp)

	assert.NotContains(t, logs.String(), r.Password())
}

func TestConfigValidate(t *testing.T) {
	err := snapshots.Config{Prefix: "a b", Key: []byte("short")}.Validate()
	require.Error(t, err)
	for _, want := range []string{"snapshots.Address", "snapshots.TLS", "snapshots.Password", "snapshots.Key: 5 bytes", "snapshots.Prefix"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NoError(t, snapshots.Config{Address: "x:1", AllowPlaintext: true, Key: key}.Validate(), "plaintext without a password is an explicit opt-in")
	_, err = snapshots.New(snapshots.Config{Address: "x:1", Password: "p", Key: key})
	assert.ErrorContains(t, err, "TLS")
}

// Bad names never reach a key.
func TestRefusesNamesThatAreNotClusters(t *testing.T) {
	r := startRedis(t)
	s, _ := open(t, r, nil)
	for _, bad := range []string{"", "East", "a:b", "x*", "-a", strings.Repeat("a", 64), "a b", "a\nb"} {
		_, err := s.Put(t.Context(), snapshots.Record{Cluster: bad, Snapshot: &relaypb.Snapshot{Cluster: bad}})
		assert.Error(t, err, "%q", bad)
		_, _, err = s.Get(t.Context(), bad)
		assert.Error(t, err, "%q", bad)
		assert.Error(t, s.Delete(t.Context(), bad), "%q", bad)
	}
	keys, err := raw(t, r).Keys(t.Context(), "*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys)
}

func TestCredentialsAndTLS(t *testing.T) {
	r := startRedis(t)
	ctx := t.Context()

	s, logs := open(t, r, func(c *snapshots.Config) { c.Password = "not-the-password-0123" })
	err := s.Ping(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refused the credentials")
	assert.NotContains(t, err.Error(), "not-the-password-0123")
	assert.NotContains(t, logs.String(), "not-the-password-0123")

	// A server certificate that does not chain to the configured roots.
	s, _ = open(t, r, func(c *snapshots.Config) { c.TLS = &tls.Config{RootCAs: x509.NewCertPool()} })
	err = s.Ping(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "certificate")

	// Plaintext against a TLS port fails; it is not silently downgraded.
	s, logs = open(t, r, func(c *snapshots.Config) { c.TLS, c.AllowPlaintext = nil, true })
	assert.Error(t, s.Ping(ctx))
	assert.Contains(t, logs.String(), "not encrypted")
}

// recorder is a Watch handler that keeps what it was told.
type recorder struct {
	mu      sync.Mutex
	records map[string]*snapshots.Record
	synced  int
	lost    int
}

func newRecorder() *recorder { return &recorder{records: map[string]*snapshots.Record{}} }

func (r *recorder) Changed(e snapshots.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Record == nil {
		delete(r.records, e.Cluster)
		return
	}
	r.records[e.Cluster] = e.Record
}
func (r *recorder) Synced() { r.mu.Lock(); r.synced++; r.mu.Unlock() }
func (r *recorder) Lost(error) {
	r.mu.Lock()
	r.lost++
	r.mu.Unlock()
}

func (r *recorder) hash(cluster string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec := r.records[cluster]; rec != nil {
		return rec.Snapshot.GetHash()
	}
	return ""
}

func (r *recorder) counts() (synced, lost, clusters int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced, r.lost, len(r.records)
}

func watch(t *testing.T, s *snapshots.Store) *recorder {
	rec := newRecorder()
	watchWith(t, s, rec)
	return rec
}

// watchWith runs s.Watch with h, which holds rec, until the test ends.
func watchWith(t *testing.T, s *snapshots.Store, h interface {
	snapshots.Handler
	counts() (int, int, int)
}) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Watch(ctx, h); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool { synced, _, _ := h.counts(); return synced > 0 }, 10*time.Second, 20*time.Millisecond)
}

func TestWatch(t *testing.T) {
	r := startRedis(t)
	writer, _ := open(t, r, nil)
	ctx := t.Context()
	before := snapshot("east", 2)
	_, err := writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: before})
	require.NoError(t, err)

	reader, _ := open(t, r, nil)
	rec := watch(t, reader)
	assert.Equal(t, before.GetHash(), rec.hash("east"), "what was stored before the watch is read at its start")

	after := snapshot("east", 5)
	_, err = writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: after})
	require.NoError(t, err)
	west := snapshot("west", 1)
	_, err = writer.Put(ctx, snapshots.Record{Cluster: "west", Snapshot: west})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.hash("east") == after.GetHash() && rec.hash("west") == west.GetHash() }, 5*time.Second, 10*time.Millisecond)

	require.NoError(t, writer.Delete(ctx, "east"))
	require.Eventually(t, func() bool { return rec.hash("east") == "" }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, west.GetHash(), rec.hash("west"))
}

// Someone who can write to the store but does not hold the replicas' key:
// a forged record, a record moved to another cluster, a truncated one, an
// oversized one and junk announcements are refused, and the last good
// record of the cluster stays.
func TestHostileStore(t *testing.T) {
	r := startRedis(t)
	writer, _ := open(t, r, nil)
	ctx := t.Context()
	good := snapshot("east", 2)
	_, err := writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: good})
	require.NoError(t, err)
	_, err = writer.Put(ctx, snapshots.Record{Cluster: "west", Snapshot: snapshot("west", 1)})
	require.NoError(t, err)

	reader, logs := open(t, r, func(c *snapshots.Config) { c.Limits.MaxChunkedBytes = 1 << 20 })
	rec := watch(t, reader)
	require.Equal(t, good.GetHash(), rec.hash("east"))

	c := raw(t, r)
	westRec, err := c.HGet(ctx, "relaymesh:snapshot:west", "rec").Result()
	require.NoError(t, err)
	eastRec, err := c.HGet(ctx, "relaymesh:snapshot:east", "rec").Result()
	require.NoError(t, err)

	// The same record signed with another key.
	forger, _ := open(t, r, func(c *snapshots.Config) { c.Key = bytes.Repeat([]byte{8}, 32) })
	evil := snapshot("east", 9)
	for i, tamper := range []func(){
		func() {
			_, err := forger.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: evil})
			require.NoError(t, err)
		},
		func() { publish(t, c, "east", westRec) }, // west's genuine record under east's key
		func() { publish(t, c, "east", eastRec[:len(eastRec)-3]) },
		func() { b := []byte(eastRec); b[len(b)-1] ^= 1; publish(t, c, "east", string(b)) },
		func() { publish(t, c, "east", "RMS1"+strings.Repeat("\x00", 2<<20)) },
		func() { publish(t, c, "east", "") },
		func() {
			for _, m := range []string{"", "put", "put 1", "put 1 East", "put 1 h East", "put 1 h east extra", "del ../x", "drop east", strings.Repeat("x", 1<<16)} {
				require.NoError(t, c.Publish(ctx, "relaymesh:snapshots", m).Err())
			}
		},
	} {
		tamper()
		// A good write of west after each: once the reader has it, it has
		// handled the tampering before it.
		w := snapshot("west", i+2)
		_, err := writer.Put(ctx, snapshots.Record{Cluster: "west", Snapshot: w})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return rec.hash("west") == w.GetHash() }, 5*time.Second, 10*time.Millisecond, "step %d", i)
		assert.Equal(t, good.GetHash(), rec.hash("east"), "step %d: the last good record of east stays", i)
	}
	out := logs.String()
	assert.Contains(t, out, "MAC does not verify")
	assert.Contains(t, out, "more than the")
	assert.Contains(t, out, "malformed announcement")
	assert.NotContains(t, out, string(key))
	assert.Equal(t, float64(5), testutil.ToFloat64(refusedCounter(t, reader)), "five records refused: forged, moved, truncated, flipped, oversized")
}

// publish writes rec under cluster's key and announces it, as the store's
// own script does.
func publish(t *testing.T, c *redis.Client, cluster, rec string) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, c.HSet(ctx, "relaymesh:snapshot:"+cluster, "rec", rec, "at", time.Now().Format("20060102150405.000000000")).Err())
	require.NoError(t, c.Publish(ctx, "relaymesh:snapshots", "put "+time.Now().Format("150405.000000000")+" forged-hash "+cluster).Err())
}

func refusedCounter(t *testing.T, s *snapshots.Store) prometheus.Collector {
	t.Helper()
	return snapshots.RequestsCounter(s).WithLabelValues("get", "refused")
}

// A restarted (emptied) store, and one that stops answering without closing
// the connection: the watch reports the loss, keeps what it had, and
// resyncs when the store is back; writes work again without a new client.
func TestWatchSurvivesRestartAndHang(t *testing.T) {
	r := startRedis(t)
	writer, _ := open(t, r, nil)
	reader, _ := open(t, r, nil)
	ctx := t.Context()
	east := snapshot("east", 2)
	_, err := writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: east})
	require.NoError(t, err)
	rec := watch(t, reader)
	require.Equal(t, east.GetHash(), rec.hash("east"))

	require.NoError(t, r.Restart(ctx))
	require.Eventually(t, func() bool { synced, lost, _ := rec.counts(); return lost >= 1 && synced >= 2 }, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, east.GetHash(), rec.hash("east"), "an emptied store does not erase what the replica read")
	west := snapshot("west", 3)
	require.Eventually(t, func() bool {
		_, err := writer.Put(ctx, snapshots.Record{Cluster: "west", Snapshot: west})
		return err == nil
	}, 10*time.Second, 100*time.Millisecond, "the writer's client reconnects by itself")
	require.Eventually(t, func() bool { return rec.hash("west") == west.GetHash() }, 5*time.Second, 10*time.Millisecond)

	// Hung: the process is stopped, the connection stays open.
	_, lostBefore, _ := rec.counts()
	require.NoError(t, syscall.Kill(r.Pid(), syscall.SIGSTOP))
	require.Eventually(t, func() bool { _, lost, _ := rec.counts(); return lost > lostBefore }, 20*time.Second, 50*time.Millisecond, "a hung store is noticed")
	start := time.Now()
	_, err = writer.Put(ctx, snapshots.Record{Cluster: "west", Snapshot: snapshot("west", 4)})
	assert.Error(t, err, "a write to a hung store fails within its timeout")
	assert.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, syscall.Kill(r.Pid(), syscall.SIGCONT))
	synced, _, _ := rec.counts()
	require.Eventually(t, func() bool { s, _, _ := rec.counts(); return s > synced }, 20*time.Second, 50*time.Millisecond, "and resynced when it answers again")
	// The timed-out write was sent before the store hung, so it may have
	// landed once it resumed: the reader has whatever the store holds.
	stored, _, err := writer.Get(ctx, "west")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.hash("west") == stored.Snapshot.GetHash() }, 5*time.Second, 10*time.Millisecond)
}

// A record rewritten with the content a replica holds (what every replica
// does after Redis restarted empty) is not read again: its hash is stored
// and announced beside it.
func TestRewriteOfHeldContentIsNotReadAgain(t *testing.T) {
	r := startRedis(t)
	writer, _ := open(t, r, nil)
	ctx := t.Context()
	east := snapshot("east", 3)
	_, err := writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: east})
	require.NoError(t, err)
	reader, _ := open(t, r, nil)
	rec := watch(t, reader)
	require.Equal(t, east.GetHash(), rec.hash("east"))
	gets := func() float64 {
		return testutil.ToFloat64(snapshots.RequestsCounter(reader).WithLabelValues("get", "ok"))
	}
	before := gets()

	_, err = writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: east})
	require.NoError(t, err)
	west := snapshot("west", 1)
	_, err = writer.Put(ctx, snapshots.Record{Cluster: "west", Snapshot: west})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.hash("west") == west.GetHash() }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, before+1, gets(), "west was read; east, rewritten with the same content, was not")

	// After a restart (emptied) and a rewrite of both, the resync reads
	// neither again.
	require.NoError(t, r.Restart(ctx))
	require.Eventually(t, func() bool {
		_, err1 := writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: east})
		_, err2 := writer.Put(ctx, snapshots.Record{Cluster: "west", Snapshot: west})
		return err1 == nil && err2 == nil
	}, 10*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool { s, _, _ := rec.counts(); return s >= 2 }, 20*time.Second, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, before+1, gets(), "nothing read again")
	assert.Equal(t, east.GetHash(), rec.hash("east"))
}
