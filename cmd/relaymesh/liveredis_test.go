package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// An installation that keeps its Workloads in Redis (--snapshot-store=redis):
// `describe` and `policy audit` read them from the real Redis, verified
// with the replicas' key from its Secret, given the flags the servers have;
// without them they refuse and say why; a record the key does not verify
// and a missing key are clear errors; no flag leaks the password.
func TestLiveViewFromRedis(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	mgmt, cs, dyn := localcluster.Management(t, "relaymesh")
	r, err := localcluster.StartRedis(ctx, localcluster.RedisConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Stop() })

	// A registered cluster whose status says its Workloads are in Redis.
	clusters := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh")
	created, err := clusters.Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "multicluster.relaymesh.io/v1alpha1", "kind": "KubernetesCluster",
		"metadata": map[string]any{"name": "east", "namespace": "relaymesh"}, "spec": map[string]any{}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	created.Object["status"] = map[string]any{"discovered": map[string]any{"meshes": 1, "workloads": 1, "destinations": 0, "serviceAccounts": 1, "workloadsIn": "redis"}}
	_, err = clusters.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)

	// Its record, sealed with the replicas' key as a replica writes it.
	key := make([]byte, 32)
	_, err = rand.Read(key)
	require.NoError(t, err)
	_, err = cs.CoreV1().Secrets("relaymesh").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: snapshotKeySecret, Namespace: "relaymesh"}, Data: map[string][]byte{"key": key}}, metav1.CreateOptions{})
	require.NoError(t, err)
	w := &relaypb.Workload{Name: "productpage-v1", Namespace: "shop", Cluster: "east", Kind: "Deployment",
		PodLabels: map[string]string{"app": "productpage"}, ServiceAccount: "productpage", MeshName: "istiod", MeshNamespace: "istio-system"}
	snap := relaytest.Spec{Cluster: "east"}.Snapshot()
	snap.Workloads = []*relaypb.Workload{w}
	relaytest.Rehash(snap)
	put := func(key []byte) {
		store, err := snapshots.New(snapshots.Config{Address: r.Address(), Password: r.Password(), TLS: r.TLS(), Key: key})
		require.NoError(t, err)
		defer store.Close()
		_, err = store.Put(ctx, snapshots.Record{Cluster: "east", Snapshot: snap, Replica: "replica-0"})
		require.NoError(t, err)
	}
	put(key)
	want, err := server.SharedWorkload("east", "relaymesh", w)
	require.NoError(t, err)

	redisFlags := []string{"--redis-address", r.Address(), "--redis-password-file", r.PasswordFile(), "--redis-ca-file", r.CAFile(), "--kubeconfig", mgmt.Kubeconfig}
	runOK := func(args ...string) string {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(ctx, args, &out, &errOut), "%v: %s", args, errOut.String())
		assert.NotContains(t, out.String()+errOut.String(), r.Password())
		return out.String()
	}
	runFails := func(args ...string) string {
		var out, errOut bytes.Buffer
		assert.NotEqual(t, 0, run(ctx, args, &out, &errOut), "%v", args)
		assert.Empty(t, out.String(), "%v", args)
		assert.NotContains(t, errOut.String(), r.Password())
		return errOut.String()
	}

	out := runOK(append([]string{"describe", "workload", want.Name, "-o", "json"}, redisFlags...)...)
	var described map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &described), out)
	assert.Contains(t, out, "productpage", "the workload read from Redis is described")
	audit := runOK(append([]string{"policy", "audit", "-o", "json"}, redisFlags...)...)
	assert.Contains(t, audit, "productpage", "the audit's sources include the workload in Redis")

	// Without the flags: refused, saying how.
	for _, args := range [][]string{{"policy", "audit"}, {"describe", "workload", want.Name}} {
		msg := runFails(append(args, "--kubeconfig", mgmt.Kubeconfig)...)
		assert.Contains(t, msg, "keeps its Workloads in the server replicas' snapshot store", "%v", args)
		assert.Contains(t, msg, "--redis-address", "%v", args)
	}
	// Flags that make no sense together, or half of them.
	assert.Contains(t, runFails("policy", "audit", "--redis-password-file", r.PasswordFile(), "--kubeconfig", mgmt.Kubeconfig), "--redis-password-file needs --redis-address")
	assert.Contains(t, runFails("policy", "audit", "--redis-address", r.Address(), "--kubeconfig", mgmt.Kubeconfig), "needs --redis-ca-file")
	assert.Contains(t, runFails("describe", "workload", "x", "-f", t.TempDir(), "--redis-address", r.Address()), "give one of them")
	// The wrong password is Redis's refusal, without the password.
	assert.Contains(t, runFails("policy", "audit", "--redis-address", r.Address(), "--redis-password-file", writeTemp(t, "not-the-password\n"), "--redis-ca-file", r.CAFile(), "--kubeconfig", mgmt.Kubeconfig), "east")

	// A record sealed with another key (someone who can write to Redis but
	// lacks the replicas' key): refused, not shown.
	other := make([]byte, 32)
	_, err = rand.Read(other)
	require.NoError(t, err)
	put(other)
	assert.Contains(t, runFails(append([]string{"policy", "audit"}, redisFlags...)...), "snapshot record refused")
	put(key)
	runOK(append([]string{"policy", "audit"}, redisFlags...)...)

	// An installation whose clusters keep their Workloads in the
	// apiserver: the Redis flags are not used, and the output says so.
	created, err = clusters.Get(ctx, "east", metav1.GetOptions{})
	require.NoError(t, err)
	created.Object["status"] = map[string]any{"discovered": map[string]any{"meshes": 1, "workloads": 1, "destinations": 0, "serviceAccounts": 1, "workloadsIn": "apiserver"}}
	_, err = clusters.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)
	var out2, errOut2 bytes.Buffer
	require.Equal(t, 0, run(ctx, append([]string{"policy", "audit", "-o", "json"}, redisFlags...), &out2, &errOut2), errOut2.String())
	assert.Contains(t, errOut2.String(), "--redis-address is not used")
	assert.NotContains(t, out2.String(), "productpage", "Workloads from the apiserver, where there are none")
	created, err = clusters.Get(ctx, "east", metav1.GetOptions{})
	require.NoError(t, err)
	created.Object["status"] = map[string]any{"discovered": map[string]any{"meshes": 1, "workloads": 1, "destinations": 0, "serviceAccounts": 1, "workloadsIn": "redis"}}
	_, err = clusters.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)

	// No key: the reader does not make one.
	require.NoError(t, cs.CoreV1().Secrets("relaymesh").Delete(ctx, snapshotKeySecret, metav1.DeleteOptions{}))
	assert.Contains(t, runFails(append([]string{"policy", "audit"}, redisFlags...)...), "the server replicas create it")
	_, err = cs.CoreV1().Secrets("relaymesh").Get(ctx, snapshotKeySecret, metav1.GetOptions{})
	assert.Error(t, err, "no key was created by a reader")
}

// writeTemp writes content to a new file (mode 0600) and returns its path.
func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}
