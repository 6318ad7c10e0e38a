package translation

import (
	"fmt"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
)

// ServingWaypoint finds the waypoint that enforces L7 policy for d's
// Service, or says why there is none.
func ServingWaypoint(in *Input, d *discoveryv1alpha1.Destination) (wp *discoveryv1alpha1.WaypointInfo, principal, why string) {
	ks := d.Spec.KubeService
	ref := ks.Waypoint
	if ref == nil {
		return nil, "", fmt.Sprintf("Service %s/%s is bound to no waypoint (label istio.io/use-waypoint)", ks.Ref.Namespace, ks.Ref.Name)
	}
	if ks.Headless {
		// Its clients resolve the pod IPs and send there: ztunnel routes
		// them by the pods' own binding, past the Service's waypoint. A
		// .waypoint policy would be enforced by no one, and the .ztunnel
		// one admitting only the waypoint would deny the L7 clients.
		return nil, "", fmt.Sprintf("Service %s/%s is headless (clusterIP: None): its clients connect to the pod IPs and bypass the waypoint bound to the Service", ks.Ref.Namespace, ks.Ref.Name)
	}
	mesh := in.MeshOf(d.Spec.Mesh)
	if mesh == nil || mesh.Spec.Istio == nil || mesh.Spec.Istio.Ambient == nil || mesh.Spec.Istio.TrustDomain == "" {
		return nil, "", fmt.Sprintf("the Service's mesh %q is not a discovered ambient mesh with a trust domain", d.Spec.Mesh.Name)
	}
	for i := range mesh.Spec.Istio.Ambient.Waypoints {
		w := &mesh.Spec.Istio.Ambient.Waypoints[i]
		if w.Name != ref.Name || w.Namespace != ref.Namespace {
			continue
		}
		switch {
		case w.TrafficType != "service" && w.TrafficType != "all":
			return nil, "", fmt.Sprintf("waypoint %s/%s serves %q traffic, not Services (istio.io/waypoint-for)", w.Namespace, w.Name, w.TrafficType)
		case !w.Ready:
			return nil, "", fmt.Sprintf("waypoint %s/%s is not ready (its Gateway has no status.addresses; istiod ignores it)", w.Namespace, w.Name)
		case w.ServiceAccount == "":
			return nil, "", fmt.Sprintf("waypoint %s/%s has no known service account, so the Service's L4 policy cannot admit it", w.Namespace, w.Name)
		}
		return w, mesh.Spec.Istio.TrustDomain + "/ns/" + w.Namespace + "/sa/" + w.ServiceAccount, ""
	}
	return nil, "", fmt.Sprintf("waypoint %s/%s is not discovered", ref.Namespace, ref.Name)
}
