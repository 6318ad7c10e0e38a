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
// Objects in a shared cache are shared: a component MUST NOT modify one it
// got from an informer (DeepCopy first), as client-go already requires of
// any shared informer.
package kubeinformers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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

// ForResource returns the one informer of gvr in this factory.
func (f *Factory) ForResource(gvr schema.GroupVersionResource) informers.GenericInformer {
	gi := f.DynamicSharedInformerFactory.ForResource(gvr)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.prepared[gvr] {
		f.prepared[gvr] = true
		// Fails only on a started informer, and none starts before its
		// first ForResource has returned.
		_ = gi.Informer().SetTransform(StripManagedFields)
	}
	return gi
}

// Informer is ForResource(gvr).Informer().
func (f *Factory) Informer(gvr schema.GroupVersionResource) cache.SharedIndexInformer {
	return f.ForResource(gvr).Informer()
}

// StripManagedFields is the informers' transform: an object enters the
// cache without metadata.managedFields. Other values (deletion tombstones)
// pass unchanged.
func StripManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		if md, ok := u.Object["metadata"].(map[string]any); ok {
			delete(md, "managedFields")
		}
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
