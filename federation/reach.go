package federation

import (
	"slices"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
)

// reach is where d is federated, the one rule Export, RemoteDestinationRule,
// FederatedClusters and FederatedTo share: the valid VirtualMesh owning d's
// mesh (s), d's member mesh (from), and the other members a selector of
// that VirtualMesh federates d to (to, sorted by mesh key). s is nil when
// no valid VirtualMesh with federation selectors owns d's mesh.
func (p *Plan) reach(d *discoveryv1alpha1.Destination) (s *vmState, from *member, to []*member) {
	s = p.byMesh[destinationMeshKey(d)]
	if s == nil || s.vm.Spec.Federation == nil || len(s.vm.Spec.Federation.Selectors) == 0 {
		return nil, nil, nil
	}
	from = s.byKey[destinationMeshKey(d)]
	return s, from, s.targets(s.vm.Spec.Federation, d, from)
}

// FederatedTo returns the valid VirtualMesh that federates d and the member
// meshes, other than d's own, it federates d to (sorted by Mesh object
// key); nil and nil when d is federated nowhere. It is what Export acts on,
// for views that explain it (`relaymesh describe`).
func (p *Plan) FederatedTo(d *discoveryv1alpha1.Destination) (*networkingv1alpha1.VirtualMesh, []*discoveryv1alpha1.Mesh) {
	s, _, to := p.reach(d)
	if len(to) == 0 {
		return nil, nil
	}
	meshes := make([]*discoveryv1alpha1.Mesh, len(to))
	for i, m := range to {
		meshes[i] = m.mesh
	}
	return s.vm, meshes
}

// FederatedClusters returns the clusters, sorted, other than d's own where a
// valid VirtualMesh federates d to a member mesh: where d's federated
// hostname is defined, so config for it can take effect. It agrees with
// RemoteDestinationRule (ok for exactly these clusters) and costs the size
// of d's VirtualMesh, not of the fleet.
func (p *Plan) FederatedClusters(d *discoveryv1alpha1.Destination) []string {
	_, _, to := p.reach(d)
	var out []string
	for _, m := range to {
		if m.cluster != d.Spec.KubeService.Ref.ClusterName {
			out = append(out, m.cluster)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
