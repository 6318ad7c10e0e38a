package snapshots_test

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refusals is a recorder that is also told of refused records.
type refusals struct {
	*recorder
	mu  sync.Mutex
	got map[string][]error
}

func (r *refusals) Refused(cluster string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got[cluster] = append(r.got[cluster], err)
}

func (r *refusals) of(cluster string) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.got[cluster]...)
}

func watchRefusals(t *testing.T, s *snapshots.Store) *refusals {
	rec := &refusals{recorder: newRecorder(), got: map[string][]error{}}
	watchWith(t, s, rec)
	return rec
}

// mark makes the reader handle everything published before: a good write
// of west, which it delivers after what came before it.
func mark(t *testing.T, writer *snapshots.Store, rec *recorder, n int) {
	t.Helper()
	w := snapshot("west", n)
	_, err := writer.Put(t.Context(), snapshots.Record{Cluster: "west", Snapshot: w})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.hash("west") == w.GetHash() }, 5*time.Second, 10*time.Millisecond)
}

// A delete announced while the record is still stored is forged (anyone
// who can write to the store can publish): the reader delivers nothing.
// Once the record is really gone, the delete is delivered; what the
// handler does with it is its registry's business (see SharedSnapshots).
func TestAForgedDeleteAnnouncementIsNotDelivered(t *testing.T) {
	r := startRedis(t)
	writer, _ := open(t, r, nil)
	ctx := t.Context()
	east := snapshot("east", 2)
	_, err := writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: east})
	require.NoError(t, err)
	reader, logs := open(t, r, nil)
	rec := watch(t, reader)
	require.Equal(t, east.GetHash(), rec.hash("east"))

	c := raw(t, r)
	require.NoError(t, c.Publish(ctx, "relaymesh:snapshots", "del east").Err())
	mark(t, writer, rec, 1)
	assert.Equal(t, east.GetHash(), rec.hash("east"), "a forged delete announcement changes nothing")
	assert.Contains(t, logs.String(), "a forged announcement")

	require.NoError(t, c.Del(ctx, "relaymesh:snapshot:east").Err())
	require.NoError(t, c.Publish(ctx, "relaymesh:snapshots", "del east").Err())
	require.Eventually(t, func() bool { return rec.hash("east") == "" }, 5*time.Second, 10*time.Millisecond, "a delete of an absent record is delivered")
}

// An older, genuine record of a cluster written back to the store (by
// someone with write access to it, not the key) is refused by a replica
// that has seen a newer one, announced or not; the handler is told, so
// the replica holding the session can write the record again. A replica
// that has seen nothing (one that restarted) takes it: the residual the
// design note describes.
func TestAReplayedRecordIsRefused(t *testing.T) {
	r := startRedis(t)
	writer, _ := open(t, r, nil)
	ctx := t.Context()
	c := raw(t, r)
	old := snapshot("east", 3)
	_, err := writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: old})
	require.NoError(t, err)
	oldRec, err := c.HGet(ctx, "relaymesh:snapshot:east", "rec").Result()
	require.NoError(t, err)
	reader, logs := open(t, r, nil)
	rec := watchRefusals(t, reader)
	require.Equal(t, old.GetHash(), rec.hash("east"))
	current := snapshot("east", 2)
	_, err = writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: current})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.hash("east") == current.GetHash() }, 5*time.Second, 10*time.Millisecond)

	// Written back and announced.
	publish(t, c, "east", oldRec)
	mark(t, writer, rec.recorder, 1)
	assert.Equal(t, current.GetHash(), rec.hash("east"), "the replayed record is refused")
	require.Len(t, rec.of("east"), 1)
	assert.ErrorIs(t, rec.of("east")[0], snapshots.ErrReplayed)
	assert.ErrorIs(t, rec.of("east")[0], snapshots.ErrRecord)
	assert.Contains(t, logs.String(), "a replay")
	assert.Equal(t, float64(1), testutil.ToFloat64(snapshots.RequestsCounter(reader).WithLabelValues("get", "replayed")))

	// A replica that has seen nothing takes it.
	fresh, _ := open(t, r, nil)
	got, _, err := fresh.Get(ctx, "east")
	require.NoError(t, err)
	assert.Equal(t, old.GetHash(), got.Snapshot.GetHash(), "the residual: a replica that restarted takes the newest record it finds")

	// The writer writes again: newer than both, taken by every replica.
	_, err = writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: current})
	require.NoError(t, err)
	got, _, err = fresh.Get(ctx, "east")
	require.NoError(t, err)
	assert.Equal(t, current.GetHash(), got.Snapshot.GetHash())
	assert.Equal(t, current.GetHash(), rec.hash("east"))
}

// A record written by a replica of the previous release (no sequence) is
// read as the oldest of its cluster: taken while nothing newer was seen
// (a rolling upgrade), refused once a record with a sequence was.
func TestRecordsOfThePreviousFormatAreTheOldest(t *testing.T) {
	r := startRedis(t)
	ctx := t.Context()
	c := raw(t, r)
	v1Snap := snapshot("east", 3)
	v1, err := snapshots.SealV1(key, snapshots.Record{Cluster: "east", Snapshot: v1Snap, Replica: "old-release"})
	require.NoError(t, err)
	require.NoError(t, c.HSet(ctx, "relaymesh:snapshot:east", "rec", string(v1), "at", "1").Err())
	reader, _ := open(t, r, nil)
	got, _, err := reader.Get(ctx, "east")
	require.NoError(t, err)
	assert.Equal(t, v1Snap.GetHash(), got.Snapshot.GetHash())
	assert.Zero(t, got.Sequence)

	writer, _ := open(t, r, nil)
	current := snapshot("east", 2)
	_, err = writer.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: current})
	require.NoError(t, err)
	got, _, err = reader.Get(ctx, "east")
	require.NoError(t, err)
	assert.Equal(t, current.GetHash(), got.Snapshot.GetHash())
	require.NoError(t, c.HSet(ctx, "relaymesh:snapshot:east", "rec", string(v1)).Err())
	_, _, err = reader.Get(ctx, "east")
	assert.ErrorIs(t, err, snapshots.ErrReplayed)
}

// A record is newer than every record its writer read, whatever the
// clocks: a replica whose clock is an hour ahead wrote, another read it
// and wrote: the second record's sequence is greater. A replica that had
// not read it (and so cannot know) writes an older sequence, which the
// replicas that saw the first refuse; the replica holding the session
// writes again once it has read the newer one (SharedSnapshots).
func TestSequencesOutrunWhatTheWriterRead(t *testing.T) {
	r := startRedis(t)
	ctx := t.Context()
	ahead, _ := open(t, r, func(c *snapshots.Config) { c.Now = func() time.Time { return time.Now().Add(time.Hour) } })
	_, err := ahead.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: snapshot("east", 1)})
	require.NoError(t, err)
	reader, _ := open(t, r, nil)
	first, _, err := reader.Get(ctx, "east")
	require.NoError(t, err)

	uninformed, _ := open(t, r, nil)
	_, err = uninformed.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: snapshot("east", 2)})
	require.NoError(t, err)
	_, _, err = reader.Get(ctx, "east")
	assert.ErrorIs(t, err, snapshots.ErrReplayed, "written by a replica that had not read the newer one")

	_, err = ahead.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: snapshot("east", 1)})
	require.NoError(t, err)
	informed, _ := open(t, r, nil)
	_, _, err = informed.Get(ctx, "east")
	require.NoError(t, err)
	_, err = informed.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: snapshot("east", 3)})
	require.NoError(t, err)
	third, _, err := reader.Get(ctx, "east")
	require.NoError(t, err, "written after reading the newest: taken")
	assert.Greater(t, third.Sequence, first.Sequence)
	assert.Len(t, third.Snapshot.GetWorkloads(), 3)
}
