package federation

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"google.golang.org/protobuf/proto"
)

// Defaults and names of the objects Translate produces.
const (
	// DefaultHostnameSuffix ends federated hostnames when a VirtualMesh names none.
	DefaultHostnameSuffix = "global"
	// GlobalDenyName is the deny-all AuthorizationPolicy of globalAccessPolicy Enabled.
	GlobalDenyName = "relaymesh-global-deny"
	// GlobalDenyWaypointsName is its twin for the waypoints of an ambient
	// member: waypoints read no selector or namespace policy, only
	// targetRefs ones.
	GlobalDenyWaypointsName = "relaymesh-global-deny-waypoints"
	// PeerAuthenticationName is the mesh-wide PeerAuthentication of strictMTLS.
	PeerAuthenticationName = "default"

	kindVirtualMesh     = "VirtualMesh"
	gatewayKindEastWest = "EastWest"
	tlsPortName         = "tls"
)

// vmState is one VirtualMesh being translated.
type vmState struct {
	vm      *networkingv1alpha1.VirtualMesh
	key     translation.ObjectKey
	parent  translation.Parent
	members []*member // sorted by mesh key
	byKey   map[string]*member
	missing []string // references to meshes that do not exist
	// unregistered are references to meshes of clusters that are not
	// registered: no part of the VirtualMesh, and no error.
	unregistered []string
	errs         []string
	warns        []string
}

// member is a Mesh of a VirtualMesh.
type member struct {
	key     string // namespace/name of the Mesh object
	mesh    *discoveryv1alpha1.Mesh
	cluster string
	root    string // Istio root namespace: the installation namespace
	errs    []string
	// exported is set when a Destination of this mesh is federated through
	// its east-west gateways (so it needs the AUTO_PASSTHROUGH Gateway).
	exported bool
}

func (m *member) istio() *discoveryv1alpha1.IstioMesh { return m.mesh.Spec.Istio }

// Translate adds the outputs of every VirtualMesh in `in` to out and its
// status to r. It never panics on partial data: what cannot be translated is
// reported. It is NewPlan, Export of every Destination (in
// translation.SortedDestinations order), then Finish; the translation
// controller calls those separately so that a change to one Destination
// re-exports that Destination only.
func Translate(in *translation.Input, out *translation.Output, r *translation.Report) {
	p := NewPlan(in)
	var notes []Note
	for _, d := range translation.SortedDestinations(in.Destinations) {
		notes = append(notes, p.Export(d, out)...)
	}
	p.Finish(notes, out, r)
}

// Plan is the validated VirtualMeshes of an input: which are valid, which
// meshes each owns, and the address of every federated host.
type Plan struct {
	vms    []*vmState          // sorted by namespace/name
	byMesh map[string]*vmState // valid VirtualMeshes by member mesh key
	// alloc, ids, services and namespaces are nil when no valid
	// VirtualMesh claims a mesh (byMesh is empty): nothing reads them then.
	alloc *allocator
	ids   *identityIndex // identities of Destinations' pods (flatNetwork, ambient)
	// services are the Kubernetes Services discovered, by
	// cluster/namespace/name: ambient federation writes none over them.
	services map[string]bool
	// namespaces are the namespaces of discovered Workloads and Services,
	// by cluster/namespace: where ambient federation may write.
	namespaces map[string]bool
	deps       map[*vmState]string // memoized ExportDeps prefixes
}

// Note is what exporting one Destination tells its VirtualMesh's status:
// an error on the exporting member, or that the member now exports through
// its east-west gateways (so it needs the AUTO_PASSTHROUGH Gateway).
type Note struct {
	VirtualMesh translation.ObjectKey
	Mesh        string // namespace/name of the exporting member
	Exported    bool
	Error       string
	// AmbientPeer is a member (namespace/name of its Mesh) the exporting
	// member's Destination reached over ambient federation: that member
	// needs the exporting network's gateway.
	AmbientPeer string
}

// NewPlan validates every VirtualMesh of in, decides which VirtualMesh owns
// each mesh (earlier VirtualMeshes claim their meshes first) and allocates
// the address of every federated hostname. The indexes of the fleet that
// exports read are built only when some mesh is claimed.
func NewPlan(in *translation.Input) *Plan {
	vms := make([]*vmState, 0, len(in.VirtualMeshes))
	for i := range in.VirtualMeshes {
		// A copy: a caller that reorders in.VirtualMeshes later must not
		// give one VirtualMesh another's verdict.
		vm := new(in.VirtualMeshes[i])
		vms = append(vms, &vmState{
			vm:     vm,
			key:    translation.ObjectKey{Kind: kindVirtualMesh, Namespace: vm.Namespace, Name: vm.Name},
			parent: translation.Parent{Kind: kindVirtualMesh, Namespace: vm.Namespace, Name: vm.Name},
			byKey:  map[string]*member{},
		})
	}
	// Earlier VirtualMeshes claim their meshes first.
	slices.SortFunc(vms, func(a, b *vmState) int {
		if c := a.vm.CreationTimestamp.Compare(b.vm.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.vm.Namespace, b.vm.Namespace), strings.Compare(a.vm.Name, b.vm.Name))
	})
	claimed := map[string]*vmState{}
	var grants *translation.Grants
	if len(vms) > 0 {
		// Read only to validate VirtualMeshes: a fleet without any (a storm
		// translating its new clusters' objects) does not pay for it.
		grants = translation.NewGrants(in.Clusters)
	}
	for _, s := range vms {
		s.validate(in, grants)
		if len(s.errs) == 0 {
			for _, m := range s.members {
				if other := claimed[m.key]; other != nil {
					msg := fmt.Sprintf("mesh %s already belongs to VirtualMesh %s/%s, created earlier", m.key, other.vm.Namespace, other.vm.Name)
					s.errs = append(s.errs, msg)
					m.errs = append(m.errs, msg)
				}
			}
		}
		if len(s.errs) == 0 {
			for _, m := range s.members {
				claimed[m.key] = s
			}
		}
	}
	slices.SortFunc(vms, func(a, b *vmState) int {
		return cmp.Or(strings.Compare(a.vm.Namespace, b.vm.Namespace), strings.Compare(a.vm.Name, b.vm.Name))
	})
	p := &Plan{vms: vms, byMesh: claimed, deps: map[*vmState]string{}}
	if len(claimed) == 0 {
		// Everything that reads the indexes below starts from a
		// Destination whose mesh a valid VirtualMesh claims (reach,
		// ExportDeps). Without one — a fleet without VirtualMeshes, as in a
		// bootstrap storm translated over and over — they are not built:
		// each reads the whole fleet (issue 31).
		return p
	}
	// The VirtualDestination translator reserves addresses the same way, so
	// a federated host has one address in both.
	p.alloc = reservedAllocator(in, sortedVirtualMeshes(in), translation.SortedDestinations(in.Destinations))
	p.ids, p.services, p.namespaces = newIdentityIndex(in), discoveredServices(in), discoveredNamespaces(in)
	return p
}

// VirtualMeshOf returns the valid VirtualMesh that owns d's mesh, or nil.
func (p *Plan) VirtualMeshOf(d *discoveryv1alpha1.Destination) *networkingv1alpha1.VirtualMesh {
	if s := p.byMesh[destinationMeshKey(d)]; s != nil {
		return s.vm
	}
	return nil
}

// Members returns the member meshes of the VirtualMesh namespace/name,
// sorted by key, and whether it is valid (an Invalid VirtualMesh has none).
func (p *Plan) Members(namespace, name string) ([]*discoveryv1alpha1.Mesh, bool) {
	for _, s := range p.vms {
		if s.vm.Namespace != namespace || s.vm.Name != name {
			continue
		}
		if len(s.errs) > 0 {
			return nil, false
		}
		out := make([]*discoveryv1alpha1.Mesh, len(s.members))
		for i, m := range s.members {
			out[i] = m.mesh
		}
		return out, true
	}
	return nil, false
}

// HostnameSuffix is the suffix of d's federated hostname: that of the valid
// VirtualMesh owning d's mesh, else DefaultHostnameSuffix.
func (p *Plan) HostnameSuffix(d *discoveryv1alpha1.Destination) string {
	if s := p.byMesh[destinationMeshKey(d)]; s != nil {
		return vmSuffix(s.vm)
	}
	return DefaultHostnameSuffix
}

// RemoteDestinationRule names the DestinationRule federation makes for d's
// federated host in cluster: the root namespace of the member mesh there and
// the object name. ok is false when d is not federated to a mesh in cluster.
// Other translators put their settings for that host into an object of the
// same name, so Output merges them into the one DestinationRule Istio reads.
func (p *Plan) RemoteDestinationRule(d *discoveryv1alpha1.Destination, cluster string) (namespace, name string, ok bool) {
	_, _, to := p.reach(d)
	for _, m := range to {
		if m.cluster == cluster {
			ref := d.Spec.KubeService.Ref
			return m.root, objectName(ref.Name, ref.Namespace, ref.ClusterName), true
		}
	}
	return "", "", false
}

// ExportDeps names everything Export(d) reads besides d itself: the owning
// VirtualMesh's spec, every member's name, cluster and root namespace, the
// exporting mesh's spec, the address of d's federated hostname and, on a
// flat network, the identities of d's pods (from the Workloads its selector
// matches). Two plans that give equal ExportDeps for d export d identically.
// "" means d is exported nowhere.
func (p *Plan) ExportDeps(d *discoveryv1alpha1.Destination) string {
	s := p.byMesh[destinationMeshKey(d)]
	if s == nil {
		return ""
	}
	prefix, ok := p.deps[s]
	if !ok {
		h := sha256.New()
		vmSpec, _ := json.Marshal(s.vm.Spec)
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00", s.key, s.vm.Generation, vmSpec)
		for _, m := range s.members {
			fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00", m.key, m.mesh.Name, m.cluster, m.root)
		}
		prefix = hex.EncodeToString(h.Sum(nil))
		p.deps[s] = prefix
	}
	from := s.byKey[destinationMeshKey(d)]
	meshSpec, _ := json.Marshal(from.mesh.Spec)
	sum := sha256.Sum256(meshSpec)
	deps := prefix + "/" + hex.EncodeToString(sum[:8]) + "/" + p.alloc.address(translation.FederatedHostname(d, vmSuffix(s.vm)))
	if f := s.vm.Spec.Federation; f != nil && f.FlatNetwork {
		ids, skipped := p.ids.identities(d)
		h := sha256.New()
		for _, id := range append(ids, skipped...) {
			fmt.Fprintf(h, "%s\x00", id)
		}
		deps += "/" + hex.EncodeToString(h.Sum(nil)[:8])
	} else if from.istio().Ambient != nil {
		deps += "/" + p.ambientDeps(s, d)
	}
	return deps
}

// ambientDeps names what exportAmbient reads of d's VirtualMesh besides
// d and its mesh: every member's ambient data (network, gateways), trust
// domain, modes and root; whether each member's cluster holds a Service of
// d's name and uses d's namespace; and the Workloads of d's cluster and
// namespace (their labels and accounts name its pods' identities).
func (p *Plan) ambientDeps(s *vmState, d *discoveryv1alpha1.Destination) string {
	ref := d.Spec.KubeService.Ref
	h := sha256.New()
	for _, m := range s.members {
		a, _ := json.Marshal(m.istio().Ambient)
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%q\x00%s\x00%t\x00%t\x00", m.key, a, m.istio().TrustDomain, m.istio().DataPlaneModes, m.root,
			p.services[m.cluster+"/"+ref.Namespace+"/"+ref.Name], p.namespaces[m.cluster+"/"+ref.Namespace])
	}
	var ws []string
	for _, w := range p.ids.workloads[ref.ClusterName+"/"+ref.Namespace] {
		k := w.Spec.Kubernetes
		labels, _ := json.Marshal(k.PodLabels)
		ws = append(ws, fmt.Sprintf("%s\x00%s\x00%s", k.Controller.Name, labels, k.ServiceAccountName))
	}
	slices.Sort(ws)
	for _, w := range ws {
		fmt.Fprintf(h, "%s\x00", w)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Export adds d's federation outputs (none unless d's mesh belongs to a valid
// VirtualMesh whose selectors federate d) and returns what the VirtualMesh's
// status must say about it.
func (p *Plan) Export(d *discoveryv1alpha1.Destination, out *translation.Output) []Note {
	s, from, to := p.reach(d)
	if len(to) == 0 {
		return nil
	}
	f := s.vm.Spec.Federation
	suffix := cmp.Or(f.HostnameSuffix, DefaultHostnameSuffix)
	if f.FlatNetwork {
		return s.exportFlat(out, p.alloc, p.ids, d, from, to, suffix)
	}
	// Sidecar-era federated hosts for members with sidecars; ambient
	// federation for members with ambient workloads (both, mid-migration).
	var notes []Note
	if classic := slices.DeleteFunc(slices.Clone(to), ambientOnly); len(classic) > 0 {
		notes = s.export(out, p.alloc, d, from, classic, suffix)
	}
	return append(notes, p.exportAmbient(s, out, d, from, to)...)
}

// Finish adds every valid VirtualMesh's per-mesh objects (PeerAuthentication,
// deny-all and gateway allowances, AUTO_PASSTHROUGH Gateways of exporting
// members) and reports every VirtualMesh. notes are Export's, in
// translation.SortedDestinations order.
func (p *Plan) Finish(notes []Note, out *translation.Output, r *translation.Report) {
	byVM := map[translation.ObjectKey][]Note{}
	for _, n := range notes {
		byVM[n.VirtualMesh] = append(byVM[n.VirtualMesh], n)
	}
	for _, s := range p.vms {
		gen := s.vm.Generation
		if len(s.errs) > 0 {
			for _, e := range s.errs {
				r.Invalid(s.key, gen, "%s", e)
			}
			s.reportTargets(r, "not federated: the VirtualMesh is invalid")
			continue
		}
		r.Accept(s.key, gen)
		for _, w := range s.warns {
			r.Warn(s.key, gen, "%s", w)
		}
		s.finish(byVM[s.key], out)
		s.reportTargets(r, "")
	}
}

// reportTargets records each member's verdict. A member without errors of
// its own gets `idle` as its error when idle is set (the VirtualMesh is
// Invalid), else Accepted.
func (s *vmState) reportTargets(r *translation.Report, idle string) {
	for _, m := range s.members {
		t := common.TargetStatus{Target: m.mesh.Name, State: common.StateAccepted, Errors: m.errs}
		if len(m.errs) > 0 {
			t.State = common.StateInvalid
		} else if idle != "" {
			t.State, t.Errors = common.StateInvalid, []string{idle}
		}
		r.Target(s.key, t)
	}
	// Referenced meshes that do not exist are targets too.
	for _, name := range s.missing {
		r.Target(s.key, common.TargetStatus{Target: name, State: common.StateInvalid, Errors: []string{"mesh not found"}})
	}
	for _, name := range s.unregistered {
		r.Target(s.key, common.TargetStatus{Target: name, State: common.StateInvalid, Errors: []string{"its cluster is not registered: not federated"}})
	}
}

// validate resolves the member meshes and records every error in s.errs.
func (s *vmState) validate(in *translation.Input, grants *translation.Grants) {
	vm := s.vm
	if len(vm.Spec.Meshes) == 0 {
		s.errs = append(s.errs, "spec.meshes is empty")
	}
	for i, ref := range vm.Spec.Meshes {
		mesh, err := in.MeshFor(ref)
		if err != nil && !grants.Registered(ref.ClusterName) {
			// Its cluster is not registered (deregistered, or not yet): the
			// mesh takes no part and the others federate without it. An
			// Invalid VirtualMesh would keep its last valid outputs, and
			// with them whatever a revoked cluster exported.
			s.warns = append(s.warns, fmt.Sprintf("spec.meshes[%d]: cluster %s is not registered: mesh %s takes no part until it is", i, ref.ClusterName, translation.MeshRefString(ref)))
			s.unregistered = append(s.unregistered, translation.MeshRefString(ref))
			continue
		}
		if err != nil {
			s.errs = append(s.errs, fmt.Sprintf("spec.meshes[%d]: %v", i, err))
			s.missing = append(s.missing, translation.MeshRefString(ref))
			continue
		}
		key := mesh.Namespace + "/" + mesh.Name
		if s.byKey[key] != nil {
			s.errs = append(s.errs, fmt.Sprintf("spec.meshes[%d]: mesh %s is listed twice", i, translation.MeshRefString(ref)))
			continue
		}
		m := &member{key: key, mesh: mesh}
		s.byKey[key] = m
		s.members = append(s.members, m)
		switch ist := mesh.Spec.Istio; {
		case ist.Installation.Cluster == "" || ist.Installation.Namespace == "":
			m.errs = append(m.errs, fmt.Sprintf("mesh %s has no installation cluster or namespace", translation.MeshRefString(ref)))
		default:
			m.cluster, m.root = ist.Installation.Cluster, ist.Installation.Namespace
		}
		s.errs = append(s.errs, m.errs...)
	}
	slices.SortFunc(s.members, func(a, b *member) int { return strings.Compare(a.key, b.key) })
	if len(s.members) == 0 && len(s.unregistered) > 0 && len(s.errs) == 0 {
		// Nothing left to federate: say so, rather than accept a
		// VirtualMesh whose policies are in force nowhere (an audit of
		// files without the registry, or every member deregistered).
		s.errs = append(s.errs, fmt.Sprintf("no member mesh is in a registered cluster (%s)", strings.Join(s.unregistered, ", ")))
	}
	s.checkTrustDomains(grants)
	if f := vm.Spec.Federation; f != nil {
		if len(f.EastWestGatewaySelectors) > 0 {
			s.errs = append(s.errs, "spec.federation.eastWestGatewaySelectors is not supported yet; omit it to use the discovered east-west gateways (label istio: eastwestgateway)")
		}
		for i, sel := range f.Selectors {
			for j, ref := range sel.Meshes {
				if slices.Contains(s.unregistered, translation.MeshRefString(ref)) {
					continue // a member whose cluster is not registered: warned about above
				}
				mesh, err := in.MeshFor(ref)
				if err != nil || s.byKey[mesh.Namespace+"/"+mesh.Name] == nil {
					s.errs = append(s.errs, fmt.Sprintf("spec.federation.selectors[%d].meshes[%d]: mesh %s is not a member of this VirtualMesh", i, j, translation.MeshRefString(ref)))
				}
			}
		}
		if len(f.Selectors) > 0 {
			s.warnAmbientClients(f.FlatNetwork)
		}
	}
}

// discoveredServices are the Kubernetes Services of in's Destinations, by
// cluster/namespace/name.
func discoveredServices(in *translation.Input) map[string]bool {
	out := map[string]bool{}
	for i := range in.Destinations {
		ref := in.Destinations[i].Spec.KubeService.Ref
		out[ref.ClusterName+"/"+ref.Namespace+"/"+ref.Name] = true
	}
	return out
}

// discoveredNamespaces are the namespaces of in's Workloads and
// Destinations, by cluster/namespace.
func discoveredNamespaces(in *translation.Input) map[string]bool {
	out := map[string]bool{}
	for i := range in.Destinations {
		ref := in.Destinations[i].Spec.KubeService.Ref
		out[ref.ClusterName+"/"+ref.Namespace] = true
	}
	for i := range in.Workloads {
		c := in.Workloads[i].Spec.Kubernetes.Controller
		out[c.ClusterName+"/"+c.Namespace] = true
	}
	return out
}

// runsAmbient says whether m reports workloads in ambient mode.
func runsAmbient(m *discoveryv1alpha1.Mesh) bool {
	return m.Spec.Istio != nil && slices.Contains(m.Spec.Istio.DataPlaneModes, discoveryv1alpha1.DataPlaneAmbient)
}

// warnAmbientClients warns about every member that runs workloads in
// ambient mode: federation reaches other meshes' Destinations through a
// ServiceEntry and an ISTIO_MUTUAL DestinationRule (to their east-west
// gateways, or on a flat network to their pods), and ztunnel reads no
// DestinationRule, so those workloads do not get the mutual TLS the other
// side requires. The mesh's sidecars do. (Ambient federation, over HBONE
// through east-west gateways, is issue 33.)
func (s *vmState) warnAmbientClients(flat bool) {
	reach := "their east-west gateways (port 15443, mutual TLS with SNI)"
	ambient := "ambient workloads reach the ambient Destinations of ambient meshes on other networks, over HBONE through their east-west gateways, where the meshes' networks and trust domain allow it: see each target's errors"
	if flat {
		reach, ambient = "their pods", "ambient federation is not supported with flatNetwork"
	}
	for _, m := range s.members {
		if !runsAmbient(m.mesh) {
			continue
		}
		s.warns = append(s.warns, fmt.Sprintf("mesh %s runs workloads in ambient mode, for which the federated hosts of the other meshes do not work as designed: ztunnel reads no DestinationRule, so it does not originate the mutual TLS %s require; only the mesh's sidecar workloads reach them (%s)",
			meshName(m.mesh), reach, ambient))
	}
}

// checkTrustDomains refuses members whose trust domain is missing, outside
// their cluster's grant (grants: the registry's word, not the agent's), or
// claimed by another member unless spec.mtls.trustDomains is Shared. A
// trust domain is what a mesh's intermediate CA is constrained to sign and
// what policies name identities by: two meshes with one trust domain could
// sign each other's identities, so that takes an explicit choice — across
// clusters an administrator's, on the KubernetesClusters.
func (s *vmState) checkTrustDomains(grants *translation.Grants) {
	shared := s.vm.Spec.MTLS != nil && s.vm.Spec.MTLS.TrustDomains == networkingv1alpha1.TrustDomainsShared
	first := map[string]*member{}
	for _, m := range s.members {
		td := m.istio().TrustDomain
		if td == "" {
			msg := fmt.Sprintf("mesh %s reports no trust domain", meshName(m.mesh))
			m.errs, s.errs = append(m.errs, msg), append(s.errs, msg)
			continue
		}
		if m.cluster == "" {
			continue // refused already: no installation cluster
		}
		if err := grants.Authorize(m.cluster, td); err != nil {
			msg := fmt.Sprintf("mesh %s reports trust domain %q: %v", meshName(m.mesh), td, err)
			m.errs, s.errs = append(m.errs, msg), append(s.errs, msg)
			continue
		}
		if others := grants.SharedWith(m.cluster, td); len(others) > 0 {
			s.warns = append(s.warns, fmt.Sprintf("mesh %s uses trust domain %q, which clusters %s hold too (shared on every KubernetesCluster holding it): their meshes' CAs can sign this mesh's identities",
				meshName(m.mesh), td, strings.Join(others, ", ")))
		}
		other := first[td]
		if other == nil {
			first[td] = m
			continue
		}
		if !shared {
			msg := fmt.Sprintf("meshes %s and %s both claim trust domain %q: either could sign the other's identities; give each mesh its own trust domain, or set spec.mtls.trustDomains: Shared if they are meant to share one", meshName(other.mesh), meshName(m.mesh), td)
			m.errs, s.errs = append(m.errs, msg), append(s.errs, msg)
			continue
		}
		s.warns = append(s.warns, fmt.Sprintf("meshes %s and %s share trust domain %q (spec.mtls.trustDomains: Shared): each mesh's CA can sign the other's identities", meshName(other.mesh), meshName(m.mesh), td))
	}
}

// meshName is how a mesh reads in messages: its control plane,
// `<cluster>/<namespace>/<name>`.
func meshName(m *discoveryv1alpha1.Mesh) string {
	inst := m.Spec.Istio.Installation
	return translation.MeshRefString(common.ClusterObjectRef{ClusterName: inst.Cluster, Namespace: inst.Namespace, Name: inst.Name})
}

// finish produces the per-mesh outputs of a valid VirtualMesh and applies
// the notes of its exported Destinations.
func (s *vmState) finish(notes []Note, out *translation.Output) {
	spec := s.vm.Spec
	for _, m := range s.members {
		if spec.MTLS != nil && spec.MTLS.StrictMTLS {
			s.add(out, m, m.cluster, apiSecurity, "PeerAuthentication", m.root, PeerAuthenticationName, strictPeerAuthentication())
		}
		if spec.GlobalAccessPolicy == networkingv1alpha1.GlobalAccessEnabled {
			s.add(out, m, m.cluster, apiSecurity, "AuthorizationPolicy", m.root, GlobalDenyName, denyAll())
			if m.istio() != nil && m.istio().Ambient != nil {
				s.add(out, m, m.cluster, apiSecurity, "AuthorizationPolicy", m.root, GlobalDenyWaypointsName, denyAllAtWaypoints())
			}
			for _, gw := range eastWestGateways(m.istio()) {
				if len(gw.WorkloadLabels) == 0 {
					m.errs = append(m.errs, fmt.Sprintf("east-west gateway %s/%s has no workload labels: no AuthorizationPolicy can let cross-cluster traffic through it", gw.Namespace, gw.Name))
					continue
				}
				s.add(out, m, m.cluster, apiSecurity, "AuthorizationPolicy", m.root, allowGatewayName(gw), allowGateway(gw))
			}
		}
	}
	ambientPeers := map[string][]string{}
	for _, n := range notes {
		m := s.byKey[n.Mesh]
		if m == nil {
			continue
		}
		if n.Error != "" && !slices.Contains(m.errs, n.Error) {
			m.errs = append(m.errs, n.Error)
		}
		m.exported = m.exported || n.Exported
		if n.AmbientPeer != "" && !slices.Contains(ambientPeers[n.Mesh], n.AmbientPeer) {
			ambientPeers[n.Mesh] = append(ambientPeers[n.Mesh], n.AmbientPeer)
		}
	}
	s.finishAmbient(out, ambientPeers)
	f := spec.Federation
	if f == nil || len(f.Selectors) == 0 || f.FlatNetwork {
		return
	}
	suffix := cmp.Or(f.HostnameSuffix, DefaultHostnameSuffix)
	for _, m := range s.members {
		if !m.exported {
			continue
		}
		for _, gw := range usableGateways(m.istio()) {
			s.add(out, m, m.cluster, apiNetworking, "Gateway", m.root, passthroughGatewayName(gw), passthroughGateway(gw, suffix))
		}
	}
}

// targets returns the members (other than from) that d federates to.
func (s *vmState) targets(f *networkingv1alpha1.Federation, d *discoveryv1alpha1.Destination, from *member) []*member {
	set := map[string]bool{}
	for _, sel := range f.Selectors {
		if !translation.MatchDestination(sel.DestinationSelectors, d) {
			continue
		}
		if len(sel.Meshes) == 0 {
			for _, m := range s.members {
				set[m.key] = true
			}
		}
		for _, ref := range sel.Meshes {
			for _, m := range s.members {
				if inst := m.istio().Installation; inst.Cluster == ref.ClusterName && inst.Namespace == ref.Namespace && inst.Name == ref.Name {
					set[m.key] = true
				}
			}
		}
	}
	var out []*member
	for _, m := range s.members { // sorted
		if set[m.key] && m != from {
			out = append(out, m)
		}
	}
	return out
}

// export federates d of mesh from to the meshes to through from's east-west
// gateways.
func (s *vmState) export(out *translation.Output, alloc *allocator, d *discoveryv1alpha1.Destination, from *member, to []*member, suffix string) []Note {
	var notes []Note
	note := func(msg string) { notes = append(notes, Note{VirtualMesh: s.key, Mesh: from.key, Error: msg}) }
	add := func(cluster, apiVersion, kind, namespace, name string, spec proto.Message) {
		if err := out.Add(cluster, apiVersion, kind, namespace, name, spec, s.parent); err != nil {
			note(err.Error())
		}
	}
	host := translation.FederatedHostname(d, suffix)
	fail := func(format string, args ...any) {
		names := make([]string, len(to))
		for i, m := range to {
			names[i] = m.mesh.Name
		}
		note(fmt.Sprintf("destination %s not federated to %s: %s", d.Name, strings.Join(names, ", "), fmt.Sprintf(format, args...)))
	}
	ports := servicePorts(d)
	if len(ports) == 0 {
		fail("it has no TCP port")
		return notes
	}
	gws := usableGateways(from.istio())
	if len(gws) == 0 {
		fail("mesh %s has no usable east-west gateway%s", from.mesh.Name, gatewayProblems(from.istio()))
		return notes
	}
	if len(d.Spec.KubeService.WorkloadSelectorLabels) == 0 {
		fail("it has no pod selector, so the east-west gateway cannot reach its pods")
		return notes
	}
	var endpoints []endpoint
	for _, gw := range gws {
		endpoints = append(endpoints, endpoint{address: gw.ExternalAddress, port: gw.TLSPort})
	}
	ref := d.Spec.KubeService.Ref
	add(from.cluster, apiNetworking, "ServiceEntry", ref.Namespace, objectName(ref.Name, ref.Namespace, ref.ClusterName),
		localServiceEntry(host, d, ports, gws, from.root))
	notes = append(notes, Note{VirtualMesh: s.key, Mesh: from.key, Exported: true})
	addr := alloc.address(host)
	name := objectName(d.Spec.KubeService.Ref.Name, d.Spec.KubeService.Ref.Namespace, d.Spec.KubeService.Ref.ClusterName)
	for _, m := range to {
		add(m.cluster, apiNetworking, "ServiceEntry", m.root, name, remoteServiceEntry(host, addr, ports, endpoints))
		add(m.cluster, apiNetworking, "DestinationRule", m.root, name, mutualTLS(host, ports))
	}
	return notes
}

// eastWestGateways returns a mesh's east-west gateways sorted by namespace/name.
func eastWestGateways(ist *discoveryv1alpha1.IstioMesh) []discoveryv1alpha1.GatewayInfo {
	if ist == nil {
		return nil
	}
	var out []discoveryv1alpha1.GatewayInfo
	for _, g := range ist.Gateways {
		if g.Kind == gatewayKindEastWest {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b discoveryv1alpha1.GatewayInfo) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}

// usableGateways are the east-west gateways that can carry federated
// traffic: an external address, a TLS port and workload labels to select.
func usableGateways(ist *discoveryv1alpha1.IstioMesh) []discoveryv1alpha1.GatewayInfo {
	var out []discoveryv1alpha1.GatewayInfo
	for _, g := range eastWestGateways(ist) {
		if gatewayProblem(g) == "" {
			out = append(out, g)
		}
	}
	return out
}

func gatewayProblem(g discoveryv1alpha1.GatewayInfo) string {
	var p []string
	if g.ExternalAddress == "" {
		p = append(p, "no external address")
	}
	if g.TLSPort <= 0 || g.TLSPort > 65535 {
		p = append(p, "no TLS port")
	}
	if len(g.WorkloadLabels) == 0 {
		p = append(p, "no workload labels")
	}
	return strings.Join(p, ", ")
}

// gatewayProblems explains why no east-west gateway of a mesh is usable.
func gatewayProblems(ist *discoveryv1alpha1.IstioMesh) string {
	var p []string
	for _, g := range eastWestGateways(ist) {
		p = append(p, fmt.Sprintf("%s/%s: %s", g.Namespace, g.Name, gatewayProblem(g)))
	}
	if len(p) == 0 {
		return ""
	}
	return " (" + strings.Join(p, "; ") + ")"
}
