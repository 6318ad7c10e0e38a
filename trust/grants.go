package trust

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/translation"
)

// A mesh's trust domain is the registry's to grant (translation.Grants):
// federation refuses a VirtualMesh with a member outside its cluster's
// grant, so the Controller never publishes a request for it, and
// SignIntermediate checks the grant once more, against the registry and the
// mesh as they are at the moment of signing. Every cluster's
// status.trustDomains says what was decided.

// Bounds of status.trustDomains (the CRD's).
const (
	maxGrantStatuses   = 64
	maxGrantMeshes     = 16
	maxGrantMessageLen = 1024
)

// ErrTrustDomainRefused: the registry does not grant the trust domain to the
// mesh's cluster, or the mesh no longer reports the trust domain its
// intermediate was decided for.
var ErrTrustDomainRefused = errors.New("trust domain refused")

// authorizeSigning decides, at the moment of signing, whether an
// intermediate for trust domain td may be issued to mesh of cluster: the
// mesh (as discovered now) must be cluster's and still report td, and the
// registry (clusters, as they are now) must grant td to cluster. mesh nil:
// not discovered (any more).
func authorizeSigning(clusters []multiclusterv1alpha1.KubernetesCluster, mesh *discoveryv1alpha1.Mesh, cluster, td string) error {
	switch {
	case td == "":
		return fmt.Errorf("%w: the request names no trust domain", ErrTrustDomainRefused)
	case mesh == nil || mesh.Spec.Istio == nil:
		return fmt.Errorf("%w: the mesh is not discovered (any more)", ErrTrustDomainRefused)
	case mesh.Spec.Istio.Installation.Cluster != cluster:
		return fmt.Errorf("%w: the mesh is not in the caller's cluster", ErrTrustDomainRefused)
	case mesh.Spec.Istio.TrustDomain != td:
		return fmt.Errorf("%w: the mesh now reports trust domain %q, not %q: no intermediate until the new one is authorized", ErrTrustDomainRefused, mesh.Spec.Istio.TrustDomain, td)
	}
	if err := translation.NewGrants(clusters).Authorize(cluster, td); err != nil {
		return fmt.Errorf("%w: %w", ErrTrustDomainRefused, err)
	}
	return nil
}

// grantStatuses is status.trustDomains of every cluster: each trust domain
// it is granted (Authorized or Conflict), then each one its meshes report
// outside the grant (NotGranted), with the meshes reporting it.
func grantStatuses(clusters []multiclusterv1alpha1.KubernetesCluster, meshes []discoveryv1alpha1.Mesh) map[string][]multiclusterv1alpha1.TrustDomainStatus {
	grants := translation.NewGrants(clusters)
	reporting := map[string]map[string][]string{} // cluster → trust domain → control planes
	for i := range meshes {
		ist := meshes[i].Spec.Istio
		if ist == nil || ist.TrustDomain == "" || ist.Installation.Cluster == "" {
			continue
		}
		cl := ist.Installation.Cluster
		if reporting[cl] == nil {
			reporting[cl] = map[string][]string{}
		}
		reporting[cl][ist.TrustDomain] = append(reporting[cl][ist.TrustDomain], ist.Installation.Namespace+"/"+ist.Installation.Name)
	}
	out := map[string][]multiclusterv1alpha1.TrustDomainStatus{}
	for i := range clusters {
		name := clusters[i].Name
		var sts []multiclusterv1alpha1.TrustDomainStatus
		granted := map[string]bool{}
		for _, td := range grants.Granted(name) {
			granted[td] = true
			st := multiclusterv1alpha1.TrustDomainStatus{Name: td, State: multiclusterv1alpha1.TrustDomainAuthorized, Meshes: meshList(reporting[name][td])}
			if err := grants.Authorize(name, td); err != nil {
				st.State, st.Message = multiclusterv1alpha1.TrustDomainConflict, err.Error()
			} else if others := grants.SharedWith(name, td); len(others) > 0 {
				st.Message = fmt.Sprintf("shared with clusters %s (every holder marks it shared): their meshes' CAs can sign the identities of this cluster's meshes", strings.Join(others, ", "))
			}
			sts = append(sts, st)
		}
		for _, td := range slices.Sorted(maps.Keys(reporting[name])) {
			if granted[td] {
				continue
			}
			err := grants.Authorize(name, td)
			sts = append(sts, multiclusterv1alpha1.TrustDomainStatus{Name: td, State: multiclusterv1alpha1.TrustDomainNotGranted, Meshes: meshList(reporting[name][td]),
				Message: fmt.Sprintf("reported by meshes of this cluster: %v; they get no intermediate, and every VirtualMesh naming them is Invalid", err)})
		}
		for j := range sts {
			sts[j].Message = text.Truncate(sts[j].Message, maxGrantMessageLen)
		}
		if len(sts) > maxGrantStatuses {
			sts = sts[:maxGrantStatuses]
		}
		out[name] = sts
	}
	return out
}

func meshList(planes []string) []string {
	planes = slices.Clone(planes)
	slices.Sort(planes)
	planes = slices.Compact(planes)
	if len(planes) > maxGrantMeshes {
		planes = planes[:maxGrantMeshes]
	}
	return planes
}
