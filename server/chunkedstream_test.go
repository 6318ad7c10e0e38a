package server

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// chunkHarness is the server's side of PushChunked streams of cluster-1
// without their transport: the handler the server runs for each message
// (chunkedStream.take), with a real View, Registry, memory budget and
// metrics, small parts (64 to 256 bytes, at most 64 KiB in all) and a
// fake clock.
type chunkHarness struct {
	d     *discoveryService
	view  *View
	clock *fakeClock
	agent *agent
}

func newChunkHarness(t testing.TB) *chunkHarness {
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	reg := NewRegistry()
	reg.Set(Registration{Name: "cluster-1", UID: "uid-1"})
	h := &chunkHarness{view: NewView(), clock: &fakeClock{t: time.Unix(1000, 0)}, agent: &agent{cluster: "cluster-1", registration: "uid-1"}}
	h.d = &discoveryService{
		s: &Server{cfg: ServerConfig{Registry: reg, Metrics: m, Clock: h.clock.now}, log: slog.New(slog.DiscardHandler)},
		cfg: DataPathConfig{View: h.view, Limits: relay.SnapshotLimits{MaxChunkedBytes: 64 << 10}.WithDefaults(),
			SnapshotsPerSecond: 1000, SnapshotBurst: 1000, SnapshotDeadline: 10 * time.Second, SnapshotMemory: 1 << 20},
	}
	return h
}

// stream opens a stream of cluster-1's agent.
func (h *chunkHarness) stream() *chunkedStream {
	c := h.d.newChunkedStream(h.agent, h.clock.now)
	// The assembler of newChunkedStream, with small parts.
	cfg := h.d.assemblerConfig(h.agent.cluster, h.clock.now)
	cfg.MaxPart, cfg.MinPart = 256, 64
	c.asm = relay.NewAssembler(cfg)
	return c
}

// FuzzSnapshotChunks feeds the server's handler of a PushChunked stream
// (chunkedStream.take, what PushChunked runs for every message) any
// sequence of messages — the input is length-delimited SnapshotChunk
// encodings: out of order, oversized, repeated, never finished, naming
// or carrying another cluster — and checks the server's state after each:
// a snapshot the view accepts is exactly the decoding of the parts sent
// since its header, carries their SHA-256 and passes the server's checks
// (relay.ValidateSnapshot's too when the encoding is the deterministic one);
// anything refused (the stream ended, or an ack that refuses) leaves the
// view's snapshot of the cluster as it was and says why in its LastError;
// another cluster's snapshot never changes; nothing stays reserved
// between snapshots; a snapshot never finished is refused at its deadline
// without a change; and a new stream of the cluster then gets a good
// snapshot through as if nothing had happened.
func FuzzSnapshotChunks(f *testing.F) {
	good := relaytest.Snapshot(8)
	data, hash := relaytest.Encode(f, good)
	seed := func(msgs ...*relaypb.SnapshotChunk) []byte { return seedChunks(f, msgs...) }
	msgs := relaytest.Chunked("cluster-1", hash, data, 256)
	f.Add(seed(msgs...))
	f.Add(seed(append(msgs, msgs...)...))
	f.Add(seed(msgs[0], msgs[2], msgs[1]))
	f.Add(seed(msgs[:3]...))
	f.Add(seed(relaytest.Header("cluster-2", hash, len(data), len(msgs)-2)))
	small, smallHash := relaytest.Encode(f, relaytest.Snapshot(1))
	f.Add(seed(relaytest.Chunked("cluster-1", smallHash, small, 256)...))
	f.Add(seed(relaytest.Chunked("cluster-1", smallHash, small[:len(small)-1], 256)...))
	other := relaytest.Snapshot(2)
	other.Cluster = "cluster-2"
	for _, d := range other.Destinations {
		d.Cluster = "cluster-2"
	}
	otherData, otherHash := relaytest.Encode(f, other)
	f.Add(seed(relaytest.Chunked("cluster-1", otherHash, otherData, 256)...))
	f.Add(seed(msgs[0], relaytest.Part(0, make([]byte, 257))))
	f.Add([]byte{})
	next := relaytest.Snapshot(5)
	nextData, nextHash := relaytest.Encode(f, next)
	nextMsgs := relaytest.Chunked("cluster-1", nextHash, nextData, 256)
	f.Fuzz(func(t *testing.T, in []byte) {
		h := newChunkHarness(t)
		budget := h.d.snapshotBudget()
		limits := h.d.cfg.Limits
		h.view.Accept("cluster-1", good, h.clock.t)
		h.view.Accept("cluster-2", other, h.clock.t)
		otherBefore := h.view.Snapshot("cluster-2")
		c := h.stream()
		var sent []byte // the data of the parts since the last header
		ended := false
		for i := 0; len(in) > 0 && i < 64 && !ended; i++ {
			mb, n := protowire.ConsumeBytes(in)
			if n < 0 {
				break
			}
			in = in[n:]
			m := &relaypb.SnapshotChunk{}
			if proto.Unmarshal(mb, m) != nil {
				break
			}
			h.clock.t = h.clock.t.Add(time.Second)
			before := h.view.Snapshot("cluster-1")
			ack, err := c.take(m)
			switch {
			case err != nil:
				require.Contains(t, []codes.Code{codes.InvalidArgument, codes.DeadlineExceeded, codes.ResourceExhausted}, status.Code(err), err)
				require.Same(t, before, h.view.Snapshot("cluster-1"), "a refused stream changes nothing")
				require.Contains(t, h.view.Clusters()["cluster-1"].LastError, relay.ErrSnapshotRefused.Error())
				ended = true
			case ack != nil && !ack.GetAccepted():
				require.Same(t, before, h.view.Snapshot("cluster-1"), "a refused snapshot changes nothing")
				require.Contains(t, ack.GetError(), relay.ErrSnapshotRefused.Error())
				require.Equal(t, ack.GetError(), h.view.Clusters()["cluster-1"].LastError)
			case ack != nil:
				got := h.view.Snapshot("cluster-1")
				sum := sha256.Sum256(sent)
				require.Equal(t, hex.EncodeToString(sum[:]), ack.GetHash())
				require.Equal(t, ack.GetHash(), got.GetHash())
				decoded := &relaypb.Snapshot{}
				require.NoError(t, proto.Unmarshal(sent, decoded))
				decoded.Hash = ack.GetHash()
				require.True(t, proto.Equal(decoded, got), "accepted: exactly the parts sent")
				require.NoError(t, relay.ValidateAssembled("cluster-1", got, limits, ack.GetHash()))
				if canonical, err := snapshothash.Encode(got); err == nil && string(canonical) == string(sent) {
					require.NoError(t, relay.ValidateSnapshot("cluster-1", got, relay.SnapshotLimits{MaxBytes: 64 << 20}))
				}
			case m.GetHeader() != nil:
				sent = nil
			case m.GetPart() != nil:
				sent = append(sent, m.GetPart().GetData()...)
			}
			if ack == nil && err == nil {
				require.Same(t, before, h.view.Snapshot("cluster-1"), "nothing changes before a snapshot is complete")
			}
			require.Same(t, otherBefore, h.view.Snapshot("cluster-2"), "a stream of cluster-1 never touches cluster-2")
			if _, inTransit := c.asm.Deadline(); !inTransit {
				require.Zero(t, budget.InUse(), "nothing reserved between snapshots")
			}
		}
		if _, inTransit := c.asm.Deadline(); inTransit && !ended {
			// Never finished: the stream's timer refuses it.
			before := h.view.Snapshot("cluster-1")
			require.Equal(t, codes.DeadlineExceeded, status.Code(c.expire()))
			require.Same(t, before, h.view.Snapshot("cluster-1"))
		}
		c.close()
		require.Zero(t, budget.InUse(), "the stream ended: nothing reserved")

		// Nothing left behind: a new stream of the cluster gets a good
		// snapshot through.
		c = h.stream()
		var ack *relaypb.PushAck
		for _, m := range nextMsgs {
			var err error
			ack, err = c.take(m)
			require.NoError(t, err)
		}
		require.True(t, ack.GetAccepted(), ack.GetError())
		require.True(t, proto.Equal(next, h.view.Snapshot("cluster-1")))
		c.close()
		require.Zero(t, budget.InUse())
	})
}

// FuzzSessionSnapshots feeds the snapshot side of a relay session v2
// (sessionPush.take, what Session runs for every snapshot frame) the same
// hostile sequences as FuzzSnapshotChunks, and checks what a session adds:
// a refusal is a PushRefused frame that changes nothing and leaves nothing
// reserved; the refused snapshot's remaining parts are dropped until a
// header; another cluster's snapshot never changes; refusals beyond the
// session's pace end it with ResourceExhausted; and unless it ended, the
// same session then gets a good snapshot through.
func FuzzSessionSnapshots(f *testing.F) {
	good := relaytest.Snapshot(8)
	data, hash := relaytest.Encode(f, good)
	seed := func(msgs ...*relaypb.SnapshotChunk) []byte { return seedChunks(f, msgs...) }
	msgs := relaytest.Chunked("cluster-1", hash, data, 256)
	f.Add(seed(msgs...))
	f.Add(seed(msgs[1], msgs[2], msgs[0], msgs[1]))
	f.Add(seed(msgs[0], msgs[2], msgs[1]))
	f.Add(seed(msgs[0], msgs[0], msgs[0], msgs[0], msgs[0], msgs[0], msgs[0], msgs[0]))
	f.Add(seed(relaytest.Header("cluster-2", hash, len(data), len(msgs)-2)))
	f.Add(seed(append([]*relaypb.SnapshotChunk{msgs[0], relaytest.Part(0, make([]byte, 257)), msgs[1]}, msgs...)...))
	f.Add([]byte{})
	other := relaytest.Snapshot(2)
	other.Cluster = "cluster-2"
	for _, d := range other.Destinations {
		d.Cluster = "cluster-2"
	}
	next := relaytest.Snapshot(5)
	nextData, nextHash := relaytest.Encode(f, next)
	nextMsgs := relaytest.Chunked("cluster-1", nextHash, nextData, 256)
	f.Fuzz(func(t *testing.T, in []byte) {
		h := newChunkHarness(t)
		budget := h.d.snapshotBudget()
		h.view.Accept("cluster-1", good, h.clock.t)
		h.view.Accept("cluster-2", other, h.clock.t)
		otherBefore := h.view.Snapshot("cluster-2")
		p := newSessionPush(h.agent, h.stream)
		var frames []*relaypb.ServerFrame
		send := func(fr *relaypb.ServerFrame) error { frames = append(frames, fr); return nil }
		ended := false
		for i := 0; len(in) > 0 && i < 64 && !ended; i++ {
			mb, n := protowire.ConsumeBytes(in)
			if n < 0 {
				break
			}
			in = in[n:]
			m := &relaypb.SnapshotChunk{}
			if proto.Unmarshal(mb, m) != nil {
				break
			}
			h.clock.t = h.clock.t.Add(time.Second)
			before := h.view.Snapshot("cluster-1")
			frames = frames[:0]
			err := p.take(send, m)
			if err != nil {
				require.Equal(t, codes.ResourceExhausted, status.Code(err), err)
				require.Contains(t, status.Convert(err).Message(), "refused more often than once a second")
				require.Same(t, before, h.view.Snapshot("cluster-1"))
				ended = true
				break
			}
			require.LessOrEqual(t, len(frames), 1, "one answer at most per frame")
			for _, fr := range frames {
				switch {
				case fr.GetPushRefused() != nil:
					require.Contains(t, []int32{int32(codes.InvalidArgument), int32(codes.DeadlineExceeded), int32(codes.ResourceExhausted)}, fr.GetPushRefused().GetCode())
					require.Same(t, before, h.view.Snapshot("cluster-1"), "a refused snapshot changes nothing")
					require.Zero(t, budget.InUse(), "a refusal releases what the snapshot held")
					require.True(t, p.discarding)
				case fr.GetPushAck() != nil && !fr.GetPushAck().GetAccepted():
					require.Same(t, before, h.view.Snapshot("cluster-1"))
				case fr.GetPushAck() != nil:
					require.Equal(t, fr.GetPushAck().GetHash(), h.view.Snapshot("cluster-1").GetHash())
				default:
					t.Fatalf("unexpected frame %v", fr)
				}
			}
			if len(frames) == 0 && p.discarding {
				require.Same(t, before, h.view.Snapshot("cluster-1"), "a refused snapshot's parts are dropped")
			}
			require.Same(t, otherBefore, h.view.Snapshot("cluster-2"), "a session of cluster-1 never touches cluster-2")
		}
		if ended {
			p.c.close()
			require.Zero(t, budget.InUse(), "the session ended: nothing reserved")
			return
		}
		// The session goes on: a good snapshot gets through on it.
		for _, m := range nextMsgs {
			frames = frames[:0]
			if err := p.take(send, m); err != nil {
				// The first header may meet a snapshot still in transit
				// (a second header: refused); the next one goes through.
				require.Equal(t, codes.ResourceExhausted, status.Code(err), err)
				return
			}
		}
		if len(frames) == 0 || frames[0].GetPushAck() == nil {
			// The good snapshot's header met one in transit and was
			// refused; send it again, as the agent does after a pause.
			for _, m := range nextMsgs {
				frames = frames[:0]
				if err := p.take(send, m); err != nil {
					require.Equal(t, codes.ResourceExhausted, status.Code(err), err)
					return
				}
			}
		}
		require.Len(t, frames, 1)
		require.True(t, frames[0].GetPushAck().GetAccepted(), frames[0].GetPushAck().GetError())
		require.True(t, proto.Equal(next, h.view.Snapshot("cluster-1")))
		p.c.close()
		require.Zero(t, budget.InUse())
	})
}

// seedChunks is a fuzz input of msgs: their encodings, length-delimited.
func seedChunks(f *testing.F, msgs ...*relaypb.SnapshotChunk) []byte {
	var b []byte
	for _, m := range msgs {
		mb, err := proto.Marshal(m)
		require.NoError(f, err)
		b = protowire.AppendBytes(b, mb)
	}
	return b
}
