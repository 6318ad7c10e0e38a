package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"math"
	"strconv"
	"strings"
	"unicode"

	"github.com/open-policy-agent/opa/v1/ast"
)

// input builds the input document (see the package documentation) as an
// OPA value, converting the objects directly and within the input limits.
func input(req Request) (ast.Value, error) {
	var b budget
	doc := [][2]*ast.Term{
		{ast.StringTerm("operation"), ast.StringTerm(req.Operation)},
		{ast.StringTerm("kind"), ast.StringTerm(req.Kind)},
		{ast.StringTerm("namespace"), ast.StringTerm(req.Namespace)},
		{ast.StringTerm("name"), ast.StringTerm(req.Name)},
	}
	for _, o := range []struct {
		key string
		obj map[string]any
	}{{"object", req.Object}, {"oldObject", req.OldObject}} {
		if o.obj == nil {
			continue
		}
		v, err := b.value(o.obj, 1)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.key, err)
		}
		doc = append(doc, [2]*ast.Term{ast.StringTerm(o.key), ast.NewTerm(v)})
	}
	groups := make([]*ast.Term, len(req.User.Groups))
	for i, g := range req.User.Groups {
		groups[i] = ast.StringTerm(g)
	}
	user := ast.NewObject(
		[2]*ast.Term{ast.StringTerm("username"), ast.StringTerm(req.User.Username)},
		[2]*ast.Term{ast.StringTerm("groups"), ast.ArrayTerm(groups...)},
	)
	labels := ast.NewObjectWithCapacity(len(req.NamespaceLabels))
	for k, v := range req.NamespaceLabels {
		labels.Insert(ast.StringTerm(k), ast.StringTerm(v))
	}
	doc = append(doc,
		[2]*ast.Term{ast.StringTerm("user"), ast.NewTerm(user)},
		[2]*ast.Term{ast.StringTerm("namespaceLabels"), ast.NewTerm(labels)},
	)
	if err := b.spend(len(req.Kind) + len(req.Namespace) + len(req.Name) + len(req.User.Username)); err != nil {
		return nil, err
	}
	return ast.NewObject(doc...), nil
}

// budget counts what an input has used of its limits.
type budget struct{ values, bytes int }

var errTooLarge = fmt.Errorf("more than %d values or %d bytes of strings", maxInputValues, maxInputBytes)

func (b *budget) spend(n int) error {
	b.values++
	b.bytes += n
	if b.values > maxInputValues || b.bytes > maxInputBytes {
		return errTooLarge
	}
	return nil
}

// value converts a JSON-shaped Go value: what encoding/json decodes into
// any, plus the integer types and typed maps and lists unstructured objects
// hold. Anything else, NaN and infinities included, is an error.
func (b *budget) value(x any, depth int) (ast.Value, error) {
	switch x.(type) {
	case map[string]any, map[string]string, []any, []string:
		if depth > MaxDepth {
			return nil, fmt.Errorf("nested deeper than %d levels", MaxDepth)
		}
	}
	switch x := x.(type) {
	case nil:
		return ast.Null{}, b.spend(0)
	case bool:
		return ast.Boolean(x), b.spend(0)
	case string:
		return ast.String(x), b.spend(len(x))
	case int:
		return ast.Number(strconv.FormatInt(int64(x), 10)), b.spend(0)
	case int32:
		return ast.Number(strconv.FormatInt(int64(x), 10)), b.spend(0)
	case int64:
		return ast.Number(strconv.FormatInt(x, 10)), b.spend(0)
	case uint64:
		return ast.Number(strconv.FormatUint(x, 10)), b.spend(0)
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, errors.New("a number is NaN or infinite")
		}
		return ast.Number(strconv.FormatFloat(x, 'g', -1, 64)), b.spend(0)
	case json.Number:
		if _, err := strconv.ParseFloat(string(x), 64); err != nil {
			return nil, fmt.Errorf("invalid number %q", text.Truncate(string(x), 32))
		}
		return ast.Number(x), b.spend(len(x))
	case map[string]any:
		if err := b.spend(0); err != nil {
			return nil, err
		}
		obj := ast.NewObjectWithCapacity(len(x))
		for k, v := range x {
			if err := b.spend(len(k)); err != nil {
				return nil, err
			}
			val, err := b.value(v, depth+1)
			if err != nil {
				return nil, err
			}
			obj.Insert(ast.StringTerm(k), ast.NewTerm(val))
		}
		return obj, nil
	case map[string]string:
		obj := ast.NewObjectWithCapacity(len(x))
		for k, v := range x {
			if err := b.spend(len(k) + len(v)); err != nil {
				return nil, err
			}
			obj.Insert(ast.StringTerm(k), ast.StringTerm(v))
		}
		return obj, b.spend(0)
	case []any:
		if err := b.spend(0); err != nil {
			return nil, err
		}
		terms := make([]*ast.Term, len(x))
		for i, v := range x {
			val, err := b.value(v, depth+1)
			if err != nil {
				return nil, err
			}
			terms[i] = ast.NewTerm(val)
		}
		return ast.NewArray(terms...), nil
	case []string:
		terms := make([]*ast.Term, len(x))
		for i, v := range x {
			if err := b.spend(len(v)); err != nil {
				return nil, err
			}
			terms[i] = ast.StringTerm(v)
		}
		return ast.NewArray(terms...), b.spend(0)
	default:
		return nil, fmt.Errorf("a value of type %T is not JSON", x)
	}
}

// message turns one element of a deny set into text.
func message(m any) string {
	if s, ok := m.(string); ok {
		return s
	}
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Sprintf("%v", m)
	}
	return string(b)
}

// clean makes s fit an audit field: valid UTF-8, no control characters or
// line separators, at most 1 KiB.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return '\uFFFD'
		}
		return r
	}, s)
	return text.Truncate(s, 1<<10)
}
