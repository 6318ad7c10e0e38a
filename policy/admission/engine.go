package admission

import (
	"context"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/audit"
)

// Operations a Request may carry.
const (
	OperationCreate = "CREATE"
	OperationUpdate = "UPDATE"
	OperationDelete = "DELETE"
)

// Defaults and bounds of Config.
const (
	DefaultTimeout         = 500 * time.Millisecond
	DefaultTestTimeout     = 5 * time.Second
	DefaultMaxRuleSets     = 100
	DefaultMaxRuleSetBytes = 256 << 10
	maxTimeout             = time.Minute
)

// Limits on one decision's input and output.
const (
	// MaxDepth is how deeply object and oldObject may nest (maps and lists).
	MaxDepth = 100
	// maxInputValues and maxInputBytes bound the values and string bytes
	// (keys included) of one input; the API server's own request limit
	// (3 MiB) keeps real objects far below them.
	maxInputValues = 1 << 20
	maxInputBytes  = 16 << 20
	// maxDenials and maxMessageLen bound what one decision reports.
	maxDenials    = 64
	maxMessageLen = 1 << 10
)

// EngineRule is the Denial.Rule of denials the engine itself produces
// (failed checks), as opposed to those of a rule set's package.
const EngineRule = "relaymesh.admission"

var (
	// ErrCheckFailed is wrapped by the error Decide returns when it could not
	// judge an object (bad input, evaluation error or timeout, audit
	// failure); the Decision it returns then denies.
	ErrCheckFailed = errors.New("admission: check failed")
	// ErrAlreadyStarted is returned by a second Loader.Start.
	ErrAlreadyStarted = errors.New("admission: loader already started")
)

// Config configures an Engine. Zero durations and limits mean the defaults.
type Config struct {
	// Recorder receives every decision. Required; audit.Discard is the
	// explicit opt-out.
	Recorder audit.Recorder
	// Timeout bounds one decision; default 500ms, at most a minute.
	Timeout time.Duration
	// TestTimeout bounds each test_ rule of a self-test; default 5s, at most
	// a minute.
	TestTimeout time.Duration
	// MaxRuleSets bounds the user rule sets in force; default 100.
	MaxRuleSets int
	// MaxRuleSetBytes bounds the Rego source of one rule set; default 256 KiB.
	MaxRuleSetBytes int
	// Registerer receives the engine's metrics; nil: they are kept but not
	// exported.
	Registerer prometheus.Registerer
	// Logger for operational logs (rule sets accepted and refused); default:
	// discard. Decisions go to Recorder, not here.
	Logger *slog.Logger
	// Clock stamps rule set statuses; default time.Now.
	Clock func() time.Time
}

// Validate reports every problem with c, each prefixed with its field path.
func (c Config) Validate() error {
	var errs []error
	if c.Recorder == nil {
		errs = append(errs, errors.New("recorder: required (audit.Discard opts out explicitly)"))
	}
	if c.Timeout < 0 || c.Timeout > maxTimeout {
		errs = append(errs, fmt.Errorf("timeout: %v is outside [0s, %v]", c.Timeout, maxTimeout))
	}
	if c.TestTimeout < 0 || c.TestTimeout > maxTimeout {
		errs = append(errs, fmt.Errorf("testTimeout: %v is outside [0s, %v]", c.TestTimeout, maxTimeout))
	}
	if c.MaxRuleSets < 0 {
		errs = append(errs, errors.New("maxRuleSets: must not be negative"))
	}
	if c.MaxRuleSetBytes < 0 {
		errs = append(errs, errors.New("maxRuleSetBytes: must not be negative"))
	}
	return errors.Join(errs...)
}

// Request is what is being admitted. See the package documentation for how
// it appears to rules.
type Request struct {
	// Operation is OperationCreate, OperationUpdate or OperationDelete.
	Operation string
	// Kind of the object, e.g. "AccessPolicy". Required.
	Kind string
	// Namespace and Name of the object.
	Namespace string
	Name      string
	// Object is the object as unstructured JSON (as decoded by
	// encoding/json or held by an unstructured.Unstructured). Required for
	// CREATE and UPDATE.
	Object map[string]any
	// OldObject is the previous object for UPDATE and the deleted one for
	// DELETE, if known.
	OldObject map[string]any
	// User is who asked.
	User User
	// NamespaceLabels are the labels of the object's namespace.
	NamespaceLabels map[string]string
	// Caller is who delivered the request when that is not the server
	// itself: the webhook's authenticated caller ("apiserver CN=…"), or
	// "unauthenticated <address>" when the webhook accepts callers without
	// a client certificate, whose User is then only a claim. Audited, not
	// given to the rules.
	Caller string
}

// User is the identity a request was made with.
type User struct {
	Username string
	Groups   []string
}

// Decision is the verdict on one Request.
type Decision struct {
	// Allowed is true if and only if there are no denials.
	Allowed bool
	// Denials are the deny messages of every rule that fired, sorted by rule
	// then message; at most 64, messages cut at 1 KiB.
	Denials []Denial
	// Version identifies the rule sets that decided (a hash of their names
	// and sources).
	Version string
}

// Denial is one deny message.
type Denial struct {
	// Rule is the package of the deny rule, e.g.
	// "relaymesh.admission.access_allow_all", or EngineRule when the check
	// itself failed.
	Rule string
	// Message is the rule's message.
	Message string
}

// Message joins the denials into one line for a user (kubectl shows it).
func (d Decision) Message() string {
	parts := make([]string, len(d.Denials))
	for i, den := range d.Denials {
		parts[i] = den.Message + " (" + den.Rule + ")"
	}
	return strings.Join(parts, "; ")
}

// Engine decides admission with the default rule set and the user rule sets
// loaded into it. It is safe for concurrent use: Decide never waits for
// Load, and sees either the rule sets before a Load or those after it.
type Engine struct {
	recorder        audit.Recorder
	timeout         time.Duration
	testTimeout     time.Duration
	maxRuleSets     int
	maxRuleSetBytes int
	log             *slog.Logger
	clock           func() time.Time
	metrics         *metrics

	state atomic.Pointer[state] // what Decide evaluates

	mu      sync.Mutex // serializes Load and guards the fields below
	sets    map[string]*ruleSet
	status  map[string]RuleSetStatus
	refused map[string]string // rule set name → hash of its last refused sources
	changed chan struct{}
}

// New validates cfg and returns an Engine with the default rule set, which
// it self-tests first.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("admission config: %w", err)
	}
	e := &Engine{
		recorder: cfg.Recorder, timeout: cfg.Timeout, testTimeout: cfg.TestTimeout,
		maxRuleSets: cfg.MaxRuleSets, maxRuleSetBytes: cfg.MaxRuleSetBytes, log: cfg.Logger, clock: cfg.Clock,
		status: map[string]RuleSetStatus{}, refused: map[string]string{}, changed: make(chan struct{}),
	}
	if e.timeout == 0 {
		e.timeout = DefaultTimeout
	}
	if e.testTimeout == 0 {
		e.testTimeout = DefaultTestTimeout
	}
	if e.maxRuleSets == 0 {
		e.maxRuleSets = DefaultMaxRuleSets
	}
	if e.maxRuleSetBytes == 0 {
		e.maxRuleSetBytes = DefaultMaxRuleSetBytes
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.log = e.log.With("component", "admission")
	if e.clock == nil {
		e.clock = time.Now
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("admission metrics: %w", err)
	}
	e.metrics = m

	builtin, err := defaultRuleSet()
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	compiled, err := e.check(ctx, builtin)
	if err != nil {
		return nil, fmt.Errorf("admission: the default rule set is broken: %w", err)
	}
	e.sets = map[string]*ruleSet{BuiltinRuleSet: compiled}
	st, err := e.prepare(e.sets)
	if err != nil {
		return nil, fmt.Errorf("admission: the default rule set is broken: %w", err)
	}
	e.state.Store(st)
	e.status[BuiltinRuleSet] = RuleSetStatus{Name: BuiltinRuleSet, State: StateAccepted, Time: e.clock(),
		Version: builtin.Version, ActiveVersion: builtin.Version}
	e.updateGauges()
	return e, nil
}

// Version identifies the rule sets in force (Decision.Version).
func (e *Engine) Version() string { return e.state.Load().version }

// Changed returns a channel that is closed at the next change of the rule
// sets in force. Take it before reading what depends on them, then wait:
//
//	for { ch := e.Changed(); recheck(); <-ch }
func (e *Engine) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

// Decide judges req by every deny rule in force (evaluating those that may
// deny it, see index.go) and records the decision in the audit log.
//
// It fails closed: when it cannot judge req, or cannot record the decision,
// it returns a Decision that denies (Allowed false, a Denial with Rule
// EngineRule saying the admission check failed) together with an error
// wrapping ErrCheckFailed. It never returns Allowed true with an error.
func (e *Engine) Decide(ctx context.Context, req Request) (Decision, error) {
	start := time.Now()
	st := e.state.Load()
	d, err := e.evaluate(ctx, st, req, denials)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrCheckFailed, err)
		d = failed(st.version, err)
	}
	if rerr := e.record(req, d, err); rerr != nil {
		rerr = fmt.Errorf("%w: the decision could not be recorded in the audit log: %w", ErrCheckFailed, rerr)
		d = failed(st.version, rerr)
		err = errors.Join(err, rerr)
	}
	result := "allowed"
	switch {
	case err != nil:
		result = "error"
	case !d.Allowed:
		result = "denied"
	}
	e.metrics.decided(req.Kind, result, time.Since(start))
	return d, err
}

// failed is the denial for a check that could not be completed.
func failed(version string, err error) Decision {
	return Decision{Version: version, Denials: []Denial{{Rule: EngineRule,
		Message: text.Truncate("admission check failed, the object is refused: "+err.Error(), maxMessageLen)}}}
}

// denyFunc adds to d the denials of the rules of st for the input in of an
// object of kind.
type denyFunc func(ctx context.Context, st *state, kind string, in ast.Value, d *Decision) error

func (e *Engine) evaluate(ctx context.Context, st *state, req Request, deny denyFunc) (Decision, error) {
	switch req.Operation {
	case OperationCreate, OperationUpdate:
		if req.Object == nil {
			return Decision{}, fmt.Errorf("malformed request: %s without an object", req.Operation)
		}
	case OperationDelete:
	default:
		return Decision{}, fmt.Errorf("malformed request: operation %q is not CREATE, UPDATE or DELETE", text.Truncate(req.Operation, 32))
	}
	if req.Kind == "" {
		return Decision{}, errors.New("malformed request: no kind")
	}
	in, err := input(req)
	if err != nil {
		return Decision{}, fmt.Errorf("malformed request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	d := Decision{Version: st.version}
	if err := deny(ctx, st, req.Kind, in, &d); err != nil {
		if ctx.Err() != nil {
			return Decision{}, fmt.Errorf("evaluation did not finish within %v: %w", e.timeout, err)
		}
		return Decision{}, fmt.Errorf("evaluation: %w", err)
	}
	sort.Slice(d.Denials, func(i, j int) bool {
		a, b := d.Denials[i], d.Denials[j]
		return a.Rule < b.Rule || a.Rule == b.Rule && a.Message < b.Message
	})
	if n := len(d.Denials); n > maxDenials {
		d.Denials = append(d.Denials[:maxDenials-1], Denial{Rule: EngineRule, Message: fmt.Sprintf("and %d more denials", n-maxDenials+1)})
	}
	d.Allowed = len(d.Denials) == 0
	return d, nil
}

// denials is the denyFunc of Decide: it evaluates only the packages that
// may deny in, whose deny rules OPA's index and their guards leave to
// evaluate; the others' deny sets are empty (index.go).
func denials(ctx context.Context, st *state, kind string, in ast.Value, d *Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := &inputResolver{input: in}
	var pkgs []int
	for _, i := range st.candidates(kind) {
		if st.pkgs[i].mayDeny(r) {
			pkgs = append(pkgs, i)
		}
	}
	if len(pkgs) == 0 {
		return nil
	}
	return st.evaluate(ctx, in, pkgs, d)
}

// record writes d to the audit log.
func (e *Engine) record(req Request, d Decision, checkErr error) error {
	ev := audit.Event{
		Type:    audit.AdmissionDecision,
		Result:  audit.ResultSuccess,
		Subject: clean(req.User.Username),
		Details: map[string]string{
			"operation": clean(req.Operation),
			"kind":      clean(req.Kind),
			"namespace": clean(req.Namespace),
			"name":      clean(req.Name),
			"ruleset":   d.Version,
		},
	}
	if req.Caller != "" {
		ev.Details["caller"] = clean(req.Caller)
	}
	if !d.Allowed {
		ev.Result = audit.ResultFailure
		ev.Reason = "denied by admission rules"
		var rules []string
		for _, den := range d.Denials {
			if len(rules) == 0 || rules[len(rules)-1] != den.Rule {
				rules = append(rules, den.Rule)
			}
		}
		ev.Details["rules"] = clean(strings.Join(rules, ","))
	}
	if checkErr != nil {
		ev.Reason = "admission check failed"
		ev.Details["error"] = clean(checkErr.Error())
	}
	return e.recorder.Record(ev)
}
