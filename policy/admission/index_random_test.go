package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The index may skip a package only when evaluating it would give an empty
// deny set and no error. These tests generate rule sets mixing everything
// that decides that (equalities the index reads, guards on constants, calls
// that fail before or after them, negations, iteration, `with`, constants
// that are not constant, packages reading other packages' deny sets,
// packages below another package's rule) and hostile requests (values of
// the wrong type where a guard looks, near-miss strings, missing fields),
// and require Decide, which evaluates only the packages the index leaves,
// to return exactly the decision, denials and error of a query over every
// package (DecideAll).

// picker chooses among n things.
type picker interface{ pick(n int) int }

type randPicker struct{ r *rand.Rand }

func (p randPicker) pick(n int) int { return p.r.IntN(n) }

// bytePicker chooses by the bytes of a fuzz input, then 0 once they run out.
type bytePicker struct {
	b []byte
	i int
}

func (p *bytePicker) pick(n int) int {
	if p.i >= len(p.b) {
		return 0
	}
	p.i++
	return int(p.b[p.i-1]) % n
}

func oneOf[T any](p picker, xs ...T) T { return xs[p.pick(len(xs))] }

// regoString is s as a Rego string literal.
func regoString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

var (
	randomKinds      = []string{"TrafficPolicy", "AccessPolicy", "VirtualMesh", "VirtualDestination", "Secret"}
	randomNamespaces = []string{"team-a", "team-b", "kube-system", ""}
	randomModes      = []string{"strict", "open"}
)

// randomPackage is one generated package: relaymesh.admission.<name>.
type randomPackage struct {
	name string
	// team is the constant "team" of the package, if it defines one.
	team bool
}

// randomWorld returns rule sets of generated packages; each rule set
// holds one to three packages (files), each package one to three deny rules.
func randomWorld(p picker) []RuleSet {
	var sets []RuleSet
	var pkgs []randomPackage
	for s := range 1 + p.pick(6) {
		rs := RuleSet{Name: fmt.Sprintf("random/set-%d", s), Version: "1", Files: map[string]string{}}
		for f := range 1 + p.pick(3) {
			name := fmt.Sprintf("s%d_p%d", s, f)
			src, team := randomPackageSource(p, name, pkgs)
			rs.Files[name+".rego"] = src
			pkgs = append(pkgs, randomPackage{name: name, team: team})
			if p.pick(10) == 0 {
				// A package below this one, which the parent may
				// shadow with a rule of its own.
				sub, _ := randomPackageSource(p, name+".sub", pkgs)
				rs.Files[name+"_sub.rego"] = sub
				if p.pick(4) == 0 {
					rs.Files[name+"_shadow.rego"] = fmt.Sprintf("package relaymesh.admission.%s\n\nsub[x] := 1 if some x in input.object.spec.items\n", name)
				}
			}
		}
		sets = append(sets, rs)
	}
	return sets
}

// randomPackageSource returns the source of package name and whether it
// defines the constant team; rules may read the packages before it.
func randomPackageSource(p picker, name string, before []randomPackage) (string, bool) {
	var b strings.Builder
	fmt.Fprintf(&b, "package relaymesh.admission.%s\n\n", name)
	team := p.pick(3) != 0
	if team {
		fmt.Fprintf(&b, "team := %s\n\n", regoString(oneOf(p, randomNamespaces...)))
	}
	fmt.Fprintf(&b, "kind_c := %s\n\nlimit := 3\n\n", regoString(oneOf(p, randomKinds...)))
	// mode_c looks like a constant but is not: it depends on the input.
	fmt.Fprintf(&b, "mode_c := \"strict\" if input.operation == \"CREATE\"\n\nmode_c := \"open\" if input.operation == \"UPDATE\"\n\n")
	b.WriteString("helper if input.object.spec.ok == true\n\n")
	for r := range 1 + p.pick(3) {
		b.WriteString("deny contains msg if {\n")
		for range 1 + p.pick(4) {
			fmt.Fprintf(&b, "\t%s\n", randomExpr(p, team, before))
		}
		fmt.Fprintf(&b, "\tmsg := sprintf(\"%%v %s r%d\", [input.kind])\n}\n\n", name, r)
	}
	return b.String(), team
}

// randomExpr is one expression of a deny rule's body.
func randomExpr(p picker, team bool, before []randomPackage) string {
	ns := regoString(oneOf(p, randomNamespaces...))
	switch p.pick(24) {
	case 0, 1:
		return "input.kind == " + regoString(oneOf(p, randomKinds...))
	case 2:
		return ns + " == input.namespace"
	case 3:
		return "input.namespace = " + ns
	case 4, 5:
		if team {
			return oneOf(p, "input.namespace == team", "team == input.namespace", "input.namespace = team")
		}
		return "input.namespace == " + ns
	case 6:
		for _, o := range before {
			if o.team && p.pick(2) == 0 {
				return fmt.Sprintf("input.namespace == data.relaymesh.admission.%s.team", o.name)
			}
		}
		// A constant of a package that does not define it: undefined.
		return "input.namespace == data.relaymesh.admission.nowhere.team"
	case 7:
		return "input.kind == kind_c"
	case 8:
		return "input.object.spec.mode == " + regoString(oneOf(p, randomModes...))
	case 9:
		return oneOf(p, "input.object.spec.n == limit", "input.object.spec.n == 3", `input.object.spec.n == "3"`)
	case 10:
		return `input.namespaceLabels.env == "prod"`
	case 11:
		return "x := input.object.spec.mode\n\tx == " + regoString(oneOf(p, randomModes...))
	case 12:
		// Fails on "x", and on values of other types.
		return oneOf(p, "to_number(input.object.spec.replicas) > 3", "is_string(input.object.spec.replicas)")
	case 13:
		// Fails on a number.
		return oneOf(p, "count(input.object.spec.items) > 1", "is_array(input.object.spec.items)")
	case 14:
		return "not input.object.spec.ok == true"
	case 15:
		return `some item in input.object.spec.items
	item == "bad"`
	case 16:
		return "input.namespace == " + ns + " with input.namespace as " + regoString(oneOf(p, randomNamespaces...))
	case 17:
		if len(before) > 0 {
			return fmt.Sprintf("count(data.relaymesh.admission.%s.deny) > 0", oneOf(p, before...).name)
		}
		return "true"
	case 18:
		return `input.operation in {"CREATE", "UPDATE"}`
	case 19:
		return oneOf(p, `input.user.username == "alice"`, "input.user.groups[0] == "+ns)
	case 20:
		// Fails on a value that is not a string.
		return oneOf(p, `upper(input.object.spec.mode) == "STRICT"`, `is_string(input.object.spec.mode)`)
	case 21:
		return "input.object.spec.mode == mode_c"
	case 22:
		return "helper"
	default:
		return `input.object.metadata.labels["relaymesh.io/owner"] == ` + ns
	}
}

// randomRequest is a request with values of every type where rules look.
func randomRequest(p picker) Request {
	spec := map[string]any{}
	// set sets spec[key] to one of vals; absent leaves it out.
	set := func(key string, vals ...any) {
		if v := oneOf(p, vals...); v != absent {
			spec[key] = v
		}
	}
	set("mode", "strict", "open", "STRICT", int64(3), []any{"strict"}, map[string]any{"strict": true}, true, nil, absent)
	set("n", int64(3), json.Number("3.0"), json.Number("3e0"), "3", 3.5, nil, absent)
	set("replicas", "11", "x", int64(2), "5", int64(20), 3.5, nil, absent, absent, json.Number("1e400"))
	set("items", []any{}, []any{"bad"}, []any{"a", "b"}, "bad", int64(5), map[string]any{"bad": "bad"}, absent)
	set("ok", true, false, "true", absent)
	meta := map[string]any{"name": "obj"}
	if p.pick(2) == 0 {
		meta["labels"] = map[string]any{"relaymesh.io/owner": oneOf(p, randomNamespaces...)}
	}
	obj := map[string]any{"metadata": meta, "spec": spec}
	ns := oneOf(p, append(randomNamespaces, "TEAM-A", "team-a ", "team-a\u0000", "tëam-a", strings.Repeat("team-a", 100))...)
	req := Request{
		Operation: oneOf(p, OperationCreate, OperationUpdate, OperationDelete, OperationCreate),
		Kind:      oneOf(p, append(randomKinds, "trafficpolicy", "TrafficPolicy ", "Other")...),
		Namespace: ns, Name: "obj", Object: obj, OldObject: obj,
		User: User{Username: oneOf(p, "alice", "bob", ""), Groups: oneOf(p, []string{}, []string{"team-a"}, []string{ns, "team-b"})},
	}
	if p.pick(2) == 0 {
		req.NamespaceLabels = map[string]string{"env": oneOf(p, "prod", "dev", "")}
	}
	if req.Operation == OperationDelete && p.pick(2) == 0 {
		req.Object = nil
	}
	return req
}

// absent is the choice of leaving a field out.
var absent any = struct{ absent bool }{true}

// newWorldEngine returns an engine with the default rules alone, to which
// useWorld gives generated rule sets.
func newWorldEngine(t testing.TB) *Engine {
	t.Helper()
	e, err := New(Config{Recorder: audit.Discard, Timeout: time.Minute})
	require.NoError(t, err)
	return e
}

// useWorld puts the default rules and sets in force in e, compiled together
// without their self-tests (generated rules have none: the index must be
// right for whatever compiles); false if they do not compile together.
func useWorld(t testing.TB, e *Engine, sets []RuleSet) bool {
	t.Helper()
	next := map[string]*ruleSet{BuiltinRuleSet: e.sets[BuiltinRuleSet]}
	for _, rs := range sets {
		parsed, err := e.parse(rs)
		if err != nil {
			t.Logf("generated rule set %s does not parse: %v", rs.Name, err)
			return false
		}
		next[rs.Name] = parsed
	}
	st, err := e.prepare(next)
	if err != nil {
		return false
	}
	e.state.Store(st)
	return true
}

// indexStats counts what decisions did.
type indexStats struct {
	worlds, skippedWorlds                 int
	decisions, allowed, denied, failed    int
	candidates, evaluated, packagesPassed int
}

// checkSame requires Decide and DecideAll to agree on req, and counts.
func checkSame(t testing.TB, e *Engine, req Request, s *indexStats) {
	t.Helper()
	ctx := context.Background()
	want, wantErr := e.DecideAll(ctx, req)
	got, gotErr := e.Decide(ctx, req)
	if (wantErr == nil) != (gotErr == nil) || wantErr != nil && wantErr.Error() != gotErr.Error() {
		require.Failf(t, "errors differ", "request %+v\nevery package: %v\nindexed: %v", req, wantErr, gotErr)
	}
	require.Equal(t, want, got, "request %+v", req)
	if s == nil {
		return
	}
	s.decisions++
	switch {
	case gotErr != nil:
		s.failed++
	case got.Allowed:
		s.allowed++
	default:
		s.denied++
	}
	st := e.state.Load()
	if in, err := input(req); err == nil {
		r := &inputResolver{input: in}
		s.packagesPassed += len(st.pkgs)
		s.candidates += len(st.candidates(req.Kind))
		for _, i := range st.candidates(req.Kind) {
			if st.pkgs[i].mayDeny(r) {
				s.evaluated++
			}
		}
	}
}

// TestIndexedDecisionsRandom: for 40 generated worlds of rule sets and 150
// hostile requests each, Decide equals a query over every package (10
// worlds under -short, the fast tier; make test runs all 40).
func TestIndexedDecisionsRandom(t *testing.T) {
	var s indexStats
	e := newWorldEngine(t)
	worlds := uint64(40)
	if testing.Short() {
		worlds = 10
	}
	for seed := range worlds {
		p := randPicker{rand.New(rand.NewPCG(seed, 0x5eed))}
		sets := randomWorld(p)
		if !useWorld(t, e, sets) {
			s.skippedWorlds++
			continue
		}
		s.worlds++
		for range 150 {
			checkSame(t, e, randomRequest(p), &s)
		}
		if t.Failed() {
			for _, rs := range sets {
				for n, src := range rs.Files {
					t.Logf("seed %d, %s/%s:\n%s", seed, rs.Name, n, src)
				}
			}
			return
		}
	}
	t.Logf("%+v", s)
	// The corpus must exercise every outcome, and the index must both skip
	// packages and leave some to evaluate, or the test proves nothing.
	assert.GreaterOrEqual(t, s.worlds, int(worlds*3/4), "most generated worlds compile")
	assert.Positive(t, s.allowed)
	assert.Greater(t, s.denied, s.decisions/10)
	assert.Greater(t, s.failed, s.decisions/100)
	assert.Less(t, s.candidates, s.packagesPassed, "the kind leaves packages out")
	assert.Less(t, s.evaluated, s.candidates, "the index and the guards leave packages out")
	assert.Positive(t, s.evaluated)
}

// FuzzIndexedRules: for rule sets and a request generated from the fuzz
// input, Decide equals a query over every package.
func FuzzIndexedRules(f *testing.F) {
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 1))
		rules := make([]byte, 64)
		for i := range rules {
			rules[i] = byte(r.UintN(256))
		}
		f.Add(rules, []byte{byte(seed), byte(seed * 7), byte(seed * 13)}, []byte(`{"spec": {"mode": "strict", "n": 3, "items": ["bad"]}}`))
	}
	f.Add([]byte{5, 0, 0, 2, 4, 4, 1, 12, 2}, []byte{}, []byte(`{"spec": {"replicas": "x"}}`))
	e := newWorldEngine(f)
	// Compiling a world is most of an execution: keep the last one, which
	// mutations of the request alone reuse.
	var world string
	var have, worldOK bool
	f.Fuzz(func(t *testing.T, rules, req, obj []byte) {
		if !have || world != string(rules) {
			have, world, worldOK = true, string(rules), useWorld(t, e, randomWorld(&bytePicker{b: rules}))
		}
		if !worldOK {
			return
		}
		r := randomRequest(&bytePicker{b: req})
		var o map[string]any
		dec := json.NewDecoder(bytes.NewReader(obj))
		dec.UseNumber()
		if dec.Decode(&o) == nil && o != nil {
			r.Object, r.OldObject = o, o
		}
		checkSame(t, e, r, nil)
	})
}

// TestIndexedTimeoutFailsClosed: a package the index leaves out cannot make
// a decision wait, and one it keeps fails closed when its evaluation does
// not finish; a context already done fails before any lookup.
func TestIndexedTimeoutFailsClosed(t *testing.T) {
	e, err := New(Config{Recorder: audit.Discard})
	require.NoError(t, err)
	slow := RuleSet{Name: "ns/slow", Version: "1", Files: map[string]string{"slow.rego": `package relaymesh.admission.slow

deny contains "slow" if {
	input.namespace == "team-slow"
	some i in numbers.range(1, 3000)
	some j in numbers.range(1, 3000)
	some k in numbers.range(1, 3000)
	i * j * k == -1
}
`}}
	parsed, err := e.parse(slow)
	require.NoError(t, err)
	st, err := e.prepare(map[string]*ruleSet{BuiltinRuleSet: e.sets[BuiltinRuleSet], slow.Name: parsed})
	require.NoError(t, err)
	e.state.Store(st)
	req := Request{Operation: OperationCreate, Kind: "TrafficPolicy", Namespace: "elsewhere", Name: "n",
		Object: map[string]any{"spec": map[string]any{}}}
	d, err := e.Decide(context.Background(), req)
	require.NoError(t, err, "the slow package is not evaluated outside its namespace")
	assert.True(t, d.Allowed)

	req.Namespace = "team-slow"
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	d, err = e.Decide(ctx, req)
	require.ErrorIs(t, err, ErrCheckFailed)
	assert.False(t, d.Allowed)
	require.Len(t, d.Denials, 1)
	assert.Equal(t, EngineRule, d.Denials[0].Rule)

	// A context that is already done is refused before any lookup.
	done, stop := context.WithCancel(context.Background())
	stop()
	req.Namespace = "elsewhere"
	d, err = e.Decide(done, req)
	require.ErrorIs(t, err, ErrCheckFailed)
	assert.False(t, d.Allowed)
}

// TestIndexLookupNeverDrops: a resolver the index cannot read (every value
// unknown) keeps every package; an input that meets a rule's equalities and
// guards keeps it, one that misses them (other values, other types, a ref
// the rule needs undefined) leaves it out.
func TestIndexLookupNeverDrops(t *testing.T) {
	c := compiled(t, map[string]string{"p.rego": `package relaymesh.admission.p

deny contains "a" if input.kind == "A"

deny contains "b" if {
	input.namespace == "n"
	input.object.x > 1
}
`})
	p := denyPackageOf(c, pkgRef)
	require.NotNil(t, p.index)
	assert.True(t, p.mayDeny(unknownResolver{}))
	assert.True(t, p.mayDeny(&inputResolver{input: ast.MustParseTerm(`{"kind": "A"}`).Value}))
	assert.True(t, p.mayDeny(&inputResolver{input: ast.MustParseTerm(`{"namespace": "n", "object": {"x": 2}}`).Value}))
	assert.False(t, p.mayDeny(&inputResolver{input: ast.MustParseTerm(`{"namespace": "n"}`).Value}), "input.object.x must be defined")
	assert.False(t, p.mayDeny(&inputResolver{input: ast.MustParseTerm(`{"kind": "B", "namespace": "m"}`).Value}))
	assert.False(t, p.mayDeny(&inputResolver{input: ast.MustParseTerm(`{"kind": 1, "namespace": ["n"]}`).Value}))
}

type unknownResolver struct{}

func (unknownResolver) Resolve(ast.Ref) (ast.Value, error) { return nil, ast.UnknownValueErr{} }
