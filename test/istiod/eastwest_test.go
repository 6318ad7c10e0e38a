package istiod

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	matcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// TestEastWestGatewaySendsToTheWaypointUnlessAWaypointSent proves, from a
// real pilot-discovery in ambient multi-network mode and a client posing as
// the cluster's east-west gateway, the two facts ambient federation and
// ambient failover rest on: a request for a global Service bound to a
// waypoint that arrives from another network's ztunnel is sent to this
// cluster's waypoint (its L7 policy holds, with no waypoint copied into
// the client's cluster), while one that another cluster's waypoint sent
// (x-istio-source: waypoint) goes straight to the Service (that waypoint's
// L7 rules stand for this one's: why ambient failover requires the same
// AccessPolicies on every backend).
func TestEastWestGatewaySendsToTheWaypointUnlessAWaypointSent(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, cs, d := multiNetworkWorld(ctx, t)
	dyn, err := dynamic.NewForConfig(cluster.RESTConfig())
	require.NoError(t, err)
	globalReviewsBehindWaypoint(ctx, t, cs, dyn)

	// The east-west gateway: its Gateway (class istio-east-west, HBONE
	// terminated with Istio mTLS) with an address, and its pod.
	gw := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
		"metadata": map[string]any{"name": "istio-eastwest", "namespace": DefaultNamespace, "labels": map[string]any{"topology.istio.io/network": localNetwork}},
		"spec": map[string]any{"gatewayClassName": "istio-east-west", "listeners": []any{map[string]any{
			"name": "mesh", "port": int64(15008), "protocol": "HBONE",
			"tls": map[string]any{"mode": "Terminate", "options": map[string]any{"gateway.istio.io/tls-terminate-mode": "ISTIO_MUTUAL"}},
		}}},
	}}
	createGatewayWithAddress(ctx, t, dyn, gw, "IPAddress", "192.0.2.10")
	_, err = cs.CoreV1().ServiceAccounts(DefaultNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "istio-eastwest"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	labels := map[string]string{"gateway.networking.k8s.io/gateway-name": "istio-eastwest", "gateway.istio.io/managed": "istio.io-eastwest-controller"}
	pod, err := cs.CoreV1().Pods(DefaultNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-eastwest-1", Labels: labels},
		Spec:       corev1.PodSpec{ServiceAccountName: "istio-eastwest", NodeName: "node-test", Containers: []corev1.Container{{Name: "istio-proxy", Image: "example.invalid/proxyv2"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.30", PodIPs: []corev1.PodIP{{IP: "10.1.0.30"}}, HostIP: "10.0.0.1",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	_, err = cs.CoreV1().Pods(DefaultNamespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	node := d.proxyNode("waypoint", "10.1.0.30", "istio-eastwest-1", DefaultNamespace, "istio-eastwest", labels)
	w, err := d.WatchDelta(ctx, node, ListenerTypeURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	wait, waitCancel := context.WithTimeout(ctx, 90*time.Second)
	defer waitCancel()
	const (
		authority  = "reviews.shop.svc.cluster.local:9080"
		toService  = "inbound-vip|9080|tcp|reviews.shop.svc.cluster.local"
		toWaypoint = "inbound-vip|15008|tcp|waypoint.shop.svc.cluster.local"
	)
	var routes []string
	require.NoError(t, w.Await(wait, func(res map[string]*anypb.Any) error {
		routes = nil
		for name, r := range res {
			l := &listenerv3.Listener{}
			if err := r.UnmarshalTo(l); err != nil {
				return fmt.Errorf("decode listener %s: %w", name, err)
			}
			routes = append(routes, matcherRoutes(l.GetFilterChainMatcher(), name)...)
		}
		slices.Sort(routes)
		var forReviews []string
		for _, r := range routes {
			if strings.Contains(r, authority) {
				forReviews = append(forReviews, r)
			}
		}
		want := []string{"waypoint -> " + toService, "no match -> " + toWaypoint}
		for _, suffix := range want {
			if !slices.ContainsFunc(forReviews, func(r string) bool { return strings.HasSuffix(r, suffix) }) {
				return fmt.Errorf("no route for %s ending %q (have %q)", authority, suffix, forReviews)
			}
		}
		return nil
	}), "the east-west gateway's listeners: %q", routes)
	for _, r := range routes {
		if strings.Contains(r, "reviews") {
			t.Logf("east-west gateway: %s", r)
		}
	}
}

// matcherRoutes renders a filter chain matcher as one line per leaf: the
// keys matched on the way (the input's name and the value, or "no match")
// and the filter chain it selects.
func matcherRoutes(m *matcherv3.Matcher, prefix string) []string {
	if m == nil {
		return nil
	}
	var out []string
	onMatch := func(path string, om *matcherv3.Matcher_OnMatch) {
		if om == nil {
			return
		}
		if sub := om.GetMatcher(); sub != nil {
			out = append(out, matcherRoutes(sub, path)...)
			return
		}
		chain := &wrapperspb.StringValue{}
		if err := om.GetAction().GetTypedConfig().UnmarshalTo(chain); err == nil {
			out = append(out, path+" -> "+chain.GetValue())
		}
	}
	if tree := m.GetMatcherTree(); tree != nil {
		input := tree.GetInput().GetName()
		for k, om := range tree.GetExactMatchMap().GetMap() {
			onMatch(prefix+" | "+input+"="+k+" | "+k, om)
		}
	}
	onMatch(prefix+" | no match", m.GetOnNoMatch())
	return out
}
