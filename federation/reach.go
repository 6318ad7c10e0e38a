package federation

import (
	"slices"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
)

// FederatedClusters returns the clusters, sorted, other than d's own where a
// valid VirtualMesh federates d to a member mesh: where d's federated
// hostname is defined, so config for it can take effect. It agrees with
// RemoteDestinationRule (ok for exactly these clusters) and costs the size
// of d's VirtualMesh, not of the fleet.
func (p *Plan) FederatedClusters(d *discoveryv1alpha1.Destination) []string {
	s := p.byMesh[destinationMeshKey(d)]
	if s == nil || s.vm.Spec.Federation == nil || len(s.vm.Spec.Federation.Selectors) == 0 {
		return nil
	}
	from := s.byKey[destinationMeshKey(d)]
	var out []string
	for _, m := range s.targets(s.vm.Spec.Federation, d, from) {
		if m.cluster != d.Spec.KubeService.Ref.ClusterName {
			out = append(out, m.cluster)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
