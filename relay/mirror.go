package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
)

// Labels and annotations on discovered objects in the management cluster.
const (
	// LabelCluster is the cluster a discovered object came from.
	LabelCluster      = discoveryv1alpha1.LabelCluster
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	annotationSpecSum = "relaymesh.io/spec-sha256"
	mirrorManager     = "relaymesh-server"
)

// Discovered kinds.
var (
	MeshesResource       = discoveryv1alpha1.GroupVersion.WithResource("meshes")
	WorkloadsResource    = discoveryv1alpha1.GroupVersion.WithResource("workloads")
	DestinationsResource = discoveryv1alpha1.GroupVersion.WithResource("destinations")
)

// Mirror writes each cluster's accepted snapshot as Mesh, Workload and
// Destination objects in the management cluster, in one namespace, labelled
// with the cluster: it creates and updates what changed (by a hash of the
// spec kept in an annotation) and deletes what disappeared. One worker per
// cluster applies the latest snapshot; intermediate ones are skipped.
type Mirror struct {
	client    dynamic.Interface
	namespace string
	view      *View
	log       *slog.Logger

	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{}
}

// NewMirror returns a mirror of view; call Run.
func NewMirror(client dynamic.Interface, namespace string, view *View, log *slog.Logger) *Mirror {
	m := &Mirror{client: client, namespace: namespace, view: view, log: log.With("component", "discovery-mirror"),
		pending: map[string]bool{}, wake: make(chan struct{}, 1)}
	view.OnSnapshot(m.enqueue)
	return m
}

func (m *Mirror) enqueue(cluster string) {
	m.mu.Lock()
	m.pending[cluster] = true
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run syncs pending clusters until ctx ends; a failed sync is retried.
func (m *Mirror) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-time.After(10 * time.Second): // retry failures
		}
		m.mu.Lock()
		clusters := make([]string, 0, len(m.pending))
		for c := range m.pending {
			clusters = append(clusters, c)
		}
		m.pending = map[string]bool{}
		m.mu.Unlock()
		sort.Strings(clusters)
		for _, c := range clusters {
			if err := m.sync(ctx, c); err != nil {
				m.log.Warn("could not write discovered objects; will retry", "cluster", c, "error", err)
				m.mu.Lock()
				m.pending[c] = true
				m.mu.Unlock()
			}
		}
	}
}

// sync makes the discovered objects of cluster match its snapshot (none if
// the cluster left the view).
func (m *Mirror) sync(ctx context.Context, cluster string) error {
	desired := map[schema.GroupVersionResource]map[string]*unstructured.Unstructured{
		MeshesResource: {}, WorkloadsResource: {}, DestinationsResource: {},
	}
	if snap := m.view.Snapshot(cluster); snap != nil {
		objs, err := DiscoveredObjects(snap, m.namespace)
		if err != nil {
			return err
		}
		for _, o := range objs {
			desired[o.Resource][o.Object.GetName()] = o.Object
		}
	}
	start := time.Now()
	var created, updated, deleted int
	var errs []error
	for gvr, want := range desired {
		ri := m.client.Resource(gvr).Namespace(m.namespace)
		list, err := ri.List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list %s: %w", gvr.Resource, err)
		}
		have := map[string]*unstructured.Unstructured{}
		others := map[string]*unstructured.Unstructured{} // objects of other clusters (or hand-made), by name
		for i := range list.Items {
			o := &list.Items[i]
			if c := o.GetLabels()[LabelCluster]; c == cluster {
				have[o.GetName()] = o
			} else {
				others[o.GetName()] = o
			}
		}
		for name, obj := range want {
			if cur := others[name]; cur != nil || (have[name] != nil && !sameOrigin(have[name], obj)) {
				if cur == nil {
					cur = have[name]
				}
				// Names are a hash of the exact origin, so only a hash
				// collision or a hand-made object gets here: never take
				// over an object of another origin.
				m.log.Error("a discovered object of another origin has this name; not written", "cluster", cluster, "kind", gvr.Resource, "name", name,
					"owner_cluster", cur.GetLabels()[LabelCluster], "owner_namespace", cur.GetLabels()[discoveryv1alpha1.LabelNamespace])
				errs = append(errs, fmt.Errorf("%s %s: the name belongs to an object of another origin", gvr.Resource, name))
				continue
			}
			if cur, ok := have[name]; ok && cur.GetAnnotations()[annotationSpecSum] == obj.GetAnnotations()[annotationSpecSum] {
				continue
			}
			body, err := obj.MarshalJSON()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if _, err := ri.Patch(ctx, name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: mirrorManager, Force: new(true)}); err != nil {
				errs = append(errs, fmt.Errorf("apply %s %s: %w", gvr.Resource, name, err))
				continue
			}
			if _, ok := have[name]; ok {
				updated++
			} else {
				created++
			}
		}
		for name, cur := range have {
			if _, ok := want[name]; ok {
				continue
			}
			uid := cur.GetUID()
			err := ri.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete %s %s: %w", gvr.Resource, name, err))
				continue
			}
			deleted++
		}
	}
	if created+updated+deleted > 0 {
		m.log.Info("discovered objects written", "cluster", cluster, "created", created, "updated", updated, "deleted", deleted, "took", time.Since(start).Round(time.Millisecond))
	}
	// One bad object does not hold up the others; the failures are retried.
	return errors.Join(errs...)
}

// CollectOrphans deletes discovered objects of clusters that are not
// registered (deregistered while the server was down, or a mode that is no
// longer managed). Call it once at start, after the registries synced.
func (m *Mirror) CollectOrphans(ctx context.Context, registered func(cluster string) bool) error {
	var errs []error
	for _, gvr := range []schema.GroupVersionResource{MeshesResource, WorkloadsResource, DestinationsResource} {
		ri := m.client.Resource(gvr).Namespace(m.namespace)
		list, err := ri.List(ctx, metav1.ListOptions{LabelSelector: LabelCluster})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, o := range list.Items {
			if c := o.GetLabels()[LabelCluster]; !registered(c) {
				uid := o.GetUID()
				if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
					errs = append(errs, err)
					continue
				}
				m.log.Info("deleted a discovered object of an unregistered cluster", "cluster", c, "kind", gvr.Resource, "name", o.GetName())
			}
		}
	}
	return errors.Join(errs...)
}

// sameOrigin reports whether cur, found under want's name, came from the
// same cluster and namespace (its labels).
func sameOrigin(cur, want *unstructured.Unstructured) bool {
	for _, k := range []string{LabelCluster, discoveryv1alpha1.LabelNamespace} {
		if cur.GetLabels()[k] != want.GetLabels()[k] {
			return false
		}
	}
	return true
}

// DiscoveredObject is a Mesh, Workload or Destination object to write.
type DiscoveredObject struct {
	Resource schema.GroupVersionResource
	Object   *unstructured.Unstructured
}

// DiscoveredObjects turns a snapshot into the Mesh, Workload and Destination
// objects of the management cluster (a pure function). Each is named by
// discoveryv1alpha1.Name from exactly where it came from, and labelled with
// it.
func DiscoveredObjects(snap *relaypb.Snapshot, namespace string) ([]DiscoveredObject, error) {
	cluster := snap.GetCluster()
	var out []DiscoveredObject
	add := func(gvr schema.GroupVersionResource, kind, origin, objNamespace, objName string, spec any) error {
		specJSON, err := json.Marshal(spec)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(specJSON)
		var specMap map[string]any
		if err := json.Unmarshal(specJSON, &specMap); err != nil {
			return err
		}
		u := &unstructured.Unstructured{Object: map[string]any{"spec": specMap}}
		u.SetAPIVersion(discoveryv1alpha1.GroupVersion.String())
		u.SetKind(kind)
		u.SetName(discoveryv1alpha1.Name(origin, cluster, objNamespace, objName))
		u.SetNamespace(namespace)
		labels := map[string]string{LabelCluster: cluster, discoveryv1alpha1.LabelNamespace: objNamespace, LabelManagedBy: "relaymesh"}
		if len(validation.IsValidLabelValue(objName)) == 0 {
			labels[discoveryv1alpha1.LabelName] = objName
		}
		u.SetLabels(labels)
		u.SetAnnotations(map[string]string{annotationSpecSum: hex.EncodeToString(sum[:])})
		out = append(out, DiscoveredObject{Resource: gvr, Object: u})
		return nil
	}
	for _, m := range snap.GetMeshes() {
		spec := discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
			Installation: discoveryv1alpha1.MeshInstallation{Name: m.GetName(), Namespace: m.GetNamespace(), Cluster: cluster, Revision: m.GetRevision(), Version: m.GetVersion(), PodLabels: m.GetPodLabels()},
			TrustDomain:  m.GetTrustDomain(), IstiodServiceAccount: m.GetIstiodServiceAccount(), SmartDNSProxying: m.GetSmartDnsProxying(),
		}}
		for _, g := range m.GetGateways() {
			spec.Istio.Gateways = append(spec.Istio.Gateways, discoveryv1alpha1.GatewayInfo{Name: g.GetName(), Namespace: g.GetNamespace(), Kind: g.GetKind(),
				WorkloadLabels: g.GetWorkloadLabels(), ExternalAddress: g.GetExternalAddress(), TLSPort: g.GetTlsPort()})
		}
		if err := add(MeshesResource, "Mesh", discoveryv1alpha1.OriginMesh, m.GetNamespace(), m.GetName(), spec); err != nil {
			return nil, err
		}
	}
	meshRef := func(name, ns string) common.ObjectRef {
		return common.ObjectRef{Name: MeshObjectName(cluster, ns, name), Namespace: namespace}
	}
	for _, w := range snap.GetWorkloads() {
		spec := discoveryv1alpha1.WorkloadSpec{
			Kubernetes: discoveryv1alpha1.KubernetesWorkload{Controller: common.ClusterObjectRef{Name: w.GetName(), Namespace: w.GetNamespace(), ClusterName: cluster},
				Kind: w.GetKind(), PodLabels: w.GetPodLabels(), ServiceAccountName: w.GetServiceAccount()},
			Mesh: meshRef(w.GetMeshName(), w.GetMeshNamespace()),
		}
		if err := add(WorkloadsResource, "Workload", w.GetKind(), w.GetNamespace(), w.GetName(), spec); err != nil {
			return nil, err
		}
	}
	for _, d := range snap.GetDestinations() {
		ks := discoveryv1alpha1.KubeService{Ref: common.ClusterObjectRef{Name: d.GetName(), Namespace: d.GetNamespace(), ClusterName: cluster},
			WorkloadSelectorLabels: d.GetSelector(), Labels: d.GetLabels(), ServiceType: d.GetServiceType(), ExternalAddresses: d.GetExternalAddresses()}
		for _, p := range d.GetPorts() {
			ks.Ports = append(ks.Ports, discoveryv1alpha1.ServicePort{Port: p.GetPort(), Name: p.GetName(), Protocol: p.GetProtocol(), AppProtocol: p.GetAppProtocol(), TargetPort: p.GetTargetPort()})
		}
		for _, e := range d.GetEndpoints() {
			ks.Endpoints = append(ks.Endpoints, discoveryv1alpha1.Endpoint{IP: e.GetIp(), Labels: e.GetLabels()})
		}
		if len(d.GetSubsets()) > 0 {
			ks.Subsets = map[string][]string{}
			for k, v := range d.GetSubsets() {
				ks.Subsets[k] = v.GetValues()
			}
		}
		spec := discoveryv1alpha1.DestinationSpec{KubeService: ks, Mesh: meshRef(d.GetMeshName(), d.GetMeshNamespace())}
		if err := add(DestinationsResource, "Destination", discoveryv1alpha1.OriginService, d.GetNamespace(), d.GetName(), spec); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// MeshObjectName is the name of the Mesh object of the istiod name in
// namespace of cluster.
func MeshObjectName(cluster, namespace, name string) string {
	return discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, cluster, namespace, name)
}
