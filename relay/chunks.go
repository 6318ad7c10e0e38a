package relay

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/bits"
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/internal/text"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Framing of Discovery.PushChunked (see relay.proto): a header, parts in
// order, an end. Every part carries at most MaxSnapshotPartBytes and, but
// the last, at least MinSnapshotPartBytes, so a snapshot costs a bounded
// number of messages.
const (
	MaxSnapshotPartBytes = 1 << 20
	MinSnapshotPartBytes = 64 << 10
)

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

// SnapshotBudget is the server-wide memory for snapshots in transit: the
// buffered parts of every PushChunked stream, and then the memory their
// decoding takes, until the snapshot is accepted or refused. A cluster
// holds at most one reservation at a time.
type SnapshotBudget struct {
	limit int64
	gauge prometheus.Gauge

	mu      sync.Mutex
	used    int64
	holders map[string]int64
}

// NewSnapshotBudget holds limit bytes for snapshots in transit and shows
// what it holds in gauge.
func NewSnapshotBudget(limit int64, gauge prometheus.Gauge) *SnapshotBudget {
	return &SnapshotBudget{limit: limit, gauge: gauge, holders: map[string]int64{}}
}

// reserve takes n bytes for cluster's one snapshot in transit.
func (b *SnapshotBudget) reserve(cluster string, n int64) *ChunkError {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, busy := b.holders[cluster]; busy {
		return &ChunkError{Code: codes.ResourceExhausted, Reason: "cluster_busy", Msg: "another stream of this cluster is sending a snapshot; one at a time"}
	}
	if b.used+n > b.limit {
		return &ChunkError{Code: codes.ResourceExhausted, Reason: "memory", Msg: fmt.Sprintf("the server's memory for snapshots in transit is in use (%d MiB); retry later", b.limit>>20)}
	}
	b.holders[cluster] = n
	b.used += n
	b.gauge.Set(float64(b.used))
	return nil
}

// grow adds n bytes to cluster's reservation.
func (b *SnapshotBudget) grow(cluster string, n int64) *ChunkError {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		return &ChunkError{Code: codes.ResourceExhausted, Reason: "memory", Msg: fmt.Sprintf("the server's memory for snapshots in transit is in use (%d MiB); retry later", b.limit>>20)}
	}
	b.holders[cluster] += n
	b.used += n
	b.gauge.Set(float64(b.used))
	return nil
}

// held is cluster's reservation.
func (b *SnapshotBudget) held(cluster string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.holders[cluster]
}

// shrink cuts cluster's reservation down to n, if it holds more.
func (b *SnapshotBudget) shrink(cluster string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if have, ok := b.holders[cluster]; ok && have > n {
		b.used -= have - n
		b.holders[cluster] = n
		b.gauge.Set(float64(b.used))
	}
}

// release returns cluster's reservation, if it holds one.
func (b *SnapshotBudget) release(cluster string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= b.holders[cluster]
	delete(b.holders, cluster)
	b.gauge.Set(float64(b.used))
}

// InUse is the memory reserved now.
func (b *SnapshotBudget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// AssemblerConfig configures the Assembler of one PushChunked stream.
type AssemblerConfig struct {
	// Cluster is the stream's, from its certificate.
	Cluster string
	Limits  SnapshotLimits
	Budget  *SnapshotBudget
	// Deadline from a header to its end.
	Deadline time.Duration
	Now      func() time.Time
	// MaxPart and MinPart bound the parts; default MaxSnapshotPartBytes
	// and MinSnapshotPartBytes (tests use small ones).
	MaxPart, MinPart uint64
}

// Assembler puts the snapshots of one PushChunked stream together, one at
// a time. It never holds more than the header announced, within the
// budget; any refusal drops what it buffered. Not safe for concurrent use.
type Assembler struct {
	cfg AssemblerConfig
	cur *assembly
	// held: the budget still holds the reservation of a snapshot add
	// returned; release gives it back.
	held bool
}

// assembly is one snapshot in transit. Parts are decoded as they come,
// one complete top-level field at a time (merging fields in order is what
// decoding their concatenation does), so decoding keeps pace with the
// agent's encoding and only an incomplete field waits in pending.
type assembly struct {
	header   *relaypb.SnapshotHeader
	received uint64
	next     uint32
	deadline time.Time
	sum      hash.Hash // SHA-256 of the parts so far
	pending  []byte
	snapshot *relaypb.Snapshot
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
	if cur := a.cur; cur != nil && a.cfg.Now().After(cur.deadline) {
		return nil, a.expired()
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
	if !IsHexSHA256(h.GetHash()) {
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
	// Twice the size: the strings and unknown fields decoded from the
	// parts are copies of them, and pending holds at most the rest.
	if err := a.cfg.Budget.reserve(a.cfg.Cluster, 2*int64(size)); err != nil {
		return err
	}
	a.cur = &assembly{header: h, deadline: a.cfg.Now().Add(a.cfg.Deadline), sum: sha256.New(), snapshot: &relaypb.Snapshot{}}
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
	if cur.err != nil {
		return nil
	}
	if need := len(cur.pending) + int(n); need > cap(cur.pending) {
		// Grow within the announced size, which the budget holds.
		grown := make([]byte, len(cur.pending), min(max(2*cap(cur.pending), need), int(h.GetSize())))
		copy(grown, cur.pending)
		cur.pending = grown
	}
	cur.pending = append(cur.pending, p.GetData()...)
	return a.decodeFields(cur)
}

// decodeFields decodes every complete top-level field in pending into the
// snapshot, after reserving what decoding it takes. A malformed field
// makes the content refused (cur.err); no room for decoding ends the
// stream.
func (a *Assembler) decodeFields(cur *assembly) error {
	b := cur.pending
	md := cur.snapshot.ProtoReflect().Descriptor()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n >= 0 && typ == protowire.StartGroupType {
			// Never in a snapshot; and finding where a group ends takes a
			// scan, which every part would repeat.
			return a.refuseContent(cur, refused("the parts are not a snapshot's encoding: a group at field %d", num))
		}
		m := 0
		if n >= 0 {
			m = protowire.ConsumeFieldValue(num, typ, b[n:])
		}
		if n < 0 || m < 0 {
			err := protowire.ParseError(min(n, m))
			if errors.Is(err, io.ErrUnexpectedEOF) {
				break // the field goes on in the next part
			}
			return a.refuseContent(cur, refused("the parts are not a snapshot's encoding: %v", err))
		}
		field := b[:n+m]
		b = b[n+m:]
		cost, err := messageCost(field, md, structCosts(), 0)
		if err != nil {
			return a.refuseContent(cur, refused("the parts are not a snapshot's encoding: %v", err))
		}
		held := a.cfg.Budget.held(a.cfg.Cluster)
		if held+cost > a.cfg.Budget.limit {
			return a.refuseContent(cur, refused("decoding would take more than the server's memory for snapshots in transit (%d MiB)", a.cfg.Budget.limit>>20))
		}
		if err := a.cfg.Budget.grow(a.cfg.Cluster, cost); err != nil {
			return err
		}
		if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(field, cur.snapshot); err != nil {
			return a.refuseContent(cur, refused("the parts are not a snapshot's encoding: %v", err))
		}
	}
	cur.pending = append(cur.pending[:0], b...)
	return nil
}

// refuseContent stops decoding cur: its end will be answered with err.
// What it decoded is dropped and its reservation shrinks back to the
// parts'.
func (a *Assembler) refuseContent(cur *assembly, err error) error {
	cur.err, cur.pending, cur.snapshot = err, nil, nil
	a.cfg.Budget.shrink(a.cfg.Cluster, 2*int64(cur.header.GetSize()))
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
	case hex.EncodeToString(cur.sum.Sum(nil)) != h.GetHash():
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
	a.cur, a.held = nil, true
	return out, nil
}

// Deadline is when the snapshot in transit must be complete.
func (a *Assembler) Deadline() (time.Time, bool) {
	if a.cur == nil {
		return time.Time{}, false
	}
	return a.cur.deadline, true
}

// Expire refuses the snapshot in transit: its deadline passed.
func (a *Assembler) Expire() error {
	err := a.expired()
	a.drop()
	return err
}

func (a *Assembler) expired() *ChunkError {
	h := a.cur.header
	return &ChunkError{Code: codes.DeadlineExceeded, Reason: "deadline",
		Msg: fmt.Sprintf("snapshot %s not complete within %s (%d of %d parts)", h.GetHash(), a.cfg.Deadline, a.cur.next, h.GetParts())}
}

// Release returns the reservation of the snapshot Add returned last.
func (a *Assembler) Release() {
	if a.held {
		a.held = false
		a.cfg.Budget.release(a.cfg.Cluster)
	}
}

// drop forgets the snapshot in transit and returns its reservation.
func (a *Assembler) drop() {
	if a.cur != nil || a.held {
		a.cur, a.held = nil, false
		a.cfg.Budget.release(a.cfg.Cluster)
	}
}

// Close drops everything; the stream ended.
func (a *Assembler) Close() { a.drop() }

// WithoutHash is a shallow copy of s with every field but the hash: its
// deterministic encoding is what a snapshot's hash covers, and what the
// parts of a chunked push carry.
func WithoutHash(s *relaypb.Snapshot) *relaypb.Snapshot {
	c := &relaypb.Snapshot{}
	src, dst := s.ProtoReflect(), c.ProtoReflect()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() != "hash" {
			dst.Set(fd, v)
		}
		return true
	})
	dst.SetUnknown(src.GetUnknown())
	return c
}

// IsHexSHA256 reports whether s is a snapshot hash: 64 lower-case hex digits.
func IsHexSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Costs of decoded elements beyond their bytes, measured upper bounds
// (TestDecodeCostBoundsAllocation): a message is its Go struct, rounded up
// to a power of two, plus its slot in a list as the list grows (Go grows
// long slices by a quarter, so a slot is allocated about five times); a
// map's first entry allocates its first group, entries up to the eighth
// fit in it, the ninth grows the table, and later ones cost their share.
const (
	listSlotCost      = 48
	scalarListCost    = 96
	mapFirstEntryCost = 384
	mapSmallEntryCost = 32
	mapGrowCost       = 1024
	mapEntryCost      = 192
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
