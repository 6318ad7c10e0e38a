package controller

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// An object the controller cannot read stops translation instead of being
// skipped (skipping a VirtualMesh would drop its deny-all policy).
func TestUnreadableObjectFailsClosed(t *testing.T) {
	c := &Controller{informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{}, typed: map[schema.GroupVersionResource]map[string]typedObject{}}
	for _, gvr := range []schema.GroupVersionResource{gvrMesh, gvrWorkload, gvrDestination, gvrVirtualMesh, gvrTraffic, gvrAccess, gvrVirtualDest, gvrCluster} {
		c.informers[gvr] = cache.NewSharedIndexInformer(&cache.ListWatch{}, &unstructured.Unstructured{}, 0, cache.Indexers{})
	}
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": "VirtualMesh",
		"metadata": map[string]any{"name": "vm", "namespace": "relaymesh"},
		"spec":     map[string]any{"meshes": "not-a-list", "globalAccessPolicy": "Enabled"},
	}}
	require.NoError(t, c.informers[gvrVirtualMesh].GetStore().Add(bad))

	_, err := c.Input()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "VirtualMesh relaymesh/vm")
}

// Translation reads a KubernetesCluster's spec alone: a status write (an
// ack, a heartbeat, a certificate — a thousand per policy edit before
// issue 31) is no reason to convert it again, and the status is not handed
// to translation; a spec change is converted at once.
func TestClustersAreConvertedOnSpecChangesOnly(t *testing.T) {
	c := &Controller{informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{}, typed: map[schema.GroupVersionResource]map[string]typedObject{}}
	for _, gvr := range []schema.GroupVersionResource{gvrMesh, gvrWorkload, gvrDestination, gvrVirtualMesh, gvrTraffic, gvrAccess, gvrVirtualDest, gvrCluster} {
		c.informers[gvr] = cache.NewSharedIndexInformer(&cache.ListWatch{}, &unstructured.Unstructured{}, 0, cache.Indexers{})
	}
	kc := func(rv string, generation int64, domains []any, connected bool) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "multicluster.relaymesh.io/v1alpha1", "kind": "KubernetesCluster",
			"metadata": map[string]any{"name": "c1", "namespace": "relaymesh", "uid": "u1", "resourceVersion": rv, "generation": generation},
			"spec":     map[string]any{"mode": "relay", "trustDomains": domains},
			"status":   map[string]any{"connected": connected},
		}}
	}
	store := c.informers[gvrCluster].GetStore()
	require.NoError(t, store.Add(kc("1", 1, []any{map[string]any{"name": "a.example"}}, false)))
	in, err := c.Input()
	require.NoError(t, err)
	require.Len(t, in.Clusters, 1)
	assert.False(t, in.Clusters[0].Status.Connected, "no status is handed over")
	first := c.typed[gvrCluster]["relaymesh/c1"]

	require.NoError(t, store.Update(kc("2", 1, []any{map[string]any{"name": "a.example"}}, true))) // a status write
	in, err = c.Input()
	require.NoError(t, err)
	assert.Equal(t, first, c.typed[gvrCluster]["relaymesh/c1"], "a status write is not converted again")
	assert.False(t, in.Clusters[0].Status.Connected)

	require.NoError(t, store.Update(kc("3", 2, []any{map[string]any{"name": "b.example"}}, true))) // a spec change
	in, err = c.Input()
	require.NoError(t, err)
	require.Len(t, in.Clusters[0].Spec.TrustDomains, 1)
	assert.Equal(t, "b.example", in.Clusters[0].Spec.TrustDomains[0].Name, "a spec change is read at once")
}
