package admission_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trickyRuleSets exercise what decides whether a decision evaluates a
// package: rules for every kind, guards (constants compared with the
// input), expressions that fail before or after a guard, and what only
// looks like a guard.
func trickyRuleSets() []admission.RuleSet {
	return []admission.RuleSet{
		single("ns/every-kind", `package relaymesh.admission.every_kind

deny contains msg if {
	input.object.metadata.labels.frozen == "true"
	msg := sprintf("%s %s/%s is frozen", [input.kind, input.namespace, input.name])
}

test_frozen if {
	count(deny) == 1 with input as {"kind": "X", "namespace": "a", "name": "b", "object": {"metadata": {"labels": {"frozen": "true"}}}}
}
`),
		// An expression that fails with an error comes before the guard:
		// the rule fails in every namespace.
		single("ns/error-first", `package relaymesh.admission.error_first

team := "team-err"

deny contains "too many replicas" if {
	to_number(input.object.spec.replicas) > 10
	input.namespace == team
}

test_many if {
	count(deny) == 1 with input as {"namespace": "team-err", "object": {"spec": {"replicas": "11"}}}
}
`),
		// The guard comes first: the rule fails only in its namespace.
		single("ns/guard-first", `package relaymesh.admission.guard_first

team := "team-guard"

deny contains "too many replicas" if {
	input.namespace == team
	to_number(input.object.spec.replicas) > 10
}

test_many if {
	count(deny) == 1 with input as {"namespace": "team-guard", "object": {"spec": {"replicas": "11"}}}
}
`),
		// team is not a constant: two conditional definitions.
		single("ns/not-constant", `package relaymesh.admission.not_constant

team := "team-a" if input.operation == "CREATE"

team := "team-b" if input.operation == "UPDATE"

deny contains "flag" if {
	input.namespace == team
	input.object.spec.flag == true
}

test_flag if {
	count(deny) == 1 with input as {"operation": "UPDATE", "namespace": "team-b", "object": {"spec": {"flag": true}}}
}
`),
		// Negated, or under with: not guards.
		single("ns/not-guards", `package relaymesh.admission.not_guards

team := "team-07"

deny contains "outside" if {
	not input.namespace == team
	input.object.spec.outside == true
}

deny contains "with" if {
	input.namespace == team with input.namespace as "team-07"
	input.object.spec.with == true
}

test_outside if {
	count(deny) == 1 with input as {"namespace": "x", "object": {"spec": {"outside": true}}}
}

test_with if {
	count(deny) == 1 with input as {"namespace": "x", "object": {"spec": {"with": true}}}
}
`),
		// Guards on a constant of another package, and on the kind.
		single("ns/shared", `package relaymesh.admission.shared

kind := "TrafficPolicy"

deny contains "shared" if {
	input.kind == kind
	input.namespace == data.relaymesh.admission.guard_first.team
	input.object.spec.shared == true
}

test_shared if {
	count(deny) == 1 with input as {"kind": "TrafficPolicy", "namespace": "team-guard", "object": {"spec": {"shared": true}}}
		with data.relaymesh.admission.guard_first.team as "team-guard"
}
`),
		// A package reading another's deny set.
		single("ns/echo", `package relaymesh.admission.echo

deny contains msg if {
	some m in data.relaymesh.admission.every_kind.deny
	msg := concat(" ", ["echo:", m])
}

test_echo if {
	count(deny) == 1 with data.relaymesh.admission.every_kind.deny as {"x"}
}
`),
		// A number constant, compared with whatever the input holds.
		single("ns/numbers", `package relaymesh.admission.numbers

limit := 3

deny contains "three" if input.object.spec.n == limit

test_three if {
	count(deny) == 1 with input as {"object": {"spec": {"n": 3.0}}}
}
`),
	}
}

// patient gives decisions a minute: on a loaded machine a query over every
// package may take longer than the default 500ms, and then fails.
func patient(c *admission.Config) { c.Timeout = time.Minute }

// indexedEngine is an engine with the fleet's 100 rule sets and the tricky
// ones in force.
func indexedEngine(t testing.TB) *admission.Engine {
	t.Helper()
	e, _ := newEngine(t, func(c *admission.Config) { patient(c); c.MaxRuleSets = 200 })
	for _, s := range e.Load(context.Background(), append(fleetRuleSets(100), trickyRuleSets()...)) {
		require.Equal(t, admission.StateAccepted, s.State, "%s: %s", s.Name, s.Error)
	}
	return e
}

// sameDecision requires Decide and DecideAll to agree on req.
func sameDecision(t *testing.T, e *admission.Engine, req admission.Request) admission.Decision {
	t.Helper()
	want, wantErr := e.DecideAll(context.Background(), req)
	got, gotErr := e.Decide(context.Background(), req)
	if wantErr != nil {
		require.Error(t, gotErr, "%s %s/%s: a query over every package fails: %v", req.Kind, req.Namespace, req.Name, wantErr)
		assert.Equal(t, wantErr.Error(), gotErr.Error())
	} else {
		require.NoError(t, gotErr)
	}
	require.Equal(t, want, got, "%s %s %s/%s", req.Operation, req.Kind, req.Namespace, req.Name)
	return got
}

// TestIndexedDecisionsMatchAll: deciding from the packages that may deny
// gives the decisions, messages and errors of a query over every package.
func TestIndexedDecisionsMatchAll(t *testing.T) {
	e := indexedEngine(t)
	tweaks := []map[string]any{
		nil,
		{"replicas": "11", "flag": true, "n": int64(3)},
		{"replicas": "many", "outside": true, "shared": true},
		{"with": true, "n": "3", "policy": map[string]any{"retries": map[string]any{"attempts": int64(50)}, "requestTimeout": "10m"}},
		{"allowedMethods": []any{"GET", "DELETE"}, "allowedPorts": []any{int64(22)},
			"mtls": map[string]any{}, "federation": map[string]any{"hostnameSuffix": "example.com"},
			"hostname": "reviews.example", "port": map[string]any{"number": int64(80), "protocol": "mongo"}},
		{"replicas": "11", "shared": true, "with": true},
	}
	// Under -short every fifth combination (5 is prime to the counts of
	// tweaks and operations, so each base, namespace, operation and tweak
	// still occurs); make test decides them all.
	every := 1
	if testing.Short() {
		every = 5
	}
	var denied, failed, decisions, combination int
	for _, base := range append(fleetRequests(), request("Secret", map[string]any{})) {
		for _, ns := range []string{"team-07", "team-err", "team-guard", "team-b", "elsewhere"} {
			for _, op := range []string{admission.OperationCreate, admission.OperationUpdate, admission.OperationDelete} {
				for i, tweak := range tweaks {
					if combination++; combination%every != 0 {
						continue
					}
					req := withChanges(base, ns, op, tweak, i%2 == 0)
					d := sameDecision(t, e, req)
					decisions++
					switch {
					case len(d.Denials) == 1 && d.Denials[0].Rule == admission.EngineRule:
						failed++
					case !d.Allowed:
						denied++
					}
				}
			}
		}
	}
	t.Logf("%d decisions: %d denied, %d failed", decisions, denied, failed)
	assert.Greater(t, denied, decisions/4, "the corpus exercises denials")
	assert.Positive(t, failed, "the corpus exercises failures")
}

// withChanges is base in namespace ns under operation op, its spec merged
// with tweak, labelled frozen if frozen.
func withChanges(base admission.Request, ns, op string, tweak map[string]any, frozen bool) admission.Request {
	obj := cloneJSON(base.Object)
	spec, _ := obj["spec"].(map[string]any)
	maps.Copy(spec, cloneJSON(tweak))
	meta := obj["metadata"].(map[string]any)
	meta["namespace"] = ns
	if frozen {
		labels, _ := meta["labels"].(map[string]any)
		if labels == nil {
			labels = map[string]any{}
			meta["labels"] = labels
		}
		labels["frozen"] = "true"
	}
	req := base
	req.Namespace, req.Operation, req.Object, req.OldObject = ns, op, obj, nil
	switch op {
	case admission.OperationUpdate:
		req.OldObject = cloneJSON(base.Object)
	case admission.OperationDelete:
		req.Object, req.OldObject = nil, obj
	}
	return req
}

func cloneJSON(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out map[string]any
	if err := dec.Decode(&out); err != nil {
		panic(err)
	}
	return out
}

// TestIndexedDecisions: what the indexing must not change, case by case.
func TestIndexedDecisions(t *testing.T) {
	ctx := context.Background()

	t.Run("a rule set with no kind judges every kind", func(t *testing.T) {
		e, _ := newEngine(t, patient)
		e.Load(ctx, []admission.RuleSet{ruleSet("ns/any", "any_kind", "forbidden")})
		for _, kind := range []string{"TrafficPolicy", "AccessPolicy", "VirtualMesh", "VirtualDestination", "Secret"} {
			d := sameDecision(t, e, request(kind, map[string]any{"forbidden": true,
				"sourceSelector": []any{map[string]any{"kubeIdentityMatcher": map[string]any{"namespaces": []any{"a"}}}}}))
			require.Len(t, d.Denials, 1, kind)
			assert.Equal(t, "relaymesh.admission.any_kind", d.Denials[0].Rule, kind)
		}
	})

	t.Run("a rule set changed at run time judges other kinds", func(t *testing.T) {
		e, _ := newEngine(t, patient)
		kindRule := func(kind string) admission.RuleSet {
			return single("ns/kind", fmt.Sprintf(`package relaymesh.admission.kind

deny contains "no %[1]s here" if input.kind == %[1]q

test_kind if {
	count(deny) == 1 with input as {"kind": %[1]q}
}
`, kind))
		}
		allowed := func(kind string) bool {
			return sameDecision(t, e, request(kind, map[string]any{"hostname": "a.global"})).Allowed
		}
		e.Load(ctx, []admission.RuleSet{kindRule("VirtualDestination")})
		assert.False(t, allowed("VirtualDestination"))
		assert.True(t, allowed("TrafficPolicy"))
		e.Load(ctx, []admission.RuleSet{kindRule("TrafficPolicy")})
		assert.True(t, allowed("VirtualDestination"))
		assert.False(t, allowed("TrafficPolicy"))
		e.Load(ctx, nil)
		assert.True(t, allowed("TrafficPolicy"))
	})

	t.Run("a package below another package's rule", func(t *testing.T) {
		// OPA reaches these deny rules through the rule inner of the parent
		// package, which shadows them: every decision fails, as before.
		e, _ := newEngine(t, patient)
		nested := admission.RuleSet{Name: "ns/nested", Version: "1", Files: map[string]string{
			"outer.rego": `package relaymesh.admission.outer

inner[x] := 1 if some x in input.object.spec.inner
`,
			"inner.rego": `package relaymesh.admission.outer.inner

deny contains "nested" if input.object.spec.nested == true

test_nested if {
	count(deny) == 1 with input as {"object": {"spec": {"nested": true}}}
}
`,
		}}
		require.Equal(t, admission.StateAccepted, statusOf(t, e.Load(ctx, []admission.RuleSet{nested}), "ns/nested").State)
		for _, spec := range []map[string]any{{}, {"nested": true}, {"inner": []any{"deny"}}} {
			d := sameDecision(t, e, request("TrafficPolicy", spec))
			assert.False(t, d.Allowed)
		}
	})

	t.Run("a rule that fails still fails closed", func(t *testing.T) {
		tricky := trickyRuleSets()
		errorFirst, guardFirst := tricky[1], tricky[2]
		for _, tc := range []struct {
			name     string
			set      admission.RuleSet
			ns       string
			replicas string
			want     string // "": allowed, "error": failed, else the rule that denied
		}{
			{"error before the guard, other namespace", errorFirst, "elsewhere", "many", "error"},
			{"error before the guard, its namespace", errorFirst, "team-err", "many", "error"},
			{"error before the guard, no error", errorFirst, "elsewhere", "11", ""},
			{"error before the guard, denied", errorFirst, "team-err", "11", "relaymesh.admission.error_first"},
			{"guard before the error, other namespace", guardFirst, "elsewhere", "many", ""},
			{"guard before the error, its namespace", guardFirst, "team-guard", "many", "error"},
			{"guard before the error, denied", guardFirst, "team-guard", "11", "relaymesh.admission.guard_first"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e, _ := newEngine(t, patient)
				require.Equal(t, admission.StateAccepted, statusOf(t, e.Load(ctx, []admission.RuleSet{tc.set}), tc.set.Name).State)
				req := withChanges(fleetRequests()[3], tc.ns, admission.OperationCreate, map[string]any{"replicas": tc.replicas}, false)
				d := sameDecision(t, e, req)
				_, err := e.Decide(ctx, req)
				switch tc.want {
				case "":
					require.NoError(t, err)
					assert.True(t, d.Allowed, "%+v", d)
				case "error":
					require.ErrorIs(t, err, admission.ErrCheckFailed)
					assert.ErrorContains(t, err, tc.set.Name+"/rules.rego")
					assert.False(t, d.Allowed)
				default:
					require.NoError(t, err)
					require.Len(t, d.Denials, 1)
					assert.Equal(t, tc.want, d.Denials[0].Rule)
				}
			})
		}
	})
}

// FuzzIndexedDecide: whatever the object, Decide and a query over every
// package agree.
func FuzzIndexedDecide(f *testing.F) {
	for _, r := range fleetRequests() {
		b, err := json.Marshal(r.Object)
		require.NoError(f, err)
		f.Add(byte(0), "team-07", b)
	}
	f.Add(byte(1), "team-guard", []byte(`{"spec": {"replicas": "11"}, "metadata": {"labels": {"frozen": "true"}}}`))
	f.Add(byte(2), "team-err", []byte(`{"spec": {"replicas": "x", "n": 3, "shared": true}}`))
	f.Add(byte(7), "team-b", []byte(`{"spec": {"flag": true, "outside": true, "with": true}}`))
	e := indexedEngine(f)
	kinds := []string{"AccessPolicy", "TrafficPolicy", "VirtualMesh", "VirtualDestination", "Secret"}
	ops := []string{admission.OperationCreate, admission.OperationUpdate, admission.OperationDelete}
	f.Fuzz(func(t *testing.T, sel byte, ns string, data []byte) {
		var obj map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if dec.Decode(&obj) != nil || obj == nil {
			return
		}
		req := admission.Request{
			Operation: ops[int(sel>>4)%len(ops)], Kind: kinds[int(sel)%len(kinds)], Namespace: ns, Name: "n",
			Object: obj, OldObject: obj,
			User:            admission.User{Username: "u", Groups: []string{ns}},
			NamespaceLabels: map[string]string{"relaymesh.io/environment": "production"},
		}
		sameDecision(t, e, req)
	})
}
