package discovery

import (
	"context"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// DefaultDebounce is how long Changes waits after the first event of a burst.
const DefaultDebounce = 100 * time.Millisecond

// maxDebounce bounds Config.Debounce: discovery must stay live.
const maxDebounce = time.Minute

var (
	// ErrNotSynced is returned by Snapshot before the caches have synced,
	// and by Run when they never do.
	ErrNotSynced = errors.New("discovery: informer caches not synced")
	// ErrAlreadyRunning is returned by a second call to Run.
	ErrAlreadyRunning = errors.New("discovery: Run called twice")
)

// Config configures a Discoverer.
type Config struct {
	// Client reads the workload cluster. Required.
	Client kubernetes.Interface
	// Cluster is the name every discovered object carries: a DNS label.
	// Required.
	Cluster string
	// Resync is the informers' resync period; 0 (the default) means none.
	Resync time.Duration
	// Debounce is how long Changes waits after the first event of a burst;
	// 0 means DefaultDebounce (100ms). At most one minute.
	Debounce time.Duration
	// Logger for operational logs; default: discard.
	Logger *slog.Logger
	// Dynamic reads Gateway API Gateways (waypoints). Optional: without it,
	// when the cluster serves no gateway.networking.k8s.io/v1 Gateways when
	// Run starts, or when Client's identity may not list and watch them in
	// every namespace, no waypoint is discovered (and translation treats
	// every ambient Destination as served by none: fail closed); the rest
	// of discovery runs, and WaypointsUnavailable says why.
	Dynamic dynamic.Interface
}

// Validate reports every problem with c, each prefixed with its field path.
func (c Config) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("client: required"))
	}
	if c.Cluster == "" {
		errs = append(errs, errors.New("cluster: required"))
	} else if msgs := validation.IsDNS1123Label(c.Cluster); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("cluster: %q is not a DNS label: %s", text.Truncate(c.Cluster, 80), strings.Join(msgs, "; ")))
	}
	if c.Resync < 0 {
		errs = append(errs, errors.New("resync: must not be negative"))
	}
	if c.Debounce < 0 || c.Debounce > maxDebounce {
		errs = append(errs, fmt.Errorf("debounce: %v is outside [0s, %v]", c.Debounce, maxDebounce))
	}
	return errors.Join(errs...)
}

// Discoverer watches a workload cluster with shared informers and builds
// snapshots from their caches.
type Discoverer struct {
	cluster  string
	debounce time.Duration
	log      *slog.Logger
	factory  informers.SharedInformerFactory

	namespaces   corelisters.NamespaceLister
	deployments  appslisters.DeploymentLister
	statefulSets appslisters.StatefulSetLister
	daemonSets   appslisters.DaemonSetLister
	services     corelisters.ServiceLister
	configMaps   corelisters.ConfigMapLister
	pods         corelisters.PodLister

	client   kubernetes.Interface
	dynamic  dynamicinformer.DynamicSharedInformerFactory // nil without Config.Dynamic
	gateways atomic.Pointer[cache.GenericLister]          // set by Run when Gateways are served
	// noWaypoints says why Run discovers no waypoint; set before Synced
	// closes, nil when it does.
	noWaypoints atomic.Pointer[string]
	dynClient   dynamic.Interface

	started atomic.Bool
	synced  chan struct{}
	kick    chan struct{} // an event since the last Changes value; capacity 1
	changes chan struct{} // capacity 1
}

// New validates cfg and sets up (but does not start) the informers.
func New(cfg Config) (*Discoverer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("discovery config: %w", err)
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Discoverer{
		cluster:  cfg.Cluster,
		debounce: cfg.Debounce,
		log:      cfg.Logger.With("component", "discovery", "cluster", cfg.Cluster),
		factory:  informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.Resync, informers.WithTransform(trim)),
		synced:   make(chan struct{}),
		kick:     make(chan struct{}, 1),
		changes:  make(chan struct{}, 1),
		client:   cfg.Client,
	}
	d.dynClient = cfg.Dynamic
	if cfg.Dynamic != nil {
		d.dynamic = dynamicinformer.NewDynamicSharedInformerFactory(cfg.Dynamic, cfg.Resync)
	}
	core, apps := d.factory.Core().V1(), d.factory.Apps().V1()
	d.namespaces = core.Namespaces().Lister()
	d.deployments = apps.Deployments().Lister()
	d.statefulSets = apps.StatefulSets().Lister()
	d.daemonSets = apps.DaemonSets().Lister()
	d.services = core.Services().Lister()
	d.configMaps = core.ConfigMaps().Lister()
	d.pods = core.Pods().Lister()

	all := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.notify() },
		UpdateFunc: d.onUpdate,
		DeleteFunc: func(any) { d.notify() },
	}
	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{core.Namespaces().Informer(), all},
		{apps.Deployments().Informer(), all},
		{apps.StatefulSets().Informer(), all},
		{apps.DaemonSets().Informer(), all},
		{core.Services().Informer(), all},
		{core.ConfigMaps().Informer(), cache.FilteringResourceEventHandler{FilterFunc: isMeshConfigMap, Handler: all}},
		{core.Pods().Informer(), all},
	}
	for _, h := range handlers {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return nil, fmt.Errorf("discovery: add event handler: %w", err)
		}
	}
	return d, nil
}

// Run starts the informers, waits until their caches have synced, then
// signals Changes until ctx ends and returns nil. It returns an error
// wrapping ErrNotSynced when ctx ends before the caches sync, and
// ErrAlreadyRunning when called a second time. The informers stop before Run
// returns.
func (d *Discoverer) Run(ctx context.Context) error {
	if !d.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	start := time.Now()
	if d.dynamic == nil {
		d.noWaypoints.Store(new("discovery has no dynamic client"))
	} else {
		if why := d.gatewaysReadable(ctx); why == "" {
			inf := d.dynamic.ForResource(GatewayResource)
			if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(any) { d.notify() },
				UpdateFunc: d.onUpdate,
				DeleteFunc: func(any) { d.notify() },
			}); err != nil {
				return fmt.Errorf("discovery: gateway informer: %w", err)
			}
			lister := inf.Lister()
			d.gateways.Store(&lister)
			d.dynamic.Start(ctx.Done())
			defer d.dynamic.Shutdown()
		} else {
			d.noWaypoints.Store(&why)
			d.log.Warn("no waypoints are discovered until the agent restarts: L7 AccessPolicies and routes of ambient Destinations fail closed (needs a waypoint)", "reason", why)
		}
	}
	d.factory.Start(ctx.Done())
	defer d.factory.Shutdown()
	var failed []string
	for typ, ok := range d.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			failed = append(failed, typ.String())
		}
	}
	if d.gateways.Load() != nil {
		for res, ok := range d.dynamic.WaitForCacheSync(ctx.Done()) {
			if !ok {
				failed = append(failed, res.String())
			}
		}
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		return fmt.Errorf("%w: %s: %w", ErrNotSynced, strings.Join(failed, ", "), context.Cause(ctx))
	}
	close(d.synced)
	d.log.Info("informer caches synced", "elapsed", time.Since(start).Round(time.Millisecond))

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.kick:
		}
		t := time.NewTimer(d.debounce)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		select {
		case d.changes <- struct{}{}:
		default: // a value is already waiting; it covers this one
		}
	}
}

// Synced is closed once the caches have synced.
func (d *Discoverer) Synced() <-chan struct{} { return d.synced }

// Changes receives a value at most Debounce after any relevant informer
// event; values coalesce (the channel holds at most one). A receiver calls
// Snapshot and compares its Hash with the last one it sent.
func (d *Discoverer) Changes() <-chan struct{} { return d.changes }

// Snapshot builds a snapshot from the informer caches. It returns
// ErrNotSynced until Synced is closed.
func (d *Discoverer) Snapshot() (*relaypb.Snapshot, error) {
	select {
	case <-d.synced:
	default:
		return nil, ErrNotSynced
	}
	var in Inputs
	var errs []error
	list := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", what, err))
		}
	}
	var err error
	everything := labels.Everything()
	in.Namespaces, err = d.namespaces.List(everything)
	list("namespaces", err)
	in.Deployments, err = d.deployments.List(everything)
	list("deployments", err)
	in.StatefulSets, err = d.statefulSets.List(everything)
	list("statefulsets", err)
	in.DaemonSets, err = d.daemonSets.List(everything)
	list("daemonsets", err)
	in.Services, err = d.services.List(everything)
	list("services", err)
	in.ConfigMaps, err = d.configMaps.List(everything)
	list("configmaps", err)
	in.Pods, err = d.pods.List(everything)
	list("pods", err)
	if gl := d.gateways.Load(); gl != nil {
		objs, err := (*gl).List(everything)
		list("gateways", err)
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok {
				in.Gateways = append(in.Gateways, u)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	return Build(d.cluster, in), nil
}

// WaypointsUnavailable says why discovery reports no waypoint (the cluster
// serves no Gateways, or the agent may not list and watch them), or "" when
// it discovers them. Meaningful once Synced is closed.
func (d *Discoverer) WaypointsUnavailable() string {
	if why := d.noWaypoints.Load(); why != nil {
		return *why
	}
	return ""
}

// gatewaysReadable says why Gateways cannot be watched ("" when they can):
// the cluster does not serve them, or the agent may not list or watch them
// in every namespace. An informer on a kind its client may not list never
// syncs, and discovery would never report a snapshot (an agent of a
// ClusterRole without the rule would never connect), so Run asks first.
func (d *Discoverer) gatewaysReadable(ctx context.Context) string {
	if !d.servesGateways() {
		return "the cluster serves no gateway.networking.k8s.io/v1 Gateways"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	const lacks = "in every namespace (its ClusterRole lacks the rule that this release's agent chart grants)"
	var denied []string
	unknown := false
	for _, verb := range []string{"list", "watch"} {
		review, err := d.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Group: GatewayResource.Group, Version: GatewayResource.Version, Resource: GatewayResource.Resource}},
		}, metav1.CreateOptions{})
		switch {
		case err != nil:
			unknown = true
		case !review.Status.Allowed:
			denied = append(denied, verb)
		}
	}
	if len(denied) > 0 {
		return fmt.Sprintf("the agent may not %s gateways.gateway.networking.k8s.io %s", strings.Join(denied, " or "), lacks)
	}
	if unknown {
		// Could not ask: try. A list refused means the informer would be
		// too; another error is likely passing, and the informer retries.
		if _, err := d.dynClient.Resource(GatewayResource).List(ctx, metav1.ListOptions{Limit: 1}); apierrors.IsForbidden(err) {
			return "the agent may not list gateways.gateway.networking.k8s.io " + lacks
		}
	}
	return ""
}

// servesGateways asks the apiserver whether it serves Gateway API Gateways.
func (d *Discoverer) servesGateways() bool {
	res, err := d.client.Discovery().ServerResourcesForGroupVersion(GatewayResource.GroupVersion().String())
	if err != nil {
		return false
	}
	for _, r := range res.APIResources {
		if r.Name == GatewayResource.Resource {
			return true
		}
	}
	return false
}

// notify records an event for the debounce loop in Run.
func (d *Discoverer) notify() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// onUpdate ignores resyncs: updates that carry the same resource version.
func (d *Discoverer) onUpdate(oldObj, newObj any) {
	o, err1 := meta.Accessor(oldObj)
	n, err2 := meta.Accessor(newObj)
	if err1 == nil && err2 == nil && o.GetResourceVersion() == n.GetResourceVersion() {
		return
	}
	d.notify()
}

// isMeshConfigMap reports whether a ConfigMap event can concern a mesh
// config ("istio" or "istio-<rev>"); it sees through deletion tombstones.
func isMeshConfigMap(obj any) bool {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, err := meta.Accessor(obj)
	return err == nil && meshConfigMapName(m.GetName())
}

func meshConfigMapName(name string) bool {
	return name == "istio" || strings.HasPrefix(name, "istio-")
}

// trim keeps in the informer caches only what Build reads (see the package
// doc). It is idempotent, as client-go requires of a transform.
func trim(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		p := &corev1.Pod{TypeMeta: o.TypeMeta, ObjectMeta: o.ObjectMeta}
		p.Annotations = nil
		if v, ok := o.Annotations[annotationRedirection]; ok {
			p.Annotations = map[string]string{annotationRedirection: v}
		}
		p.Status = corev1.PodStatus{
			Phase:      o.Status.Phase,
			Conditions: o.Status.Conditions,
			PodIP:      o.Status.PodIP,
			PodIPs:     o.Status.PodIPs,
		}
		return p, nil
	case *corev1.ConfigMap:
		if !meshConfigMapName(o.Name) {
			o.Data, o.BinaryData = nil, nil
		}
	}
	return obj, nil
}
