package helm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestUpgradeAndReinstallKeepSecrets installs the previous chart version
// (the same charts packaged as 0.0.9), runs the job to shared trust, then
// helm upgrade to these charts: every Secret of the management cluster's
// and the workload clusters' relaymesh namespaces and every cacerts is
// untouched (same data, UID and resourceVersion) and none is Helm's. The
// processes restart as a rollout would, and the agents reconnect with the
// certificates they hold: no bootstrap token exists anywhere, the relay CA
// and the agents' certificates are byte for byte the same. Then helm
// uninstall and install again keep them the same way.
func TestUpgradeAndReinstallKeepSecrets(t *testing.T) {
	start := time.Now()
	h := newHelm(t)
	prev := t.TempDir()
	previous := map[string]string{}
	for _, chart := range []string{serverChart, agentChart} {
		previous[chart] = packageAs(t, h, chart, "0.0.9", prev)
	}
	// Agent certificates of a day: nothing renews during the test.
	values := []string{"--set", "serverIPs={127.0.0.1}", "--set", "webhook.enabled=true,webhook.clientCAConfigMap=apiserver-webhook-client-ca"}
	j := newJob(t, jobConfig{workload: []string{"cluster-1", "cluster-2"}, serverChart: previous[serverChart], agentChart: previous[agentChart], serverValues: values})
	_, _ = j.run(mainJob[:6]) // server, register, discovery, debug, translation, trust
	require.Equal(t, "trust", j.steps[len(j.steps)-1].name)
	requireRelease(t, h, j, "0.0.9", "1")
	serials := map[string]string{}
	for _, name := range j.cfg.workload {
		var err error
		serials[name], err = j.clientSerial(name)
		require.NoError(t, err)
	}
	before := j.allSecrets()
	require.Contains(t, before, "mgmt/relaymesh/relay-root-tls-secret")
	require.Contains(t, before, "mgmt/relaymesh/relay-tls-signing-secret")
	require.Contains(t, before, "cluster-1/relaymesh/relay-client-tls-secret")
	require.Contains(t, before, "cluster-2/istio-system/cacerts")
	serverSA := j.serviceAccountUID(j.mgmtKube, serverAccount)

	j.install(chartDir(t, serverChart), chartDir(t, agentChart), "upgrade")
	requireRelease(t, h, j, "0.1.0", "2")
	sameSecrets(t, "helm upgrade", before, j.allSecrets(), true)
	require.Equal(t, serverSA, j.serviceAccountUID(j.mgmtKube, serverAccount), "the upgrade kept the ServiceAccount")

	// The rollout: new pods from the upgraded Deployments.
	require.NoError(t, j.restart())
	after := j.allSecrets()
	// relay-server-tls-secret is the serving certificate the server issues
	// itself at every start (its key never leaves the process; the Secret is
	// a copy for tools), not CA material.
	delete(before, "mgmt/relaymesh/relay-server-tls-secret")
	sameSecrets(t, "upgrade rollout", before, after, false)
	for _, name := range j.cfg.workload {
		serial, err := j.clientSerial(name)
		require.NoError(t, err)
		require.Equal(t, serials[name], serial, "%s's agent reconnected with the certificate it held", name)
	}

	// helm uninstall keeps them; helm install again uses them.
	j.stop()
	kept := j.allSecrets()
	j.uninstall()
	_, err := j.mgmtKube.CoreV1().ServiceAccounts(namespace).Get(context.Background(), serverAccount, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "uninstalled: %v", err)
	sameSecrets(t, "helm uninstall", kept, j.allSecrets(), true)
	j.install(chartDir(t, serverChart), chartDir(t, agentChart), "install")
	require.NotEqual(t, serverSA, j.serviceAccountUID(j.mgmtKube, serverAccount), "a new ServiceAccount")
	require.NoError(t, j.startServer())
	for _, name := range j.cfg.workload {
		j.startAgents(name)
	}
	require.NoError(t, j.connected())
	require.NoError(t, j.noTokens())
	delete(kept, "mgmt/relaymesh/relay-server-tls-secret")
	sameSecrets(t, "uninstall and install", kept, j.allSecrets(), false)
	for _, name := range j.cfg.workload {
		serial, err := j.clientSerial(name)
		require.NoError(t, err)
		require.Equal(t, serials[name], serial, "%s's agent reconnected with the certificate it held", name)
	}
	t.Logf("upgrade, uninstall and reinstall: %s", time.Since(start).Round(time.Millisecond))
}

// packageAs packages a copy of chart with another version into dir.
func packageAs(t testing.TB, h helm, chart, version, dir string) string {
	t.Helper()
	src := chartDir(t, chart)
	dst := filepath.Join(t.TempDir(), chart)
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	meta := filepath.Join(dst, "Chart.yaml")
	b, err := os.ReadFile(meta)
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "version:") {
			lines[i] = "version: " + version
		}
	}
	require.NoError(t, os.WriteFile(meta, []byte(strings.Join(lines, "\n")), 0o644))
	out, err := h.run("package", dst, "--destination", dir)
	require.NoError(t, err, out)
	return filepath.Join(dir, chart+"-"+version+".tgz")
}

// requireRelease checks the chart version and revision of both releases.
func requireRelease(t testing.TB, h helm, j *job, version, revision string) {
	t.Helper()
	check := func(release, kubeconfig, chart string) {
		out, err := h.run("list", "--namespace", namespace, "--kubeconfig", kubeconfig, "--filter", "^"+release+"$")
		require.NoError(t, err)
		require.Contains(t, out, chart+"-"+version, out)
		fields := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1])
		require.Equal(t, revision, fields[2], out)
	}
	check("relaymesh-server", j.mgmt.Kubeconfig, serverChart)
	for _, name := range j.cfg.workload {
		check("relaymesh-agent", j.env.Cluster(name).Kubeconfig, agentChart)
	}
}

// allSecrets is every Secret of the relaymesh namespaces and every cacerts,
// keyed cluster/namespace/name.
func (j *job) allSecrets() map[string]corev1.Secret {
	out := map[string]corev1.Secret{}
	add := func(cluster string, cs kubernetes.Interface, namespaces ...string) {
		for k, s := range secretsOf(j.t, cs, namespaces...) {
			if s.Type == identity.TokenSecretType {
				continue // spent bootstrap tokens go after their retry window, upgrade or not
			}
			out[cluster+"/"+k] = s
		}
	}
	add("mgmt", j.mgmtKube, namespace)
	for _, name := range j.cfg.workload {
		add(name, j.kube[name], namespace, "istio-system")
	}
	return out
}

func (j *job) serviceAccountUID(cs kubernetes.Interface, name string) string {
	sa, err := cs.CoreV1().ServiceAccounts(namespace).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(j.t, err)
	return string(sa.UID)
}
