// Package metricsdoc keeps docs/metrics.md true: Defined reads every
// Prometheus metric the module's code creates (from the source, so no list
// is kept by hand), Documented reads the tables of docs/metrics.md, and
// Compare says where they disagree — a metric served but not documented, a
// documented one nothing creates, or a type or label set that differs. Its
// test runs the comparison on this module in `make test`.
//
// Defined fails closed: a metric whose name, type or labels it cannot read
// from the source (a name computed at run time, opts not passed straight
// to a prometheus constructor, a Desc built by hand) is an error, never a
// metric silently skipped. Such code gets a string constant for its name,
// or this package learns to read it.
package metricsdoc

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// promPath is the import path of the Prometheus client library.
const promPath = "github.com/prometheus/client_golang/prometheus"

// Metric is one metric: its name, type (counter, gauge, histogram,
// summary, untyped) and label names (sorted).
type Metric struct {
	Name, Type string
	Labels     []string
	// Where it is created (file:line) or documented (docs file:line).
	Where string
}

// constructors are the prometheus functions that create a metric from
// opts, with the metric's type and whether their second argument is its
// label names.
var constructors = map[string]struct {
	typ string
	vec bool
}{
	"NewCounter": {"counter", false}, "NewCounterVec": {"counter", true}, "NewCounterFunc": {"counter", false},
	"NewGauge": {"gauge", false}, "NewGaugeVec": {"gauge", true}, "NewGaugeFunc": {"gauge", false},
	"NewHistogram": {"histogram", false}, "NewHistogramVec": {"histogram", true},
	"NewSummary": {"summary", false}, "NewSummaryVec": {"summary", true},
	"NewUntypedFunc": {"untyped", false},
}

// optsTypes are the prometheus opts types whose literals name a metric.
var optsTypes = []string{"Opts", "CounterOpts", "GaugeOpts", "HistogramOpts", "SummaryOpts", "UntypedOpts"}

// Defined reads every metric the Go code of the module at root creates
// with a prometheus constructor. It reads non-test files only, and skips
// test/ and testdata/ (test harnesses serve no metrics), hidden and
// underscore directories, and nested modules.
func Defined(root string) ([]Metric, error) {
	module, err := modulePath(root)
	if err != nil {
		return nil, err
	}
	m := &source{root: root, path: module, fset: token.NewFileSet(), pkgs: map[string]*pkg{}}
	if err := m.parse(); err != nil {
		return nil, err
	}
	var out []Metric
	var errs []error
	for _, dir := range slices.Sorted(maps.Keys(m.pkgs)) {
		p := m.pkgs[dir]
		for _, f := range p.files {
			ms, err := m.metrics(p, f)
			out = append(out, ms...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return out, errors.Join(errs...)
}

func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", filepath.Join(root, "go.mod"))
}

// source is the parsed module.
type source struct {
	root, path string
	fset       *token.FileSet
	// pkgs by import path.
	pkgs map[string]*pkg
}

type pkg struct {
	files []*ast.File
	// consts: the package's top-level constants, unevaluated.
	consts map[string]ast.Expr
}

func (m *source) parse() error {
	return filepath.WalkDir(m.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(m.root, path)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || rel == "test") {
				return filepath.SkipDir
			}
			if rel != "." {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // a module of its own
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(m.fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ip := m.path
		if dir := filepath.ToSlash(filepath.Dir(rel)); dir != "." {
			ip += "/" + dir
		}
		p := m.pkgs[ip]
		if p == nil {
			p = &pkg{consts: map[string]ast.Expr{}}
			m.pkgs[ip] = p
		}
		p.files = append(p.files, f)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) {
						p.consts[name.Name] = vs.Values[i]
					}
				}
			}
		}
		return nil
	})
}

// where is n's file (relative to the module's root) and line.
func (m *source) where(n ast.Node) string {
	pos := m.fset.Position(n.Pos())
	rel, err := filepath.Rel(m.root, pos.Filename)
	if err != nil {
		rel = pos.Filename
	}
	return fmt.Sprintf("%s:%d", filepath.ToSlash(rel), pos.Line)
}

// imports maps the names a file gives its imports to their paths.
func imports(f *ast.File) map[string]string {
	out := map[string]string{}
	for _, im := range f.Imports {
		path, _ := strconv.Unquote(im.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		out[name] = path
	}
	return out
}

// metrics reads the metrics file f of p creates.
func (m *source) metrics(p *pkg, f *ast.File) ([]Metric, error) {
	names := imports(f)
	prom := ""
	for name, path := range names {
		if path == promPath {
			prom = name
		}
	}
	if prom == "" {
		return nil, nil
	}
	isProm := func(e ast.Expr, sels ...string) (string, bool) {
		s, ok := e.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		x, ok := s.X.(*ast.Ident)
		if !ok || x.Name != prom || !slices.Contains(sels, s.Sel.Name) {
			return "", false
		}
		return s.Sel.Name, true
	}
	var out []Metric
	var errs []error
	consumed := map[*ast.CompositeLit]bool{}
	fail := func(n ast.Node, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", m.where(n), fmt.Sprintf(format, args...)))
	}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if _, ok := isProm(call.Fun, "NewDesc", "NewDescWithLabels"); ok {
			fail(call, "a metric Desc built by hand; metricsdoc cannot read its name")
			return true
		}
		ctor, ok := isProm(call.Fun, slices.Collect(maps.Keys(constructors))...)
		if !ok || len(call.Args) == 0 {
			return true
		}
		arg := call.Args[0]
		if u, ok := arg.(*ast.UnaryExpr); ok && u.Op == token.AND {
			arg = u.X
		}
		lit, ok := arg.(*ast.CompositeLit)
		if !ok {
			fail(call, "prometheus.%s without an opts literal; metricsdoc cannot read its name", ctor)
			return true
		}
		consumed[lit] = true
		metric := Metric{Type: constructors[ctor].typ, Where: m.where(call)}
		var parts [3]string // namespace, subsystem, name
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			key, _ := kv.Key.(*ast.Ident)
			if key == nil {
				continue
			}
			if key.Name == "ConstLabels" {
				// A metric made once per value of a label (one collector
				// each) documents that label like a Vec's.
				labels, ok := kv.Value.(*ast.CompositeLit)
				if !ok {
					fail(kv, "ConstLabels not a prometheus.Labels literal; metricsdoc cannot read them")
					return true
				}
				for _, e := range labels.Elts {
					pair, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					v, err := m.eval(p, names, pair.Key)
					if err != nil {
						fail(pair, "ConstLabels: %v", err)
						return true
					}
					metric.Labels = append(metric.Labels, v)
				}
				slices.Sort(metric.Labels)
				continue
			}
			i := slices.Index([]string{"Namespace", "Subsystem", "Name"}, key.Name)
			if i < 0 {
				continue
			}
			v, err := m.eval(p, names, kv.Value)
			if err != nil {
				fail(kv, "%s: %v", key.Name, err)
				return true
			}
			parts[i] = v
		}
		metric.Name = strings.Join(slices.DeleteFunc(parts[:], func(s string) bool { return s == "" }), "_")
		if metric.Name == "" {
			fail(call, "prometheus.%s with no name", ctor)
			return true
		}
		if constructors[ctor].vec {
			if len(call.Args) < 2 {
				fail(call, "prometheus.%s without label names", ctor)
				return true
			}
			labels, ok := call.Args[1].(*ast.CompositeLit)
			if !ok {
				fail(call, "%s: label names not a []string literal; metricsdoc cannot read them", metric.Name)
				return true
			}
			for _, e := range labels.Elts {
				v, err := m.eval(p, names, e)
				if err != nil {
					fail(e, "%s: label: %v", metric.Name, err)
					return true
				}
				metric.Labels = append(metric.Labels, v)
			}
			slices.Sort(metric.Labels)
		}
		out = append(out, metric)
		return true
	})
	// Opts made anywhere but in a constructor's call: their metric is
	// created where this cannot see it.
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		if _, ok := isProm(lit.Type, optsTypes...); ok && !consumed[lit] {
			fail(lit, "prometheus opts not passed straight to a prometheus constructor; metricsdoc cannot tell what they create")
		}
		return true
	})
	return out, errors.Join(errs...)
}

// eval is the string value of a constant expression in p: a string
// literal, a constant of p or of another package of the module, or a
// concatenation of those.
func (m *source) eval(p *pkg, names map[string]string, e ast.Expr) (string, error) {
	return m.evalDepth(p, names, e, 0)
}

func (m *source) evalDepth(p *pkg, names map[string]string, e ast.Expr, depth int) (string, error) {
	if depth > 16 {
		return "", errors.New("constants nested too deep")
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", fmt.Errorf("%s is not a string", e.Value)
		}
		return strconv.Unquote(e.Value)
	case *ast.ParenExpr:
		return m.evalDepth(p, names, e.X, depth+1)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", fmt.Errorf("operator %s", e.Op)
		}
		a, err := m.evalDepth(p, names, e.X, depth+1)
		if err != nil {
			return "", err
		}
		b, err := m.evalDepth(p, names, e.Y, depth+1)
		return a + b, err
	case *ast.Ident:
		v, ok := p.consts[e.Name]
		if !ok {
			return "", fmt.Errorf("%s is not a constant of its package", e.Name)
		}
		return m.evalDepth(p, names, v, depth+1)
	case *ast.SelectorExpr:
		x, ok := e.X.(*ast.Ident)
		if !ok {
			return "", fmt.Errorf("%s is not a constant", e.Sel.Name)
		}
		other := m.pkgs[names[x.Name]]
		if other == nil {
			return "", fmt.Errorf("%s.%s is not a constant of the module", x.Name, e.Sel.Name)
		}
		v, ok := other.consts[e.Sel.Name]
		if !ok {
			return "", fmt.Errorf("%s.%s is not a constant", x.Name, e.Sel.Name)
		}
		// The other package's own imports name its constants' packages.
		return m.evalDepth(other, m.importsOf(other, e.Sel.Name), v, depth+1)
	}
	return "", fmt.Errorf("%T is not a constant expression metricsdoc reads", e)
}

// importsOf is the imports of the file of p that declares const name.
func (m *source) importsOf(p *pkg, name string) map[string]string {
	for _, f := range p.files {
		for _, decl := range f.Decls {
			if gd, ok := decl.(*ast.GenDecl); ok && gd.Tok == token.CONST {
				for _, spec := range gd.Specs {
					for _, n := range spec.(*ast.ValueSpec).Names {
						if n.Name == name {
							return imports(f)
						}
					}
				}
			}
		}
	}
	return nil
}

// row is a table row of docs/metrics.md naming a metric: | `name` | type | labels | meaning |
var row = regexp.MustCompile("^\\|\\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`\\s*\\|([^|]*)\\|([^|]*)\\|")

var backticked = regexp.MustCompile("`([^`]+)`")

// Documented reads the metrics of the tables of docs/metrics.md: each row
// whose first cell is a metric name in backticks, with its type and the
// label names of its labels cell (backticked words outside parentheses;
// "—" for none). Where is "line N".
func Documented(r io.Reader) ([]Metric, error) {
	var out []Metric
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		metric := Metric{Name: m[1], Type: strings.TrimSpace(m[2]), Where: fmt.Sprintf("line %d", line)}
		for _, l := range backticked.FindAllStringSubmatch(outsideParens(m[3]), -1) {
			metric.Labels = append(metric.Labels, l[1])
		}
		slices.Sort(metric.Labels)
		out = append(out, metric)
	}
	return out, sc.Err()
}

// outsideParens is s without what stands in (nested) parentheses.
func outsideParens(s string) string {
	var b strings.Builder
	depth := 0
	for _, c := range s {
		switch {
		case c == '(':
			depth++
		case c == ')' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// Compare lists every disagreement between the metrics the code defines
// and the ones the docs list; none when they agree. A metric may be
// defined, or documented, more than once (in the server's and the agent's
// tables) as long as every place agrees on its type and labels.
func Compare(defined, documented []Metric) []string {
	var problems []string
	def, doc := byName(defined), byName(documented)
	for _, name := range slices.Sorted(maps.Keys(def)) {
		ds := def[name]
		for _, d := range ds[1:] {
			if d.Type != ds[0].Type || !slices.Equal(d.Labels, ds[0].Labels) {
				problems = append(problems, fmt.Sprintf("%s is defined twice, differently: %s and %s", name, ds[0].Where, d.Where))
			}
		}
		docs, ok := doc[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s (%s) is not in docs/metrics.md", name, ds[0].Where))
			continue
		}
		for _, d := range docs {
			if d.Type != ds[0].Type {
				problems = append(problems, fmt.Sprintf("%s: docs/metrics.md %s says %s, the code (%s) makes a %s", name, d.Where, d.Type, ds[0].Where, ds[0].Type))
			}
			if !slices.Equal(d.Labels, ds[0].Labels) {
				problems = append(problems, fmt.Sprintf("%s: docs/metrics.md %s lists labels %v, the code (%s) has %v", name, d.Where, d.Labels, ds[0].Where, ds[0].Labels))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(doc)) {
		if _, ok := def[name]; !ok {
			problems = append(problems, fmt.Sprintf("%s (docs/metrics.md %s) is created nowhere in the code", name, doc[name][0].Where))
		}
	}
	return problems
}

func byName(ms []Metric) map[string][]Metric {
	out := map[string][]Metric{}
	for _, m := range ms {
		out[m.Name] = append(out[m.Name], m)
	}
	return out
}
