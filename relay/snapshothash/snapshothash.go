// Package snapshothash is the one definition of a discovery snapshot's
// hash: the lower-case hex SHA-256 of the deterministic protobuf encoding
// of the snapshot without its hash field. The agent's discovery sets it,
// the agent's chunk encoder announces it, the server's assembler and
// validator check it, and test fixtures compute it — all through this
// package, so they cannot disagree.
//
// It imports only the wire types (relay/proto), so every package that
// touches snapshots may use it, relay's own test fixtures (relaytest)
// included.
package snapshothash

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Of is the hash of s. It does not modify s. A nil snapshot hashes like
// an empty one. It returns "" when s does not encode (a string field that
// is not valid UTF-8), which discovery never produces.
func Of(s *relaypb.Snapshot) string {
	b, err := Encode(s)
	if err != nil {
		return ""
	}
	h := New()
	h.Write(b)
	return h.Sum()
}

// Encode is the deterministic encoding of s without its hash field: the
// bytes its hash covers, and what the parts of a chunked push carry.
func Encode(s *relaypb.Snapshot) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(WithoutHash(s))
}

// WithoutHash is a shallow copy of s with every field but the hash
// (unknown fields included, and any field added to Snapshot later): cheap,
// and what Encode encodes. A nil s gives an empty snapshot.
func WithoutHash(s *relaypb.Snapshot) *relaypb.Snapshot {
	c := &relaypb.Snapshot{}
	if s == nil {
		return c
	}
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

// Valid reports whether h has the form of a snapshot hash: 64 lower-case
// hex digits.
func Valid(h string) bool {
	if len(h) != 64 {
		return false
	}
	for _, c := range []byte(h) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Hasher hashes an encoding that arrives (or leaves) in pieces: the
// parts of a chunked push. Its Sum over a snapshot's Encode is Of.
type Hasher struct{ h hash.Hash }

// New starts a Hasher.
func New() *Hasher { return &Hasher{h: sha256.New()} }

// Write adds p to what is hashed.
func (h *Hasher) Write(p []byte) { h.h.Write(p) }

// Sum is the hash of everything written so far, in a snapshot hash's form.
func (h *Hasher) Sum() string { return hex.EncodeToString(h.h.Sum(nil)) }
