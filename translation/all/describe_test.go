package all_test

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// translateAll runs every translator, as the server's controller does.
func translateAll(in *translation.Input) (*translation.Output, *translation.Report) {
	out, r := translation.NewOutput(), translation.NewReport()
	federation.Translate(in, out, r)
	policy.TranslateAccess(in, out, r)
	policy.TranslateTraffic(in, out, r)
	return out, r
}

// policyInput is the traffic-shift golden case plus an older timeout policy
// on reviews, a policy on ratings, and an AccessPolicy on reviews.
func policyInput(t *testing.T) *translation.Input {
	in := translationtest.LoadInput(t, "../../policy/testdata/traffic/shift-subsets-and-remote")
	reviews := []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "reviews", Namespace: "bookinfo", ClusterName: "cluster-1"}}}}}
	ratings := []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "ratings", Namespace: "bookinfo", ClusterName: "cluster-1"}}}}}
	meta := func(name string, day int) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: "bookinfo", Generation: 1, CreationTimestamp: metav1.NewTime(time.Date(2024, 12, day, 0, 0, 0, 0, time.UTC))}
	}
	in.TrafficPolicies = append(in.TrafficPolicies,
		networkingv1alpha1.TrafficPolicy{ObjectMeta: meta("reviews-timeout", 1), Spec: networkingv1alpha1.TrafficPolicySpec{
			DestinationSelector: reviews, Policy: networkingv1alpha1.Policy{RequestTimeout: &metav1.Duration{Duration: 2 * time.Second}}}},
		networkingv1alpha1.TrafficPolicy{ObjectMeta: meta("ratings-timeout", 2), Spec: networkingv1alpha1.TrafficPolicySpec{
			DestinationSelector: ratings, Policy: networkingv1alpha1.Policy{RequestTimeout: &metav1.Duration{Duration: time.Second}}}})
	in.AccessPolicies = append(in.AccessPolicies, networkingv1alpha1.AccessPolicy{ObjectMeta: meta("reviews-from-productpage", 3), Spec: networkingv1alpha1.AccessPolicySpec{
		SourceSelector: []common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{
			{Name: "bookinfo-productpage", Namespace: "bookinfo", ClusterName: "cluster-1"}}}}},
		DestinationSelector: reviews}})
	return in
}

func names(ps []all.AppliedPolicy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Kind+"/"+p.Namespace+"/"+p.Name+" "+p.State)
	}
	return out
}

func refs(os []all.OutputRef) []string {
	var out []string
	for _, o := range os {
		out = append(out, o.Cluster+" "+o.Kind+" "+o.Namespace+"/"+o.Name)
	}
	return out
}

func TestDescribeDestination(t *testing.T) {
	in := policyInput(t)
	out, r := translateAll(in)
	d, err := all.DescribeDestination(in, out, r, "reviews-bookinfo-cluster-1")
	require.NoError(t, err)
	assert.Equal(t, common.ClusterObjectRef{Name: "reviews", Namespace: "bookinfo", ClusterName: "cluster-1"}, d.Service)
	assert.Equal(t, "istiod-istio-system-cluster-1", d.Mesh)
	assert.Equal(t, "sidecar", d.DataPlane, "no mode from discovery is a sidecar")
	assert.Empty(t, d.Waypoint)
	assert.Equal(t, []string{"reviews.bookinfo.svc.cluster.local", "reviews.bookinfo.svc.cluster-1.global"}, d.Hostnames)
	// Translation order: oldest first.
	assert.Equal(t, []string{"TrafficPolicy/bookinfo/reviews-timeout Accepted", "TrafficPolicy/bookinfo/reviews-canary Accepted"}, names(d.Traffic))
	require.NotNil(t, d.Traffic[1].Target)
	assert.Equal(t, "cluster-1/bookinfo/reviews", d.Traffic[1].Target.Target)
	assert.Equal(t, []string{"AccessPolicy/bookinfo/reviews-from-productpage Accepted"}, names(d.Access))
	// The golden input's VirtualMesh federates both meshes.
	require.Len(t, d.Federated, 1)
	assert.Equal(t, "reviews.bookinfo.svc.cluster-1.global", d.Federated[0].Hostname)
	assert.Equal(t, []string{"cluster-2/istio-system/istiod"}, d.Federated[0].ToMeshes)
	assert.Equal(t, []string{
		"cluster-1 DestinationRule bookinfo/relaymesh-reviews",
		"cluster-1 VirtualService bookinfo/relaymesh-reviews",
		"cluster-1 AuthorizationPolicy bookinfo/relaymesh-reviews",
		// reviews-timeout applies to sources in every cluster: cluster-2
		// reaches reviews of cluster-1 through its federated hostname
		// (without the VirtualMesh it could not, and would get nothing).
		"cluster-2 VirtualService bookinfo/relaymesh-reviews-cluster-1",
	}, refs(d.Outputs))

	// A Destination nothing selects has no policies and no outputs.
	d, err = all.DescribeDestination(in, out, r, "details-bookinfo-cluster-1")
	require.NoError(t, err)
	assert.Empty(t, d.Traffic)
	assert.Empty(t, d.Access)
	assert.Empty(t, d.Outputs)
}

// TestDescribeDestinationInMigration: a Destination in the middle of a
// move to ambient says so, names its waypoint, and lists the three
// policies of both modes.
func TestDescribeDestinationInMigration(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "policy", "testdata", "access", "ambient-mixed-migration"))
	out, r := translateAll(in)
	d, err := all.DescribeDestination(in, out, r, "reviews-shop-cluster-1")
	require.NoError(t, err)
	assert.Equal(t, "mixed", d.DataPlane)
	assert.Equal(t, "shop/waypoint", d.Waypoint)
	assert.Equal(t, "Gateway API (mixed data plane)", d.Routing)
	assert.Equal(t, []string{
		"cluster-1 AuthorizationPolicy shop/relaymesh-reviews",
		"cluster-1 AuthorizationPolicy shop/relaymesh-reviews.waypoint",
		"cluster-1 AuthorizationPolicy shop/relaymesh-reviews.ztunnel",
	}, refs(d.Outputs))
}

func TestDescribeDestinationFederated(t *testing.T) {
	in := translationtest.LoadInput(t, "../../federation/testdata/basic")
	out, r := translateAll(in)
	d, err := all.DescribeDestination(in, out, r, "reviews-bookinfo-cluster-1")
	require.NoError(t, err)
	require.Len(t, d.Federated, 1)
	f := d.Federated[0]
	assert.Equal(t, "VirtualMesh/relaymesh/bookinfo Accepted", f.Kind+"/"+f.Namespace+"/"+f.Name+" "+f.State)
	assert.Equal(t, "reviews.bookinfo.svc.cluster-1.global", f.Hostname)
	assert.Equal(t, []string{"cluster-2/istio-system/istiod"}, f.ToMeshes)
	assert.Equal(t, []string{
		"cluster-1 Gateway istio-system/relaymesh-federation-istio-eastwestgateway-istio-system",
		"cluster-1 ServiceEntry bookinfo/reviews-bookinfo-cluster-1",
		"cluster-2 DestinationRule istio-system/reviews-bookinfo-cluster-1",
		"cluster-2 ServiceEntry istio-system/reviews-bookinfo-cluster-1",
	}, refs(d.Outputs))
}

func TestDescribeWorkload(t *testing.T) {
	in := policyInput(t)
	_, r := translateAll(in)
	tests := []struct {
		name            string
		traffic, access []string
	}{
		// reviews-timeout and ratings-timeout select every source.
		{"productpage-v1-bookinfo-cluster-1-deployment",
			[]string{"TrafficPolicy/bookinfo/reviews-timeout Accepted", "TrafficPolicy/bookinfo/ratings-timeout Accepted", "TrafficPolicy/bookinfo/reviews-canary Accepted"},
			[]string{"AccessPolicy/bookinfo/reviews-from-productpage Accepted"}},
		{"sleep-tools-cluster-2-deployment",
			[]string{"TrafficPolicy/bookinfo/reviews-timeout Accepted", "TrafficPolicy/bookinfo/ratings-timeout Accepted"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := all.DescribeWorkload(in, r, tt.name)
			require.NoError(t, err)
			assert.Equal(t, tt.traffic, names(w.Traffic))
			assert.Equal(t, tt.access, names(w.Access))
		})
	}
	w, err := all.DescribeWorkload(in, r, "sleep-tools-cluster-2-deployment")
	require.NoError(t, err)
	assert.Equal(t, "sleep", w.ServiceAccount)
	assert.Equal(t, "cluster-2", w.Controller.ClusterName)
	assert.Equal(t, "Deployment", w.ControllerKind)
}

func TestDescribePolicy(t *testing.T) {
	in := policyInput(t)
	out, r := translateAll(in)
	p, err := all.DescribePolicy(in, out, r, translation.KindTrafficPolicy, "bookinfo", "reviews-canary")
	require.NoError(t, err)
	assert.Equal(t, "Accepted", p.State)
	assert.Equal(t, int64(1), p.ObservedGeneration)
	assert.Equal(t, []string{"reviews-bookinfo-cluster-1"}, p.Destinations)
	assert.Equal(t, []string{"productpage-v1-bookinfo-cluster-1-deployment"}, p.Workloads)
	require.Len(t, p.Outputs, 1)
	assert.Equal(t, "cluster-1", p.Outputs[0].Cluster)
	assert.Equal(t, []string{"cluster-1 DestinationRule bookinfo/relaymesh-reviews", "cluster-1 VirtualService bookinfo/relaymesh-reviews"}, refs(p.Outputs[0].Objects))

	fin := translationtest.LoadInput(t, "../../federation/testdata/basic")
	fout, fr := translateAll(fin)
	p, err = all.DescribePolicy(fin, fout, fr, translation.KindVirtualMesh, "relaymesh", "bookinfo")
	require.NoError(t, err)
	assert.Equal(t, []string{"cluster-1/istio-system/istiod", "cluster-2/istio-system/istiod"}, p.Meshes)
	assert.Len(t, p.Destinations, 5)
	require.Len(t, p.Outputs, 2)
	assert.Equal(t, "cluster-2", p.Outputs[1].Cluster)
	assert.Nil(t, p.Workloads)
}

func TestDescribeErrors(t *testing.T) {
	in := policyInput(t)
	out, r := translateAll(in)

	_, err := all.DescribeDestination(in, out, r, "reviews-bookinfo-cluster-3")
	require.ErrorIs(t, err, all.ErrNotFound)
	var nf *all.NotFoundError
	require.True(t, errors.As(err, &nf))
	assert.Equal(t, []string{"reviews-bookinfo-cluster-1", "reviews-bookinfo-cluster-2"}, nf.Similar)
	assert.Contains(t, err.Error(), `destination "reviews-bookinfo-cluster-3" not found; did you mean reviews-bookinfo-cluster-1, reviews-bookinfo-cluster-2?`)

	_, err = all.DescribeDestination(in, out, r, "zzz")
	assert.EqualError(t, err, `destination "zzz" not found`)

	_, err = all.DescribeWorkload(in, r, "sleep")
	assert.ErrorContains(t, err, "did you mean sleep-tools-cluster-2-deployment?")

	_, err = all.DescribePolicy(in, out, r, translation.KindTrafficPolicy, "bookinfo", "reviews")
	assert.ErrorContains(t, err, "bookinfo/reviews-canary, bookinfo/reviews-timeout")
	_, err = all.DescribePolicy(in, out, r, translation.KindAccessPolicy, "default", "reviews-from-productpage")
	require.ErrorIs(t, err, all.ErrNotFound)

	for _, k := range []string{"trafficpolicy", "TrafficPolicies", "ap", "VirtualMesh", "virtualdestination"} {
		_, err := translation.PolicyKind(k)
		assert.NoError(t, err, k)
	}
	_, err = translation.PolicyKind("service")
	assert.ErrorIs(t, err, translation.ErrUnknownKind)
	_, err = all.DescribePolicy(in, out, r, "Service", "a", "b")
	assert.ErrorIs(t, err, translation.ErrUnknownKind)
}

// federatedClusters are the clusters, other than d's own, where the
// translation's output defines d's federated hostname: where federation
// really exported d, read from the outputs, not from the plan.
func federatedClusters(out *translation.Output, d *all.DestinationDescription) []string {
	var clusters []string
	for _, o := range out.Objects() {
		if o.Cluster == d.Service.ClusterName || o.Object.GetKind() != "ServiceEntry" {
			continue
		}
		hosts, _, _ := unstructured.NestedStringSlice(o.Object.Object, "spec", "hosts")
		for _, f := range d.Federated {
			if slices.Contains(hosts, f.Hostname) {
				clusters = append(clusters, o.Cluster)
			}
		}
	}
	slices.Sort(clusters)
	return slices.Compact(clusters)
}

// describedClusters are the clusters, other than d's own, of the meshes
// describe says d is federated to.
func describedClusters(d *all.DestinationDescription) []string {
	var clusters []string
	for _, f := range d.Federated {
		for _, m := range f.ToMeshes {
			if c, _, _ := strings.Cut(m, "/"); c != d.Service.ClusterName {
				clusters = append(clusters, c)
			}
		}
	}
	slices.Sort(clusters)
	return slices.Compact(clusters)
}

// TestDescribeAgreesWithFederation: describe says a Destination is
// federated exactly where the translation exports it. The cases are where
// describe's own reading of a VirtualMesh used to differ from the
// federation plan's: a selector naming a mesh that is not a member
// (describe matched the other references and ignored that one; federation
// refuses the VirtualMesh), and a mesh two VirtualMeshes list (describe
// listed both; the earlier one owns the mesh, the later is Invalid).
func TestDescribeAgreesWithFederation(t *testing.T) {
	ref := func(cluster string) common.ClusterObjectRef {
		return common.ClusterObjectRef{ClusterName: cluster, Namespace: "istio-system", Name: "istiod"}
	}
	tests := []struct {
		name, dir string
		edit      func(in *translation.Input)
		// federated: the Destination is federated at all.
		federated bool
	}{
		{name: "basic", dir: "basic", edit: func(*translation.Input) {}, federated: true},
		{name: "a selector names a mesh that is not a member", dir: "basic", edit: func(in *translation.Input) {
			in.VirtualMeshes[0].Spec.Federation.Selectors = []networkingv1alpha1.FederationSelector{{Meshes: []common.ClusterObjectRef{ref("cluster-2"), ref("cluster-3")}}}
		}},
		{name: "a mesh in two VirtualMeshes, the later one federating", dir: "mesh-in-two-virtualmeshes", edit: func(in *translation.Input) {
			for i := range in.VirtualMeshes {
				if vm := &in.VirtualMeshes[i]; vm.Name == "a-second" {
					vm.Spec.Federation = &networkingv1alpha1.Federation{Selectors: []networkingv1alpha1.FederationSelector{{}}}
				} else {
					vm.Spec.Federation = nil // only the later one would federate
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := translationtest.LoadInput(t, "../../federation/testdata/"+tt.dir)
			tt.edit(in)
			out, r := all.Translate(in, "relaymesh")
			federated := false
			for _, dst := range in.Destinations {
				if dst.Spec.KubeService.Ref.ClusterName != "cluster-2" && tt.dir != "basic" {
					continue
				}
				d, err := all.DescribeDestination(in, out, r, dst.Name)
				require.NoError(t, err)
				assert.Equal(t, federatedClusters(out, d), describedClusters(d), "%s: describe and the outputs disagree on where it is federated", dst.Name)
				if len(d.Federated) > 0 {
					federated = true
					assert.True(t, d.Federated[0].InForce, "%s: described as federated by a VirtualMesh that is not in force", dst.Name)
				}
			}
			assert.Equal(t, tt.federated, federated)
		})
	}
}

// TestDescribeDestinationOptedIntoGatewayAPI: a sidecar Destination whose
// Service says relaymesh.io/route-api=gateway-api is routed by Gateway API
// and says why; its neighbour with an unknown value keeps Istio's API.
func TestDescribeDestinationOptedIntoGatewayAPI(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "policy", "testdata", "traffic", "gateway-api-opt-in"))
	out, r := translateAll(in)
	d, err := all.DescribeDestination(in, out, r, "web-shop-cluster-1")
	require.NoError(t, err)
	assert.Equal(t, "sidecar", d.DataPlane)
	assert.Equal(t, "Gateway API (relaymesh.io/route-api=gateway-api)", d.Routing)
	assert.Contains(t, refs(d.Outputs), "cluster-1 HTTPRoute shop/relaymesh-web")
	d, err = all.DescribeDestination(in, out, r, "legacy-shop-cluster-1")
	require.NoError(t, err)
	assert.Equal(t, "Istio (VirtualService)", d.Routing)
}
