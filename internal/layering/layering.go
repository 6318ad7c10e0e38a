// Package layering states which of Relaymesh's packages may import which,
// as data (Rules, Exceptions), and checks a module's import graph against
// it (Check). Its test loads this module's graph with `go list` and runs
// the check; it runs in `make verify` and in `make test`, so a layering
// rule is a rule and not only prose in docs/architecture.md.
//
// A rule binds packages (From) and names what they MUST NOT reach (Not),
// directly or through any chain of the module's packages, from their
// production code or from their tests. An exception excuses one pair for a
// named issue; an exception the graph no longer needs is reported too, so
// none outlives its reason.
package layering

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
)

// Rule is one layering rule.
type Rule struct {
	// Name says what the rule keeps true.
	Name string
	// From are the packages it binds, as module-relative patterns:
	// "relay/..." is relay and every package below it, "policy/accessaudit"
	// that package alone.
	From []string
	// Not are the packages they must not import, as patterns like From.
	Not []string
}

// Exception excuses From importing To (module-relative packages) until
// Issue is done.
type Exception struct {
	From, To string
	Issue    string
}

// roles are Relaymesh's role packages: the processes and the operator
// views, and what only they use. The wire and the shared helpers sit
// below all of them.
var roles = []string{"agent/...", "server/...", "discovery/...", "translation/...", "trust/...",
	"federation/...", "policy/...", "dashboard/...", "check/...", "cmd/..."}

// Rules are the layering rules of Relaymesh (docs/architecture.md).
func Rules() []Rule {
	return []Rule{
		{Name: "the wire (relay/...) imports no role package", From: []string{"relay/..."}, Not: slices.Clone(roles)},
		{Name: "the agent never imports the server", From: []string{"agent/..."}, Not: []string{"server/..."}},
		{Name: "only cmd/ composes the agent: no other role package imports its composition root (agent/app)",
			From: slices.DeleteFunc(slices.Clone(roles), func(r string) bool { return r == "cmd/..." }), Not: []string{"agent/app"}},
		{Name: "translators (policy/..., federation/...) do not import the informer-driven translation/controller",
			From: []string{"policy/...", "federation/..."}, Not: []string{"translation/controller/..."}},
		{Name: "shared helpers (internal/...) import no role package; CLI-only helpers live under cmd/relaymesh/internal/",
			From: []string{"internal/..."}, Not: slices.Clone(roles)},
		{Name: "only commands (cmd/...) and server/app's own test harness (server/app/apptest) import the server's composition root (server/app)",
			From: []string{"agent/...", "discovery/...", "translation/...", "trust/...", "federation/...", "policy/...", "dashboard/...",
				"check/...", "ca/...", "identity/..."}, Not: []string{"server/app/..."}},
		{Name: "the SPIFFE bundle endpoint (trust/spiffefed) is pure: no role package, so no trust controller, server or client of the apiserver reaches it",
			From: []string{"trust/spiffefed"}, Not: slices.Clone(roles)},
	}
}

// Exceptions are today's known breaches of Rules, each with the issue
// that removes it.
func Exceptions() []Exception {
	return nil
}

// Graph is the import graph of a module's packages, by module-relative
// path; imports of packages outside the module are left out.
type Graph struct {
	Module string
	// Imports of each package's production code; TestImports of its tests
	// (in-package and external) beyond those.
	Imports, TestImports map[string][]string
}

// Violation is a package that reaches one it must not.
type Violation struct {
	Rule     string
	From, To string
	// Path is the chain of imports, From first and To last.
	Path []string
	// Test: only through From's tests.
	Test bool
}

func (v Violation) String() string {
	via := ""
	if v.Test {
		via = " (from its tests)"
	}
	return fmt.Sprintf("%s imports %s%s: %s — breaks %q", v.From, v.To, via, strings.Join(v.Path, " → "), v.Rule)
}

// Report is what Check found.
type Report struct {
	Violations []Violation
	// Unused are exceptions no import needs any more: remove them.
	Unused []Exception
	// Empty are rules whose From matches no package (a package renamed
	// under them): such a rule checks nothing.
	Empty []string
}

// OK reports whether the graph keeps every rule, with no stale exception
// and no empty rule.
func (r Report) OK() bool { return len(r.Violations) == 0 && len(r.Unused) == 0 && len(r.Empty) == 0 }

// Match reports whether the module-relative package pkg matches pattern:
// "x/..." matches x and every package below it, any other pattern only
// itself.
func Match(pattern, pkg string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

func matchAny(patterns []string, pkg string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return Match(p, pkg) })
}

// Check checks g against rules, excusing exceptions.
func Check(g Graph, rules []Rule, exceptions []Exception) Report {
	var r Report
	pkgs := make([]string, 0, len(g.Imports))
	for p := range g.Imports {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	used := make([]bool, len(exceptions))
	for _, rule := range rules {
		bound := false
		for _, p := range pkgs {
			if !matchAny(rule.From, p) {
				continue
			}
			bound = true
			for _, reached := range g.reach(p) {
				to := reached.path[len(reached.path)-1]
				if !matchAny(rule.Not, to) {
					continue
				}
				if i := slices.IndexFunc(exceptions, func(e Exception) bool { return e.From == p && e.To == to }); i >= 0 {
					used[i] = true
					continue
				}
				r.Violations = append(r.Violations, Violation{Rule: rule.Name, From: p, To: to, Path: reached.path, Test: reached.test})
			}
		}
		if !bound {
			r.Empty = append(r.Empty, rule.Name)
		}
	}
	for i, e := range exceptions {
		if !used[i] {
			r.Unused = append(r.Unused, e)
		}
	}
	return r
}

type reached struct {
	path []string
	test bool
}

// reach is every package p reaches, each with a shortest chain: through
// its production imports first, then through its tests' imports.
func (g Graph) reach(p string) []reached {
	seen := map[string]bool{p: true}
	var out []reached
	var queue [][]string
	walk := func(test bool) {
		for len(queue) > 0 {
			path := queue[0]
			queue = queue[1:]
			out = append(out, reached{path: path, test: test})
			for _, next := range g.Imports[path[len(path)-1]] {
				if !seen[next] {
					seen[next] = true
					queue = append(queue, append(slices.Clip(path), next))
				}
			}
		}
	}
	for _, next := range g.Imports[p] {
		if !seen[next] {
			seen[next] = true
			queue = append(queue, []string{p, next})
		}
	}
	walk(false)
	for _, next := range g.TestImports[p] {
		if !seen[next] {
			seen[next] = true
			queue = append(queue, []string{p, next})
		}
	}
	walk(true)
	return out
}

// ErrNoModule: go list found no packages of a module in the directory.
var ErrNoModule = errors.New("no packages of a module")

// Load reads the import graph of the module in dir with `go list` (the go
// command on PATH). Any error of go list fails it: a graph that could not
// be read checks nothing.
func Load(ctx context.Context, dir string) (Graph, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", "list", "-json=ImportPath,Imports,TestImports,XTestImports,Module", "./...")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return Graph{}, fmt.Errorf("go list in %s: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return parse(&stdout)
}

// listed is what go list -json says of a package.
type listed struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
	Module                             *struct{ Path string }
}

func parse(r io.Reader) (Graph, error) {
	var all []listed
	dec := json.NewDecoder(r)
	for {
		var p listed
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Graph{}, fmt.Errorf("go list output: %w", err)
		}
		all = append(all, p)
	}
	if len(all) == 0 || all[0].Module == nil {
		return Graph{}, ErrNoModule
	}
	g := Graph{Module: all[0].Module.Path, Imports: map[string][]string{}, TestImports: map[string][]string{}}
	rel := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			if r, ok := g.relative(p); ok {
				out = append(out, r)
			}
		}
		return out
	}
	for _, p := range all {
		self, ok := g.relative(p.ImportPath)
		if !ok {
			return Graph{}, fmt.Errorf("go list: package %s is not in module %s", p.ImportPath, g.Module)
		}
		g.Imports[self] = rel(p.Imports)
		tests := slices.DeleteFunc(rel(append(slices.Clone(p.TestImports), p.XTestImports...)), func(t string) bool { return t == self })
		slices.Sort(tests)
		g.TestImports[self] = slices.Compact(tests)
	}
	return g, nil
}

// relative is p relative to the module ("." for the module's root
// package); false for a package outside it.
func (g Graph) relative(p string) (string, bool) {
	if p == g.Module {
		return ".", true
	}
	r, ok := strings.CutPrefix(p, g.Module+"/")
	return r, ok
}
