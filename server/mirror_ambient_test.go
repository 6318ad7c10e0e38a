package server_test

import (
	"testing"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestAmbientSnapshotBecomesTheAPIView: a mesh in the middle of a migration
// says ambient (ztunnel, waypoints) and both data-plane modes; a workload
// from an agent that sends no mode is a sidecar; waypoint bindings and
// captured endpoints reach the Workload and Destination; and every object
// passes the CRD schema the apiserver enforces.
func TestAmbientSnapshotBecomesTheAPIView(t *testing.T) {
	objs, err := server.DiscoveredObjects(relaytest.Ambient(), "relaymesh")
	require.NoError(t, err)
	var (
		mesh      discoveryv1alpha1.Mesh
		workloads = map[string]discoveryv1alpha1.Workload{}
		dest      discoveryv1alpha1.Destination
	)
	for _, o := range objs {
		require.Empty(t, schemaErrors(t, o.Object), "%s %s", o.Object.GetKind(), o.Object.GetName())
		switch o.Object.GetKind() {
		case "Mesh":
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object.Object, &mesh))
		case "Workload":
			var w discoveryv1alpha1.Workload
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object.Object, &w))
			workloads[w.Spec.Kubernetes.Controller.Name] = w
		case "Destination":
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object.Object, &dest))
		}
	}
	assert.Equal(t, []string{"ambient", "sidecar"}, mesh.Spec.Istio.DataPlaneModes)
	assert.Equal(t, &discoveryv1alpha1.AmbientMesh{Ztunnel: true, Waypoints: []discoveryv1alpha1.WaypointInfo{
		{Name: "waypoint", Namespace: "bookinfo", TrafficType: "service", ServiceAccount: "waypoint", Ready: true}}}, mesh.Spec.Istio.Ambient)
	assert.Equal(t, "ambient", workloads["app-0"].Spec.Kubernetes.DataPlaneMode)
	assert.Equal(t, &discoveryv1alpha1.WaypointRef{Name: "waypoint", Namespace: "bookinfo"}, workloads["app-0"].Spec.Kubernetes.Waypoint)
	assert.Equal(t, "sidecar", workloads["app-1"].Spec.Kubernetes.DataPlaneMode)
	assert.Nil(t, workloads["app-1"].Spec.Kubernetes.Waypoint)
	assert.Equal(t, &discoveryv1alpha1.WaypointRef{Name: "waypoint", Namespace: "bookinfo"}, dest.Spec.KubeService.Waypoint)
	assert.True(t, dest.Spec.KubeService.Endpoints[0].Ambient)
	assert.Equal(t, "mixed", dest.Spec.KubeService.DataPlaneMode)
	assert.False(t, dest.Spec.KubeService.Headless)

	// A headless Service says so (translation then knows its waypoint is
	// not in its clients' path).
	headless := relaytest.Ambient()
	headless.Destinations[0].Headless = true
	objs, err = server.DiscoveredObjects(relaytest.Rehash(headless), "relaymesh")
	require.NoError(t, err)
	for _, o := range objs {
		if o.Object.GetKind() == "Destination" {
			require.Empty(t, schemaErrors(t, o.Object))
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object.Object, &dest))
		}
	}
	assert.True(t, dest.Spec.KubeService.Headless)

	// The mesh's network and east-west gateways reach its Mesh, within
	// the schema.
	ew := relaytest.Ambient()
	ew.Meshes[0].Network = "net-1"
	ew.Meshes[0].EastWestGateways = []*relaypb.EastWestGateway{{Name: "istio-eastwest", Namespace: "istio-system", Network: "net-1",
		Addresses: []string{"192.0.2.10", "ew.example.com"}, HbonePort: 15008, ServiceAccount: "istio-eastwest"}}
	objs, err = server.DiscoveredObjects(relaytest.Rehash(ew), "relaymesh")
	require.NoError(t, err)
	require.Empty(t, schemaErrors(t, objs[0].Object))
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object.Object, &mesh))
	assert.Equal(t, "net-1", mesh.Spec.Istio.Ambient.Network)
	assert.Equal(t, []discoveryv1alpha1.EastWestGatewayInfo{{Name: "istio-eastwest", Namespace: "istio-system", Network: "net-1",
		Addresses: []string{"192.0.2.10", "ew.example.com"}, HBONEPort: 15008, ServiceAccount: "istio-eastwest"}}, mesh.Spec.Istio.Ambient.EastWestGateways)

	// A sidecar-only mesh has no ambient block, and its one mode.
	objs, err = server.DiscoveredObjects(relaytest.Spec{Workloads: 1}.Snapshot(), "relaymesh")
	require.NoError(t, err)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object.Object, &mesh))
	assert.Nil(t, mesh.Spec.Istio.Ambient)
	assert.Equal(t, []string{"sidecar"}, mesh.Spec.Istio.DataPlaneModes)
}
