package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// PolicyLabel marks a ConfigMap as a user rule set, whatever its value.
const PolicyLabel = "relaymesh.io/admission-policy"

// DefaultDebounce is how long the Loader waits after the first ConfigMap
// event of a burst before reloading.
const DefaultDebounce = 100 * time.Millisecond

// syncTimeout bounds Start's wait for the first list of ConfigMaps.
const syncTimeout = time.Minute

// LoaderConfig configures a Loader.
type LoaderConfig struct {
	// Client reads ConfigMaps. Required.
	Client kubernetes.Interface
	// Namespace holds the rule set ConfigMaps (the server's). Required.
	Namespace string
	// Engine receives the rule sets. Required.
	Engine *Engine
	// Debounce is how long to wait after the first event of a burst; 0
	// means DefaultDebounce, at most a minute.
	Debounce time.Duration
	// Logger for operational logs; default: discard.
	Logger *slog.Logger
}

// Validate reports every problem with c, each prefixed with its field path.
func (c LoaderConfig) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("client: required"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("namespace: required"))
	}
	if c.Engine == nil {
		errs = append(errs, errors.New("engine: required"))
	}
	if c.Debounce < 0 || c.Debounce > time.Minute {
		errs = append(errs, fmt.Errorf("debounce: %v is outside [0s, 1m0s]", c.Debounce))
	}
	return errors.Join(errs...)
}

// Loader keeps an Engine's user rule sets equal to the ConfigMaps labelled
// PolicyLabel in one namespace: each ConfigMap is one rule set named
// "namespace/name" whose files are its data keys ending in ".rego" (other
// keys, and binaryData, are ignored). Adding, changing, relabelling or
// deleting a ConfigMap reloads every rule set (Engine.Load); a refused one
// keeps its last accepted version in force.
type Loader struct {
	engine    *Engine
	namespace string
	debounce  time.Duration
	log       *slog.Logger
	factory   informers.SharedInformerFactory
	lister    corelisters.ConfigMapLister
	informer  cache.SharedIndexInformer
	started   atomic.Bool
	kick      chan struct{} // capacity 1
}

// NewLoader validates cfg and sets up (but does not start) the watch.
func NewLoader(cfg LoaderConfig) (*Loader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("admission loader config: %w", err)
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Loader{
		engine: cfg.Engine, namespace: cfg.Namespace, debounce: cfg.Debounce,
		log: cfg.Logger.With("component", "admission-loader", "namespace", cfg.Namespace),
		factory: informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(cfg.Namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = PolicyLabel })),
		kick: make(chan struct{}, 1),
	}
	cms := l.factory.Core().V1().ConfigMaps()
	l.lister, l.informer = cms.Lister(), cms.Informer()
	notify := func(any) { l.notify() }
	if _, err := l.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, n any) { l.notify() }, DeleteFunc: notify,
	}); err != nil {
		return nil, err
	}
	return l, nil
}

// Engine is the engine the Loader feeds.
func (l *Loader) Engine() *Engine { return l.engine }

// Status is the status of every rule set (Engine.Status).
func (l *Loader) Status() []RuleSetStatus { return l.engine.Status() }

// Start watches the ConfigMaps, loads them once listed, and returns; it
// keeps reloading after every change until ctx ends. It fails if the
// ConfigMaps cannot be listed within a minute, leaving the engine with the
// default rules only.
func (l *Loader) Start(ctx context.Context) error {
	if !l.started.CompareAndSwap(false, true) {
		return ErrAlreadyStarted
	}
	l.factory.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), l.informer.HasSynced) {
		return fmt.Errorf("admission: ConfigMaps in %s not listed within %v", l.namespace, syncTimeout)
	}
	// Events before the first load are covered by it.
	select {
	case <-l.kick:
	default:
	}
	l.reload(ctx)
	go l.run(ctx)
	return nil
}

func (l *Loader) notify() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func (l *Loader) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(l.debounce):
		}
		l.reload(ctx)
	}
}

func (l *Loader) reload(ctx context.Context) {
	cms, err := l.lister.List(labels.Everything())
	if err != nil {
		l.log.Error("listing admission rule ConfigMaps", "error", err)
		return
	}
	sets := make([]RuleSet, 0, len(cms))
	for _, cm := range cms {
		sets = append(sets, RuleSetOf(cm))
	}
	l.engine.Load(ctx, sets)
}

// RuleSetOf is the rule set a ConfigMap labelled PolicyLabel holds: the
// Loader's reading, shared with views that load the same ConfigMaps once
// (the offline and live access audit).
func RuleSetOf(cm *corev1.ConfigMap) RuleSet {
	rs := RuleSet{Name: cm.Namespace + "/" + cm.Name, Version: cm.ResourceVersion, Files: map[string]string{}}
	for k, v := range cm.Data {
		if strings.HasSuffix(k, ".rego") {
			rs.Files[k] = v
		}
	}
	return rs
}
