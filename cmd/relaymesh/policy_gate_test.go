package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var updateGate = flag.Bool("update", false, "rewrite the golden files of testdata/audit-gate")

// gate is the directory of the CI-gate cases: world.yaml is the demo's
// world (clean), the other files each add one thing.
const gate = "testdata/audit-gate"

// runStdin runs the command line with stdin as standard input.
func runStdin(ctx context.Context, args []string, stdin string, stdout, stderr *bytes.Buffer) int {
	d := defaultDeps(stdout, stderr)
	d.stdin = strings.NewReader(stdin)
	return runWith(ctx, d, args)
}

// TestPolicyAuditGate: `policy audit -f` as a CI gate. Each case's exit
// code is checked, and its output (JSON unless the case says otherwise) is
// golden: testdata/audit-gate/<case>.golden (go test -update rewrites it).
// 0: valid and no finding at least --fail-on; 1: findings; 2: input the
// API server or its admission would refuse, or that cannot be read.
func TestPolicyAuditGate(t *testing.T) {
	world := filepath.Join(gate, "world.yaml")
	worldBytes, err := os.ReadFile(world)
	require.NoError(t, err)
	tests := []struct {
		name  string
		args  []string
		stdin string
		code  int
		// stderr must contain these.
		stderr []string
	}{
		{name: "clean", args: []string{"-f", world}, code: 0},
		{name: "clean-table", args: []string{"-f", world, "-o", "table"}, code: 0},
		{name: "stdin", args: []string{"-f", "-"}, stdin: string(worldBytes), code: 0},
		{name: "list", args: []string{"-f", filepath.Join(gate, "list.yaml")}, code: 0},
		// The directory holds the world twice (world.yaml, list.yaml) and
		// every bad file: all of it is reported, each duplicate once.
		{name: "directory", args: []string{"-f", gate + "/", "--fail-on", "none"}, code: 2, stderr: []string{"invalid input"}},
		{name: "findings", args: []string{"-f", world, "-f", filepath.Join(gate, "open.yaml")}, code: 1},
		{name: "findings-below-fail-on", args: []string{"-f", world, "-f", filepath.Join(gate, "open.yaml"), "--fail-on", "high"}, code: 0},
		{name: "refused-by-admission", args: []string{"-f", world, "-f", filepath.Join(gate, "refused.yaml")}, code: 2, stderr: []string{"invalid input"}},
		{name: "refused-by-admission-table", args: []string{"-f", world, "-f", filepath.Join(gate, "refused.yaml"), "-o", "table"}, code: 2},
		{name: "schema", args: []string{"-f", world, "-f", filepath.Join(gate, "maybe.yaml"), "-o", "table"}, code: 2},
		{name: "schema-json", args: []string{"-f", world, "-f", filepath.Join(gate, "maybe.yaml")}, code: 2},
		{name: "wrong-apiversion", args: []string{"-f", world, "-f", filepath.Join(gate, "wrong-apiversion.yaml"), "-o", "table"}, code: 2},
		{name: "malformed", args: []string{"-f", world, "-f", filepath.Join(gate, "malformed.yaml"), "-o", "table"}, code: 2},
		{name: "examples-demo", args: []string{"-f", "../../examples/demo/", "-o", "table"}, code: 1},
		{name: "what-if-refused", args: []string{"-f", world, "--with", filepath.Join(gate, "refused.yaml")}, code: 2},
		{name: "what-if-clean", args: []string{"-f", world, "--without", "accesspolicy/relaymesh/productpage-to-reviews"}, code: 0},
		{name: "missing-file", args: []string{"-f", filepath.Join(gate, "nope.yaml")}, code: 2, stderr: []string{"nope.yaml: no such file or directory"}},
		{name: "bad-flag", args: []string{"-f", world, "--fail-on", "sometimes"}, code: 2, stderr: []string{"Run 'relaymesh policy audit --help' for usage."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"policy", "audit", "-o", "json"}, tt.args...)
			var out, errOut bytes.Buffer
			code := runStdin(context.Background(), args, tt.stdin, &out, &errOut)
			assert.Equal(t, tt.code, code, "exit code; stderr: %s", errOut.String())
			for _, s := range tt.stderr {
				assert.Contains(t, errOut.String(), s)
			}
			path := filepath.Join(gate, tt.name+".golden")
			if *updateGate {
				require.NoError(t, os.WriteFile(path, out.Bytes(), 0o644))
				return
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "missing golden file; run go test -run TestPolicyAuditGate -update")
			assert.Equal(t, string(want), out.String(), "%s differs; if intended, run go test -run TestPolicyAuditGate -update and review", path)
			if out.Len() > 0 && out.Bytes()[0] == '{' {
				var r accessaudit.Result
				dec := json.NewDecoder(bytes.NewReader(out.Bytes()))
				dec.DisallowUnknownFields()
				if strings.HasPrefix(tt.name, "what-if") {
					var d accessaudit.Diff
					require.NoError(t, dec.Decode(&d))
				} else {
					require.NoError(t, dec.Decode(&r))
				}
			}
		})
	}
}

// TestPolicyAuditReadsTheSameWorldEveryWay: a file, stdin, a List with
// server-set metadata and status (as kubectl get -o yaml writes it), and a
// directory holding the file give one matrix and one set of findings.
func TestPolicyAuditReadsTheSameWorldEveryWay(t *testing.T) {
	world := filepath.Join(gate, "world.yaml")
	b, err := os.ReadFile(world)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "nested"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nested", "w.yaml"), b, 0o600))
	audit := func(stdin string, args ...string) accessaudit.Result {
		t.Helper()
		var out, errOut bytes.Buffer
		require.Equal(t, 0, runStdin(context.Background(), append([]string{"policy", "audit", "-o", "json"}, args...), stdin, &out, &errOut), errOut.String())
		var r accessaudit.Result
		require.NoError(t, json.Unmarshal(out.Bytes(), &r))
		require.NotNil(t, r.Input)
		assert.Empty(t, r.Input.Problems)
		r.Input = nil
		return r
	}
	want := audit("", "-f", world)
	require.Len(t, want.Matrix.Pairs, 2)
	for name, got := range map[string]accessaudit.Result{
		"stdin":     audit(string(b), "-f", "-"),
		"list":      audit("", "-f", filepath.Join(gate, "list.yaml")),
		"directory": audit("", "-f", dir),
	} {
		assert.Equal(t, want, got, name)
	}
}
