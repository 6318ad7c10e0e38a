package federation_test

import (
	"cmp"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The VirtualDestination cases are the testdata directories named vd-*. Their
// VirtualDestination goldens are vd-output.yaml and vd-status.yaml; TestGolden
// also runs over every testdata directory, so output.yaml and status.yaml
// there hold what Translate (VirtualMeshes) makes of the same input.

func translateVD(in *translation.Input) (*translation.Output, *translation.Report) {
	out, r := translation.NewOutput(), translation.NewReport()
	federation.TranslateVirtualDestinations(in, out, r)
	return out, r
}

func vdCases(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("testdata")
	require.NoError(t, err)
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "vd-") {
			dirs = append(dirs, e.Name())
		}
	}
	require.NotEmpty(t, dirs)
	return dirs
}

// vdGolden compares (or with -update writes) dir/vd-output.yaml and
// dir/vd-status.yaml.
func vdGolden(t *testing.T, dir string, out *translation.Output, r *translation.Report) {
	t.Helper()
	for name, got := range map[string][]byte{"vd-output.yaml": translationtest.RenderOutput(t, out), "vd-status.yaml": translationtest.RenderReport(t, r)} {
		path := filepath.Join(dir, name)
		if *translationtest.Update {
			require.NoError(t, os.WriteFile(path, got, 0o644))
			continue
		}
		want, err := os.ReadFile(path)
		require.NoError(t, err, "missing golden file; run go test -update")
		require.Equal(t, string(want), string(got), "%s differs; if the change is intended, run go test -update and review the diff", path)
	}
}

// TestVirtualDestinationGolden compares each vd-* case with its goldens and
// runs every output through istioctl and a server-side dry run on one real
// kube-apiserver with Istio's CRDs.
func TestVirtualDestinationGolden(t *testing.T) {
	for _, name := range vdCases(t) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			out, r := translateVD(translationtest.LoadInput(t, dir))
			vdGolden(t, dir, out, r)
			if len(out.Objects()) == 0 {
				return
			}
			translationtest.Admitted(t, out)
		})
	}
}

// TestVirtualDestinationDeterministic: the same input, in any order, gives
// byte-identical output and report.
func TestVirtualDestinationDeterministic(t *testing.T) {
	for _, name := range vdCases(t) {
		t.Run(name, func(t *testing.T) {
			in := translationtest.LoadInput(t, filepath.Join("testdata", name))
			out, r := translateVD(in)
			wantOut, wantReport := translationtest.RenderOutput(t, out), translationtest.RenderReport(t, r)
			rng := rand.New(rand.NewPCG(2, uint64(len(name))))
			for range 5 {
				shuffled := *in
				shuffled.Meshes = shuffle(rng, in.Meshes)
				shuffled.Destinations = shuffle(rng, in.Destinations)
				shuffled.VirtualMeshes = shuffle(rng, in.VirtualMeshes)
				shuffled.VirtualDestinations = shuffle(rng, in.VirtualDestinations)
				out, r := translateVD(&shuffled)
				require.Equal(t, string(wantOut), string(translationtest.RenderOutput(t, out)))
				require.Equal(t, string(wantReport), string(translationtest.RenderReport(t, r)))
			}
		})
	}
}

func localizedVD(name string, directives ...networkingv1alpha1.FailoverDirective) networkingv1alpha1.VirtualDestination {
	return networkingv1alpha1.VirtualDestination{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh", Generation: 2},
		Spec: networkingv1alpha1.VirtualDestinationSpec{
			Hostname: "reviews.global",
			Port:     networkingv1alpha1.VirtualDestinationPort{Number: 9080},
			Meshes:   []common.ClusterObjectRef{meshRef("m1"), meshRef("m2")},
			Localized: &networkingv1alpha1.LocalizedFailover{
				DestinationSelectors: []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Namespaces: []string{"bookinfo"}}}},
				FailoverDirectives:   directives,
			},
		},
	}
}

// Input the CRD schemas would let through but Istio cannot express is
// Invalid with a precise message, and produces nothing.
func TestVirtualDestinationInvalid(t *testing.T) {
	http := discoveryv1alpha1.ServicePort{Port: 9080, Name: "http"}
	base := translation.Input{
		Meshes: []discoveryv1alpha1.Mesh{istioMesh("m1", "c1", eastWest), istioMesh("m2", "c2", eastWest), istioMesh("m3", "c3")},
		Destinations: []discoveryv1alpha1.Destination{destination("reviews", "c1", "m1", http), destination("reviews", "c2", "m2", http),
			inNamespace(destination("reviews", "c3", "m3", http), "other"), inNamespace(destination("ratings", "c1", "m1", http), "other")},
	}
	loc := func(region, zone string) networkingv1alpha1.Locality {
		return networkingv1alpha1.Locality{Region: region, Zone: zone}
	}
	later := localizedVD("later")
	later.CreationTimestamp = metav1.Unix(100, 0)
	earlier := localizedVD("earlier")
	earlier.CreationTimestamp = metav1.Unix(50, 0)
	targetName := localizedVD("vd")
	targetName.Spec.Port.TargetName = "grpc"
	both := localizedVD("vd")
	both.Spec.VirtualMesh = &common.ObjectRef{Name: "vm"}
	noVM := localizedVD("vd")
	noVM.Spec.Meshes, noVM.Spec.VirtualMesh = nil, &common.ObjectRef{Name: "vm"}
	static := func(refs ...common.ClusterObjectRef) networkingv1alpha1.VirtualDestination {
		vd := localizedVD("vd")
		vd.Spec.Localized, vd.Spec.Static = nil, &networkingv1alpha1.StaticFailover{Destinations: refs}
		return vd
	}
	noGateway := static(common.ClusterObjectRef{Name: "reviews", Namespace: "bookinfo", ClusterName: "c1"}, common.ClusterObjectRef{Name: "reviews", Namespace: "other", ClusterName: "c3"})
	twoInOne := static(common.ClusterObjectRef{Name: "reviews", Namespace: "bookinfo", ClusterName: "c1"}, common.ClusterObjectRef{Name: "ratings", Namespace: "other", ClusterName: "c1"})
	for _, tc := range []struct {
		name string
		vds  []networkingv1alpha1.VirtualDestination
		vd   string
		errs []string
	}{
		{name: "zone in directive", vds: []networkingv1alpha1.VirtualDestination{localizedVD("vd", networkingv1alpha1.FailoverDirective{From: loc("c1", "a"), To: []networkingv1alpha1.Locality{loc("c2", "")}})},
			errs: []string{"spec.localized.failoverDirectives[0].from: Istio fails over between regions only; zone and subZone are not supported"}},
		{name: "several targets", vds: []networkingv1alpha1.VirtualDestination{localizedVD("vd", networkingv1alpha1.FailoverDirective{From: loc("c1", ""), To: []networkingv1alpha1.Locality{loc("c2", ""), loc("c3", "")}})},
			errs: []string{"spec.localized.failoverDirectives[0]: Istio fails a region over to exactly one other region; to lists 2 localities"}},
		{name: "same region", vds: []networkingv1alpha1.VirtualDestination{localizedVD("vd", networkingv1alpha1.FailoverDirective{From: loc("c1", ""), To: []networkingv1alpha1.Locality{loc("c1", "")}})},
			errs: []string{"spec.localized.failoverDirectives[0]: from and to are the same region c1"}},
		{name: "repeated from", vds: []networkingv1alpha1.VirtualDestination{localizedVD("vd",
			networkingv1alpha1.FailoverDirective{From: loc("c1", ""), To: []networkingv1alpha1.Locality{loc("c2", "")}},
			networkingv1alpha1.FailoverDirective{From: loc("c1", ""), To: []networkingv1alpha1.Locality{loc("c3", "")}})},
			errs: []string{"spec.localized.failoverDirectives[1]: region c1 already fails over in failoverDirectives[0]; Istio honours one directive per region"}},
		{name: "hostname taken", vds: []networkingv1alpha1.VirtualDestination{later, earlier}, vd: "later",
			errs: []string{"hostname reviews.global is already published by VirtualDestination relaymesh/earlier, created earlier"}},
		{name: "unknown target port", vds: []networkingv1alpha1.VirtualDestination{targetName},
			errs: []string{"destination c1/bookinfo/reviews has no port named grpc (spec.port.targetName)"}},
		{name: "virtualMesh and meshes", vds: []networkingv1alpha1.VirtualDestination{both},
			errs: []string{"spec.virtualMesh and spec.meshes are both set; set one"}},
		{name: "missing virtualMesh", vds: []networkingv1alpha1.VirtualDestination{noVM},
			errs: []string{"spec.virtualMesh: VirtualMesh relaymesh/vm not found"}},
		{name: "no east-west gateway", vds: []networkingv1alpha1.VirtualDestination{noGateway},
			errs: []string{"destination c3/other/reviews: its mesh has no usable east-west gateway, so meshes in other clusters cannot reach it"}},
		{name: "two in one cluster", vds: []networkingv1alpha1.VirtualDestination{twoInOne},
			errs: []string{"spec.static.destinations[1]: destination c1/other/ratings is in cluster c1 like c1/bookinfo/reviews; a VirtualDestination takes at most one destination per cluster (other clusters reach it through that cluster's east-west gateway, which can route the hostname to one Service only)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base
			in.VirtualDestinations = tc.vds
			out, r := translateVD(&in)
			st, targets, ok := r.Status(translation.ObjectKey{Kind: "VirtualDestination", Namespace: "relaymesh", Name: cmp.Or(tc.vd, "vd")})
			require.True(t, ok)
			assert.Equal(t, common.StateInvalid, st.State)
			assert.Equal(t, int64(2), st.ObservedGeneration)
			for _, want := range tc.errs {
				assert.Contains(t, st.Errors, want)
			}
			for _, ts := range targets {
				assert.Equal(t, common.StateInvalid, ts.State, "target %s", ts.Target)
			}
			for _, o := range out.Objects() {
				assert.NotContains(t, o.Object.GetAnnotations()[outputs.ParentsAnnotation], "/"+cmp.Or(tc.vd, "vd"), "an Invalid VirtualDestination produces nothing")
			}
		})
	}
}

func inNamespace(d discoveryv1alpha1.Destination, ns string) discoveryv1alpha1.Destination {
	d.Spec.KubeService.Ref.Namespace = ns
	d.Name = d.Spec.KubeService.Ref.Name + "-" + ns + "-" + d.Spec.KubeService.Ref.ClusterName
	return d
}

// A VirtualDestination that names a mesh of a cluster that is not
// registered (deregistered) serves the others and warns, as a VirtualMesh
// does, instead of turning Invalid.
func TestVirtualDestinationLeavesAnUnregisteredClusterOut(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("testdata", "vd-static"))
	require.NotEmpty(t, in.VirtualDestinations)
	vd := &in.VirtualDestinations[0]
	require.NotNil(t, vd.Spec.VirtualMesh, "the VirtualDestination reaches the VirtualMesh's meshes")
	vm := &in.VirtualMeshes[0]
	vm.Spec.Meshes = append(vm.Spec.Meshes, common.ClusterObjectRef{ClusterName: "cluster-9", Namespace: "istio-system", Name: "istiod"})
	out, r := translation.NewOutput(), translation.NewReport()
	federation.TranslateVirtualDestinations(in, out, r)
	st, _, _ := r.Status(translation.ObjectKey{Kind: "VirtualDestination", Namespace: vd.Namespace, Name: vd.Name})
	assert.NotEqual(t, common.StateInvalid, st.State, "%v", st.Errors)
	assert.Contains(t, strings.Join(st.Warnings, "\n"), "cluster cluster-9 is not registered")
	assert.NotEmpty(t, out.Objects())
}
