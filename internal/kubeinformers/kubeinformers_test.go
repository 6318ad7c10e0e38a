package kubeinformers_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
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
	require.IsType(t, &multiclusterv1alpha1.KubernetesCluster{}, obj, "a KubernetesCluster is cached typed")
	cached := obj.(*multiclusterv1alpha1.KubernetesCluster)
	assert.Empty(t, cached.GetManagedFields(), "managedFields are dropped as the object enters the cache")
	assert.Equal(t, "a", cached.GetLabels()["team"], "the rest of the object is kept")
	assert.Equal(t, multiclusterv1alpha1.ModeRelay, cached.Spec.Mode)

	// Asked for after Start: started by the next Start. A discovered kind
	// is cached typed, without managedFields.
	mesh := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "discovery.relaymesh.io/v1alpha1", "kind": "Mesh",
		"metadata": map[string]any{"name": "istiod-c1", "namespace": ns, "labels": map[string]any{"relaymesh.io/cluster": "c1"}},
		"spec": map[string]any{"agentNamespace": "relaymesh-system",
			"istio": map[string]any{"trustDomain": "c1.local", "installation": map[string]any{"cluster": "c1", "namespace": "istio-system"}}},
	}}
	_, err = dyn.Resource(discoveryv1alpha1.Meshes).Namespace(ns).Apply(ctx, "istiod-c1", mesh, metav1.ApplyOptions{FieldManager: "test"})
	require.NoError(t, err)
	meshes := shared.Local.Informer(discoveryv1alpha1.Meshes)
	assert.False(t, meshes.HasSynced())
	shared.Start(ctx.Done())
	require.Eventually(t, meshes.HasSynced, 30*time.Second, 50*time.Millisecond)
	obj, ok, err = meshes.GetStore().GetByKey(ns + "/istiod-c1")
	require.NoError(t, err)
	require.True(t, ok)
	require.IsType(t, &discoveryv1alpha1.Mesh{}, obj, "a discovered kind is cached typed")
	typed := obj.(*discoveryv1alpha1.Mesh)
	assert.Empty(t, typed.ManagedFields)
	assert.Equal(t, "c1", typed.Labels["relaymesh.io/cluster"])
	assert.NotEmpty(t, typed.ResourceVersion)
	assert.Equal(t, "Mesh", typed.Kind)
	require.NotNil(t, typed.Spec.Istio)
	assert.Equal(t, "c1.local", typed.Spec.Istio.TrustDomain)
	assert.Equal(t, "relaymesh-system", typed.Spec.AgentNamespace)

	// The listers hand out what the caches hold, typed or not (the
	// dynamic factory's own lister cast to unstructured and panicked).
	listed, err := shared.Local.ForResource(discoveryv1alpha1.Meshes).Lister().List(labels.Everything())
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Same(t, typed, listed[0])
	got, err := shared.Local.ForResource(multiclusterv1alpha1.KubernetesClusters).Lister().ByNamespace(ns).Get("cluster-1")
	require.NoError(t, err)
	assert.Same(t, cached, got)
	_, err = shared.Local.ForResource(discoveryv1alpha1.Meshes).Lister().ByNamespace(ns).Get("none")
	assert.True(t, apierrors.IsNotFound(err), "%v", err)
	tp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": "TrafficPolicy",
		"metadata": map[string]any{"name": "shift", "namespace": ns},
		"spec": map[string]any{"policy": map[string]any{"trafficShift": map[string]any{"destinations": []any{
			map[string]any{"weight": int64(100), "kubeService": map[string]any{"name": "reviews", "namespace": "bookinfo", "clusterName": "c1"}}}}}},
	}}
	_, err = dyn.Resource(networkingv1alpha1.TrafficPolicies).Namespace(ns).Create(ctx, tp, metav1.CreateOptions{})
	require.NoError(t, err)
	policies := shared.Local.ForResource(networkingv1alpha1.TrafficPolicies)
	shared.Start(ctx.Done())
	require.Eventually(t, policies.Informer().HasSynced, 30*time.Second, 50*time.Millisecond)
	listedPolicies, err := policies.Lister().List(labels.Everything())
	require.NoError(t, err)
	require.Len(t, listedPolicies, 1)
	require.IsType(t, &unstructured.Unstructured{}, listedPolicies[0], "a kind not cached typed is listed as cached")
	assert.Equal(t, "shift", listedPolicies[0].(*unstructured.Unstructured).GetName())

	// An update from the cached copy (DeepCopy: cached objects are
	// shared) keeps the apiserver's record of who owns what.
	fields, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cached.DeepCopy())
	require.NoError(t, err)
	next := &unstructured.Unstructured{Object: fields}
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
		return ok && obj.(*multiclusterv1alpha1.KubernetesCluster).GetLabels()["team"] == "b"
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
	typed := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	got, err = kubeinformers.StripManagedFields(typed)
	require.NoError(t, err)
	assert.Same(t, typed, got)
	assert.Nil(t, typed.ManagedFields, "a typed object (the token store's Secrets) is stripped too")
	assert.Equal(t, "s", typed.Name)
}

// The typed kinds' transform converts; an object that does not convert is
// kept as read (its readers fail on it instead of going without it), and
// other kinds and tombstones pass as before.
func TestTransformForTypedKinds(t *testing.T) {
	assert.True(t, kubeinformers.Typed(discoveryv1alpha1.Workloads))
	assert.True(t, kubeinformers.Typed(multiclusterv1alpha1.KubernetesClusters))
	assert.False(t, kubeinformers.Typed(networkingv1alpha1.VirtualMeshes))
	dest := func(spec any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "discovery.relaymesh.io/v1alpha1", "kind": "Destination",
			"metadata": map[string]any{"name": "d", "namespace": "ns",
				"managedFields": []any{map[string]any{"manager": "m"}}},
			"spec": spec,
		}}
	}
	tf := kubeinformers.TransformFor(discoveryv1alpha1.Destinations)
	got, err := tf(dest(map[string]any{"kubeService": map[string]any{"ref": map[string]any{"name": "svc", "namespace": "ns", "clusterName": "c1"}}}))
	require.NoError(t, err)
	require.IsType(t, &discoveryv1alpha1.Destination{}, got)
	d := got.(*discoveryv1alpha1.Destination)
	assert.Equal(t, "svc", d.Spec.KubeService.Ref.Name)
	assert.Empty(t, d.ManagedFields)

	// Endpoints with equal labels (pods of one Deployment) share one map.
	ep := func(ip, version string) any {
		return map[string]any{"ip": ip, "labels": map[string]any{"app": "a", "version": version}}
	}
	got, err = tf(dest(map[string]any{"kubeService": map[string]any{"ref": map[string]any{"name": "svc", "namespace": "ns", "clusterName": "c1"},
		"endpoints": []any{ep("10.0.0.1", "v1"), ep("10.0.0.2", "v2"), ep("10.0.0.3", "v1"), map[string]any{"ip": "10.0.0.4"}}}}))
	require.NoError(t, err)
	eps := got.(*discoveryv1alpha1.Destination).Spec.KubeService.Endpoints
	require.Len(t, eps, 4)
	assert.Equal(t, map[string]string{"app": "a", "version": "v1"}, eps[0].Labels)
	assert.Equal(t, map[string]string{"app": "a", "version": "v2"}, eps[1].Labels)
	assert.Equal(t, reflect.ValueOf(eps[0].Labels).UnsafePointer(), reflect.ValueOf(eps[2].Labels).UnsafePointer(), "one map for equal labels")
	assert.NotEqual(t, reflect.ValueOf(eps[0].Labels).UnsafePointer(), reflect.ValueOf(eps[1].Labels).UnsafePointer())
	assert.Nil(t, eps[3].Labels)

	bad := dest(map[string]any{"kubeService": "not an object"})
	got, err = tf(bad)
	require.NoError(t, err)
	assert.Same(t, bad, got, "an object that does not convert is kept as read")
	assert.Empty(t, bad.GetManagedFields(), "and without managedFields")

	tomb := cache.DeletedFinalStateUnknown{Key: "ns/d"}
	got, err = tf(tomb)
	require.NoError(t, err)
	assert.Equal(t, tomb, got)

	vm := &unstructured.Unstructured{Object: map[string]any{"kind": "VirtualMesh", "metadata": map[string]any{"name": "vm"}}}
	got, err = kubeinformers.TransformFor(networkingv1alpha1.VirtualMeshes)(vm)
	require.NoError(t, err)
	assert.Same(t, vm, got, "other kinds stay unstructured")
}
