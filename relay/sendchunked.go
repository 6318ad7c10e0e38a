package relay

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ErrSnapshotTooLarge: a snapshot over the limit is not sent; the server
// keeps the last one it accepted.
var ErrSnapshotTooLarge = errors.New("snapshot too large")

// ChunkSender is the sending side of a PushChunked stream.
type ChunkSender interface {
	Send(*relaypb.SnapshotChunk) error
}

// SentSnapshot is what SendChunked sent of a snapshot.
type SentSnapshot struct {
	// Hash is the one the header and the end carry, and the server's ack
	// will: the snapshot's own hash field when it has a hash's form, else
	// its hash (snapshothash.Of).
	Hash string
	// Sum is the hash of the parts as sent, set once they all were: Hash,
	// unless the snapshot's hash field is not the hash of its content (the
	// server then refuses it).
	Sum string
	// Size in bytes of all parts, and their number.
	Size, Parts int
}

// SendChunked sends snap on stream as a header, parts of
// MaxSnapshotPartBytes and an end: the framing of Discovery.PushChunked
// that Assembler decodes. The parts carry snapshothash.Encode(snap), so the
// header names snap's own hash; they are encoded object by object while
// the first ones travel, so the server decodes while the agent encodes. A
// snapshot of more than maxBytes is not sent (ErrSnapshotTooLarge).
func SendChunked(stream ChunkSender, snap *relaypb.Snapshot, maxBytes int) (SentSnapshot, error) {
	c := snapshothash.WithoutHash(snap)
	out := SentSnapshot{Hash: snap.GetHash()}
	if !snapshothash.Valid(out.Hash) {
		// Not a snapshot of discovery.Build: hash it first.
		b, err := snapshothash.Encode(snap)
		if err != nil {
			return out, fmt.Errorf("encode snapshot: %w", err)
		}
		h := snapshothash.New()
		h.Write(b)
		out.Hash = h.Sum()
	}
	// Size caches the size of every message, which the encoding below
	// reuses instead of computing it again.
	size := proto.Size(c)
	if size > maxBytes {
		return out, fmt.Errorf("%w: snapshot of %d bytes exceeds the %d-byte limit; the server keeps the last accepted one", ErrSnapshotTooLarge, size, maxBytes)
	}
	parts := (size + MaxSnapshotPartBytes - 1) / MaxSnapshotPartBytes
	out.Size, out.Parts = size, parts
	if err := stream.Send(&relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Header{Header: &relaypb.SnapshotHeader{
		Cluster: snap.GetCluster(), Hash: out.Hash, Size: uint64(size), Parts: uint32(parts)}}}); err != nil {
		return out, err
	}
	w := &partWriter{stream: stream, sum: snapshothash.New(), buf: make([]byte, 0, 2*MaxSnapshotPartBytes)}
	if err := encodeFields(c, w); err != nil {
		return out, err
	}
	if err := w.flush(true); err != nil {
		return out, err
	}
	if w.sent != size || w.next != parts {
		return out, fmt.Errorf("encode snapshot: %d bytes in %d parts, but its size is %d bytes", w.sent, w.next, size)
	}
	out.Sum = w.sum.Sum()
	return out, stream.Send(&relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_End{End: &relaypb.SnapshotEnd{Hash: out.Hash}}})
}

// encodeFields appends the deterministic encoding of s, whose sizes
// proto.Size cached, to w one top-level field at a time: field-number
// order, repeated elements in order, unknown fields last — the order the
// deterministic encoding of the whole message has.
func encodeFields(s *relaypb.Snapshot, w *partWriter) error {
	opts := proto.MarshalOptions{Deterministic: true, UseCachedSize: true}
	m := s.ProtoReflect()
	fields := m.Descriptor().Fields()
	// In field-number order, which need not be the order of declaration.
	ordered := make([]protoreflect.FieldDescriptor, fields.Len())
	for i := range ordered {
		ordered[i] = fields.Get(i)
	}
	slices.SortFunc(ordered, func(a, b protoreflect.FieldDescriptor) int { return cmp.Compare(a.Number(), b.Number()) })
	for _, fd := range ordered {
		if !m.Has(fd) {
			continue
		}
		if fd.Kind() != protoreflect.MessageKind || !fd.IsList() {
			// Another field: encode a message holding only it (no size of
			// its own is cached).
			one := &relaypb.Snapshot{}
			one.ProtoReflect().Set(fd, m.Get(fd))
			b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(w.buf, one)
			if err != nil {
				return fmt.Errorf("encode snapshot: %w", err)
			}
			w.buf = b
		} else {
			list := m.Get(fd).List()
			for j := range list.Len() {
				msg := list.Get(j).Message().Interface()
				w.buf = protowire.AppendTag(w.buf, fd.Number(), protowire.BytesType)
				w.buf = protowire.AppendVarint(w.buf, uint64(opts.Size(msg)))
				b, err := opts.MarshalAppend(w.buf, msg)
				if err != nil {
					return fmt.Errorf("encode snapshot: %w", err)
				}
				w.buf = b
				if err := w.flush(false); err != nil {
					return err
				}
			}
		}
		if err := w.flush(false); err != nil {
			return err
		}
	}
	w.buf = append(w.buf, m.GetUnknown()...)
	return nil
}

// partWriter sends what is appended to buf in parts of
// MaxSnapshotPartBytes, hashing it on the way.
type partWriter struct {
	stream ChunkSender
	sum    *snapshothash.Hasher
	buf    []byte
	sent   int
	next   int
}

// flush sends every full part of buf, and with last also the rest.
func (w *partWriter) flush(last bool) error {
	for len(w.buf) >= MaxSnapshotPartBytes || last && len(w.buf) > 0 {
		n := min(len(w.buf), MaxSnapshotPartBytes)
		// A message MUST NOT change once sent: each part has its own bytes.
		data := bytes.Clone(w.buf[:n])
		w.sum.Write(data)
		if err := w.stream.Send(&relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Part{Part: &relaypb.SnapshotPart{Index: uint32(w.next), Data: data}}}); err != nil {
			return err
		}
		w.sent += n
		w.next++
		w.buf = append(w.buf[:0], w.buf[n:]...)
	}
	return nil
}
