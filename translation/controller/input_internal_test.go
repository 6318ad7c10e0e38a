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
