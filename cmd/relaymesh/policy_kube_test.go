package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// TestPolicyAuditLive audits a real management cluster (a kube-apiserver
// with Relaymesh's CRDs, the audit world applied to it) and gets what the
// same objects give offline with -f, including a what-if.
func TestPolicyAuditLive(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, _, _ := localcluster.Management(t, "relaymesh")
	world, err := os.ReadFile(auditWorld)
	require.NoError(t, err)
	_, err = mgmt.Apply(ctx, "policy-audit-test", world)
	require.NoError(t, err)

	w := &liveWorld{mgmt: mgmt, dyn: dynamic.NewForConfigOrDie(mgmt.RESTConfig())}
	dir := auditDir(t)
	for _, extra := range [][]string{{"--output", "json"}, {"--output", "json", "--without", "ap/relaymesh/reviews-from-tools"}, {}} {
		var live, offline, errOut bytes.Buffer
		require.Equal(t, 0, run(ctx, append([]string{"policy", "audit", "--kubeconfig", mgmt.Kubeconfig, "--fail-on", "none"}, extra...), &live, &errOut), errOut.String())
		require.Equal(t, 0, run(ctx, append([]string{"policy", "audit", "-f", dir, "--fail-on", "none"}, extra...), &offline, &errOut), errOut.String())
		assert.Equal(t, withoutInput(t, offline.String()), live.String(), "%v", extra)
		assert.NotEmpty(t, live.String())
	}

	w.refusedPolicy(t, ctx, world)

	// An installation that keeps its Workloads in Redis: a live audit
	// would miss every source workload, so it refuses and says why.
	kc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "multicluster.relaymesh.io/v1alpha1", "kind": "KubernetesCluster",
		"metadata": map[string]any{"name": "redis-mode", "namespace": "relaymesh"}, "spec": map[string]any{}}}
	clusters := dynamic.NewForConfigOrDie(mgmt.RESTConfig()).Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh")
	created, err := clusters.Create(ctx, kc, metav1.CreateOptions{})
	require.NoError(t, err)
	created.Object["status"] = map[string]any{"discovered": map[string]any{"meshes": 1, "workloads": 10, "destinations": 2, "serviceAccounts": 3, "workloadsIn": "redis"}}
	_, err = clusters.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)
	for _, args := range [][]string{{"policy", "audit"}, {"describe", "workload", "x"}} {
		var out, errOut bytes.Buffer
		assert.NotEqual(t, 0, run(ctx, append(args, "--kubeconfig", mgmt.Kubeconfig), &out, &errOut), "%v", args)
		assert.Contains(t, errOut.String(), "keeps its Workloads in the server replicas' snapshot store", "%v", args)
		assert.Empty(t, out.String())
	}
}

// liveWorld is the management cluster of TestPolicyAuditLive.
type liveWorld struct {
	mgmt *localcluster.Cluster
	dyn  dynamic.Interface
}

// withoutInput drops the input section (which only files have) of a JSON
// or table output, so live and offline outputs compare.
func withoutInput(t *testing.T, out string) string {
	t.Helper()
	if strings.HasPrefix(out, "{") {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(out), &m))
		if _, ok := m["input"]; !ok {
			return out
		}
		// Re-encode the same fields in the same order, without input.
		i := strings.Index(out, "\n  \"input\": ")
		j := strings.Index(out, "\n  \"matrix\": ")
		if j < 0 {
			j = strings.Index(out, "\n  \"added\": ")
		}
		require.True(t, i > 0 && j > i, "input section not found")
		return out[:i] + out[j:]
	}
	if strings.HasPrefix(out, "INPUT: ") {
		_, rest, _ := strings.Cut(out, "\n\n")
		return rest
	}
	return out
}

// refusedPolicy replaces the audit world by the demo's with an AccessPolicy
// admission refuses (every source to every destination, no opt-in), the
// way it gets in when the webhook is not installed: the live audit shows
// the demo's 2 pairs, not 16, and no shadowed policy; describe says it is
// not in force; export and kubectl get -o yaml read back by the offline
// audit give the same result; and an object the server reports Invalid for
// its generation is left out live too.
func (w *liveWorld) refusedPolicy(t *testing.T, ctx context.Context, old []byte) {
	objs, err := localcluster.DecodeObjects(old)
	require.NoError(t, err)
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		resource := strings.ToLower(gvk.Kind) + "s"
		switch {
		case strings.HasSuffix(gvk.Kind, "Mesh"):
			resource = strings.ToLower(gvk.Kind) + "es"
		case strings.HasSuffix(gvk.Kind, "Policy"):
			resource = strings.TrimSuffix(strings.ToLower(gvk.Kind), "y") + "ies"
		}
		gvr := gvk.GroupVersion().WithResource(resource)
		require.NoError(t, w.dyn.Resource(gvr).Namespace(o.GetNamespace()).Delete(ctx, o.GetName(), metav1.DeleteOptions{}), "%s %s", gvk.Kind, o.GetName())
	}
	world, err := os.ReadFile(filepath.Join(gate, "world.yaml"))
	require.NoError(t, err)
	refused, err := os.ReadFile(filepath.Join(gate, "refused.yaml"))
	require.NoError(t, err)
	_, err = w.mgmt.Apply(ctx, "policy-audit-test", append(append(world, "\n---\n"...), refused...))
	require.NoError(t, err)
	kc := w.mgmt.Kubeconfig

	audit := func(code int, stdin string, args ...string) (accessaudit.Result, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		require.Equal(t, code, runStdin(ctx, append([]string{"policy", "audit", "-o", "json"}, args...), stdin, &out, &errOut), errOut.String())
		var r accessaudit.Result
		require.NoError(t, json.Unmarshal(out.Bytes(), &r))
		return r, withoutInput(t, out.String())
	}
	// Live: the refused policy is a high finding (exit 1), not a grant.
	live, liveJSON := audit(1, "", "--kubeconfig", kc)
	require.Len(t, live.Matrix.Pairs, 2, "the demo's 2 pairs, not 16")
	for _, p := range live.Matrix.Pairs {
		require.Len(t, p.Grants, 1)
		assert.Equal(t, "relaymesh/productpage-to-reviews", p.Grants[0].Policy)
	}
	var kinds []string
	for _, f := range live.Findings {
		kinds = append(kinds, f.Kind+" "+f.Objects[0])
	}
	assert.Equal(t, []string{"refused-by-admission AccessPolicy/relaymesh/allow-all"}, kinds, "no shadowed finding for the real policy")

	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"describe", "policy", "accesspolicy/relaymesh/allow-all", "--kubeconfig", kc}, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "In force:")
	assert.Contains(t, out.String(), "no — the server does not translate it")
	assert.Contains(t, out.String(), "refused by admission")
	assert.Contains(t, out.String(), "Outputs:  <none>")

	// Export, and kubectl get -o yaml, read back offline: the same audit
	// (the offline one exits 2: from files, a refused object is invalid
	// input, as the admission webhook would refuse it).
	exported := filepath.Join(t.TempDir(), "world.yaml")
	out.Reset()
	require.Equal(t, 0, run(ctx, []string{"policy", "export", "--kubeconfig", kc, "--out", exported}, &out, &errOut), errOut.String())
	_, offlineJSON := audit(2, "", "-f", exported)
	assert.Equal(t, liveJSON, offlineJSON, "export reads back equal")
	// --discovered-only: the world a repository's policies are audited
	// against; with the user objects read from files it is the same audit.
	discovered := filepath.Join(t.TempDir(), "discovered.yaml")
	require.Equal(t, 0, run(ctx, []string{"policy", "export", "--kubeconfig", kc, "--discovered-only", "--out", discovered}, &out, &errOut), errOut.String())
	b, err := os.ReadFile(discovered)
	require.NoError(t, err)
	assert.Contains(t, string(b), "kind: Workload")
	assert.NotContains(t, string(b), "kind: AccessPolicy")
	assert.NotContains(t, string(b), "kind: VirtualMesh")
	userObjects := filepath.Join(t.TempDir(), "policies.yaml")
	var user []string
	for _, doc := range strings.Split(string(world)+"\n---\n"+string(refused), "\n---\n") {
		if strings.Contains(doc, "networking.relaymesh.io") {
			user = append(user, doc)
		}
	}
	require.NoError(t, os.WriteFile(userObjects, []byte(strings.Join(user, "\n---\n")), 0o600))
	_, repoJSON := audit(2, "", "-f", discovered, "-f", userObjects)
	assert.Equal(t, liveJSON, repoJSON, "discovered export + the repository's policies")

	root, err := localcluster.RepoRoot()
	require.NoError(t, err)
	list, err := exec.CommandContext(ctx, filepath.Join(root, ".cache", "bin", "kubectl"), "--kubeconfig", kc, "get",
		"kubernetesclusters,meshes,workloads,destinations,virtualmeshes,trafficpolicies,accesspolicies,virtualdestinations", "-A", "-o", "yaml").Output()
	require.NoError(t, err)
	require.Contains(t, string(list), "kind: List")
	_, kubectlJSON := audit(2, string(list), "-f", "-")
	assert.Equal(t, liveJSON, kubectlJSON, "kubectl get -o yaml reads back equal")

	// The server's own verdict counts live: an object it reports Invalid
	// for its current generation (say, by a rule set this view cannot
	// read) is left out.
	_, err = w.mgmt.Apply(ctx, "policy-audit-test", []byte(`apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: reviews-to-productpage, namespace: relaymesh}
spec:
  sourceSelector: [{kubeServiceAccountRefs: {serviceAccounts: [{name: bookinfo-reviews, namespace: bookinfo, clusterName: cluster-1}]}}]
  destinationSelector: [{kubeServiceMatcher: {labels: {app: productpage}}}]
`))
	require.NoError(t, err)
	aps := w.dyn.Resource(networkingv1alpha1.AccessPolicies).Namespace("relaymesh")
	ap, err := aps.Get(ctx, "reviews-to-productpage", metav1.GetOptions{})
	require.NoError(t, err)
	ap.Object["status"] = map[string]any{"state": "Invalid", "observedGeneration": ap.GetGeneration(), "errors": []any{"refused by admission, so it is not translated: team rule (relaymesh.admission.team)"}}
	_, err = aps.UpdateStatus(ctx, ap, metav1.UpdateOptions{})
	require.NoError(t, err)
	live, _ = audit(1, "", "--kubeconfig", kc)
	assert.Len(t, live.Matrix.Pairs, 2, "the policy the server reports Invalid allows nothing")
	found := false
	for _, f := range live.Findings {
		if f.Objects[0] == "AccessPolicy/relaymesh/reviews-to-productpage" {
			found = true
			assert.Contains(t, f.Message, "the server reports it Invalid")
		}
	}
	assert.True(t, found, "a finding for the policy the server reports Invalid: %v", live.Findings)
	require.NoError(t, aps.Delete(ctx, "reviews-to-productpage", metav1.DeleteOptions{}))
}
