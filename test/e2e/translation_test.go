package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// TestTranslation runs the server and two agents as processes: a
// VirtualMesh over two clusters, a TrafficPolicy shifting 20% to the remote
// cluster and an AccessPolicy become Istio objects in the right clusters,
// and disappear when the policy is deleted.
func TestTranslation(t *testing.T) {
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
	Start(t, bin, dir, "server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", dir+"/audit.log", "--server-dns-names", "localhost", "--server-ips", Host(relayAddr))
	waitHealthy(t, opsAddr)
	clients := map[string]dynamic.Interface{}
	for _, name := range []string{"cluster-1", "cluster-2"} {
		_, err := Run(t, bin, "cluster", "register", name, "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", env.Cluster(name).Kubeconfig, "--server-address", relayAddr)
		require.NoError(t, err)
		Start(t, bin, dir, "agent-"+name, "agent", "--kubeconfig", env.Cluster(name).Kubeconfig, "--health-listen", Addr(t), "--metrics-listen", Addr(t))
		clients[name], err = dynamic.NewForConfig(env.Cluster(name).RESTConfig())
		require.NoError(t, err)
	}
	mgmtDyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	Eventually(t, 60*time.Second, "both clusters discovered", func() (bool, string) {
		l, err := mgmtDyn.Resource(discoveryv1alpha1.Destinations).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 4, fmt.Sprint(err)
	})

	vm, err := examples.Demo.ReadFile("demo/virtualmesh.yaml")
	require.NoError(t, err)
	_, err = mgmt.Apply(ctx, "test", vm)
	require.NoError(t, err)
	policies, err := examples.Demo.ReadFile("demo/policies.yaml")
	require.NoError(t, err)
	start := time.Now()
	_, err = mgmt.Apply(ctx, "test", policies)
	require.NoError(t, err)

	get := func(cluster string, gvr schema.GroupVersionResource, ns, name string) (*unstructured.Unstructured, error) {
		return clients[cluster].Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	}
	vsGVR := outputs.VirtualServices
	seGVR := outputs.ServiceEntries
	apGVR := outputs.AuthorizationPolicies
	Eventually(t, 10*time.Second, "the 80/20 VirtualService in cluster-1", func() (bool, string) {
		vs, err := get("cluster-1", vsGVR, "bookinfo", "relaymesh-reviews")
		if err != nil {
			return false, err.Error()
		}
		routes, _, _ := unstructured.NestedSlice(vs.Object, "spec", "http")
		return strings.Contains(fmt.Sprint(routes), "reviews.bookinfo.svc.cluster-2.global") && strings.Contains(fmt.Sprint(routes), "weight:20"), fmt.Sprint(routes)
	})
	t.Logf("TrafficPolicy applied in cluster-1 %s after it was created", time.Since(start).Round(time.Millisecond))
	Eventually(t, 10*time.Second, "the federation ServiceEntry in cluster-2 and the AuthorizationPolicy in cluster-1", func() (bool, string) {
		ses, err := clients["cluster-2"].Resource(seGVR).Namespace("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		found := false
		for _, se := range ses.Items {
			hosts, _, _ := unstructured.NestedStringSlice(se.Object, "spec", "hosts")
			found = found || strings.Contains(strings.Join(hosts, ","), "reviews.bookinfo.svc.cluster-1.global")
		}
		_, err = get("cluster-1", apGVR, "bookinfo", "relaymesh-reviews")
		return found && err == nil, fmt.Sprint(found, err)
	})
	Eventually(t, 10*time.Second, "statuses Accepted", func() (bool, string) {
		var states []string
		for _, gvr := range []schema.GroupVersionResource{
			networkingv1alpha1.TrafficPolicies,
			networkingv1alpha1.AccessPolicies,
			networkingv1alpha1.VirtualMeshes,
		} {
			l, err := mgmtDyn.Resource(gvr).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, o := range l.Items {
				s, _, _ := unstructured.NestedString(o.Object, "status", "state")
				states = append(states, o.GetKind()+"="+s)
			}
		}
		return len(states) == 3 && !strings.Contains(strings.Join(states, ","), "=Invalid") && !strings.Contains(strings.Join(states, ","), "=\""), strings.Join(states, ",")
	})

	// Every object's status says where its outputs are and that the agents
	// applied them (status.clusters, from the agents' acks).
	tpGVR := networkingv1alpha1.TrafficPolicies
	apolGVR := networkingv1alpha1.AccessPolicies
	vmGVR := networkingv1alpha1.VirtualMeshes
	applied := func(gvr schema.GroupVersionResource, name string) (string, []any) {
		o, err := mgmtDyn.Resource(gvr).Namespace("relaymesh").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error(), nil
		}
		state, _, _ := unstructured.NestedString(o.Object, "status", "state")
		clusters, _, _ := unstructured.NestedSlice(o.Object, "status", "clusters")
		return state, clusters
	}
	Eventually(t, 10*time.Second, "status.clusters Applied", func() (bool, string) {
		_, tpc := applied(tpGVR, "reviews-shift")
		_, vmc := applied(vmGVR, "bookinfo-federation")
		ok := fmt.Sprint(tpc) == "[map[cluster:cluster-1 state:Applied version:"+versionOf(tpc)+"]]" &&
			strings.Count(fmt.Sprint(vmc), "state:Applied") == 2
		return ok, fmt.Sprint(tpc, vmc)
	})

	// An object in the way that is not Relaymesh's is never overwritten:
	// the agent reports a conflict and the policy's status names it.
	apGVRList := clients["cluster-1"].Resource(apGVR).Namespace("bookinfo")
	foreign := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
		"metadata": map[string]any{"name": "relaymesh-productpage", "namespace": "bookinfo"}, "spec": map[string]any{}}}
	_, err = apGVRList.Create(ctx, foreign, metav1.CreateOptions{})
	require.NoError(t, err)
	blocked := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": "AccessPolicy",
		"metadata": map[string]any{"name": "to-productpage", "namespace": "relaymesh"},
		"spec": map[string]any{"destinationSelector": []any{map[string]any{"kubeServiceRefs": map[string]any{"services": []any{
			map[string]any{"name": "productpage", "namespace": "bookinfo", "clusterName": "cluster-1"}}}}}}}}
	_, err = mgmtDyn.Resource(apolGVR).Namespace("relaymesh").Create(ctx, blocked, metav1.CreateOptions{})
	require.NoError(t, err)
	Eventually(t, 10*time.Second, "the conflict on the AccessPolicy's status", func() (bool, string) {
		state, clusters := applied(apolGVR, "to-productpage")
		return state == "Failed" && strings.Contains(fmt.Sprint(clusters), "AuthorizationPolicy bookinfo/relaymesh-productpage: conflict"), state + fmt.Sprint(clusters)
	})
	tp, err := mgmtDyn.Resource(tpGVR).Namespace("relaymesh").Get(ctx, "reviews-shift", metav1.GetOptions{})
	require.NoError(t, err)
	workloads, _, _ := unstructured.NestedStringSlice(tp.Object, "status", "workloads")
	require.NotEmpty(t, workloads, "status.workloads lists the policy's source workloads")
	require.Contains(t, strings.Join(workloads, ","), "productpage")
	for _, w := range workloads {
		require.Contains(t, w, "cluster-1", "reviews-shift's sources are the workloads of cluster-1")
	}
	cur, err := apGVRList.Get(ctx, "relaymesh-productpage", metav1.GetOptions{})
	require.NoError(t, err)
	require.Empty(t, cur.GetLabels(), "the foreign object was left as it was")

	// describe reads the same view from the live management cluster.
	out, err := Run(t, bin, "describe", "policy", "trafficpolicy/relaymesh/reviews-shift", "--kubeconfig", mgmt.Kubeconfig)
	require.NoError(t, err)
	for _, want := range []string{"Accepted", serviceName("cluster-1", "bookinfo", "reviews"), "VirtualService", "relaymesh-reviews"} {
		require.Contains(t, out, want)
	}
	out, err = Run(t, bin, "describe", "destination", serviceName("cluster-1", "bookinfo", "reviews"), "--kubeconfig", mgmt.Kubeconfig)
	require.NoError(t, err)
	for _, want := range []string{"reviews-shift", "productpage-to-reviews", "bookinfo-federation"} {
		require.Contains(t, out, want)
	}

	require.NoError(t, mgmtDyn.Resource(networkingv1alpha1.TrafficPolicies).
		Namespace("relaymesh").Delete(ctx, "reviews-shift", metav1.DeleteOptions{}))
	start = time.Now()
	Eventually(t, 10*time.Second, "the VirtualService gone after the policy was deleted", func() (bool, string) {
		_, err := get("cluster-1", vsGVR, "bookinfo", "relaymesh-reviews")
		return err != nil && strings.Contains(err.Error(), "not found"), fmt.Sprint(err)
	})
	t.Logf("TrafficPolicy outputs pruned %s after the policy was deleted", time.Since(start).Round(time.Millisecond))
}

// versionOf returns the version field of the first status.clusters entry.
func versionOf(clusters []any) string {
	if len(clusters) == 0 {
		return ""
	}
	m, _ := clusters[0].(map[string]any)
	return fmt.Sprint(m["version"])
}
