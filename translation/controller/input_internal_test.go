package controller

import (
	"sync/atomic"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// A kind whose cache did not change since the last translation is not
// read again: its watch's handler says when it changed, before it kicks
// the translation. A status write of a specOnly kind is no change; of the
// other kinds it is (their status is handed over); an unreadable object
// is read again every time until it is fixed.
func TestUnchangedKindsAreNotReadAgain(t *testing.T) {
	kicks := 0
	c, handlers := watchedController(func() { kicks++ })
	// update stores o and calls gvr's handler as the watch would (store first).
	update := func(gvr schema.GroupVersionResource, old, o *unstructured.Unstructured) {
		store := c.informers[gvr].GetStore()
		if old == nil {
			require.NoError(t, store.Add(o))
			handlers[gvr].OnAdd(o, false)
			return
		}
		require.NoError(t, store.Update(o))
		handlers[gvr].OnUpdate(old, o)
	}
	obj := func(kind, name, rv string, generation int64, spec, status map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "x/v1alpha1", "kind": kind,
			"metadata": map[string]any{"name": name, "namespace": "relaymesh", "uid": "u-" + name, "resourceVersion": rv, "generation": generation},
			"spec":     spec, "status": status,
		}}
	}
	kc1 := obj("KubernetesCluster", "c1", "1", 1, map[string]any{"mode": "relay"}, map[string]any{"connected": false})
	tp1 := obj("TrafficPolicy", "tp", "2", 1, map[string]any{"policy": map[string]any{"requestTimeout": "5s"}}, nil)
	update(gvrCluster, nil, kc1)
	update(gvrTraffic, nil, tp1)
	in, err := c.Input()
	require.NoError(t, err)
	require.Len(t, in.TrafficPolicies, 1)
	clusters := in.Clusters

	// Nothing changed: the same lists, not a new reading of the caches.
	in, err = c.Input()
	require.NoError(t, err)
	assert.Same(t, &clusters[0], &in.Clusters[0], "an unchanged kind's list is the last one")

	// A cluster's status write: no change for translation, no kick.
	k := kicks
	kc2 := obj("KubernetesCluster", "c1", "3", 1, map[string]any{"mode": "relay"}, map[string]any{"connected": true})
	update(gvrCluster, kc1, kc2)
	assert.Equal(t, k, kicks)
	in, err = c.Input()
	require.NoError(t, err)
	assert.Same(t, &clusters[0], &in.Clusters[0])

	// A policy's status write is read (its status is handed over) but
	// kicks nothing; its edit is read and kicks.
	tp2 := obj("TrafficPolicy", "tp", "4", 1, map[string]any{"policy": map[string]any{"requestTimeout": "5s"}}, map[string]any{"observedGeneration": int64(1)})
	update(gvrTraffic, tp1, tp2)
	assert.Equal(t, k, kicks)
	in, err = c.Input()
	require.NoError(t, err)
	assert.Equal(t, int64(1), in.TrafficPolicies[0].Status.ObservedGeneration)
	tp3 := obj("TrafficPolicy", "tp", "5", 2, map[string]any{"policy": map[string]any{"requestTimeout": "7s"}}, nil)
	update(gvrTraffic, tp2, tp3)
	assert.Equal(t, k+1, kicks)
	in, err = c.Input()
	require.NoError(t, err)
	assert.Equal(t, 7*time.Second, in.TrafficPolicies[0].Spec.Policy.RequestTimeout.Duration)

	// A cluster's spec change is read.
	kc3 := obj("KubernetesCluster", "c1", "6", 2, map[string]any{"mode": "relay", "trustDomains": []any{map[string]any{"name": "b.example"}}}, nil)
	update(gvrCluster, kc2, kc3)
	in, err = c.Input()
	require.NoError(t, err)
	require.Len(t, in.Clusters[0].Spec.TrustDomains, 1)

	// An unreadable VirtualMesh fails every translation until it is fixed.
	bad := obj("VirtualMesh", "vm", "7", 1, map[string]any{"meshes": "not-a-list", "globalAccessPolicy": "Enabled"}, nil)
	update(gvrVirtualMesh, nil, bad)
	for range 2 {
		_, err = c.Input()
		require.Error(t, err)
	}
	good := obj("VirtualMesh", "vm", "8", 2, map[string]any{"globalAccessPolicy": "Enabled"}, nil)
	update(gvrVirtualMesh, bad, good)
	in, err = c.Input()
	require.NoError(t, err)
	require.Len(t, in.VirtualMeshes, 1)
}

// With typed caches (kubeinformers.Typed) translation reads the cached
// objects themselves: no conversion, no copy of its own, and the cached
// object is not changed by the status it does not hand over. A status
// write of a typed KubernetesCluster kicks nothing; a spec change or a
// change of labels of a typed Destination kicks; a resync (the same object
// again) kicks nothing.
func TestTypedCachesAreReadInPlace(t *testing.T) {
	kicks := 0
	c, handlers := watchedController(func() { kicks++ })
	kc := func(rv string, connected bool) *multiclusterv1alpha1.KubernetesCluster {
		return &multiclusterv1alpha1.KubernetesCluster{
			ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "relaymesh", UID: "u1", ResourceVersion: rv, Generation: 1},
			Spec:       multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay},
			Status:     multiclusterv1alpha1.KubernetesClusterStatus{Connected: connected},
		}
	}
	dest := func(rv string, generation int64, service string) *discoveryv1alpha1.Destination {
		d := &discoveryv1alpha1.Destination{ObjectMeta: metav1.ObjectMeta{Name: "d1", Namespace: "relaymesh", UID: "u2", ResourceVersion: rv, Generation: generation}}
		d.Spec.KubeService.Ref = common.ClusterObjectRef{ClusterName: "c1", Namespace: "default", Name: service}
		return d
	}
	kc1, d1 := kc("1", true), dest("2", 1, "reviews")
	require.NoError(t, c.informers[gvrCluster].GetStore().Add(kc1))
	handlers[gvrCluster].OnAdd(kc1, false)
	require.NoError(t, c.informers[gvrDestination].GetStore().Add(d1))
	handlers[gvrDestination].OnAdd(d1, false)
	in, err := c.Input()
	require.NoError(t, err)
	require.Len(t, in.Clusters, 1)
	require.Len(t, in.Destinations, 1)
	assert.False(t, in.Clusters[0].Status.Connected, "no status is handed over")
	assert.True(t, kc1.Status.Connected, "the cached object keeps its status")
	assert.Equal(t, "reviews", in.Destinations[0].Spec.KubeService.Ref.Name)
	assert.Empty(t, c.typed[gvrDestination], "no converted copy is kept")

	k := kicks
	kc2 := kc("3", false)
	require.NoError(t, c.informers[gvrCluster].GetStore().Update(kc2))
	handlers[gvrCluster].OnUpdate(kc1, kc2)
	handlers[gvrDestination].OnUpdate(d1, d1)
	assert.Equal(t, k, kicks, "a status write and a resync kick nothing")

	d2 := dest("4", 2, "ratings")
	require.NoError(t, c.informers[gvrDestination].GetStore().Update(d2))
	handlers[gvrDestination].OnUpdate(d1, d2)
	assert.Equal(t, k+1, kicks, "a spec change kicks")
	labelled := dest("5", 2, "ratings")
	labelled.Labels = map[string]string{"relaymesh.io/allow-all": "true"}
	handlers[gvrDestination].OnUpdate(d2, labelled)
	assert.Equal(t, k+2, kicks, "a change of labels alone kicks (admission reads them)")
	require.NoError(t, c.informers[gvrDestination].GetStore().Update(d2))
	in, err = c.Input()
	require.NoError(t, err)
	assert.Equal(t, "ratings", in.Destinations[0].Spec.KubeService.Ref.Name)
}

func TestSameSpec(t *testing.T) {
	d := func(name string) *discoveryv1alpha1.Destination {
		x := &discoveryv1alpha1.Destination{}
		x.Spec.KubeService.Ref.Name = name
		return x
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"a": "b"}}}
	assert.True(t, sameSpec(d("x"), d("x")))
	assert.False(t, sameSpec(d("x"), d("y")))
	assert.False(t, sameSpec(d("x"), u), "a typed and an unstructured version are a change")
	assert.False(t, sameSpec(u, d("x")))
	assert.True(t, sameSpec(u, u.DeepCopy()))
	assert.False(t, sameSpec(d("x"), &discoveryv1alpha1.Mesh{}), "different types are a change")
	assert.False(t, sameSpec(&metav1.ObjectMeta{}, &metav1.ObjectMeta{}), "no spec is a change")
	assert.False(t, sameSpec(nil, nil), "nothing is a change")
}

// watchedController is a controller over empty stores of every kind it
// reads, with each kind's watch handler (kick counts the kicks).
func watchedController(kick func()) (*Controller, map[schema.GroupVersionResource]cache.ResourceEventHandlerFuncs) {
	c := &Controller{informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{}, typed: map[schema.GroupVersionResource]map[string]typedObject{},
		changed: map[schema.GroupVersionResource]*atomic.Bool{}, lists: map[schema.GroupVersionResource]any{}}
	handlers := map[schema.GroupVersionResource]cache.ResourceEventHandlerFuncs{}
	for _, gvr := range []schema.GroupVersionResource{gvrMesh, gvrWorkload, gvrDestination, gvrVirtualMesh, gvrTraffic, gvrAccess, gvrVirtualDest, gvrCluster} {
		c.informers[gvr] = cache.NewSharedIndexInformer(&cache.ListWatch{}, &unstructured.Unstructured{}, 0, cache.Indexers{})
		handlers[gvr] = c.watchHandler(gvr, kick)
	}
	return c, handlers
}
