// Package controller runs translation in the server: it watches the
// discovered objects and the user's intent in the management cluster,
// translates the whole view (federation, access and traffic policy) after
// every change (debounced), publishes each cluster's Istio objects to the
// relay's outputs, and writes every user object's status.
//
// Translation is incremental (Engine): a change recomputes the units whose
// inputs changed and republishes only the clusters whose objects changed.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	"github.com/relaymesh/relaymesh/internal/pace"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/translation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// Publisher receives each cluster's translated objects.
type Publisher interface {
	SetFrom(source, cluster string, objects []*relaypb.OutputObject)
	// Version is the version of cluster's current output set.
	Version(cluster string) uint64
}

// batchPublisher is a Publisher that can tell whoever follows its sets
// about a translation's sets at once (server.Outputs).
type batchPublisher interface {
	Batch(f func())
}

// Acks tells which output set each cluster's agent applied last, and with
// what result per object (server.View).
type Acks interface {
	Ack(cluster string) *relaypb.PullAck
	OnAck(func(cluster string))
}

// WorkloadSource lists the discovered Workloads when they are not kept in
// the apiserver (server.SharedSnapshots: full snapshots in the replicas'
// shared store). Workloads MUST return every registered cluster's Workloads
// as last known, never a partial list while the store is unreachable;
// OnChange's function MUST be called after every change.
type WorkloadSource interface {
	Workloads() []discoveryv1alpha1.Workload
	OnChange(func())
}

// Source is the name under which translation publishes outputs.
const Source = "translation"

var (
	gvrMesh        = discoveryv1alpha1.Meshes
	gvrWorkload    = discoveryv1alpha1.Workloads
	gvrDestination = discoveryv1alpha1.Destinations
	gvrVirtualMesh = networkingv1alpha1.VirtualMeshes
	gvrTraffic     = networkingv1alpha1.TrafficPolicies
	gvrAccess      = networkingv1alpha1.AccessPolicies
	gvrVirtualDest = networkingv1alpha1.VirtualDestinations
	// gvrCluster: the registry, whose grants say which trust domains each
	// cluster's meshes may use.
	gvrCluster = multiclusterv1alpha1.KubernetesClusters
)

// userKinds maps the user kinds translation reports on to their resources.
var userKinds = map[string]schema.GroupVersionResource{
	"VirtualMesh": gvrVirtualMesh, "TrafficPolicy": gvrTraffic, "AccessPolicy": gvrAccess, "VirtualDestination": gvrVirtualDest,
}

// Controller translates and publishes.
type Controller struct {
	client    dynamic.Interface
	namespace string
	out       Publisher
	clusters  func() []string
	log       *slog.Logger

	informers map[schema.GroupVersionResource]cache.SharedIndexInformer
	// changed says, per kind, whether its cache changed since list last
	// read it (set by the watch's handler before it kicks a translation);
	// a kind without one is read every time.
	changed map[schema.GroupVersionResource]*atomic.Bool
	wake    chan struct{}
	// acked wakes a status refresh only: an ack changes status.clusters,
	// never what translation computes.
	acked chan struct{}

	// Owned by the translating goroutine.
	report    *translation.Report // the last translation's, with admission's refusals
	engine    *Engine
	typed     map[schema.GroupVersionResource]map[string]typedObject
	lists     map[schema.GroupVersionResource]any // list's last result per kind, while unchanged
	published map[string]bool                     // clusters that have a published set
	status    *statusWriter
	acks      Acks
	admission Admitter
	admitted  map[string]admitted
	versions  map[string]uint64                          // cluster → output version that carries translation's current objects
	parentsIn map[string]map[translation.Parent][]string // cluster → parent → sorted keys of its objects there
	leading   func() bool
	led       bool // led when statuses were last set
	workloads WorkloadSource
}

// typedObject is a cached conversion of an informer object.
type typedObject struct {
	resourceVersion string
	obj             any
}

// Config configures a Controller.
type Config struct {
	Client dynamic.Interface
	// Namespace holds discovered objects; user objects are read from every
	// namespace.
	Namespace string
	Outputs   Publisher
	// Clusters lists the registered clusters: each gets a (possibly empty)
	// set, so translation can also remove everything from a cluster.
	Clusters func() []string
	// Acks, when set, puts each user object's per-cluster apply results in
	// its status (status.clusters).
	Acks Acks
	// Admission, when set, judges every user object before translation; a
	// refused one is Invalid with the rule's message and never translated.
	Admission Admitter
	Logger    *slog.Logger
	// Leading reports whether this replica holds the server's Lease
	// (lease.Elector.Leading); nil: always (one replica). Every replica
	// translates and publishes; only the leader writes statuses. Call Kick
	// when it changes: a new leader writes every status that differs from
	// what it wants, including changes made while it followed.
	Leading func() bool
	// Workloads, when set, is where the discovered Workloads are read
	// instead of Workload objects (which are then not watched).
	Workloads WorkloadSource
	// Informers, when set, are the process's shared informers
	// (kubeinformers.Shared): each resource watched and cached once for
	// the whole server. Nil: the controller watches on its own.
	Informers *kubeinformers.Shared
}

// Start watches, translates once synced, and keeps translating after every
// change until ctx ends. It returns once the first translation is published.
func Start(ctx context.Context, cfg Config) (*Controller, error) {
	c := &Controller{client: cfg.Client, namespace: cfg.Namespace, out: cfg.Outputs, clusters: cfg.Clusters,
		log: cfg.Logger.With("component", "translation"), informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{},
		wake: make(chan struct{}, 1), acked: make(chan struct{}, 1), engine: NewEngine(cfg.Namespace), typed: map[schema.GroupVersionResource]map[string]typedObject{},
		changed: map[schema.GroupVersionResource]*atomic.Bool{}, lists: map[schema.GroupVersionResource]any{},
		published: map[string]bool{},
		acks:      cfg.Acks, admission: cfg.Admission, admitted: map[string]admitted{}, versions: map[string]uint64{}, parentsIn: map[string]map[translation.Parent][]string{},
		leading: cfg.Leading, workloads: cfg.Workloads}
	if c.leading == nil {
		c.leading = func() bool { return true }
	}
	shared := cfg.Informers.OrNew(cfg.Client, cfg.Namespace)
	discovered, users := shared.Local, shared.All
	kick := func() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	discoveredKinds := []schema.GroupVersionResource{gvrMesh, gvrWorkload, gvrDestination, gvrCluster}
	if c.workloads != nil {
		discoveredKinds = []schema.GroupVersionResource{gvrMesh, gvrDestination, gvrCluster}
		c.workloads.OnChange(kick)
	}
	for _, gvr := range discoveredKinds {
		c.informers[gvr] = discovered.ForResource(gvr).Informer()
	}
	for _, gvr := range []schema.GroupVersionResource{gvrVirtualMesh, gvrTraffic, gvrAccess, gvrVirtualDest} {
		c.informers[gvr] = users.ForResource(gvr).Informer()
	}
	if c.admission != nil {
		// Rules may read a namespace's labels.
		c.informers[gvrNamespace] = users.ForResource(gvrNamespace).Informer()
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-c.admission.Changed():
					kick() // the rules changed: judge every object again
				}
			}
		}()
	}
	for gvr, inf := range c.informers {
		if _, err := inf.AddEventHandler(c.watchHandler(gvr, kick)); err != nil {
			return nil, err
		}
	}
	if c.acks != nil {
		// An ack changes status.clusters only: the statuses are computed
		// again from the last translation's report, without translating.
		c.acks.OnAck(func(string) {
			select {
			case c.acked <- struct{}{}:
			default:
			}
		})
	}
	shared.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for gvr, inf := range c.informers {
		if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
			return nil, fmt.Errorf("translation watch of %s did not sync within a minute", gvr.Resource)
		}
	}
	c.status = newStatusWriter(c)
	go c.status.run(ctx)
	if err := c.translate(ctx); err != nil {
		return nil, err
	}
	go c.run(ctx)
	return c, nil
}

// Kick asks for a new translation (e.g. when a cluster registers, or this
// replica started or stopped leading).
func (c *Controller) Kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// A burst of changes (a fleet's snapshots, a thousand acks) is debounced
// into one translation (or status refresh), the next no sooner than
// debounce after the last ended, or as long as the last translation took
// if that was longer (at most pace.DefaultCap): while changes keep coming,
// translation uses at most about half of the time, however long one takes.
// A translation reads the whole fleet, so in a bootstrap storm of 10,000
// clusters, woken by every cluster's discovered objects, one took up to
// seconds and they ran back to back (issue 31;
// docs/design/2026-12-06-storm-pacing.md). A change after a quiet spell
// waits only gather (for the other objects of one kubectl apply), not a
// whole debounce: an isolated policy edit reaches the fleet that much
// sooner.
const (
	debounce = 100 * time.Millisecond
	gather   = 20 * time.Millisecond
)

func (c *Controller) run(ctx context.Context) {
	pacer := pace.Pacer{Gather: gather, Debounce: debounce, Cap: pace.DefaultCap}
	for {
		translate := false
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
			translate = true
		case <-c.acked:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pacer.Wait(time.Now())):
		}
		select {
		case <-c.wake:
			translate = true
		default:
		}
		if !translate {
			select {
			case <-c.acked:
			default:
			}
			if c.report != nil {
				c.writeStatus(ctx, c.report)
			}
			pacer.Refreshed(time.Now())
			continue
		}
		start := time.Now()
		if err := c.translate(ctx); err != nil {
			c.log.Error("translation failed", "error", err)
		}
		pacer.Ran(start, time.Now())
	}
}

// specOnly are the kinds translation reads without their status: they are
// converted again only when their spec changes (their generation), and
// handed over without a status.
var specOnly = map[schema.GroupVersionResource]bool{gvrCluster: true}

// watchHandler is the handler of kind gvr's watch: it notes that the
// kind's cache changed before it kicks a translation (kick), so the
// translation it wakes reads the change. Status writes (this controller's
// own) kick nothing, and for the specOnly kinds they are no change; a
// change of labels or annotations alone kicks one (admission reads them).
func (c *Controller) watchHandler(gvr schema.GroupVersionResource, kick func()) cache.ResourceEventHandlerFuncs {
	changed := new(atomic.Bool)
	changed.Store(true)
	c.changed[gvr] = changed
	touch := func(any) { changed.Store(true); kick() }
	return cache.ResourceEventHandlerFuncs{AddFunc: touch, DeleteFunc: touch, UpdateFunc: func(o, n any) {
		om, _ := o.(metav1.Object)
		nm, _ := n.(metav1.Object)
		if om == nil || nm == nil {
			touch(n)
			return
		}
		if !specOnly[gvr] || specVersion(om) != specVersion(nm) {
			changed.Store(true)
		}
		if om.GetGeneration() == nm.GetGeneration() && om.GetGeneration() != 0 && sameSpec(o, n) &&
			(specOnly[gvr] || sameMetadata(om, nm)) {
			return
		}
		kick()
	}}
}

// sameSpec reports whether two versions of a cached object have equal
// specs: unstructured objects, or typed ones (kubeinformers.Typed) of the
// same type. Anything else is a change.
func sameSpec(o, n any) bool {
	ou, uok := o.(*unstructured.Unstructured)
	nu, nok := n.(*unstructured.Unstructured)
	if uok || nok {
		return uok && nok && reflect.DeepEqual(ou.Object["spec"], nu.Object["spec"])
	}
	ov, nv := reflect.ValueOf(o), reflect.ValueOf(n)
	if !ov.IsValid() || !nv.IsValid() || ov.Type() != nv.Type() || ov.Kind() != reflect.Pointer ||
		ov.IsNil() || nv.IsNil() || ov.Elem().Kind() != reflect.Struct {
		return false
	}
	oSpec, nSpec := ov.Elem().FieldByName("Spec"), nv.Elem().FieldByName("Spec")
	return oSpec.IsValid() && reflect.DeepEqual(oSpec.Interface(), nSpec.Interface())
}

// sameMetadata reports whether two versions of an object have the same
// labels and annotations. Admission rules read them (the default rules:
// relaymesh.io/allow-all) and the generation does not cover them, so a
// change to them alone is judged again at once, not at the next unrelated
// translation.
func sameMetadata(a, b metav1.Object) bool {
	return maps.Equal(a.GetLabels(), b.GetLabels()) && maps.Equal(a.GetAnnotations(), b.GetAnnotations())
}

// specVersion is what a specOnly kind is converted again on: its spec's
// generation (with its UID), or its resourceVersion if it has none.
func specVersion(u metav1.Object) string {
	if u.GetGeneration() > 0 {
		return "spec:" + string(u.GetUID()) + "/" + strconv.FormatInt(u.GetGeneration(), 10)
	}
	return u.GetResourceVersion()
}

// list reads an informer's cache as typed objects: a typed cache's objects
// as they are (kubeinformers.Typed), an unstructured one's converted,
// converting only what changed since the last call (by resourceVersion; by
// generation for the specOnly kinds). It returns the last call's list
// again when the kind's cache did not change since (changed). An object it
// cannot read is an error, not a skip: dropping, say, a VirtualMesh with
// globalAccessPolicy Enabled would remove its deny-all policy (fail open);
// and a kind that had one is read again next time.
func list[T any](c *Controller, gvr schema.GroupVersionResource, errs *[]error) []T {
	changed := c.changed[gvr]
	if changed != nil && !changed.Swap(false) {
		if out, ok := c.lists[gvr].([]T); ok {
			return out
		}
	}
	failed := len(*errs)
	objs := c.informers[gvr].GetStore().List()
	// Sized once: the list is kept until the kind changes, and a slice
	// grown by append holds up to a quarter more than it uses (at 20,000
	// Workloads and Destinations, megabytes for the life of the list).
	var out []T
	if len(objs) > 0 {
		out = make([]T, 0, len(objs))
	}
	prev := c.typed[gvr]
	next := map[string]typedObject{}
	for _, obj := range objs {
		if t, ok := obj.(*T); ok {
			// A typed cache (kubeinformers.Typed): the cached object
			// itself, shared and read only, no copy of translation's own.
			v := *t
			if kc, ok := any(&v).(*multiclusterv1alpha1.KubernetesCluster); ok && specOnly[gvr] && kc.Generation > 0 {
				kc.Status = multiclusterv1alpha1.KubernetesClusterStatus{} // of the copy
			}
			out = append(out, v)
			continue
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		key := u.GetNamespace() + "/" + u.GetName()
		rv := u.GetResourceVersion()
		if specOnly[gvr] {
			// Translation reads the spec alone: a status write (an agent's
			// heartbeat, its certificate) is no reason to convert again.
			rv = specVersion(u)
		}
		if t, ok := prev[key]; ok && t.resourceVersion != "" && t.resourceVersion == rv {
			next[key] = t
			out = append(out, t.obj.(T))
			continue
		}
		fields := u.Object
		if specOnly[gvr] && u.GetGeneration() > 0 {
			fields = maps.Clone(u.Object)
			delete(fields, "status")
		}
		var t T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(fields, &t); err != nil {
			*errs = append(*errs, fmt.Errorf("%s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err))
			continue
		}
		next[key] = typedObject{resourceVersion: rv, obj: t}
		out = append(out, t)
	}
	c.typed[gvr] = next
	if changed != nil {
		if len(*errs) > failed {
			changed.Store(true)
			delete(c.lists, gvr)
		} else {
			c.lists[gvr] = out
		}
	}
	return out
}

// Input builds the translation input from the caches; it fails if any
// object cannot be read.
func (c *Controller) Input() (*translation.Input, error) {
	var errs []error
	var workloads []discoveryv1alpha1.Workload
	if c.workloads != nil {
		workloads = c.workloads.Workloads()
	} else {
		workloads = list[discoveryv1alpha1.Workload](c, gvrWorkload, &errs)
	}
	in := &translation.Input{
		Meshes:              list[discoveryv1alpha1.Mesh](c, gvrMesh, &errs),
		Workloads:           workloads,
		Destinations:        list[discoveryv1alpha1.Destination](c, gvrDestination, &errs),
		VirtualMeshes:       list[networkingv1alpha1.VirtualMesh](c, gvrVirtualMesh, &errs),
		TrafficPolicies:     list[networkingv1alpha1.TrafficPolicy](c, gvrTraffic, &errs),
		AccessPolicies:      list[networkingv1alpha1.AccessPolicy](c, gvrAccess, &errs),
		VirtualDestinations: list[networkingv1alpha1.VirtualDestination](c, gvrVirtualDest, &errs),
		Clusters:            list[multiclusterv1alpha1.KubernetesCluster](c, gvrCluster, &errs),
	}
	return in, errors.Join(errs...)
}

func (c *Controller) translate(ctx context.Context) error {
	start := time.Now()
	in, err := c.Input()
	if err != nil {
		// Keep the last published outputs rather than publish a view with
		// holes in it.
		return fmt.Errorf("not translating, the published outputs stay: %w", err)
	}
	in, refused := c.admit(ctx, in)
	report := c.engine.Translate(in)
	report.Merge(refused)
	stats := c.engine.Stats()
	if stats.Full && stats.FullReason != "" {
		c.log.Warn("incremental translation gave way to a full one", "reason", stats.FullReason)
	}
	// Every registered cluster gets a set, possibly empty, so translation
	// can also remove everything from a cluster.
	dirty := c.engine.Dirty()
	for _, name := range c.clusters() {
		if !c.published[name] && !slices.Contains(dirty, name) {
			dirty = append(dirty, name)
		}
	}
	sort.Strings(dirty)
	publish := func() {
		for _, n := range dirty {
			c.out.SetFrom(Source, n, c.engine.ClusterObjects(n))
			c.published[n] = true
			c.versions[n] = c.out.Version(n)
			c.parentsIn[n] = c.engine.ClusterParents(n)
		}
	}
	if b, ok := c.out.(batchPublisher); ok {
		b.Batch(publish)
	} else {
		publish()
	}
	c.report = report
	c.writeStatus(ctx, report)
	c.log.Info("translated", "units", stats.Units, "recomputed", stats.Recomputed, "clusters_published", len(dirty),
		"took", time.Since(start).Round(time.Microsecond))
	return nil
}
