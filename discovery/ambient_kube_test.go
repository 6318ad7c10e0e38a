package discovery_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// runDiscoverer runs a Discoverer until the test ends and waits for its
// caches.
func runDiscoverer(ctx context.Context, t *testing.T, cfg discovery.Config) (*discovery.Discoverer, func()) {
	t.Helper()
	d, err := discovery.New(cfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	select {
	case <-d.Synced():
	case err := <-done:
		t.Fatalf("Run ended before its caches synced: %v", err)
	case <-ctx.Done():
		t.Fatal("caches did not sync")
	}
	return d, func() { stop(); assert.NoError(t, <-done) }
}

// TestDiscovererAmbientKube runs ambient discovery against a real
// kube-apiserver with the real Gateway API CRDs: before the CRDs exist the
// Discoverer still syncs and reports the ambient mesh and workload with no
// waypoint; once they exist, a waypoint Gateway is discovered, becomes ready
// when its status has an address, and the istio-cni annotation on a pod
// survives the informer's trimming.
func TestDiscovererAmbientKube(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: t.TempDir(), Clusters: []string{cluster}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	c := env.Cluster(cluster)
	cs, err := c.Clientset()
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	require.NoError(t, err)
	cfg := discovery.Config{Client: cs, Dynamic: dyn, Cluster: cluster, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}

	createAmbientShop(ctx, t, cs)
	ambientReady := func(s *relaypb.Snapshot) bool {
		return len(s.Meshes) == 1 && s.Meshes[0].Ambient && s.Meshes[0].Ztunnel && len(s.Workloads) == 1 && len(s.Destinations) == 1 &&
			len(s.Destinations[0].Endpoints) == 1
	}

	before, stopBefore := runDiscoverer(ctx, t, cfg)
	s := waitSnapshot(t, before, 10*time.Second, ambientReady)
	stopBefore()
	assert.Empty(t, s.Meshes[0].Waypoints, "no Gateway API: no waypoints")
	assert.Equal(t, "ambient", s.Workloads[0].DataPlaneMode)
	assertProto(t, &relaypb.WaypointRef{Name: "waypoint", Namespace: "shop"}, s.Workloads[0].Waypoint)
	assert.True(t, s.Destinations[0].Endpoints[0].Ambient, "the pod's ambient.istio.io/redirection annotation is kept")

	// Installed as every test installs them: established and listed by
	// discovery, which Apply maps kinds through.
	translationtest.InstallGatewayAPI(ctx, t, c)
	gateways := dyn.Resource(discovery.GatewayResource).Namespace("shop")
	_, err = c.Apply(ctx, "discovery-test", []byte(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop, labels: {istio.io/waypoint-for: service}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
`))
	require.NoError(t, err)

	after, stopAfter := runDiscoverer(ctx, t, cfg)
	defer stopAfter()
	s = waitSnapshot(t, after, 10*time.Second, func(s *relaypb.Snapshot) bool { return ambientReady(s) && len(s.Meshes[0].Waypoints) == 1 })
	assertProto(t, &relaypb.Waypoint{Name: "waypoint", Namespace: "shop", TrafficType: "service", ServiceAccount: "waypoint"}, s.Meshes[0].Waypoints[0])

	gw, err := gateways.Get(ctx, "waypoint", metav1.GetOptions{})
	require.NoError(t, err)
	gw.Object["status"] = map[string]any{"addresses": []any{map[string]any{"type": "Hostname", "value": "waypoint.shop.svc.cluster.local"}}}
	_, err = gateways.UpdateStatus(ctx, gw, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitSnapshot(t, after, 10*time.Second, func(s *relaypb.Snapshot) bool {
		return len(s.Meshes) == 1 && len(s.Meshes[0].Waypoints) == 1 && s.Meshes[0].Waypoints[0].Ready
	})
	assert.Empty(t, after.WaypointsUnavailable())

	// An agent whose ClusterRole lacks the gateways rule (an older chart)
	// still discovers everything else, reports no waypoint (fail closed),
	// and says why; an informer it may not list would never sync.
	checkGatewayRBAC(ctx, t, c, ambientReady)
}

// checkGatewayRBAC runs discovery as a service account that may read
// everything discovery reads but Gateways, then may list but not watch
// them, then both.
func checkGatewayRBAC(ctx context.Context, t *testing.T, c *localcluster.Cluster, ambientReady func(*relaypb.Snapshot) bool) {
	t.Helper()
	admin, err := c.Clientset()
	require.NoError(t, err)
	const user = "system:serviceaccount:relaymesh-agent:agent"
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces", "services", "configmaps", "pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets", "daemonsets"}, Verbs: []string{"list", "watch"}},
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "discovery-test"}, Rules: rules}
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "discovery-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "discovery-test"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	rc := rest.CopyConfig(c.RESTConfig())
	rc.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	cs, err := kubernetes.NewForConfig(rc)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(rc)
	require.NoError(t, err)
	cfg := discovery.Config{Client: cs, Dynamic: dyn, Cluster: cluster, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	for _, step := range []struct {
		verbs     []string
		why       string
		waypoints int
	}{
		{nil, "may not list or watch gateways.gateway.networking.k8s.io", 0},
		{[]string{"list"}, "may not watch gateways.gateway.networking.k8s.io", 0},
		{[]string{"list", "watch"}, "", 1},
	} {
		role.Rules = rules
		if step.verbs != nil {
			role.Rules = append(slices.Clone(rules), rbacv1.PolicyRule{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"gateways"}, Verbs: step.verbs})
		}
		cur, err := admin.RbacV1().ClusterRoles().Get(ctx, role.Name, metav1.GetOptions{})
		require.NoError(t, err)
		cur.Rules = role.Rules
		_, err = admin.RbacV1().ClusterRoles().Update(ctx, cur, metav1.UpdateOptions{})
		require.NoError(t, err)
		// The authorizer learns the change through its informers: wait
		// until it answers as the role now says, then start discovery.
		require.Eventually(t, func() bool {
			for _, verb := range []string{"list", "watch"} {
				review, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
					Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: verb, Group: "gateway.networking.k8s.io", Resource: "gateways"}}}, metav1.CreateOptions{})
				if err != nil || review.Status.Allowed != slices.Contains(step.verbs, verb) {
					return false
				}
			}
			return true
		}, 10*time.Second, 50*time.Millisecond, "the authorizer follows the role: %v", step.verbs)
		d, stop := runDiscoverer(ctx, t, cfg)
		s := waitSnapshot(t, d, 10*time.Second, func(s *relaypb.Snapshot) bool {
			return ambientReady(s) && len(s.Meshes[0].Waypoints) == step.waypoints
		})
		stop()
		if step.why == "" {
			assert.Empty(t, d.WaypointsUnavailable(), "%v", step.verbs)
		} else {
			assert.Contains(t, d.WaypointsUnavailable(), step.why, "%v", step.verbs)
		}
		assert.Len(t, s.Meshes[0].Waypoints, step.waypoints)
	}
}

// createAmbientShop creates an ambient istiod with its ztunnel, namespace
// shop enrolled in ambient and bound to waypoint "waypoint" (whose
// Deployment runs as service account waypoint), and one captured pod.
func createAmbientShop(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	must := func(_ any, err error) { t.Helper(); require.NoError(t, err) }
	opts := metav1.CreateOptions{}
	must(cs.CoreV1().Namespaces().Create(ctx, namespace("istio-system", nil), opts))
	must(cs.CoreV1().Namespaces().Create(ctx, namespace("shop", l("istio.io/dataplane-mode", "ambient", "istio.io/use-waypoint", "waypoint")), opts))
	must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reviews"}}, opts))
	must(cs.AppsV1().Deployments("istio-system").Create(ctx, istiod("istio-system", "istiod", nil, withEnv("PILOT_ENABLE_AMBIENT", "true")), opts))
	must(cs.AppsV1().DaemonSets("istio-system").Create(ctx, daemonSet("istio-system", "ztunnel", l("app", "ztunnel", "istio.io/dataplane-mode", "none")), opts))
	must(cs.AppsV1().Deployments("shop").Create(ctx, deployment("shop", "reviews", l("app", "reviews"), withSA("reviews")), opts))
	must(cs.AppsV1().Deployments("shop").Create(ctx, deployment("shop", "waypoint", l("gateway.networking.k8s.io/gateway-name", "waypoint"), withSA("waypoint")), opts))
	must(cs.CoreV1().Services("shop").Create(ctx, kubeService(service("shop", "reviews", l("app", "reviews"))), opts))
	created, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reviews-0", Labels: l("app", "reviews"),
			Annotations: l("ambient.istio.io/redirection", "enabled", "unrelated", "dropped")},
		Spec: corev1.PodSpec{ServiceAccountName: "reviews", Containers: []corev1.Container{{Name: "reviews", Image: "reviews:1"}}},
	}, opts)
	require.NoError(t, err)
	created.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: "10.244.1.5", PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}
	must(cs.CoreV1().Pods("shop").UpdateStatus(ctx, created, metav1.UpdateOptions{}))
}
