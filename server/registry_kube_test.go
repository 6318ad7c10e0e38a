package server_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// A registration the watch has not shown (it lags, or an apiserver closed
// it as too slow) is read from the apiserver on a miss, so a storm's
// agents are not refused as unregistered; a name the apiserver does not
// have, or has in kubeconfig mode, stays unregistered.
func TestLookupFreshReadsWhatTheWatchMissed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, _, client := localcluster.Management(t, "relaymesh")
	create := func(name, mode string) string {
		spec := map[string]any{"mode": mode}
		if mode == "kubeconfig" {
			spec["kubeconfigSecretRef"] = map[string]any{"name": name + "-kubeconfig"}
		}
		u, err := client.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": multiclusterv1alpha1.GroupVersion.String(), "kind": "KubernetesCluster",
			"metadata": map[string]any{"name": name}, "spec": spec}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return string(u.GetUID())
	}
	uid := create("c1", "relay")
	create("kc", "kubeconfig")

	reg := server.NewRegistry()
	require.NoError(t, server.WatchClusters(ctx, client, nil, "relaymesh", reg, nil, slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.Eventually(t, func() bool { _, ok := reg.Lookup("c1"); return ok }, 10*time.Second, 20*time.Millisecond)

	// The watch "missed" c1: a lookup reads it again, with its UID.
	reg.Remove("c1")
	_, ok := reg.Lookup("c1")
	require.False(t, ok)
	got, ok := reg.LookupFresh(ctx, "c1")
	require.True(t, ok)
	assert.Equal(t, server.Registration{Name: "c1", UID: uid}, got)
	assert.Equal(t, []string{"c1"}, reg.Unconfirmed(0), "kept until the watch confirms it")

	for _, name := range []string{"nope", "kc", "UPPER", ""} {
		_, ok := reg.LookupFresh(ctx, name)
		assert.False(t, ok, "%q is not a relay registration", name)
	}

	// Deleted: the watch removes it, and a fresh lookup finds nothing.
	require.NoError(t, client.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Delete(ctx, "c1", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { _, ok := reg.Lookup("c1"); return !ok }, 10*time.Second, 20*time.Millisecond)
	_, ok = reg.LookupFresh(ctx, "c1")
	assert.False(t, ok)
	assert.Empty(t, reg.Unconfirmed(0))
}
