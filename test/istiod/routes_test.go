package istiod

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
)

// wantRoute is what the waypoint must route for a request with header
// x-canary: true: the two per-version Services with these weights, within
// this timeout.
type wantRoute struct {
	v1, v2  uint32
	timeout time.Duration
}

// TestWaypointGetsTheRoutesOfAmbientTrafficPolicies is the proof by
// istiod's own xDS for TrafficPolicy in ambient mode: the real traffic
// translator turns a canary policy on reviews (header x-canary: true →
// reviews-v1 90 / reviews-v2 10, 2s timeout) into an HTTPRoute with a
// Service parentRef; applied to a real apiserver with Gateway API v1.6's
// standard CRDs, next to the waypoint world of the L7 access proof, it
// reaches a Go delta-xDS client posing as the waypoint as the route config
// of the reviews chain: the header match, the weighted clusters and the
// timeout, then the default route to reviews. Changing the weights to
// 50/50 changes what the waypoint is told, and the first expectation then
// fails against it.
func TestWaypointGetsTheRoutesOfAmbientTrafficPolicies(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, cs, d, in := ambientWorld(ctx, t, true)
	dyn, err := dynamic.NewForConfig(cluster.RESTConfig())
	require.NoError(t, err)
	waypointWorld(ctx, t, cs, dyn)
	versionServices(ctx, t, cs)

	applyCanary(ctx, t, cluster, in, 90, 10)
	w, err := d.WatchDelta(ctx, d.WaypointNode("10.1.0.20", "waypoint-1", "shop", "waypoint", "waypoint"), ListenerTypeURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })

	first := wantRoute{v1: 90, v2: 10, timeout: 2 * time.Second}
	var routes []string
	wait, waitCancel := context.WithTimeout(ctx, 90*time.Second)
	defer waitCancel()
	err = w.Await(wait, func(res map[string]*anypb.Any) error {
		rc, err := waypointRoutes(res, "reviews.shop.svc.cluster.local")
		if err != nil {
			return err
		}
		routes = describeRoutes(rc)
		return checkCanary(rc, first)
	})
	require.NoError(t, err, "listeners: %q; routes: %q", w.Names(), routes)
	for _, r := range routes {
		t.Logf("waypoint route: %s", r)
	}

	// The same test fails when the policy changes.
	applyCanary(ctx, t, cluster, in, 50, 50)
	wait2, wait2Cancel := context.WithTimeout(ctx, 90*time.Second)
	defer wait2Cancel()
	err = w.Await(wait2, func(res map[string]*anypb.Any) error {
		rc, err := waypointRoutes(res, "reviews.shop.svc.cluster.local")
		if err != nil {
			return err
		}
		routes = describeRoutes(rc)
		return checkCanary(rc, wantRoute{v1: 50, v2: 50, timeout: 2 * time.Second})
	})
	require.NoError(t, err, "routes: %q", routes)
	res, _, err := w.Snapshot()
	require.NoError(t, err)
	rc, err := waypointRoutes(res, "reviews.shop.svc.cluster.local")
	require.NoError(t, err)
	require.Error(t, checkCanary(rc, first), "the 90/10 expectation fails against the 50/50 policy")
}

// versionServices makes the per-version Services the canary routes to
// (Gateway API routes to Services, not subsets).
func versionServices(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	for _, v := range []string{"v1", "v2"} {
		_, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "reviews-" + v},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "reviews", "version": v}, Ports: []corev1.ServicePort{
				{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)},
			}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
}

// applyCanary translates the canary TrafficPolicy on reviews with the
// real translator (in is the ambient-waypoint world) and applies its
// output, which must be exactly one HTTPRoute.
func applyCanary(ctx context.Context, t *testing.T, cluster *localcluster.Cluster, in *translation.Input, v1, v2 int32) {
	t.Helper()
	world := *in
	world.Destinations = append([]discoveryv1alpha1.Destination(nil), in.Destinations...)
	for _, v := range []string{"v1", "v2"} {
		world.Destinations = append(world.Destinations, discoveryv1alpha1.Destination{
			ObjectMeta: metav1.ObjectMeta{Name: "reviews-" + v + "-shop-cluster-1", Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.DestinationSpec{
				KubeService: discoveryv1alpha1.KubeService{
					Ref:                    common.ClusterObjectRef{Name: "reviews-" + v, Namespace: "shop", ClusterName: "cluster-1"},
					WorkloadSelectorLabels: map[string]string{"app": "reviews", "version": v},
					Ports:                  []discoveryv1alpha1.ServicePort{{Port: 9080, Name: "http", Protocol: "TCP"}},
					DataPlaneMode:          discoveryv1alpha1.DataPlaneAmbient,
				},
				Mesh: in.Destinations[0].Spec.Mesh,
			},
		})
	}
	ref := func(name string) common.ClusterObjectRef {
		return common.ClusterObjectRef{Name: name, Namespace: "shop", ClusterName: "cluster-1"}
	}
	p := networkingv1alpha1.TrafficPolicy{ObjectMeta: metav1.ObjectMeta{Name: "reviews-canary", Namespace: "shop", Generation: 1}}
	p.Spec.DestinationSelector = []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{ref("reviews")}}}}
	p.Spec.HTTPRequestMatchers = []networkingv1alpha1.HTTPMatcher{{Headers: []networkingv1alpha1.HeaderMatcher{{Name: "x-canary", Value: "true"}}}}
	p.Spec.Policy.RequestTimeout = &metav1.Duration{Duration: 2 * time.Second}
	p.Spec.Policy.TrafficShift = &networkingv1alpha1.TrafficShift{Destinations: []networkingv1alpha1.WeightedDestination{
		{Weight: v1, KubeService: &networkingv1alpha1.KubeServiceTarget{ClusterObjectRef: ref("reviews-v1")}},
		{Weight: v2, KubeService: &networkingv1alpha1.KubeServiceTarget{ClusterObjectRef: ref("reviews-v2")}},
	}}
	world.TrafficPolicies = []networkingv1alpha1.TrafficPolicy{p}
	out, r := translation.NewOutput(), translation.NewReport()
	policy.TranslateTraffic(&world, out, r)
	_, targets, _ := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: "shop", Name: "reviews-canary"})
	require.Len(t, targets, 1)
	require.Equal(t, common.StateAccepted, targets[0].State, "%v", targets[0].Errors)
	objs := out.Objects()
	require.Len(t, objs, 1)
	require.Equal(t, "HTTPRoute", objs[0].Object.GetKind())
	_, err := cluster.Apply(ctx, "relaymesh-test", translationtest.RenderOutput(t, out))
	require.NoError(t, err)
}

// waypointRoutes finds, in the waypoint's listeners, the filter chain for
// host and returns its HTTP connection manager's inline route config
// (waypoints get no RDS for inbound traffic).
func waypointRoutes(res map[string]*anypb.Any, host string) (*routev3.RouteConfiguration, error) {
	chain, hcm, err := waypointHCM(res, host)
	if err != nil {
		return nil, err
	}
	if rc := hcm.GetRouteConfig(); rc != nil {
		return rc, nil
	}
	return nil, fmt.Errorf("chain %s: the HTTP connection manager has no inline route config (rds %q)", chain, hcm.GetRds().GetRouteConfigName())
}

// checkCanary wants, in the route config, first a route that matches
// header x-canary exactly "true" and splits between reviews-v1 and
// reviews-v2 with want's weights and timeout, and after it a route to
// reviews itself.
func checkCanary(rc *routev3.RouteConfiguration, want wantRoute) error {
	var routes []*routev3.Route
	for _, vh := range rc.GetVirtualHosts() {
		routes = append(routes, vh.GetRoutes()...)
	}
	canary := -1
	for i, r := range routes {
		for _, h := range r.GetMatch().GetHeaders() {
			if h.GetName() == "x-canary" && h.GetStringMatch().GetExact() == "true" {
				canary = i
			}
		}
	}
	if canary < 0 {
		return fmt.Errorf("no route matches x-canary: true among %q", describeRoutes(rc))
	}
	ra := routes[canary].GetRoute()
	weights := map[string]uint32{}
	for _, c := range ra.GetWeightedClusters().GetClusters() {
		weights[c.GetName()] = c.GetWeight().GetValue()
	}
	got := map[string]uint32{}
	for name, w := range weights {
		for _, v := range []string{"reviews-v1", "reviews-v2"} {
			if strings.Contains(name, "|"+v+".shop.svc.cluster.local") {
				got[v] = w
			}
		}
	}
	if len(weights) != 2 || got["reviews-v1"] != want.v1 || got["reviews-v2"] != want.v2 {
		return fmt.Errorf("canary route splits %v, want reviews-v1 %d / reviews-v2 %d", weights, want.v1, want.v2)
	}
	if d := ra.GetTimeout().AsDuration(); d != want.timeout {
		return fmt.Errorf("canary route timeout %s, want %s", d, want.timeout)
	}
	for _, r := range routes[canary+1:] {
		if len(r.GetMatch().GetHeaders()) == 0 && strings.Contains(r.GetRoute().GetCluster(), "|reviews.shop.svc.cluster.local") {
			return nil
		}
	}
	return fmt.Errorf("no default route to reviews after the canary route: %q", describeRoutes(rc))
}

// describeRoutes renders each route: its match, clusters and timeout.
func describeRoutes(rc *routev3.RouteConfiguration) []string {
	var out []string
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			var headers []string
			for _, h := range r.GetMatch().GetHeaders() {
				headers = append(headers, h.GetName()+"="+h.GetStringMatch().GetExact())
			}
			var clusters []string
			if c := r.GetRoute().GetCluster(); c != "" {
				clusters = append(clusters, c)
			}
			for _, c := range r.GetRoute().GetWeightedClusters().GetClusters() {
				clusters = append(clusters, fmt.Sprintf("%s:%d", c.GetName(), c.GetWeight().GetValue()))
			}
			out = append(out, fmt.Sprintf("%s %s headers%v → %v timeout %s", vh.GetName(), r.GetMatch().GetPrefix()+r.GetMatch().GetPath(), headers, clusters, r.GetRoute().GetTimeout().AsDuration()))
		}
	}
	return out
}
