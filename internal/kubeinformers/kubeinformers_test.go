package kubeinformers_test

import (
	"context"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// On a real apiserver: every component asking for a resource gets the same
// informer, objects enter its cache without managedFields (the apiserver
// records them on every write), an informer asked for after Start starts
// at the next Start, and a component that got an object can still update
// it without losing the apiserver's managedFields.
func TestSharedInformers(t *testing.T) {
	const ns = "kubeinformers"
	_, _, dyn := localcluster.Management(t, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kcs := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns)
	kc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.relaymesh.io/v1alpha1", "kind": "KubernetesCluster",
		"metadata": map[string]any{"name": "cluster-1", "namespace": ns, "labels": map[string]any{"team": "a"}},
		"spec":     map[string]any{"mode": "relay"},
	}}
	applied, err := kcs.Apply(ctx, "cluster-1", kc, metav1.ApplyOptions{FieldManager: "test"})
	require.NoError(t, err)
	require.NotEmpty(t, applied.GetManagedFields(), "the apiserver records the field manager")

	shared := kubeinformers.NewShared(dyn, ns)
	first := shared.Local.Informer(multiclusterv1alpha1.KubernetesClusters)
	second := shared.Local.ForResource(multiclusterv1alpha1.KubernetesClusters).Informer()
	assert.Same(t, first, second, "one informer per resource in a factory")
	shared.Start(ctx.Done())
	require.True(t, cache.WaitForCacheSync(ctx.Done(), first.HasSynced))
	obj, ok, err := first.GetStore().GetByKey(ns + "/cluster-1")
	require.NoError(t, err)
	require.True(t, ok)
	cached := obj.(*unstructured.Unstructured)
	assert.Empty(t, cached.GetManagedFields(), "managedFields are dropped as the object enters the cache")
	assert.Equal(t, "a", cached.GetLabels()["team"], "the rest of the object is kept")

	// Asked for after Start: started by the next Start.
	meshes := shared.Local.Informer(discoveryv1alpha1.Meshes)
	assert.False(t, meshes.HasSynced())
	shared.Start(ctx.Done())
	require.Eventually(t, meshes.HasSynced, 30*time.Second, 50*time.Millisecond)

	// An update from the cached copy (DeepCopy: cached objects are
	// shared) keeps the apiserver's record of who owns what.
	next := cached.DeepCopy()
	next.SetLabels(map[string]string{"team": "b"})
	updated, err := kcs.Update(ctx, next, metav1.UpdateOptions{FieldManager: "other"})
	require.NoError(t, err)
	managers := map[string]bool{}
	for _, f := range updated.GetManagedFields() {
		managers[f.Manager] = true
	}
	assert.True(t, managers["test"], "the first manager's entry survives an update without managedFields: %v", managers)
	require.Eventually(t, func() bool {
		obj, ok, _ := first.GetStore().GetByKey(ns + "/cluster-1")
		return ok && obj.(*unstructured.Unstructured).GetLabels()["team"] == "b"
	}, 30*time.Second, 50*time.Millisecond)
	assert.Equal(t, cached.GetLabels()["team"], "a", "the object handed out before is not changed by the update")
}

func TestStripManagedFieldsPassesOtherValues(t *testing.T) {
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/name"}
	got, err := kubeinformers.StripManagedFields(tomb)
	require.NoError(t, err)
	assert.Equal(t, tomb, got)
	noMeta := &unstructured.Unstructured{Object: map[string]any{"kind": "X"}}
	got, err = kubeinformers.StripManagedFields(noMeta)
	require.NoError(t, err)
	assert.Equal(t, noMeta, got)
}
