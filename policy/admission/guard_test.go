package admission

import (
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// compiled compiles the modules srcs (file name → source).
func compiled(t *testing.T, srcs map[string]string) *ast.Compiler {
	t.Helper()
	mods := map[string]*ast.Module{}
	for name, src := range srcs {
		mod, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		require.NoError(t, err, name)
		mods[name] = mod
	}
	c := newCompiler()
	c.Compile(mods)
	require.False(t, c.Failed(), "%v", c.Errors)
	return c
}

var pkgRef = ast.MustParseRef("data.relaymesh.admission.p")

// guardStrings are the guards of each deny rule of package p in src, in
// rule order, as "ref=value". Package q defines team := "q".
func guardStrings(t *testing.T, src string) [][]string {
	t.Helper()
	c := compiled(t, map[string]string{
		"p.rego": "package relaymesh.admission.p\n\n" + src,
		"q.rego": "package relaymesh.admission.q\n\nteam := \"q\"\n",
	})
	p := denyPackageOf(c, pkgRef)
	require.NotNil(t, p.index)
	var out [][]string
	for _, r := range ruleNode(c, pkgRef.Append(ast.StringTerm("deny"))).Values {
		gs := []string{}
		for _, g := range p.guards[r] {
			gs = append(gs, fmt.Sprintf("%v=%s", g.ref, string(g.value)))
		}
		out = append(out, gs)
	}
	return out
}

func TestGuards(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"literals", `deny contains "x" if {
	input.kind == "A"
	"n" == input.namespace
	count(input.object.spec) > 1
	input.name == "after a call"
}`, []string{"input.kind=A", "input.namespace=n"}},
		{"a constant", `team := "t"
deny contains "x" if {
	input.namespace == team
	input.object.spec.x
}`, []string{"input.namespace=t"}},
		{"a constant first", `team := "t"
deny contains "x" if {
	team == input.namespace
}`, []string{"input.namespace=t"}},
		{"a constant of another package", `deny contains "x" if {
	input.namespace == data.relaymesh.admission.q.team
}`, []string{"input.namespace=q"}},
		{"unification", `deny contains "x" if {
	input.namespace = "n"
}`, []string{"input.namespace=n"}},
		{"after an assignment and a number", `limit := 3
deny contains "x" if {
	n := input.object.spec.n
	n == limit
	input.namespace == "n"
}`, []string{"input.namespace=n"}},
		{"after a call", `team := "t"
deny contains "x" if {
	to_number(input.object.spec.n) > 1
	input.namespace == team
}`, []string{}},
		{"negated", `team := "t"
deny contains "x" if {
	not input.namespace == team
}`, []string{}},
		{"with", `team := "t"
deny contains "x" if {
	input.namespace == team with input.namespace as "t"
	input.kind == "A"
}`, []string{}},
		{"iteration", `deny contains "x" if {
	input.object.spec.items[_] == "a"
	input.kind == "A"
}`, []string{}},
		{"a default", `default team := "t"
deny contains "x" if input.namespace == team`, []string{}},
		{"two definitions", `team := "a" if input.kind == "A"
team := "b" if input.kind == "B"
deny contains "x" if input.namespace == team`, []string{}},
		{"a condition", `team := "a" if input.kind == "A"
deny contains "x" if input.namespace == team`, []string{}},
		{"an else", `team := "a" if false
else := "b"
deny contains "x" if input.namespace == team`, []string{}},
		{"a function", `team(x) := x
deny contains "x" if input.namespace == team("t")`, []string{}},
		{"a set", `teams := {"a"}
deny contains "x" if {
	input.namespace == teams
	input.kind == "A"
}`, []string{}},
		{"a computed string", `team := concat("-", ["team", "a"])
deny contains "x" if input.namespace == team`, []string{}},
		{"a partial object", `teams[x] := x if some x in ["a"]
deny contains "x" if {
	input.namespace == teams.a
	input.kind == "A"
}`, []string{}},
		{"a number guard", `limit := 3
deny contains "x" if input.object.spec.n == limit`, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := guardStrings(t, tc.src)
			require.Len(t, got, 1)
			assert.Equal(t, tc.want, got[0])
		})
	}
}

func TestGuardsHold(t *testing.T) {
	gs := []guard{
		{ref: ast.MustParseRef("input.kind"), value: "A"},
		{ref: ast.MustParseRef("input.namespace"), value: "n"},
	}
	in := func(s string) ast.Value { return ast.MustParseTerm(s).Value }
	assert.True(t, guardsHold(gs, &inputResolver{input: in(`{"kind": "A", "namespace": "n"}`)}))
	assert.False(t, guardsHold(gs, &inputResolver{input: in(`{"kind": "A", "namespace": "m"}`)}))
	assert.False(t, guardsHold(gs, &inputResolver{input: in(`{"kind": "A"}`)}), "undefined does not hold")
	assert.False(t, guardsHold(gs, &inputResolver{input: in(`{"kind": "A", "namespace": ["n"]}`)}))
	assert.True(t, guardsHold(gs, &kindResolver{kind: ast.String("A")}), "the namespace is unknown")
	assert.False(t, guardsHold(gs, &kindResolver{kind: ast.String("B")}))
	assert.True(t, guardsHold(nil, &kindResolver{kind: ast.String("B")}))
}

// TestRulesFromAbove: a package whose deny rules OPA reaches through a
// parent's rule is always evaluated.
func TestRulesFromAbove(t *testing.T) {
	mods := map[string]*ast.Module{}
	for name, src := range map[string]string{
		"outer.rego": "package relaymesh.admission.outer\n\ninner[x] := 1 if some x in input.xs\n",
		"inner.rego": "package relaymesh.admission.outer.inner\n\ndeny contains \"x\" if input.kind == \"A\"\n",
	} {
		mods[name] = ast.MustParseModuleWithOpts(src, ast.ParserOptions{RegoVersion: ast.RegoV1})
	}
	c := newCompiler()
	if c.Compile(mods); c.Failed() {
		t.Logf("OPA refuses the modules, nothing to index: %v", c.Errors)
		return
	}
	p := denyPackageOf(c, ast.MustParseRef("data.relaymesh.admission.outer.inner"))
	assert.Nil(t, p.index)
	assert.True(t, p.mayDeny(&kindResolver{kind: ast.String("B")}))
}
