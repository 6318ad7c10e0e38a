package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// auditWorld is the golden input of policy/accessaudit: VirtualMesh prod
// (deny by default, reviews federated to mesh 2) and five AccessPolicies.
const auditWorld = "../../policy/accessaudit/testdata/virtualmesh/input.yaml"

// auditDir returns a directory holding only the audit world (the golden
// directory also holds .json outputs, which -f would read as input).
func auditDir(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(auditWorld)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "world.yaml"), b, 0o600))
	return dir
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

const morePostsToReviews = `apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: reviews-from-productpage, namespace: relaymesh}
spec:
  sourceSelector:
  - kubeServiceAccountRefs:
      serviceAccounts:
      - {name: bookinfo-productpage, namespace: bookinfo, clusterName: cluster-1}
  destinationSelector:
  - kubeServiceRefs:
      services:
      - {name: reviews, namespace: bookinfo, clusterName: cluster-1}
  allowedMethods: [GET, POST]
`

// TestPolicyAudit runs policy audit with -f: table output, what-if, and
// refusals of bad input with a clear message and exit code.
func TestPolicyAudit(t *testing.T) {
	dir := auditDir(t)
	tmp := t.TempDir()
	with := writeFile(t, tmp, "with.yaml", morePostsToReviews)
	malformed := writeFile(t, tmp, "malformed.yaml", "apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: [unclosed\n")
	foreign := writeFile(t, tmp, "foreign.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: apps}\n")
	unknownField := writeFile(t, tmp, "unknown-field.yaml", "apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: x, namespace: apps}\nspec: {allowEveryone: true}\n")
	empty := writeFile(t, tmp, "empty.yaml", "# nothing\n")
	refused := writeFile(t, tmp, "refused.yaml", "apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: everyone, namespace: relaymesh}\nspec: {}\n")
	badDir := t.TempDir()
	writeFile(t, badDir, "x.yaml", "kind: [")
	tests := []struct {
		name     string
		args     []string
		code     int
		out, err []string
	}{
		{"table", []string{"audit", "-f", dir}, 1, []string{
			"INPUT: 1 file, 26 documents, 26 Relaymesh objects read; 0 problems (refused as the API server would, left out), 0 notes",
			"ACCESS MATRIX: 9 allowed pairs (1 open) between 7 source identities and 6 destinations",
			"cluster-2/tools/sleep                    cluster-1/bookinfo/reviews  9080  federated via relaymesh/prod  relaymesh/reviews-from-tools",
			"cluster-1/bookinfo/bookinfo-productpage  cluster-1/bookinfo/reviews  9080  local                         relaymesh/reviews-from-productpage [methods GET]",
			"FINDINGS: 3",
			"unreachable-grant",
		}, nil},
		{"a medium finding passes --fail-on high", []string{"audit", "-f", dir, "--fail-on", "high"}, 0, []string{"FINDINGS: 3"}, nil},
		{"and --fail-on none", []string{"audit", "-f", dir, "--fail-on", "none"}, 0, []string{"FINDINGS: 3"}, nil},
		{"what-if change", []string{"audit", "-f", dir, "--with", with}, 0, []string{
			"ACCESS CHANGES: 0 added, 0 removed, 1 changed",
			"~  cluster-1/bookinfo/bookinfo-productpage  cluster-1/bookinfo/reviews  9080  local: relaymesh/reviews-from-productpage [methods GET]  local: relaymesh/reviews-from-productpage [methods GET,POST]",
		}, nil},
		{"what-if delete", []string{"audit", "--without", "ap/relaymesh/reviews-from-tools", "-f", dir}, 0, []string{
			"ACCESS CHANGES: 0 added, 1 removed, 0 changed",
			"-  cluster-2/tools/sleep  cluster-1/bookinfo/reviews  9080  federated via relaymesh/prod: relaymesh/reviews-from-tools  -",
			"FINDINGS RESOLVED: 1",
		}, nil},
		{"what-if delete a discovered object", []string{"audit", "-f", dir, "--without", "workload/relaymesh/sleep-tools-cluster-2-deployment", "--without", "destination/relaymesh/legacy-db-cluster-3"}, 0, []string{
			"ACCESS CHANGES: 0 added, 2 removed, 0 changed",
		}, nil},
		{"what-if nothing changes", []string{"audit", "-f", dir, "--with", auditWorld}, 0, []string{
			"ACCESS CHANGES: 0 added, 0 removed, 0 changed",
		}, nil},
		{"what-if of a refused policy adds nothing and is invalid input", []string{"audit", "-f", dir, "--with", refused}, 2, []string{
			"ACCESS CHANGES: 0 added, 0 removed, 0 changed",
			"refused-by-admission",
		}, []string{"invalid input"}},
		{"help", []string{"audit", "--help"}, 0, []string{"relaymesh policy audit [flags]", "--without", "What-if", "Examples:", "Exit code", "--fail-on"}, nil},
		{"help without subcommand", []string{"--help"}, 0, []string{"relaymesh policy [command]", "audit", "export"}, nil},
		{"yaml", []string{"audit", "-f", dir, "-o", "yaml"}, 1, []string{"schema: " + accessaudit.Schema, "matrix:"}, nil},
		{"no subcommand", nil, 2, nil, []string{"want a subcommand: audit, export"}},
		{"unknown subcommand", []string{"check"}, 2, nil, []string{`unknown subcommand "check": want audit, export`}},
		{"stray argument", []string{"audit", "-f", dir, "extra"}, 2, nil, []string{`want no arguments, got ["extra"]`}},
		{"bad output", []string{"audit", "-f", dir, "--output", "xml"}, 2, nil, []string{`-o "xml": want table, wide, json, yaml or html`}},
		{"bad fail-on", []string{"audit", "-f", dir, "--fail-on", "warning"}, 2, nil, []string{`--fail-on "warning": want high, medium, low, info, none`}},
		{"bad without", []string{"audit", "-f", dir, "--without", "reviews"}, 2, nil, []string{"--without \"reviews\": want KIND/NAMESPACE/NAME"}},
		{"without unknown kind", []string{"audit", "-f", dir, "--without", "service/bookinfo/reviews"}, 2, nil, []string{`unknown kind "service"`}},
		{"without missing object", []string{"audit", "-f", dir, "--without", "ap/relaymesh/nope"}, 2, nil, []string{"cannot remove AccessPolicy/relaymesh/nope: not found"}},
		{"with missing file", []string{"audit", "-f", dir, "--with", filepath.Join(tmp, "nope.yaml")}, 2, nil, []string{"--with: stat", "no such file or directory"}},
		{"with malformed YAML", []string{"audit", "-f", dir, "--with", malformed}, 2, []string{malformed + ": document 1: not valid YAML or JSON"}, []string{"invalid input"}},
		{"with a foreign kind only", []string{"audit", "-f", dir, "--with", foreign}, 2, nil, []string{foreign + " has no Relaymesh objects"}},
		{"with unknown field", []string{"audit", "-f", dir, "--with", unknownField}, 2, []string{`AccessPolicy apps/x: spec.allowEveryone: unknown field "spec.allowEveryone"`}, []string{"invalid input"}},
		{"with nothing", []string{"audit", "-f", dir, "--with", empty}, 2, nil, []string{"has no Relaymesh objects"}},
		{"with and -f both stdin", []string{"audit", "-f", "-", "--with", "-"}, 2, nil, []string{"both read standard input"}},
		{"malformed view", []string{"audit", "-f", badDir}, 2, []string{"x.yaml: document 1: not valid YAML or JSON"}, []string{"invalid input"}},
		{"missing dir", []string{"audit", "-f", filepath.Join(tmp, "nope")}, 2, nil, []string{"-f: stat", "no such file or directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			assert.Equal(t, tt.code, run(context.Background(), append([]string{"policy"}, tt.args...), &out, &errOut), "stderr: %s", errOut.String())
			for _, s := range tt.out {
				assert.Contains(t, out.String(), s)
			}
			for _, s := range tt.err {
				assert.Contains(t, errOut.String(), s)
			}
		})
	}
}

// TestPolicyAuditJSON checks the JSON forms decode strictly into the
// package's types, and --out writes the file (0600) instead of stdout.
func TestPolicyAuditJSON(t *testing.T) {
	dir := auditDir(t)
	var out, errOut bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"policy", "audit", "-f", dir, "--output", "json"}, &out, &errOut), errOut.String())
	var r accessaudit.Result
	dec := json.NewDecoder(&out)
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&r))
	assert.Equal(t, accessaudit.Schema, r.Schema)
	assert.Len(t, r.Matrix.Pairs, 9)
	assert.Len(t, r.Matrix.Sources, 7)

	path := filepath.Join(t.TempDir(), "diff.json")
	out.Reset()
	assert.Equal(t, 1, run(context.Background(), []string{"policy", "audit", "-f", dir, "--without", "vm/relaymesh/prod", "--output", "json", "--out", path}, &out, &errOut), "findings added: %s", errOut.String())
	assert.Empty(t, out.String())
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var d accessaudit.Diff
	dec = json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&d))
	// Without the VirtualMesh nothing is deny-by-default or federated: the
	// federated pair goes, every destination without a policy opens.
	assert.NotEmpty(t, d.Added)
	require.Len(t, d.Removed, 1)
	assert.Equal(t, "cluster-2/tools/sleep", d.Removed[0].Source)
}

// TestPolicyAuditHTML: one self-contained page with the picture.
func TestPolicyAuditHTML(t *testing.T) {
	dir := auditDir(t)
	for _, args := range [][]string{{}, {"--without", "ap/relaymesh/reviews-from-tools"}} {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(context.Background(), append([]string{"policy", "audit", "-f", dir, "--output", "html", "--fail-on", "none"}, args...), &out, &errOut), errOut.String())
		page := out.String()
		assert.True(t, strings.HasPrefix(page, "<!DOCTYPE html>"))
		assert.Contains(t, page, "<svg")
		assert.Contains(t, page, "cluster-1/bookinfo/reviews:9080")
		assert.NotContains(t, page, "<script")
		assert.NotContains(t, page, "<link")
	}
}

// TestPolicyAuditBounds: inputs above the object or byte bounds are refused
// with a message that says which bound.
func TestPolicyAuditBounds(t *testing.T) {
	dir := auditDir(t)
	objects, bytesLimit := auditMaxObjects, auditMaxBytes
	t.Cleanup(func() { auditMaxObjects, auditMaxBytes = objects, bytesLimit })

	auditMaxObjects = 10
	var out, errOut bytes.Buffer
	assert.Equal(t, 2, run(context.Background(), []string{"policy", "audit", "-f", dir}, &out, &errOut))
	assert.Contains(t, errOut.String(), "input too large: 23 objects, at most 10 are audited")

	auditMaxObjects = 23
	with := writeFile(t, t.TempDir(), "with.yaml", morePostsToReviews+"---\n"+strings.Replace(morePostsToReviews, "reviews-from-productpage", "another", 1))
	errOut.Reset()
	assert.Equal(t, 2, run(context.Background(), []string{"policy", "audit", "-f", dir, "--with", with}, &out, &errOut))
	assert.Contains(t, errOut.String(), "with the change: input too large: 24 objects, at most 23")

	auditMaxObjects = objects
	auditMaxBytes = 1024
	errOut.Reset()
	assert.Equal(t, 2, run(context.Background(), []string{"policy", "audit", "-f", dir}, &out, &errOut))
	assert.Contains(t, errOut.String(), "-f: input too large: the files add up to more than 1024 bytes")
	auditMaxBytes = bytesLimit
	big := writeFile(t, t.TempDir(), "big.yaml", fmt.Sprintf("# %s\n", strings.Repeat("x", 2048)))
	auditMaxBytes = 1024
	errOut.Reset()
	// The view and the change are bounded apart: the view fits.
	small := writeFile(t, t.TempDir(), "small.yaml", morePostsToReviews)
	assert.Equal(t, 2, run(context.Background(), []string{"policy", "audit", "-f", small, "--with", big}, &out, &errOut))
	assert.Contains(t, errOut.String(), "--with: input too large: the files add up to more than 1024 bytes")
}
