package translation

import (
	"errors"
	"fmt"
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

// MeshOf returns the discovered Mesh object a reference names (a Workload's
// or Destination's spec.mesh, written by the server), or nil.
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

// ErrMeshNotFound and ErrMeshAmbiguous are why MeshFor found no mesh.
var (
	ErrMeshNotFound  = errors.New("mesh not found")
	ErrMeshAmbiguous = errors.New("more than one Mesh object claims this control plane")
)

// MeshFor returns the discovered Istio mesh whose control plane ref names:
// the istiod Deployment ref.Name in ref.Namespace of cluster ref.ClusterName,
// as its Mesh's spec.istio.installation says. It never matches by object
// name. Two Mesh objects that claim one control plane (only a hand-made
// object can) name none: ErrMeshAmbiguous.
func (in *Input) MeshFor(ref common.ClusterObjectRef) (*discoveryv1alpha1.Mesh, error) {
	var found *discoveryv1alpha1.Mesh
	for i := range in.Meshes {
		m := &in.Meshes[i]
		ist := m.Spec.Istio
		if ist == nil || ist.Installation.Cluster != ref.ClusterName || ist.Installation.Namespace != ref.Namespace || ist.Installation.Name != ref.Name {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("%s: %w (%s/%s and %s/%s)", MeshRefString(ref), ErrMeshAmbiguous, found.Namespace, found.Name, m.Namespace, m.Name)
		}
		found = m
	}
	if found == nil {
		return nil, fmt.Errorf("%s: %w", MeshRefString(ref), ErrMeshNotFound)
	}
	return found, nil
}

// MeshRefString is how a mesh reference reads in messages:
// `<cluster>/<namespace>/<name>`.
func MeshRefString(ref common.ClusterObjectRef) string {
	return ref.ClusterName + "/" + ref.Namespace + "/" + ref.Name
}
