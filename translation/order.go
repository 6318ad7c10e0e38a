package translation

import (
	"cmp"
	"slices"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
)

// The orders and names every translator (and describe) must agree on live
// here, once.

// TargetName names a Destination (or the Service a reference points at) in
// a status, the access audit and translation's own keys:
// `<cluster>/<namespace>/<name>`. No part may contain '/', so two Services
// never share a target name (`<name>-<namespace>-<cluster>` would:
// `a-b`,`c` and `a`,`b-c`).
func TargetName(ref common.ClusterObjectRef) string {
	return ref.ClusterName + "/" + ref.Namespace + "/" + ref.Name
}

// DestinationTarget is TargetName of a Destination's Service.
func DestinationTarget(d *discoveryv1alpha1.Destination) string {
	return TargetName(d.Spec.KubeService.Ref)
}

// SortedDestinations orders Destinations by the cluster, namespace and name
// of their Service, then by object namespace and name.
func SortedDestinations(ds []discoveryv1alpha1.Destination) []*discoveryv1alpha1.Destination {
	out := pointers(ds)
	slices.SortFunc(out, func(a, b *discoveryv1alpha1.Destination) int {
		x, y := a.Spec.KubeService.Ref, b.Spec.KubeService.Ref
		return cmp.Or(cmp.Compare(x.ClusterName, y.ClusterName), cmp.Compare(x.Namespace, y.Namespace),
			cmp.Compare(x.Name, y.Name), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// SortedTrafficPolicies orders TrafficPolicies as conflicts are decided:
// oldest first (creationTimestamp), then by namespace and name.
func SortedTrafficPolicies(ps []networkingv1alpha1.TrafficPolicy) []*networkingv1alpha1.TrafficPolicy {
	out := pointers(ps)
	slices.SortFunc(out, func(a, b *networkingv1alpha1.TrafficPolicy) int {
		return cmp.Or(a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func pointers[T any](xs []T) []*T {
	out := make([]*T, len(xs))
	for i := range xs {
		out[i] = &xs[i]
	}
	return out
}
