package controller_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/relaymesh/relaymesh/translation/worldtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// requireSameAsFull fails unless the engine's objects and report are exactly
// what a full translation of in gives.
func requireSameAsFull(t *testing.T, e *controller.Engine, r *translation.Report, in *translation.Input, step string) {
	t.Helper()
	out, want := all.Translate(in, "relaymesh")
	render := func(objs []*translation.Object) []string {
		var s []string
		for _, o := range objs {
			b, err := json.Marshal(o.Object.Object)
			require.NoError(t, err)
			s = append(s, o.Cluster+" "+string(b))
		}
		return s
	}
	require.Equal(t, render(out.Objects()), render(e.Objects()), "%s: objects differ from a full translation", step)
	require.Equal(t, want.Keys(), r.Keys(), "%s: reported objects differ", step)
	for _, k := range want.Keys() {
		ws, wt, _ := want.Status(k)
		gs, gt, _ := r.Status(k)
		require.Equal(t, ws, gs, "%s: status of %v", step, k)
		require.Equal(t, wt, gt, "%s: targets of %v", step, k)
		require.Equal(t, want.SourceWorkloads(k), r.SourceWorkloads(k), "%s: workloads of %v", step, k)
	}
}

// The engine gives exactly the full translation's result on every golden
// input of the translators.
func TestEngineAgreesOnGoldenInputs(t *testing.T) {
	var dirs []string
	for _, pattern := range []string{"../../federation/testdata/*", "../../policy/testdata/*/*"} {
		m, err := filepath.Glob(pattern)
		require.NoError(t, err)
		dirs = append(dirs, m...)
	}
	require.GreaterOrEqual(t, len(dirs), 25)
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			in := translationtest.LoadInput(t, dir)
			e := controller.NewEngine("relaymesh")
			requireSameAsFull(t, e, e.Translate(in), in, "first translation")
			e.Dirty()
			// Translating again changes nothing and recomputes nothing.
			r := e.Translate(in)
			requireSameAsFull(t, e, r, in, "second translation")
			assert.Zero(t, e.Stats().Recomputed, "an unchanged input recomputes nothing")
			assert.Empty(t, e.Dirty(), "an unchanged input republishes nothing")
		})
	}
}

// edits are the changes the random test makes; each returns what it did.
var edits = []func(in *translation.Input, rng *rand.Rand) string{
	func(in *translation.Input, rng *rand.Rand) string {
		p := &in.TrafficPolicies[rng.IntN(len(in.TrafficPolicies))]
		p.Spec.HTTPRequestMatchers = []networkingv1alpha1.HTTPMatcher{{URI: &networkingv1alpha1.StringMatch{Prefix: new(fmt.Sprintf("/edit-%d", rng.IntN(1000)))}}}
		p.Generation++
		return "edit TrafficPolicy " + p.Name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		// Point a policy at another Service: its old and new groups change.
		p := &in.TrafficPolicies[rng.IntN(len(in.TrafficPolicies))]
		d := in.Destinations[rng.IntN(len(in.Destinations))]
		p.Spec.DestinationSelector = []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{d.Spec.KubeService.Ref}}}}
		p.Generation++
		return "retarget TrafficPolicy " + p.Name + " to " + d.Name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		// Two policies on one Destination conflict; the later is Invalid.
		a := in.TrafficPolicies[rng.IntN(len(in.TrafficPolicies))]
		a.Name = fmt.Sprintf("%s-copy-%d", a.Name, rng.IntN(1000))
		a.CreationTimestamp = metav1.NewTime(a.CreationTimestamp.Add(1))
		in.TrafficPolicies = append(in.TrafficPolicies, a)
		return "add conflicting TrafficPolicy " + a.Name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		i := rng.IntN(len(in.TrafficPolicies))
		name := in.TrafficPolicies[i].Name
		in.TrafficPolicies = slices.Delete(in.TrafficPolicies, i, i+1)
		return "delete TrafficPolicy " + name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		// Sources in another cluster: outlier detection on a federated
		// host merges into federation's DestinationRule there, and a
		// shift to a remote subset is Invalid.
		p := &in.TrafficPolicies[rng.IntN(len(in.TrafficPolicies))]
		p.Spec.SourceSelector = []common.WorkloadSelector{{Clusters: []string{fmt.Sprintf("cluster-%d", rng.IntN(4))}}}
		p.Spec.Policy.OutlierDetection = &networkingv1alpha1.OutlierDetection{ConsecutiveErrors: int32(1 + rng.IntN(5))}
		if rng.IntN(2) == 0 {
			p.Spec.Policy.TrafficShift = nil
		}
		p.Generation++
		return "TrafficPolicy " + p.Name + " from another cluster with outlier detection"
	},
	func(in *translation.Input, rng *rand.Rand) string {
		p := &in.AccessPolicies[rng.IntN(len(in.AccessPolicies))]
		ns := in.Workloads[rng.IntN(len(in.Workloads))].Spec.Kubernetes.Controller.Namespace
		p.Spec.SourceSelector = []common.IdentitySelector{{KubeIdentityMatcher: &common.KubeIdentityMatcher{Namespaces: []string{ns}, Clusters: []string{fmt.Sprintf("cluster-%d", rng.IntN(4))}}}}
		p.Generation++
		return "edit AccessPolicy sources " + p.Name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		i := rng.IntN(len(in.AccessPolicies))
		name := in.AccessPolicies[i].Name
		in.AccessPolicies = slices.Delete(in.AccessPolicies, i, i+1)
		return "delete AccessPolicy " + name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		// A tenant policy reaching another namespace is Invalid.
		p := in.AccessPolicies[rng.IntN(len(in.AccessPolicies))]
		p.Namespace, p.Name = "team-a", fmt.Sprintf("tenant-%d", rng.IntN(1000))
		in.AccessPolicies = append(in.AccessPolicies, p)
		return "add tenant AccessPolicy " + p.Name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		d := &in.Destinations[rng.IntN(len(in.Destinations))]
		d.Spec.KubeService.Ports = append(slices.Clone(d.Spec.KubeService.Ports), discoveryv1alpha1.ServicePort{Port: int32(9000 + rng.IntN(100)), Name: "grpc"})
		d.Generation++
		return "add a port to Destination " + d.Name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		i := rng.IntN(len(in.Destinations))
		name := in.Destinations[i].Name
		in.Destinations = slices.Delete(in.Destinations, i, i+1)
		return "delete Destination " + name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		i := rng.IntN(len(in.Workloads))
		name := in.Workloads[i].Name
		in.Workloads = slices.Delete(in.Workloads, i, i+1)
		return "delete Workload " + name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		w := in.Workloads[rng.IntN(len(in.Workloads))]
		w.Name += fmt.Sprintf("-new-%d", rng.IntN(1000))
		w.Spec.Kubernetes.ServiceAccountName = "other"
		w.Spec.Kubernetes.Controller.ClusterName = fmt.Sprintf("cluster-%d", rng.IntN(4))
		in.Workloads = append(in.Workloads, w)
		return "add Workload " + w.Name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		m := &in.Meshes[rng.IntN(len(in.Meshes))]
		m.Spec.Istio.Gateways = slices.Clone(m.Spec.Istio.Gateways)
		m.Spec.Istio.Gateways[0].ExternalAddress = fmt.Sprintf("192.0.2.%d", rng.IntN(250)+1)
		m.Generation++
		return "move the east-west gateway of " + m.Name
	},
	func(in *translation.Input, rng *rand.Rand) string {
		if len(in.VirtualMeshes) == 0 {
			return "no VirtualMesh"
		}
		vm := &in.VirtualMeshes[0]
		vm.Spec.GlobalAccessPolicy = networkingv1alpha1.GlobalAccessEnabled
		vm.Spec.MTLS = &networkingv1alpha1.MTLSConfig{StrictMTLS: rng.IntN(2) == 0}
		vm.Generation++
		return "change the VirtualMesh's access and mTLS"
	},
	func(in *translation.Input, rng *rand.Rand) string {
		// The registry changes a grant, its mesh's trust domain still in
		// it (a refused one turns the VirtualMesh Invalid, where the
		// engine keeps the last good outputs on purpose:
		// TestGrantChangeReachesTheVirtualMesh).
		c := &in.Clusters[rng.IntN(len(in.Clusters))]
		what := "restore the default grant of " + c.Name
		if rng.IntN(2) == 0 {
			c.Spec.TrustDomains = []multiclusterv1alpha1.TrustDomainGrant{{Name: c.Name + ".local"}, {Name: fmt.Sprintf("%s-%d.example", c.Name, rng.IntN(1000))}}
			what = "grant " + c.Name + " one more trust domain"
		} else {
			c.Spec.TrustDomains = nil
		}
		c.Generation++
		return what
	},
	func(in *translation.Input, rng *rand.Rand) string {
		// A foreign identity: admitted only where the Destination's
		// VirtualMesh trusts its trust domain.
		p := &in.AccessPolicies[rng.IntN(len(in.AccessPolicies))]
		p.Spec.SourceSelector = append(slices.Clone(p.Spec.SourceSelector),
			common.IdentitySelector{SpiffeIDs: []string{fmt.Sprintf("spiffe://spire.example/ns/default/sa/client-%d", rng.IntN(3))}})
		p.Generation++
		return "AccessPolicy " + p.Name + " names a foreign identity"
	},
	func(in *translation.Input, rng *rand.Rand) string {
		if len(in.VirtualMeshes) == 0 {
			return "no VirtualMesh"
		}
		vm := &in.VirtualMeshes[0]
		mtls := vm.Spec.MTLS.DeepCopy()
		if mtls == nil {
			mtls = &networkingv1alpha1.MTLSConfig{}
		}
		what := "the VirtualMesh no longer trusts spire.example"
		mtls.FederatedTrustDomains = nil
		if rng.IntN(2) == 0 {
			mtls.FederatedTrustDomains = []string{"spire.example"}
			what = "the VirtualMesh trusts spire.example"
		}
		vm.Spec.MTLS = mtls
		vm.Generation++
		return what
	},
}

// Random sequences of edits: after every one the engine agrees with a full
// translation, and it recomputes less than everything.
func TestEngineAgreesAfterRandomEdits(t *testing.T) {
	var merged atomic.Int64 // steps that published a DestinationRule merged from two translators
	t.Cleanup(func() {      // after the parallel subtests
		assert.Positive(t, merged.Load(), "the edits never made federation and a TrafficPolicy share a DestinationRule")
	})
	seeds, steps := uint64(8), 60
	if testing.Short() {
		seeds, steps = 8, 12
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 42))
			in := worldtest.New(t, worldtest.Translation(4, 24, 24, seed%2 == 0))
			if seed%4 >= 2 {
				// As from an apiserver: a version is the UID and
				// generation, and the engine takes an unchanged
				// object's key and version from the cycle before.
				in = worldtest.WithUIDs(in)
			}
			e := controller.NewEngine("relaymesh")
			requireSameAsFull(t, e, e.Translate(in), in, "start")
			for step := range steps {
				what := edits[rng.IntN(len(edits))](in, rng)
				r := e.Translate(in)
				requireSameAsFull(t, e, r, in, fmt.Sprintf("step %d (%s)", step, what))
				for _, o := range e.Objects() {
					if len(o.Parents) > 1 && o.Parents[0].Kind != o.Parents[len(o.Parents)-1].Kind {
						merged.Add(1)
						break
					}
				}
				require.False(t, e.Stats().Full, "step %d (%s): %s", step, what, e.Stats().FullReason)
			}
		})
	}
}

// The engine takes an object's key and version from the cycle before only
// for the same object: an object deleted and created again under its name
// (a new UID, the same generation), an object removed while another of its
// kind is added (as many objects as before), and a grant changed with
// nothing else are each seen, and the result is the full translation's.
func TestEngineSeesObjectsReplacedUnderTheirNames(t *testing.T) {
	in := worldtest.WithUIDs(worldtest.New(t, worldtest.Translation(4, 24, 24, true)))
	e := controller.NewEngine("relaymesh")
	requireSameAsFull(t, e, e.Translate(in), in, "start")

	e.Dirty()
	e.Translate(in)
	assert.Zero(t, e.Stats().Recomputed, "nothing changed, nothing recomputed")
	assert.Empty(t, e.Dirty(), "nothing changed, nothing republished")

	step := func(what string) {
		t.Helper()
		requireSameAsFull(t, e, e.Translate(in), in, what)
		require.False(t, e.Stats().Full, "%s: translated in full (%s), so the kept keys and versions went untested", what, e.Stats().FullReason)
	}

	p := &in.TrafficPolicies[0]
	p.UID += "-again"
	p.Spec.HTTPRequestMatchers = []networkingv1alpha1.HTTPMatcher{{URI: &networkingv1alpha1.StringMatch{Prefix: new("/recreated")}}}
	step("a TrafficPolicy created again under its name")
	assert.NotEmpty(t, e.Dirty(), "the recreated policy's clusters are republished")

	gone := in.Destinations[0].Name
	added := *in.Destinations[1].DeepCopy()
	added.Name, added.UID = "added", "uid-added"
	added.Spec.KubeService.Ref.Name = "added"
	in.Destinations[0] = added
	step("Destination " + gone + " removed as another is added")

	c := &in.Clusters[0]
	c.Spec.TrustDomains = []multiclusterv1alpha1.TrustDomainGrant{{Name: c.Name + ".local"}, {Name: "other.example"}}
	c.Generation++
	step("a grant changed")
	assert.Positive(t, e.Stats().Recomputed, "a grant is a dependency of federation")
}

// One policy edit recomputes that policy's unit only and republishes only
// the clusters whose objects changed.
func TestOneEditRecomputesOneUnit(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(10, 100, 100, true))
	e := controller.NewEngine("relaymesh")
	e.Translate(in)
	all := e.Dirty()
	require.Len(t, all, 10, "the first translation publishes every cluster")

	p := &in.TrafficPolicies[0]
	p.Spec.HTTPRequestMatchers[0].URI.Prefix = new("/edited")
	p.Generation++
	r := e.Translate(in)
	requireSameAsFull(t, e, r, in, "after the edit")
	assert.Equal(t, 1, e.Stats().Recomputed, "units recomputed of %d", e.Stats().Units)
	assert.Equal(t, []string{p.Spec.SourceSelector[0].Clusters[0]}, e.Dirty(), "only the policy's source cluster changes")

	// A Service port change in one cluster re-exports that Destination to
	// the other nine meshes and nothing else.
	d := &in.Destinations[3]
	d.Spec.KubeService.Ports = append(slices.Clone(d.Spec.KubeService.Ports), discoveryv1alpha1.ServicePort{Port: 9090, Name: "grpc"})
	d.Generation++
	r = e.Translate(in)
	requireSameAsFull(t, e, r, in, "after the port change")
	assert.LessOrEqual(t, e.Stats().Recomputed, 3, "fed/ for the Destination, and its traffic and access units")
	assert.Len(t, e.Dirty(), 10, "a federated Destination's change reaches every mesh")
}

// A grant the registry changes reaches the VirtualMesh at once: it turns
// Invalid naming the grant (keeping its last good outputs, as any Invalid
// VirtualMesh does), and valid again, equal to a full translation, when the
// grant is restored; a grant held twice does the same.
func TestGrantChangeReachesTheVirtualMesh(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(3, 6, 6, true))
	e := controller.NewEngine("relaymesh")
	requireSameAsFull(t, e, e.Translate(in), in, "start")
	vk := translation.ObjectKey{Kind: "VirtualMesh", Namespace: "relaymesh", Name: "all"}
	for _, tc := range []struct {
		name   string
		grants []multiclusterv1alpha1.TrustDomainGrant
		on     int // index of the cluster whose grant changes
		want   string
	}{
		{"a grant without the mesh's trust domain", []multiclusterv1alpha1.TrustDomainGrant{{Name: "elsewhere.example"}}, 1,
			`cluster cluster-1 is not granted trust domain "cluster-1.local" (its grant: elsewhere.example)`},
		{"another cluster's trust domain granted too", []multiclusterv1alpha1.TrustDomainGrant{{Name: "cluster-2.local"}, {Name: "cluster-0.local"}}, 2,
			`trust domain "cluster-0.local" is granted to clusters cluster-0, cluster-2`},
	} {
		c := &in.Clusters[tc.on]
		c.Spec.TrustDomains = tc.grants
		c.Generation++
		r := e.Translate(in)
		st, _, _ := r.Status(vk)
		assert.Equal(t, common.StateInvalid, st.State, tc.name)
		assert.Contains(t, strings.Join(st.Errors, "\n"), tc.want, tc.name)
		assert.Contains(t, st.Warnings, "its meshes keep the outputs of generation 1, the last valid one, until the VirtualMesh is valid again or deleted", tc.name)
		full, _ := all.Translate(in, "relaymesh")
		for _, o := range full.Objects() {
			assert.NotContains(t, o.Object.GetAnnotations()[outputs.ParentsAnnotation], "VirtualMesh/", "%s: a full translation federates nothing", tc.name)
		}

		c.Spec.TrustDomains = nil
		c.Generation++
		requireSameAsFull(t, e, e.Translate(in), in, tc.name+", restored")
		st, _, _ = e.Translate(in).Status(vk)
		assert.Equal(t, common.StateAccepted, st.State, tc.name)
	}
}

// A VirtualMesh that turns Invalid keeps its last good outputs, says so in
// its status, and loses them when it is deleted.
// A member's cluster deregistered (its KubernetesCluster and what its
// agent discovered gone) takes no part: the VirtualMesh stays Accepted with
// a warning, and nothing the cluster exported is kept anywhere — unlike a
// VirtualMesh made Invalid by an edit, which keeps its last good outputs.
func TestADeregisteredMemberKeepsNothing(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(3, 6, 0, true))
	e := controller.NewEngine("relaymesh")
	e.Translate(in)
	gone := in.VirtualMeshes[0].Spec.Meshes[2].ClusterName
	exported := func() []string {
		var out []string
		for _, o := range e.Objects() {
			b, err := json.Marshal(o.Object.Object)
			require.NoError(t, err)
			if o.Cluster != gone && strings.Contains(string(b), "svc."+gone+".") {
				out = append(out, o.Cluster+"/"+o.Object.GetKind()+"/"+o.Object.GetName())
			}
		}
		return out
	}
	require.NotEmpty(t, exported(), "the cluster's Destinations are federated to the others")

	in.Clusters = slices.DeleteFunc(in.Clusters, func(kc multiclusterv1alpha1.KubernetesCluster) bool { return kc.Name == gone })
	in.Meshes = slices.DeleteFunc(in.Meshes, func(m discoveryv1alpha1.Mesh) bool { return m.Spec.Istio.Installation.Cluster == gone })
	in.Destinations = slices.DeleteFunc(in.Destinations, func(d discoveryv1alpha1.Destination) bool { return d.Spec.KubeService.Ref.ClusterName == gone })
	in.Workloads = slices.DeleteFunc(in.Workloads, func(w discoveryv1alpha1.Workload) bool { return w.Spec.Kubernetes.Controller.ClusterName == gone })
	r := e.Translate(in)
	st, _, _ := r.Status(translation.ObjectKey{Kind: "VirtualMesh", Namespace: "relaymesh", Name: "all"})
	assert.Equal(t, common.StateAccepted, st.State, "%v", st.Errors)
	assert.Contains(t, strings.Join(st.Warnings, "\n"), "cluster "+gone+" is not registered")
	assert.Empty(t, exported(), "nothing the deregistered cluster exported is kept")
}

func TestInvalidVirtualMeshKeepsLastGoodOutputs(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(3, 6, 0, true))
	e := controller.NewEngine("relaymesh")
	e.Translate(in)
	before := e.Objects()
	require.NotEmpty(t, before)
	e.Dirty()

	vm := &in.VirtualMeshes[0]
	vm.Spec.Meshes = append(slices.Clone(vm.Spec.Meshes), common.ClusterObjectRef{ClusterName: vm.Spec.Meshes[0].ClusterName, Namespace: "istio-system", Name: "no-such-mesh"})
	vm.Generation = 2
	r := e.Translate(in)
	st, _, _ := r.Status(translation.ObjectKey{Kind: "VirtualMesh", Namespace: "relaymesh", Name: "all"})
	assert.Equal(t, common.StateInvalid, st.State)
	assert.Contains(t, st.Errors[0], "no-such-mesh")
	assert.Contains(t, st.Warnings, "its meshes keep the outputs of generation 1, the last valid one, until the VirtualMesh is valid again or deleted")
	assert.Equal(t, len(before), len(e.Objects()), "every federation output is kept")
	assert.Empty(t, e.Dirty(), "nothing is republished")

	// A full translation would remove them: the engine remembers.
	out, _ := all.Translate(in, "relaymesh")
	assert.Empty(t, out.Objects())

	in.VirtualMeshes = nil
	e.Translate(in)
	assert.Empty(t, e.Objects(), "a deleted VirtualMesh keeps nothing")
	assert.Len(t, e.Dirty(), 3)
}

// The engine follows everything ambient federation reads besides the
// exported Destination (review finding: the consuming member's network and
// trust domain, a Service of that name in the consuming cluster, the pods'
// Workloads): after each edit it publishes exactly what a full translation
// gives — in particular nothing for a pair the edit refuses.
func TestEngineFollowsAmbientFederationInputs(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "federation", "testdata", "ambient-multinetwork"))
	e := controller.NewEngine("relaymesh")
	requireSameAsFull(t, e, e.Translate(in), in, "start")
	meshOf := func(cluster string) *discoveryv1alpha1.Mesh {
		for i := range in.Meshes {
			if in.Meshes[i].Spec.Istio.Installation.Cluster == cluster {
				return &in.Meshes[i]
			}
		}
		t.Fatalf("no mesh of %s", cluster)
		return nil
	}
	for _, step := range []struct {
		name string
		edit func()
	}{
		{"a pod's account changes", func() {
			for i := range in.Workloads {
				if in.Workloads[i].Spec.Kubernetes.Controller.Name == "ratings-v1" {
					in.Workloads[i].Spec.Kubernetes.ServiceAccountName = "ratings-v2"
					in.Workloads[i].Generation++
				}
			}
		}},
		{"the consumer moves to the exporter's network", func() {
			m := meshOf("cluster-1")
			m.Spec.Istio.Ambient.Network = "net-2"
			m.Generation++
		}},
		{"the consumer's network back", func() {
			m := meshOf("cluster-1")
			m.Spec.Istio.Ambient.Network = "net-1"
			m.Generation++
		}},
		{"the consumer gets a ratings Service of its own", func() {
			d := in.Destinations[0].DeepCopy()
			for i := range in.Destinations {
				if in.Destinations[i].Spec.KubeService.Ref.Name == "ratings" {
					d = in.Destinations[i].DeepCopy()
				}
			}
			d.Name = "ratings-shop-cluster-1"
			d.Spec.KubeService.Ref.ClusterName = "cluster-1"
			d.Spec.Mesh.Name = meshOf("cluster-1").Name
			d.Spec.KubeService.Endpoints = nil
			in.Destinations = append(in.Destinations, *d)
		}},
		{"the consumer's trust domain differs", func() {
			m := meshOf("cluster-1")
			m.Spec.Istio.TrustDomain = "cluster-1.local"
			m.Generation++
			for i := range in.Clusters {
				if in.Clusters[i].Name == "cluster-1" {
					in.Clusters[i].Spec.TrustDomains = nil
					in.Clusters[i].Generation++
				}
			}
		}},
	} {
		step.edit()
		requireSameAsFull(t, e, e.Translate(in), in, step.name)
	}
}

// The engine follows what ambient failover reads besides the
// VirtualDestination and its backends: an AccessPolicy that selects one
// backend only makes it Invalid (failover would bypass that backend's L7
// rules), and one that selects both makes it valid again.
func TestEngineFollowsAmbientFailoverInputs(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "federation", "testdata", "vd-ambient-failover"))
	e := controller.NewEngine("relaymesh")
	requireSameAsFull(t, e, e.Translate(in), in, "start")
	policy := func(sel common.DestinationSelector) networkingv1alpha1.AccessPolicy {
		return networkingv1alpha1.AccessPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "reviews-readers", Namespace: "relaymesh", Generation: int64(len(in.AccessPolicies) + 1)},
			Spec:       networkingv1alpha1.AccessPolicySpec{DestinationSelector: []common.DestinationSelector{sel}, AllowedPaths: []string{"/public"}},
		}
	}
	for _, step := range []struct {
		name string
		edit func()
	}{
		{"a policy on cluster-2's reviews only", func() {
			in.AccessPolicies = []networkingv1alpha1.AccessPolicy{policy(common.DestinationSelector{KubeServiceRefs: &common.KubeServiceRefs{
				Services: []common.ClusterObjectRef{{Name: "reviews", Namespace: "shop", ClusterName: "cluster-2"}}}})}
		}},
		{"the policy on both", func() {
			p := policy(common.DestinationSelector{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "reviews"}}})
			p.Generation = 2
			in.AccessPolicies = []networkingv1alpha1.AccessPolicy{p}
		}},
		// The hostname's waypoint policy follows the policy's rules.
		{"the policy's paths change", func() {
			in.AccessPolicies[0].Generation, in.AccessPolicies[0].Spec.AllowedPaths = 3, []string{"/v2"}
		}},
		// A policy Invalid for its namespace reaches neither the Service's
		// rules nor the hostname's, nor the check that backends share them.
		{"a policy of another namespace", func() {
			p := policy(common.DestinationSelector{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "reviews"}}})
			p.Namespace, p.Name, p.Spec.AllowedPaths = "team-a", "reach-shop", []string{"/everything"}
			in.AccessPolicies = append(in.AccessPolicies, p)
		}},
	} {
		step.edit()
		requireSameAsFull(t, e, e.Translate(in), in, step.name)
	}
	var hostname string
	for _, o := range e.Objects() {
		if o.Cluster == "cluster-1" && o.Object.GetName() == "relaymesh-vd-reviews-shop.hostname" {
			b, err := json.Marshal(o.Object.Object["spec"])
			require.NoError(t, err)
			hostname = string(b)
		}
	}
	assert.Contains(t, hostname, `"/v2"`, "the hostname takes the Service's waypoint rules")
	assert.NotContains(t, hostname, "/everything", "and none of the Invalid policy")
}
