package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// TestKubeconfigMode registers a cluster in the weaker kubeconfig mode: a
// server without --allow-kubeconfig-clusters ignores it; with the flag, the
// server runs discovery and apply in-process with the kubeconfig it holds —
// of two replicas only the Lease holder, and the other once it stops.
func TestKubeconfigMode(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt", "cluster-1")
	mgmt, c1 := env.Cluster("mgmt"), env.Cluster("cluster-1")
	mgmtCS, err := mgmt.Clientset()
	require.NoError(t, err)
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	_, err = c1.Apply(ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", "cluster-1")))
	require.NoError(t, err)

	out, err := Run(t, bin, "cluster", "register", "cluster-1", "--mode", "kubeconfig", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", c1.Kubeconfig)
	require.NoError(t, err)
	assert.Contains(t, out, "WEAKER")

	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	destination := func() bool {
		_, err := dyn.Resource(discoveryv1alpha1.Destinations).Namespace("relaymesh").Get(ctx, serviceName("cluster-1", "bookinfo", "reviews"), metav1.GetOptions{})
		return err == nil
	}

	// Without the opt-in the server leaves the cluster alone.
	opsAddr := Addr(t)
	off := Start(t, bin, dir, "server-default", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", Addr(t), "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", filepath.Join(dir, "audit-1.log"))
	waitHealthy(t, opsAddr)
	time.Sleep(2 * time.Second)
	assert.False(t, destination(), "kubeconfig mode is off by default")
	require.NoError(t, off.Stop(10*time.Second))

	// Two replicas: the in-process agent is once-only work, so only the
	// Lease holder discovers and applies; when it stops, the other does.
	type replica struct {
		proc    *localcluster.Process
		opsAddr string
	}
	var replicas []replica
	for i := range 2 {
		ops := Addr(t)
		p := Start(t, bin, dir, fmt.Sprintf("server-kubeconfig-%d", i), "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", Addr(t), "--metrics-listen", ops, "--metrics-plain-http",
			"--audit-log", filepath.Join(dir, fmt.Sprintf("audit-kubeconfig-%d.log", i)), "--allow-kubeconfig-clusters")
		waitHealthy(t, ops)
		replicas = append(replicas, replica{p, ops})
	}
	Eventually(t, 30*time.Second, "discovery through the held kubeconfig", func() (bool, string) { return destination(), "" })
	const managing = "managing a cluster in kubeconfig mode"
	managers := func() []int {
		var out []int
		for i, r := range replicas {
			b, err := os.ReadFile(r.proc.LogPath())
			require.NoError(t, err)
			if strings.Contains(string(b), managing) {
				out = append(out, i)
			}
		}
		return out
	}
	require.Len(t, managers(), 1, "one replica runs the in-process agent")
	lead := managers()[0]
	next := replicas[1-lead]
	require.NoError(t, replicas[lead].proc.Stop(10*time.Second))
	Eventually(t, 30*time.Second, "the other replica runs the in-process agent after the leader stopped", func() (bool, string) {
		b, err := os.ReadFile(next.proc.LogPath())
		return err == nil && strings.Contains(string(b), managing), fmt.Sprint(err)
	})
	opsAddr = next.opsAddr
	// The new holder discovers: a Service created after the handover is
	// mirrored.
	_, err = c1.Apply(ctx, "test", []byte(`
apiVersion: v1
kind: Service
metadata: {name: late, namespace: bookinfo}
spec: {ports: [{name: http, port: 9080}], selector: {app: reviews}}
`))
	require.NoError(t, err)
	Eventually(t, 30*time.Second, "a Service made after the handover is discovered", func() (bool, string) {
		_, err := dyn.Resource(discoveryv1alpha1.Destinations).Namespace("relaymesh").Get(ctx, serviceName("cluster-1", "bookinfo", "late"), metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})

	_, err = mgmt.Apply(ctx, "test", []byte(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews-route
  namespace: relaymesh
  labels: {relaymesh.io/target-cluster: cluster-1}
  annotations: {relaymesh.io/target-namespace: bookinfo}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews}}]}]}
`))
	require.NoError(t, err)
	c1Dyn, err := dynamic.NewForConfig(c1.RESTConfig())
	require.NoError(t, err)
	Eventually(t, 20*time.Second, "the output applied by the in-process agent", func() (bool, string) {
		vs, err := c1Dyn.Resource(virtualServices).Namespace("bookinfo").Get(ctx, "reviews-route", metav1.GetOptions{})
		return err == nil && vs.GetLabels()[outputs.OwnerLabel] == "relaymesh-agent", fmt.Sprint(err)
	})

	// Shared trust is refused here, visibly: the intermediate key would be
	// generated in the server, outside the cluster it is for.
	_, err = mgmt.Apply(ctx, "test", []byte(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: held, namespace: relaymesh}
spec:
  meshes: [{clusterName: cluster-1, namespace: istio-system, name: istiod}]
  mtls: {shared: {rootCA: {generated: {}}}}
`))
	require.NoError(t, err)
	debug := DebugReader(t, mgmt, opsAddr)
	Eventually(t, 20*time.Second, "the in-process agent reports shared trust as unavailable", func() (bool, string) {
		code, b, err := debug("/debug/snapshots/input")
		if err != nil {
			return false, err.Error()
		}
		return code == http.StatusOK && strings.Contains(string(b), "shared trust is not available in kubeconfig mode"), string(b)
	})
	c1CS, err := c1.Clientset()
	require.NoError(t, err)
	_, err = c1CS.CoreV1().Secrets("istio-system").Get(ctx, "cacerts", metav1.GetOptions{})
	assert.Error(t, err, "no cacerts written from outside the cluster")

	_, err = Run(t, bin, "cluster", "deregister", "cluster-1", "--mgmt-kubeconfig", mgmt.Kubeconfig)
	require.NoError(t, err)
	Eventually(t, 20*time.Second, "discovered objects removed after deregistration", func() (bool, string) { return !destination(), "" })
	_, err = mgmtCS.CoreV1().Secrets("relaymesh").Get(ctx, multiclusterv1alpha1.KubeconfigSecretName("cluster-1"), metav1.GetOptions{})
	assert.Error(t, err, "the held kubeconfig is deleted on deregistration")
}
