package relaytest_test

import (
	"testing"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// Every snapshot the builders make passes the server's own validation for
// its cluster, with the hash snapshothash.Of gives, and only for it.
func TestBuiltSnapshotsAreValid(t *testing.T) {
	for name, s := range map[string]*relaypb.Snapshot{
		"default spec": relaytest.Spec{}.Snapshot(),
		"workloads":    relaytest.Spec{Cluster: "east", Workloads: 3}.Snapshot(),
		"both":         relaytest.Spec{Cluster: "east", Workloads: 300, Destinations: 300}.Snapshot(),
		"endpoints":    relaytest.Spec{Cluster: "east", Destinations: 300, Endpoints: true}.Snapshot(),
		"Snapshot(n)":  relaytest.Snapshot(5),
		"rich":         relaytest.Rich{Namespaces: 2}.Snapshot("east"),
	} {
		t.Run(name, func(t *testing.T) {
			cluster := s.GetCluster()
			require.NoError(t, relay.ValidateSnapshot(cluster, s, relay.SnapshotLimits{MaxBytes: 64 << 20, MaxObjects: 1 << 20}))
			assert.Equal(t, snapshothash.Of(s), s.GetHash())
			require.Len(t, s.GetMeshes(), 1)
			assert.Equal(t, cluster+".local", s.GetMeshes()[0].GetTrustDomain())
			assert.Error(t, relay.ValidateSnapshot("west", s, relay.SnapshotLimits{MaxBytes: 64 << 20, MaxObjects: 1 << 20}), "another cluster's")
		})
	}
}

// A Spec has what it asks for and nothing else: the sizes and limits
// tests derive from it depend on that.
func TestSpecHasWhatItAsksFor(t *testing.T) {
	s := relaytest.Spec{Workloads: 2, Destinations: 3}.Snapshot()
	assert.Equal(t, "cluster-1", s.GetCluster())
	assert.Len(t, s.GetWorkloads(), 2)
	require.Len(t, s.GetDestinations(), 3)
	for _, d := range s.GetDestinations() {
		assert.Empty(t, d.GetEndpoints())
	}
	assert.Empty(t, relaytest.Spec{Workloads: 2}.Snapshot().GetDestinations())
	with := relaytest.Spec{Destinations: 300, Endpoints: true}.Snapshot()
	ips := map[string]bool{}
	for _, d := range with.GetDestinations() {
		require.Len(t, d.GetEndpoints(), 1)
		ips[d.GetEndpoints()[0].GetIp()] = true
	}
	assert.Len(t, ips, 300, "one address per endpoint")
	assert.True(t, proto.Equal(relaytest.Snapshot(7), relaytest.Spec{Destinations: 7, Endpoints: true}.Snapshot()))
}

// Rich has 200 pods, 20 Workloads and 20 Destinations per namespace, and
// every pod is an endpoint of two Destinations: 500 namespaces are the
// 100,000-pod cluster of the large-snapshot tests and benchmarks.
func TestRichHasTheShapeItSays(t *testing.T) {
	r := relaytest.Rich{Namespaces: 5}
	s := r.Snapshot("cluster-1")
	endpoints := map[string]int{}
	for _, d := range s.GetDestinations() {
		for _, e := range d.GetEndpoints() {
			endpoints[e.GetIp()]++
		}
	}
	assert.Equal(t, 1000, r.Pods())
	assert.Equal(t, 100000, relaytest.Rich{Namespaces: 500}.Pods())
	assert.Len(t, s.GetDestinations(), 100)
	assert.Len(t, s.GetWorkloads(), 100)
	assert.Len(t, endpoints, r.Pods(), "one endpoint address per pod")
	for ip, n := range endpoints {
		require.Equal(t, 2, n, "%s is an endpoint of two Destinations", ip)
	}
}

// Rehash makes a changed snapshot valid again.
func TestRehash(t *testing.T) {
	s := relaytest.Spec{Workloads: 1}.Snapshot()
	s.Workloads[0].ServiceAccount = "changed"
	require.Error(t, relay.ValidateSnapshot("cluster-1", s, relay.SnapshotLimits{}))
	assert.Same(t, s, relaytest.Rehash(s))
	require.NoError(t, relay.ValidateSnapshot("cluster-1", s, relay.SnapshotLimits{}))
}
