package relay_test

import (
	"fmt"
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
		{"multi-network settings of a sidecar mesh", "meshes[0].multiNetwork", func(s *relaypb.Snapshot) {
			s.Meshes[0].Ambient, s.Meshes[0].Ztunnel, s.Meshes[0].Waypoints, s.Meshes[0].GlobalServiceScope = false, false, nil, true
		}},
		{"network not a label value", "meshes[0].network", func(s *relaypb.Snapshot) { s.Meshes[0].Network = "net 1" }},
		{"east-west gateway without network", "meshes[0].eastWestGateways[0].network", func(s *relaypb.Snapshot) { withEastWest(s).Network = "" }},
		{"east-west gateway hostile network", "meshes[0].eastWestGateways[0].network", func(s *relaypb.Snapshot) { withEastWest(s).Network = "net\x00" + strings.Repeat("n", 100) }},
		{"east-west gateway without HBONE port", "meshes[0].eastWestGateways[0].hbonePort", func(s *relaypb.Snapshot) { withEastWest(s).HbonePort = 0 }},
		{"east-west gateway port out of range", "meshes[0].eastWestGateways[0].hbonePort", func(s *relaypb.Snapshot) { withEastWest(s).HbonePort = 70000 }},
		{"east-west gateway bad address", "meshes[0].eastWestGateways[0].addresses[1]", func(s *relaypb.Snapshot) {
			g := withEastWest(s)
			g.Addresses = append(g.Addresses, "not an address")
		}},
		{"east-west gateway on loopback", "meshes[0].eastWestGateways[0].addresses[1]", func(s *relaypb.Snapshot) {
			g := withEastWest(s)
			g.Addresses = append(g.Addresses, "127.0.0.1")
		}},
		{"east-west gateway link-local", "meshes[0].eastWestGateways[0].addresses[0]", func(s *relaypb.Snapshot) { withEastWest(s).Addresses = []string{"169.254.169.254"} }},
		{"east-west gateway unspecified", "meshes[0].eastWestGateways[0].addresses[0]", func(s *relaypb.Snapshot) { withEastWest(s).Addresses = []string{"::"} }},
		{"east-west gateway too many addresses", "addresses, at most 16", func(s *relaypb.Snapshot) {
			g := withEastWest(s)
			for range 16 {
				g.Addresses = append(g.Addresses, "192.0.2.1")
			}
		}},
		{"east-west gateway bad service account", "meshes[0].eastWestGateways[0].serviceAccount", func(s *relaypb.Snapshot) { withEastWest(s).ServiceAccount = "../x" }},
		{"east-west gateway bad namespace", "meshes[0].eastWestGateways[0].namespace", func(s *relaypb.Snapshot) { withEastWest(s).Namespace = "Istio System" }},
		{"east-west gateway twice", "appears twice", func(s *relaypb.Snapshot) {
			s.Meshes[0].EastWestGateways = append(s.Meshes[0].EastWestGateways, withEastWest(s))
		}},
		{"east-west gateways of a sidecar mesh", "meshes[0].eastWestGateways", func(s *relaypb.Snapshot) {
			withEastWest(s)
			s.Meshes[0].Ambient, s.Meshes[0].Ztunnel, s.Meshes[0].Waypoints = false, false, nil
		}},
		{"too many east-west gateways", "east-west gateways, at most 64", func(s *relaypb.Snapshot) {
			for i := range 65 {
				s.Meshes[0].EastWestGateways = append(s.Meshes[0].EastWestGateways, &relaypb.EastWestGateway{Name: fmt.Sprintf("ew-%d", i), Namespace: "istio-system", Network: "net-1", HbonePort: 15008})
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

// withEastWest gives the ambient snapshot's mesh a network and one valid
// east-west gateway, and returns the gateway.
func withEastWest(s *relaypb.Snapshot) *relaypb.EastWestGateway {
	g := &relaypb.EastWestGateway{Name: "istio-eastwest", Namespace: "istio-system", Network: "net-1", HbonePort: 15008, ServiceAccount: "istio-eastwest", Addresses: []string{"192.0.2.10"}}
	s.Meshes[0].Network = "net-1"
	s.Meshes[0].EastWestGateways = []*relaypb.EastWestGateway{g}
	return g
}

func TestAmbientSnapshotWithEastWestGatewayIsValid(t *testing.T) {
	s := relaytest.Ambient()
	withEastWest(s)
	require.NoError(t, relay.ValidateSnapshot("cluster-1", relaytest.Rehash(s), relay.SnapshotLimits{}))
}
