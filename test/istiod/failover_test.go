package istiod

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/translationtest"
)

// What the vd-ambient-failover golden has cluster-1 hold: its own reviews
// pod, and cluster-2's reviews behind net-2's east-west gateway.
const (
	failoverHost      = "reviews.shop.svc.cluster.local"
	localReviewsIP    = "10.1.0.11"
	failoverGatewayIP = "192.0.2.20"
	vdHostname        = "reviews.global"
)

// ambientFailoverOutput is the real translator's output for cluster-1 from
// the vd-ambient-failover golden input, whose VirtualDestination port is
// HTTP (protocol, when set, replaces it), with one AccessPolicy on reviews
// in both clusters: shop/reviews may GET /public (TCP: connect to port
// 9080). So cluster-1 holds, with
// the VirtualDestination's objects, reviews' ztunnel and waypoint policies
// and the hostname's waypoint policy.
func ambientFailoverOutput(t *testing.T, protocol string) []byte {
	t.Helper()
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "federation", "testdata", "vd-ambient-failover"))
	if protocol != "" {
		in.VirtualDestinations[0].Spec.Port.Protocol = protocol
	}
	in.AccessPolicies = []networkingv1alpha1.AccessPolicy{{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews-public", Namespace: "relaymesh"},
		Spec: networkingv1alpha1.AccessPolicySpec{
			SourceSelector: []common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{
				{Name: "reviews", Namespace: "shop", ClusterName: "cluster-2"}}}}},
			DestinationSelector: []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "reviews"}}}},
			AllowedMethods:      []string{"GET"},
			AllowedPaths:        []string{"/public"},
		},
	}}
	if protocol == "TCP" {
		// What a connection can be held to: its source and port.
		in.AccessPolicies[0].Spec.AllowedMethods, in.AccessPolicies[0].Spec.AllowedPaths = nil, nil
		in.AccessPolicies[0].Spec.AllowedPorts = []int32{9080}
	}
	out, r := all.Translate(in, "relaymesh")
	require.NotContains(t, string(translationtest.RenderReport(t, r)), "Invalid")
	mine := translation.NewOutput()
	for _, o := range out.Objects() {
		if o.Cluster == "cluster-1" && (o.Object.GetKind() != "AuthorizationPolicy" || o.Object.GetNamespace() == "shop") {
			mine.Put(o)
		}
	}
	require.Len(t, mine.Objects(), 9, "net-2's gateway, the hostname, the DestinationRule, two WorkloadEntries; reviews' ztunnel and waypoint policies, the hostname's")
	return translationtest.RenderOutput(t, mine)
}

// TestAmbientFailoverFromAWaypointsEDS proves VirtualDestination failover
// for ambient meshes (issue 33 item 2) with a real pilot-discovery in
// ambient multi-network mode and no remote secret: from what the
// translator writes into cluster-1 only, istiod tells cluster-1's waypoint
// (a Go client posing as one) that reviews has its own pod at priority 0
// and cluster-2's pods behind net-2's east-west gateway at priority 1 (the
// static order: cluster-1 first); when the local pod is no longer ready,
// the remote endpoint is the only one, at priority 0 (it takes the
// traffic); when it is ready again, the remote endpoint goes back to
// priority 1 (it takes none while the local one is healthy).
func TestAmbientFailoverFromAWaypointsEDS(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, cs, d := multiNetworkWorld(ctx, t)
	dyn, err := dynamic.NewForConfig(cluster.RESTConfig())
	require.NoError(t, err)

	globalReviewsBehindWaypoint(ctx, t, cs, dyn)
	_, err = cluster.Apply(ctx, "relaymesh-test", ambientFailoverOutput(t, ""))
	require.NoError(t, err)

	// spec.hostname: ztunnel hands reviews.global to the waypoint, and the
	// waypoint routes it to reviews, whose cluster is the one that fails
	// over (below).
	node := d.WaypointNode("10.1.0.20", "waypoint-1", "shop", "waypoint", "waypoint")
	checkHostnameRoutedByTheWaypoint(ctx, t, d, node)

	// The waypoint's clusters name the EDS resource of reviews.
	cds, err := d.WatchDelta(ctx, node, ClusterTypeURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cds.Close() })
	wait, waitCancel := context.WithTimeout(ctx, 90*time.Second)
	defer waitCancel()
	var edsName string
	require.NoError(t, cds.Await(wait, func(res map[string]*anypb.Any) error {
		edsName = ""
		for name, r := range res {
			c := &clusterv3.Cluster{}
			if err := r.UnmarshalTo(c); err != nil {
				return fmt.Errorf("decode cluster %s: %w", name, err)
			}
			if strings.Contains(name, "|9080|") && strings.HasSuffix(name, "|"+failoverHost) && c.GetType() == clusterv3.Cluster_EDS {
				edsName = cmpOr(c.GetEdsClusterConfig().GetServiceName(), name)
			}
		}
		if edsName == "" {
			return fmt.Errorf("no EDS cluster for %s:9080 among %v", failoverHost, sortedKeys(res))
		}
		return nil
	}))
	t.Logf("the waypoint's cluster for %s:9080 takes EDS %q", failoverHost, edsName)

	eds, err := d.WatchDeltaNames(ctx, node, EndpointTypeURL, []string{edsName})
	require.NoError(t, err)
	t.Cleanup(func() { _ = eds.Close() })
	// want: the endpoints by priority; load: the share of requests Envoy
	// gives each priority from their health (PriorityLoad).
	await := func(what string, want map[uint32][]string, load map[uint32]int) {
		t.Helper()
		var got map[uint32][]string
		err := eds.Await(wait, func(res map[string]*anypb.Any) error {
			var err error
			if got, err = EndpointPriorities(res[edsName]); err != nil {
				return err
			}
			if !SamePriorities(got, want) {
				return fmt.Errorf("priorities %v, want %v", got, want)
			}
			return nil
		})
		require.NoError(t, err, "%s: %v", what, got)
		assert.Equal(t, load, PriorityLoad(got), "%s: the share of requests per priority", what)
		t.Logf("%s: %v, requests per priority (%%): %v", what, got, PriorityLoad(got))
	}
	// Both over HBONE: the local pod on its port, cluster-2 through its
	// east-west gateway's HBONE port with the Service's own name as the
	// inner authority (what that gateway forwards).
	local, remote := "pod "+localReviewsIP+":9080", "gateway "+failoverGatewayIP+":15008 for "+failoverHost+":9080"
	await("local pod ready", map[uint32][]string{0: {local}, 1: {remote}}, map[uint32]int{0: 100, 1: 0})

	start := time.Now()
	require.NoError(t, SetEndpointReady(ctx, cs, "shop", "reviews-1", "reviews", localReviewsIP, "http", 9080, false))
	await("local pod not ready", map[uint32][]string{0: {local + " (UNHEALTHY)"}, 1: {remote}}, map[uint32]int{0: 0, 1: 100})
	t.Logf("cluster-2's endpoint took every request %v after cluster-1's pod went unready", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	require.NoError(t, SetEndpointReady(ctx, cs, "shop", "reviews-1", "reviews", localReviewsIP, "http", 9080, true))
	await("local pod ready again", map[uint32][]string{0: {local}, 1: {remote}}, map[uint32]int{0: 100, 1: 0})
	t.Logf("and took none again %v after it was ready again", time.Since(start).Round(time.Millisecond))

	// The order is the DestinationRule's: without it the waypoint holds
	// both at one priority, and cluster-2 takes its share of requests while
	// cluster-1's pod is healthy.
	drs := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
	require.NoError(t, dyn.Resource(drs).Namespace("shop").Delete(ctx, "relaymesh-vd-reviews-shop", metav1.DeleteOptions{}))
	await("without the DestinationRule", map[uint32][]string{0: {remote, local}}, map[uint32]int{0: 100})

	// Without the hostname's policy the waypoint's chain for reviews.global
	// has no rule at all: reviews' own policy does not reach it.
	authz := schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "authorizationpolicies"}
	require.NoError(t, dyn.Resource(authz).Namespace("shop").Delete(ctx, "relaymesh-vd-reviews-shop.hostname", metav1.DeleteOptions{}))
	awaitListeners(ctx, t, d, node, "no rule on "+vdHostname+" without its policy", func(res map[string]*anypb.Any) error {
		return checkHostnameRBAC(res, false)
	})

	// The same VirtualDestination on a TCP port: what the agent would do
	// with the new set (the HTTPRoute pruned, the rest applied), and the
	// waypoint proxies reviews.global's connections to the same cluster.
	httpRoutes := schema.GroupVersionResource{Group: translationtest.GatewayAPIGroup, Version: "v1", Resource: "httproutes"}
	require.NoError(t, dyn.Resource(httpRoutes).Namespace("shop").Delete(ctx, "relaymesh-vd-reviews-shop", metav1.DeleteOptions{}))
	_, err = cluster.Apply(ctx, "relaymesh-test", ambientFailoverOutput(t, "TCP"))
	require.NoError(t, err)
	checkTCPHostnameProxiedByTheWaypoint(ctx, t, d, node, "inbound-vip|9080|http|"+failoverHost)
	// The route is what sends it there: without it the waypoint proxies
	// the hostname to its own cluster, which has no endpoint.
	tcpRoutes := schema.GroupVersionResource{Group: translationtest.GatewayAPIGroup, Version: "v1", Resource: "tcproutes"}
	require.NoError(t, dyn.Resource(tcpRoutes).Namespace("shop").Delete(ctx, "relaymesh-vd-reviews-shop", metav1.DeleteOptions{}))
	checkTCPHostnameProxiedByTheWaypoint(ctx, t, d, node, "inbound-vip|9080|tcp|"+vdHostname)
}

// checkTCPHostnameProxiedByTheWaypoint proves a TCP VirtualDestination's
// hostname from istiod's xDS: the posing waypoint's filter chain for
// reviews.global proxies every connection (a TCP proxy, no HTTP connection
// manager) to cluster, the Service's cluster that fails over.
func checkTCPHostnameProxiedByTheWaypoint(ctx context.Context, t *testing.T, d *Istiod, node *corev3.Node, cluster string) {
	t.Helper()
	var chain, got string
	var rbac map[string]string
	awaitListeners(ctx, t, d, node, "the waypoint's TCP proxy for "+vdHostname, func(res map[string]*anypb.Any) error {
		var err error
		chain, got, rbac, err = waypointTCPProxy(res, vdHostname)
		if err != nil {
			return err
		}
		if got != cluster {
			return fmt.Errorf("%s proxied to %q by chain %s", vdHostname, got, chain)
		}
		return nil
	})
	const want = "ns[shop]-policy[relaymesh-vd-reviews-shop.hostname]-rule[0]"
	assert.Equal(t, "ALLOW", rbac["action envoy.filters.network.rbac tcp."], "the chain's RBAC filter: %v", rbac)
	assert.Contains(t, rbac[want], sharedDomain+"/ns/shop/sa/reviews", "the hostname's policy holds the connection to its source: %v", rbac)
	// protojson varies its spacing on purpose: match the field, not the bytes.
	assert.Regexp(t, `"destinationPort":\s*9080\b`, rbac[want], "and to its port: %v", rbac)
	t.Logf("the waypoint's chain %s proxies %s to %q, under %s", chain, vdHostname, got, want)
}

// awaitListeners waits, at most 90 s, until the listeners istiod sends
// node satisfy check.
func awaitListeners(ctx context.Context, t *testing.T, d *Istiod, node *corev3.Node, what string, check func(map[string]*anypb.Any) error) {
	t.Helper()
	wait, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	lds, err := d.WatchDelta(ctx, node, ListenerTypeURL)
	require.NoError(t, err)
	defer lds.Close()
	require.NoError(t, lds.Await(wait, check), what)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkHostnameRoutedByTheWaypoint proves the VirtualDestination's hostname
// from istiod's xDS: a posing ztunnel is told of reviews.global with the
// hostname's address and a waypoint, and the posing waypoint routes every
// request for it to reviews' cluster.
func checkHostnameRoutedByTheWaypoint(ctx context.Context, t *testing.T, d *Istiod, node *corev3.Node) {
	t.Helper()
	wait, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	addrs, err := d.WatchDelta(ctx, d.ZtunnelNode("10.0.0.1"), AddressTypeURL)
	require.NoError(t, err)
	defer addrs.Close()
	require.NoError(t, addrs.Await(wait, func(res map[string]*anypb.Any) error {
		v, err := viewOf(res)
		if err != nil {
			return err
		}
		svc := v.services[vdHostname]
		if svc == nil || svc.GetWaypoint() == nil {
			return fmt.Errorf("service %s not sent with a waypoint: %s", vdHostname, v.describe())
		}
		return nil
	}), "what ztunnel was told of %s", vdHostname)

	lds, err := d.WatchDelta(ctx, node, ListenerTypeURL)
	require.NoError(t, err)
	defer lds.Close()
	var clusters []string
	require.NoError(t, lds.Await(wait, func(res map[string]*anypb.Any) error {
		_, hcm, err := waypointHCM(res, vdHostname)
		if err != nil {
			return err
		}
		clusters = nil
		for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				clusters = append(clusters, r.GetRoute().GetCluster())
			}
		}
		if !slices.Equal(clusters, []string{"inbound-vip|9080|http|" + failoverHost}) {
			return fmt.Errorf("%s routed to %q", vdHostname, clusters)
		}
		return checkHostnameRBAC(res, true)
	}), "the waypoint's route for %s", vdHostname)
	t.Logf("ztunnel hands %s to the waypoint, which routes it to %q under reviews' AccessPolicy", vdHostname, clusters)
}

// checkHostnameRBAC checks the access rules of the waypoint's chain for
// reviews.global: with the hostname's policy, exactly its one rule (the
// AccessPolicy's source, method and path); without it, none, which is why
// the translator writes it — the waypoint applies no policy of the Service
// to the hostname's chain.
func checkHostnameRBAC(res map[string]*anypb.Any, withPolicy bool) error {
	policies, err := waypointRBAC(res, vdHostname)
	if err != nil {
		return err
	}
	if !withPolicy {
		if len(policies) > 0 {
			return fmt.Errorf("RBAC policies on %s: %q, want none", vdHostname, sortedKeys(policies))
		}
		return nil
	}
	const want = "ns[shop]-policy[relaymesh-vd-reviews-shop.hostname]-rule[0]"
	if got := sortedKeys(policies); !slices.Equal(got, []string{want}) {
		return fmt.Errorf("RBAC policies on %s: %q, want %q", vdHostname, got, want)
	}
	for _, s := range []string{sharedDomain + "/ns/shop/sa/reviews", `"GET"`, "/public"} {
		if !strings.Contains(policies[want], s) {
			return fmt.Errorf("%s lacks %s: %s", want, s, policies[want])
		}
	}
	return nil
}
