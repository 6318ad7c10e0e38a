package check

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What Relaymesh's federation replaces in Istio's own multicluster, judged
// per VirtualMesh from the member clusters that were read: a remote secret
// (another control plane's credentials in a federated cluster) and
// waypoints that differ between the clusters of a Service (Istio requires
// identically named waypoints wherever a service is global).

// vmClusters are the clusters of a VirtualMesh's members, sorted.
func vmClusters(vm *networkingv1alpha1.VirtualMesh) []string {
	var out []string
	for _, m := range vm.Spec.Meshes {
		if !slices.Contains(out, m.ClusterName) {
			out = append(out, m.ClusterName)
		}
	}
	slices.Sort(out)
	return out
}

// evalMulticluster reports, for every VirtualMesh, the remote secrets in
// its member clusters and the Services whose waypoints differ between
// them.
func evalMulticluster(o *Observations) []Result {
	if o.VirtualMeshesErr != nil {
		return nil // evalVirtualMeshes reports it
	}
	var rs []Result
	checked, clean := map[string]bool{}, 0
	for i := range o.VirtualMeshes {
		vm := &o.VirtualMeshes[i]
		key := vm.Namespace + "/" + vm.Name
		var read []*Workload
		for _, c := range vmClusters(vm) {
			w := workloadOf(o, c)
			if w == nil || w.Err != nil {
				continue // not read: evalWorkload says why, or it was not asked for
			}
			read = append(read, w)
			if checked[c] {
				continue
			}
			checked[c] = true
			found := evalRemoteSecrets(key, w)
			if len(found) == 0 {
				clean++
			}
			rs = append(rs, found...)
		}
		rs = append(rs, evalWaypointUniformity(key, read)...)
	}
	if clean > 0 {
		rs = append(rs, result(AreaFederation, "remote secrets", OK, "none in the %d federated cluster(s) read", clean))
	}
	return rs
}

// evalRemoteSecrets judges one member cluster's remote secrets: each is
// an error, since it gives the cluster's istiod another cluster's API
// credentials, which Relaymesh's federation exists to avoid.
func evalRemoteSecrets(vm string, w *Workload) []Result {
	subject := "cluster " + w.Cluster
	if w.RemoteSecretsErr != nil {
		return []Result{result(AreaFederation, subject, Warning, "%v: whether istiod holds another cluster's credentials is not checked", w.RemoteSecretsErr)}
	}
	var rs []Result
	for _, s := range w.RemoteSecrets {
		names := "a cluster it does not name"
		if s.Cluster != "" {
			names = "cluster " + s.Cluster
		}
		rs = append(rs, result(AreaFederation, subject, Error,
			"Istio remote secret %s/%s (label %s=true) holds a kubeconfig for %s: an istiod in %s reads it and watches that API server, so whoever controls this cluster holds that cluster's credentials, and endpoints merged through it bypass VirtualMesh %s's federation; Relaymesh federates without it: delete the secret",
			s.Namespace, s.Name, labelRemoteSecret, names, s.Namespace, vm))
	}
	return rs
}

// waypointUse is how one cluster serves a Service: the waypoint it is
// bound to ("" none) and, when that waypoint exists there, the traffic it
// serves (istio.io/waypoint-for).
type waypointUse struct {
	waypoint string
	exists   bool
	serves   string
}

func (u waypointUse) String() string {
	switch {
	case u.waypoint == "":
		return "no waypoint"
	case !u.exists:
		return "waypoint " + u.waypoint + " (absent)"
	default:
		return fmt.Sprintf("waypoint %s (for %s)", u.waypoint, u.serves)
	}
}

// evalWaypointUniformity finds Services that more than one member cluster
// holds (namespace sameness: the same namespace/name is the same service
// to Istio) and that are served differently by waypoints: bound in one
// cluster and not in another, bound to differently named waypoints, to
// one absent in a cluster, or to one serving other traffic. Istio's
// ambient multicluster requires identical waypoints wherever a service is
// global; where they differ, a request's L7 policy and routing depend on
// which cluster's waypoint it passes.
func evalWaypointUniformity(vm string, read []*Workload) []Result {
	uses := map[string]map[string]waypointUse{} // service → cluster → use
	bound := map[string]bool{}
	for _, w := range read {
		a := w.Ambient
		if a == nil {
			continue
		}
		waypoints := map[string]*unstructured.Unstructured{}
		for i := range a.Waypoints {
			waypoints[a.Waypoints[i].GetNamespace()+"/"+a.Waypoints[i].GetName()] = &a.Waypoints[i]
		}
		for _, s := range a.Services {
			key := s.Namespace + "/" + s.Name
			u := waypointUse{waypoint: boundWaypoint(a, s)}
			if gw := waypoints[u.waypoint]; gw != nil {
				u.exists, u.serves = true, waypointFor(gw)
			}
			if u.waypoint != "" {
				bound[key] = true
			}
			if uses[key] == nil {
				uses[key] = map[string]waypointUse{}
			}
			uses[key][w.Cluster] = u
		}
	}
	var rs []Result
	for _, svc := range slices.Sorted(maps.Keys(bound)) {
		byCluster := uses[svc]
		if len(byCluster) < 2 {
			continue
		}
		clusters := slices.Sorted(maps.Keys(byCluster))
		first := byCluster[clusters[0]]
		uniform := first.exists || first.waypoint == ""
		for _, c := range clusters[1:] {
			uniform = uniform && byCluster[c] == first
		}
		if uniform {
			continue
		}
		parts := make([]string, len(clusters))
		for i, c := range clusters {
			parts[i] = c + ": " + byCluster[c].String()
		}
		rs = append(rs, result(AreaAmbient, "service "+svc, Warning,
			"served by different waypoints in the clusters of VirtualMesh %s (%s): Istio's ambient multicluster requires an identically named waypoint, serving the same traffic, in every cluster that holds a global service, else its L7 policies and routes hold only for requests that pass one cluster's waypoint; create the same waypoint (%s) and binding in each",
			vm, strings.Join(parts, "; "), cmp.Or(firstBound(byCluster, clusters), "a waypoint")))
	}
	return rs
}

// firstBound is the first waypoint a Service is bound to, by cluster name.
func firstBound(byCluster map[string]waypointUse, clusters []string) string {
	for _, c := range clusters {
		if w := byCluster[c].waypoint; w != "" {
			return w
		}
	}
	return ""
}
