package translation

import (
	"slices"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
)

// MatchDestination reports whether d is selected by sels. No selectors
// select every Destination; otherwise any selector may match.
func MatchDestination(sels []common.DestinationSelector, d *discoveryv1alpha1.Destination) bool {
	if len(sels) == 0 {
		return true
	}
	ks := d.Spec.KubeService
	for _, s := range sels {
		if m := s.KubeServiceMatcher; m != nil {
			if subset(m.Labels, ks.Labels) && in(m.Namespaces, ks.Ref.Namespace) && in(m.Clusters, ks.Ref.ClusterName) {
				return true
			}
		}
		if refs := s.KubeServiceRefs; refs != nil {
			for _, r := range refs.Services {
				if r == ks.Ref {
					return true
				}
			}
		}
	}
	return false
}

// MatchWorkload reports whether w is selected by sels. No selectors select
// every Workload; otherwise any selector may match.
func MatchWorkload(sels []common.WorkloadSelector, w *discoveryv1alpha1.Workload) bool {
	if len(sels) == 0 {
		return true
	}
	k := w.Spec.Kubernetes
	for _, s := range sels {
		if subset(s.Labels, k.PodLabels) && in(s.Namespaces, k.Controller.Namespace) && in(s.Clusters, k.Controller.ClusterName) {
			return true
		}
	}
	return false
}

// MatchIdentity reports whether a workload's identity (cluster, namespace,
// service account) is selected by sels. No selectors select everyone.
func MatchIdentity(sels []common.IdentitySelector, cluster, namespace, serviceAccount string) bool {
	if len(sels) == 0 {
		return true
	}
	for _, s := range sels {
		if m := s.KubeIdentityMatcher; m != nil && in(m.Namespaces, namespace) && in(m.Clusters, cluster) {
			return true
		}
		if refs := s.KubeServiceAccountRefs; refs != nil {
			for _, r := range refs.ServiceAccounts {
				if r.Name == serviceAccount && r.Namespace == namespace && r.ClusterName == cluster {
					return true
				}
			}
		}
	}
	return false
}

// MeshOf returns the discovered Mesh a reference names, or nil.
func (in *Input) MeshOf(ref common.ObjectRef) *discoveryv1alpha1.Mesh {
	for i := range in.Meshes {
		m := &in.Meshes[i]
		if m.Name == ref.Name && (ref.Namespace == "" || m.Namespace == ref.Namespace) {
			return m
		}
	}
	return nil
}

// FederatedHostname is the cross-cluster hostname of a Destination:
// `<svc>.<ns>.svc.<cluster>.<suffix>`.
func FederatedHostname(d *discoveryv1alpha1.Destination, suffix string) string {
	if suffix == "" {
		suffix = "global"
	}
	r := d.Spec.KubeService.Ref
	return r.Name + "." + r.Namespace + ".svc." + r.ClusterName + "." + suffix
}

// LocalHostname is a Destination's in-cluster hostname.
func LocalHostname(d *discoveryv1alpha1.Destination, clusterDomain string) string {
	if clusterDomain == "" {
		clusterDomain = "cluster.local"
	}
	r := d.Spec.KubeService.Ref
	return r.Name + "." + r.Namespace + ".svc." + clusterDomain
}

// subset: every key of want is in have with the same value.
func subset(want, have map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// in: an empty list allows anything.
func in(list []string, v string) bool {
	return len(list) == 0 || slices.Contains(list, v)
}
