package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// chartDir is the agent chart of this repository.
func chartDir(t *testing.T) string {
	t.Helper()
	root, err := localcluster.RepoRoot()
	require.NoError(t, err)
	dir := filepath.Join(root, "charts", "relaymesh-agent")
	_, err = os.Stat(filepath.Join(dir, "Chart.yaml"))
	require.NoError(t, err, "the relaymesh-agent chart")
	return dir
}

// startChartAgent runs the agent the way the chart's Deployment does —
// its container's arguments, authenticated as the chart's ServiceAccount
// (a TokenRequest token) — as a process of this test, since no kubelet
// runs the Pod.
func (w *world) startChartAgent(cluster, namespace, release string) {
	w.t.Helper()
	cs := w.clients[cluster]
	dep, err := cs.AppsV1().Deployments(namespace).Get(w.ctx, release, metav1.GetOptions{})
	require.NoError(w.t, err, "the chart's Deployment")
	pod := dep.Spec.Template.Spec
	require.Len(w.t, pod.Containers, 1)
	seconds := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(w.ctx, pod.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	require.NoError(w.t, err)
	c := w.env.Cluster(cluster)
	admin, err := clientcmd.LoadFromFile(c.Kubeconfig)
	require.NoError(w.t, err)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = admin.Clusters[cluster]
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["chart-sa"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa", Namespace: namespace}
	cfg.CurrentContext = "chart-sa"
	path := filepath.Join(w.dir, cluster+"-chart-sa.kubeconfig")
	require.NoError(w.t, clientcmd.WriteToFile(*cfg, path))

	metrics, health := freeAddr(w.t, ""), freeAddr(w.t, "")
	w.agentAddrs[cluster] = [2]string{metrics, health}
	args := []string{"--kubeconfig", path}
	for _, a := range pod.Containers[0].Args {
		switch {
		case strings.HasPrefix(a, "--health-listen="):
			a = "--health-listen=" + health
		case strings.HasPrefix(a, "--metrics-listen="):
			a = "--metrics-listen=" + metrics
		case a == "--identity=$(POD_NAME)":
			a = "--identity=" + release + "-0"
		}
		args = append(args, a)
	}
	require.Equal(w.t, "agent", args[2], "the chart runs relaymesh agent: %v", args)
	args = append([]string{args[2], args[0], args[1]}, args[3:]...)
	w.agents[cluster] = w.start("agent-"+cluster, time.Now, args...)
}

// TestRegisterThroughChart registers workload clusters the two ways an
// operator without a shell on the cluster does: with the agent chart
// installed by the Helm SDK, and for GitOps (--dry-run -o yaml, applied
// later by someone else). Either way the agent — run as the chart's
// ServiceAccount with the chart's arguments — connects.
func TestRegisterThroughChart(t *testing.T) {
	w := baseWorld(t, []string{"chart-1", "gitops-1"}, 24*time.Hour)
	chart := chartDir(t)

	t.Run("installed with the Helm SDK", func(t *testing.T) {
		defer w.in(t)()
		out := w.mustRelaymesh("cluster", "register", "chart-1", "--mgmt-context", "mgmt", "--remote-context", "chart-1", "--server-address", w.relayAddr,
			"--chart", chart, "--set", "image.repository=registry.example.com/platform/relaymesh", "--set", "replicas=1")
		assert.Contains(t, out, "registered cluster chart-1")
		assert.Contains(t, out, "installed chart relaymesh-agent 0.1.0 as release relaymesh-agent (revision 1) in relaymesh of the workload cluster")
		cs := w.clients["chart-1"]
		dep, err := cs.AppsV1().Deployments("relaymesh").Get(w.ctx, "relaymesh-agent", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, int32(1), *dep.Spec.Replicas, "--set reached the chart")
		assert.Contains(t, dep.Spec.Template.Spec.Containers[0].Image, "registry.example.com/platform/relaymesh")
		args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
		assert.Contains(t, args, "--cluster=chart-1", "the registration's values win")
		assert.Contains(t, args, "--server-address="+w.relayAddr)
		releases, err := cs.CoreV1().Secrets("relaymesh").List(w.ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=relaymesh-agent"})
		require.NoError(t, err)
		assert.Len(t, releases.Items, 1, "a Helm release, as helm list shows it")

		w.startChartAgent("chart-1", "relaymesh", "relaymesh-agent")
		w.waitConnected("chart-1", true)

		// Registering it again is refused before anything changes.
		_, errOut, code := w.relaymesh("cluster", "register", "chart-1", "--mgmt-context", "mgmt", "--remote-context", "chart-1", "--server-address", w.relayAddr, "--chart", chart)
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, "cluster chart-1 is already registered")
		// A chart that is not the agent's is refused, and the registration
		// it would have made stands as before.
		_, errOut, code = w.relaymesh("cluster", "register", "chart-2", "--mgmt-context", "mgmt", "--remote-context", "chart-1", "--remote-namespace", "other",
			"--server-address", w.relayAddr, "--chart", filepath.Join(filepath.Dir(chart), "relaymesh-server"))
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, "is not the relaymesh-agent chart")
		_, err = w.mgmtDyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Get(w.ctx, "chart-2", metav1.GetOptions{})
		assert.True(t, notFound(err), "a refused chart registers nothing: %v", err)
		_, errOut, code = w.relaymesh("cluster", "register", "chart-2", "--mgmt-context", "mgmt", "--remote-context", "chart-1", "--server-address", w.relayAddr, "--chart", chart, "--values", filepath.Join(t.TempDir(), "missing.yaml"))
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, "chart values")
	})

	t.Run("GitOps: printed, applied later", func(t *testing.T) {
		defer w.in(t)()
		out, errOut, code := w.relaymesh("cluster", "register", "gitops-1", "--mgmt-context", "mgmt", "--server-address", w.relayAddr,
			"--chart", chart, "--set", "replicas=1", "--dry-run", "-o", "yaml")
		require.Equal(t, 0, code, errOut)
		assert.Contains(t, errOut, "single use and expires")
		for _, want := range []string{"#   cluster: gitops-1", "kind: Namespace", "name: relay-root-tls-secret", "name: relay-identity-token-secret", "name: relaymesh-agent-config",
			"kind: Deployment", "kind: ServiceAccount", "--cluster=gitops-1"} {
			assert.Contains(t, out, want)
		}
		// Nothing was written into the workload cluster.
		_, err := w.clients["gitops-1"].CoreV1().Namespaces().Get(w.ctx, "relaymesh", metav1.GetOptions{})
		assert.True(t, notFound(err), "the dry run wrote into the workload cluster: %v", err)
		// The management side is registered: the printed token is valid.
		assert.False(t, w.cluster("gitops-1").Status.Connected)

		// The GitOps tool applies what was printed.
		_, err = w.env.Cluster("gitops-1").Apply(w.ctx, "gitops", []byte(out))
		require.NoError(t, err)
		w.startChartAgent("gitops-1", "relaymesh", "relaymesh-agent")
		w.waitConnected("gitops-1", true)

		// -o json is one List of the same objects.
		out = w.mustRelaymesh("cluster", "register", "gitops-2", "--mgmt-context", "mgmt", "--server-address", w.relayAddr, "--dry-run", "-o", "json")
		var list struct {
			Kind  string `json:"kind"`
			Items []struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			} `json:"items"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &list))
		assert.Equal(t, "List", list.Kind)
		var kinds []string
		for _, i := range list.Items {
			kinds = append(kinds, fmt.Sprintf("%s/%s", i.Kind, i.Metadata.Name))
		}
		assert.Equal(t, []string{"Namespace/relaymesh", "Secret/relay-root-tls-secret", "Secret/relay-identity-token-secret", "ConfigMap/relaymesh-agent-config"}, kinds)
	})

	// Both agents, each run as its chart's ServiceAccount, are what check
	// sees (from the management side: there is no kubelet, so no pods).
	t.Run("listed", func(t *testing.T) {
		defer w.in(t)()
		var list clusterList
		require.NoError(t, json.Unmarshal([]byte(w.mustRelaymesh("cluster", "list", "--context", "mgmt", "-o", "json")), &list))
		require.Len(t, list.Clusters, 3)
		assert.True(t, list.Clusters[0].Connected)
		assert.True(t, list.Clusters[1].Connected)
		assert.False(t, list.Clusters[2].Connected, "gitops-2 was printed, never applied")
	})

	// Deregistered: gitops-2 on the management side only (its workload
	// cluster never saw it), chart-1 with its agent's secrets; the server
	// ends chart-1's session.
	t.Run("deregistered", func(t *testing.T) {
		defer w.in(t)()
		out := w.mustRelaymesh("cluster", "deregister", "gitops-2", "--mgmt-context", "mgmt")
		assert.Contains(t, out, "deregistered cluster gitops-2")
		out = w.mustRelaymesh("cluster", "deregister", "chart-1", "--mgmt-context", "mgmt", "--remote-context", "chart-1")
		assert.Contains(t, out, "removed the agent's secrets from relaymesh in the workload cluster")
		for _, s := range []string{identity.RootSecret, identity.TokenSecret, identity.ClientSecret} {
			_, err := w.clients["chart-1"].CoreV1().Secrets("relaymesh").Get(w.ctx, s, metav1.GetOptions{})
			assert.True(t, notFound(err), "%s: %v", s, err)
		}
		connected := regexp.MustCompile(`(?m)^` + server.MetricConnectedAgents + ` (\S+)$`)
		w.eventually(30*time.Second, "one agent session left (gitops-1's)", func() (bool, string) {
			resp, err := w.opsGet("/metrics")
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return false, err.Error()
			}
			m := connected.FindStringSubmatch(string(body))
			return m != nil && m[1] == "1", fmt.Sprint(m)
		})
		var list clusterList
		require.NoError(t, json.Unmarshal([]byte(w.mustRelaymesh("cluster", "list", "--context", "mgmt", "-o", "json")), &list))
		require.Len(t, list.Clusters, 1)
		assert.Equal(t, "gitops-1", list.Clusters[0].Name)
		_, errOut, code := w.relaymesh("cluster", "deregister", "chart-1", "--mgmt-context", "mgmt")
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, "cluster chart-1 is not registered")
	})
}
