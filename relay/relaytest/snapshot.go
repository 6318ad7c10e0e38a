// Package relaytest has test fixtures of the wire: the one builder of
// synthetic snapshots (Spec for small ones, Rich for a realistic cluster,
// Rehash after a change), the fixed Golden snapshot, and their chunked
// framing (Discovery.PushChunked). It is imported only by tests and the
// test harnesses under test/; the in-process server the tests run is
// server/servertest.
package relaytest

import (
	"cmp"
	"fmt"
	"testing"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
)

// Spec is the shape of a small valid snapshot, the one builder of the
// synthetic snapshots tests push, store and check: cluster's one mesh
// (istiod in istio-system, trust domain <cluster>.local) and apps app-0,
// app-1, … in namespace bookinfo, each app a Deployment (Workloads), a
// Service selecting it (Destinations) or both. What is not given is left
// out, so a test's limits and sizes follow from what it asks for.
type Spec struct {
	// Cluster the snapshot and every object in it belong to; default
	// cluster-1.
	Cluster string
	// Workloads: Deployments app-0, app-1, … with pod labels app=<name>.
	Workloads int
	// Destinations: Services app-0, app-1, … selecting app=<name>, one
	// port (9080, http).
	Destinations int
	// Endpoints gives each Destination one endpoint (10.0.x.y, labels
	// app=<name>); without it a Destination has none.
	Endpoints bool
}

// Snapshot is the snapshot of s, with its hash (snapshothash.Of).
func (s Spec) Snapshot() *relaypb.Snapshot {
	cluster := cmp.Or(s.Cluster, "cluster-1")
	snap := &relaypb.Snapshot{Cluster: cluster, Meshes: []*relaypb.Mesh{{Name: "istiod", Namespace: "istio-system", Cluster: cluster, TrustDomain: cluster + ".local"}}}
	for i := range s.Workloads {
		app := fmt.Sprintf("app-%d", i)
		snap.Workloads = append(snap.Workloads, &relaypb.Workload{Name: app, Namespace: "bookinfo", Cluster: cluster, Kind: "Deployment",
			PodLabels: map[string]string{"app": app}, MeshName: "istiod", MeshNamespace: "istio-system"})
	}
	for i := range s.Destinations {
		app := fmt.Sprintf("app-%d", i)
		d := &relaypb.Destination{Name: app, Namespace: "bookinfo", Cluster: cluster,
			Selector: map[string]string{"app": app}, Ports: []*relaypb.ServicePort{{Port: 9080, Name: "http"}},
			MeshName: "istiod", MeshNamespace: "istio-system"}
		if s.Endpoints {
			d.Endpoints = []*relaypb.Endpoint{{Ip: fmt.Sprintf("10.0.%d.%d", i>>8&255, i&255), Labels: map[string]string{"app": app}}}
		}
		snap.Destinations = append(snap.Destinations, d)
	}
	return Rehash(snap)
}

// Snapshot is a valid snapshot of cluster-1 with n destinations, each
// with one endpoint: Spec{Destinations: n, Endpoints: true}.
func Snapshot(n int) *relaypb.Snapshot {
	return Spec{Destinations: n, Endpoints: true}.Snapshot()
}

// Ambient is a valid snapshot of a mesh in the middle of a migration to
// ambient: Spec{Workloads: 2, Destinations: 1, Endpoints: true} with the
// mesh ambient (ztunnel, a ready waypoint "waypoint" in bookinfo), app-0
// ambient and bound to the waypoint, app-1 a sidecar, and Destination
// app-0 mixed, bound to the waypoint, its endpoint captured.
func Ambient() *relaypb.Snapshot {
	s := Spec{Workloads: 2, Destinations: 1, Endpoints: true}.Snapshot()
	m := s.Meshes[0]
	m.Ambient, m.Ztunnel = true, true
	m.Waypoints = []*relaypb.Waypoint{{Name: "waypoint", Namespace: "bookinfo", TrafficType: "service", ServiceAccount: "waypoint", Ready: true}}
	s.Workloads[0].DataPlaneMode = "ambient"
	s.Workloads[0].Waypoint = &relaypb.WaypointRef{Name: "waypoint", Namespace: "bookinfo"}
	d := s.Destinations[0]
	d.Waypoint = &relaypb.WaypointRef{Name: "waypoint", Namespace: "bookinfo"}
	d.Endpoints[0].Ambient = true
	d.DataPlaneMode = "mixed"
	return Rehash(s)
}

// Rehash sets s's hash to the hash of its content (snapshothash.Of), for
// a test that changed a valid snapshot and wants it valid again, and
// returns s.
func Rehash(s *relaypb.Snapshot) *relaypb.Snapshot {
	s.Hash = snapshothash.Of(s)
	return s
}

// Encode is what the agent sends of s: the deterministic encoding without
// the hash, and its SHA-256.
func Encode(t testing.TB, s *relaypb.Snapshot) ([]byte, string) {
	t.Helper()
	b, err := snapshothash.Encode(s)
	require.NoError(t, err)
	h := snapshothash.New()
	h.Write(b)
	return b, h.Sum()
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

// Golden is a fixed snapshot that uses every field of the wire
// type, maps with several entries (their encoding order is the
// deterministic one), repeated fields and unknown fields; with
// destinations > 0 it grows by that many destinations (enough of them
// make a chunked push of several parts). Its hash field is set to
// something that is not its hash: the hash field is not hashed. Tests
// compare its hash and its chunked framing with values recorded before
// the code that computes them moved (TestSnapshotHashIsUnchanged,
// TestSendChunkedFramingIsUnchanged): a change there is a change of the
// wire.
func Golden(destinations int) *relaypb.Snapshot {
	s := &relaypb.Snapshot{
		Cluster: "cluster-golden",
		Meshes: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "istio-system", Cluster: "cluster-golden", Revision: "default", Version: "1.31.1",
			TrustDomain: "golden.local", IstiodServiceAccount: "istiod", SmartDnsProxying: true,
			PodLabels: map[string]string{"app": "istiod", "istio": "pilot", "istio.io/rev": "default"},
			Gateways: []*relaypb.Gateway{{Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest",
				WorkloadLabels: map[string]string{"istio": "eastwestgateway", "app": "istio-eastwestgateway"}, ExternalAddress: "203.0.113.10", TlsPort: 15443}},
		}},
		Workloads: []*relaypb.Workload{
			{Name: "reviews-v1", Namespace: "bookinfo", Cluster: "cluster-golden", Kind: "Deployment", ServiceAccount: "reviews",
				PodLabels: map[string]string{"app": "reviews", "version": "v1"}, MeshName: "istiod", MeshNamespace: "istio-system"},
			{Name: "mysql", Namespace: "db", Cluster: "cluster-golden", Kind: "StatefulSet",
				PodLabels: map[string]string{"app": "mysql"}, MeshName: "istiod", MeshNamespace: "istio-system"},
		},
		Destinations: []*relaypb.Destination{{
			Name: "reviews", Namespace: "bookinfo", Cluster: "cluster-golden",
			Selector: map[string]string{"app": "reviews"}, Labels: map[string]string{"app": "reviews", "team": "books"},
			Ports:       []*relaypb.ServicePort{{Port: 9080, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "9080"}, {Port: 9090, Name: "grpc", TargetPort: "grpc"}},
			Subsets:     map[string]*relaypb.LabelValues{"version": {Values: []string{"v1", "v2"}}, "zone": {Values: []string{"a"}}},
			ServiceType: "LoadBalancer", ExternalAddresses: []string{"198.51.100.7", "reviews.example.com"},
			MeshName: "istiod", MeshNamespace: "istio-system",
			Endpoints: []*relaypb.Endpoint{{Ip: "10.1.0.1", Labels: map[string]string{"app": "reviews", "version": "v1"}}, {Ip: "10.1.0.2", Labels: map[string]string{"app": "reviews", "version": "v2"}}},
		}},
		Hash: "ignored: the hash field is not hashed",
	}
	for i := range destinations {
		d := &relaypb.Destination{Name: fmt.Sprintf("app-%05d", i), Namespace: "load", Cluster: "cluster-golden",
			Selector: map[string]string{"app": fmt.Sprintf("app-%05d", i)}, Ports: []*relaypb.ServicePort{{Port: 8080, Name: "http"}},
			MeshName: "istiod", MeshNamespace: "istio-system"}
		for j := range 8 {
			d.Endpoints = append(d.Endpoints, &relaypb.Endpoint{Ip: fmt.Sprintf("10.%d.%d.%d", 2+i>>8, i&255, j), Labels: map[string]string{"app": d.Name, "pod-template-hash": fmt.Sprintf("%08x", i*8+j)}})
		}
		s.Destinations = append(s.Destinations, d)
	}
	// An unknown field (a newer agent's): 99, length-delimited.
	s.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), []byte("from a newer agent")))
	return s
}
