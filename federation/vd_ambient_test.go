package federation_test

import (
	"path/filepath"
	"strings"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ambientVDInput is the vd-ambient-failover golden's input.
func ambientVDInput(t *testing.T) *translation.Input {
	return translationtest.LoadInput(t, filepath.Join("testdata", "vd-ambient-failover"))
}

func destinationIn(t *testing.T, in *translation.Input, cluster string) *discoveryv1alpha1.Destination {
	t.Helper()
	for i := range in.Destinations {
		if in.Destinations[i].Spec.KubeService.Ref.ClusterName == cluster {
			return &in.Destinations[i]
		}
	}
	t.Fatalf("no destination in %s", cluster)
	return nil
}

// Each precondition of ambient failover, broken alone, makes the
// VirtualDestination Invalid with the reason, and nothing is written.
func TestAmbientFailoverRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*translation.Input)
		want string
	}{
		{"not global", func(in *translation.Input) {
			delete(destinationIn(t, in, "cluster-2").Spec.KubeService.Labels, "istio.io/global")
		}, "is not labelled istio.io/global=true in cluster-2"},
		{"no waypoint", func(in *translation.Input) {
			destinationIn(t, in, "cluster-1").Spec.KubeService.Waypoint = nil
		}, "ambient failover is done by the waypoint of the Service in cluster-1, and Service shop/reviews is bound to no waypoint"},
		{"another name", func(in *translation.Input) {
			d := destinationIn(t, in, "cluster-2")
			d.Spec.KubeService.Ref.Name = "reviews2"
			in.VirtualDestinations[0].Spec.Static.Destinations[1].Name = "reviews2"
		}, "joins one Service of the same name and namespace in every cluster"},
		{"one network", func(in *translation.Input) {
			for i := range in.Meshes {
				in.Meshes[i].Spec.Istio.Ambient.Network = "net-1"
				for j := range in.Meshes[i].Spec.Istio.Ambient.EastWestGateways {
					in.Meshes[i].Spec.Istio.Ambient.EastWestGateways[j].Network = "net-1"
				}
			}
		}, `both meshes are on network "net-1"`},
		{"trust domains", func(in *translation.Input) {
			in.Meshes[1].Spec.Istio.TrustDomain = "other.local"
		}, "ambient meshes federate only with one trust domain"},
		{"an AccessPolicy on one backend only", func(in *translation.Input) {
			in.AccessPolicies = append(in.AccessPolicies, networkingv1alpha1.AccessPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "only-cluster-2", Namespace: "relaymesh"},
				Spec: networkingv1alpha1.AccessPolicySpec{
					DestinationSelector: []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "reviews", Namespace: "shop", ClusterName: "cluster-2"}}}}},
					AllowedPaths:        []string{"/public"},
				},
			})
		}, "are selected by different AccessPolicies (none; relaymesh/only-cluster-2)"},
		{"no pod selector", func(in *translation.Input) {
			destinationIn(t, in, "cluster-2").Spec.KubeService.WorkloadSelectorLabels = nil
		}, "has no pod selector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ambientVDInput(t)
			tc.edit(in)
			out, r := translateVD(in)
			report := string(translationtest.RenderReport(t, r))
			assert.Contains(t, report, "state: Invalid")
			assert.Contains(t, strings.Join(strings.Fields(report), " "), tc.want)
			assert.Empty(t, out.Objects(), "nothing is written for an invalid VirtualDestination")
		})
	}
}

// A static order of three ambient backends cannot be expressed by the
// network label alone: refused, not cut down.
func TestAmbientFailoverRefusesThreeStaticBackends(t *testing.T) {
	in := ambientVDInput(t)
	third := *destinationIn(t, in, "cluster-2")
	third.Name = "reviews-shop-cluster-3"
	third.Spec.KubeService.Ref.ClusterName = "cluster-3"
	in.Destinations = append(in.Destinations, third)
	in.VirtualDestinations[0].Spec.Static.Destinations = append(in.VirtualDestinations[0].Spec.Static.Destinations,
		common.ClusterObjectRef{Name: "reviews", Namespace: "shop", ClusterName: "cluster-3"})
	out, r := translateVD(in)
	report := strings.Join(strings.Fields(string(translationtest.RenderReport(t, r))), " ")
	assert.Contains(t, report, "a static order names at most two")
	assert.Empty(t, out.Objects())
}

// Localized failover keeps Istio's locality order: the remote entries carry
// their mesh's region, and the DestinationRule the directives.
func TestAmbientFailoverLocalized(t *testing.T) {
	in := ambientVDInput(t)
	vd := &in.VirtualDestinations[0]
	vd.Spec.Static = nil
	vd.Spec.Localized = &networkingv1alpha1.LocalizedFailover{
		DestinationSelectors: []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "reviews"}}}},
		FailoverDirectives:   []networkingv1alpha1.FailoverDirective{{From: networkingv1alpha1.Locality{Region: "eu-west"}, To: []networkingv1alpha1.Locality{{Region: "us-east"}}}},
	}
	out, r := translateVD(in)
	report := string(translationtest.RenderReport(t, r))
	require.NotContains(t, report, "Invalid", report)
	rendered := string(translationtest.RenderOutput(t, out))
	assert.Contains(t, rendered, "failover:\n        - from: eu-west\n          to: us-east")
	assert.NotContains(t, rendered, "failoverPriority")
	assert.Contains(t, rendered, "locality: us-east")
	assert.Contains(t, rendered, "locality: eu-west")
}

// A target mesh that still runs sidecars keeps the sidecar design and its
// warning: the ambient path is only taken when everything is ambient.
func TestAmbientFailoverNeedsAmbientTargets(t *testing.T) {
	in := ambientVDInput(t)
	in.Meshes[0].Spec.Istio.DataPlaneModes = []string{discoveryv1alpha1.DataPlaneAmbient, discoveryv1alpha1.DataPlaneSidecar}
	out, _ := translateVD(in)
	for _, o := range out.Objects() {
		assert.NotEqual(t, "WorkloadEntry", o.Object.GetKind(), "the sidecar design writes no WorkloadEntry")
	}
}

// One AccessPolicy selecting both backends is what failover needs: the
// client cluster's waypoint then applies the rules the other's would.
func TestAmbientFailoverWithOneAccessPolicyOnBoth(t *testing.T) {
	in := ambientVDInput(t)
	in.AccessPolicies = append(in.AccessPolicies, networkingv1alpha1.AccessPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews-readers", Namespace: "relaymesh"},
		Spec: networkingv1alpha1.AccessPolicySpec{
			DestinationSelector: []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "reviews"}}}},
			AllowedPaths:        []string{"/public"},
		},
	})
	out, r := translateVD(in)
	report := string(translationtest.RenderReport(t, r))
	require.NotContains(t, report, "Invalid", report)
	assert.Len(t, out.Objects(), 11, "per cluster: the gateway, the hostname (ServiceEntry, HTTPRoute), the DestinationRule and the entries")
}

// spec.hostname is published for every protocol a VirtualDestination
// takes: the waypoint routes the HTTP family's requests with an HTTPRoute
// and proxies TCP, TLS and HTTPS connections with a TCPRoute, both
// attached to the hostname's ServiceEntry and sending everything to the
// cluster's own Service. Nothing warns that the hostname is not published.
func TestAmbientFailoverPublishesTheHostnameForEveryProtocol(t *testing.T) {
	for _, tc := range []struct{ protocol, route string }{
		{"HTTP", "HTTPRoute"}, {"http2", "HTTPRoute"}, {"GRPC", "HTTPRoute"},
		{"TCP", "TCPRoute"}, {"TLS", "TCPRoute"}, {"HTTPS", "TCPRoute"},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			in := ambientVDInput(t)
			in.VirtualDestinations[0].Spec.Port.Protocol = tc.protocol
			out, r := translateVD(in)
			report := string(translationtest.RenderReport(t, r))
			require.NotContains(t, report, "Invalid", report)
			assert.NotContains(t, report, "published", "no warning about the hostname")
			routes := map[string]int{}
			for _, o := range out.Objects() {
				u := o.Object
				switch u.GetKind() {
				case "HTTPRoute", "TCPRoute":
					routes[u.GetKind()]++
					assert.Equal(t, "gateway.networking.k8s.io/v1", u.GetAPIVersion())
					spec := u.Object["spec"].(map[string]any)
					assert.Equal(t, []any{map[string]any{"group": "networking.istio.io", "kind": "ServiceEntry", "name": "relaymesh-vd-reviews-shop", "port": float64(9080)}}, spec["parentRefs"], o.Cluster)
					assert.Equal(t, []any{map[string]any{"backendRefs": []any{map[string]any{"name": "reviews", "port": float64(9080)}}}}, spec["rules"], o.Cluster)
				case "ServiceEntry":
					ports := u.Object["spec"].(map[string]any)["ports"].([]any)
					require.Len(t, ports, 1)
					assert.Equal(t, strings.ToUpper(tc.protocol), ports[0].(map[string]any)["protocol"], o.Cluster)
					assert.Equal(t, "waypoint", u.GetLabels()["istio.io/use-waypoint"], o.Cluster)
				}
			}
			assert.Equal(t, map[string]int{tc.route: 2}, routes, "one route per cluster, of the protocol's kind")
		})
	}
}
