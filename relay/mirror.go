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
	"strings"
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
	"k8s.io/client-go/dynamic"
)

// Labels and annotations on discovered objects in the management cluster.
const (
	LabelCluster      = "relaymesh.io/cluster"
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

// WorkloadName is a Workload's discovered name: `<name>-<namespace>-<cluster>`
// for Deployments, with `-statefulset` or `-daemonset` appended for the
// other kinds so that controllers of different kinds never collide.
func WorkloadName(w *relaypb.Workload) string {
	n := DiscoveredName(w.GetName(), w.GetNamespace(), w.GetCluster())
	if k := strings.ToLower(w.GetKind()); k != "deployment" {
		n += "-" + k
	}
	return n
}

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
			desired[o.gvr][o.obj.GetName()] = o.obj
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
		others := map[string]string{} // name -> the other cluster that owns it
		for i := range list.Items {
			o := &list.Items[i]
			if c := o.GetLabels()[LabelCluster]; c == cluster {
				have[o.GetName()] = o
			} else {
				others[o.GetName()] = c
			}
		}
		for name, obj := range want {
			if owner, taken := others[name]; taken {
				// Never take over another cluster's object: names are
				// `<name>-<namespace>-<cluster>` and can collide.
				m.log.Warn("discovered name already used by another cluster; not written", "cluster", cluster, "kind", gvr.Resource, "name", name, "owner", owner)
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

type discoveredObject struct {
	gvr schema.GroupVersionResource
	obj *unstructured.Unstructured
}

// DiscoveredObjects turns a snapshot into the Mesh, Workload and Destination
// objects of the management cluster (a pure function).
func DiscoveredObjects(snap *relaypb.Snapshot, namespace string) ([]discoveredObject, error) {
	cluster := snap.GetCluster()
	var out []discoveredObject
	add := func(gvr schema.GroupVersionResource, kind, name string, spec any) error {
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
		u.SetName(name)
		u.SetNamespace(namespace)
		u.SetLabels(map[string]string{LabelCluster: cluster, LabelManagedBy: "relaymesh"})
		u.SetAnnotations(map[string]string{annotationSpecSum: hex.EncodeToString(sum[:])})
		out = append(out, discoveredObject{gvr: gvr, obj: u})
		return nil
	}
	for _, m := range snap.GetMeshes() {
		spec := discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
			Installation: discoveryv1alpha1.MeshInstallation{Namespace: m.GetNamespace(), Cluster: cluster, Revision: m.GetRevision(), Version: m.GetVersion(), PodLabels: m.GetPodLabels()},
			TrustDomain:  m.GetTrustDomain(), IstiodServiceAccount: m.GetIstiodServiceAccount(), SmartDNSProxying: m.GetSmartDnsProxying(),
		}}
		for _, g := range m.GetGateways() {
			spec.Istio.Gateways = append(spec.Istio.Gateways, discoveryv1alpha1.GatewayInfo{Name: g.GetName(), Namespace: g.GetNamespace(), Kind: g.GetKind(),
				WorkloadLabels: g.GetWorkloadLabels(), ExternalAddress: g.GetExternalAddress(), TLSPort: g.GetTlsPort()})
		}
		if err := add(MeshesResource, "Mesh", DiscoveredName(m.GetName(), m.GetNamespace(), cluster), spec); err != nil {
			return nil, err
		}
	}
	meshRef := func(name, ns string) common.ObjectRef {
		return common.ObjectRef{Name: DiscoveredName(name, ns, cluster), Namespace: namespace}
	}
	for _, w := range snap.GetWorkloads() {
		spec := discoveryv1alpha1.WorkloadSpec{
			Kubernetes: discoveryv1alpha1.KubernetesWorkload{Controller: common.ClusterObjectRef{Name: w.GetName(), Namespace: w.GetNamespace(), ClusterName: cluster},
				Kind: w.GetKind(), PodLabels: w.GetPodLabels(), ServiceAccountName: w.GetServiceAccount()},
			Mesh: meshRef(w.GetMeshName(), w.GetMeshNamespace()),
		}
		if err := add(WorkloadsResource, "Workload", WorkloadName(w), spec); err != nil {
			return nil, err
		}
	}
	for _, d := range snap.GetDestinations() {
		ks := discoveryv1alpha1.KubeService{Ref: common.ClusterObjectRef{Name: d.GetName(), Namespace: d.GetNamespace(), ClusterName: cluster},
			WorkloadSelectorLabels: d.GetSelector(), Labels: d.GetLabels(), ServiceType: d.GetServiceType(), ExternalAddresses: d.GetExternalAddresses()}
		for _, p := range d.GetPorts() {
			ks.Ports = append(ks.Ports, discoveryv1alpha1.ServicePort{Port: p.GetPort(), Name: p.GetName(), Protocol: p.GetProtocol(), AppProtocol: p.GetAppProtocol(), TargetPort: p.GetTargetPort()})
		}
		if len(d.GetSubsets()) > 0 {
			ks.Subsets = map[string][]string{}
			for k, v := range d.GetSubsets() {
				ks.Subsets[k] = v.GetValues()
			}
		}
		spec := discoveryv1alpha1.DestinationSpec{KubeService: ks, Mesh: meshRef(d.GetMeshName(), d.GetMeshNamespace())}
		if err := add(DestinationsResource, "Destination", DiscoveredName(d.GetName(), d.GetNamespace(), cluster), spec); err != nil {
			return nil, err
		}
	}
	return out, nil
}
