// Package kubeinformers gives every component of one process the same
// informer per resource, so the process watches each resource once and
// holds each object once.
//
// The management server's components (the registration watch, the cluster
// status writer, the discovery mirror, translation, shared trust) each
// watched what they read through an informer factory of their own: four
// watches and four cached copies of every KubernetesCluster, three of
// every Mesh, two of every Workload and Destination (issue 31). A Factory
// made once per process and handed to each of them replaces those with one
// watch and one copy each. Its informers also drop metadata.managedFields
// as objects enter the cache: no component reads them, and they are a
// large part of every object the server writes (one entry per field
// manager, with the fields it owns).
//
// The kinds every agent adds (its KubernetesCluster, and the Mesh, Workload
// and Destination objects its snapshot becomes: one of each at the least,
// thousands for a large cluster) are cached typed, not as unstructured
// maps: a typed object is a fraction of the map's size, and translation,
// shared trust and the status writer read the cached object itself instead
// of converting it into a copy of their own (issue 31: the maps and the
// copies were about 40 % of an idle agent's live heap). An object that
// does not convert stays in the cache as read, so its readers report it as
// they did before (Typed). A Destination's endpoints with equal labels (the
// pods of one Deployment) share one label map (internal/sharedlabels).
//
// Objects in a shared cache are shared: a component MUST NOT modify one it
// got from an informer (DeepCopy first), as client-go already requires of
// any shared informer.
package kubeinformers

import (
	"fmt"
	"sync"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/sharedlabels"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// DefaultResync is how often a shared informer replays its cache to the
// handlers that did not ask for another period (AddEventHandlerWithResyncPeriod
// with 0 asks for none).
const DefaultResync = 10 * time.Minute

// Factory is a dynamic informer factory for one scope (a namespace, or the
// whole cluster) whose informers strip managedFields. Start starts every
// informer asked for so far that has not started; a component asks for
// its informers, adds its handlers and indexers, then calls Start and
// waits for its own informers to sync.
type Factory struct {
	dynamicinformer.DynamicSharedInformerFactory
	mu       sync.Mutex
	prepared map[schema.GroupVersionResource]bool
}

// NewNamespaced is a Factory of namespace's objects; namespace "" is every
// namespace.
func NewNamespaced(client dynamic.Interface, namespace string) *Factory {
	return &Factory{DynamicSharedInformerFactory: dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, DefaultResync, namespace, nil),
		prepared: map[schema.GroupVersionResource]bool{}}
}

// ForResource returns the one informer of gvr in this factory. Its
// Lister hands out the cached objects as they are: typed for the typed
// kinds (Typed), unstructured otherwise.
func (f *Factory) ForResource(gvr schema.GroupVersionResource) informers.GenericInformer {
	gi := f.DynamicSharedInformerFactory.ForResource(gvr)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.prepared[gvr] {
		f.prepared[gvr] = true
		// Fails only on a started informer, and none starts before its
		// first ForResource has returned.
		_ = gi.Informer().SetTransform(TransformFor(gvr))
	}
	return genericInformer{GenericInformer: gi, resource: gvr.GroupResource()}
}

// genericInformer is the dynamic factory's informer with a lister that
// reads whatever the cache holds: the dynamic lister casts every object to
// unstructured, and panicked on the typed kinds' caches.
type genericInformer struct {
	informers.GenericInformer
	resource schema.GroupResource
}

// Lister reads the informer's indexer as it is.
func (g genericInformer) Lister() cache.GenericLister {
	return cache.NewGenericLister(g.Informer().GetIndexer(), g.resource)
}

// Informer is ForResource(gvr).Informer().
func (f *Factory) Informer(gvr schema.GroupVersionResource) cache.SharedIndexInformer {
	return f.ForResource(gvr).Informer()
}

// typedKinds are the kinds cached typed, each with a constructor of its
// type. Adding one means auditing its readers: each must accept the typed
// object (and still the unstructured one, which did not convert), and
// none may change it (readers such as trust's listTyped hand out the
// cached object's maps and slices).
var typedKinds = map[schema.GroupVersionResource]func() runtime.Object{
	discoveryv1alpha1.Meshes:       func() runtime.Object { return new(discoveryv1alpha1.Mesh) },
	discoveryv1alpha1.Workloads:    func() runtime.Object { return new(discoveryv1alpha1.Workload) },
	discoveryv1alpha1.Destinations: func() runtime.Object { return new(discoveryv1alpha1.Destination) },
	multiclusterv1alpha1.KubernetesClusters: func() runtime.Object {
		return new(multiclusterv1alpha1.KubernetesCluster)
	},
}

// Typed reports whether the informers of gvr cache typed objects (a
// *discoveryv1alpha1.Mesh, not an *unstructured.Unstructured); readers of
// such a cache still accept an *unstructured.Unstructured, the object that
// did not convert, and report why it cannot be read.
func Typed(gvr schema.GroupVersionResource) bool {
	_, ok := typedKinds[gvr]
	return ok
}

// As is a cached object as a T: the object itself where the cache holds
// typed objects (Typed; shared, not to be modified), a conversion of an
// unstructured one (an error naming it if it does not convert), nil for
// anything else.
func As[T any](obj any) (*T, error) {
	switch o := obj.(type) {
	case *T:
		return o, nil
	case *unstructured.Unstructured:
		t := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, t); err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		return t, nil
	}
	return nil, nil
}

// TransformFor is the transform of gvr's informers: StripManagedFields,
// then, for the typed kinds, the conversion to their type (which keeps no
// managedFields either).
func TransformFor(gvr schema.GroupVersionResource) cache.TransformFunc {
	newTyped, typed := typedKinds[gvr]
	if !typed {
		return StripManagedFields
	}
	return func(obj any) (any, error) {
		obj, _ = StripManagedFields(obj)
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		t := newTyped()
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, t); err != nil {
			// Kept as read: dropping it would hide it from its readers,
			// which fail on an object they cannot read instead of
			// translating without it.
			return u, nil
		}
		if d, ok := t.(*discoveryv1alpha1.Destination); ok {
			shareEndpointLabels(d)
		}
		return t, nil
	}
}

// shareEndpointLabels makes d's endpoints with equal labels share one map:
// a Destination lists every ready pod behind its Service, and the pods of
// one Deployment carry the same labels (at 100,000 pods the cache held
// 200,000 such maps).
func shareEndpointLabels(d *discoveryv1alpha1.Destination) {
	var tab sharedlabels.Table
	for i := range d.Spec.KubeService.Endpoints {
		e := &d.Spec.KubeService.Endpoints[i]
		e.Labels = tab.Share(e.Labels)
	}
}

// StripManagedFields is the informers' transform: an object, unstructured
// or typed (a client-go informer's), enters the cache without
// metadata.managedFields. Other values (deletion tombstones) pass
// unchanged.
func StripManagedFields(obj any) (any, error) {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		if md, ok := o.Object["metadata"].(map[string]any); ok {
			delete(md, "managedFields")
		}
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// Shared are one process's two factories: the objects of its own
// namespace (what it registers and discovers) and those of every namespace
// (what users write).
type Shared struct {
	Local *Factory
	All   *Factory
}

// NewShared builds a process's factories.
func NewShared(client dynamic.Interface, namespace string) *Shared {
	return &Shared{Local: NewNamespaced(client, namespace), All: NewNamespaced(client, "")}
}

// OrNew returns s, or factories of client's own when s is nil (a component
// built alone, as in its tests).
func (s *Shared) OrNew(client dynamic.Interface, namespace string) *Shared {
	if s != nil {
		return s
	}
	return NewShared(client, namespace)
}

// Start starts, in both factories, every informer asked for that has not
// started; they stop when stop closes.
func (s *Shared) Start(stop <-chan struct{}) {
	s.Local.Start(stop)
	s.All.Start(stop)
}
