package dashboard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// Source is what the dashboard reads of the management cluster.
// Implementations MUST be safe for concurrent use and MUST return objects
// the caller may keep but not modify.
type Source interface {
	// Clusters are the registered KubernetesClusters.
	Clusters() ([]multiclusterv1alpha1.KubernetesCluster, error)
	// Input is the translation input: discovered objects and user intent.
	Input() (*translation.Input, error)
	// Version changes whenever what Input returns may have changed.
	Version() string
	// FederatedTrustDomains are the federation peers: the
	// FederatedTrustDomains of the server's namespace only (those of other
	// namespaces are never fetched). An error MUST leave the caller's other
	// reads working: the peers are one section of one page.
	FederatedTrustDomains() ([]networkingv1alpha1.FederatedTrustDomain, error)
}

var (
	gvrClusters     = multiclusterv1alpha1.KubernetesClusters
	gvrMeshes       = discoveryv1alpha1.Meshes
	gvrWorkloads    = discoveryv1alpha1.Workloads
	gvrDestinations = discoveryv1alpha1.Destinations
	gvrVirtualMesh  = networkingv1alpha1.VirtualMeshes
	gvrTraffic      = networkingv1alpha1.TrafficPolicies
	gvrAccess       = networkingv1alpha1.AccessPolicies
	gvrVirtualDests = networkingv1alpha1.VirtualDestinations
	gvrPeers        = networkingv1alpha1.FederatedTrustDomains
)

// KubeSource reads the management cluster through informers: the
// KubernetesClusters, discovered objects and FederatedTrustDomains of the
// server's namespace, the user objects of every namespace. Typed conversions are cached by
// resourceVersion, so a page load converts only what changed.
type KubeSource struct {
	informers map[schema.GroupVersionResource]cache.SharedIndexInformer

	mu    sync.Mutex
	typed map[schema.GroupVersionResource]map[string]typedObject
}

type typedObject struct {
	resourceVersion string
	obj             any
}

// StartKubeSource starts the informers and waits (at most timeout) until
// they synced, all but the FederatedTrustDomains': a chart upgrade does not
// install a new CRD, and a server without it must still serve every other
// view (FederatedTrustDomains says the watch has not synced). They stop
// with ctx.
func StartKubeSource(ctx context.Context, client dynamic.Interface, namespace string, timeout time.Duration) (*KubeSource, error) {
	s := &KubeSource{informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{}, typed: map[schema.GroupVersionResource]map[string]typedObject{}}
	local := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 10*time.Minute, namespace, nil)
	all := dynamicinformer.NewDynamicSharedInformerFactory(client, 10*time.Minute)
	for _, gvr := range []schema.GroupVersionResource{gvrClusters, gvrMeshes, gvrWorkloads, gvrDestinations, gvrPeers} {
		s.informers[gvr] = local.ForResource(gvr).Informer()
	}
	for _, gvr := range []schema.GroupVersionResource{gvrVirtualMesh, gvrTraffic, gvrAccess, gvrVirtualDests} {
		s.informers[gvr] = all.ForResource(gvr).Informer()
	}
	local.Start(ctx.Done())
	all.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for gvr, inf := range s.informers {
		if gvr == gvrPeers {
			continue
		}
		if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
			return nil, fmt.Errorf("dashboard: the watch of %s did not sync within %s", gvr.Resource, timeout)
		}
	}
	return s, nil
}

// Clusters implements Source.
func (s *KubeSource) Clusters() ([]multiclusterv1alpha1.KubernetesCluster, error) {
	var errs []error
	out := listTyped[multiclusterv1alpha1.KubernetesCluster](s, gvrClusters, &errs)
	return out, errors.Join(errs...)
}

// Input implements Source. An object that cannot be read is an error, not
// a skip: an access matrix without, say, a deny-by-default VirtualMesh
// would show access that does not exist.
func (s *KubeSource) Input() (*translation.Input, error) {
	var errs []error
	in := &translation.Input{
		Meshes:              listTyped[discoveryv1alpha1.Mesh](s, gvrMeshes, &errs),
		Workloads:           listTyped[discoveryv1alpha1.Workload](s, gvrWorkloads, &errs),
		Destinations:        listTyped[discoveryv1alpha1.Destination](s, gvrDestinations, &errs),
		VirtualMeshes:       listTyped[networkingv1alpha1.VirtualMesh](s, gvrVirtualMesh, &errs),
		TrafficPolicies:     listTyped[networkingv1alpha1.TrafficPolicy](s, gvrTraffic, &errs),
		AccessPolicies:      listTyped[networkingv1alpha1.AccessPolicy](s, gvrAccess, &errs),
		VirtualDestinations: listTyped[networkingv1alpha1.VirtualDestination](s, gvrVirtualDests, &errs),
		Clusters:            listTyped[multiclusterv1alpha1.KubernetesCluster](s, gvrClusters, &errs),
	}
	return in, errors.Join(errs...)
}

// errPeersNotSynced is FederatedTrustDomains' answer before its watch
// synced.
var errPeersNotSynced = errors.New("the watch of federatedtrustdomains has not synced (is the FederatedTrustDomain CRD installed?)")

// FederatedTrustDomains implements Source.
func (s *KubeSource) FederatedTrustDomains() ([]networkingv1alpha1.FederatedTrustDomain, error) {
	if !s.informers[gvrPeers].HasSynced() {
		return nil, errPeersNotSynced
	}
	var errs []error
	out := listTyped[networkingv1alpha1.FederatedTrustDomain](s, gvrPeers, &errs)
	return out, errors.Join(errs...)
}

// Version implements Source: a hash of every watched object's key and
// resourceVersion.
func (s *KubeSource) Version() string {
	h := sha256.New()
	for _, gvr := range []schema.GroupVersionResource{gvrMeshes, gvrWorkloads, gvrDestinations, gvrVirtualMesh, gvrTraffic, gvrAccess, gvrVirtualDests} {
		keys := s.informers[gvr].GetStore().ListKeys()
		sort.Strings(keys)
		fmt.Fprintf(h, "%s\x00", gvr.Resource)
		for _, k := range keys {
			obj, ok, _ := s.informers[gvr].GetStore().GetByKey(k)
			if u, isU := obj.(*unstructured.Unstructured); ok && isU {
				fmt.Fprintf(h, "%s\x00%s\x00", k, u.GetResourceVersion())
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// listTyped converts an informer's objects to T, reusing the conversion of
// objects whose resourceVersion did not change.
func listTyped[T any](s *KubeSource, gvr schema.GroupVersionResource, errs *[]error) []T {
	objs := s.informers[gvr].GetStore().List()
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.typed[gvr]
	next := make(map[string]typedObject, len(objs))
	out := make([]T, 0, len(objs))
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		key := u.GetNamespace() + "/" + u.GetName()
		if t, ok := prev[key]; ok && t.resourceVersion != "" && t.resourceVersion == u.GetResourceVersion() {
			if v, ok := t.obj.(T); ok {
				next[key] = t
				out = append(out, v)
				continue
			}
		}
		var t T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t); err != nil {
			*errs = append(*errs, fmt.Errorf("%s %s: %w", gvr.Resource, key, err))
			continue
		}
		next[key] = typedObject{resourceVersion: u.GetResourceVersion(), obj: t}
		out = append(out, t)
	}
	s.typed[gvr] = next
	return out
}

// StaticSource serves fixed objects: for tests, benchmarks and offline
// rendering.
type StaticSource struct {
	KubernetesClusters []multiclusterv1alpha1.KubernetesCluster
	In                 *translation.Input
	// Peers are what FederatedTrustDomains returns.
	Peers []networkingv1alpha1.FederatedTrustDomain
	// Rev is what Version returns.
	Rev string
}

// Clusters implements Source.
func (s *StaticSource) Clusters() ([]multiclusterv1alpha1.KubernetesCluster, error) {
	return s.KubernetesClusters, nil
}

// Input implements Source.
func (s *StaticSource) Input() (*translation.Input, error) {
	if s.In == nil {
		return &translation.Input{}, nil
	}
	return s.In, nil
}

// Version implements Source.
func (s *StaticSource) Version() string { return s.Rev }

// FederatedTrustDomains implements Source.
func (s *StaticSource) FederatedTrustDomains() ([]networkingv1alpha1.FederatedTrustDomain, error) {
	return s.Peers, nil
}

// Workloads lists discovered Workloads kept outside the apiserver
// (server.SharedSnapshots); Version changes whenever the list may have.
type Workloads interface {
	Workloads() []discoveryv1alpha1.Workload
	Version() string
}

// WithWorkloads is src with its Workloads read from w instead: an
// installation that keeps full snapshots in the replicas' shared store has
// no Workload objects in the apiserver.
func WithWorkloads(src Source, w Workloads) Source { return sharedWorkloads{Source: src, w: w} }

type sharedWorkloads struct {
	Source
	w Workloads
}

// Input implements Source.
func (s sharedWorkloads) Input() (*translation.Input, error) {
	in, err := s.Source.Input()
	if err != nil {
		return nil, err
	}
	out := *in
	out.Workloads = s.w.Workloads()
	return &out, nil
}

// Version implements Source.
func (s sharedWorkloads) Version() string { return s.Source.Version() + "/" + s.w.Version() }
