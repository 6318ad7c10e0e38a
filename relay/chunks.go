package relay

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"reflect"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/internal/sharedlabels"
	"github.com/relaymesh/relaymesh/internal/text"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Framing of Discovery.PushChunked (see relay.proto): a header, parts in
// order, an end. Every part carries at most MaxSnapshotPartBytes and, but
// the last, at least MinSnapshotPartBytes, so a snapshot costs a bounded
// number of messages. SendChunked (sendchunked.go) encodes it; the
// Assembler decodes it.

// ChunkError refuses a PushChunked stream: the snapshot broke the framing,
// took too long, or the server has no room or rate for it. The stream ends
// with code; the last accepted snapshot stays.
type ChunkError struct {
	Code codes.Code
	// Reason is the label of relaymesh_snapshots_refused_total.
	Reason string
	Msg    string
}

func (e *ChunkError) Error() string { return ErrSnapshotRefused.Error() + ": " + e.Msg }
func (e *ChunkError) Unwrap() error { return ErrSnapshotRefused }

func framing(format string, args ...any) *ChunkError {
	return &ChunkError{Code: codes.InvalidArgument, Reason: "framing", Msg: fmt.Sprintf(format, args...)}
}

// AssemblerConfig configures the Assembler of one PushChunked stream.
type AssemblerConfig struct {
	// Cluster is the stream's, from its certificate.
	Cluster string
	Limits  SnapshotLimits
	Budget  *SnapshotBudget
	// Deadline from a header to its end.
	Deadline time.Duration
	// Idle is how long a snapshot in transit may go without a part (after
	// its header, or its last part); default DefaultSnapshotIdle.
	Idle time.Duration
	// MinRate is the least average rate, in bytes per second from the
	// header, at which a snapshot's parts must come once its first Idle
	// has passed; default DefaultSnapshotMinRate.
	MinRate int64
	Now     func() time.Time
	// MaxPart and MinPart bound the parts; default MaxSnapshotPartBytes
	// and MinSnapshotPartBytes (tests use small ones).
	MaxPart, MinPart uint64
}

// Defaults of AssemblerConfig: a snapshot in transit goes no more than
// 10 s without a part and, after its first 10 s, averages at least
// 64 KiB/s (a 64 MiB snapshot at the 60 s deadline's pace averages 1 MiB/s).
const (
	DefaultSnapshotIdle    = 10 * time.Second
	DefaultSnapshotMinRate = 64 << 10
)

// Assembler puts the snapshots of one PushChunked stream together, one at
// a time. It reserves memory in the budget for what arrived, as it
// arrives; any refusal drops what it buffered. Not safe for concurrent
// use.
type Assembler struct {
	cfg AssemblerConfig
	cur *assembly
	// held: the reservation of the snapshot Add returned last, which
	// release gives back.
	held *reservation
}

// assembly is one snapshot in transit. Parts are decoded as they come,
// one complete top-level field at a time (merging fields in order is what
// decoding their concatenation does), so decoding keeps pace with the
// agent's encoding and only an incomplete field waits in pending.
type assembly struct {
	header   *relaypb.SnapshotHeader
	res      *reservation
	received uint64
	next     uint32
	// started is when the header came, last when the last part did.
	started, last time.Time
	deadline      time.Time
	sum           *snapshothash.Hasher // of the parts so far
	pending       []byte
	snapshot      *relaypb.Snapshot
	// labels makes equal endpoint labels share one map as Destinations
	// are decoded (ShareLabels); shared counts the Destinations passed
	// through it so far.
	labels sharedlabels.Table
	shared int
	// err is why the content is refused, found before the end; decoding
	// stopped there, the framing is still checked, and the end is
	// answered with it.
	err error
}

// Assembled is a complete snapshot: decoded, with the hash of its bytes,
// not yet validated. Err, when set, is why it was refused (wrapping
// ErrSnapshotRefused): it is answered with an ack, and the stream goes on.
type Assembled struct {
	Snapshot *relaypb.Snapshot
	Hash     string
	Size     int
	Err      error
}

// NewAssembler starts the assembler of one PushChunked stream.
func NewAssembler(cfg AssemblerConfig) *Assembler {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.MaxPart == 0 {
		cfg.MaxPart, cfg.MinPart = MaxSnapshotPartBytes, MinSnapshotPartBytes
	}
	if cfg.Idle <= 0 {
		cfg.Idle = DefaultSnapshotIdle
	}
	if cfg.MinRate <= 0 {
		cfg.MinRate = DefaultSnapshotMinRate
	}
	return &Assembler{cfg: cfg}
}

// Add takes the next message of the stream. It returns the snapshot an end
// completes (the caller MUST call release once it is done with it), nil
// otherwise. An error refuses the stream: the Assembler has dropped what
// it held, and the caller ends the stream.
func (a *Assembler) Add(c *relaypb.SnapshotChunk) (*Assembled, error) {
	a.Release()
	out, err := a.step(c)
	if err != nil {
		a.drop()
		return nil, err
	}
	return out, nil
}

func (a *Assembler) step(c *relaypb.SnapshotChunk) (*Assembled, error) {
	if cur := a.cur; cur != nil {
		if err := a.overdue(cur, a.cfg.Now()); err != nil {
			return nil, err
		}
	}
	switch {
	case c.GetHeader() != nil:
		return nil, a.start(c.GetHeader())
	case c.GetPart() != nil:
		return nil, a.part(c.GetPart())
	case c.GetEnd() != nil:
		return a.end(c.GetEnd())
	}
	return nil, framing("a message that is neither a header, a part nor an end")
}

func (a *Assembler) start(h *relaypb.SnapshotHeader) error {
	if a.cur != nil {
		return framing("a second header before the end of snapshot %s", a.cur.header.GetHash())
	}
	if h.GetCluster() != a.cfg.Cluster {
		return framing("header for cluster %q, but the agent's certificate names %q", text.Truncate(h.GetCluster(), 80), a.cfg.Cluster)
	}
	if !snapshothash.Valid(h.GetHash()) {
		return framing("header hash %q is not 64 lower-case hex digits", text.Truncate(h.GetHash(), 80))
	}
	size, parts := h.GetSize(), uint64(h.GetParts())
	if size == 0 || size > uint64(a.cfg.Limits.MaxChunkedBytes) {
		return &ChunkError{Code: codes.InvalidArgument, Reason: "too_large", Msg: fmt.Sprintf("snapshot of %d bytes; at least 1, at most %d", size, a.cfg.Limits.MaxChunkedBytes)}
	}
	if least, most := (size+a.cfg.MaxPart-1)/a.cfg.MaxPart, size/a.cfg.MinPart+1; parts < least || parts > most {
		return framing("%d parts for %d bytes; between %d and %d (parts of at most %d bytes, all but the last at least %d)",
			parts, size, least, most, a.cfg.MaxPart, a.cfg.MinPart)
	}
	// Nothing is reserved for what the header announces: only for what
	// arrives.
	res, err := a.cfg.Budget.open(a.cfg.Cluster)
	if err != nil {
		return err
	}
	now := a.cfg.Now()
	a.cur = &assembly{header: h, res: res, started: now, last: now, deadline: now.Add(a.cfg.Deadline), sum: snapshothash.New(), snapshot: &relaypb.Snapshot{}}
	return nil
}

func (a *Assembler) part(p *relaypb.SnapshotPart) error {
	cur := a.cur
	if cur == nil {
		return framing("part %d without a header", p.GetIndex())
	}
	h, n := cur.header, uint64(len(p.GetData()))
	switch {
	case p.GetIndex() != cur.next:
		return framing("part %d, but part %d comes next", p.GetIndex(), cur.next)
	case p.GetIndex() >= h.GetParts():
		return framing("part %d, but the header announced %d", p.GetIndex(), h.GetParts())
	case n > a.cfg.MaxPart:
		return &ChunkError{Code: codes.InvalidArgument, Reason: "too_large", Msg: fmt.Sprintf("part %d of %d bytes, at most %d", p.GetIndex(), n, a.cfg.MaxPart)}
	case n == 0 || n < a.cfg.MinPart && p.GetIndex() < h.GetParts()-1:
		return framing("part %d of %d bytes; all parts but the last carry at least %d", p.GetIndex(), n, a.cfg.MinPart)
	case cur.received+n > h.GetSize():
		return &ChunkError{Code: codes.InvalidArgument, Reason: "too_large", Msg: fmt.Sprintf("more than the %d bytes the header announced", h.GetSize())}
	}
	cur.sum.Write(p.GetData())
	cur.received += n
	cur.next++
	cur.last = a.cfg.Now()
	if cur.err != nil {
		return nil // refused content: nothing more is buffered
	}
	// The part itself: the strings and unknown fields decoded from it are
	// copies of it. And every buffer pending takes (old ones are garbage,
	// not yet collected), within the announced size.
	reserve, grown := int64(n), 0
	if need := len(cur.pending) + int(n); need > cap(cur.pending) {
		grown = min(max(2*cap(cur.pending), need), int(h.GetSize()))
		reserve += int64(grown)
	}
	if err := a.cfg.Budget.grow(cur.res, reserve); err != nil {
		return err
	}
	if grown > 0 {
		b := make([]byte, len(cur.pending), grown)
		copy(b, cur.pending)
		cur.pending = b
	}
	cur.pending = append(cur.pending, p.GetData()...)
	return a.decodeFields(cur)
}

// decodeFields decodes every complete top-level field in pending into the
// snapshot, after reserving what decoding them takes. A malformed field
// makes the content refused (cur.err); no room for decoding ends the
// stream.
func (a *Assembler) decodeFields(cur *assembly) error {
	b := cur.pending
	md := cur.snapshot.ProtoReflect().Descriptor()
	complete, cost := 0, int64(0)
	for complete < len(b) {
		rest := b[complete:]
		num, typ, n := protowire.ConsumeTag(rest)
		if n >= 0 && typ == protowire.StartGroupType {
			// Never in a snapshot; and finding where a group ends takes a
			// scan, which every part would repeat.
			return a.refuseContent(cur, refused("the parts are not a snapshot's encoding: a group at field %d", num))
		}
		m := 0
		if n >= 0 {
			m = protowire.ConsumeFieldValue(num, typ, rest[n:])
		}
		if n < 0 || m < 0 {
			err := protowire.ParseError(min(n, m))
			if errors.Is(err, io.ErrUnexpectedEOF) {
				break // the field goes on in the next part
			}
			return a.refuseContent(cur, refused("the parts are not a snapshot's encoding: %v", err))
		}
		c, err := messageCost(rest[:n+m], md, structCosts(), 0)
		if err != nil {
			return a.refuseContent(cur, refused("the parts are not a snapshot's encoding: %v", err))
		}
		cost += c
		complete += n + m
	}
	if complete == 0 {
		return nil
	}
	if a.cfg.Budget.held(cur.res)+cost > a.cfg.Budget.Limit() {
		return a.refuseContent(cur, refused("decoding would take more than the server's memory for snapshots in transit (%d MiB)", a.cfg.Budget.Limit()>>20))
	}
	if err := a.cfg.Budget.grow(cur.res, cost); err != nil {
		return err
	}
	// The complete fields at once: decoding a concatenation merges its
	// fields in order.
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b[:complete], cur.snapshot); err != nil {
		return a.refuseContent(cur, refused("the parts are not a snapshot's encoding: %v", err))
	}
	// The copies of equal labels become garbage while the rest is still
	// being decoded, not once the whole snapshot is in memory.
	ds := cur.snapshot.GetDestinations()
	shareEndpointLabels(&cur.labels, ds[cur.shared:])
	cur.shared = len(ds)
	cur.pending = append(cur.pending[:0], b[complete:]...)
	return nil
}

// refuseContent stops decoding cur: its end will be answered with err.
// What it decoded is dropped, and so is its reservation: the parts still
// to come are only hashed.
func (a *Assembler) refuseContent(cur *assembly, err error) error {
	cur.err, cur.pending, cur.snapshot = err, nil, nil
	a.cfg.Budget.shrink(cur.res, 0)
	return nil
}

func (a *Assembler) end(e *relaypb.SnapshotEnd) (*Assembled, error) {
	cur := a.cur
	if cur == nil {
		return nil, framing("an end without a header")
	}
	h := cur.header
	if e.GetHash() != h.GetHash() {
		return nil, framing("end of snapshot %q, but snapshot %s is in transit", text.Truncate(e.GetHash(), 80), h.GetHash())
	}
	if cur.next != h.GetParts() || cur.received != h.GetSize() {
		return nil, framing("end after %d of %d parts, %d of %d bytes", cur.next, h.GetParts(), cur.received, h.GetSize())
	}
	// The framing was kept: a problem with the content is answered with an
	// ack, and the stream goes on.
	out := &Assembled{Hash: h.GetHash(), Size: int(cur.received)}
	switch {
	case cur.sum.Sum() != h.GetHash():
		out.Err = refused("the parts' SHA-256 is not the header's hash %s", h.GetHash())
	case cur.err != nil:
		out.Err = cur.err
	case len(cur.pending) > 0:
		out.Err = refused("the parts are not a snapshot's encoding: it ends inside a field")
	case cur.snapshot.GetHash() != "":
		out.Err = refused("the encoding carries a hash field; it must be empty (the header carries the hash)")
	}
	if out.Err != nil {
		a.drop()
		return out, nil
	}
	out.Snapshot = cur.snapshot
	out.Snapshot.Hash = h.GetHash()
	a.cfg.Budget.complete(cur.res)
	a.cur, a.held = nil, cur.res
	return out, nil
}

// Deadline is when the snapshot in transit is refused unless a part comes
// first (its deadline, its idle limit, or its minimum rate); false when
// none is in transit.
func (a *Assembler) Deadline() (time.Time, bool) {
	if a.cur == nil {
		return time.Time{}, false
	}
	at, _ := a.due(a.cur)
	return at, true
}

// Preempted is closed when the budget took back the memory of the
// snapshot in transit (nil when none is in transit): Expire then refuses
// it.
func (a *Assembler) Preempted() <-chan struct{} {
	if a.cur == nil {
		return nil
	}
	return a.cur.res.preempted
}

// Expire refuses the snapshot in transit: it was preempted, or its
// Deadline passed.
func (a *Assembler) Expire() error {
	cur := a.cur
	if cur == nil {
		return &ChunkError{Code: codes.DeadlineExceeded, Reason: "deadline", Msg: "no snapshot in transit"}
	}
	var err *ChunkError
	select {
	case <-cur.res.preempted:
		err = a.cfg.Budget.preemptedError(cur.res)
	default:
		_, why := a.due(cur)
		err = a.refusal(cur, why, a.cfg.Now())
	}
	a.drop()
	return err
}

// due is when cur is refused unless a part comes, and which limit that is:
// its deadline, Idle after its last part (or its header), or when the
// bytes so far fall under MinRate since the header (not before its first
// Idle).
func (a *Assembler) due(cur *assembly) (time.Time, string) {
	at, why := cur.deadline, "deadline"
	if idle := cur.last.Add(a.cfg.Idle); idle.Before(at) {
		at, why = idle, "idle"
	}
	paid := time.Duration(float64(cur.received) / float64(a.cfg.MinRate) * float64(time.Second))
	if slow := cur.started.Add(max(a.cfg.Idle, paid)); slow.Before(at) {
		at, why = slow, "slow"
	}
	return at, why
}

// overdue refuses cur if a limit passed before now.
func (a *Assembler) overdue(cur *assembly, now time.Time) *ChunkError {
	select {
	case <-cur.res.preempted:
		return a.cfg.Budget.preemptedError(cur.res)
	default:
	}
	if at, why := a.due(cur); now.After(at) {
		return a.refusal(cur, why, now)
	}
	return nil
}

// refusal is the error of a snapshot in transit refused for the limit why
// at now.
func (a *Assembler) refusal(cur *assembly, why string, now time.Time) *ChunkError {
	h := cur.header
	msg := fmt.Sprintf("snapshot %s not complete within %s (%d of %d parts)", h.GetHash(), a.cfg.Deadline, cur.next, h.GetParts())
	switch why {
	case "idle":
		msg = fmt.Sprintf("snapshot %s: no part for %s (%d of %d parts); a snapshot in transit must keep coming", h.GetHash(), a.cfg.Idle, cur.next, h.GetParts())
	case "slow":
		msg = fmt.Sprintf("snapshot %s: %d bytes in %s, under the minimum rate of %d KiB/s", h.GetHash(), cur.received, now.Sub(cur.started).Round(time.Millisecond), a.cfg.MinRate>>10)
	}
	return &ChunkError{Code: codes.DeadlineExceeded, Reason: why, Msg: msg}
}

// Release returns the reservation of the snapshot Add returned last.
func (a *Assembler) Release() {
	if a.held != nil {
		a.cfg.Budget.release(a.held)
		a.held = nil
	}
}

// drop forgets the snapshot in transit and returns its reservation.
func (a *Assembler) drop() {
	if a.cur != nil {
		a.cfg.Budget.release(a.cur.res)
		a.cur = nil
	}
	a.Release()
}

// Close drops everything; the stream ended.
func (a *Assembler) Close() { a.drop() }

// Costs of decoded elements beyond their bytes, measured upper bounds
// (TestDecodeCostBoundsAllocation): a message is its Go struct, rounded up
// to a power of two, plus its slot in a list as the list grows (Go grows
// long slices by a quarter, so a slot is allocated about five times); a
// map's first entry allocates its first group, entries up to the eighth
// fit in it, the ninth grows the table, and later ones cost their share:
// most just after the table doubled, when every smaller table is garbage
// not yet collected (up to 221 bytes an entry measured; 192 held at 20,000
// entries but not at 914, 2,010 or 7,469 —
// TestDecodeCostBoundsMapsOfEverySize).
const (
	listSlotCost      = 48
	scalarListCost    = 96
	mapFirstEntryCost = 384
	mapSmallEntryCost = 32
	mapGrowCost       = 1024
	mapEntryCost      = 240
	smallMapEntries   = 8
)

// structCosts is the cost of each message of a snapshot, by full name.
var structCosts = sync.OnceValue(func() map[protoreflect.FullName]int64 {
	costs := map[protoreflect.FullName]int64{}
	var visit func(md protoreflect.MessageDescriptor)
	visit = func(md protoreflect.MessageDescriptor) {
		if _, done := costs[md.FullName()]; done {
			return
		}
		costs[md.FullName()] = 0
		if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName()); err == nil {
			size := reflect.TypeOf(mt.Zero().Interface()).Elem().Size()
			costs[md.FullName()] = int64(1) << bits.Len64(uint64(size))
		}
		fields := md.Fields()
		for i := range fields.Len() {
			if m := fields.Get(i).Message(); m != nil {
				visit(m)
			}
		}
	}
	visit((&relaypb.Snapshot{}).ProtoReflect().Descriptor())
	return costs
})

// messageCost bounds the memory proto.Unmarshal takes to decode b as a
// message of md beyond b's own length (strings and unknown fields are
// copies of it), from the wire alone and without allocating: a cost for
// every message, list entry and map entry b holds. A hostile encoding can
// make a few bytes decode into hundreds (an empty message in two bytes);
// this lets the server reserve the memory before it decodes. It reports
// malformed wire data.
func messageCost(b []byte, md protoreflect.MessageDescriptor, costs map[protoreflect.FullName]int64, depth int) (int64, error) {
	if depth > 16 {
		return 0, fmt.Errorf("nested too deep")
	}
	var cost int64
	// Entries so far of each map field (a message has few); no
	// allocation, as this runs for every message of a snapshot.
	var maps [8]struct {
		num     protowire.Number
		entries int
	}
	entries := func(num protowire.Number) int {
		for i := range maps {
			if maps[i].num == num || maps[i].num == 0 {
				maps[i].num = num
				maps[i].entries++
				return maps[i].entries
			}
		}
		// Beyond the table (no message of a snapshot has that many map
		// fields): charged as a first entry, dearer than any other.
		return 1
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd != nil && fd.Message() != nil && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			b = b[n:]
			c, err := messageCost(v, fd.Message(), costs, depth+1)
			if err != nil {
				return 0, err
			}
			cost += c
			switch {
			case fd.IsMap():
				switch k := entries(num); {
				case k == 1:
					cost += mapFirstEntryCost
				case k <= smallMapEntries:
					cost += mapSmallEntryCost
				case k == smallMapEntries+1:
					cost += mapGrowCost + mapEntryCost
				default:
					cost += mapEntryCost
				}
			case fd.IsList():
				cost += costs[fd.Message().FullName()] + listSlotCost
			default:
				cost += costs[fd.Message().FullName()]
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if fd != nil && fd.IsList() {
			cost += scalarListCost
		}
	}
	return cost, nil
}
