package admission

import (
	"github.com/open-policy-agent/opa/v1/ast"
)

// Guards: what a rule's first expressions say about the input.
//
// OPA's index reads equalities between the input and literals, wherever they
// stand in a rule. Rules often compare the input with a constant of their
// package instead,
//
//	team := "team-a"
//
//	deny contains msg if {
//		input.namespace == team
//		...
//	}
//
// which the index cannot read. A guard is such a comparison, between a
// ground input ref and a string (a literal, or a rule whose only definition
// is a string constant), among a rule's first expressions: those OPA
// evaluates before any other, which cannot fail with an error (comparisons
// and assignments of variables, literals, input refs and such constants).
// When a guard does not hold for an input, evaluating the rule stops there:
// it produces nothing and cannot fail, so it need not be evaluated at all.
// Only expressions before the first that could fail with an error (a call,
// a negation, a `with`, a ref to a computed rule) count: later ones may never
// be reached.

// guard holds for an input whose value at ref is value.
type guard struct {
	ref   ast.Ref
	value ast.String
}

// guardsHold reports whether every guard holds for the input r resolves; a
// ref r cannot resolve (ast.UnknownValueErr) may hold.
func guardsHold(gs []guard, r ast.ValueResolver) bool {
	for _, g := range gs {
		v, err := r.Resolve(g.ref)
		if err != nil {
			continue
		}
		if v == nil || !ast.ValueEqual(v, g.value) {
			return false
		}
	}
	return true
}

var (
	eqRef    = ast.Equality.Ref()
	equalRef = ast.Equal.Ref()
)

// guards returns the guards of the compiled rule r.
func guards(c *ast.Compiler, r *ast.Rule) []guard {
	var out []guard
	for _, expr := range r.Body {
		if expr.Negated || len(expr.With) > 0 || !expr.IsCall() || len(expr.Operands()) != 2 {
			return out
		}
		op := expr.Operator()
		if !op.Equal(eqRef) && !op.Equal(equalRef) {
			return out
		}
		a, b := expr.Operand(0), expr.Operand(1)
		if !harmless(c, a) || !harmless(c, b) {
			return out
		}
		if ref, ok := inputRef(a); ok {
			if s, ok := constant(c, b); ok {
				out = append(out, guard{ref: ref, value: s})
			}
		} else if ref, ok := inputRef(b); ok {
			if s, ok := constant(c, a); ok {
				out = append(out, guard{ref: ref, value: s})
			}
		}
	}
	return out
}

// harmless reports whether evaluating t cannot fail with an error: a
// variable, a scalar, a ground input ref or a constant rule.
func harmless(c *ast.Compiler, t *ast.Term) bool {
	switch t.Value.(type) {
	case ast.Var, ast.String, ast.Number, ast.Boolean, ast.Null:
		return true
	}
	if _, ok := inputRef(t); ok {
		return true
	}
	_, ok := constantRule(c, t)
	return ok
}

// inputRef returns t if it is a ground ref into the input.
func inputRef(t *ast.Term) (ast.Ref, bool) {
	ref, ok := t.Value.(ast.Ref)
	if !ok || !ref[0].Equal(ast.InputRootDocument) || !ref.IsGround() {
		return nil, false
	}
	return ref, true
}

// constant returns the string t is: a string literal or a constant rule's.
func constant(c *ast.Compiler, t *ast.Term) (ast.String, bool) {
	if s, ok := t.Value.(ast.String); ok {
		return s, true
	}
	v, ok := constantRule(c, t)
	if !ok {
		return "", false
	}
	s, ok := v.(ast.String)
	return s, ok
}

// constantRule returns the value of the rule t refers to if that rule is
// defined once, unconditionally, as a scalar, and nothing else is defined at
// or below its name:
//
//	team := "team-a"
func constantRule(c *ast.Compiler, t *ast.Term) (ast.Value, bool) {
	ref, ok := t.Value.(ast.Ref)
	if !ok || !ref[0].Equal(ast.DefaultRootDocument) || !ref.IsGround() {
		return nil, false
	}
	node := ruleNode(c, ref)
	if node == nil || len(node.Children) > 0 || len(node.Values) != 1 {
		return nil, false
	}
	r := node.Values[0]
	if r.Default || !r.Head.Ref().IsGround() || r.Else != nil || len(r.Head.Args) > 0 || r.Head.Key != nil || r.Head.Value == nil ||
		r.Head.RuleKind() != ast.SingleValue {
		return nil, false
	}
	if len(r.Body) != 1 || !r.Body[0].Equal(ast.NewExpr(ast.BooleanTerm(true))) {
		return nil, false
	}
	switch v := r.Head.Value.Value.(type) {
	case ast.String, ast.Number, ast.Boolean, ast.Null:
		return v, true
	}
	return nil, false
}
