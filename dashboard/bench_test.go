package dashboard

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// largeWorld is a fleet the size issue 17 names for the Access page:
// services spread over clusters (one mesh each) and 20 namespaces, each
// service with one Workload running as its own account, one VirtualMesh
// federating every fifth service, and policies AccessPolicies, each on
// one service, by turns allowing the next service's account, the
// service's namespace in its cluster, and the next service's account for
// GET /api/* only.
func largeWorld(clusters, services, policies int) *StaticSource {
	in := &translation.Input{}
	meshOf := func(c int) common.ObjectRef {
		return common.ObjectRef{Name: discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, fmt.Sprintf("cluster-%d", c), "istio-system", "istiod"), Namespace: "relaymesh"}
	}
	var refs []common.ClusterObjectRef
	for c := range clusters {
		name := fmt.Sprintf("cluster-%d", c)
		in.Meshes = append(in.Meshes, discoveryv1alpha1.Mesh{ObjectMeta: metav1.ObjectMeta{Name: meshOf(c).Name, Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
				Installation: discoveryv1alpha1.MeshInstallation{Name: "istiod", Namespace: "istio-system", Cluster: name}, TrustDomain: name + ".local"}}})
		refs = append(refs, common.ClusterObjectRef{ClusterName: name, Namespace: "istio-system", Name: "istiod"})
		in.Clusters = append(in.Clusters, multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh"}}) // the default grant, <cluster>.local
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
		in.Workloads = append(in.Workloads, discoveryv1alpha1.Workload{
			ObjectMeta: metav1.ObjectMeta{Name: discoveryv1alpha1.Name(discoveryv1alpha1.OriginDeployment, r.ClusterName, r.Namespace, r.Name), Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.WorkloadSpec{Mesh: meshOf(s % clusters), Kubernetes: discoveryv1alpha1.KubernetesWorkload{
				Controller: r, Kind: "Deployment", PodLabels: map[string]string{"app": r.Name}, ServiceAccountName: r.Name}}})
		in.Destinations = append(in.Destinations, discoveryv1alpha1.Destination{
			ObjectMeta: metav1.ObjectMeta{Name: discoveryv1alpha1.Name(discoveryv1alpha1.OriginService, r.ClusterName, r.Namespace, r.Name), Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.DestinationSpec{Mesh: meshOf(s % clusters), KubeService: discoveryv1alpha1.KubeService{
				Ref: r, Labels: labels, WorkloadSelectorLabels: map[string]string{"app": r.Name}, Ports: []discoveryv1alpha1.ServicePort{{Port: 8080, Name: "http"}}}}})
	}
	for p := range policies {
		s := p % services
		r, next := ref(s), ref((s+1)%services)
		spec := networkingv1alpha1.AccessPolicySpec{
			DestinationSelector: []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{r}}}}}
		account := []common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{next}}}}
		switch p % 3 {
		case 0:
			spec.SourceSelector = account
		case 1:
			spec.SourceSelector = []common.IdentitySelector{{KubeIdentityMatcher: &common.KubeIdentityMatcher{Namespaces: []string{r.Namespace}, Clusters: []string{r.ClusterName}}}}
		case 2:
			spec.SourceSelector, spec.AllowedMethods, spec.AllowedPaths = account, []string{"GET"}, []string{"/api/*"}
		}
		ap := networkingv1alpha1.AccessPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", p), Namespace: "relaymesh", Generation: 1}, Spec: spec}
		ap.Status.State, ap.Status.ObservedGeneration = common.StateAccepted, 1
		in.AccessPolicies = append(in.AccessPolicies, ap)
	}
	in.VirtualMeshes = []networkingv1alpha1.VirtualMesh{{ObjectMeta: metav1.ObjectMeta{Name: "all", Namespace: "relaymesh", Generation: 1},
		Spec: networkingv1alpha1.VirtualMeshSpec{Meshes: refs, GlobalAccessPolicy: networkingv1alpha1.GlobalAccessEnabled,
			Federation: &networkingv1alpha1.Federation{Selectors: []networkingv1alpha1.FederationSelector{{
				DestinationSelectors: []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"tier": "public"}}}}}}}}}}
	return &StaticSource{In: in, Rev: "1"}
}

// BenchmarkAccessPageFirstRender is the Access page's first render for
// 10 clusters, 1,000 services and 1,000 AccessPolicies (issue 17: at most
// 2 s): a new Dashboard each time, so the audit behind the page is
// computed, not cached; then the table, the graph and the HTML, as a
// browser's GET of /access gets them.
func BenchmarkAccessPageFirstRender(b *testing.B) {
	src := largeWorld(10, 1000, 1000)
	var bytes, rows int
	for b.Loop() {
		d, err := New(Config{Namespace: "relaymesh", Source: src, Auth: tokenAuth{users: map[string]string{"t": "viewer"},
			allow: map[string]map[string]bool{"viewer": {"*": true}}}, Clock: func() time.Time { return testNow }})
		if err != nil {
			b.Fatal(err)
		}
		req := httptest.NewRequest(http.MethodGet, "/access", nil)
		req.Header.Set("Authorization", "Bearer t")
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `id="access-graph"`) {
			b.Fatalf("GET /access: %d %.300s", rec.Code, rec.Body.String())
		}
		bytes, rows = rec.Body.Len(), strings.Count(rec.Body.String(), "<tr")
	}
	b.ReportMetric(float64(bytes), "html-bytes")
	b.ReportMetric(float64(rows), "rows")
}

// BenchmarkAccessPageCached is the same page once the audit of the
// current input is cached (every later load until the input changes).
func BenchmarkAccessPageCached(b *testing.B) {
	d, err := New(Config{Namespace: "relaymesh", Source: largeWorld(10, 1000, 1000), Auth: tokenAuth{users: map[string]string{"t": "viewer"},
		allow: map[string]map[string]bool{"viewer": {"*": true}}}, Clock: func() time.Time { return testNow }})
	if err != nil {
		b.Fatal(err)
	}
	get := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/access", nil)
		req.Header.Set("Authorization", "Bearer t")
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, req)
		return rec
	}
	if rec := get(); rec.Code != http.StatusOK {
		b.Fatalf("GET /access: %d", rec.Code)
	}
	for b.Loop() {
		if rec := get(); rec.Code != http.StatusOK {
			b.Fatalf("GET /access: %d", rec.Code)
		}
	}
}

// The Access graph of a large fleet stays drawable: more than
// maxGraphNodes identities on a side are grouped (by namespace, then by
// cluster) on both sides, and the table and the JSON still hold every
// pair.
func TestAccessGraphGroupsALargeFleet(t *testing.T) {
	d, err := New(Config{Namespace: "relaymesh", Source: largeWorld(10, 1000, 1000), Auth: tokenAuth{users: map[string]string{"t": "viewer"},
		allow: map[string]map[string]bool{"viewer": {"*": true}}}, Clock: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.accessPage(accessFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Total < 1000 || p.Matching != p.Total {
		t.Fatalf("the matrix has %d pairs, %d matching: want every one of at least 1,000", p.Total, p.Matching)
	}
	g := p.Graph
	if g.Grouping == "identity" || len(g.Left) > maxGraphNodes || len(g.Right) > maxGraphNodes {
		t.Fatalf("graph grouped by %s with %d sources and %d destinations: want both sides grouped to at most %d", g.Grouping, len(g.Left), len(g.Right), maxGraphNodes)
	}
	for _, n := range g.Right {
		if strings.Contains(n.ID, " @ ") {
			t.Errorf("destination node %q is a label, not a grouped ID", n.ID)
		}
	}
}
