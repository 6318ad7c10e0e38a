package snapshothash_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// Hashes of relaytest.Golden recorded with discovery.Hash before the hash
// moved here (issue 29, at 7305c91): agents and servers of both sides of
// that change must agree on every snapshot.
const (
	goldenHash      = "f8d05a472279d7ebe82d5bde6ca6cfdcf4c12dbd2cc309f96acab0952e99b5da"
	goldenHash4000  = "31d2495827e53c64989528d0b73e77e42ea52032aa699ecc94a268412f8a17ae"
	goldenSize4000  = 2366346
	emptySHA256     = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	goldenEncodeLen = 810
)

func TestSnapshotHashIsUnchanged(t *testing.T) {
	assert.Equal(t, goldenHash, snapshothash.Of(relaytest.Golden(0)))
	assert.Equal(t, goldenHash4000, snapshothash.Of(relaytest.Golden(4000)))
	b, err := snapshothash.Encode(relaytest.Golden(4000))
	require.NoError(t, err)
	assert.Len(t, b, goldenSize4000)
	assert.Equal(t, emptySHA256, snapshothash.Of(nil), "nil hashes like an empty snapshot: the SHA-256 of no bytes")
	assert.Equal(t, emptySHA256, snapshothash.Of(&relaypb.Snapshot{}))
}

// TestHashIsSHA256OfEncodingWithoutHash: Of is the SHA-256 of Encode,
// Encode is the deterministic encoding without the hash field, and the
// streaming Hasher agrees with Of however the bytes are split.
func TestHashIsSHA256OfEncodingWithoutHash(t *testing.T) {
	s := relaytest.Golden(0)
	b, err := snapshothash.Encode(s)
	require.NoError(t, err)
	require.Len(t, b, goldenEncodeLen)
	sum := sha256.Sum256(b)
	assert.Equal(t, hex.EncodeToString(sum[:]), snapshothash.Of(s))

	c := proto.CloneOf(s)
	c.Hash = ""
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	require.NoError(t, err)
	assert.Equal(t, want, b)

	for _, split := range []int{0, 1, 7, 64, len(b) - 1, len(b)} {
		h := snapshothash.New()
		h.Write(b[:split])
		h.Write(b[split:])
		assert.Equal(t, snapshothash.Of(s), h.Sum(), "split at %d", split)
	}
}

// TestHashIgnoresOnlyTheHashField: setting the hash field changes nothing;
// every other change does, unknown fields included; Of and WithoutHash
// leave their argument alone.
func TestHashIgnoresOnlyTheHashField(t *testing.T) {
	s := relaytest.Golden(0)
	h := snapshothash.Of(s)
	s.Hash = "anything"
	assert.Equal(t, h, snapshothash.Of(s))
	assert.Equal(t, "anything", s.Hash, "Of does not modify its argument")
	c := snapshothash.WithoutHash(s)
	assert.Empty(t, c.GetHash())
	assert.Equal(t, "anything", s.Hash, "WithoutHash does not modify its argument")
	assert.Equal(t, s.ProtoReflect().GetUnknown(), c.ProtoReflect().GetUnknown(), "unknown fields are kept")

	for name, mutate := range map[string]func(*relaypb.Snapshot){
		"cluster":        func(s *relaypb.Snapshot) { s.Cluster = "x" },
		"mesh label":     func(s *relaypb.Snapshot) { s.Meshes[0].PodLabels["x"] = "y" },
		"workload order": func(s *relaypb.Snapshot) { s.Workloads[0], s.Workloads[1] = s.Workloads[1], s.Workloads[0] },
		"subset value":   func(s *relaypb.Snapshot) { s.Destinations[0].Subsets["zone"].Values[0] = "b" },
		"unknown field":  func(s *relaypb.Snapshot) { s.ProtoReflect().SetUnknown(nil) },
	} {
		c := relaytest.Golden(0)
		mutate(c)
		assert.NotEqual(t, h, snapshothash.Of(c), name)
	}
}

// TestHashOfUnencodableSnapshotIsEmpty: a string that is not UTF-8 does
// not encode, and such a snapshot has no hash ("" is never Valid).
func TestHashOfUnencodableSnapshotIsEmpty(t *testing.T) {
	s := &relaypb.Snapshot{Cluster: "bad\xff"}
	assert.Empty(t, snapshothash.Of(s))
	_, err := snapshothash.Encode(s)
	assert.Error(t, err)
	assert.False(t, snapshothash.Valid(snapshothash.Of(s)))
}

func TestValid(t *testing.T) {
	assert.True(t, snapshothash.Valid(goldenHash))
	for _, h := range []string{"", goldenHash[:63], goldenHash + "0", "F" + goldenHash[1:], "g" + goldenHash[1:], " " + goldenHash[1:], "é" + goldenHash[2:]} {
		assert.False(t, snapshothash.Valid(h), "%q", h)
	}
}

// FuzzHasherAgreesWithOf: however an encoding is split, the Hasher's sum
// is the hash of the snapshot it encodes, and Valid.
func FuzzHasherAgreesWithOf(f *testing.F) {
	f.Add("cluster-1", uint(3))
	f.Add("", uint(0))
	f.Fuzz(func(t *testing.T, cluster string, split uint) {
		s := &relaypb.Snapshot{Cluster: cluster}
		b, err := snapshothash.Encode(s)
		if err != nil {
			assert.Empty(t, snapshothash.Of(s))
			return
		}
		k := int(split % uint(len(b)+1))
		h := snapshothash.New()
		h.Write(b[:k])
		h.Write(b[k:])
		assert.Equal(t, snapshothash.Of(s), h.Sum())
		assert.True(t, snapshothash.Valid(h.Sum()))
	})
}
