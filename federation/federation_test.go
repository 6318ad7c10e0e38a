package federation_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func translate(in *translation.Input) (*translation.Output, *translation.Report) {
	out, r := translation.NewOutput(), translation.NewReport()
	federation.Translate(in, out, r)
	return out, r
}

func cases(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("testdata")
	require.NoError(t, err)
	var dirs []string
	for _, e := range entries {
		// vd-* cases belong to the VirtualDestination golden test.
		if e.IsDir() && !strings.HasPrefix(e.Name(), "vd-") {
			dirs = append(dirs, e.Name())
		}
	}
	require.NotEmpty(t, dirs)
	return dirs
}

// TestGolden compares each testdata case with its output.yaml and
// status.yaml, and runs every output through istioctl and a server-side dry
// run on one real kube-apiserver with Istio's CRDs.
func TestGolden(t *testing.T) {
	for _, name := range cases(t) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			out, r := translate(translationtest.LoadInput(t, dir))
			translationtest.Golden(t, dir, out, r)
			if len(out.Objects()) == 0 {
				return
			}
			// Every cluster's objects go to the one apiserver: the dry
			// run judges schemas and CEL rules, not placement, and it
			// persists nothing, so same-named objects of different
			// clusters do not interfere.
			translationtest.Admitted(t, out)
		})
	}
}

// TestDeterministic: the same input, in any order, gives byte-identical output.
func TestDeterministic(t *testing.T) {
	for _, name := range cases(t) {
		t.Run(name, func(t *testing.T) {
			in := translationtest.LoadInput(t, filepath.Join("testdata", name))
			out, r := translate(in)
			wantOut, wantReport := translationtest.RenderOutput(t, out), translationtest.RenderReport(t, r)
			rng := rand.New(rand.NewPCG(1, uint64(len(name))))
			for range 5 {
				shuffled := *in
				shuffled.Meshes = shuffle(rng, in.Meshes)
				shuffled.Destinations = shuffle(rng, in.Destinations)
				shuffled.VirtualMeshes = shuffle(rng, in.VirtualMeshes)
				out, r := translate(&shuffled)
				require.Equal(t, string(wantOut), string(translationtest.RenderOutput(t, out)))
				require.Equal(t, string(wantReport), string(translationtest.RenderReport(t, r)))
			}
		})
	}
}

func shuffle[T any](rng *rand.Rand, s []T) []T {
	out := append([]T(nil), s...)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func ref(name string) common.ObjectRef { return common.ObjectRef{Name: name, Namespace: "relaymesh"} }

// meshRef names the control plane of test mesh m<i>: istiod "m<i>" in
// istio-system of cluster c<i> (as istioMesh makes it).
func meshRef(name string) common.ClusterObjectRef {
	return common.ClusterObjectRef{ClusterName: "c" + strings.TrimPrefix(name, "m"), Namespace: "istio-system", Name: name}
}

func istioMesh(name, cluster string, gws ...discoveryv1alpha1.GatewayInfo) discoveryv1alpha1.Mesh {
	return discoveryv1alpha1.Mesh{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh"},
		Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
			Installation: discoveryv1alpha1.MeshInstallation{Name: name, Namespace: "istio-system", Cluster: cluster},
			TrustDomain:  cluster + ".local",
			Gateways:     gws,
		}},
	}
}

func destination(svc, cluster, mesh string, ports ...discoveryv1alpha1.ServicePort) discoveryv1alpha1.Destination {
	return discoveryv1alpha1.Destination{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-bookinfo-" + cluster, Namespace: "relaymesh"},
		Spec: discoveryv1alpha1.DestinationSpec{
			KubeService: discoveryv1alpha1.KubeService{
				Ref:                    common.ClusterObjectRef{Name: svc, Namespace: "bookinfo", ClusterName: cluster},
				WorkloadSelectorLabels: map[string]string{"app": svc},
				Ports:                  ports,
			},
			Mesh: ref(mesh),
		},
	}
}

// registered is a registry of clusters each holding its default grant,
// <name>.local (what istioMesh reports).
func registered(names ...string) []multiclusterv1alpha1.KubernetesCluster {
	var out []multiclusterv1alpha1.KubernetesCluster
	for _, n := range names {
		out = append(out, cluster(n))
	}
	return out
}

// cluster is a KubernetesCluster with grants (none: the default grant).
func cluster(name string, grants ...multiclusterv1alpha1.TrustDomainGrant) multiclusterv1alpha1.KubernetesCluster {
	return multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh"},
		Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay, TrustDomains: grants}}
}

var eastWest = discoveryv1alpha1.GatewayInfo{Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest",
	WorkloadLabels: map[string]string{"istio": "eastwestgateway"}, ExternalAddress: "10.0.0.1", TLSPort: 15443}

func federateAll(meshes ...string) networkingv1alpha1.VirtualMesh {
	vm := networkingv1alpha1.VirtualMesh{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "relaymesh", Generation: 4}}
	for _, m := range meshes {
		vm.Spec.Meshes = append(vm.Spec.Meshes, meshRef(m))
	}
	vm.Spec.Federation = &networkingv1alpha1.Federation{Selectors: []networkingv1alpha1.FederationSelector{{}}}
	return vm
}

// Partial and odd data never panics; what cannot be translated is reported.
func TestPartialData(t *testing.T) {
	http := discoveryv1alpha1.ServicePort{Port: 9080, Name: "http"}
	noLabels := eastWest
	noLabels.WorkloadLabels = nil
	longName := strings.Repeat("a-very-long-service-name", 3)
	for _, tc := range []struct {
		name      string
		in        translation.Input
		state     common.ApprovalState
		errs      []string // substrings of the VirtualMesh's or a target's errors
		wantNames []string // output object names that must exist
	}{
		{
			name:  "nil istio field",
			in:    translation.Input{Meshes: []discoveryv1alpha1.Mesh{{ObjectMeta: metav1.ObjectMeta{Name: "m1", Namespace: "relaymesh"}}}, VirtualMeshes: []networkingv1alpha1.VirtualMesh{federateAll("m1")}},
			state: common.StateInvalid, errs: []string{"spec.meshes[0]: c1/istio-system/m1: mesh not found"},
		},
		{
			name:  "no installation",
			in:    translation.Input{Meshes: []discoveryv1alpha1.Mesh{istioMesh("m1", "")}, VirtualMeshes: []networkingv1alpha1.VirtualMesh{federateAll("m1")}},
			state: common.StateInvalid, errs: []string{"spec.meshes[0]: c1/istio-system/m1: mesh not found"},
		},
		{
			name:  "no meshes",
			in:    translation.Input{VirtualMeshes: []networkingv1alpha1.VirtualMesh{federateAll()}},
			state: common.StateInvalid, errs: []string{"spec.meshes is empty"},
		},
		{
			name:  "mesh listed twice",
			in:    translation.Input{Meshes: []discoveryv1alpha1.Mesh{istioMesh("m1", "c1")}, VirtualMeshes: []networkingv1alpha1.VirtualMesh{federateAll("m1", "m1")}},
			state: common.StateInvalid, errs: []string{"spec.meshes[1]: mesh c1/istio-system/m1 is listed twice"},
		},
		{
			name: "destination without ports",
			in: translation.Input{
				Meshes:        []discoveryv1alpha1.Mesh{istioMesh("m1", "c1", eastWest), istioMesh("m2", "c2", eastWest)},
				Destinations:  []discoveryv1alpha1.Destination{destination("reviews", "c1", "m1"), destination("udp", "c1", "m1", discoveryv1alpha1.ServicePort{Port: 53, Protocol: "UDP"})},
				VirtualMeshes: []networkingv1alpha1.VirtualMesh{federateAll("m1", "m2")},
			},
			state: common.StateAccepted, errs: []string{"destination reviews-bookinfo-c1 not federated to m2: it has no TCP port", "destination udp-bookinfo-c1 not federated to m2: it has no TCP port"},
		},
		{
			name: "destination of an unknown mesh is ignored",
			in: translation.Input{
				Meshes:        []discoveryv1alpha1.Mesh{istioMesh("m1", "c1", eastWest), istioMesh("m2", "c2", eastWest)},
				Destinations:  []discoveryv1alpha1.Destination{destination("reviews", "c9", "m9", http)},
				VirtualMeshes: []networkingv1alpha1.VirtualMesh{federateAll("m1", "m2")},
			},
			state: common.StateAccepted,
		},
		{
			name: "gateway without labels",
			in: translation.Input{
				Meshes:       []discoveryv1alpha1.Mesh{istioMesh("m1", "c1", noLabels), istioMesh("m2", "c2", eastWest)},
				Destinations: []discoveryv1alpha1.Destination{destination("reviews", "c1", "m1", http)},
				VirtualMeshes: func() []networkingv1alpha1.VirtualMesh {
					vm := federateAll("m1", "m2")
					vm.Spec.GlobalAccessPolicy = networkingv1alpha1.GlobalAccessEnabled
					return []networkingv1alpha1.VirtualMesh{vm}
				}(),
			},
			state: common.StateAccepted,
			errs: []string{
				"east-west gateway istio-system/istio-eastwestgateway has no workload labels",
				"mesh m1 has no usable east-west gateway (istio-system/istio-eastwestgateway: no workload labels)",
			},
			wantNames: []string{federation.GlobalDenyName},
		},
		{
			name: "long names are hashed",
			in: translation.Input{
				Meshes:        []discoveryv1alpha1.Mesh{istioMesh("m1", "c1", eastWest), istioMesh("m2", "c2", eastWest)},
				Destinations:  []discoveryv1alpha1.Destination{destination(longName, "c1", "m1", http)},
				VirtualMeshes: []networkingv1alpha1.VirtualMesh{federateAll("m1", "m2")},
			},
			state:     common.StateAccepted,
			wantNames: []string{"a-very-long-service-namea-very-long-service-namea-very-6b57a422"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Clusters = registered("c1", "c2")
			out, r := translate(&tc.in)
			st, targets, ok := r.Status(translation.ObjectKey{Kind: "VirtualMesh", Namespace: "relaymesh", Name: "vm"})
			require.True(t, ok)
			assert.Equal(t, tc.state, st.State, "errors: %v, targets: %v", st.Errors, targets)
			assert.Equal(t, int64(4), st.ObservedGeneration)
			all := append([]string(nil), st.Errors...)
			for _, ts := range targets {
				all = append(all, ts.Errors...)
			}
			for _, want := range tc.errs {
				assert.Contains(t, strings.Join(all, "\n"), want)
			}
			if tc.state == common.StateInvalid {
				assert.Empty(t, out.Objects(), "an Invalid VirtualMesh produces nothing")
			}
			var names []string
			for _, o := range out.Objects() {
				names = append(names, o.Object.GetName())
				assert.LessOrEqual(t, len(o.Object.GetName()), 63)
				assert.Equal(t, "VirtualMesh/relaymesh/vm", o.Object.GetAnnotations()[outputs.ParentsAnnotation])
			}
			for _, want := range tc.wantNames {
				found := false
				for _, n := range names {
					found = found || strings.HasPrefix(n, want)
				}
				assert.True(t, found, "no output named %s* in %v", want, names)
			}
		})
	}
}

// On a flat network a Destination's federation reads the Workloads its
// selector matches (their service accounts are the identities clients
// verify), so ExportDeps changes with them: the incremental engine then
// exports it again.
func TestFlatExportDepsFollowIdentities(t *testing.T) {
	http := discoveryv1alpha1.ServicePort{Port: 9080, Name: "http", TargetPort: "9080"}
	d := destination("reviews", "c1", "m1", http)
	d.Spec.KubeService.Endpoints = []discoveryv1alpha1.Endpoint{{IP: "10.0.0.7", Labels: map[string]string{"app": "reviews"}}}
	w := discoveryv1alpha1.Workload{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews-v1", Namespace: "relaymesh"},
		Spec: discoveryv1alpha1.WorkloadSpec{
			Kubernetes: discoveryv1alpha1.KubernetesWorkload{
				Controller: common.ClusterObjectRef{Name: "reviews-v1", Namespace: "bookinfo", ClusterName: "c1"},
				Kind:       "Deployment", PodLabels: map[string]string{"app": "reviews", "version": "v1"}, ServiceAccountName: "reviews",
			},
			Mesh: ref("m1"),
		},
	}
	vm := federateAll("m1", "m2")
	vm.Spec.Federation.FlatNetwork = true
	in := func(ws ...discoveryv1alpha1.Workload) *translation.Input {
		return &translation.Input{
			Meshes:       []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), istioMesh("m2", "c2")},
			Destinations: []discoveryv1alpha1.Destination{d}, Workloads: ws, VirtualMeshes: []networkingv1alpha1.VirtualMesh{vm},
			Clusters: registered("c1", "c2"),
		}
	}
	deps := func(in *translation.Input) string { return federation.NewPlan(in).ExportDeps(&in.Destinations[0]) }
	other := w
	other.Spec.Kubernetes.ServiceAccountName = "someone-else"
	unrelated := w
	unrelated.Spec.Kubernetes.PodLabels = map[string]string{"app": "ratings"}
	unrelated.Spec.Kubernetes.ServiceAccountName = "ratings"

	base := deps(in(w))
	assert.NotEmpty(t, base)
	assert.Equal(t, base, deps(in(w)))
	assert.Equal(t, base, deps(in(w, unrelated)), "a workload the Destination does not select changes nothing")
	assert.NotEqual(t, base, deps(in(other)), "another service account: other identities to verify")
	assert.NotEqual(t, base, deps(in()), "no workload: no identities")

	// And the output follows: the identities are the SANs clients verify.
	out, _ := translate(in(w))
	var sans []any
	for _, o := range out.Objects() {
		if o.Object.GetKind() == "ServiceEntry" {
			sans, _ = o.Object.Object["spec"].(map[string]any)["subjectAltNames"].([]any)
		}
	}
	assert.Equal(t, []any{"spiffe://c1.local/ns/bookinfo/sa/reviews"}, sans)
	out, r := translate(in())
	assert.Empty(t, out.Objects(), "no identity to verify: not federated (fail closed)")
	_, targets, _ := r.Status(translation.ObjectKey{Kind: "VirtualMesh", Namespace: "relaymesh", Name: "vm"})
	assert.Contains(t, fmt.Sprint(targets), "no discovered workload of it names the identity")
}

// A mesh's trust domain is the registry's to grant: a mesh reporting one
// outside its cluster's grant, or one granted to another cluster too
// without being shared on both, makes every VirtualMesh naming it Invalid
// (so no intermediate is issued for it), whichever VirtualMesh the trust
// domain's rightful mesh is in, and whoever was registered first.
func TestTrustDomainOutsideTheGrantIsRefused(t *testing.T) {
	td := func(m discoveryv1alpha1.Mesh, td string) discoveryv1alpha1.Mesh {
		m.Spec.Istio.TrustDomain = td
		return m
	}
	grant := func(name string, shared bool) multiclusterv1alpha1.TrustDomainGrant {
		return multiclusterv1alpha1.TrustDomainGrant{Name: name, Shared: shared}
	}
	vm := func(name string, meshes ...string) networkingv1alpha1.VirtualMesh {
		v := federateAll(meshes...)
		v.Name = name
		return v
	}
	for _, tc := range []struct {
		name     string
		clusters []multiclusterv1alpha1.KubernetesCluster
		meshes   []discoveryv1alpha1.Mesh
		vms      []networkingv1alpha1.VirtualMesh
		want     map[string]common.ApprovalState // by VirtualMesh name
		errs     []string
		warns    []string
	}{
		{
			name:     "default grants",
			clusters: registered("c1", "c2"),
			meshes:   []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), istioMesh("m2", "c2")},
			vms:      []networkingv1alpha1.VirtualMesh{vm("vm", "m1", "m2")},
			want:     map[string]common.ApprovalState{"vm": common.StateAccepted},
		},
		{
			name:     "another cluster's trust domain, in a VirtualMesh without that cluster",
			clusters: registered("c1", "c2", "c3"),
			meshes:   []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), istioMesh("m2", "c2"), td(istioMesh("m3", "c3"), "c1.local")},
			vms:      []networkingv1alpha1.VirtualMesh{vm("a", "m1"), vm("b", "m2", "m3")},
			want:     map[string]common.ApprovalState{"a": common.StateAccepted, "b": common.StateInvalid},
			errs:     []string{`mesh c3/istio-system/m3 reports trust domain "c1.local": cluster c3 is not granted trust domain "c1.local" (its grant: c3.local); an administrator grants trust domains in KubernetesCluster c3, spec.trustDomains`},
		},
		{
			name:     "a trust domain no cluster holds",
			clusters: registered("c1", "c2"),
			meshes:   []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), td(istioMesh("m2", "c2"), "cluster.local")},
			vms:      []networkingv1alpha1.VirtualMesh{vm("vm", "m1", "m2")},
			want:     map[string]common.ApprovalState{"vm": common.StateInvalid},
			errs:     []string{`cluster c2 is not granted trust domain "cluster.local" (its grant: c2.local)`},
		},
		{
			name:     "an unregistered cluster holds nothing",
			clusters: registered("c1"),
			meshes:   []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), istioMesh("m2", "c2")},
			vms:      []networkingv1alpha1.VirtualMesh{vm("vm", "m1", "m2")},
			want:     map[string]common.ApprovalState{"vm": common.StateInvalid},
			errs:     []string{"cluster c2 is not registered (no KubernetesCluster)"},
		},
		{
			name:     "an explicit grant replaces the default",
			clusters: []multiclusterv1alpha1.KubernetesCluster{cluster("c1", grant("prod.example", false)), cluster("c2")},
			meshes:   []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), istioMesh("m2", "c2")},
			vms:      []networkingv1alpha1.VirtualMesh{vm("vm", "m1", "m2")},
			want:     map[string]common.ApprovalState{"vm": common.StateInvalid},
			errs:     []string{`cluster c1 is not granted trust domain "c1.local" (its grant: prod.example)`},
		},
		{
			name:     "a trust domain granted to two clusters is refused to both, whichever registered first",
			clusters: []multiclusterv1alpha1.KubernetesCluster{cluster("c1"), cluster("c2"), cluster("c3", grant("c3.local", false), grant("c1.local", false))},
			meshes:   []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), istioMesh("m2", "c2"), td(istioMesh("m3", "c3"), "c1.local")},
			vms:      []networkingv1alpha1.VirtualMesh{vm("a", "m1"), vm("b", "m2", "m3")},
			want:     map[string]common.ApprovalState{"a": common.StateInvalid, "b": common.StateInvalid},
			errs:     []string{`trust domain "c1.local" is granted to clusters c1, c3, and c1, c3 do not mark it shared`},
		},
		{
			name:     "shared by one holder only is still a conflict",
			clusters: []multiclusterv1alpha1.KubernetesCluster{cluster("c1"), cluster("c2"), cluster("c3", grant("c1.local", true))},
			meshes:   []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), istioMesh("m2", "c2"), td(istioMesh("m3", "c3"), "c1.local")},
			vms:      []networkingv1alpha1.VirtualMesh{vm("a", "m1"), vm("b", "m2", "m3")},
			want:     map[string]common.ApprovalState{"a": common.StateInvalid, "b": common.StateInvalid},
			errs:     []string{`trust domain "c1.local" is granted to clusters c1, c3, and c1 does not mark it shared`},
		},
		{
			name:     "shared on every holder: usable, with a warning",
			clusters: []multiclusterv1alpha1.KubernetesCluster{cluster("c1", grant("c1.local", true)), cluster("c2"), cluster("c3", grant("c1.local", true))},
			meshes:   []discoveryv1alpha1.Mesh{istioMesh("m1", "c1"), istioMesh("m2", "c2"), td(istioMesh("m3", "c3"), "c1.local")},
			vms:      []networkingv1alpha1.VirtualMesh{vm("a", "m1"), vm("b", "m2", "m3")},
			want:     map[string]common.ApprovalState{"a": common.StateAccepted, "b": common.StateAccepted},
			warns:    []string{`mesh c3/istio-system/m3 uses trust domain "c1.local", which clusters c1 hold too`, `mesh c1/istio-system/m1 uses trust domain "c1.local", which clusters c3 hold too`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, r := translate(&translation.Input{Clusters: tc.clusters, Meshes: tc.meshes, VirtualMeshes: tc.vms})
			var all, warns []string
			for name, want := range tc.want {
				st, targets, ok := r.Status(translation.ObjectKey{Kind: "VirtualMesh", Namespace: "relaymesh", Name: name})
				require.True(t, ok, name)
				assert.Equal(t, want, st.State, "%s: %v", name, st.Errors)
				all = append(all, st.Errors...)
				for _, ts := range targets {
					all = append(all, ts.Errors...)
				}
				warns = append(warns, st.Warnings...)
			}
			for _, want := range tc.errs {
				assert.Contains(t, strings.Join(all, "\n"), want)
			}
			for _, want := range tc.warns {
				assert.Contains(t, strings.Join(warns, "\n"), want)
			}
			if len(tc.errs) == 0 {
				assert.Empty(t, all)
			}
			for _, o := range out.Objects() {
				for name, want := range tc.want {
					if want == common.StateInvalid {
						assert.NotContains(t, o.Object.GetAnnotations()[outputs.ParentsAnnotation], "VirtualMesh/relaymesh/"+name, "an Invalid VirtualMesh produces nothing")
					}
				}
			}
			// The plan the trust controller reads agrees: an Invalid
			// VirtualMesh has no members to issue intermediates to.
			plan := federation.NewPlan(&translation.Input{Clusters: tc.clusters, Meshes: tc.meshes, VirtualMeshes: tc.vms})
			for name, want := range tc.want {
				_, ok := plan.Members("relaymesh", name)
				assert.Equal(t, want == common.StateAccepted, ok, name)
			}
		})
	}
}

// A plan keeps each VirtualMesh's verdict with that VirtualMesh even when
// the caller reorders its input afterwards (the trust controller sorted it
// after planning, and an Invalid VirtualMesh took a valid one's members).
func TestPlanSurvivesReorderedInput(t *testing.T) {
	bad := istioMesh("m1", "c1")
	bad.Spec.Istio.TrustDomain = "elsewhere.local"
	a, b := federateAll("m1"), federateAll("m2")
	a.Name, b.Name = "b-invalid", "a-valid"
	in := &translation.Input{Clusters: registered("c1", "c2"), Meshes: []discoveryv1alpha1.Mesh{bad, istioMesh("m2", "c2")},
		VirtualMeshes: []networkingv1alpha1.VirtualMesh{a, b}}
	plan := federation.NewPlan(in)
	in.VirtualMeshes[0], in.VirtualMeshes[1] = in.VirtualMeshes[1], in.VirtualMeshes[0]
	_, ok := plan.Members("relaymesh", "b-invalid")
	assert.False(t, ok, "the VirtualMesh with a member outside its grant stays Invalid")
	members, ok := plan.Members("relaymesh", "a-valid")
	require.True(t, ok)
	require.Len(t, members, 1)
	assert.Equal(t, "m2", members[0].Name)
}
