package accessaudit_test

import (
	"fmt"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/translation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// world builds a synthetic input: one mesh per cluster (with an east-west
// gateway), services Services spread over the clusters and 20 namespaces,
// each with two Workloads (v1, v2) running as the service's own account,
// one VirtualMesh with every mesh, deny by default, federating every fifth
// service (label tier: public) everywhere, and policies AccessPolicies in
// the admin namespace, each on one service, by turns allowing: the next
// service's account; the service's namespace in its cluster; the service's
// namespace in every cluster (remote sources reach it only if federated);
// the next service's account for GET /api/* only.
func world(clusters, services, policies int) *translation.Input {
	in := &translation.Input{}
	var meshRefs []common.ClusterObjectRef
	meshOf := func(c int) common.ObjectRef {
		return common.ObjectRef{Name: fmt.Sprintf("istiod-istio-system-cluster-%d", c), Namespace: "relaymesh"}
	}
	for c := range clusters {
		ref := meshOf(c)
		in.Meshes = append(in.Meshes, discoveryv1alpha1.Mesh{
			ObjectMeta: metav1.ObjectMeta{Name: ref.Name, Namespace: ref.Namespace},
			Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
				Installation: discoveryv1alpha1.MeshInstallation{Name: "istiod", Namespace: "istio-system", Cluster: fmt.Sprintf("cluster-%d", c)},
				TrustDomain:  fmt.Sprintf("cluster-%d.local", c),
				Gateways: []discoveryv1alpha1.GatewayInfo{{Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest",
					WorkloadLabels: map[string]string{"istio": "eastwestgateway"}, ExternalAddress: fmt.Sprintf("10.%d.%d.1", c/250, c%250), TLSPort: 15443}},
			}},
		})
		meshRefs = append(meshRefs, common.ClusterObjectRef{ClusterName: fmt.Sprintf("cluster-%d", c), Namespace: "istio-system", Name: "istiod"})
		// Registered with the default grant, <cluster>.local.
		in.Clusters = append(in.Clusters, multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cluster-%d", c), Namespace: "relaymesh"}})
	}
	ref := func(s int) common.ClusterObjectRef {
		return common.ClusterObjectRef{Name: fmt.Sprintf("svc-%d", s), Namespace: fmt.Sprintf("ns-%d", s%20), ClusterName: fmt.Sprintf("cluster-%d", s%clusters)}
	}
	for s := range services {
		r := ref(s)
		labels := map[string]string{"app": r.Name}
		if s%5 == 0 {
			labels["tier"] = "public"
		}
		for _, v := range []string{"v1", "v2"} {
			in.Workloads = append(in.Workloads, discoveryv1alpha1.Workload{
				ObjectMeta: metav1.ObjectMeta{Name: r.Name + "-" + v + "-" + r.Namespace + "-" + r.ClusterName, Namespace: "relaymesh"},
				Spec: discoveryv1alpha1.WorkloadSpec{Mesh: meshOf(s % clusters), Kubernetes: discoveryv1alpha1.KubernetesWorkload{
					Controller: common.ClusterObjectRef{Name: r.Name + "-" + v, Namespace: r.Namespace, ClusterName: r.ClusterName}, Kind: "Deployment",
					PodLabels: map[string]string{"app": r.Name, "version": v}, ServiceAccountName: r.Name}},
			})
		}
		in.Destinations = append(in.Destinations, discoveryv1alpha1.Destination{
			ObjectMeta: metav1.ObjectMeta{Name: translation.TargetName(r), Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.DestinationSpec{Mesh: meshOf(s % clusters), KubeService: discoveryv1alpha1.KubeService{
				Ref: r, Labels: labels, WorkloadSelectorLabels: map[string]string{"app": r.Name},
				Ports: []discoveryv1alpha1.ServicePort{{Port: 8080, Name: "http"}}}},
		})
	}
	for p := range policies {
		s := p % services
		r, next := ref(s), ref((s+1)%services)
		spec := networkingv1alpha1.AccessPolicySpec{
			DestinationSelector: []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{r}}}},
		}
		account := []common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{next}}}}
		switch p % 4 {
		case 0:
			spec.SourceSelector = account
		case 1:
			spec.SourceSelector = []common.IdentitySelector{{KubeIdentityMatcher: &common.KubeIdentityMatcher{Namespaces: []string{r.Namespace}, Clusters: []string{r.ClusterName}}}}
		case 2:
			spec.SourceSelector = []common.IdentitySelector{{KubeIdentityMatcher: &common.KubeIdentityMatcher{Namespaces: []string{r.Namespace}}}}
		case 3:
			spec.SourceSelector, spec.AllowedMethods, spec.AllowedPaths = account, []string{"GET"}, []string{"/api/*"}
		}
		in.AccessPolicies = append(in.AccessPolicies, networkingv1alpha1.AccessPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", p), Namespace: "relaymesh", Generation: 1}, Spec: spec})
	}
	in.VirtualMeshes = []networkingv1alpha1.VirtualMesh{{
		ObjectMeta: metav1.ObjectMeta{Name: "all", Namespace: "relaymesh", Generation: 1, CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
		Spec: networkingv1alpha1.VirtualMeshSpec{Meshes: meshRefs, GlobalAccessPolicy: networkingv1alpha1.GlobalAccessEnabled,
			Federation: &networkingv1alpha1.Federation{Selectors: []networkingv1alpha1.FederationSelector{{
				DestinationSelectors: []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"tier": "public"}}}}}}}},
	}}
	return in
}

// BenchmarkAudit audits 10 clusters, 1,000 services (2,000 workloads) and
// 1,000 AccessPolicies: translation, matrix and findings.
func BenchmarkAudit(b *testing.B) {
	in := world(10, 1000, 1000)
	cfg := auditConfig(b, admin)
	var pairs, findings int
	for b.Loop() {
		r, err := accessaudit.Audit(b.Context(), in, cfg)
		if err != nil {
			b.Fatal(err)
		}
		pairs, findings = len(r.Matrix.Pairs), len(r.Findings)
	}
	b.ReportMetric(float64(pairs), "pairs")
	b.ReportMetric(float64(findings), "findings")
}
