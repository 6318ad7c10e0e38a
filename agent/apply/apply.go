package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/relaymesh/relaymesh/api/outputs"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
)

// FieldManager is the agent's server-side apply field manager.
const FieldManager = "relaymesh-agent"

// Outcomes of one object (relaypb.ObjectResult.Outcome).
const (
	OutcomeApplied   = "applied"
	OutcomeUnchanged = "unchanged"
	OutcomePruned    = "pruned"
	OutcomeConflict  = "conflict"
	OutcomeError     = "error"
)

// Defaults and bounds of Config.
const (
	DefaultMaxObjectBytes = 256 << 10
	DefaultMaxObjects     = 20000

	maxMaxObjectBytes = 3 << 19 // 1.5 MiB, etcd's default request limit
	maxMaxObjects     = 100000
)

// workers bounds the API requests one Apply has in flight.
const workers = 8

// maxErrorBytes bounds the error text of one result.
const maxErrorBytes = 2048

// ErrSetRefused is returned (wrapped) when Apply refuses a whole set; the
// cluster is left as it was.
var ErrSetRefused = errors.New("output set refused")

// DefaultKinds are the kinds the agent manages unless configured otherwise:
// the Istio kinds Relaymesh's translators produce. All are namespaced.
var DefaultKinds = outputs.IstioGroupVersionKinds()

// GatewayRouteKinds are the Gateway API routes Relaymesh writes for ambient
// Destinations (HTTPRoute, GRPCRoute, TCPRoute). An agent adds them to its
// Kinds and its OptionalKinds: a cluster without Gateway API's CRDs serves
// none of them, and an older Gateway API no TCPRoute at v1.
var GatewayRouteKinds = gatewayRouteKinds()

func gatewayRouteKinds() []schema.GroupVersionKind {
	var out []schema.GroupVersionKind
	for _, k := range outputs.GatewayRouteKinds() {
		out = append(out, k.Kind)
	}
	return out
}

// AmbientFederationKinds are what ambient federation writes into a
// consuming cluster (docs/design/2026-12-04-ambient-federation.md): the
// global Service, its WorkloadEntries, and the remote network's gateway (a
// Gateway API Gateway of class istio-remote). An agent adds them to its
// Kinds only when told to (relaymesh agent --ambient-federation): writing
// Services is a privilege the agent otherwise does without. The Gateway is
// optional (a cluster without Gateway API's CRDs serves none).
var AmbientFederationKinds = []schema.GroupVersionKind{
	{Version: "v1", Kind: "Service"},
	{Group: "networking.istio.io", Version: "v1", Kind: "WorkloadEntry"},
	AmbientFederationGateway,
}

// AmbientFederationGateway is the optional kind of AmbientFederationKinds.
var AmbientFederationGateway = schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "Gateway"}

// Config configures an Applier.
type Config struct {
	// Dynamic is the client for the workload cluster. Required.
	Dynamic dynamic.Interface
	// Mapper maps kinds to resources, e.g.
	// restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)).
	// If it is a meta.ResettableRESTMapper it is reset after a kind was not
	// found, so a CRD installed later is seen by the next set. Required.
	Mapper meta.RESTMapper
	// Owner is the value of outputs.OwnerLabel on everything this agent applies; a
	// non-empty label value. Required.
	Owner string
	// Kinds is the allowlist of kinds the agent may create, change and
	// prune; default DefaultKinds. One version per kind; every kind must be
	// namespaced in the cluster (checked when applying).
	Kinds []schema.GroupVersionKind
	// OptionalKinds are kinds of Kinds the cluster may not serve (their
	// CRDs are not installed): such a kind is then not reported once per
	// set, as a required kind is; there is nothing of it to prune. An
	// object of it that the set names still fails, saying the kind is not
	// served. Any other failure to map or list it is reported.
	OptionalKinds []schema.GroupVersionKind
	// MaxObjectBytes bounds one manifest; default 256 KiB, at most 1.5 MiB.
	MaxObjectBytes int
	// MaxObjects bounds one set; default 20,000, at most 100,000. A larger
	// set is refused whole.
	MaxObjects int
	// Logger receives one line per change; never a manifest. Default: discard.
	Logger *slog.Logger
	// LocalNetworks, when set, lets WorkloadEntries join users' global
	// Services (relaymesh agent --ambient-failover,
	// docs/design/2026-12-04-ambient-failover.md). An entry labelled other
	// than relaymesh.io/global-service: <service> is then applied only
	// when its network is not one LocalNetworks returns (it is reached
	// through that network's gateway and cannot pass for a pod of this
	// cluster) and a Service of its namespace labelled istio.io/global=true,
	// not the agent's own, selects exactly its labels: the owner's consent
	// to other clusters' endpoints joining it. nil: such entries are
	// refused, whatever the server sends.
	LocalNetworks func() []string
}

// Default returns c with every zero field set to its default.
func (c Config) Default() Config {
	if len(c.Kinds) == 0 {
		c.Kinds = slices.Clone(DefaultKinds)
	}
	if c.MaxObjectBytes == 0 {
		c.MaxObjectBytes = DefaultMaxObjectBytes
	}
	if c.MaxObjects == 0 {
		c.MaxObjects = DefaultMaxObjects
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c, each prefixed with its field path.
// It does not apply defaults; call Default first.
func (c Config) Validate() error {
	var errs []error
	if c.Dynamic == nil {
		errs = append(errs, errors.New("dynamic: required"))
	}
	if c.Mapper == nil {
		errs = append(errs, errors.New("mapper: required"))
	}
	if c.Owner == "" {
		errs = append(errs, errors.New("owner: required"))
	} else if msgs := validation.IsValidLabelValue(c.Owner); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("owner: %q is not a label value: %s", c.Owner, strings.Join(msgs, "; ")))
	}
	if len(c.Kinds) == 0 {
		errs = append(errs, errors.New("kinds: at least one kind is required"))
	}
	seen := map[schema.GroupKind]int{}
	for i, k := range c.Kinds {
		switch {
		case k.Kind == "" || k.Version == "":
			errs = append(errs, fmt.Errorf("kinds[%d]: version and kind are required", i))
		case seen[k.GroupKind()] > 0:
			errs = append(errs, fmt.Errorf("kinds[%d]: %s is listed twice (kinds[%d]); list one version per kind", i, k.GroupKind(), seen[k.GroupKind()]-1))
		}
		seen[k.GroupKind()] = i + 1
	}
	for i, k := range c.OptionalKinds {
		if seen[k.GroupKind()] == 0 || c.Kinds[seen[k.GroupKind()]-1] != k {
			errs = append(errs, fmt.Errorf("optionalKinds[%d]: %s is not one of kinds", i, k))
		}
	}
	if c.MaxObjectBytes < 1 || c.MaxObjectBytes > maxMaxObjectBytes {
		errs = append(errs, fmt.Errorf("maxObjectBytes: %d is outside [1, %d]", c.MaxObjectBytes, maxMaxObjectBytes))
	}
	if c.MaxObjects < 1 || c.MaxObjects > maxMaxObjects {
		errs = append(errs, fmt.Errorf("maxObjects: %d is outside [1, %d]", c.MaxObjects, maxMaxObjects))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("logger: required"))
	}
	return errors.Join(errs...)
}

// Applier makes a cluster match output sets. It is safe for concurrent use;
// Apply calls run one at a time.
type Applier struct {
	cfg      Config
	rules    rules
	optional map[schema.GroupVersionKind]bool // cfg.OptionalKinds
	log      *slog.Logger

	mu sync.Mutex // serializes Apply
	// kindMissing records that the last Apply could not map a required
	// kind, so the next one resets a resettable mapper first.
	kindMissing bool
	// optionalMissing records that it could not map an optional kind (a
	// cluster without Gateway API's CRDs: most of them). That resets the
	// mapper — a full discovery of the cluster's API groups — at most once
	// per optionalRediscovery since lastReset, not before every Apply.
	optionalMissing bool
	lastReset       time.Time
}

// optionalRediscovery is how soon an Apply notices an optional kind's CRD
// installed since the last one, at the latest.
const optionalRediscovery = time.Minute

// New returns an Applier. It applies cfg.Default and validates the config.
func New(cfg Config) (*Applier, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("apply: invalid config: %w", err)
	}
	cfg.Kinds = slices.Clone(cfg.Kinds)
	r := rules{
		kinds:        map[schema.GroupVersionKind]bool{},
		groupKinds:   map[schema.GroupKind]bool{},
		maxBytes:     cfg.MaxObjectBytes,
		owner:        cfg.Owner,
		joinServices: cfg.LocalNetworks != nil,
	}
	for _, k := range cfg.Kinds {
		r.kinds[k] = true
		r.groupKinds[k.GroupKind()] = true
	}
	optional := map[schema.GroupVersionKind]bool{}
	for _, k := range cfg.OptionalKinds {
		optional[k] = true
	}
	return &Applier{cfg: cfg, rules: r, optional: optional, log: cfg.Logger.With("component", "apply")}, nil
}

// item is one object of the set on its way through Apply.
type item struct {
	*manifest
	result *relaypb.ObjectResult
}

// Apply makes the cluster match set and returns one result per object of
// the set, one per pruned object and one per allowed kind that could not be
// listed, sorted by apiVersion, kind, namespace and name. A failure of one
// object is a result with outcome "error"; Apply goes on with the others.
//
// It returns an error wrapping ErrSetRefused, and changes nothing, when the
// set is nil or holds more than MaxObjects objects.
func (a *Applier) Apply(ctx context.Context, set *relaypb.OutputSet) ([]*relaypb.ObjectResult, error) {
	if set == nil {
		return nil, fmt.Errorf("%w: no set", ErrSetRefused)
	}
	if n := len(set.GetObjects()); n > a.cfg.MaxObjects {
		a.log.Warn("output set refused", "version", set.GetVersion(), "objects", n, "maxObjects", a.cfg.MaxObjects)
		return nil, fmt.Errorf("%w: %d objects, at most %d", ErrSetRefused, n, a.cfg.MaxObjects)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	log := a.log.With("version", set.GetVersion())

	// 1. Check every manifest before the first write.
	items, keep, pruneBlocked := a.check(set)
	a.checkJoins(ctx, items, keep)

	// 2. Map and list every allowed kind.
	a.resetMapperIfStale()
	kinds := a.kinds(ctx)
	var results []*relaypb.ObjectResult
	for _, k := range kinds {
		if k.err != nil && !k.optionalUnserved {
			results = append(results, kindResult(k.gvk, k.err))
			log.Warn("kind skipped", "apiVersion", k.gvk.GroupVersion().String(), "kind", k.gvk.Kind, "error", k.err)
		}
	}

	// 3. Apply the valid objects.
	byGVK := map[schema.GroupVersionKind]*kindState{}
	for _, k := range kinds {
		byGVK[k.gvk] = k
	}
	for _, it := range items {
		// A set that names an object of an unserved optional kind makes
		// the next Apply look again at once: its CRD may be on its way.
		if k := byGVK[it.gvk]; it.obj != nil && k != nil && k.optionalUnserved {
			a.kindMissing = true
		}
	}
	parallel(len(items), func(i int) {
		it := items[i]
		if it.obj != nil {
			it.result.Outcome, it.result.Error = a.applyObject(ctx, byGVK[it.gvk], it)
		}
		logResult(log, it.result)
	})
	for _, it := range items {
		results = append(results, it.result)
	}

	// 4. Prune what the agent owns and the set does not name.
	if !pruneBlocked {
		results = append(results, a.prune(ctx, log, kinds, keep)...)
	}

	for _, r := range results {
		r.Error = truncate(r.Error)
	}
	slices.SortStableFunc(results, compareResults)
	logSummary(log, results)
	return results, nil
}

// check checks every manifest of set. It returns the items, the keys of
// every object the set names (valid or not: none of them may be pruned) and
// whether some manifest's identity could not be read, which blocks pruning.
func (a *Applier) check(set *relaypb.OutputSet) (items []*item, keep map[objectKey]bool, pruneBlocked bool) {
	keep = map[objectKey]bool{}
	first := map[objectKey]int{}
	for i, o := range set.GetObjects() {
		m := checkManifest(a.rules, o.GetManifest(), o.GetParents())
		if m.state == identityKnown {
			if j, dup := first[m.key]; dup {
				m.problems = append(m.problems, fmt.Sprintf("duplicate of object %d (same kind, namespace and name)", j))
				m.obj = nil
			} else {
				first[m.key] = i
			}
			keep[m.key] = true
		}
		it := &item{manifest: m, result: &relaypb.ObjectResult{
			ApiVersion: m.apiVersion, Kind: m.kind, Namespace: m.namespace, Name: m.name,
		}}
		if len(m.problems) > 0 {
			it.obj = nil
			it.result.Outcome = OutcomeError
			it.result.Error = fmt.Sprintf("object %d: %s", i, strings.Join(m.problems, "; "))
			if m.state == identityUnknown {
				pruneBlocked = true
				it.result.Error += "; its identity is unknown, so nothing was pruned for this set"
			}
		}
		items = append(items, it)
	}
	return items, keep, pruneBlocked
}

// kindResult reports an allowed kind the agent could not map or list.
func kindResult(gvk schema.GroupVersionKind, err error) *relaypb.ObjectResult {
	return &relaypb.ObjectResult{
		ApiVersion: gvk.GroupVersion().String(), Kind: gvk.Kind,
		Outcome: OutcomeError, Error: err.Error(),
	}
}

// parallel runs fn(0..n-1) on at most workers goroutines.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func compareResults(x, y *relaypb.ObjectResult) int {
	for _, c := range [][2]string{
		{x.GetApiVersion(), y.GetApiVersion()}, {x.GetKind(), y.GetKind()},
		{x.GetNamespace(), y.GetNamespace()}, {x.GetName(), y.GetName()},
	} {
		if n := strings.Compare(c[0], c[1]); n != 0 {
			return n
		}
	}
	return 0
}

// truncate bounds an error text, keeping it valid UTF-8.
func truncate(s string) string {
	if len(s) <= maxErrorBytes {
		return s
	}
	cut := maxErrorBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "… (truncated)"
}

func logResult(log *slog.Logger, r *relaypb.ObjectResult) {
	attrs := []any{"apiVersion", r.GetApiVersion(), "kind", r.GetKind(), "namespace", r.GetNamespace(), "name", r.GetName()}
	switch r.GetOutcome() {
	case OutcomeApplied:
		log.Info("applied", attrs...)
	case OutcomePruned:
		log.Info("pruned", attrs...)
	case OutcomeConflict:
		log.Warn("left untouched: exists and is not managed by relaymesh", attrs...)
	case OutcomeError:
		log.Warn("not applied", append(attrs, "error", truncate(r.GetError()))...)
	}
}

func logSummary(log *slog.Logger, results []*relaypb.ObjectResult) {
	counts := map[string]int{}
	for _, r := range results {
		counts[r.GetOutcome()]++
	}
	log.Info("output set applied",
		OutcomeApplied, counts[OutcomeApplied], OutcomeUnchanged, counts[OutcomeUnchanged],
		OutcomePruned, counts[OutcomePruned], OutcomeConflict, counts[OutcomeConflict],
		OutcomeError, counts[OutcomeError])
}
