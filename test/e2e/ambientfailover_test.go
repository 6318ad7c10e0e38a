package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/test/istiod"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// failoverAppManifest is reviews in one cluster, the backend of an ambient
// VirtualDestination: global and bound to its namespace's waypoint, and
// the waypoint as `istioctl waypoint apply` and Istio's deployment
// controller leave it (its Gateway, account and Deployment).
const failoverAppManifest = `
apiVersion: v1
kind: ServiceAccount
metadata: {name: reviews, namespace: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: reviews, namespace: shop}
spec:
  selector: {matchLabels: {app: reviews}}
  template:
    metadata: {labels: {app: reviews}}
    spec:
      serviceAccountName: reviews
      containers:
      - {name: reviews, image: example.invalid/reviews}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop, labels: {istio.io/global: "true", istio.io/use-waypoint: waypoint}}
spec:
  selector: {app: reviews}
  ports:
  - {name: http, port: 9080}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: waypoint, namespace: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: waypoint, namespace: shop}
spec:
  selector: {matchLabels: {gateway.networking.k8s.io/gateway-name: waypoint}}
  template:
    metadata: {labels: {gateway.networking.k8s.io/gateway-name: waypoint}}
    spec:
      serviceAccountName: waypoint
      containers:
      - {name: istio-proxy, image: docker.io/istio/proxyv2:1.31.1}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop, labels: {istio.io/waypoint-for: service}}
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - {name: mesh, port: 15008, protocol: HBONE}
`

// reviewsFailover is a static VirtualDestination over both clusters'
// reviews, cluster-1 first.
const reviewsFailover = `
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualDestination
metadata: {name: reviews, namespace: relaymesh}
spec:
  hostname: reviews.global
  port: {number: 9080, protocol: HTTP}
  virtualMesh: {name: shop}
  static:
    destinations:
    - {name: reviews, namespace: shop, clusterName: cluster-1}
    - {name: reviews, namespace: shop, clusterName: cluster-2}
`

// reviewsPodIP is reviews-1's address in cluster n.
func reviewsPodIP(n int) string { return fmt.Sprintf("10.%d.0.41", n) }

// installFailoverBackend writes reviews and its waypoint into cluster n,
// with what kubelets and Istio's controllers would add: reviews-1 running
// and ready (and its EndpointSlice), the waypoint's pod, and the
// waypoint Gateway's address.
func installFailoverBackend(ctx context.Context, t *testing.T, c *localcluster.Cluster, cs kubernetes.Interface, n int) {
	t.Helper()
	_, err := c.Apply(ctx, "test", []byte(failoverAppManifest))
	require.NoError(t, err)
	readyPod(ctx, t, cs, "shop", "reviews-1", reviewsPodIP(n), map[string]string{"app": "reviews"}, "reviews")
	setReviewsEndpoint(ctx, t, cs, n, true)
	wp, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint-1", Labels: map[string]string{"gateway.networking.k8s.io/gateway-name": "waypoint"}},
		Spec:       corev1.PodSpec{ServiceAccountName: "waypoint", NodeName: "node-1", Containers: []corev1.Container{{Name: "istio-proxy", Image: "example.invalid/proxyv2"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	ip := fmt.Sprintf("10.%d.0.20", n)
	wp.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	_, err = cs.CoreV1().Pods("shop").UpdateStatus(ctx, wp, metav1.UpdateOptions{})
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	require.NoError(t, err)
	setGatewayAddress(ctx, t, dyn, "shop", "waypoint", "Hostname", "waypoint.shop.svc.cluster.local")
}

// setReviewsEndpoint sets reviews-1's readiness in cluster n where
// Kubernetes would: the pod's Ready condition and reviews' EndpointSlice.
func setReviewsEndpoint(ctx context.Context, t *testing.T, cs kubernetes.Interface, n int, ready bool) {
	t.Helper()
	require.NoError(t, istiod.SetEndpointReady(ctx, cs, "shop", "reviews-1", "reviews", reviewsPodIP(n), "http", 9080, ready))
}

// checkAmbientFailover applies reviewsFailover and proves it from what
// cluster-1's real istiod tells a client posing as cluster-1's waypoint:
// reviews has cluster-1's pod at priority 0 and cluster-2 behind its
// east-west gateway at priority 1; with cluster-1's pod unready every
// request goes to cluster-2, and back when it is ready again.
func checkAmbientFailover(ctx context.Context, t *testing.T, mgmt, c1 *localcluster.Cluster, d *istiod.Istiod, cs1 kubernetes.Interface) {
	t.Helper()
	start := time.Now()
	_, err := mgmt.Apply(ctx, "test", []byte(reviewsFailover))
	require.NoError(t, err)
	// The waypoint's cluster for reviews:9080 (its name is istiod's:
	// test/istiod TestAmbientFailoverFromAWaypointsEDS reads it from CDS).
	const eds = "inbound-vip|9080|http|reviews.shop.svc.cluster.local"
	w, err := d.WatchDeltaNames(ctx, d.WaypointNode("10.1.0.20", "waypoint-1", "shop", "waypoint", "waypoint"), istiod.EndpointTypeURL, []string{eds})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	wait, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	local, remote := "pod "+reviewsPodIP(1)+":9080", "gateway 192.0.2.20:15008 for reviews.shop.svc.cluster.local:9080"
	await := func(what string, want map[uint32][]string, load map[uint32]int) {
		t.Helper()
		var got map[uint32][]string
		err := w.Await(wait, func(res map[string]*anypb.Any) error {
			var err error
			if got, err = istiod.EndpointPriorities(res[eds]); err != nil {
				return err
			}
			if !istiod.SamePriorities(got, want) {
				return fmt.Errorf("priorities %v, want %v", got, want)
			}
			return nil
		})
		require.NoError(t, err, "%s: what cluster-1's waypoint was told of reviews", what)
		assert.Equal(t, load, istiod.PriorityLoad(got), what)
	}
	await("after the VirtualDestination", map[uint32][]string{0: {local}, 1: {remote}}, map[uint32]int{0: 100, 1: 0})
	t.Logf("cluster-1's waypoint held reviews in failover order %v after the VirtualDestination was applied", time.Since(start).Round(time.Millisecond))
	// The hostname, as the agent applied it: bound to the waypoint, and
	// routed to reviews.
	dyn1, err := dynamic.NewForConfig(c1.RESTConfig())
	require.NoError(t, err)
	for _, r := range []struct {
		gvr   schema.GroupVersionResource
		check func(*unstructured.Unstructured) bool
	}{
		{schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}, func(u *unstructured.Unstructured) bool {
			return u.GetLabels()["istio.io/use-waypoint"] == "waypoint"
		}},
		{schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}, func(u *unstructured.Unstructured) bool {
			rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "rules")
			return len(rules) == 1
		}},
	} {
		Eventually(t, 30*time.Second, "reviews.global's "+r.gvr.Resource+" in cluster-1", func() (bool, string) {
			u, err := dyn1.Resource(r.gvr).Namespace("shop").Get(ctx, "relaymesh-vd-reviews-relaymesh", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return u.GetLabels()["relaymesh.io/owner"] != "" && r.check(u), fmt.Sprint(u.Object)
		})
	}

	start = time.Now()
	setReviewsEndpoint(ctx, t, cs1, 1, false)
	await("cluster-1's pod unready", map[uint32][]string{0: {local + " (UNHEALTHY)"}, 1: {remote}}, map[uint32]int{0: 0, 1: 100})
	t.Logf("every request to cluster-2 %v after cluster-1's reviews pod went unready", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	setReviewsEndpoint(ctx, t, cs1, 1, true)
	await("cluster-1's pod ready again", map[uint32][]string{0: {local}, 1: {remote}}, map[uint32]int{0: 100, 1: 0})
	t.Logf("none to cluster-2 %v after it was ready again", time.Since(start).Round(time.Millisecond))
}

// setGatewayAddress gives a Gateway API Gateway the status address a
// LoadBalancer or Istio's deployment controller would (typ IPAddress or
// Hostname), retrying until the write is not in conflict with istiod's.
func setGatewayAddress(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns, name, typ, value string) {
	t.Helper()
	Eventually(t, 30*time.Second, "the address of Gateway "+ns+"/"+name, func() (bool, string) {
		gw, err := dyn.Resource(gatewaysGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		_ = unstructured.SetNestedSlice(gw.Object, []any{map[string]any{"type": typ, "value": value}}, "status", "addresses")
		_, err = dyn.Resource(gatewaysGVR).Namespace(ns).UpdateStatus(ctx, gw, metav1.UpdateOptions{})
		return err == nil, fmt.Sprint(err)
	})
}
