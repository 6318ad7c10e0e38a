package controller_test

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/controller"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// world builds a synthetic input: clusters meshes (one per cluster, each
// with an east-west gateway), services Destinations and Workloads spread
// over them, policies policies (half TrafficPolicies shifting between two
// subsets, half AccessPolicies), and one VirtualMesh federating every
// Destination to every mesh when federate is true.
func world(clusters, services, policies int, federate bool) *translation.Input {
	in := &translation.Input{}
	var meshRefs []common.ClusterObjectRef
	for c := range clusters {
		cl := fmt.Sprintf("cluster-%d", c)
		name := "istiod-istio-system-" + cl
		in.Meshes = append(in.Meshes, discoveryv1alpha1.Mesh{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
				Installation: discoveryv1alpha1.MeshInstallation{Name: "istiod", Namespace: "istio-system", Cluster: cl},
				TrustDomain:  cl + ".local", IstiodServiceAccount: "istiod",
				Gateways: []discoveryv1alpha1.GatewayInfo{{Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest",
					WorkloadLabels: map[string]string{"istio": "eastwestgateway"}, ExternalAddress: fmt.Sprintf("10.%d.%d.1", c/250, c%250), TLSPort: 15443}},
			}},
		})
		meshRefs = append(meshRefs, common.ClusterObjectRef{ClusterName: cl, Namespace: "istio-system", Name: "istiod"})
		// Registered with the default grant, <cluster>.local.
		in.Clusters = append(in.Clusters, multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: cl, Namespace: "relaymesh"},
			Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay}})
	}
	for s := range services {
		cl := fmt.Sprintf("cluster-%d", s%clusters)
		svc := fmt.Sprintf("svc-%d", s)
		mesh := common.ObjectRef{Name: "istiod-istio-system-" + cl, Namespace: "relaymesh"}
		for _, v := range []string{"v1", "v2"} {
			in.Workloads = append(in.Workloads, discoveryv1alpha1.Workload{
				ObjectMeta: metav1.ObjectMeta{Name: svc + "-" + v + "-apps-" + cl, Namespace: "relaymesh"},
				Spec: discoveryv1alpha1.WorkloadSpec{Mesh: mesh, Kubernetes: discoveryv1alpha1.KubernetesWorkload{
					Controller: common.ClusterObjectRef{Name: svc + "-" + v, Namespace: "apps", ClusterName: cl}, Kind: "Deployment",
					PodLabels: map[string]string{"app": svc, "version": v}, ServiceAccountName: svc}},
			})
		}
		in.Destinations = append(in.Destinations, discoveryv1alpha1.Destination{
			ObjectMeta: metav1.ObjectMeta{Name: svc + "-apps-" + cl, Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.DestinationSpec{Mesh: mesh, KubeService: discoveryv1alpha1.KubeService{
				Ref: common.ClusterObjectRef{Name: svc, Namespace: "apps", ClusterName: cl}, Labels: map[string]string{"app": svc},
				WorkloadSelectorLabels: map[string]string{"app": svc}, Subsets: map[string][]string{"version": {"v1", "v2"}},
				Ports: []discoveryv1alpha1.ServicePort{{Port: 8080, Name: "http"}}}},
		})
	}
	created := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	for p := range policies {
		s := p % services
		cl := fmt.Sprintf("cluster-%d", s%clusters)
		ref := common.ClusterObjectRef{Name: fmt.Sprintf("svc-%d", s), Namespace: "apps", ClusterName: cl}
		meta := metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", p), Namespace: "relaymesh", CreationTimestamp: created, Generation: 1}
		sel := []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{ref}}}}
		if p%2 == 0 {
			in.TrafficPolicies = append(in.TrafficPolicies, networkingv1alpha1.TrafficPolicy{ObjectMeta: meta, Spec: networkingv1alpha1.TrafficPolicySpec{
				DestinationSelector: sel,
				SourceSelector:      []common.WorkloadSelector{{Clusters: []string{cl}}},
				HTTPRequestMatchers: []networkingv1alpha1.HTTPMatcher{{URI: &networkingv1alpha1.StringMatch{Prefix: new(fmt.Sprintf("/p%d", p))}}},
				Policy: networkingv1alpha1.Policy{TrafficShift: &networkingv1alpha1.TrafficShift{Destinations: []networkingv1alpha1.WeightedDestination{
					{Weight: 90, KubeService: &networkingv1alpha1.KubeServiceTarget{ClusterObjectRef: ref, Subset: map[string]string{"version": "v1"}}},
					{Weight: 10, KubeService: &networkingv1alpha1.KubeServiceTarget{ClusterObjectRef: ref, Subset: map[string]string{"version": "v2"}}},
				}}},
			}})
		} else {
			in.AccessPolicies = append(in.AccessPolicies, networkingv1alpha1.AccessPolicy{ObjectMeta: meta, Spec: networkingv1alpha1.AccessPolicySpec{
				DestinationSelector: sel,
				SourceSelector: []common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{
					{Name: fmt.Sprintf("svc-%d", (s+1)%services), Namespace: "apps", ClusterName: fmt.Sprintf("cluster-%d", ((s+1)%services)%clusters)}}}}},
			}})
		}
	}
	if federate {
		in.VirtualMeshes = []networkingv1alpha1.VirtualMesh{{ObjectMeta: metav1.ObjectMeta{Name: "all", Namespace: "relaymesh", CreationTimestamp: created, Generation: 1},
			Spec: networkingv1alpha1.VirtualMeshSpec{Meshes: meshRefs, Federation: &networkingv1alpha1.Federation{Selectors: []networkingv1alpha1.FederationSelector{{}}}}}}
	}
	return in
}

func benchTranslate(b *testing.B, in *translation.Input) {
	var objects int
	for b.Loop() {
		out, _ := all.Translate(in, "relaymesh")
		objects = len(out.Objects())
	}
	b.ReportMetric(float64(objects), "outputs")
}

// BenchmarkTranslate is a full translation of 100 clusters, 1,000 services
// and 1,000 policies: without federation, and with one VirtualMesh that
// federates every service to every other mesh (99,000 ServiceEntries and as
// many DestinationRules).
func BenchmarkTranslate(b *testing.B) {
	b.Run("policies", func(b *testing.B) { benchTranslate(b, world(100, 1000, 1000, false)) })
	b.Run("policies+federation", func(b *testing.B) { benchTranslate(b, world(100, 1000, 1000, true)) })
}

// BenchmarkTranslateOneEdit measures incremental translation in the
// 100 × 1,000 × 1,000 world, with and without federation, against a full
// translation of the same world in the same run:
//
//   - policy: one TrafficPolicy's matcher changes (generation bumped, as the
//     apiserver does);
//   - destination: one Destination gets another port, as when one cluster's
//     snapshot changes one Service (federated: re-exported to 99 meshes);
//   - full: the engine from scratch (what start-up costs).
func BenchmarkTranslateOneEdit(b *testing.B) {
	for _, federate := range []bool{false, true} {
		name := "policies"
		if federate {
			name = "policies+federation"
		}
		b.Run(name+"/policy", func(b *testing.B) {
			in := withUIDs(world(100, 1000, 1000, federate))
			e := controller.NewEngine("relaymesh")
			e.Translate(in)
			p := &in.TrafficPolicies[0]
			for b.Loop() {
				p.Spec.HTTPRequestMatchers[0].URI.Prefix = new(fmt.Sprintf("/edit%d", p.Generation))
				p.Generation++
				e.Translate(in)
				e.Dirty()
			}
			b.ReportMetric(float64(e.Stats().Recomputed), "units-recomputed")
		})
		b.Run(name+"/destination", func(b *testing.B) {
			in := withUIDs(world(100, 1000, 1000, federate))
			e := controller.NewEngine("relaymesh")
			e.Translate(in)
			d := &in.Destinations[0]
			base := d.Spec.KubeService.Ports
			for b.Loop() {
				d.Spec.KubeService.Ports = append(slices.Clone(base), discoveryv1alpha1.ServicePort{Port: int32(9000 + d.Generation%100), Name: "grpc"})
				d.Generation++
				e.Translate(in)
				e.Dirty()
			}
			b.ReportMetric(float64(e.Stats().Recomputed), "units-recomputed")
		})
		b.Run(name+"/full", func(b *testing.B) {
			in := withUIDs(world(100, 1000, 1000, federate))
			var e *controller.Engine
			for b.Loop() {
				e = controller.NewEngine("relaymesh")
				e.Translate(in)
			}
			// What the engine keeps between translations: every unit's
			// objects, encoded for the wire, and the indexes.
			b.StopTimer()
			var before, after runtime.MemStats
			e = nil
			runtime.GC()
			runtime.ReadMemStats(&before)
			e = controller.NewEngine("relaymesh")
			e.Translate(in)
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-min(before.HeapAlloc, after.HeapAlloc))/(1<<20), "MB-retained")
			runtime.KeepAlive(e)
		})
	}
}

// withUIDs gives every object a UID and generation 1, as objects read from
// an apiserver have (the engine versions objects by them).
func withUIDs(in *translation.Input) *translation.Input {
	n := 0
	meta := func(m *metav1.ObjectMeta) {
		n++
		m.UID = types.UID(fmt.Sprintf("uid-%d", n))
		m.Generation = max(m.Generation, 1)
	}
	for i := range in.Meshes {
		meta(&in.Meshes[i].ObjectMeta)
	}
	for i := range in.Workloads {
		meta(&in.Workloads[i].ObjectMeta)
	}
	for i := range in.Destinations {
		meta(&in.Destinations[i].ObjectMeta)
	}
	for i := range in.TrafficPolicies {
		meta(&in.TrafficPolicies[i].ObjectMeta)
	}
	for i := range in.AccessPolicies {
		meta(&in.AccessPolicies[i].ObjectMeta)
	}
	for i := range in.VirtualMeshes {
		meta(&in.VirtualMeshes[i].ObjectMeta)
	}
	for i := range in.Clusters {
		meta(&in.Clusters[i].ObjectMeta)
	}
	return in
}

// BenchmarkTranslateFleetEdit is issue 21's edit: a fleet of clusters with
// one Service each, no VirtualMesh, and one TrafficPolicy without selectors
// (every Destination, from every cluster's workloads) whose request timeout
// changes (5 s ↔ 7 s). It reports the objects the policy produces and the
// clusters republished per edit.
func BenchmarkTranslateFleetEdit(b *testing.B) {
	for _, clusters := range []int{100, 1000} {
		b.Run(fmt.Sprintf("clusters=%d", clusters), func(b *testing.B) {
			in := world(clusters, clusters, 0, false)
			in.TrafficPolicies = []networkingv1alpha1.TrafficPolicy{{
				ObjectMeta: metav1.ObjectMeta{Name: "timeouts", Namespace: "relaymesh", CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
				Spec:       networkingv1alpha1.TrafficPolicySpec{Policy: networkingv1alpha1.Policy{RequestTimeout: &metav1.Duration{Duration: 5 * time.Second}}},
			}}
			in = withUIDs(in)
			e := controller.NewEngine("relaymesh")
			e.Translate(in)
			e.Dirty()
			p := &in.TrafficPolicies[0]
			dirty := 0
			for b.Loop() {
				p.Spec.Policy.RequestTimeout.Duration = 12*time.Second - p.Spec.Policy.RequestTimeout.Duration
				p.Generation++
				e.Translate(in)
				dirty = len(e.Dirty())
			}
			b.ReportMetric(float64(len(e.Objects())), "outputs")
			b.ReportMetric(float64(dirty), "clusters-republished")
		})
	}
}
