package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/examples"
	relayserver "github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var virtualServices = outputs.VirtualServices

// TestDataPath runs the relay data path with real processes: two agents
// discover Istio-shaped workloads, the management cluster shows them, a
// Service change propagates within 2 s, pass-through outputs are applied and
// pruned without touching a user's object, a killed server comes back to the
// same state, and a standby agent takes over from a killed leader.
func TestDataPath(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt", "cluster-1", "cluster-2")
	mgmt := env.Cluster("mgmt")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	for _, name := range []string{"cluster-1", "cluster-2"} {
		_, err := env.Cluster(name).Apply(ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
		require.NoError(t, err)
	}

	relayAddr, opsAddr := Addr(t), Addr(t)
	serverArgs := []string{"server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", filepath.Join(dir, "audit.log"), "--server-dns-names", "localhost", "--server-ips", Host(relayAddr)}
	server := Start(t, bin, dir, "server", serverArgs...)
	waitHealthy(t, opsAddr)
	leaderFlags := []string{"--leader-lease-duration", "4s", "--leader-renew-deadline", "3s", "--leader-retry-period", "500ms"}
	agents := map[string]*localcluster.Process{}
	health := map[string]string{}
	for _, name := range []string{"cluster-1", "cluster-2"} {
		_, err := Run(t, bin, "cluster", "register", name, "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", env.Cluster(name).Kubeconfig, "--server-address", relayAddr)
		require.NoError(t, err)
		health[name] = Addr(t)
		agents[name] = Start(t, bin, dir, "agent-"+name, append([]string{"agent", "--kubeconfig", env.Cluster(name).Kubeconfig,
			"--health-listen", health[name], "--metrics-listen", Addr(t), "--identity", name + "-a"}, leaderFlags...)...)
	}

	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	exists := func(gvr schema.GroupVersionResource, name string) bool {
		_, err := dyn.Resource(gvr).Namespace("relaymesh").Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}
	count := func(gvr schema.GroupVersionResource, cluster string) int {
		l, err := dyn.Resource(gvr).Namespace("relaymesh").List(ctx, metav1.ListOptions{LabelSelector: relayserver.LabelCluster + "=" + cluster})
		require.NoError(t, err)
		return len(l.Items)
	}
	for _, c := range []string{"cluster-1", "cluster-2"} {
		Eventually(t, 60*time.Second, "discovered objects of "+c, func() (bool, string) {
			ok := exists(discoveryv1alpha1.Meshes, meshName(c)) &&
				exists(discoveryv1alpha1.Workloads, deploymentName(c, "bookinfo", "reviews-v1")) && exists(discoveryv1alpha1.Workloads, deploymentName(c, "bookinfo", "reviews-v2")) &&
				exists(discoveryv1alpha1.Workloads, deploymentName(c, "bookinfo", "productpage-v1")) &&
				exists(discoveryv1alpha1.Destinations, serviceName(c, "bookinfo", "reviews")) && exists(discoveryv1alpha1.Destinations, serviceName(c, "bookinfo", "productpage"))
			return ok, fmt.Sprint(count(discoveryv1alpha1.Meshes, c), count(discoveryv1alpha1.Workloads, c), count(discoveryv1alpha1.Destinations, c))
		})
	}
	dest, err := dyn.Resource(discoveryv1alpha1.Destinations).Namespace("relaymesh").Get(ctx, serviceName("cluster-1", "bookinfo", "reviews"), metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, []any{"v1", "v2"}, dest.Object["spec"].(map[string]any)["kubeService"].(map[string]any)["subsets"].(map[string]any)["version"])
	mesh, err := dyn.Resource(discoveryv1alpha1.Meshes).Namespace("relaymesh").Get(ctx, meshName("cluster-2"), metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "cluster-2.local", mesh.Object["spec"].(map[string]any)["istio"].(map[string]any)["trustDomain"])

	// A Service added in cluster-1 appears within 2 s; deleted, it disappears.
	c1 := env.Cluster("cluster-1")
	c1CS, err := c1.Clientset()
	require.NoError(t, err)
	_, err = c1CS.CoreV1().Services("bookinfo").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews-canary", Namespace: "bookinfo"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "reviews", "version": "v2"}, Ports: []corev1.ServicePort{{Name: "http", Port: 9080}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	start := time.Now()
	Eventually(t, 2*time.Second, "the new Service's Destination within 2s", func() (bool, string) {
		return exists(discoveryv1alpha1.Destinations, serviceName("cluster-1", "bookinfo", "reviews-canary")), ""
	})
	t.Logf("a Service created in cluster-1 appeared in mgmt after %s", time.Since(start).Round(time.Millisecond))
	require.NoError(t, c1CS.CoreV1().Services("bookinfo").Delete(ctx, "reviews-canary", metav1.DeleteOptions{}))
	start = time.Now()
	Eventually(t, 2*time.Second, "the deleted Service's Destination gone within 2s", func() (bool, string) {
		return !exists(discoveryv1alpha1.Destinations, serviceName("cluster-1", "bookinfo", "reviews-canary")), ""
	})
	t.Logf("a Service deleted in cluster-1 disappeared from mgmt after %s", time.Since(start).Round(time.Millisecond))

	// Outputs: a user's own VirtualService "user-owned" exists in cluster-1.
	c1Dyn, err := dynamic.NewForConfig(c1.RESTConfig())
	require.NoError(t, err)
	_, err = c1.Apply(ctx, "kubectl", []byte(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: user-owned, namespace: bookinfo}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews}}]}]}
`))
	require.NoError(t, err)
	userVS, err := c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "user-owned", metav1.GetOptions{})
	require.NoError(t, err)
	// The management cluster asks for two VirtualServices in cluster-1, one
	// of them with the user's object's name.
	_, err = mgmt.Apply(ctx, "test", []byte(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews-route
  namespace: relaymesh
  labels: {relaymesh.io/target-cluster: cluster-1}
  annotations: {relaymesh.io/target-namespace: bookinfo}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v2}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: user-owned
  namespace: relaymesh
  labels: {relaymesh.io/target-cluster: cluster-1}
  annotations: {relaymesh.io/target-namespace: bookinfo}
spec: {hosts: [ratings], http: [{route: [{destination: {host: ratings}}]}]}
`))
	require.NoError(t, err)
	Eventually(t, 10*time.Second, "the output applied in cluster-1", func() (bool, string) {
		vs, err := c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "reviews-route", metav1.GetOptions{})
		return err == nil && vs.GetLabels()[outputs.OwnerLabel] == "relaymesh-agent" && vs.GetAnnotations()[outputs.ParentsAnnotation] == "VirtualService/relaymesh/reviews-route", fmt.Sprint(err)
	})
	Eventually(t, 10*time.Second, "the conflict reported", func() (bool, string) {
		n, err := MetricWith("http://"+opsAddr+"/metrics", relayserver.MetricApplyResults, `outcome="conflict"`)
		return err == nil && n >= 1, fmt.Sprint(n, err)
	})
	after, err := c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "user-owned", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, userVS.GetResourceVersion(), after.GetResourceVersion(), "the user's object is untouched")
	assert.Empty(t, after.GetLabels()[outputs.OwnerLabel])
	_, err = c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "reviews-route", metav1.GetOptions{})
	require.NoError(t, err)
	// cluster-2 got nothing.
	c2Dyn, err := dynamic.NewForConfig(env.Cluster("cluster-2").RESTConfig())
	require.NoError(t, err)
	l, err := c2Dyn.Resource(virtualServices).Namespace("bookinfo").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, l.Items)

	// Deleting the source prunes the output; the user's object stays.
	require.NoError(t, dyn.Resource(virtualServices).Namespace("relaymesh").Delete(ctx, "reviews-route", metav1.DeleteOptions{}))
	Eventually(t, 10*time.Second, "the output pruned", func() (bool, string) {
		_, err := c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "reviews-route", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	_, err = c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "user-owned", metav1.GetOptions{})
	require.NoError(t, err, "never pruned")

	// Kill the server mid-stream and start it again: same view (the very
	// same objects, not recreated), no duplicates, outputs intact.
	_, err = mgmt.Apply(ctx, "test", []byte(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: keep-route
  namespace: relaymesh
  labels: {relaymesh.io/target-cluster: cluster-1}
  annotations: {relaymesh.io/target-namespace: bookinfo}
spec: {hosts: [productpage], http: [{route: [{destination: {host: productpage}}]}]}
`))
	require.NoError(t, err)
	var kept *unstructured.Unstructured
	// Applied and settled (a new object takes a create and an apply).
	Eventually(t, 10*time.Second, "keep-route applied and settled", func() (bool, string) {
		first, err := c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "keep-route", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		time.Sleep(time.Second)
		kept, err = c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "keep-route", metav1.GetOptions{})
		return err == nil && kept.GetResourceVersion() == first.GetResourceVersion(), fmt.Sprint(err)
	})
	uids := func() map[string]string {
		out := map[string]string{}
		for _, gvr := range []schema.GroupVersionResource{discoveryv1alpha1.Meshes, discoveryv1alpha1.Workloads, discoveryv1alpha1.Destinations} {
			l, err := dyn.Resource(gvr).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
			require.NoError(t, err)
			for _, o := range l.Items {
				out[gvr.Resource+"/"+o.GetName()] = string(o.GetUID())
			}
		}
		return out
	}
	before := uids()
	require.NoError(t, server.Kill())
	_, err = c1CS.CoreV1().Services("bookinfo").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "while-down", Namespace: "bookinfo"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "productpage"}, Ports: []corev1.ServicePort{{Name: "http", Port: 9080}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	Start(t, bin, dir, "server-restarted", serverArgs...)
	waitHealthy(t, opsAddr)
	start = time.Now()
	Eventually(t, 45*time.Second, "the view rebuilt after the restart", func() (bool, string) {
		return exists(discoveryv1alpha1.Destinations, serviceName("cluster-1", "bookinfo", "while-down")), ""
	})
	t.Logf("after a server restart, a change made while it was down arrived %s after it came back", time.Since(start).Round(time.Millisecond))
	restarted := uids()
	assert.Len(t, restarted, len(before)+1, "exactly the one new Destination, no duplicates")
	for k, uid := range before {
		assert.Equal(t, uid, restarted[k], "%s was recreated or lost across the restart", k)
	}
	keptAfter, err := c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "keep-route", metav1.GetOptions{})
	require.NoError(t, err, "an applied output survives the server restart")
	assert.Equal(t, kept.GetUID(), keptAfter.GetUID())
	assert.Equal(t, kept.GetResourceVersion(), keptAfter.GetResourceVersion(), "and is not rewritten")
	_, err = c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "user-owned", metav1.GetOptions{})
	require.NoError(t, err)

	// A standby agent in cluster-1 takes over when the leader dies.
	standbyHealth := Addr(t)
	Start(t, bin, dir, "agent-cluster-1-standby", append([]string{"agent", "--kubeconfig", c1.Kubeconfig,
		"--health-listen", standbyHealth, "--metrics-listen", Addr(t), "--identity", "cluster-1-b"}, leaderFlags...)...)
	leaderOf := func(addr string) (bool, bool) {
		var st struct {
			Status struct {
				Leader  bool `json:"leader"`
				Session struct {
					Connected bool `json:"connected"`
				} `json:"session"`
			} `json:"status"`
		}
		_, err := GetJSON("http://"+addr+"/readyz", &st)
		return err == nil && st.Status.Leader, st.Status.Session.Connected
	}
	Eventually(t, 10*time.Second, "the standby standing by", func() (bool, string) {
		l, _ := leaderOf(standbyHealth)
		code, err := GetJSON("http://"+standbyHealth+"/healthz", nil)
		return err == nil && code == 200 && !l, ""
	})
	require.NoError(t, agents["cluster-1"].Kill())
	start = time.Now()
	Eventually(t, 20*time.Second, "the standby leading and connected", func() (bool, string) {
		l, c := leaderOf(standbyHealth)
		return l && c, fmt.Sprint(l, c)
	})
	t.Logf("standby took over %s after the leader was killed (lease 4s)", time.Since(start).Round(time.Millisecond))
	require.NoError(t, c1CS.CoreV1().Services("bookinfo").Delete(ctx, "while-down", metav1.DeleteOptions{}))
	Eventually(t, 5*time.Second, "changes flow through the new leader", func() (bool, string) {
		return !exists(discoveryv1alpha1.Destinations, serviceName("cluster-1", "bookinfo", "while-down")), ""
	})
}

func waitHealthy(t *testing.T, opsAddr string) {
	t.Helper()
	Eventually(t, 30*time.Second, "server healthy", func() (bool, string) {
		code, err := GetJSON("http://"+opsAddr+"/healthz", nil)
		return err == nil && code == 200, fmt.Sprint(code, err)
	})
}
