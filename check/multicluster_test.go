package check

import (
	"errors"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// federatedVM is a VirtualMesh of one mesh in each named cluster.
func federatedVM(clusters ...string) networkingv1alpha1.VirtualMesh {
	vm := networkingv1alpha1.VirtualMesh{ObjectMeta: metav1.ObjectMeta{Namespace: "relaymesh", Name: "fleet"}}
	for _, c := range clusters {
		vm.Spec.Meshes = append(vm.Spec.Meshes, common.ClusterObjectRef{ClusterName: c, Namespace: "istio-system", Name: "istiod"})
	}
	return vm
}

func waypointGateway(ns, name, serves string) unstructured.Unstructured {
	u := unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"gatewayClassName": "istio-waypoint"}}}
	u.SetNamespace(ns)
	u.SetName(name)
	if serves != "" {
		u.SetLabels(map[string]string{labelWaypointFor: serves})
	}
	return u
}

// ambientCluster is a read workload cluster whose namespace shop binds
// its Services to nsWaypoint (none when empty) and holds the given
// waypoints; reviews is in it, and other is when more is set.
func ambientCluster(name, nsWaypoint string, more bool, waypoints ...unstructured.Unstructured) Workload {
	labels := map[string]string{labelDataplaneMode: "ambient"}
	if nsWaypoint != "" {
		labels[labelUseWaypoint] = nsWaypoint
	}
	a := &Ambient{Namespaces: map[string]map[string]string{"shop": labels}, Waypoints: waypoints,
		Services: []Service{{Namespace: "shop", Name: "reviews"}, {Namespace: "istio-system", Name: "istiod"}}}
	if more {
		a.Services = append(a.Services, Service{Namespace: "shop", Name: "other"})
	}
	return Workload{Context: name, Cluster: name, Ambient: a}
}

func TestRemoteSecretsInFederatedClusters(t *testing.T) {
	a, b, c := ambientCluster("a", "", false), ambientCluster("b", "", false), ambientCluster("c", "", false)
	b.RemoteSecrets = []RemoteSecret{{Namespace: "istio-system", Name: "istio-remote-secret-a", Cluster: "a"}, {Namespace: "istio-system", Name: "handmade"}}
	c.RemoteSecrets = []RemoteSecret{{Namespace: "istio-system", Name: "istio-remote-secret-a", Cluster: "a"}} // c is in no VirtualMesh
	o := &Observations{Workloads: []Workload{a, b, c}, VirtualMeshes: []networkingv1alpha1.VirtualMesh{federatedVM("a", "b")}}
	rs := find(evalMulticluster(o), AreaFederation, "")
	require.Len(t, rs, 3, "%v", rs)
	assert.Equal(t, Result{Area: AreaFederation, Subject: "remote secrets", Severity: OK, Message: "none in the 1 federated cluster(s) read"}, rs[2])
	for i, want := range []string{"istio-system/istio-remote-secret-a (label istio/multiCluster=true) holds a kubeconfig for cluster a", "istio-system/handmade (label istio/multiCluster=true) holds a kubeconfig for a cluster it does not name"} {
		assert.Equal(t, "cluster b", rs[i].Subject)
		assert.Equal(t, Error, rs[i].Severity)
		assert.Contains(t, rs[i].Message, want)
		assert.Contains(t, rs[i].Message, "VirtualMesh relaymesh/fleet")
	}

	// Not listed: unknown, never "none".
	b.RemoteSecrets, b.RemoteSecretsErr = nil, errors.New(`list Secrets labelled istio/multiCluster=true: secrets is forbidden`)
	o.Workloads = []Workload{a, b}
	rs = find(evalMulticluster(o), AreaFederation, "cluster b")
	require.Len(t, rs, 1)
	assert.Equal(t, Warning, rs[0].Severity)
	assert.Contains(t, rs[0].Message, "forbidden: whether istiod holds another cluster's credentials is not checked")

	// A cluster that was not read, or could not be, is not judged here
	// (evalWorkload says so), and says nothing is clean.
	o.Workloads = []Workload{{Context: "b", Err: errors.New("unreachable")}}
	assert.Empty(t, evalMulticluster(o))
	o.VirtualMeshesErr = errors.New("forbidden")
	o.Workloads = []Workload{b}
	assert.Empty(t, evalMulticluster(o), "evalVirtualMeshes reports an unreadable VirtualMesh list")
}

func TestWaypointUniformity(t *testing.T) {
	wp := func(name, serves string) unstructured.Unstructured { return waypointGateway("shop", name, serves) }
	for _, tc := range []struct {
		name     string
		a, b     Workload
		want     []string // the subjects warned about
		contains string
	}{
		{"identical waypoints", ambientCluster("a", "waypoint", true, wp("waypoint", "")), ambientCluster("b", "waypoint", false, wp("waypoint", "service")), nil, ""},
		{"no waypoint anywhere", ambientCluster("a", "", true), ambientCluster("b", "", true), nil, ""},
		{"bound in one cluster only", ambientCluster("a", "waypoint", true, wp("waypoint", "")), ambientCluster("b", "", true),
			[]string{"service shop/other", "service shop/reviews"}, "a: waypoint shop/waypoint (for service); b: no waypoint"},
		{"differently named", ambientCluster("a", "waypoint", false, wp("waypoint", "")), ambientCluster("b", "wp2", false, wp("wp2", "")),
			[]string{"service shop/reviews"}, "a: waypoint shop/waypoint (for service); b: waypoint shop/wp2 (for service)"},
		{"bound but absent in one", ambientCluster("a", "waypoint", false, wp("waypoint", "")), ambientCluster("b", "waypoint", false),
			[]string{"service shop/reviews"}, "b: waypoint shop/waypoint (absent)"},
		{"bound but absent everywhere", ambientCluster("a", "waypoint", false), ambientCluster("b", "waypoint", false),
			[]string{"service shop/reviews"}, "a: waypoint shop/waypoint (absent); b: waypoint shop/waypoint (absent)"},
		{"serving other traffic", ambientCluster("a", "waypoint", false, wp("waypoint", "all")), ambientCluster("b", "waypoint", false, wp("waypoint", "workload")),
			[]string{"service shop/reviews"}, "a: waypoint shop/waypoint (for all); b: waypoint shop/waypoint (for workload)"},
		{"a Service in one cluster only", ambientCluster("a", "waypoint", true, wp("waypoint", "")), ambientCluster("b", "waypoint", false, wp("waypoint", "")), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &Observations{Workloads: []Workload{tc.a, tc.b}, VirtualMeshes: []networkingv1alpha1.VirtualMesh{federatedVM("a", "b")}}
			rs := find(evalMulticluster(o), AreaAmbient, "")
			var got []string
			for _, r := range rs {
				got = append(got, r.Subject)
				assert.Equal(t, Warning, r.Severity)
				assert.Contains(t, r.Message, "VirtualMesh relaymesh/fleet")
				assert.Contains(t, r.Message, tc.contains)
			}
			assert.Equal(t, tc.want, got)
		})
	}

	// Clusters outside the VirtualMesh are not compared.
	o := &Observations{Workloads: []Workload{ambientCluster("a", "waypoint", false, wp("waypoint", "")), ambientCluster("b", "", false)},
		VirtualMeshes: []networkingv1alpha1.VirtualMesh{federatedVM("a", "c")}}
	assert.Empty(t, find(evalMulticluster(o), AreaAmbient, ""))
}
