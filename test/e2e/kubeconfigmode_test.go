package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// TestKubeconfigMode registers a cluster in the weaker kubeconfig mode: a
// server without --allow-kubeconfig-clusters ignores it; with the flag, the
// server runs discovery and apply in-process with the kubeconfig it holds.
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
		_, err := dyn.Resource(server.DestinationsResource).Namespace("relaymesh").Get(ctx, serviceName("cluster-1", "bookinfo", "reviews"), metav1.GetOptions{})
		return err == nil
	}

	// Without the opt-in the server leaves the cluster alone.
	opsAddr := Addr(t)
	off := Start(t, bin, dir, "server-default", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", Addr(t), "--metrics-listen", opsAddr,
		"--audit-log", filepath.Join(dir, "audit-1.log"))
	waitHealthy(t, opsAddr)
	time.Sleep(2 * time.Second)
	assert.False(t, destination(), "kubeconfig mode is off by default")
	require.NoError(t, off.Stop(10*time.Second))

	opsAddr = Addr(t)
	Start(t, bin, dir, "server-kubeconfig", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", Addr(t), "--metrics-listen", opsAddr,
		"--audit-log", filepath.Join(dir, "audit-2.log"), "--allow-kubeconfig-clusters")
	waitHealthy(t, opsAddr)
	Eventually(t, 30*time.Second, "discovery through the held kubeconfig", func() (bool, string) { return destination(), "" })

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
		return err == nil && vs.GetLabels()["relaymesh.io/owner"] == "relaymesh-agent", fmt.Sprint(err)
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
	_, err = mgmtCS.CoreV1().Secrets("relaymesh").Get(ctx, server.KubeconfigSecretName("cluster-1"), metav1.GetOptions{})
	assert.Error(t, err, "the held kubeconfig is deleted on deregistration")
}
