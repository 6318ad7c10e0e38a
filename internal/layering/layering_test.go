package layering_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/layering"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestModuleKeepsItsLayers: Relaymesh's own import graph, as go list reads
// it, keeps every layering rule; no exception is stale and no rule binds
// nothing.
func TestModuleKeepsItsLayers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := layering.Load(ctx, filepath.Join("..", ".."))
	require.NoError(t, err)
	require.Equal(t, "github.com/relaymesh/relaymesh", g.Module)
	// The graph is the whole module, not an empty or partial read.
	require.Greater(t, len(g.Imports), 50)
	for _, p := range []string{"relay", "relay/proto", "agent", "server", "discovery", "translation/controller", "policy/accessaudit", "internal/text", "cmd/relaymesh"} {
		require.Contains(t, g.Imports, p)
	}
	require.Contains(t, g.Imports["agent"], "relay", "imports are read")

	r := layering.Check(g, layering.Rules(), layering.Exceptions())
	for _, v := range r.Violations {
		t.Errorf("%s", v)
	}
	for _, e := range r.Unused {
		t.Errorf("exception %s → %s is no longer needed (%s): remove it from Exceptions", e.From, e.To, e.Issue)
	}
	for _, name := range r.Empty {
		t.Errorf("rule %q binds no package: was a package renamed?", name)
	}
}

// graph is a synthetic module graph: every package of the rules, each
// importing what a layered module would.
func graph() layering.Graph {
	return layering.Graph{Module: "example.com/m",
		Imports: map[string][]string{
			"api/discovery/v1alpha1": nil,
			"relay/proto":            nil,
			"relay":                  {"relay/proto", "internal/text"},
			"relay/relaytest":        {"relay/proto"},
			"internal/text":          nil,
			"discovery":              {"relay/proto"},
			"agent":                  {"relay", "discovery"},
			"agent/apply":            {"relay/proto"},
			"server":                 {"relay", "agent/apply"},
			"translation":            {"relay/proto"},
			"translation/controller": {"translation", "federation", "policy/access"},
			"federation":             {"translation"},
			"policy/access":          {"translation"},
			"trust":                  {"translation", "trust/spiffefed"},
			"trust/spiffefed":        {"internal/text"},
			"cmd/relaymesh":          {"server", "agent", "translation/controller"},
		},
		TestImports: map[string][]string{
			"relay": {"relay/relaytest"},
			"agent": {"relay/relaytest"},
		},
	}
}

// TestCheckFindsPlantedBadImports: each rule fails on a bad import planted
// into a clean graph — direct, through another package, or only from a
// package's tests — and names the chain; an exception excuses exactly its
// pair, and one that excuses nothing is reported.
func TestCheckFindsPlantedBadImports(t *testing.T) {
	clean := layering.Check(graph(), layering.Rules(), nil)
	require.True(t, clean.OK(), "the clean graph passes: %+v", clean)

	tests := []struct {
		name      string
		plant     func(g *layering.Graph)
		from, to  string
		path      []string
		onlyTests bool
	}{
		{name: "relay imports discovery", plant: func(g *layering.Graph) { g.Imports["relay"] = append(g.Imports["relay"], "discovery") },
			from: "relay", to: "discovery", path: []string{"relay", "discovery"}},
		{name: "a relay subpackage reaches the server through a helper",
			plant: func(g *layering.Graph) {
				g.Imports["internal/text"] = []string{"server"}
			},
			from: "relay", to: "server", path: []string{"relay", "internal/text", "server"}},
		{name: "relay's test fixtures import the agent",
			plant: func(g *layering.Graph) { g.Imports["relay/relaytest"] = append(g.Imports["relay/relaytest"], "agent") },
			from:  "relay/relaytest", to: "agent", path: []string{"relay/relaytest", "agent"}},
		{name: "relay's tests import cmd", plant: func(g *layering.Graph) { g.TestImports["relay"] = append(g.TestImports["relay"], "cmd/relaymesh") },
			from: "relay", to: "cmd/relaymesh", path: []string{"relay", "cmd/relaymesh"}, onlyTests: true},
		{name: "the agent's applier imports the server",
			plant: func(g *layering.Graph) { g.Imports["agent/apply"] = append(g.Imports["agent/apply"], "server") },
			from:  "agent/apply", to: "server", path: []string{"agent/apply", "server"}},
		{name: "the agent's composition root imports the server's leader package",
			plant: func(g *layering.Graph) { g.Imports["agent/app"] = []string{"agent", "server/leader"} },
			from:  "agent/app", to: "server/leader", path: []string{"agent/app", "server/leader"}},
		{name: "the server imports the agent's composition root",
			plant: func(g *layering.Graph) {
				g.Imports["agent/app"] = []string{"agent"}
				g.Imports["server"] = append(g.Imports["server"], "agent/app")
			},
			from: "server", to: "agent/app", path: []string{"server", "agent/app"}},
		{name: "the agent's tests start a server", plant: func(g *layering.Graph) { g.TestImports["agent"] = append(g.TestImports["agent"], "server") },
			from: "agent", to: "server", path: []string{"agent", "server"}, onlyTests: true},
		{name: "a policy translator imports the controller",
			plant: func(g *layering.Graph) { g.Imports["policy/audit"] = []string{"translation/controller"} },
			from:  "policy/audit", to: "translation/controller", path: []string{"policy/audit", "translation/controller"}},
		{name: "federation imports the controller",
			plant: func(g *layering.Graph) {
				g.Imports["federation"] = append(g.Imports["federation"], "translation/controller")
			},
			from: "federation", to: "translation/controller", path: []string{"federation", "translation/controller"}},
		{name: "an internal helper imports trust",
			plant: func(g *layering.Graph) { g.Imports["internal/registration"] = []string{"internal/text", "trust"} },
			from:  "internal/registration", to: "trust", path: []string{"internal/registration", "trust"}},
		{name: "the SPIFFE bundle endpoint imports the trust controller",
			plant: func(g *layering.Graph) { g.Imports["trust/spiffefed"] = append(g.Imports["trust/spiffefed"], "trust") },
			from:  "trust/spiffefed", to: "trust", path: []string{"trust/spiffefed", "trust"}},
		{name: "the SPIFFE bundle endpoint reaches the server through a helper",
			plant: func(g *layering.Graph) { g.Imports["internal/text"] = []string{"server"} },
			from:  "trust/spiffefed", to: "server", path: []string{"trust/spiffefed", "internal/text", "server"}},
		{name: "the dashboard imports the server's composition root",
			plant: func(g *layering.Graph) { g.Imports["dashboard"] = []string{"server/app"} },
			from:  "dashboard", to: "server/app", path: []string{"dashboard", "server/app"}},
		{name: "an internal helper reaches the dashboard through another",
			plant: func(g *layering.Graph) {
				g.Imports["internal/a"] = []string{"internal/b"}
				g.Imports["internal/b"] = []string{"dashboard"}
			},
			from: "internal/a", to: "dashboard", path: []string{"internal/a", "internal/b", "dashboard"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := graph()
			tt.plant(&g)
			r := layering.Check(g, layering.Rules(), nil)
			require.False(t, r.OK())
			var found *layering.Violation
			for i, v := range r.Violations {
				if v.From == tt.from && v.To == tt.to {
					found = &r.Violations[i]
				}
			}
			require.NotNil(t, found, "violations: %v", r.Violations)
			assert.Equal(t, tt.path, found.Path)
			assert.Equal(t, tt.onlyTests, found.Test)
			assert.Contains(t, found.String(), strings.Join(tt.path, " → "))
		})
	}

	t.Run("an exception excuses its pair only", func(t *testing.T) {
		g := graph()
		g.Imports["policy/audit"] = []string{"translation/controller"}
		g.Imports["federation"] = append(g.Imports["federation"], "translation/controller")
		r := layering.Check(g, layering.Rules(), []layering.Exception{{From: "policy/audit", To: "translation/controller", Issue: "#1"}})
		require.Len(t, r.Violations, 1)
		assert.Equal(t, "federation", r.Violations[0].From)
		assert.Empty(t, r.Unused)
	})
	t.Run("a stale exception is reported", func(t *testing.T) {
		r := layering.Check(graph(), layering.Rules(), []layering.Exception{{From: "policy/audit", To: "translation/controller", Issue: "#1"}})
		assert.False(t, r.OK())
		assert.Equal(t, []layering.Exception{{From: "policy/audit", To: "translation/controller", Issue: "#1"}}, r.Unused)
	})
	t.Run("a rule that binds nothing is reported", func(t *testing.T) {
		g := graph()
		delete(g.Imports, "relay")
		delete(g.Imports, "relay/proto")
		delete(g.Imports, "relay/relaytest")
		r := layering.Check(g, layering.Rules(), nil)
		assert.False(t, r.OK())
		assert.Equal(t, []string{layering.Rules()[0].Name}, r.Empty)
	})
}

// TestLoadFindsABadImportInARealModule: go list on a module with a planted
// bad import (relay importing discovery) and a test-only one (the agent's
// test importing the server) gives a graph Check fails on.
func TestLoadFindsABadImportInARealModule(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":                "module github.com/relaymesh/relaymesh\n\ngo 1.26\n",
		"relay/relay.go":        "package relay\n\nimport _ \"github.com/relaymesh/relaymesh/discovery\"\n",
		"discovery/d.go":        "package discovery\n",
		"agent/agent.go":        "package agent\n\nimport _ \"github.com/relaymesh/relaymesh/relay\"\n",
		"agent/agent_test.go":   "package agent_test\n\nimport _ \"github.com/relaymesh/relaymesh/server\"\n",
		"server/server.go":      "package server\n",
		"internal/text/text.go": "package text\n",
		"policy/x/x.go":         "package x\n",
		"federation/f.go":       "package federation\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	t.Setenv("GOWORK", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	t.Setenv("GOTOOLCHAIN", "local")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := layering.Load(ctx, dir)
	require.NoError(t, err)
	r := layering.Check(g, layering.Rules(), nil)
	require.False(t, r.OK())
	var got []string
	for _, v := range r.Violations {
		got = append(got, v.String())
	}
	assert.ElementsMatch(t, []string{
		`relay imports discovery: relay → discovery — breaks "` + layering.Rules()[0].Name + `"`,
		`agent imports server (from its tests): agent → server — breaks "` + layering.Rules()[1].Name + `"`,
	}, got)
}

// TestLoadFailsOutsideAModule: a directory go list cannot read is an
// error, never an empty graph that passes.
func TestLoadFailsOutsideAModule(t *testing.T) {
	t.Setenv("GOWORK", "off")
	t.Setenv("GOTOOLCHAIN", "local")
	t.Setenv("GO111MODULE", "on")
	_, err := layering.Load(context.Background(), t.TempDir())
	require.Error(t, err)
}

func TestMatch(t *testing.T) {
	for _, tt := range []struct {
		pattern, pkg string
		want         bool
	}{
		{"relay/...", "relay", true},
		{"relay/...", "relay/proto", true},
		{"relay/...", "relayx", false},
		{"relay/...", "server/relay", false},
		{"translation/controller/...", "translation/controller", true},
		{"translation/controller/...", "translation", false},
		{"policy/accessaudit", "policy/accessaudit", true},
		{"policy/accessaudit", "policy/accessaudit/x", false},
	} {
		assert.Equal(t, tt.want, layering.Match(tt.pattern, tt.pkg), "%s %s", tt.pattern, tt.pkg)
	}
}
