package istiod

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacconfigv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbacnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// TestWaypointGetsTheL7RulesOfAmbientAccessPolicies: in the same world as
// the ztunnel proof, plus the golden's waypoint (a Gateway of class
// istio-waypoint with its Service and pod) and reviews bound to it, a Go
// delta-xDS client posing as the waypoint pulls its listeners from the real
// istiod, and the RBAC filter of the reviews chain holds exactly the two
// rules of relaymesh-reviews.waypoint: productpage for GET /reviews/*, and
// ratings with no HTTP condition.
func TestWaypointGetsTheL7RulesOfAmbientAccessPolicies(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, cs, d, _ := ambientWorld(ctx, t, true)
	dyn, err := dynamic.NewForConfig(cluster.RESTConfig())
	require.NoError(t, err)
	waypointWorld(ctx, t, cs, dyn)

	w, err := d.WatchDelta(ctx, d.WaypointNode("10.1.0.20", "waypoint-1", "shop", "waypoint", "waypoint"), ListenerTypeURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })

	wait, waitCancel := context.WithTimeout(ctx, 90*time.Second)
	defer waitCancel()
	var policies map[string]string
	err = w.Await(wait, func(res map[string]*anypb.Any) error {
		var err error
		policies, err = waypointRBAC(res, "reviews.shop.svc.cluster.local")
		if err != nil {
			return err
		}
		return checkWaypointPolicies(policies)
	})
	require.NoError(t, err, "listeners: %q; RBAC policies: %v", w.Names(), policies)
	for _, name := range sortedKeys(policies) {
		t.Logf("waypoint RBAC %s: %s", name, policies[name])
	}
}

// checkWaypointPolicies wants exactly the two rules of
// relaymesh-reviews.waypoint.
func checkWaypointPolicies(policies map[string]string) error {
	const prefix = "ns[shop]-policy[relaymesh-reviews.waypoint]-rule["
	want := []string{prefix + "0]", prefix + "1]"}
	if got := sortedKeys(policies); !slices.Equal(got, want) {
		return fmt.Errorf("RBAC policies %q, want %q", got, want)
	}
	get, l4 := policies[want[0]], policies[want[1]]
	for _, s := range []string{"cluster-1.local/ns/shop/sa/productpage", `"GET"`, "/reviews/"} {
		if !strings.Contains(get, s) {
			return fmt.Errorf("%s lacks %s: %s", want[0], s, get)
		}
	}
	if !strings.Contains(l4, "cluster-1.local/ns/shop/sa/ratings") || strings.Contains(l4, "productpage") {
		return fmt.Errorf("%s is not ratings alone: %s", want[1], l4)
	}
	if strings.Contains(l4, ":method") || strings.Contains(l4, "urlPath") {
		return fmt.Errorf("%s has an HTTP condition: %s", want[1], l4)
	}
	return nil
}

// waypointHCM finds, in the waypoint's listeners, the first filter chain
// for host with an HTTP connection manager, and returns the chain's name
// and that manager.
func waypointHCM(res map[string]*anypb.Any, host string) (string, *hcmv3.HttpConnectionManager, error) {
	var chains []string
	for _, name := range sortedKeys(res) {
		l := &listenerv3.Listener{}
		if err := res[name].UnmarshalTo(l); err != nil {
			return "", nil, fmt.Errorf("listener %s: %w", name, err)
		}
		for _, fc := range l.GetFilterChains() {
			chains = append(chains, fc.GetName())
			if !strings.Contains(fc.GetName(), host) {
				continue
			}
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) == nil {
					return fc.GetName(), hcm, nil
				}
			}
		}
	}
	return "", nil, fmt.Errorf("no filter chain for %s with an HTTP connection manager among %q", host, chains)
}

// waypointTCPProxy finds, in the waypoint's listeners, the filter chain for
// host that proxies connections (a TCP proxy and no HTTP connection
// manager) and returns its name, the one cluster it sends to and the
// policies of its RBAC filters as JSON by name (nil: no RBAC filter; each
// filter's action under "action <filter> <stat prefix>").
func waypointTCPProxy(res map[string]*anypb.Any, host string) (chain, cluster string, rbac map[string]string, err error) {
	var chains []string
	for _, name := range sortedKeys(res) {
		l := &listenerv3.Listener{}
		if err := res[name].UnmarshalTo(l); err != nil {
			return "", "", nil, fmt.Errorf("listener %s: %w", name, err)
		}
		for _, fc := range l.GetFilterChains() {
			chains = append(chains, fc.GetName())
			if !strings.Contains(fc.GetName(), host) {
				continue
			}
			var proxy *tcpproxyv3.TcpProxy
			rbac = nil
			for _, f := range fc.GetFilters() {
				if f.GetTypedConfig().UnmarshalTo(&hcmv3.HttpConnectionManager{}) == nil {
					proxy = nil
					break
				}
				if p := (&tcpproxyv3.TcpProxy{}); f.GetTypedConfig().UnmarshalTo(p) == nil {
					proxy = p
				}
				if rb := (&rbacnetv3.RBAC{}); f.GetTypedConfig().UnmarshalTo(rb) == nil {
					if rbac == nil {
						rbac = map[string]string{}
					}
					rbac["action "+f.GetName()+" "+rb.GetStatPrefix()] = rb.GetRules().GetAction().String()
					for name, p := range rb.GetRules().GetPolicies() {
						rbac[name] = protojson.Format(p)
					}
				}
			}
			if proxy == nil {
				continue
			}
			if proxy.GetCluster() == "" {
				return fc.GetName(), "", nil, fmt.Errorf("chain %s proxies %s to no single cluster (%v)", fc.GetName(), host, proxy.GetClusterSpecifier())
			}
			return fc.GetName(), proxy.GetCluster(), rbac, nil
		}
	}
	return "", "", nil, fmt.Errorf("no filter chain for %s with a TCP proxy among %q", host, chains)
}

// waypointRBAC finds, in the waypoint's listeners, the filter chain for
// host and returns its RBAC filter's policies as JSON by name.
func waypointRBAC(res map[string]*anypb.Any, host string) (map[string]string, error) {
	_, hcm, err := waypointHCM(res, host)
	if err != nil {
		return nil, err
	}
	return rbacPolicies(hcm), nil
}

// rbacPolicies returns the policies of hcm's RBAC filters as JSON by name.
func rbacPolicies(hcm *hcmv3.HttpConnectionManager) map[string]string {
	out := map[string]string{}
	for _, hf := range hcm.GetHttpFilters() {
		rb := &rbacv3.RBAC{}
		if hf.GetTypedConfig().UnmarshalTo(rb) != nil {
			continue
		}
		// ALLOW policies by name; any other action's policies are
		// prefixed with it, so an exact name check fails on them.
		prefix := ""
		if a := rb.GetRules().GetAction(); a != rbacconfigv3.RBAC_ALLOW {
			prefix = a.String() + ":"
		}
		for pname, p := range rb.GetRules().GetPolicies() {
			out[prefix+pname] = protojson.Format(p)
		}
	}
	return out
}

var gatewayGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}

// waypointWorld makes what a waypoint install leaves (installWaypoint),
// and the Service reviews bound to it with one captured pod.
func waypointWorld(ctx context.Context, t *testing.T, cs kubernetes.Interface, dyn dynamic.Interface) {
	t.Helper()
	_, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews", Labels: map[string]string{"istio.io/use-waypoint": "waypoint"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "reviews"}, Ports: []corev1.ServicePort{
			{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	ambientPod(ctx, t, cs, "reviews")
	installWaypoint(ctx, t, cs, dyn)
}

// installWaypoint makes what `istioctl waypoint apply` and Istio's
// deployment controller leave in namespace shop: the waypoint's service
// account, Service and running pod (10.1.0.20), and its Gateway of class
// istio-waypoint with an address in status.
func installWaypoint(ctx context.Context, t *testing.T, cs kubernetes.Interface, dyn dynamic.Interface) {
	t.Helper()
	_, err := cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "waypoint"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	gwLabel := map[string]string{"gateway.networking.k8s.io/gateway-name": "waypoint"}
	_, err = cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint", Labels: gwLabel},
		Spec: corev1.ServiceSpec{Selector: gwLabel, Ports: []corev1.ServicePort{
			{Name: "mesh", Port: 15008, TargetPort: intstr.FromInt32(15008), AppProtocol: new("all")},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint-1", Labels: gwLabel},
		Spec: corev1.PodSpec{
			ServiceAccountName: "waypoint",
			NodeName:           "node-test",
			Containers:         []corev1.Container{{Name: "istio-proxy", Image: "example.invalid/proxyv2"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: "10.1.0.20", PodIPs: []corev1.PodIP{{IP: "10.1.0.20"}}, HostIP: "10.0.0.1",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
	}
	_, err = cs.CoreV1().Pods("shop").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)

	gw := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1",
		"kind":       "Gateway",
		"metadata": map[string]any{
			"name": "waypoint", "namespace": "shop",
			"labels": map[string]any{"istio.io/waypoint-for": "service"},
		},
		"spec": map[string]any{
			"gatewayClassName": "istio-waypoint",
			"listeners":        []any{map[string]any{"name": "mesh", "port": int64(15008), "protocol": "HBONE"}},
		},
	}}
	createGatewayWithAddress(ctx, t, dyn, gw, "Hostname", "waypoint.shop.svc.cluster.local")
}

// createGatewayWithAddress creates gw (retrying until a just-installed CRD
// is served) and gives it the status address the deployment controller's
// Service or a LoadBalancer would (typ IPAddress or Hostname), unless
// istiod wrote one first; a conflict with istiod's own status write is
// retried.
func createGatewayWithAddress(ctx context.Context, t *testing.T, dyn dynamic.Interface, gw *unstructured.Unstructured, typ, value string) {
	t.Helper()
	ns, name := gw.GetNamespace(), gw.GetName()
	var err error
	require.Eventually(t, func() bool {
		_, err = dyn.Resource(gatewayGVR).Namespace(ns).Create(ctx, gw, metav1.CreateOptions{})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "create Gateway %s/%s: %v", ns, name, err)
	require.Eventually(t, func() bool {
		cur, err := dyn.Resource(gatewayGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if addrs, _, _ := unstructured.NestedSlice(cur.Object, "status", "addresses"); len(addrs) > 0 {
			t.Logf("Gateway %s/%s status.addresses: %v", ns, name, addrs)
			return true
		}
		_ = unstructured.SetNestedSlice(cur.Object, []any{map[string]any{"type": typ, "value": value}}, "status", "addresses")
		_, _ = dyn.Resource(gatewayGVR).Namespace(ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return false
	}, 30*time.Second, 200*time.Millisecond, "Gateway %s/%s gets status.addresses", ns, name)
}
