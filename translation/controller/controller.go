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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/policy"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/translation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// Publisher receives each cluster's translated objects.
type Publisher interface {
	SetFrom(source, cluster string, objects []*relaypb.OutputObject)
	// Version is the version of cluster's current output set.
	Version(cluster string) uint64
}

// Acks tells which output set each cluster's agent applied last, and with
// what result per object (relay.View).
type Acks interface {
	Ack(cluster string) *relaypb.PullAck
	OnAck(func(cluster string))
}

// Source is the name under which translation publishes outputs.
const Source = "translation"

var (
	gvrMesh        = discoveryv1alpha1.GroupVersion.WithResource("meshes")
	gvrWorkload    = discoveryv1alpha1.GroupVersion.WithResource("workloads")
	gvrDestination = discoveryv1alpha1.GroupVersion.WithResource("destinations")
	gvrVirtualMesh = networkingv1alpha1.GroupVersion.WithResource("virtualmeshes")
	gvrTraffic     = networkingv1alpha1.GroupVersion.WithResource("trafficpolicies")
	gvrAccess      = networkingv1alpha1.GroupVersion.WithResource("accesspolicies")
	gvrVirtualDest = networkingv1alpha1.GroupVersion.WithResource("virtualdestinations")
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
	wake      chan struct{}

	// Owned by the translating goroutine.
	engine    *Engine
	typed     map[schema.GroupVersionResource]map[string]typedObject
	published map[string]bool // clusters that have a published set
	written   map[translation.ObjectKey]writtenStatus
	acks      Acks
	admission Admitter
	admitted  map[string]admitted
	versions  map[string]uint64                          // cluster → output version that carries translation's current objects
	parentsIn map[string]map[translation.Parent][]string // cluster → parent → sorted keys of its objects there
}

// writtenStatus is a status known to be on an object at resourceVersion.
type writtenStatus struct{ body, resourceVersion string }

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
}

// Start watches, translates once synced, and keeps translating after every
// change until ctx ends. It returns once the first translation is published.
func Start(ctx context.Context, cfg Config) (*Controller, error) {
	c := &Controller{client: cfg.Client, namespace: cfg.Namespace, out: cfg.Outputs, clusters: cfg.Clusters,
		log: cfg.Logger.With("component", "translation"), informers: map[schema.GroupVersionResource]cache.SharedIndexInformer{},
		wake: make(chan struct{}, 1), engine: NewEngine(cfg.Namespace), typed: map[schema.GroupVersionResource]map[string]typedObject{},
		published: map[string]bool{}, written: map[translation.ObjectKey]writtenStatus{},
		acks: cfg.Acks, admission: cfg.Admission, admitted: map[string]admitted{}, versions: map[string]uint64{}, parentsIn: map[string]map[translation.Parent][]string{}}
	discovered := dynamicinformer.NewFilteredDynamicSharedInformerFactory(cfg.Client, 10*time.Minute, cfg.Namespace, nil)
	users := dynamicinformer.NewDynamicSharedInformerFactory(cfg.Client, 10*time.Minute)
	kick := func() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { kick() }, UpdateFunc: func(o, n any) {
		// Status writes by this controller must not retrigger it.
		if ou, ok := o.(*unstructured.Unstructured); ok {
			if nu, ok := n.(*unstructured.Unstructured); ok && ou.GetGeneration() == nu.GetGeneration() && ou.GetGeneration() != 0 && reflect.DeepEqual(ou.Object["spec"], nu.Object["spec"]) {
				return
			}
		}
		kick()
	}, DeleteFunc: func(any) { kick() }}
	for _, gvr := range []schema.GroupVersionResource{gvrMesh, gvrWorkload, gvrDestination} {
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
	for _, inf := range c.informers {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
	}
	if c.acks != nil {
		// An ack changes status.clusters only: translation itself has
		// nothing to recompute, so this costs the engine's fixed check.
		c.acks.OnAck(func(string) { kick() })
	}
	discovered.Start(ctx.Done())
	users.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for gvr, inf := range c.informers {
		if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
			return nil, fmt.Errorf("translation watch of %s did not sync within a minute", gvr.Resource)
		}
	}
	if err := c.translate(ctx); err != nil {
		return nil, err
	}
	go c.run(ctx)
	return c, nil
}

// Kick asks for a new translation (e.g. when a cluster registers).
func (c *Controller) Kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Controller) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		// Debounce a burst of changes into one translation.
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		if err := c.translate(ctx); err != nil {
			c.log.Error("translation failed", "error", err)
		}
	}
}

// list converts an informer's cache to typed objects, converting only what
// changed since the last call (by resourceVersion). An object it cannot
// read is an error, not a skip: dropping, say, a VirtualMesh with
// globalAccessPolicy Enabled would remove its deny-all policy (fail open).
func list[T any](c *Controller, gvr schema.GroupVersionResource, errs *[]error) []T {
	var out []T
	prev := c.typed[gvr]
	next := map[string]typedObject{}
	for _, obj := range c.informers[gvr].GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		key := u.GetNamespace() + "/" + u.GetName()
		if t, ok := prev[key]; ok && t.resourceVersion != "" && t.resourceVersion == u.GetResourceVersion() {
			next[key] = t
			out = append(out, t.obj.(T))
			continue
		}
		var t T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t); err != nil {
			*errs = append(*errs, fmt.Errorf("%s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err))
			continue
		}
		next[key] = typedObject{resourceVersion: u.GetResourceVersion(), obj: t}
		out = append(out, t)
	}
	c.typed[gvr] = next
	return out
}

// Input builds the translation input from the caches; it fails if any
// object cannot be read.
func (c *Controller) Input() (*translation.Input, error) {
	var errs []error
	in := &translation.Input{
		Meshes:              list[discoveryv1alpha1.Mesh](c, gvrMesh, &errs),
		Workloads:           list[discoveryv1alpha1.Workload](c, gvrWorkload, &errs),
		Destinations:        list[discoveryv1alpha1.Destination](c, gvrDestination, &errs),
		VirtualMeshes:       list[networkingv1alpha1.VirtualMesh](c, gvrVirtualMesh, &errs),
		TrafficPolicies:     list[networkingv1alpha1.TrafficPolicy](c, gvrTraffic, &errs),
		AccessPolicies:      list[networkingv1alpha1.AccessPolicy](c, gvrAccess, &errs),
		VirtualDestinations: list[networkingv1alpha1.VirtualDestination](c, gvrVirtualDest, &errs),
	}
	return in, errors.Join(errs...)
}

// Translate runs every translator over in. Policies outside adminNamespace
// are scoped to their own namespace first (ScopePolicies).
func Translate(in *translation.Input, adminNamespace string) (*translation.Output, *translation.Report) {
	out, r := translation.NewOutput(), translation.NewReport()
	in = ScopePolicies(in, adminNamespace, r)
	federation.Translate(in, out, r)
	federation.TranslateVirtualDestinations(in, out, r)
	policy.TranslateAccess(in, out, r)
	policy.TranslateTraffic(in, out, r)
	r.WarnUntargeted("TrafficPolicy", "AccessPolicy")
	return out, r
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
	for _, n := range dirty {
		c.out.SetFrom(Source, n, c.engine.ClusterObjects(n))
		c.published[n] = true
		c.versions[n] = c.out.Version(n)
		c.parentsIn[n] = c.engine.ClusterParents(n)
	}
	c.writeStatus(ctx, report)
	c.log.Info("translated", "units", stats.Units, "recomputed", stats.Recomputed, "clusters_published", len(dirty),
		"took", time.Since(start).Round(time.Microsecond))
	return nil
}

// writeStatus patches the status of every user object whose status changed.
func (c *Controller) writeStatus(ctx context.Context, r *translation.Report) {
	keys := r.Keys()
	for k := range c.written {
		if _, _, ok := r.Status(k); !ok {
			delete(c.written, k)
		}
	}
	for _, k := range keys {
		gvr, ok := userKinds[k.Kind]
		if !ok {
			continue
		}
		st, targets, _ := r.Status(k)
		status := map[string]any{"observedGeneration": st.ObservedGeneration, "state": string(st.State)}
		status["errors"], status["warnings"] = nil, nil
		if len(st.Errors) > 0 {
			status["errors"] = st.Errors
		}
		if len(st.Warnings) > 0 {
			status["warnings"] = st.Warnings
		}
		field := "destinations"
		if k.Kind == "VirtualMesh" {
			field = "meshes"
		}
		if len(targets) > 0 {
			status[field] = targetsJSON(targets)
		} else {
			status[field] = nil
		}
		if k.Kind == "TrafficPolicy" || k.Kind == "AccessPolicy" {
			status["workloads"] = nil
			if ws := r.SourceWorkloads(k); len(ws) > 0 {
				status["workloads"] = ws
			}
		}
		status["clusters"] = nil
		if applied := c.applyStatus(translation.Parent(k)); len(applied) > 0 {
			status["clusters"] = targetsJSON(applied)
			var failed []string
			for _, a := range applied {
				if a.State == common.ApplyFailed {
					failed = append(failed, a.Cluster)
				}
			}
			if len(failed) > 0 && st.State == common.StateAccepted {
				status["state"] = string(common.StateFailed)
				status["errors"] = append(st.Errors, fmt.Sprintf("outputs not applied in cluster %s (see status.clusters)", strings.Join(failed, ", ")))
			}
		}
		body, err := json.Marshal(map[string]any{"status": status})
		if err != nil {
			continue
		}
		cur, rv, found := c.current(gvr, k)
		if w, ok := c.written[k]; ok && found && w.body == string(body) && w.resourceVersion == rv {
			continue // nothing changed since it was last written or checked
		}
		if found && reflect.DeepEqual(normalize(owned(cur, status)), normalize(status)) {
			c.written[k] = writtenStatus{body: string(body), resourceVersion: rv}
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		patched, err := c.client.Resource(gvr).Namespace(k.Namespace).Patch(wctx, k.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
		cancel()
		if err != nil {
			c.log.Warn("could not write status", "kind", k.Kind, "namespace", k.Namespace, "name", k.Name, "error", err)
			continue
		}
		c.written[k] = writtenStatus{body: string(body), resourceVersion: patched.GetResourceVersion()}
	}
}

// current returns the status and resourceVersion of a user object in the
// informer's cache.
func (c *Controller) current(gvr schema.GroupVersionResource, k translation.ObjectKey) (map[string]any, string, bool) {
	obj, exists, err := c.informers[gvr].GetStore().GetByKey(k.Namespace + "/" + k.Name)
	if err != nil || !exists {
		return nil, "", false
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, "", false
	}
	st, _, _ := unstructured.NestedMap(u.Object, "status")
	return st, u.GetResourceVersion(), true
}

// Bounds on what an agent's ack may put into a user object's status.
const (
	maxApplyErrors   = 10
	maxApplyErrorLen = 256
)

// applyStatus is where p's outputs are and whether each cluster's agent
// applied them: Pending until the agent acks the version that carries them,
// then Applied, or Failed naming each object it did not apply.
func (c *Controller) applyStatus(p translation.Parent) []common.ClusterApplyStatus {
	if c.acks == nil {
		return nil
	}
	var out []common.ClusterApplyStatus
	for _, cl := range slices.Sorted(maps.Keys(c.parentsIn)) {
		keys := c.parentsIn[cl][p]
		if len(keys) == 0 {
			continue
		}
		st := common.ClusterApplyStatus{Cluster: cl, State: common.ApplyPending}
		ack := c.acks.Ack(cl)
		if ack != nil {
			st.Version = int64(min(ack.GetVersion(), math.MaxInt64))
		}
		if ack != nil && ack.GetVersion() >= c.versions[cl] {
			st.State = common.ApplyApplied
			for _, r := range ack.GetResults() {
				if o := r.GetOutcome(); o != "conflict" && o != "error" {
					continue
				}
				key := strings.Join([]string{r.GetApiVersion(), r.GetKind(), r.GetNamespace(), r.GetName()}, "/")
				if _, mine := slices.BinarySearch(keys, key); !mine {
					continue
				}
				st.State = common.ApplyFailed
				if len(st.Errors) < maxApplyErrors {
					msg := fmt.Sprintf("%s %s/%s: %s", r.GetKind(), r.GetNamespace(), r.GetName(), r.GetOutcome())
					if e := r.GetError(); e != "" {
						msg += ": " + e
					}
					if len(msg) > maxApplyErrorLen {
						msg = msg[:maxApplyErrorLen] + "…"
					}
					st.Errors = append(st.Errors, strings.ToValidUTF8(msg, ""))
				}
			}
		}
		out = append(out, st)
	}
	return out
}

func targetsJSON[T any](ts []T) []any {
	b, _ := json.Marshal(ts)
	var out []any
	_ = json.Unmarshal(b, &out)
	return out
}

// owned keeps the fields of cur that translation writes (status has every
// one of them, nil when unset): other writers own the rest (the trust
// controller's sharedTrust), which must not make statuses differ forever.
func owned(cur, status map[string]any) map[string]any {
	out := map[string]any{}
	for k := range status {
		if v, ok := cur[k]; ok {
			out[k] = v
		}
	}
	return out
}

// normalize drops nil values and round-trips through JSON so a cached
// status compares equal to the one about to be written.
func normalize(m map[string]any) map[string]any {
	clean := map[string]any{}
	for k, v := range m {
		if v != nil {
			clean[k] = v
		}
	}
	b, _ := json.Marshal(clean)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	delete(out, "conditions")
	return out
}

// ScopePolicies enforces namespace tenancy: a TrafficPolicy or AccessPolicy
// in the admin namespace (the server's) may select anything; one in any other
// namespace may only select, shift to and mirror to Services of its own
// namespace. A policy that reaches further is Invalid, naming what it may not
// target, and is left out of translation. It returns the input translation
// should use (in itself when nothing was removed).
func ScopePolicies(in *translation.Input, adminNamespace string, r *translation.Report) *translation.Input {
	var dests []*discoveryv1alpha1.Destination // sorted on first use: the first foreign one is named
	foreign := func(policyNS string, sels []common.DestinationSelector) string {
		if dests == nil {
			dests = translation.SortedDestinations(in.Destinations)
		}
		for _, d := range dests {
			if ns := d.Spec.KubeService.Ref.Namespace; ns != policyNS && translation.MatchDestination(sels, d) {
				return fmt.Sprintf("Service %s/%s in cluster %s", ns, d.Spec.KubeService.Ref.Name, d.Spec.KubeService.Ref.ClusterName)
			}
		}
		return ""
	}
	scoped := *in
	scoped.TrafficPolicies, scoped.AccessPolicies = nil, nil
	for _, p := range in.TrafficPolicies {
		bad := ""
		if p.Namespace != adminNamespace {
			bad = foreign(p.Namespace, p.Spec.DestinationSelector)
			if ts := p.Spec.Policy.TrafficShift; bad == "" && ts != nil {
				for _, d := range ts.Destinations {
					if d.KubeService != nil && d.KubeService.Namespace != p.Namespace {
						bad = fmt.Sprintf("traffic shift target %s/%s", d.KubeService.Namespace, d.KubeService.Name)
						break
					}
				}
			}
			if m := p.Spec.Policy.Mirror; bad == "" && m != nil && m.KubeService.Namespace != p.Namespace {
				bad = fmt.Sprintf("mirror target %s/%s", m.KubeService.Namespace, m.KubeService.Name)
			}
		}
		if bad != "" {
			r.Invalid(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: p.Namespace, Name: p.Name}, p.Generation,
				"a policy in namespace %s may only target Services in %s (or be created in %s): it reaches %s", p.Namespace, p.Namespace, adminNamespace, bad)
			continue
		}
		scoped.TrafficPolicies = append(scoped.TrafficPolicies, p)
	}
	for _, p := range in.AccessPolicies {
		if p.Namespace != adminNamespace {
			if bad := foreign(p.Namespace, p.Spec.DestinationSelector); bad != "" {
				r.Invalid(translation.ObjectKey{Kind: "AccessPolicy", Namespace: p.Namespace, Name: p.Name}, p.Generation,
					"a policy in namespace %s may only target Services in %s (or be created in %s): it reaches %s", p.Namespace, p.Namespace, adminNamespace, bad)
				continue
			}
		}
		scoped.AccessPolicies = append(scoped.AccessPolicies, p)
	}
	return &scoped
}
