package main

import (
	"bytes"
	"context"
	"os"
	"testing"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
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
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: t.TempDir(), Clusters: []string{"mgmt"}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	mgmt := env.Cluster("mgmt")
	cs, err := mgmt.Clientset()
	require.NoError(t, err)
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	world, err := os.ReadFile(auditWorld)
	require.NoError(t, err)
	_, err = mgmt.Apply(ctx, "policy-audit-test", world)
	require.NoError(t, err)

	dir := auditDir(t)
	for _, extra := range [][]string{{"--output", "json"}, {"--output", "json", "--without", "ap/relaymesh/reviews-from-tools"}, {}} {
		var live, offline, errOut bytes.Buffer
		require.Equal(t, 0, run(ctx, append([]string{"policy", "audit", "--kubeconfig", mgmt.Kubeconfig}, extra...), &live, &errOut), errOut.String())
		require.Equal(t, 0, run(ctx, append([]string{"policy", "audit", "-f", dir}, extra...), &offline, &errOut), errOut.String())
		assert.Equal(t, offline.String(), live.String(), "%v", extra)
		assert.NotEmpty(t, live.String())
	}

	// An installation that keeps its Workloads in Redis: a live audit
	// would miss every source workload, so it refuses and says why.
	kc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "multicluster.relaymesh.io/v1alpha1", "kind": "KubernetesCluster",
		"metadata": map[string]any{"name": "redis-mode", "namespace": "relaymesh"}, "spec": map[string]any{}}}
	clusters := dynamic.NewForConfigOrDie(mgmt.RESTConfig()).Resource(multiclusterv1alpha1.GroupVersion.WithResource("kubernetesclusters")).Namespace("relaymesh")
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
