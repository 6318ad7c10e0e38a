package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/translation/translationtest"
)

var gatewaysGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}

// singleClusterPolicies are the user's objects: the mesh in a VirtualMesh
// with deny by default, productpage may GET /reviews/* on 9080, and
// requests to reviews time out after 2s.
const singleClusterPolicies = `
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: shop, namespace: relaymesh}
spec:
  meshes: [{clusterName: mgmt, namespace: istio-system, name: istiod}]
  globalAccessPolicy: Enabled
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: productpage-reads, namespace: shop}
spec:
  sourceSelector:
  - kubeServiceAccountRefs:
      serviceAccounts: [{name: productpage, namespace: shop, clusterName: mgmt}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: reviews, namespace: shop, clusterName: mgmt}]
  allowedPaths: [/reviews/*]
  allowedMethods: [GET]
  allowedPorts: [9080]
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: reviews-timeout, namespace: shop}
spec:
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: reviews, namespace: shop, clusterName: mgmt}]
  policy:
    requestTimeout: 2s
`

// TestSingleClusterAmbient is the single-cluster layout of the original
// design (the small-shop and testing setup): the management cluster is
// registered as its own workload cluster, with the server and the agent as
// processes on the same apiserver, and runs an ambient mesh with a
// waypoint. The mesh is discovered as ambient, a VirtualMesh and an L7
// AccessPolicy and a TrafficPolicy made in the same cluster become the
// ztunnel and waypoint AuthorizationPolicies and an HTTPRoute there (no
// sidecar-era object, no VirtualService), the statuses say Accepted and
// Applied, and deleting the policies prunes what they produced — while
// the server's own objects and the discovered ones stay untouched.
func TestSingleClusterAmbient(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt")
	mgmt := env.Cluster("mgmt")
	translationtest.InstallGatewayAPI(ctx, t, mgmt)
	world, err := os.ReadFile(filepath.Join("testdata", "ambient-single-cluster.yaml"))
	require.NoError(t, err)
	_, err = mgmt.Apply(ctx, "test", world)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	// The address Istio's deployment controller would give the waypoint.
	setGatewayAddress(ctx, t, dyn, "shop", "waypoint", "Hostname", "waypoint.shop.svc.cluster.local")

	relayAddr, opsAddr := Addr(t), Addr(t)
	Start(t, bin, dir, "server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", dir+"/audit.log", "--server-dns-names", "localhost", "--server-ips", Host(relayAddr))
	waitHealthy(t, opsAddr)
	// The agent beside the server, in the server's namespace, is refused
	// before anything is written: its Secrets would overwrite the server's
	// relay root (its key with it).
	cs, err := mgmt.Clientset()
	require.NoError(t, err)
	out, err := Run(t, bin, "cluster", "register", "mgmt", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", mgmt.Kubeconfig, "--server-address", relayAddr)
	require.Error(t, err, out)
	require.ErrorContains(t, err, "the agent's namespace is the relay server's")
	require.ErrorContains(t, err, "--remote-namespace relaymesh-agent")
	root, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, "relay-root-tls-secret", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, root.Data["tls.key"], "the server's relay root key is untouched")
	_, err = dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Get(ctx, "mgmt", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "nothing registered: %v", err)

	out, err = Run(t, bin, "cluster", "register", "mgmt", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", mgmt.Kubeconfig,
		"--remote-namespace", "relaymesh-agent", "--server-address", relayAddr)
	require.NoError(t, err, out)
	Start(t, bin, dir, "agent", "agent", "--kubeconfig", mgmt.Kubeconfig, "--namespace", "relaymesh-agent", "--health-listen", Addr(t), "--metrics-listen", Addr(t))

	reviews := func() (*unstructured.Unstructured, error) {
		l, err := dyn.Resource(discoveryv1alpha1.Destinations).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range l.Items {
			if name, _, _ := unstructured.NestedString(l.Items[i].Object, "spec", "kubeService", "ref", "name"); name == "reviews" {
				return &l.Items[i], nil
			}
		}
		return nil, fmt.Errorf("no Destination for Service reviews among %d", len(l.Items))
	}
	Eventually(t, 60*time.Second, "reviews discovered as an ambient Destination bound to the waypoint", func() (bool, string) {
		d, err := reviews()
		if err != nil {
			return false, err.Error()
		}
		mode, _, _ := unstructured.NestedString(d.Object, "spec", "kubeService", "dataPlaneMode")
		wp, _, _ := unstructured.NestedString(d.Object, "spec", "kubeService", "waypoint", "name")
		return mode == "ambient" && wp == "waypoint", fmt.Sprint(mode, " ", wp)
	})

	_, err = mgmt.Apply(ctx, "test", []byte(singleClusterPolicies))
	require.NoError(t, err)
	names := func(gvr schema.GroupVersionResource) []string {
		l, err := dyn.Resource(gvr).Namespace("shop").List(ctx, metav1.ListOptions{})
		if err != nil {
			return []string{err.Error()}
		}
		var out []string
		for _, o := range l.Items {
			out = append(out, o.GetName())
		}
		slices.Sort(out)
		return out
	}
	Eventually(t, 30*time.Second, "the ambient objects in the same cluster", func() (bool, string) {
		aps, routes, vss := names(outputs.AuthorizationPolicies), names(outputs.HTTPRoutes), names(outputs.VirtualServices)
		ok := slices.Equal(aps, []string{"relaymesh-reviews.waypoint", "relaymesh-reviews.ztunnel"}) &&
			slices.Equal(routes, []string{"relaymesh-reviews"}) && len(vss) == 0
		return ok, fmt.Sprintf("AuthorizationPolicies %q, HTTPRoutes %q, VirtualServices %q", aps, routes, vss)
	})
	ztunnel, err := dyn.Resource(outputs.AuthorizationPolicies).Namespace("shop").Get(ctx, "relaymesh-reviews.ztunnel", metav1.GetOptions{})
	require.NoError(t, err)
	rules, _, _ := unstructured.NestedSlice(ztunnel.Object, "spec", "rules")
	require.Contains(t, fmt.Sprint(rules), "mgmt.local/ns/shop/sa/waypoint", "ztunnel admits the waypoint")
	require.NotContains(t, fmt.Sprint(rules), "productpage", "ztunnel does not admit the L7 client past the waypoint")
	require.NotContains(t, fmt.Sprint(rules), "GET", "no HTTP rule at ztunnel")
	route, err := dyn.Resource(outputs.HTTPRoutes).Namespace("shop").Get(ctx, "relaymesh-reviews", metav1.GetOptions{})
	require.NoError(t, err)
	require.Contains(t, fmt.Sprint(route.Object["spec"]), "request:2s", "the HTTPRoute carries the timeout")
	Eventually(t, 30*time.Second, "the VirtualMesh's deny-all in the root namespace", func() (bool, string) {
		_, err := dyn.Resource(outputs.AuthorizationPolicies).Namespace("istio-system").Get(ctx, "relaymesh-global-deny", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})

	Eventually(t, 30*time.Second, "statuses Accepted and applied in mgmt", func() (bool, string) {
		var got []string
		for _, r := range []struct {
			gvr      schema.GroupVersionResource
			ns, name string
		}{
			{networkingv1alpha1.AccessPolicies, "shop", "productpage-reads"},
			{networkingv1alpha1.TrafficPolicies, "shop", "reviews-timeout"},
			{networkingv1alpha1.VirtualMeshes, "relaymesh", "shop"},
		} {
			o, err := dyn.Resource(r.gvr).Namespace(r.ns).Get(ctx, r.name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			state, _, _ := unstructured.NestedString(o.Object, "status", "state")
			clusters, _, _ := unstructured.NestedSlice(o.Object, "status", "clusters")
			got = append(got, fmt.Sprintf("%s=%s %v", r.name, state, clusters))
		}
		s := strings.Join(got, "; ")
		return strings.Count(s, "=Accepted") == 3 && strings.Count(s, "cluster:mgmt") == 3 && strings.Count(s, "state:Applied") == 3, s
	})

	// The policies go: what they produced is pruned from the same
	// cluster, and nothing of the server's or discovery's goes with it.
	for _, r := range []struct {
		gvr      schema.GroupVersionResource
		ns, name string
	}{
		{networkingv1alpha1.AccessPolicies, "shop", "productpage-reads"},
		{networkingv1alpha1.TrafficPolicies, "shop", "reviews-timeout"},
	} {
		require.NoError(t, dyn.Resource(r.gvr).Namespace(r.ns).Delete(ctx, r.name, metav1.DeleteOptions{}))
	}
	Eventually(t, 30*time.Second, "the policies' objects pruned", func() (bool, string) {
		aps, routes := names(outputs.AuthorizationPolicies), names(outputs.HTTPRoutes)
		return len(aps) == 0 && len(routes) == 0, fmt.Sprintf("AuthorizationPolicies %q, HTTPRoutes %q", aps, routes)
	})
	_, err = dyn.Resource(outputs.AuthorizationPolicies).Namespace("istio-system").Get(ctx, "relaymesh-global-deny", metav1.GetOptions{})
	require.NoError(t, err, "the VirtualMesh's deny-all stays")
	_, err = reviews()
	require.NoError(t, err, "the discovered Destination stays")

	// Re-bootstrap and deregister into the server's namespace are refused
	// too, before anything changes; with the agent's namespace they work.
	for _, args := range [][]string{{"cluster", "re-bootstrap", "mgmt"}, {"cluster", "deregister", "mgmt"}} {
		out, err := Run(t, bin, append(args, "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", mgmt.Kubeconfig)...)
		require.ErrorContains(t, err, "the agent's namespace is the relay server's", "%v: %s", args, out)
	}
	_, err = dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Get(ctx, "mgmt", metav1.GetOptions{})
	require.NoError(t, err, "still registered")
	out, err = Run(t, bin, "cluster", "deregister", "mgmt", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", mgmt.Kubeconfig, "--remote-namespace", "relaymesh-agent")
	require.NoError(t, err, out)
	require.Contains(t, out, "removed the agent's secrets from relaymesh-agent")
	root, err = cs.CoreV1().Secrets("relaymesh").Get(ctx, "relay-root-tls-secret", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, root.Data["tls.key"], "the server's relay root key is untouched")
}
