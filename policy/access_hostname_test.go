package policy_test

import (
	"path/filepath"
	"strings"
	"testing"

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

// hostnameWorld is the vd-ambient-failover golden (reviews in two ambient
// clusters, each bound to its waypoint, a static VirtualDestination with
// hostname reviews.global on port 9080) with AccessPolicies added.
func hostnameWorld(t *testing.T, policies ...networkingv1alpha1.AccessPolicy) *translation.Input {
	t.Helper()
	in := translationtest.LoadInput(t, filepath.Join("..", "federation", "testdata", "vd-ambient-failover"))
	in.AccessPolicies = append(in.AccessPolicies, policies...)
	return in
}

// reviewsPolicy selects reviews in every cluster and admits shop/reviews.
func reviewsPolicy(namespace, name string, edit func(*networkingv1alpha1.AccessPolicySpec)) networkingv1alpha1.AccessPolicy {
	p := networkingv1alpha1.AccessPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: networkingv1alpha1.AccessPolicySpec{
			SourceSelector: []common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{
				{Name: "reviews", Namespace: "shop", ClusterName: "cluster-1"}, {Name: "reviews", Namespace: "shop", ClusterName: "cluster-2"}}}}},
			DestinationSelector: []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "reviews"}}}},
		},
	}
	if edit != nil {
		edit(&p.Spec)
	}
	return p
}

// objectIn returns the output object of kind and name in cluster-1's shop
// namespace, or nil.
func objectIn(out *translation.Output, kind, name string) *unstructured.Unstructured {
	for _, o := range out.Objects() {
		if o.Cluster == "cluster-1" && o.Object.GetKind() == kind && o.Object.GetNamespace() == "shop" && o.Object.GetName() == name {
			return o.Object
		}
	}
	return nil
}

// The hostname's ServiceEntry gets the rules of the Service's waypoint: a
// waypoint applies to a ServiceEntry's filter chain only the policies that
// target the ServiceEntry, so without them reviews.global would reach
// reviews past its AccessPolicies.
func TestHostnameTakesTheServicesWaypointRules(t *testing.T) {
	in := hostnameWorld(t, reviewsPolicy("relaymesh", "reviews-get", func(s *networkingv1alpha1.AccessPolicySpec) {
		s.AllowedMethods = []string{"GET"}
		s.AllowedPaths = []string{"/reviews/*"}
	}))
	out, r := all.Translate(in, "relaymesh")
	require.NotContains(t, string(translationtest.RenderReport(t, r)), "Invalid")

	service := objectIn(out, "AuthorizationPolicy", "relaymesh-reviews.waypoint")
	require.NotNil(t, service, "the Service's waypoint policy")
	hostname := objectIn(out, "AuthorizationPolicy", "relaymesh-vd-reviews-shop.hostname")
	require.NotNil(t, hostname, "the hostname's waypoint policy")
	assert.Equal(t, []any{map[string]any{"group": "networking.istio.io", "kind": "ServiceEntry", "name": "relaymesh-vd-reviews-shop"}},
		hostname.Object["spec"].(map[string]any)["targetRefs"])
	assert.Nil(t, hostname.Object["spec"].(map[string]any)["action"], "ALLOW, the default")
	assert.Equal(t, service.Object["spec"].(map[string]any)["rules"], hostname.Object["spec"].(map[string]any)["rules"],
		"the same rules (the VirtualDestination and the Service share port 9080)")
	assert.Contains(t, hostname.GetAnnotations()["relaymesh.io/parents"], "AccessPolicy/relaymesh/reviews-get")
	assert.Contains(t, hostname.GetAnnotations()["relaymesh.io/parents"], "VirtualDestination/shop/reviews")
	assert.NotNil(t, objectIn(out, "ServiceEntry", "relaymesh-vd-reviews-shop"))
}

// A port condition names the Service's port; on the hostname it names the
// VirtualDestination's, and a rule for another port of the Service does not
// apply to the hostname at all. A policy that admits no port of the
// hostname leaves an ALLOW with no rule: no one.
func TestHostnameRulesFollowItsPort(t *testing.T) {
	in := hostnameWorld(t,
		reviewsPolicy("relaymesh", "on-9080", func(s *networkingv1alpha1.AccessPolicySpec) { s.AllowedPorts = []int32{9080, 9443} }),
		reviewsPolicy("relaymesh", "on-9090", func(s *networkingv1alpha1.AccessPolicySpec) {
			s.AllowedPorts = []int32{9090}
			s.AllowedPaths = []string{"/admin"}
		}))
	in.VirtualDestinations[0].Spec.Port.Number = 80
	in.VirtualDestinations[0].Spec.Port.TargetNumber = 9080
	out, r := all.Translate(in, "relaymesh")
	require.NotContains(t, string(translationtest.RenderReport(t, r)), "Invalid", string(translationtest.RenderReport(t, r)))
	hostname := objectIn(out, "AuthorizationPolicy", "relaymesh-vd-reviews-shop.hostname")
	require.NotNil(t, hostname)
	rules := hostname.Object["spec"].(map[string]any)["rules"].([]any)
	require.Len(t, rules, 1, "the 9090 rule does not apply to the hostname")
	rendered := string(translationtest.RenderOutput(t, out))
	assert.Contains(t, strings.Join(strings.Fields(renderOne(t, hostname)), " "), `ports: - "80"`)
	assert.NotContains(t, renderOne(t, hostname), "9080")
	assert.NotContains(t, renderOne(t, hostname), "/admin")
	assert.Contains(t, rendered, "relaymesh-reviews.waypoint")

	// Only the 9090 policy: the hostname admits no one.
	in = hostnameWorld(t, reviewsPolicy("relaymesh", "on-9090", func(s *networkingv1alpha1.AccessPolicySpec) { s.AllowedPorts = []int32{9090} }))
	in.VirtualDestinations[0].Spec.Port.Number = 80
	in.VirtualDestinations[0].Spec.Port.TargetNumber = 9080
	out, _ = all.Translate(in, "relaymesh")
	hostname = objectIn(out, "AuthorizationPolicy", "relaymesh-vd-reviews-shop.hostname")
	require.NotNil(t, hostname)
	assert.Nil(t, hostname.Object["spec"].(map[string]any)["rules"], "an ALLOW without rules admits no one")
}

// Without an AccessPolicy on the Service the hostname gets none either
// (both are open, or both denied by the VirtualMesh's globalAccessPolicy at
// the waypoints' GatewayClass); a policy Invalid for its namespace adds
// nothing to the hostname, as it adds nothing to the Service.
func TestHostnameAccessOnlyFromValidPolicies(t *testing.T) {
	out, _ := all.Translate(hostnameWorld(t), "relaymesh")
	assert.Nil(t, objectIn(out, "AuthorizationPolicy", "relaymesh-vd-reviews-shop.hostname"))

	// team-a may not select Services of shop: Invalid, left out.
	out, r := all.Translate(hostnameWorld(t, reviewsPolicy("team-a", "reach-shop", nil)), "relaymesh")
	assert.Contains(t, string(translationtest.RenderReport(t, r)), "may only target Services in team-a")
	assert.Nil(t, objectIn(out, "AuthorizationPolicy", "relaymesh-vd-reviews-shop.hostname"))
	assert.Nil(t, objectIn(out, "AuthorizationPolicy", "relaymesh-reviews.waypoint"))
}

func renderOne(t *testing.T, u *unstructured.Unstructured) string {
	t.Helper()
	out := translation.NewOutput()
	out.Put(&translation.Object{Cluster: "cluster-1", Object: u})
	return string(translationtest.RenderOutput(t, out))
}

// A hostname whose policy cannot be written is not published: its
// ServiceEntry and route leave the output, and the VirtualDestination's
// target says why (fail closed; the name is the VirtualDestination's own,
// so only a hand-made clash gets here).
func TestHostnameWithoutItsPolicyIsNotPublished(t *testing.T) {
	in := hostnameWorld(t, reviewsPolicy("relaymesh", "reviews-all", nil))
	out, r := translation.NewOutput(), translation.NewReport()
	hostnames := federation.TranslateVirtualDestinationsHostnames(in, out, r)
	require.Len(t, hostnames, 2, "one per cluster")
	require.NoError(t, out.AddObjectMeta("cluster-1", "security.istio.io/v1", "AuthorizationPolicy", "shop", "relaymesh-vd-reviews-shop.hostname",
		map[string]string{"clash": "true"}, nil, map[string]any{}))
	policy.TranslateHostnameAccess(in, hostnames, out, r)
	assert.Nil(t, objectIn(out, "ServiceEntry", "relaymesh-vd-reviews-shop"), "cluster-1's hostname is gone")
	assert.Nil(t, objectIn(out, "HTTPRoute", "relaymesh-vd-reviews-shop"))
	assert.Contains(t, string(translationtest.RenderReport(t, r)), "the hostname is not published in cluster-1: its access rules could not be written")
	var cluster2 []string
	for _, o := range out.Objects() {
		if o.Cluster == "cluster-2" && strings.HasPrefix(o.Object.GetName(), "relaymesh-vd-reviews-shop") {
			cluster2 = append(cluster2, o.Object.GetKind())
		}
	}
	assert.ElementsMatch(t, []string{"AuthorizationPolicy", "DestinationRule", "HTTPRoute", "ServiceEntry"}, cluster2, "cluster-2's is published with its policy")
}
