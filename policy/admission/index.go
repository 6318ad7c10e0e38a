package admission

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	opametrics "github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/relaymesh/relaymesh/internal/text"
)

// Which deny packages a decision evaluates.
//
// OPA evaluates data.<package>.deny by asking the package's rule index
// (ast.RuleIndex) which deny rules may match the input, then evaluating the
// body of each of those in order, expression by expression, until one fails;
// with no rule left, the deny set is empty and nothing is evaluated. The
// index decides from the input's values (input.kind == "TrafficPolicy", a ref
// that must be defined, ...), which the engine has before evaluation starts.
// So the engine asks each package's index itself, with the same input, and
// then looks at the first expressions of each rule the index leaves (guards,
// below): a package is evaluated only if one of its deny rules may get past
// them. The deny sets of the packages evaluated are exactly those a query over
// every package would produce, errors and timeouts included; the others' are
// empty, as they would be, and could not have failed.
//
// Asking is far cheaper than evaluating a package, even one whose rules all
// fail at once (an evaluation allocates and caches per package), so a
// decision's cost follows the packages that may deny it rather than all the
// packages in force. The packages that may deny are evaluated together, by
// one query built for the decision (`d0 = data.<package>.deny; ...`, which
// needs no compiling). Per kind of judgedKinds, the packages that may deny an
// object of that kind whatever the rest of the input is are worked out when
// the rules change (asked with input.kind known and everything else unknown,
// as in partial evaluation): a rule set judging TrafficPolicies is not even
// asked about an AccessPolicy.

// judgedKinds are the kinds whose packages are worked out ahead of a
// decision: those the webhook is registered for. Other kinds are judged by
// asking every package.
var judgedKinds = []string{"VirtualMesh", "TrafficPolicy", "AccessPolicy", "VirtualDestination"}

// denyPackage is one package with deny rules.
type denyPackage struct {
	rule string // the package without "data.", e.g. "relaymesh.admission.team_a"
	// index is OPA's index of the package's deny rules; nil when the
	// package must always be evaluated.
	index ast.RuleIndex
	// guards are the guards of each deny rule (guard.go).
	guards map[*ast.Rule][]guard
	deny   *ast.Term // data.<package>.deny
}

// mayDeny reports whether OPA would evaluate any deny rule of p for the
// input r resolves past its guards: false means p's deny set is empty for
// it, and evaluating it could not fail.
func (p *denyPackage) mayDeny(r ast.ValueResolver) bool {
	if p.index == nil {
		return true
	}
	ir, err := p.index.Lookup(r)
	if err != nil {
		// Only a resolver's error fails a lookup, and the engine's never
		// do; if one did, evaluation decides.
		return true
	}
	defer ast.IndexResultPool.Put(ir)
	if ir.Default != nil || len(ir.Else) > 0 {
		return true // not for deny rules (parse refuses them), but if so
	}
	for _, rule := range ir.Rules {
		if guardsHold(p.guards[rule], r) {
			return true
		}
	}
	return false
}

// denyPackageOf returns pkg's denyPackage: the index OPA consults to
// evaluate pkg's deny rules, and their guards. The index is nil when OPA
// would not consult that index alone: when a node on the way to pkg.deny
// holds rules of its own (a rule of a parent package whose head reaches into
// pkg, whose index covers the rules below it).
func denyPackageOf(c *ast.Compiler, pkg ast.Ref) denyPackage {
	p := denyPackage{rule: ruleName(pkg), deny: ast.RefTerm(pkg.Append(ast.StringTerm("deny"))...)}
	node := ruleNode(c, p.deny.Value.(ast.Ref))
	if node == nil || len(node.Children) > 0 {
		return p
	}
	p.index = node.Index
	p.guards = map[*ast.Rule][]guard{}
	for _, r := range node.Values {
		p.guards[r] = guards(c, r)
	}
	return p
}

// ruleNode returns the node of the rule tree holding the rules at ref, or nil
// if there is none, a node above it holds rules too, or one is external.
func ruleNode(c *ast.Compiler, ref ast.Ref) *ast.TreeNode {
	node := c.RuleTree
	for i, term := range ref {
		if node = node.Child(term.Value); node == nil || node.External != nil {
			return nil
		}
		if i < len(ref)-1 && len(node.Values) > 0 {
			return nil
		}
	}
	if len(node.Values) == 0 {
		return nil
	}
	return node
}

// ruleName is Denial.Rule of the denials of pkg.
func ruleName(pkg ast.Ref) string { return strings.TrimPrefix(pkg.String(), "data.") }

// evaluate adds to d the denials of the packages of st at pkgs, evaluated
// by one query on the input in.
func (st *state) evaluate(ctx context.Context, in ast.Value, pkgs []int, d *Decision) error {
	txn, err := st.store.NewTransaction(ctx)
	if err != nil {
		return err
	}
	defer st.store.Abort(ctx, txn)
	cancel := topdown.NewCancel()
	defer context.AfterFunc(ctx, cancel.Cancel)()
	body := make(ast.Body, len(pkgs))
	for i, p := range pkgs {
		body[i] = ast.Equality.Expr(ast.VarTerm(resultVar(i)), st.pkgs[p].deny)
		body[i].Index = i
	}
	q := topdown.NewQuery(body).
		WithCompiler(st.compiler).
		WithStore(st.store).
		WithTransaction(txn).
		WithInput(ast.NewTerm(in)).
		WithStrictBuiltinErrors(true).
		WithCancel(cancel).
		WithMetrics(noMetrics)
	results := 0
	err = q.Iter(ctx, func(qr topdown.QueryResult) error {
		if results++; results > 1 {
			return nil
		}
		for i, p := range pkgs {
			rule := st.pkgs[p].rule
			t, ok := qr[ast.Var(resultVar(i))]
			if !ok {
				return fmt.Errorf("no result for %s", rule)
			}
			if err := addDenials(d, rule, t.Value); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if results != 1 {
		return fmt.Errorf("%d results, want 1", results)
	}
	return nil
}

// noMetrics are given to OPA, which otherwise makes metrics for each query.
var noMetrics = opametrics.NoOp()

// resultVar is the variable of the query the deny set of its i-th package
// is bound to.
func resultVar(i int) string { return "d" + strconv.Itoa(i) }

// addDenials adds to d the messages of the deny set of package rule.
func addDenials(d *Decision, rule string, set ast.Value) error {
	v, err := ast.JSON(set)
	if err != nil {
		return err
	}
	msgs, ok := v.([]any)
	if !ok {
		return fmt.Errorf("%s.deny is a %T, not a set", rule, v)
	}
	for _, m := range msgs {
		d.Denials = append(d.Denials, Denial{Rule: rule, Message: text.Truncate(message(m), maxMessageLen)})
	}
	return nil
}

// inputResolver answers questions about the input as OPA's evaluator does
// (the value at the ref, nil if there is none), and says anything else
// (data, function arguments) is unknown, so an index keeps the rules that
// depend on it.
type inputResolver struct{ input ast.Value }

func (r *inputResolver) Resolve(ref ast.Ref) (ast.Value, error) {
	if !ref[0].Equal(ast.InputRootDocument) {
		return nil, ast.UnknownValueErr{}
	}
	v, err := r.input.Find(ref[1:])
	if err != nil {
		return nil, nil
	}
	return v, nil
}

// kindResolver knows only input.kind: everything else is unknown.
type kindResolver struct{ kind ast.Value }

var kindTerm = ast.StringTerm("kind")

func (r *kindResolver) Resolve(ref ast.Ref) (ast.Value, error) {
	if len(ref) < 2 || !ref[0].Equal(ast.InputRootDocument) || !ref[1].Equal(kindTerm) {
		return nil, ast.UnknownValueErr{}
	}
	v, err := r.kind.Find(ref[2:])
	if err != nil {
		return nil, nil
	}
	return v, nil
}
