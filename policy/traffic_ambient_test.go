package policy_test

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestNoIstioRoutingForAnAmbientHost: every traffic golden input, with
// each of its Destinations turned ambient (with and without a ready
// waypoint), yields no VirtualService and no DestinationRule; every route
// is a Gateway API route attached to its own Service (group "", kind
// Service, its namespace) with at most 16 rules and a port on every
// backend; every Accepted target has its route, and without a waypoint
// every target fails saying it needs one.
func TestNoIstioRoutingForAnAmbientHost(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("testdata", "traffic", "*"))
	require.NoError(t, err)
	for _, dir := range dirs {
		for _, withWaypoint := range []bool{false, true} {
			in := translationtest.LoadInput(t, dir)
			ambientEverywhere(in, withWaypoint)
			out, r := translation.NewOutput(), translation.NewReport()
			policy.TranslateTraffic(in, out, r)
			routed := map[string][]string{} // target → parents of its route
			for _, o := range out.Objects() {
				u := o.Object
				require.Contains(t, []string{"HTTPRoute", "GRPCRoute"}, u.GetKind(), "%s: %s %s/%s in an ambient world", dir, u.GetKind(), u.GetNamespace(), u.GetName())
				assert.Equal(t, "gateway.networking.k8s.io/v1", u.GetAPIVersion())
				refs, _, _ := unstructured.NestedSlice(u.Object, "spec", "parentRefs")
				require.Len(t, refs, 1, "%s: %s", dir, u.GetName())
				ref := refs[0].(map[string]any)
				assert.Equal(t, "", ref["group"], "a Service parentRef names the core group")
				assert.Equal(t, "Service", ref["kind"])
				// relaymesh-<svc>, or relaymesh-<svc>.<port> for a Service of
				// several ports (one route per port, the port its parent's).
				if name := "relaymesh-" + ref["name"].(string); u.GetName() != name {
					assert.Equal(t, fmt.Sprintf("%s.%v", name, ref["port"]), u.GetName())
				}
				rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "rules")
				assert.LessOrEqual(t, len(rules), 16)
				for _, rule := range rules {
					backends, _, _ := unstructured.NestedSlice(rule.(map[string]any), "backendRefs")
					require.NotEmpty(t, backends)
					for _, b := range backends {
						assert.Positive(t, b.(map[string]any)["port"], "%s: %s", dir, u.GetName())
					}
				}
				target := o.Cluster + "/" + u.GetNamespace() + "/" + ref["name"].(string)
				routed[target] = append(routed[target], strings.Split(u.GetAnnotations()["relaymesh.io/parents"], ",")...)
			}
			for _, p := range in.TrafficPolicies {
				st, targets, _ := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: p.Namespace, Name: p.Name})
				if st.State != common.StateAccepted {
					continue
				}
				for _, ts := range targets {
					msg := strings.Join(ts.Errors, " ")
					if !withWaypoint {
						assert.Equal(t, common.StateFailed, ts.State, "%s: %s/%s on %s", dir, p.Namespace, p.Name, ts.Target)
						assert.Contains(t, msg, "needs a waypoint", "%s: %s/%s on %s", dir, p.Namespace, p.Name, ts.Target)
						continue
					}
					assert.NotContains(t, msg, "needs a waypoint")
					if ts.State == common.StateAccepted {
						assert.Contains(t, routed[ts.Target], "TrafficPolicy/"+p.Namespace+"/"+p.Name, "%s: accepted on %s, so its route is there", dir, ts.Target)
					} else {
						assert.Contains(t, msg, "ambient Destination (Gateway API route)", "%s: %s/%s on %s", dir, p.Namespace, p.Name, ts.Target)
					}
				}
			}
		}
	}
}

// TestEveryUnsayableFieldFailsByName: each TrafficPolicy field Gateway API
// cannot carry fails the policy on the ambient Destination with a message
// naming the field, and the route is not written with the field dropped.
func TestEveryUnsayableFieldFailsByName(t *testing.T) {
	d := metav1.Duration{Duration: 1500}
	bad := map[string]func(*networkingv1alpha1.TrafficPolicySpec){
		"policy.retries": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.Retries = &networkingv1alpha1.RetryPolicy{Attempts: 2}
		},
		"policy.faultInjection": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.FaultInjection = &networkingv1alpha1.FaultInjection{Percentage: 1, Abort: &networkingv1alpha1.Abort{HTTPStatus: 500}}
		},
		"policy.outlierDetection": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.OutlierDetection = &networkingv1alpha1.OutlierDetection{}
		},
		"policy.mtls": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.MTLS = &networkingv1alpha1.MTLSPolicy{TLSMode: "ISTIO_MUTUAL"}
		},
		"policy.requestTimeout": func(s *networkingv1alpha1.TrafficPolicySpec) { s.Policy.RequestTimeout = &d },
		"spec.sourceSelector": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.SourceSelector = []common.WorkloadSelector{{Namespaces: []string{"legacy"}}}
		},
		".headers[0].invertMatch": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.HTTPRequestMatchers = []networkingv1alpha1.HTTPMatcher{{Headers: []networkingv1alpha1.HeaderMatcher{{Name: "x-a", Value: "b", InvertMatch: true}}}}
		},
		".headers[0].name": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.HTTPRequestMatchers = []networkingv1alpha1.HTTPMatcher{{Headers: []networkingv1alpha1.HeaderMatcher{{Name: "x a\n", Value: "b"}}}}
		},
		".method": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.HTTPRequestMatchers = []networkingv1alpha1.HTTPMatcher{{Method: "BREW"}}
		},
		"policy.corsPolicy.allowOrigins[0]": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.CORSPolicy = &networkingv1alpha1.CORSPolicy{AllowOrigins: []networkingv1alpha1.StringMatch{{Regex: new("https://.*")}}}
		},
		"policy.headerManipulation.removeRequestHeaders": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.HeaderManipulation = &networkingv1alpha1.HeaderManipulation{RemoveRequestHeaders: slices.Repeat([]string{"x-a"}, 17)}
		},
		"policy.trafficShift.destinations[0].subset": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.TrafficShift = &networkingv1alpha1.TrafficShift{Destinations: []networkingv1alpha1.WeightedDestination{{Weight: 100,
				KubeService: &networkingv1alpha1.KubeServiceTarget{ClusterObjectRef: common.ClusterObjectRef{Name: "reviews", Namespace: "shop", ClusterName: "cluster-1"}, Subset: map[string]string{"version": "v2"}}}}}
		},
		"is in another namespace": func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.Mirror = &networkingv1alpha1.Mirror{KubeService: common.ClusterObjectRef{Name: "frontend", Namespace: "legacy", ClusterName: "cluster-1"}, Percentage: 5}
		},
	}
	for field, set := range bad {
		t.Run(field, func(t *testing.T) {
			in := translationtest.LoadInput(t, filepath.Join("testdata", "traffic", "ambient-routes"))
			p := networkingv1alpha1.TrafficPolicy{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "shop", CreationTimestamp: metav1.Unix(1, 0)}}
			p.Spec.DestinationSelector = []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "reviews-v2", Namespace: "shop", ClusterName: "cluster-1"}}}}}
			set(&p.Spec)
			in.TrafficPolicies = []networkingv1alpha1.TrafficPolicy{p}
			out, r := translation.NewOutput(), translation.NewReport()
			policy.TranslateTraffic(in, out, r)
			st, targets, _ := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: "shop", Name: "probe"})
			require.Equal(t, common.StateAccepted, st.State, "%v", st.Errors)
			require.Len(t, targets, 1)
			assert.Equal(t, common.StateFailed, targets[0].State)
			assert.Contains(t, strings.Join(targets[0].Errors, " "), field)
			assert.Empty(t, out.Objects(), "nothing is written with the field dropped")
		})
	}
}

// TestOptedInSidecarDestinationsGetNoLocalVirtualService: every traffic
// golden input, with every sidecar Destination's Service labelled
// relaymesh.io/route-api=gateway-api, yields no VirtualService for a
// Destination's own host in its own cluster (Istio does not support a
// VirtualService and a route on one host); a VirtualService for its
// federated host in another cluster stays; a target that fails says why,
// naming the label, and never that it needs a waypoint (sidecars route
// without one).
func TestOptedInSidecarDestinationsGetNoLocalVirtualService(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("testdata", "traffic", "*"))
	require.NoError(t, err)
	for _, dir := range dirs {
		in := translationtest.LoadInput(t, dir)
		local := map[string]bool{}   // cluster/host of an opted-in Destination
		optedIn := map[string]bool{} // its target
		for i := range in.Destinations {
			ks := &in.Destinations[i].Spec.KubeService
			if ks.DataPlaneMode != "" && ks.DataPlaneMode != discoveryv1alpha1.DataPlaneSidecar {
				continue
			}
			ks.Labels = maps.Clone(ks.Labels)
			if ks.Labels == nil {
				ks.Labels = map[string]string{}
			}
			ks.Labels[discoveryv1alpha1.LabelRouteAPI] = discoveryv1alpha1.RouteAPIGatewayAPI
			local[ks.Ref.ClusterName+"/"+ks.Ref.Name+"."+ks.Ref.Namespace+".svc.cluster.local"] = true
			optedIn[translation.DestinationTarget(&in.Destinations[i])] = true
		}
		out, r := translation.NewOutput(), translation.NewReport()
		policy.TranslateTraffic(in, out, r)
		for _, o := range out.Objects() {
			if o.Object.GetKind() != "VirtualService" {
				continue
			}
			hosts, _, _ := unstructured.NestedStringSlice(o.Object.Object, "spec", "hosts")
			for _, h := range hosts {
				assert.False(t, local[o.Cluster+"/"+h], "%s: VirtualService %s/%s routes %s in %s, whose Service opted into Gateway API routes", dir, o.Object.GetNamespace(), o.Object.GetName(), h, o.Cluster)
			}
		}
		for _, p := range in.TrafficPolicies {
			_, targets, _ := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: p.Namespace, Name: p.Name})
			for _, ts := range targets {
				if !optedIn[ts.Target] {
					continue // ambient in the golden: its own test
				}
				msg := strings.Join(ts.Errors, " ")
				assert.NotContains(t, msg, "needs a waypoint", "%s: %s/%s on %s", dir, p.Namespace, p.Name, ts.Target)
				if ts.State == common.StateFailed && strings.Contains(msg, "Gateway API route") {
					assert.Contains(t, msg, "Gateway API route (relaymesh.io/route-api=gateway-api on the Service)", "%s: %s/%s on %s", dir, p.Namespace, p.Name, ts.Target)
				}
			}
		}
	}
}

// TestOptInKeepsWhatASidecarCanStillCarry: on an opted-in sidecar
// Destination, outlierDetection and mtls are a DestinationRule beside the
// route (a sidecar reads both), and a selector of whole clusters is routed
// in the Destination's cluster; any other source selector fails by name.
func TestOptInKeepsWhatASidecarCanStillCarry(t *testing.T) {
	translateIn := func(t *testing.T, in *translation.Input, set func(*networkingv1alpha1.TrafficPolicySpec)) ([]string, common.TargetStatus, *translation.Output) {
		p := networkingv1alpha1.TrafficPolicy{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "shop", CreationTimestamp: metav1.Unix(1, 0)}}
		p.Spec.DestinationSelector = []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "web", Namespace: "shop", ClusterName: "cluster-1"}}}}}
		set(&p.Spec)
		in.TrafficPolicies = []networkingv1alpha1.TrafficPolicy{p}
		out, r := translation.NewOutput(), translation.NewReport()
		policy.TranslateTraffic(in, out, r)
		_, targets, _ := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: "shop", Name: "probe"})
		require.Len(t, targets, 1)
		var objs []string
		for _, o := range out.Objects() {
			objs = append(objs, o.Cluster+" "+o.Object.GetKind()+" "+o.Object.GetName())
		}
		return objs, targets[0], out
	}
	load := func(t *testing.T) *translation.Input {
		return translationtest.LoadInput(t, filepath.Join("testdata", "traffic", "gateway-api-opt-in"))
	}
	translate := func(t *testing.T, set func(*networkingv1alpha1.TrafficPolicySpec)) ([]string, common.TargetStatus) {
		objs, ts, _ := translateIn(t, load(t), set)
		return objs, ts
	}
	t.Run("outlierDetection and mtls", func(t *testing.T) {
		objs, ts := translate(t, func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.Policy.OutlierDetection = &networkingv1alpha1.OutlierDetection{ConsecutiveErrors: 2}
			s.Policy.MTLS = &networkingv1alpha1.MTLSPolicy{TLSMode: "ISTIO_MUTUAL"}
		})
		assert.Equal(t, common.StateAccepted, ts.State, "%v", ts.Errors)
		assert.Contains(t, objs, "cluster-1 DestinationRule relaymesh-web")
		assert.Contains(t, objs, "cluster-1 HTTPRoute relaymesh-web")
		assert.NotContains(t, objs, "cluster-1 VirtualService relaymesh-web")
	})
	t.Run("a selector of whole clusters", func(t *testing.T) {
		timeout := metav1.Duration{Duration: 3e9}
		objs, ts := translate(t, func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.SourceSelector = []common.WorkloadSelector{{Clusters: []string{"cluster-2"}}}
			s.Policy.RequestTimeout = &timeout
		})
		assert.Equal(t, common.StateAccepted, ts.State, "%v", ts.Errors)
		assert.Equal(t, []string{"cluster-2 VirtualService relaymesh-web-cluster-1"}, objs, "cluster-2's clients only: no route in cluster-1")
	})
	t.Run("a field no route carries, for other clusters' clients only", func(t *testing.T) {
		objs, ts, out := translateIn(t, load(t), func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.SourceSelector = []common.WorkloadSelector{{Clusters: []string{"cluster-2"}}}
			s.Policy.Retries = &networkingv1alpha1.RetryPolicy{Attempts: 2}
		})
		assert.Equal(t, common.StateAccepted, ts.State, "not in the route, so not held to it: %v", ts.Errors)
		assert.Equal(t, []string{"cluster-2 VirtualService relaymesh-web-cluster-1"}, objs)
		assert.Contains(t, string(translationtest.RenderOutput(t, out)), "attempts: 2")
	})
	t.Run("an ambient Destination and a selector of other clusters only", func(t *testing.T) {
		in := load(t)
		for i := range in.Destinations {
			if ks := &in.Destinations[i].Spec.KubeService; ks.Ref.Name == "web" && ks.Ref.ClusterName == "cluster-1" {
				ks.DataPlaneMode = discoveryv1alpha1.DataPlaneAmbient
				ks.Waypoint = &discoveryv1alpha1.WaypointRef{Name: "waypoint", Namespace: "shop"}
			}
		}
		for i := range in.Meshes {
			if ist := in.Meshes[i].Spec.Istio; ist.Installation.Cluster == "cluster-1" {
				ist.Ambient = &discoveryv1alpha1.AmbientMesh{Ztunnel: true, Waypoints: []discoveryv1alpha1.WaypointInfo{{Name: "waypoint", Namespace: "shop", TrafficType: "service", ServiceAccount: "waypoint", Ready: true}}}
			}
		}
		timeout := metav1.Duration{Duration: 3e9}
		objs, ts, _ := translateIn(t, in, func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.SourceSelector = []common.WorkloadSelector{{Clusters: []string{"cluster-2"}}}
			s.Policy.RequestTimeout = &timeout
		})
		assert.Equal(t, common.StateFailed, ts.State, "never Accepted and written nowhere")
		assert.Contains(t, strings.Join(ts.Errors, " "), "selects no client in cluster cluster-1")
		assert.Empty(t, objs)
	})
	t.Run("a selector of namespaces", func(t *testing.T) {
		objs, ts := translate(t, func(s *networkingv1alpha1.TrafficPolicySpec) {
			s.SourceSelector = []common.WorkloadSelector{{Clusters: []string{"cluster-1"}, Namespaces: []string{"shop"}}}
			s.Policy.RequestTimeout = &metav1.Duration{Duration: 3e9}
		})
		assert.Equal(t, common.StateFailed, ts.State)
		assert.Contains(t, strings.Join(ts.Errors, " "), "spec.sourceSelector")
		assert.Empty(t, objs)
	})
}

// TestPoliciesOfOneMatchShareOneRule: two policies whose sources differ only
// by whole clusters and whose request matchers are equal meet in one rule
// of the route (it serves every client of its cluster): different fields
// merge; the same field set twice fails the later policy there, naming the
// older, instead of a second rule no request ever reaches.
func TestPoliciesOfOneMatchShareOneRule(t *testing.T) {
	timeout := metav1.Duration{Duration: 3e9}
	policyOf := func(name string, created int64, clusters []string, set func(*networkingv1alpha1.Policy)) networkingv1alpha1.TrafficPolicy {
		p := networkingv1alpha1.TrafficPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", CreationTimestamp: metav1.Unix(created, 0)}}
		p.Spec.DestinationSelector = []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "web", Namespace: "shop", ClusterName: "cluster-1"}}}}}
		if clusters != nil {
			p.Spec.SourceSelector = []common.WorkloadSelector{{Clusters: clusters}}
		}
		set(&p.Spec.Policy)
		return p
	}
	for _, tc := range []struct {
		name     string
		second   func(*networkingv1alpha1.Policy)
		conflict bool
	}{
		{"different fields merge", func(p *networkingv1alpha1.Policy) {
			p.HeaderManipulation = &networkingv1alpha1.HeaderManipulation{AppendRequestHeaders: map[string]string{"x-from": "cluster-1"}}
		}, false},
		{"one field twice conflicts", func(p *networkingv1alpha1.Policy) { p.RequestTimeout = &metav1.Duration{Duration: 5e9} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := translationtest.LoadInput(t, filepath.Join("testdata", "traffic", "gateway-api-opt-in"))
			in.TrafficPolicies = []networkingv1alpha1.TrafficPolicy{
				policyOf("everyone", 1, nil, func(p *networkingv1alpha1.Policy) { p.RequestTimeout = &timeout }),
				policyOf("cluster-1", 2, []string{"cluster-1"}, tc.second),
			}
			out, r := translation.NewOutput(), translation.NewReport()
			policy.TranslateTraffic(in, out, r)
			var route *unstructured.Unstructured
			for _, o := range out.Objects() {
				if o.Object.GetKind() == "HTTPRoute" && o.Object.GetName() == "relaymesh-web" {
					route = o.Object
				}
			}
			require.NotNil(t, route)
			rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
			require.Len(t, rules, 1, "one rule for the one match")
			rule := rules[0].(map[string]any)
			got, _, _ := unstructured.NestedString(rule, "timeouts", "request")
			assert.Equal(t, "3s", got, "the older policy's timeout")
			_, targets, _ := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: "shop", Name: "cluster-1"})
			require.Len(t, targets, 1, "one result per target")
			if tc.conflict {
				assert.Equal(t, common.StateFailed, targets[0].State)
				assert.Contains(t, strings.Join(targets[0].Errors, " "), "policy.requestTimeout: TrafficPolicy shop/everyone, older, sets it on the same request match")
				return
			}
			assert.Equal(t, common.StateAccepted, targets[0].State, "%v", targets[0].Errors)
			filters, _, _ := unstructured.NestedSlice(rule, "filters")
			assert.Len(t, filters, 1, "the header filter in the same rule")
		})
	}
}

// TestASubsetOfAnOptedInServiceStaysAVirtualServiceTarget: a sidecar
// Destination's VirtualService may still shift to a subset of a Service
// that opted into Gateway API routes: its DestinationRule defines the
// subset (only ambient hosts get none).
func TestASubsetOfAnOptedInServiceStaysAVirtualServiceTarget(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("testdata", "traffic", "gateway-api-opt-in"))
	p := networkingv1alpha1.TrafficPolicy{ObjectMeta: metav1.ObjectMeta{Name: "legacy-to-web-v2", Namespace: "shop", CreationTimestamp: metav1.Unix(1, 0)}}
	p.Spec.SourceSelector = []common.WorkloadSelector{{Clusters: []string{"cluster-1"}}}
	p.Spec.DestinationSelector = []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "legacy", Namespace: "shop", ClusterName: "cluster-1"}}}}}
	p.Spec.Policy.TrafficShift = &networkingv1alpha1.TrafficShift{Destinations: []networkingv1alpha1.WeightedDestination{{Weight: 100,
		KubeService: &networkingv1alpha1.KubeServiceTarget{ClusterObjectRef: common.ClusterObjectRef{Name: "web", Namespace: "shop", ClusterName: "cluster-1"}, Subset: map[string]string{"version": "v2"}}}}}
	in.TrafficPolicies = []networkingv1alpha1.TrafficPolicy{p}
	out, r := translation.NewOutput(), translation.NewReport()
	policy.TranslateTraffic(in, out, r)
	_, targets, _ := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: "shop", Name: "legacy-to-web-v2"})
	require.Len(t, targets, 1)
	assert.Equal(t, common.StateAccepted, targets[0].State, "%v", targets[0].Errors)
	rendered := string(translationtest.RenderOutput(t, out))
	assert.Contains(t, rendered, "name: version-v2", "web's DestinationRule defines the subset")
	assert.Contains(t, rendered, "subset: version-v2")
}
