package relay_test

import (
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAmbientSnapshotIsValid(t *testing.T) {
	require.NoError(t, relay.ValidateSnapshot("cluster-1", relaytest.Ambient(), relay.SnapshotLimits{}))
}

// TestHostileAmbientSnapshotsAreRefused: every malformed, hostile or
// oversized ambient field gets the snapshot refused with the field's path.
func TestHostileAmbientSnapshotsAreRefused(t *testing.T) {
	tests := []struct {
		name, want string
		edit       func(*relaypb.Snapshot)
	}{
		{"unknown destination mode", "destinations[0].dataPlaneMode", func(s *relaypb.Snapshot) { s.Destinations[0].DataPlaneMode = "sidecar" }},
		{"unknown mode", "workloads[0].dataPlaneMode", func(s *relaypb.Snapshot) { s.Workloads[0].DataPlaneMode = "sidecarless" }},
		{"explicit sidecar mode", "workloads[1].dataPlaneMode", func(s *relaypb.Snapshot) { s.Workloads[1].DataPlaneMode = "sidecar" }},
		{"sidecar bound to a waypoint", "workloads[1].waypoint", func(s *relaypb.Snapshot) {
			s.Workloads[1].Waypoint = &relaypb.WaypointRef{Name: "waypoint", Namespace: "bookinfo"}
		}},
		{"waypoint ref without name", "workloads[0].waypoint.name", func(s *relaypb.Snapshot) { s.Workloads[0].Waypoint.Name = "" }},
		{"waypoint ref bad namespace", "destinations[0].waypoint.namespace", func(s *relaypb.Snapshot) { s.Destinations[0].Waypoint.Namespace = "../kube-system" }},
		{"waypoint ref oversized", "destinations[0].waypoint.name", func(s *relaypb.Snapshot) { s.Destinations[0].Waypoint.Name = strings.Repeat("w", 300) }},
		{"waypoint unknown traffic type", "meshes[0].waypoints[0].trafficType", func(s *relaypb.Snapshot) { s.Meshes[0].Waypoints[0].TrafficType = "everything" }},
		{"waypoint bad name", "meshes[0].waypoints[0].name", func(s *relaypb.Snapshot) { s.Meshes[0].Waypoints[0].Name = "Way Point" }},
		{"waypoint bad service account", "meshes[0].waypoints[0].serviceAccount", func(s *relaypb.Snapshot) { s.Meshes[0].Waypoints[0].ServiceAccount = "a/b" }},
		{"waypoint twice", "appears twice", func(s *relaypb.Snapshot) {
			s.Meshes[0].Waypoints = append(s.Meshes[0].Waypoints, s.Meshes[0].Waypoints[0])
		}},
		{"waypoints of a sidecar mesh", "meshes[0].waypoints", func(s *relaypb.Snapshot) { s.Meshes[0].Ambient = false }},
		{"ztunnel of a sidecar mesh", "meshes[0].ztunnel", func(s *relaypb.Snapshot) { s.Meshes[0].Ambient, s.Meshes[0].Waypoints = false, nil }},
		{"too many waypoints", "waypoints, at most 1024", func(s *relaypb.Snapshot) {
			for i := range 1025 {
				s.Meshes[0].Waypoints = append(s.Meshes[0].Waypoints, &relaypb.Waypoint{Name: "w" + strings.Repeat("x", i%7) + string(rune('a'+i%26)), Namespace: "n", TrafficType: "all"})
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := relaytest.Ambient()
			tt.edit(s)
			err := relay.ValidateSnapshot("cluster-1", relaytest.Rehash(s), relay.SnapshotLimits{})
			require.ErrorIs(t, err, relay.ErrSnapshotRefused)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
