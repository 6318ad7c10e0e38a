// Package relaytest has test fixtures of the wire: valid snapshots and
// their chunked framing (Discovery.PushChunked). It is imported only from
// _test.go files; the in-process server the tests run is
// server/servertest.
package relaytest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// Snapshot is a valid snapshot of cluster-1 with n destinations.
func Snapshot(n int) *relaypb.Snapshot {
	s := &relaypb.Snapshot{Cluster: "cluster-1", Meshes: []*relaypb.Mesh{{Name: "istiod", Namespace: "istio-system", Cluster: "cluster-1", TrustDomain: "cluster-1.local"}}}
	for i := range n {
		s.Destinations = append(s.Destinations, &relaypb.Destination{Name: fmt.Sprintf("app-%d", i), Namespace: "bookinfo", Cluster: "cluster-1",
			Selector: map[string]string{"app": fmt.Sprintf("app-%d", i)}, Ports: []*relaypb.ServicePort{{Port: 9080, Name: "http"}},
			MeshName: "istiod", MeshNamespace: "istio-system",
			Endpoints: []*relaypb.Endpoint{{Ip: fmt.Sprintf("10.0.%d.%d", i>>8&255, i&255), Labels: map[string]string{"app": fmt.Sprintf("app-%d", i)}}}})
	}
	s.Hash = discovery.Hash(s)
	return s
}

// Encode is what the agent sends of s: the deterministic encoding without
// the hash, and its SHA-256.
func Encode(t testing.TB, s *relaypb.Snapshot) ([]byte, string) {
	t.Helper()
	c := proto.CloneOf(s)
	c.Hash = ""
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// Chunked frames data as a header, parts of partSize and an end.
func Chunked(cluster, hash string, data []byte, partSize int) []*relaypb.SnapshotChunk {
	parts := (len(data) + partSize - 1) / partSize
	out := []*relaypb.SnapshotChunk{Header(cluster, hash, len(data), parts)}
	for i := range parts {
		out = append(out, Part(i, data[i*partSize:min(len(data), (i+1)*partSize)]))
	}
	return append(out, End(hash))
}

// Header announces a snapshot of size bytes in parts.
func Header(cluster, hash string, size, parts int) *relaypb.SnapshotChunk {
	return &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Header{Header: &relaypb.SnapshotHeader{Cluster: cluster, Hash: hash, Size: uint64(size), Parts: uint32(parts)}}}
}

// Part is part i of a snapshot.
func Part(i int, data []byte) *relaypb.SnapshotChunk {
	return &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_Part{Part: &relaypb.SnapshotPart{Index: uint32(i), Data: data}}}
}

// End ends the snapshot of hash.
func End(hash string) *relaypb.SnapshotChunk {
	return &relaypb.SnapshotChunk{Chunk: &relaypb.SnapshotChunk_End{End: &relaypb.SnapshotEnd{Hash: hash}}}
}
