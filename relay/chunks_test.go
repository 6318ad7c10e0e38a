package relay

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// testAssembler assembles for cluster-1 with parts of 64 to 256 bytes.
func testAssembler(budget *SnapshotBudget, clock *fakeClock) *Assembler {
	return NewAssembler(AssemblerConfig{Cluster: "cluster-1", Budget: budget, Deadline: 10 * time.Second, Now: clock.now,
		Limits: SnapshotLimits{MaxChunkedBytes: 64 << 10}, MaxPart: 256, MinPart: 64})
}

func newTestBudget(limit int64) *SnapshotBudget {
	return NewSnapshotBudget(limit, prometheus.NewGauge(prometheus.GaugeOpts{Name: "test"}))
}

func TestAssemblerAssemblesInOrder(t *testing.T) {
	s := relaytest.Snapshot(20)
	data, hash := relaytest.Encode(t, s)
	require.Equal(t, s.GetHash(), hash, "the agent's hash is snapshothash.Of")
	budget := newTestBudget(1 << 20)
	a := testAssembler(budget, &fakeClock{t: time.Unix(1000, 0)})
	msgs := relaytest.Chunked("cluster-1", hash, data, 256)
	require.Greater(t, len(msgs), 4, "several parts")
	for i, m := range msgs {
		out, err := a.Add(m)
		require.NoError(t, err)
		if i < len(msgs)-1 {
			require.Nil(t, out)
			continue
		}
		require.NotNil(t, out)
		require.NoError(t, out.Err)
		assert.True(t, proto.Equal(s, out.Snapshot), "the Assembled snapshot is the one sent")
		assert.Equal(t, len(data), out.Size)
		assert.NoError(t, validateSnapshot("cluster-1", out.Snapshot, SnapshotLimits{}.WithDefaults(), snapshothash.Of), "and passes ValidateSnapshot's checks, its hash included")
	}
	assert.Positive(t, budget.InUse(), "reserved until released")
	a.Release()
	assert.Zero(t, budget.InUse())

	// The stream goes on: a second snapshot after the first.
	s2 := relaytest.Snapshot(3)
	data2, hash2 := relaytest.Encode(t, s2)
	var out *Assembled
	for _, m := range relaytest.Chunked("cluster-1", hash2, data2, 256) {
		var err error
		out, err = a.Add(m)
		require.NoError(t, err)
	}
	require.NotNil(t, out)
	assert.True(t, proto.Equal(s2, out.Snapshot))
	a.Close()
	assert.Zero(t, budget.InUse())
}

// Endpoints with equal labels share one map as the parts are decoded,
// across parts and Destinations; the snapshot is the one sent.
func TestAssemblerSharesEqualLabels(t *testing.T) {
	s := relaytest.Rich{Namespaces: 2}.Snapshot("cluster-1")
	data, hash := relaytest.Encode(t, s)
	a := NewAssembler(AssemblerConfig{Cluster: "cluster-1", Budget: newTestBudget(64 << 20), Deadline: 10 * time.Second, Now: time.Now,
		MaxPart: 4096, MinPart: 1024})
	var out *Assembled
	msgs := relaytest.Chunked("cluster-1", hash, data, 4096)
	require.Greater(t, len(msgs), 10, "many parts")
	for _, m := range msgs {
		var err error
		out, err = a.Add(m)
		require.NoError(t, err)
	}
	require.NotNil(t, out)
	require.NoError(t, out.Err)
	assert.True(t, proto.Equal(s, out.Snapshot), "the Assembled snapshot is the one sent")
	distinct, endpoints := map[uintptr]bool{}, 0
	for _, d := range out.Snapshot.GetDestinations() {
		for _, e := range d.GetEndpoints() {
			distinct[reflect.ValueOf(e.GetLabels()).Pointer()] = true
			endpoints++
		}
	}
	assert.Equal(t, 800, endpoints, "400 pods behind two Services each")
	assert.Len(t, distinct, 2*10*2, "one map per namespace, app and version")
	a.Close()
}

// Every broken framing refuses the stream with its code, and the
// Assembler keeps nothing.
func TestAssemblerRefusesBrokenFraming(t *testing.T) {
	data, hash := relaytest.Encode(t, relaytest.Snapshot(20))
	require.Greater(t, len(data), 4*256)
	good := relaytest.Chunked("cluster-1", hash, data, 256)
	hdr, p0, p1, p2, last := good[0], good[1], good[2], good[3], good[len(good)-1]
	n := len(good) - 2
	big, bigHash := relaytest.Encode(t, relaytest.Snapshot(2000))
	tests := []struct {
		name   string
		msgs   []*relaypb.SnapshotChunk
		code   codes.Code
		reason string
		want   string
	}{
		{"parts out of order", []*relaypb.SnapshotChunk{hdr, p0, p2}, codes.InvalidArgument, "framing", "part 2, but part 1 comes next"},
		{"a part twice", []*relaypb.SnapshotChunk{hdr, p0, p0}, codes.InvalidArgument, "framing", "part 0, but part 1 comes next"},
		{"a part too large", []*relaypb.SnapshotChunk{hdr, relaytest.Part(0, data[:257])}, codes.InvalidArgument, "too_large", "part 0 of 257 bytes, at most 256"},
		{"a small part before the last", []*relaypb.SnapshotChunk{hdr, relaytest.Part(0, data[:10])}, codes.InvalidArgument, "framing", "all parts but the last carry at least 64"},
		{"an empty part", []*relaypb.SnapshotChunk{hdr, relaytest.Part(0, nil)}, codes.InvalidArgument, "framing", "part 0 of 0 bytes"},
		{"more bytes than announced", []*relaypb.SnapshotChunk{relaytest.Header("cluster-1", hash, 300, 2), p0, relaytest.Part(1, data[256:512])}, codes.InvalidArgument, "too_large", "more than the 300 bytes the header announced"},
		{"more parts than announced", append(append([]*relaypb.SnapshotChunk{hdr}, good[1:n+1]...), relaytest.Part(n, data[:256])), codes.InvalidArgument, "framing", fmt.Sprintf("part %d, but the header announced %d", n, n)},
		{"total over the limit", []*relaypb.SnapshotChunk{relaytest.Header("cluster-1", bigHash, len(big), (len(big)+255)/256)}, codes.InvalidArgument, "too_large", fmt.Sprintf("snapshot of %d bytes; at least 1, at most 65536", len(big))},
		{"an empty snapshot", []*relaypb.SnapshotChunk{relaytest.Header("cluster-1", hash, 0, 0)}, codes.InvalidArgument, "too_large", "snapshot of 0 bytes"},
		{"too few parts for the size", []*relaypb.SnapshotChunk{relaytest.Header("cluster-1", hash, len(data), 1)}, codes.InvalidArgument, "framing", "1 parts for"},
		{"too many parts for the size", []*relaypb.SnapshotChunk{relaytest.Header("cluster-1", hash, 1000, 100)}, codes.InvalidArgument, "framing", "100 parts for 1000 bytes"},
		{"a header for another cluster", []*relaypb.SnapshotChunk{relaytest.Header("cluster-2", hash, len(data), n)}, codes.InvalidArgument, "framing", `header for cluster "cluster-2", but the agent's certificate names "cluster-1"`},
		{"a header with a bad hash", []*relaypb.SnapshotChunk{relaytest.Header("cluster-1", "not-a-hash", len(data), n)}, codes.InvalidArgument, "framing", "is not 64 lower-case hex digits"},
		{"an upper-case hash", []*relaypb.SnapshotChunk{relaytest.Header("cluster-1", "A"+hash[1:], len(data), n)}, codes.InvalidArgument, "framing", "is not 64 lower-case hex digits"},
		{"a second header mid-snapshot", []*relaypb.SnapshotChunk{hdr, p0, hdr}, codes.InvalidArgument, "framing", "a second header before the end of snapshot " + hash},
		{"a part without a header", []*relaypb.SnapshotChunk{p0}, codes.InvalidArgument, "framing", "part 0 without a header"},
		{"an end without a header", []*relaypb.SnapshotChunk{last}, codes.InvalidArgument, "framing", "an end without a header"},
		{"an end before the last part", []*relaypb.SnapshotChunk{hdr, p0, p1, last}, codes.InvalidArgument, "framing", fmt.Sprintf("end after 2 of %d parts", n)},
		{"an end of another snapshot", []*relaypb.SnapshotChunk{hdr, relaytest.End(bigHash)}, codes.InvalidArgument, "framing", "but snapshot " + hash + " is in transit"},
		{"an empty message", []*relaypb.SnapshotChunk{hdr, {}}, codes.InvalidArgument, "framing", "neither a header, a part nor an end"},
		{"a nil message", []*relaypb.SnapshotChunk{nil}, codes.InvalidArgument, "framing", "neither a header, a part nor an end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			budget := newTestBudget(1 << 20)
			a := testAssembler(budget, &fakeClock{t: time.Unix(1000, 0)})
			var err error
			for i, m := range tc.msgs {
				var out *Assembled
				out, err = a.Add(m)
				if i < len(tc.msgs)-1 {
					require.NoError(t, err, "message %d", i)
					require.Nil(t, out)
				}
			}
			var ce *ChunkError
			require.ErrorAs(t, err, &ce)
			assert.ErrorIs(t, err, ErrSnapshotRefused)
			assert.Equal(t, tc.code, ce.Code)
			assert.Equal(t, tc.reason, ce.Reason)
			assert.Contains(t, err.Error(), tc.want)
			assert.Zero(t, budget.InUse(), "nothing stays reserved")
			_, inTransit := a.Deadline()
			assert.False(t, inTransit, "nothing stays in transit")
		})
	}
}

func TestAssemblerDeadline(t *testing.T) {
	data, hash := relaytest.Encode(t, relaytest.Snapshot(20))
	msgs := relaytest.Chunked("cluster-1", hash, data, 256)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	budget := newTestBudget(1 << 20)
	a := testAssembler(budget, clock)
	_, err := a.Add(msgs[0])
	require.NoError(t, err)
	dl, ok := a.Deadline()
	require.True(t, ok)
	assert.Equal(t, clock.t.Add(10*time.Second), dl)

	// A part that comes too late refuses the snapshot.
	clock.t = clock.t.Add(11 * time.Second)
	_, err = a.Add(msgs[1])
	var ce *ChunkError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.DeadlineExceeded, ce.Code)
	assert.Contains(t, err.Error(), "not complete within 10s (0 of")
	assert.Zero(t, budget.InUse())

	// No part at all: the stream's timer calls expire.
	_, err = a.Add(msgs[0])
	require.NoError(t, err)
	err = a.Expire()
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.DeadlineExceeded, ce.Code)
	assert.Zero(t, budget.InUse())
}

func TestAssemblerBudget(t *testing.T) {
	data, hash := relaytest.Encode(t, relaytest.Snapshot(20))
	msgs := relaytest.Chunked("cluster-1", hash, data, 256)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	size := int64(len(data))
	var ce *ChunkError

	// No room for a part: refused when it comes, not at the header.
	budget := newTestBudget(256)
	a := testAssembler(budget, clock)
	_, err := a.Add(msgs[0])
	require.NoError(t, err, "a header reserves nothing")
	assert.Zero(t, budget.InUse())
	for _, m := range msgs[1:] {
		if _, err = a.Add(m); err != nil {
			break
		}
	}
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.ResourceExhausted, ce.Code)
	assert.Equal(t, "memory", ce.Reason)
	assert.Contains(t, err.Error(), "the server's memory for snapshots in transit is in use")
	assert.Zero(t, budget.InUse())

	// Room for the parts, not for decoding them while other clusters'
	// snapshots are being checked (which are never preempted): refused.
	budget = newTestBudget(40 * size)
	other := holding(t, budget, "cluster-2", 20*size)
	third := holding(t, budget, "cluster-3", 19*size)
	budget.complete(other)
	budget.complete(third)
	a = testAssembler(budget, clock)
	for _, m := range msgs {
		if _, err = a.Add(m); err != nil {
			break
		}
	}
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.ResourceExhausted, ce.Code)
	assert.Equal(t, 39*size, budget.InUse(), "only the other clusters' reservations are left")
	budget.release(other)
	budget.release(third)

	// One snapshot of a cluster at a time, whatever the stream.
	budget = newTestBudget(40 * size)
	a, b := testAssembler(budget, clock), testAssembler(budget, clock)
	_, err = a.Add(msgs[0])
	require.NoError(t, err)
	_, err = b.Add(msgs[0])
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.ResourceExhausted, ce.Code)
	assert.Equal(t, "cluster_busy", ce.Reason)
	a.Close()
	_, err = b.Add(msgs[0])
	require.NoError(t, err, "free again once the first stream is gone")
	b.Close()
	assert.Zero(t, budget.InUse())

	// A snapshot that could never be decoded within the whole budget is
	// refused with an ack, not retried for ever; decoding stops there.
	budget = newTestBudget(2*size + 100)
	a = testAssembler(budget, clock)
	var out *Assembled
	for _, m := range msgs {
		out, err = a.Add(m)
		require.NoError(t, err)
		assert.LessOrEqual(t, budget.InUse(), 2*size+100)
	}
	require.NotNil(t, out)
	require.ErrorIs(t, out.Err, ErrSnapshotRefused)
	assert.Contains(t, out.Err.Error(), "decoding would take more than the server's memory for snapshots in transit")
	assert.Zero(t, budget.InUse())
}

// holding opens cluster's reservation in budget with n bytes.
func holding(t *testing.T, budget *SnapshotBudget, cluster string, n int64) *reservation {
	t.Helper()
	r, err := budget.open(cluster)
	require.Nil(t, err)
	if n > 0 {
		require.Nil(t, budget.grow(r, n))
	}
	return r
}

// A cluster within its share gets room from the snapshots in transit
// furthest over theirs, however many hold the budget; one over its share
// gets only free room; a snapshot being checked keeps its memory.
func TestSnapshotBudgetShares(t *testing.T) {
	const limit = 1000
	budget := newTestBudget(limit)
	// Four hostile clusters hold everything, one of them twice the others.
	h1 := holding(t, budget, "h1", 400)
	h2 := holding(t, budget, "h2", 200)
	h3 := holding(t, budget, "h3", 200)
	h4 := holding(t, budget, "h4", 200)
	require.EqualValues(t, limit, budget.InUse())

	// A fifth cluster's share is 200: asking for 10 preempts h1, the one
	// furthest over it; the others keep theirs.
	legit := holding(t, budget, "legit", 0)
	require.Nil(t, budget.grow(legit, 10))
	assert.EqualValues(t, 610, budget.InUse())
	assert.True(t, isClosed(h1.preempted), "h1 was preempted")
	for _, h := range []*reservation{h2, h3, h4} {
		assert.False(t, isClosed(h.preempted))
	}
	// h1's stream learns of it: whatever it asks for next is refused, and
	// its release changes nothing.
	err := budget.grow(h1, 1)
	require.NotNil(t, err)
	assert.Equal(t, "preempted", err.Reason)
	assert.Equal(t, codes.ResourceExhausted, err.Code)
	assert.Contains(t, err.Error(), "went to clusters within their share")
	budget.release(h1)
	assert.EqualValues(t, 610, budget.InUse())
	// h1 may open a new reservation (its old stream is going).
	h1 = holding(t, budget, "h1", 0)

	// Over its share (1000/5 = 200), a cluster gets only free room: 390
	// are free, h1 asks for 395.
	err = budget.grow(h1, 395)
	require.NotNil(t, err)
	assert.Equal(t, "memory", err.Reason)
	require.Nil(t, budget.grow(h1, 390))
	// Now full; legit may grow to its share of 200, taking from h1 (390):
	// the furthest over.
	require.Nil(t, budget.grow(legit, 190))
	assert.True(t, isClosed(h1.preempted))
	assert.EqualValues(t, 200, budget.held(legit))
	// Beyond its share, legit gets no more than what is free.
	free := limit - budget.InUse()
	assert.NotNil(t, budget.grow(legit, free+1))
	require.Nil(t, budget.grow(legit, free))

	// A complete snapshot (being checked) is never preempted: with nothing
	// else over the share, a newcomer is refused.
	budget = newTestBudget(limit)
	big := holding(t, budget, "big", limit)
	budget.complete(big)
	newcomer := holding(t, budget, "newcomer", 0)
	err = budget.grow(newcomer, 1)
	require.NotNil(t, err)
	assert.Equal(t, "memory", err.Reason)
	assert.False(t, isClosed(big.preempted))
	budget.release(big)
	require.Nil(t, budget.grow(newcomer, limit))
	budget.release(newcomer)
	assert.Zero(t, budget.InUse())
}

// Many hostile clusters, each holding what it can: every legitimate small
// snapshot still gets room, and the budget is never exceeded.
func TestSnapshotBudgetManyHostileClusters(t *testing.T) {
	const limit = 1 << 20
	budget := newTestBudget(limit)
	var hostile []*reservation
	for i := range 64 {
		r := holding(t, budget, fmt.Sprintf("hostile-%d", i), 0)
		// Each asks for as much as it can get, in steps.
		for budget.grow(r, 4<<10) == nil {
		}
		hostile = append(hostile, r)
		require.LessOrEqual(t, budget.InUse(), int64(limit))
	}
	for i := range 32 {
		legit := holding(t, budget, fmt.Sprintf("legit-%d", i), 0)
		require.Nil(t, budget.grow(legit, 4<<10), "legit-%d gets room", i)
		require.LessOrEqual(t, budget.InUse(), int64(limit))
		budget.release(legit)
	}
	for _, r := range hostile {
		budget.release(r)
	}
	assert.Zero(t, budget.InUse())
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A header alone holds nothing, and is dropped once Idle passes without a
// part; a stream that stops sending parts is dropped Idle after the last
// one; one that drips parts under the minimum rate is dropped once its
// first Idle has passed.
func TestAssemblerDropsIdleAndSlowStreams(t *testing.T) {
	data, hash := relaytest.Encode(t, relaytest.Snapshot(200))
	msgs := relaytest.Chunked("cluster-1", hash, data, 256)
	require.Greater(t, len(msgs), 40)
	newAsm := func(clock *fakeClock, budget *SnapshotBudget) *Assembler {
		return NewAssembler(AssemblerConfig{Cluster: "cluster-1", Budget: budget, Deadline: time.Minute, Idle: 5 * time.Second, MinRate: 1 << 10,
			Now: clock.now, Limits: SnapshotLimits{MaxChunkedBytes: 64 << 10}, MaxPart: 256, MinPart: 64})
	}
	var ce *ChunkError

	// A header only.
	clock := &fakeClock{t: time.Unix(1000, 0)}
	budget := newTestBudget(1 << 20)
	a := newAsm(clock, budget)
	_, err := a.Add(msgs[0])
	require.NoError(t, err)
	assert.Zero(t, budget.InUse(), "a header holds nothing")
	due, ok := a.Deadline()
	require.True(t, ok)
	assert.Equal(t, clock.t.Add(5*time.Second), due, "due Idle after the header, not at the 1-minute deadline")
	clock.t = due.Add(time.Millisecond)
	_, err = a.Add(msgs[1])
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.DeadlineExceeded, ce.Code)
	assert.Equal(t, "idle", ce.Reason)
	assert.Contains(t, err.Error(), "no part for 5s (0 of")
	assert.Zero(t, budget.InUse())
	// Or the stream's timer fires.
	_, err = a.Add(msgs[0])
	require.NoError(t, err)
	err = a.Expire()
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "idle", ce.Reason)

	// What the whole snapshot holds once assembled.
	a = newAsm(clock, budget)
	var out *Assembled
	for _, m := range msgs {
		out, err = a.Add(m)
		require.NoError(t, err)
	}
	require.NotNil(t, out)
	require.NoError(t, out.Err)
	whole := budget.InUse()
	a.Close()

	// Parts that stop (after 10 KiB, 10 s at the minimum rate): due Idle
	// after the last one, holding only what came.
	a = newAsm(clock, budget)
	for _, m := range msgs[:41] {
		_, err = a.Add(m)
		require.NoError(t, err)
		clock.t = clock.t.Add(10 * time.Millisecond)
	}
	assert.Positive(t, budget.InUse())
	assert.Less(t, budget.InUse(), whole*2/3, "what came of %d parts, not what the header announced", len(msgs)-2)
	due, _ = a.Deadline()
	assert.Equal(t, clock.t.Add(-10*time.Millisecond).Add(5*time.Second), due)
	clock.t = due.Add(time.Millisecond)
	err = a.Expire()
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "idle", ce.Reason)
	assert.Zero(t, budget.InUse())

	// A drip: a part of 256 bytes every 4 s (64 B/s), under Idle each
	// time, under the minimum rate of 1 KiB/s: refused once the first 5 s
	// have passed.
	a = newAsm(clock, budget)
	start := clock.t
	_, err = a.Add(msgs[0])
	require.NoError(t, err)
	for _, m := range msgs[1:] {
		clock.t = clock.t.Add(4 * time.Second)
		if _, err = a.Add(m); err != nil {
			break
		}
	}
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.DeadlineExceeded, ce.Code)
	assert.Equal(t, "slow", ce.Reason)
	assert.Contains(t, err.Error(), "under the minimum rate of 1 KiB/s")
	assert.Equal(t, start.Add(8*time.Second), clock.t, "refused at the first part after the grace")
	assert.Zero(t, budget.InUse())

	// The same parts at the rate: accepted.
	a = newAsm(clock, budget)
	for _, m := range msgs {
		out, err = a.Add(m)
		require.NoError(t, err)
		clock.t = clock.t.Add(100 * time.Millisecond) // 2.5 KiB/s
	}
	require.NotNil(t, out)
	require.NoError(t, out.Err)
	a.Close()
	assert.Zero(t, budget.InUse())
}

// A snapshot in transit whose memory the budget took back is refused at
// its next message, or by the stream's Expire on Preempted.
func TestAssemblerPreempted(t *testing.T) {
	data, hash := relaytest.Encode(t, relaytest.Snapshot(20))
	msgs := relaytest.Chunked("cluster-1", hash, data, 256)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	// What three messages hold, measured on a budget of their own.
	dry := newTestBudget(1 << 20)
	a := testAssembler(dry, clock)
	for _, m := range msgs[:3] {
		_, err := a.Add(m)
		require.NoError(t, err)
	}
	held := dry.InUse()
	require.Positive(t, held)
	a.Close()

	// A budget in which they are over their share of two.
	budget := newTestBudget(held + held/2)
	a = testAssembler(budget, clock)
	assert.Nil(t, a.Preempted(), "nothing in transit")
	for _, m := range msgs[:3] {
		_, err := a.Add(m)
		require.NoError(t, err)
	}
	require.Equal(t, held, budget.InUse())
	// Another cluster takes what is free, then asks for more within its
	// share.
	other := holding(t, budget, "cluster-2", held/2)
	select {
	case <-a.Preempted():
		t.Fatal("preempted while there was room")
	default:
	}
	require.Nil(t, budget.grow(other, 10))
	<-a.Preempted()
	assert.Equal(t, held/2+10, budget.InUse(), "cluster-1's memory went back at once")
	err := a.Expire()
	var ce *ChunkError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, codes.ResourceExhausted, ce.Code)
	assert.Equal(t, "preempted", ce.Reason)
	_, inTransit := a.Deadline()
	assert.False(t, inTransit)
	budget.release(other)
	assert.Zero(t, budget.InUse())

	// Preempted between two messages: the next one is refused.
	a = testAssembler(budget, clock)
	for _, m := range msgs[:3] {
		_, err := a.Add(m)
		require.NoError(t, err)
	}
	other = holding(t, budget, "cluster-2", held/2+10)
	_, err = a.Add(msgs[3])
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "preempted", ce.Reason)
	budget.release(other)
	assert.Zero(t, budget.InUse())
}

// What the Assembler reserves bounds what assembling allocates: parts,
// pending bytes and the decoded snapshot.
func TestAssemblerReservationBoundsAllocation(t *testing.T) {
	for name, s := range map[string]*relaypb.Snapshot{
		"realistic":       relaytest.Snapshot(5000),
		"empty endpoints": {Cluster: "cluster-1", Destinations: []*relaypb.Destination{{Endpoints: repeat(20000, func() *relaypb.Endpoint { return &relaypb.Endpoint{} })}}},
		"many workloads":  {Cluster: "cluster-1", Workloads: repeat(20000, func() *relaypb.Workload { return &relaypb.Workload{PodLabels: map[string]string{"": ""}} })},
	} {
		data, hash := relaytest.Encode(t, s)
		msgs := relaytest.Chunked("cluster-1", hash, data, 256)
		var reserved int64
		allocated := allocatedBy(func() {
			budget := newTestBudget(1 << 30)
			a := testAssembler(budget, &fakeClock{t: time.Unix(1000, 0)})
			a.cfg.Limits.MaxChunkedBytes = 64 << 20
			var out *Assembled
			for _, m := range msgs {
				var err error
				out, err = a.Add(m)
				require.NoError(t, err)
			}
			require.NotNil(t, out.Snapshot, "%v", out.Err)
			reserved = budget.InUse()
			a.Release()
		})
		t.Logf("%-16s %8d bytes: assembly allocates %9d, reserved %9d (%.2fx)", name, len(data), allocated, reserved, float64(reserved)/float64(allocated))
		assert.GreaterOrEqual(t, reserved, int64(allocated), name)
	}
}

// A snapshot whose framing is right but whose content is not is answered
// with an ack; the stream goes on.
func TestAssemblerRefusesContent(t *testing.T) {
	s := relaytest.Snapshot(20)
	data, hash := relaytest.Encode(t, s)
	withHash, err := proto.Marshal(s)
	require.NoError(t, err)
	garbage := append([]byte{0x0a, 0xff}, data[:200]...) // a length past the end
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }
	tests := []struct {
		name string
		hash string
		data []byte
		want string
	}{
		{"a hash mismatch", sum(data[1:]), data, "the parts' SHA-256 is not the header's hash"},
		{"bytes that are no snapshot", sum(garbage), garbage, "the parts are not a snapshot's encoding"},
		{"an encoding that carries the hash", sum(withHash), withHash, "the encoding carries a hash field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			budget := newTestBudget(1 << 20)
			a := testAssembler(budget, &fakeClock{t: time.Unix(1000, 0)})
			var out *Assembled
			for _, m := range relaytest.Chunked("cluster-1", tc.hash, tc.data, 256) {
				var err error
				out, err = a.Add(m)
				require.NoError(t, err)
			}
			require.NotNil(t, out)
			require.Nil(t, out.Snapshot)
			require.ErrorIs(t, out.Err, ErrSnapshotRefused)
			assert.Contains(t, out.Err.Error(), tc.want)
			assert.Equal(t, tc.hash, out.Hash, "the ack names the snapshot")
			assert.Zero(t, budget.InUse())
			for _, m := range relaytest.Chunked("cluster-1", hash, data, 256) {
				out, err = a.Add(m)
				require.NoError(t, err)
			}
			assert.True(t, proto.Equal(s, out.Snapshot), "the stream goes on")
		})
	}
}

// decodeCost bounds what decoding allocates, for honest snapshots and for
// encodings made to decode into as much memory per byte as they can.
func TestDecodeCostBoundsAllocation(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 4000 // the same shapes at a fifth of the size; make test runs 20,000
	}
	shapes := hostileShapes(n)
	for name, s := range shapes {
		size, cost, allocated := decodeCostAndAllocation(t, s)
		t.Logf("%-20s %8d bytes: decoding allocates %9d, estimated %9d (%.2fx)", name, size, allocated, cost, float64(cost)/float64(allocated))
		assert.GreaterOrEqual(t, cost, int64(allocated), name)
	}

	// Malformed wire data is reported, never decoded.
	for _, bad := range [][]byte{{0x0a}, {0x0a, 0x05, 0x01}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, protowire.AppendTag(nil, 1, 7)} {
		_, err := decodeCost(bad)
		assert.Error(t, err, "%x", bad)
	}
}

// A map's decoding allocates most per entry just after its table doubled;
// decodeCost bounds it at every size, not only at the size of
// TestDecodeCostBoundsAllocation.
func TestDecodeCostBoundsMapsOfEverySize(t *testing.T) {
	step, largest := 11, 40000 // sizes grow by a tenth
	if testing.Short() {
		step, largest = 13, 20000
	}
	for n := smallMapEntries + 1; n <= largest; n = n*step/10 + 1 {
		_, cost, allocated := decodeCostAndAllocation(t, &relaypb.Snapshot{Destinations: []*relaypb.Destination{{Labels: labelsOf(n)}}})
		assert.GreaterOrEqual(t, cost, int64(allocated), "a map of %d entries: decoding allocates %d, estimated %d", n, allocated, cost)
	}
}

// decodeCostAndAllocation encodes s and returns its size, decodeCost's
// estimate and what decoding it allocates.
func decodeCostAndAllocation(t *testing.T, s *relaypb.Snapshot) (size int, cost int64, allocated uint64) {
	t.Helper()
	b, err := proto.Marshal(s)
	require.NoError(t, err)
	cost, err = decodeCost(b)
	require.NoError(t, err)
	allocated = allocatedBy(func() {
		d := &relaypb.Snapshot{}
		require.NoError(t, proto.Unmarshal(b, d))
		runtime.KeepAlive(d)
	})
	return len(b), cost, allocated
}

// hostileShapes are snapshots of about n elements each: an honest one, and
// encodings made to decode into as much memory per byte as they can.
func hostileShapes(n int) map[string]*relaypb.Snapshot {
	return map[string]*relaypb.Snapshot{
		"realistic":          relaytest.Snapshot(n / 4),
		"empty destinations": {Destinations: repeat(n, func() *relaypb.Destination { return &relaypb.Destination{} })},
		"empty endpoints":    {Destinations: []*relaypb.Destination{{Endpoints: repeat(n, func() *relaypb.Endpoint { return &relaypb.Endpoint{} })}}},
		"one label each":     {Destinations: []*relaypb.Destination{{Endpoints: repeat(n, func() *relaypb.Endpoint { return &relaypb.Endpoint{Labels: map[string]string{"": ""}} })}}},
		"four labels each":   {Destinations: []*relaypb.Destination{{Endpoints: repeat(n, func() *relaypb.Endpoint { return &relaypb.Endpoint{Labels: labelsOf(4)} })}}},
		"nine labels each":   {Destinations: []*relaypb.Destination{{Endpoints: repeat(n/4, func() *relaypb.Endpoint { return &relaypb.Endpoint{Labels: labelsOf(9)} })}}},
		"one large map":      {Destinations: []*relaypb.Destination{{Labels: labelsOf(n)}}},
		"empty strings":      {Destinations: []*relaypb.Destination{{ExternalAddresses: make([]string, n)}}},
		"subsets": {Destinations: repeat(n/10, func() *relaypb.Destination {
			return &relaypb.Destination{Subsets: map[string]*relaypb.LabelValues{"": {Values: []string{""}}}}
		})},
		"empty gateways":       {Meshes: []*relaypb.Mesh{{Gateways: repeat(n, func() *relaypb.Gateway { return &relaypb.Gateway{} })}}},
		"empty ports":          {Destinations: []*relaypb.Destination{{Ports: repeat(n, func() *relaypb.ServicePort { return &relaypb.ServicePort{} })}}},
		"empty workloads":      {Workloads: repeat(n, func() *relaypb.Workload { return &relaypb.Workload{} })},
		"workloads with label": {Workloads: repeat(n, func() *relaypb.Workload { return &relaypb.Workload{PodLabels: map[string]string{"": ""}} })},
	}
}

// decodeCost is what the Assembler reserves for decoding b as a whole
// snapshot, beyond the parts themselves.
func decodeCost(b []byte) (int64, error) {
	c, err := messageCost(b, (&relaypb.Snapshot{}).ProtoReflect().Descriptor(), structCosts(), 0)
	return int64(len(b)) + c, err
}

func repeat[T any](n int, f func() T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = f()
	}
	return out
}

func labelsOf(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprint(i)] = ""
	}
	return m
}

// allocatedBy is the heap f allocated (the minimum of three runs, so a
// concurrent allocation elsewhere does not count).
func allocatedBy(f func()) uint64 {
	least := ^uint64(0)
	for range 3 {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// BenchmarkAssembler: the server's side of a chunked push without its
// transport — parts of 1 MiB of a 60,000-Service snapshot (about 7 MB)
// framed, reserved, decoded as they come and released — the part of
// BenchmarkPushChunked100k that the budget changes.
func BenchmarkAssembler(b *testing.B) {
	s := relaytest.Snapshot(60000)
	data, hash := relaytest.Encode(b, s)
	msgs := relaytest.Chunked("cluster-1", hash, data, MaxSnapshotPartBytes)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		budget := newTestBudget(1 << 30)
		a := NewAssembler(AssemblerConfig{Cluster: "cluster-1", Budget: budget, Deadline: time.Minute, Now: time.Now})
		for _, m := range msgs {
			out, err := a.Add(m)
			if err != nil {
				b.Fatal(err)
			}
			if out != nil && out.Err != nil {
				b.Fatal(out.Err)
			}
		}
		a.Release()
	}
}
