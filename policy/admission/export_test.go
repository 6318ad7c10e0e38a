package admission

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/relaymesh/relaymesh/internal/text"
)

// DecideAll decides req as Decide did before it asked the rules' indexes:
// with one prepared query over every package in force, evaluated by rego.
// It does not record the decision. Decisions must not differ.
func (e *Engine) DecideAll(ctx context.Context, req Request) (Decision, error) {
	st := e.state.Load()
	d, err := e.evaluate(ctx, st, req, func(ctx context.Context, st *state, _ string, in ast.Value, d *Decision) error {
		q, err := queryAll(ctx, st)
		if err != nil {
			return err
		}
		rs, err := q.Eval(ctx, rego.EvalParsedInput(in))
		if err != nil {
			return err
		}
		if len(rs) != 1 {
			return fmt.Errorf("%d results, want 1", len(rs))
		}
		for i, p := range st.pkgs {
			v, ok := rs[0].Bindings[fmt.Sprintf("d%d", i)]
			if !ok {
				return fmt.Errorf("no result for %s", p.rule)
			}
			msgs, ok := v.([]any)
			if !ok {
				return fmt.Errorf("%s.deny is a %T, not a set", p.rule, v)
			}
			for _, m := range msgs {
				d.Denials = append(d.Denials, Denial{Rule: p.rule, Message: text.Truncate(message(m), maxMessageLen)})
			}
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrCheckFailed, err)
		d = failed(st.version, err)
	}
	return d, err
}

// prepared is the query of every package of the state last asked for:
// tests ask about one state many times, fuzzing about many states once.
var prepared struct {
	sync.Mutex
	st *state
	q  rego.PreparedEvalQuery
}

// queryAll is the query of every package of st.
func queryAll(ctx context.Context, st *state) (rego.PreparedEvalQuery, error) {
	prepared.Lock()
	defer prepared.Unlock()
	if prepared.st == st {
		return prepared.q, nil
	}
	body := make([]string, len(st.pkgs))
	for i, p := range st.pkgs {
		body[i] = fmt.Sprintf("d%d := %v", i, p.deny)
	}
	q, err := rego.New(
		rego.Compiler(st.compiler),
		rego.Query(strings.Join(body, "; ")),
		rego.StrictBuiltinErrors(true),
		rego.UnsafeBuiltins(unsafeBuiltins),
	).PrepareForEval(ctx)
	if err != nil {
		return q, err
	}
	prepared.st, prepared.q = st, q
	return q, nil
}
