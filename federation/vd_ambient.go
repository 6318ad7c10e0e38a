package federation

import (
	"fmt"
	"slices"
	"strings"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"istio.io/api/label"
	networkingv1 "istio.io/api/networking/v1"
)

// Ambient failover (docs/design/2026-12-04-ambient-failover.md). When every
// backend of a VirtualDestination is an ambient Destination of an ambient
// mesh and every target mesh is ambient, the sidecar design does not apply
// (ztunnel reads no DestinationRule, and an ambient east-west gateway
// forwards only its own cluster's global Services, by their own hostname).
// The failover is then done by the waypoint of each target cluster's own
// Service, which Istio's own ambient failover also relies on:
//
//   - every backend is the same Service name and namespace in its cluster
//     (namespace sameness), labelled istio.io/global=true by its owner;
//   - in each target cluster A that holds a backend, the ready pods of every
//     other backend B become WorkloadEntries on B's network with their
//     account, B's region as locality, and the labels A's Service selects,
//     so they join A's Service (the agent writes such entries only with
//     --ambient-failover, only for a global Service and only on another
//     network); B's network gateway is written as for ambient federation;
//   - a DestinationRule for A's Service (`<svc>.<ns>.svc.cluster.local`)
//     with the VirtualDestination's outlier detection and, static, failover
//     priority on the network label (the first backend's network first: the
//     endpoints istiod gives a waypoint for another network carry only their
//     network and cluster labels, so a static order names at most two
//     backends), localized, the locality failover directives. A's waypoint
//     applies it.
//
//   - spec.hostname: a ServiceEntry with the hostname's address bound to
//     A's Service's waypoint, and a route attached to it that sends
//     everything to A's Service: an HTTPRoute for HTTP, HTTP2 and GRPC
//     ports, a TCPRoute for TCP, TLS and HTTPS ones (the waypoint proxies
//     their bytes, TLS included, without terminating them).
//
// A target cluster without a backend of its own gets nothing from the
// VirtualDestination (a warning): its ambient clients reach the Service by
// VirtualMesh federation.

// The labels that bind a Service or ServiceEntry to a waypoint.
var (
	labelUseWaypoint          = label.IoIstioUseWaypoint.Name
	labelUseWaypointNamespace = label.IoIstioUseWaypointNamespace.Name
)

// isAmbient says whether s takes the ambient path: every backend is an
// ambient Destination of an ambient mesh, and every target mesh is ambient
// with ambient workloads. Anything mixed keeps the sidecar design and its
// warning about ambient clients.
func (s *vdState) isAmbient(in *translation.Input) bool {
	if len(s.backend) == 0 || len(s.meshes) == 0 {
		return false
	}
	for _, b := range s.backend {
		m := in.MeshOf(b.d.Spec.Mesh)
		if b.d.Spec.KubeService.DataPlaneMode != discoveryv1alpha1.DataPlaneAmbient || m == nil || m.Spec.Istio == nil || m.Spec.Istio.Ambient == nil {
			return false
		}
	}
	for _, m := range s.meshes {
		if !ambientOnly(m) {
			return false
		}
	}
	return true
}

// validateAmbient checks what ambient failover needs; every problem makes
// the VirtualDestination Invalid (nothing is written).
func (s *vdState) validateAmbient(in *translation.Input) {
	s.ambient = true
	first := s.backend[0].d.Spec.KubeService.Ref
	for _, b := range s.backend {
		ks := b.d.Spec.KubeService
		if ks.Ref.Name != first.Name || ks.Ref.Namespace != first.Namespace {
			b.errs = append(b.errs, fmt.Sprintf("destination %s: ambient failover joins one Service of the same name and namespace in every cluster (an east-west gateway forwards a Service only by its own hostname); this one is %s/%s, the first is %s/%s",
				b.target(), ks.Ref.Namespace, ks.Ref.Name, first.Namespace, first.Name))
		}
		if ks.Labels[labelGlobal] != "true" {
			b.errs = append(b.errs, fmt.Sprintf("destination %s: its Service is not labelled istio.io/global=true in %s: its east-west gateway forwards only global Services, and the label is the owner's consent to other clusters' endpoints joining it", b.target(), ks.Ref.ClusterName))
		}
		if len(ks.WorkloadSelectorLabels) == 0 {
			b.errs = append(b.errs, fmt.Sprintf("destination %s has no pod selector: its pods' identities are unknown and nothing could join it", b.target()))
		}
		if systemNamespace(ks.Ref.Namespace) {
			b.errs = append(b.errs, fmt.Sprintf("destination %s: namespace %s is the cluster's own: Relaymesh writes no WorkloadEntry there", b.target(), ks.Ref.Namespace))
		}
	}
	s.checkUniformAccess(in)
	if st := s.vd.Spec.Static; st != nil && len(s.backend) > 2 {
		s.fail("spec.static lists %d destinations: for ambient meshes a static order names at most two (the endpoints istiod gives a waypoint for another network carry only their network label, so a third could not be ordered after the second; it is refused rather than cut down)", len(s.backend))
	}
	for _, m := range s.meshes {
		local := s.localBackend(m)
		if local == nil {
			continue
		}
		if _, _, why := translation.ServingWaypoint(in, local.d); why != "" {
			local.errs = append(local.errs, fmt.Sprintf("destination %s: ambient failover is done by the waypoint of the Service in %s, and %s", local.target(), m.cluster, why))
		}
		if m.root == local.d.Spec.KubeService.Ref.Namespace {
			local.errs = append(local.errs, fmt.Sprintf("destination %s: namespace %s is the mesh's root namespace: Relaymesh writes no WorkloadEntry there", local.target(), m.root))
		}
		for _, b := range s.backend {
			if b == local {
				continue
			}
			from := s.backendMember(in, b)
			if from == nil {
				b.errs = append(b.errs, fmt.Sprintf("destination %s: its mesh is not a discovered ambient mesh", b.target()))
				continue
			}
			if why := ambientPeer(from, m); why != "" {
				b.errs = append(b.errs, fmt.Sprintf("destination %s cannot reach mesh %s: %s", b.target(), m.mesh.Name, why))
			}
		}
	}
}

// localBackend is the backend in m's own cluster and mesh, if any.
func (s *vdState) localBackend(m *member) *backend {
	for _, b := range s.backend {
		if b.cluster == m.cluster && destinationMeshKey(b.d) == m.key {
			return b
		}
	}
	return nil
}

// backendMember is b's mesh as a federation member.
func (s *vdState) backendMember(in *translation.Input, b *backend) *member {
	mesh := in.MeshOf(b.d.Spec.Mesh)
	if mesh == nil || mesh.Spec.Istio == nil || mesh.Spec.Istio.Ambient == nil {
		return nil
	}
	inst := mesh.Spec.Istio.Installation
	return &member{key: mesh.Namespace + "/" + mesh.Name, mesh: mesh, cluster: inst.Cluster, root: inst.Namespace}
}

// translateAmbient writes, in each target cluster with a backend of its
// own, the other backends' pods as members of its Service, their networks'
// gateways, and the DestinationRule its waypoint fails over by.
func (s *vdState) translateAmbient(in *translation.Input, ids *identityIndex, alloc *allocator, out *translation.Output) {
	name := objectName(vdNamePrefix, s.vd.Name, s.vd.Namespace)
	addr := alloc.address(s.vd.Spec.Hostname)
	firstNetwork := ""
	if m := s.backendMember(in, s.backend[0]); m != nil {
		firstNetwork = m.istio().Ambient.Network
	}
	for _, m := range s.meshes {
		local := s.localBackend(m)
		if local == nil {
			s.warns = append(s.warns, fmt.Sprintf("mesh %s holds no backend of its own: ambient failover happens at the waypoint of a cluster's own Service, so nothing is written there (its ambient clients reach the Service by VirtualMesh federation)", m.key))
			continue
		}
		ks := local.d.Spec.KubeService
		for _, b := range s.backend {
			if b == local {
				continue
			}
			from := s.backendMember(in, b)
			entries, problems := entriesOnNetwork(ids, b.d, from.istio().Ambient.Network, ks.WorkloadSelectorLabels, b.region)
			for _, pr := range problems {
				s.warns = append(s.warns, fmt.Sprintf("destination %s: %s", b.target(), pr))
			}
			for _, e := range entries {
				// The labels in metadata too, as the agent requires of an
				// entry that joins a Service.
				if err := out.AddMeta(m.cluster, apiNetworking, "WorkloadEntry", ks.Ref.Namespace, e.name, ks.WorkloadSelectorLabels, nil, e.spec, s.parent); err != nil {
					s.errs = append(s.errs, err.Error())
				}
			}
			for _, gw := range ambientGateways(from.istio().Ambient, m.root) {
				annotations := map[string]string{}
				if gw.ServiceAccount != "" {
					annotations[annotationGatewaySA] = gw.ServiceAccount
				}
				if err := out.AddObjectMeta(m.cluster, apiGateway, "Gateway", m.root, remoteNetworkGatewayName(from, gw),
					map[string]string{labelNetwork: gw.Network}, annotations, remoteNetworkGateway(gw), s.parent); err != nil {
					s.errs = append(s.errs, err.Error())
				}
			}
		}
		dr := s.ambientDestinationRule(translation.LocalHostname(local.d, ""), firstNetwork)
		if err := out.Add(m.cluster, apiNetworking, "DestinationRule", ks.Ref.Namespace, name, dr, s.parent); err != nil {
			s.errs = append(s.errs, err.Error())
		}
		s.publishAmbientHostname(in, out, m, local, name, addr)
	}
}

// Unpublish takes h's ServiceEntry and route out of out: what is left when
// its access rules cannot be written (fail closed).
func (h AmbientHostname) Unpublish(out *translation.Output) {
	out.Remove(h.Cluster, apiNetworking, "ServiceEntry", h.Namespace, h.ServiceEntry)
	out.Remove(h.Cluster, apiGateway, h.RouteKind, h.Namespace, h.ServiceEntry)
}

// AmbientHostname is a VirtualDestination's hostname published in one
// cluster for ambient failover: a ServiceEntry bound to the waypoint of
// Backend's Service, whose route sends everything to that Service.
// Istio's waypoint applies to the hostname's filter chain only the
// AuthorizationPolicies that target the ServiceEntry (or the waypoint's
// Gateway or GatewayClass), never the Service's: the Service's access rules
// must be written for the ServiceEntry too (policy.TranslateHostnameAccess),
// or the hostname would reach the Service past them.
type AmbientHostname struct {
	Cluster, Namespace string
	// ServiceEntry names the hostname's ServiceEntry and its route, of
	// RouteKind (gateway.networking.k8s.io/v1).
	ServiceEntry, RouteKind string
	// Port is the VirtualDestination's port; BackendPort the Service port
	// the route sends to.
	Port, BackendPort uint32
	Backend           *discoveryv1alpha1.Destination
	Parent            translation.Parent
}

// ambientRouteKind is the Gateway API route a waypoint takes spec.hostname
// by: an HTTPRoute for the HTTP family, whose requests it routes; a
// TCPRoute for TCP, TLS and HTTPS, whose connections it proxies without
// terminating (for a port that is not HTTP the waypoint builds a TCP
// filter chain and honours TCP routes, pilot's listener_waypoint.go).
func ambientRouteKind(protocol string) string {
	switch protocol {
	case "HTTP", "HTTP2", "GRPC":
		return "HTTPRoute"
	}
	return "TCPRoute"
}

// publishAmbientHostname writes spec.hostname in m's cluster, in the
// namespace of local's Service: a ServiceEntry with the hostname's
// address, bound to the Service's waypoint (so ztunnel hands its traffic
// to that waypoint), and a route attached to it (ambientRouteKind) that
// sends everything to the Service, whose cluster at the waypoint fails
// over.
func (s *vdState) publishAmbientHostname(in *translation.Input, out *translation.Output, m *member, local *backend, name, addr string) {
	ks := local.d.Spec.KubeService
	wp, _, _ := translation.ServingWaypoint(in, local.d) // validated
	se, _ := s.hostServiceEntry(addr, networkingv1.ServiceEntry_STATIC)
	labels := map[string]string{labelUseWaypoint: wp.Name}
	if wp.Namespace != ks.Ref.Namespace {
		labels[labelUseWaypointNamespace] = wp.Namespace
	}
	if err := out.AddMeta(m.cluster, apiNetworking, "ServiceEntry", ks.Ref.Namespace, name, labels, nil, se, s.parent); err != nil {
		s.errs = append(s.errs, err.Error())
	}
	route := map[string]any{
		"parentRefs": []any{map[string]any{"group": "networking.istio.io", "kind": "ServiceEntry", "name": name, "port": s.vd.Spec.Port.Number}},
		"rules":      []any{map[string]any{"backendRefs": []any{map[string]any{"name": ks.Ref.Name, "port": local.port}}}},
	}
	kind := ambientRouteKind(vdProtocol(s.vd.Spec.Port))
	if err := out.AddObject(m.cluster, apiGateway, kind, ks.Ref.Namespace, name, route, s.parent); err != nil {
		s.errs = append(s.errs, err.Error())
		return
	}
	s.hostnames = append(s.hostnames, AmbientHostname{Cluster: m.cluster, Namespace: ks.Ref.Namespace, ServiceEntry: name, RouteKind: kind,
		Port: uint32(s.vd.Spec.Port.Number), BackendPort: local.port, Backend: local.d, Parent: s.parent})
}

// ambientDestinationRule is the sidecar DestinationRule's outlier detection
// and failover for the Service host, without TLS settings (HBONE carries
// the mutual TLS) and, for static failover, with the order expressed on the
// network label: the first backend's network first.
func (s *vdState) ambientDestinationRule(host, firstNetwork string) *networkingv1.DestinationRule {
	dr := s.destinationRule("")
	dr.Host = host
	dr.TrafficPolicy.Tls = nil
	if s.vd.Spec.Static != nil {
		dr.TrafficPolicy.LoadBalancer.LocalityLbSetting.FailoverPriority = []string{labelNetwork + "=" + firstNetwork}
	}
	return dr
}

// checkUniformAccess requires every backend to be selected by the same
// AccessPolicies. A request that fails over leaves through the waypoint of
// the client's cluster, which marks its outer CONNECT x-istio-source:
// waypoint, and the other cluster's east-west gateway then skips that
// cluster's waypoint (L7 policy counts as applied: pilot's
// buildOuterConnectOriginateListener and the east-west filter chains in
// listener_waypoint.go). So the first waypoint's L7 rules stand for the
// second's: unless the same policies select both, failover would bypass a
// backend's own L7 rules. Refused, not widened.
func (s *vdState) checkUniformAccess(in *translation.Input) {
	selecting := func(b *backend) []string {
		var out []string
		for i := range in.AccessPolicies {
			p := &in.AccessPolicies[i]
			if translation.MatchDestination(p.Spec.DestinationSelector, b.d) {
				out = append(out, p.Namespace+"/"+p.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	first := selecting(s.backend[0])
	for _, b := range s.backend[1:] {
		if got := selecting(b); !slices.Equal(got, first) {
			s.fail("destinations %s and %s are selected by different AccessPolicies (%s; %s): a request that fails over keeps the L7 rules of its own cluster's waypoint, and the other cluster's east-west gateway skips that cluster's waypoint, so its own rules would be bypassed; select every backend with the same AccessPolicies",
				s.backend[0].target(), b.target(), policiesString(first), policiesString(got))
		}
	}
}

func policiesString(p []string) string {
	if len(p) == 0 {
		return "none"
	}
	return strings.Join(p, ", ")
}
