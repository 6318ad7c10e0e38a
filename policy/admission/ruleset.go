package admission

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"io/fs"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
)

// BuiltinRuleSet is the name of the default rule set, embedded in the binary.
const BuiltinRuleSet = "builtin"

// rulesPrefix is the package every rule file must be below.
var rulesPrefix = ast.MustParseRef("data.relaymesh.admission")

//go:embed rules/*.rego
var builtinRules embed.FS

// RuleSet is one unit of rules: the default one, or every .rego file of one
// ConfigMap. It is accepted or refused as a whole.
type RuleSet struct {
	// Name identifies the rule set, "namespace/name" for a ConfigMap. Names
	// are unique; BuiltinRuleSet is reserved.
	Name string
	// Version is the caller's version of it (a ConfigMap's
	// resourceVersion), reported in RuleSetStatus.
	Version string
	// Files maps file names to Rego source.
	Files map[string]string
}

// RuleSetState says whether a rule set was accepted.
type RuleSetState string

// Rule set states; also the values of the state label of the
// relaymesh_admission_rulesets metric.
const (
	StateAccepted RuleSetState = "accepted"
	StateRefused  RuleSetState = "refused"
)

// RuleSetStatus is the outcome of the last load of one rule set.
type RuleSetStatus struct {
	Name string
	// State of the latest version seen.
	State RuleSetState
	// Error says why it was refused: the file, the compile error or the
	// failing tests.
	Error string
	// Time the state was decided.
	Time time.Time
	// Version is the latest version seen, the one State is about.
	Version string
	// ActiveVersion is the version in force: Version when accepted, the last
	// accepted version when refused, "" when no version was ever accepted.
	ActiveVersion string
}

// ruleSet is a parsed, self-tested rule set.
type ruleSet struct {
	name, version, hash string
	modules             map[string]*ast.Module // by "<rule set>/<file>"
	packages            []ast.Ref              // distinct, sorted
	denies              []ast.Ref              // packages with deny rules, sorted
}

// state is what Decide evaluates: every accepted rule set, compiled
// together, and what decides which of its deny packages a decision
// evaluates (index.go).
type state struct {
	version  string
	compiler *ast.Compiler
	store    storage.Store // OPA's store of base documents: empty
	pkgs     []denyPackage // every package with deny rules, sorted
	// all is every package, kinds the packages that may deny an object of
	// each kind of judgedKinds; positions in pkgs, ascending.
	all   []int
	kinds map[string][]int
}

// candidates returns the packages that may deny an object of kind.
func (st *state) candidates(kind string) []int {
	if c, ok := st.kinds[kind]; ok {
		return c
	}
	return st.all
}

// refusal is why a rule set was refused; transient ones (the load was
// cancelled, or the rule set clashes with others or the limit) are tried
// again on the next Load even if its sources did not change.
type refusal struct {
	err       error
	transient bool
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

func defaultRuleSet() (RuleSet, error) {
	rs := RuleSet{Name: BuiltinRuleSet, Files: map[string]string{}}
	names, err := fs.Glob(builtinRules, "rules/*.rego")
	if err != nil {
		return rs, err
	}
	for _, n := range names {
		b, err := builtinRules.ReadFile(n)
		if err != nil {
			return rs, err
		}
		rs.Files[path.Base(n)] = string(b)
	}
	rs.Version = hashFiles(rs.Files)[:12]
	return rs, nil
}

// hashFiles is a hex SHA-256 over the file names and sources.
func hashFiles(files map[string]string) string {
	h := sha256.New()
	for _, n := range slices.Sorted(maps.Keys(files)) {
		fmt.Fprintf(h, "%d:%s%d:%s", len(n), n, len(files[n]), files[n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// check parses rs, checks its packages and deny rules, and runs its tests.
func (e *Engine) check(ctx context.Context, rs RuleSet) (*ruleSet, error) {
	out, err := e.parse(rs)
	if err != nil {
		return nil, err
	}
	if err := e.selfTest(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (e *Engine) parse(rs RuleSet) (*ruleSet, error) {
	size := 0
	for n, src := range rs.Files {
		size += len(n) + len(src)
	}
	if size > e.maxRuleSetBytes {
		return nil, fmt.Errorf("%d bytes of Rego, at most %d", size, e.maxRuleSetBytes)
	}
	if len(rs.Files) == 0 {
		return nil, errors.New("no .rego files")
	}
	out := &ruleSet{name: rs.Name, version: rs.Version, hash: hashFiles(rs.Files), modules: map[string]*ast.Module{}}
	seen := map[string]bool{}
	var errs []error
	for _, n := range slices.Sorted(maps.Keys(rs.Files)) {
		file := rs.Name + "/" + n
		mod, err := ast.ParseModuleWithOpts(file, rs.Files[n], ast.ParserOptions{RegoVersion: ast.RegoV1, Capabilities: capabilities()})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if mod == nil {
			errs = append(errs, fmt.Errorf("%s: no package", file))
			continue
		}
		pkg := mod.Package.Path
		if !pkg.HasPrefix(rulesPrefix) || len(pkg) <= len(rulesPrefix) {
			errs = append(errs, fmt.Errorf("%s: package %s is not below relaymesh.admission", file, strings.TrimPrefix(pkg.String(), "data.")))
			continue
		}
		hasDeny := false
		for _, r := range mod.Rules {
			ref := r.Head.Ref()
			if !ref[0].Equal(ast.VarTerm("deny")) {
				continue
			}
			if len(ref) != 1 || r.Head.Key == nil || r.Head.Value != nil || len(r.Head.Args) > 0 || r.Default {
				errs = append(errs, fmt.Errorf("%s:%d: deny must be a multi-value rule: deny contains msg if { ... }", file, r.Location.Row))
				continue
			}
			hasDeny = true
		}
		out.modules[file] = mod
		if !seen[pkg.String()] {
			seen[pkg.String()] = true
			out.packages = append(out.packages, pkg)
		}
		if hasDeny && !slices.ContainsFunc(out.denies, func(r ast.Ref) bool { return r.Equal(pkg) }) {
			out.denies = append(out.denies, pkg)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sortRefs(out.packages)
	sortRefs(out.denies)
	return out, nil
}

func sortRefs(refs []ast.Ref) {
	sort.Slice(refs, func(i, j int) bool { return refs[i].Compare(refs[j]) < 0 })
}

// maxSelfTest bounds the whole self-test of one rule set.
const maxSelfTest = 30 * time.Second

// selfTest compiles rs on its own and runs its test_ rules: all must pass,
// and there must be at least one.
func (e *Engine) selfTest(ctx context.Context, rs *ruleSet) error {
	tctx, cancel := context.WithTimeout(ctx, maxSelfTest)
	defer cancel()
	ch, err := tester.NewRunner().
		SetCompiler(newCompiler()).
		SetModules(rs.modules).
		SetTimeout(e.testTimeout).
		RaiseBuiltinErrors(true).
		RunTests(tctx, nil)
	if err != nil {
		return explainRemoved(fmt.Errorf("compile: %w", err))
	}
	passed := 0
	var failures []string
	for r := range ch {
		switch {
		case r.Skip:
		case r.Error != nil:
			failures = append(failures, fmt.Sprintf("%s: %s.%s: error: %v", where(r.Location), strings.TrimPrefix(r.Package, "data."), r.Name, r.Error))
		case r.Fail:
			failures = append(failures, fmt.Sprintf("%s: %s.%s: failed", where(r.Location), strings.TrimPrefix(r.Package, "data."), r.Name))
		default:
			passed++
		}
	}
	if err := ctx.Err(); err != nil {
		return &refusal{err: fmt.Errorf("self-test interrupted: %w", err), transient: true}
	}
	if tctx.Err() != nil {
		return fmt.Errorf("the self-test took longer than %v", maxSelfTest)
	}
	if len(failures) > 0 {
		sort.Strings(failures)
		return fmt.Errorf("%d of %d tests failed: %s", len(failures), len(failures)+passed, strings.Join(failures, "; "))
	}
	if passed == 0 {
		return errors.New("no test_ rules: a rule set must test itself (test_ rules that pass)")
	}
	return nil
}

func where(loc *ast.Location) string {
	if loc == nil {
		return "?"
	}
	return fmt.Sprintf("%s:%d", loc.File, loc.Row)
}

// prepare compiles every rule set of sets together and works out which of
// their deny packages a decision evaluates (index.go).
func (e *Engine) prepare(sets map[string]*ruleSet) (*state, error) {
	modules := map[string]*ast.Module{}
	var denies []ast.Ref
	h := sha256.New()
	for _, n := range slices.Sorted(maps.Keys(sets)) {
		s := sets[n]
		maps.Copy(modules, s.modules)
		denies = append(denies, s.denies...)
		fmt.Fprintf(h, "%d:%s%s", len(n), n, s.hash)
	}
	sortRefs(denies)
	if len(denies) == 0 {
		return nil, errors.New("no deny rules")
	}
	c := newCompiler()
	if c.Compile(modules); c.Failed() {
		return nil, fmt.Errorf("compile: %w", c.Errors)
	}
	st := &state{version: hex.EncodeToString(h.Sum(nil))[:16], compiler: c, store: inmem.New(),
		pkgs: make([]denyPackage, len(denies)), all: make([]int, len(denies)), kinds: map[string][]int{}}
	for i, pkg := range denies {
		st.pkgs[i] = denyPackageOf(c, pkg)
		st.all[i] = i
	}
	for _, kind := range judgedKinds {
		r := &kindResolver{kind: ast.String(kind)}
		for i := range st.pkgs {
			if st.pkgs[i].mayDeny(r) {
				st.kinds[kind] = append(st.kinds[kind], i)
			}
		}
	}
	return st, nil
}

// Load makes sets the user rule sets, replacing all earlier ones: rule sets
// missing from sets are removed, new and changed ones are self-tested and
// compiled with the rest. A changed rule set that is refused keeps its last
// accepted version in force. Load returns the status of every rule set.
func (e *Engine) Load(ctx context.Context, sets []RuleSet) []RuleSetStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.clock()
	desired := map[string]RuleSet{}
	for _, s := range sets {
		if s.Name == "" || s.Name == BuiltinRuleSet {
			e.log.Warn("admission rule set with a reserved name ignored", "ruleset", s.Name)
			continue
		}
		if _, dup := desired[s.Name]; dup {
			e.log.Warn("admission rule set listed twice; the first is used", "ruleset", s.Name)
			continue
		}
		desired[s.Name] = s
	}
	base := map[string]*ruleSet{} // what stays in force unless replaced
	for n, s := range e.sets {
		if _, ok := desired[n]; ok || n == BuiltinRuleSet {
			base[n] = s
		}
	}
	for n := range e.status {
		if _, ok := desired[n]; !ok && n != BuiltinRuleSet {
			delete(e.status, n)
			delete(e.refused, n)
		}
	}

	// Parse and self-test what changed.
	var candidates []*ruleSet
	for _, n := range slices.Sorted(maps.Keys(desired)) {
		s := desired[n]
		h := hashFiles(s.Files)
		if cur, ok := base[n]; ok && cur.hash == h {
			// The sources in force: a new version with the same sources, or
			// a return to them after a refused change.
			if st := e.status[n]; st.State != StateAccepted || st.Version != s.Version {
				cur.version = s.Version
				if st.State != StateAccepted {
					st.Time = now
				}
				e.status[n] = RuleSetStatus{Name: n, State: StateAccepted, Time: st.Time, Version: s.Version, ActiveVersion: s.Version}
				delete(e.refused, n)
			}
			continue
		}
		if e.refused[n] == h {
			st := e.status[n]
			st.Version = s.Version
			e.status[n] = st
			continue
		}
		c, err := e.check(ctx, s)
		if err != nil {
			e.refuse(s, h, err, now)
			continue
		}
		candidates = append(candidates, c)
	}

	// Packages must not overlap; the user rule sets in force keep their
	// place under the limit, new ones take free places in name order.
	next := maps.Clone(base)
	var accepted []*ruleSet
	for _, c := range candidates {
		if err := overlap(c, next); err != nil {
			e.refuse(RuleSet{Name: c.name, Version: c.version}, c.hash, &refusal{err: err, transient: true}, now)
			continue
		}
		if _, replacing := next[c.name]; !replacing && len(next)-1 >= e.maxRuleSets {
			e.refuse(RuleSet{Name: c.name, Version: c.version}, c.hash, &refusal{err: fmt.Errorf("%d user rule sets are in force, at most %d", len(next)-1, e.maxRuleSets), transient: true}, now)
			continue
		}
		next[c.name] = c
		accepted = append(accepted, c)
	}

	st, err := e.prepare(next)
	if err != nil && len(accepted) > 0 {
		// Together they do not compile: add them one at a time to find the
		// rule sets at fault.
		e.log.Warn("admission rule sets do not compile together; adding them one by one", "error", err)
		next = maps.Clone(base)
		kept := accepted[:0]
		for _, c := range accepted {
			prev, had := next[c.name]
			next[c.name] = c
			if _, err := e.prepare(next); err != nil {
				e.refuse(RuleSet{Name: c.name, Version: c.version}, c.hash, &refusal{err: fmt.Errorf("does not compile with the other rule sets: %w", err), transient: true}, now)
				if had {
					next[c.name] = prev
				} else {
					delete(next, c.name)
				}
				continue
			}
			kept = append(kept, c)
		}
		accepted = kept
		st, err = e.prepare(next)
	}
	if err != nil {
		e.log.Error("admission rule sets do not compile; the previous ones stay in force", "error", err)
		for _, c := range accepted {
			e.refuse(RuleSet{Name: c.name, Version: c.version}, c.hash, &refusal{err: err, transient: true}, now)
		}
		e.updateGauges()
		return e.statusLocked()
	}
	for _, c := range accepted {
		delete(e.refused, c.name)
		e.status[c.name] = RuleSetStatus{Name: c.name, State: StateAccepted, Time: now, Version: c.version, ActiveVersion: c.version}
		e.log.Info("admission rule set accepted", "ruleset", c.name, "version", c.version)
	}
	e.sets = next
	if old := e.state.Swap(st); old.version != st.version {
		close(e.changed)
		e.changed = make(chan struct{})
		e.log.Info("admission rules in force changed", "version", st.version, "rulesets", len(next))
	}
	e.updateGauges()
	return e.statusLocked()
}

// refuse records that version s.Version of a rule set was refused.
func (e *Engine) refuse(s RuleSet, hash string, err error, now time.Time) {
	var r *refusal
	if errors.As(err, &r) && r.transient {
		delete(e.refused, s.Name)
	} else {
		e.refused[s.Name] = hash
	}
	active := ""
	if cur, ok := e.sets[s.Name]; ok {
		active = cur.version
	}
	msg := text.Truncate(fmt.Sprintf("rule set %s: %v", s.Name, err), 8<<10)
	e.status[s.Name] = RuleSetStatus{Name: s.Name, State: StateRefused, Error: msg, Time: now, Version: s.Version, ActiveVersion: active}
	e.metrics.reloadFailures.Inc()
	e.log.Warn("admission rule set refused; its last accepted version, if any, stays in force",
		"ruleset", s.Name, "version", s.Version, "active_version", active, "error", msg)
}

// overlap reports a package of c that is, contains or lies within a package
// of another rule set in sets.
func overlap(c *ruleSet, sets map[string]*ruleSet) error {
	for _, n := range slices.Sorted(maps.Keys(sets)) {
		if n == c.name {
			continue
		}
		for _, p := range c.packages {
			for _, q := range sets[n].packages {
				if p.HasPrefix(q) || q.HasPrefix(p) {
					return fmt.Errorf("package %s overlaps package %s of rule set %s",
						strings.TrimPrefix(p.String(), "data."), strings.TrimPrefix(q.String(), "data."), n)
				}
			}
		}
	}
	return nil
}

// Status returns the status of every rule set, the default one included,
// sorted by name.
func (e *Engine) Status() []RuleSetStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.statusLocked()
}

func (e *Engine) statusLocked() []RuleSetStatus {
	out := make([]RuleSetStatus, 0, len(e.status))
	for _, n := range slices.Sorted(maps.Keys(e.status)) {
		out = append(out, e.status[n])
	}
	return out
}

func (e *Engine) updateGauges() {
	counts := map[RuleSetState]int{}
	for _, s := range e.status {
		counts[s.State]++
	}
	e.metrics.ruleSets.WithLabelValues(string(StateAccepted)).Set(float64(counts[StateAccepted]))
	e.metrics.ruleSets.WithLabelValues(string(StateRefused)).Set(float64(counts[StateRefused]))
}
