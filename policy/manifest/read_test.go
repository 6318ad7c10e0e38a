package manifest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/api/crds"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/policy/manifest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var schemas = sync.OnceValues(func() (*manifest.Schemas, error) { return manifest.LoadSchemas(crds.FS) })

func config(t testing.TB) manifest.Config {
	t.Helper()
	s, err := schemas()
	require.NoError(t, err)
	return manifest.Config{Schemas: s, AdminNamespace: "relaymesh"}
}

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// readString reads content as one file.
func readString(t *testing.T, content string) *manifest.World {
	t.Helper()
	w, err := manifest.Read(context.Background(), config(t), nil, write(t, t.TempDir(), "in.yaml", content))
	require.NoError(t, err)
	return w
}

const virtualMesh = `apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: prod, namespace: relaymesh}
spec:
  meshes: [{clusterName: cluster-1, namespace: istio-system, name: istiod}]
`

const accessPolicy = `apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: reviews, namespace: relaymesh}
spec:
  sourceSelector:
  - kubeServiceAccountRefs:
      serviceAccounts: [{name: productpage, namespace: bookinfo, clusterName: cluster-1}]
  destinationSelector:
  - kubeServiceMatcher: {labels: {app: reviews}}
`

// TestReadsTheDemo: the project's own examples/demo directory reads
// without a problem — its Namespaces give labels, its Relaymesh objects are
// kept, everything else is skipped with a note.
func TestReadsTheDemo(t *testing.T) {
	w, err := manifest.Read(context.Background(), config(t), nil, "../../examples/demo/")
	require.NoError(t, err)
	assert.Empty(t, w.Problems)
	assert.Len(t, w.Input.VirtualMeshes, 1)
	assert.Len(t, w.Input.TrafficPolicies, 1)
	assert.Len(t, w.Input.AccessPolicies, 1)
	assert.Equal(t, 3, w.Objects)
	assert.Equal(t, 3, w.Files)
	assert.Contains(t, w.NamespaceLabels, "relaymesh")
	assert.Equal(t, map[string]string{"istio-injection": "enabled"}, w.NamespaceLabels["bookinfo"])
	notes := fmt.Sprint(w.Notes)
	assert.Contains(t, notes, "apps/v1 Deployment: 4 skipped")
	assert.Contains(t, notes, "v1 Service")
	// Defaults are applied as the API server applies them.
	vm := w.Input.VirtualMeshes[0]
	assert.Equal(t, networkingv1alpha1.GlobalAccessEnabled, vm.Spec.GlobalAccessPolicy)
	assert.Equal(t, "None", string(vm.Spec.MTLS.RotationVerification), "the CRD's default for rotationVerification")
	assert.Equal(t, "global", vm.Spec.Federation.HostnameSuffix, "the CRD's default for hostnameSuffix")
	assert.Equal(t, "ECDSAP256", string(vm.Spec.MTLS.Shared.RootCA.Generated.KeyAlgorithm), "the CRD's default for keyAlgorithm")
}

// TestSchemaProblems: what the API server refuses is a Problem with the
// field path and the API server's own message, and the object is left out.
func TestSchemaProblems(t *testing.T) {
	tests := []struct {
		name, in      string
		field, object string
		message       string
	}{
		{"enum", strings.Replace(virtualMesh, "spec:\n", "spec:\n  globalAccessPolicy: Maybe\n", 1), "spec.globalAccessPolicy", "VirtualMesh relaymesh/prod",
			`Unsupported value: "Maybe": supported values: "MeshDefault", "Enabled", "Disabled"`},
		{"CEL rule", strings.Replace(accessPolicy, "kubeServiceMatcher: {labels: {app: reviews}}", "kubeServiceMatcher: {labels: {app: reviews}}\n    kubeServiceRefs: {services: [{name: r, namespace: b, clusterName: c}]}", 1),
			"spec.destinationSelector[0]", "AccessPolicy relaymesh/reviews", "exactly one of kubeServiceMatcher or kubeServiceRefs must be set"},
		{"unknown field", strings.Replace(accessPolicy, "spec:\n", "spec:\n  allowEveryone: true\n", 1), "spec.allowEveryone", "AccessPolicy relaymesh/reviews", `unknown field "spec.allowEveryone"`},
		{"wrong version", strings.Replace(accessPolicy, "v1alpha1", "v1", 1), "apiVersion", "AccessPolicy relaymesh/reviews",
			`Unsupported value: "networking.relaymesh.io/v1": AccessPolicy is served as apiVersion networking.relaymesh.io/v1alpha1`},
		{"wrong group", strings.Replace(accessPolicy, "networking.relaymesh.io", "relaymesh.io", 1), "apiVersion", "AccessPolicy relaymesh/reviews",
			`Unsupported value: "relaymesh.io/v1alpha1": AccessPolicy is served as apiVersion networking.relaymesh.io/v1alpha1`},
		{"unknown kind", strings.Replace(accessPolicy, "kind: AccessPolicy", "kind: AccessRule", 1), "apiVersion", "AccessRule relaymesh/reviews",
			"the group networking.relaymesh.io has no kind AccessRule (it has AccessPolicy, FederatedTrustDomain, TrafficPolicy, VirtualDestination, VirtualMesh)"},
		{"no name", strings.Replace(accessPolicy, "name: reviews, ", "", 1), "metadata.name", "AccessPolicy relaymesh/", "Required value: name or generateName is required"},
		{"bad name", strings.Replace(accessPolicy, "name: reviews", "name: Reviews_1", 1), "metadata.name", "AccessPolicy relaymesh/Reviews_1", "Invalid value: \"Reviews_1\""},
		{"minItems", strings.Replace(virtualMesh, "  meshes: [{clusterName: cluster-1, namespace: istio-system, name: istiod}]\n", "  meshes: []\n", 1), "spec.meshes", "VirtualMesh relaymesh/prod", "should have at least 1 items"},
		{"wrong type", strings.Replace(accessPolicy, "spec:\n", "spec:\n  allowedPorts: [\"eighty\"]\n", 1), "spec.allowedPorts[0]", "AccessPolicy relaymesh/reviews", `Invalid value: "string": spec.allowedPorts[0] in body must be of type integer: "string"`},
		{"no apiVersion", "kind: AccessPolicy\nmetadata: {name: x}\n", "apiVersion", "AccessPolicy", "Required value"},
		{"namespace read as a boolean", strings.Replace(accessPolicy, "namespace: relaymesh", "namespace: y", 1), "metadata", "AccessPolicy",
			"namespace must be a string, not a boolean (quote it: YAML reads unquoted y, n, yes, no, on, off as booleans)"},
		{"metadata not an object", "apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: [x]\n", "metadata", "AccessPolicy", "must be an object, not a list"},
		{"no kind", "apiVersion: networking.relaymesh.io/v1alpha1\nmetadata: {name: x}\n", "kind", "", "Required value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := readString(t, tt.in)
			require.NotEmpty(t, w.Problems)
			p := w.Problems[0]
			assert.Equal(t, tt.field, p.Field, "%v", w.Problems)
			assert.Equal(t, tt.object, p.Object)
			assert.Contains(t, p.Message, tt.message)
			assert.Equal(t, 1, p.Document)
			assert.Zero(t, w.Objects, "a refused object is left out")
			assert.Empty(t, w.Input.AccessPolicies)
			assert.Empty(t, w.Input.VirtualMeshes)
		})
	}
	// The line a CI log shows.
	w := readString(t, strings.Replace(virtualMesh, "spec:\n", "spec:\n  globalAccessPolicy: Maybe\n", 1))
	assert.Regexp(t, `in.yaml: document 1: VirtualMesh relaymesh/prod: spec.globalAccessPolicy: Unsupported value: "Maybe": supported values: "MeshDefault", "Enabled", "Disabled"$`, w.Problems[0].String())
}

// TestListsAndStreams: multi-document YAML, JSON, Lists (kubectl get -o
// yaml) with server-set metadata and status, and standard input.
func TestListsAndStreams(t *testing.T) {
	list := `apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
- apiVersion: networking.relaymesh.io/v1alpha1
  kind: AccessPolicy
  metadata:
    name: reviews
    namespace: relaymesh
    uid: 0b5e7b0c-7a43-4b8e-9a55-6b0c2f3c1d11
    resourceVersion: "4711"
    generation: 3
    creationTimestamp: "2026-11-30T10:00:00Z"
    managedFields: [{manager: kubectl, operation: Apply, apiVersion: networking.relaymesh.io/v1alpha1, fieldsType: FieldsV1, fieldsV1: {f:spec: {}}}]
  spec:
    sourceSelector: [{kubeServiceAccountRefs: {serviceAccounts: [{name: a, namespace: b, clusterName: c}]}}]
  status: {state: Invalid, observedGeneration: 3, errors: [whatever]}
- apiVersion: v1
  kind: Namespace
  metadata: {name: relaymesh, labels: {team: platform}}
`
	w := readString(t, list)
	require.Empty(t, w.Problems)
	require.Len(t, w.Input.AccessPolicies, 1)
	ap := w.Input.AccessPolicies[0]
	assert.Empty(t, ap.Status.State, "create drops the status")
	assert.Equal(t, map[string]string{"team": "platform"}, w.NamespaceLabels["relaymesh"])
	assert.Equal(t, 2, w.Documents)

	json := `{"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": "VirtualMesh", "metadata": {"name": "a", "namespace": "relaymesh"}, "spec": {"meshes": [{"clusterName": "c", "namespace": "n", "name": "m"}]}}
{"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": "VirtualMesh", "metadata": {"name": "b", "namespace": "relaymesh"}, "spec": {"meshes": [{"clusterName": "c", "namespace": "n", "name": "m"}]}}`
	w, err := manifest.Read(context.Background(), config(t), nil, write(t, t.TempDir(), "in.json", json))
	require.NoError(t, err)
	require.Empty(t, w.Problems)
	assert.Len(t, w.Input.VirtualMeshes, 2)

	w, err = manifest.Read(context.Background(), config(t), strings.NewReader(accessPolicy+"---\n"+virtualMesh), manifest.Stdin)
	require.NoError(t, err)
	require.Empty(t, w.Problems)
	assert.Len(t, w.Input.AccessPolicies, 1)
	assert.Len(t, w.Input.VirtualMeshes, 1)
	assert.Empty(t, w.Notes, "nothing skipped")
}

// TestDirectories: recursive, lexical order, only .yaml/.yml/.json, dot
// directories skipped; a file named on its own is read whatever its name.
func TestDirectories(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "b/vm.yml", virtualMesh)
	write(t, dir, "a/deeper/ap.yaml", accessPolicy)
	write(t, dir, "README.md", "apiVersion: [")
	write(t, dir, ".git/config.yaml", "kind: [")
	write(t, dir, ".github/workflows/ci.yaml", "on: push\njobs: {}\n")
	w, err := manifest.Read(context.Background(), config(t), nil, dir)
	require.NoError(t, err)
	require.Empty(t, w.Problems)
	assert.Equal(t, 2, w.Files)
	assert.Len(t, w.Input.AccessPolicies, 1)
	assert.Len(t, w.Input.VirtualMeshes, 1)

	named := write(t, dir, "policy.txt", accessPolicy)
	w, err = manifest.Read(context.Background(), config(t), nil, named)
	require.NoError(t, err)
	assert.Len(t, w.Input.AccessPolicies, 1)

	_, err = manifest.Read(context.Background(), config(t), nil, filepath.Join(dir, "nope"))
	require.ErrorIs(t, err, os.ErrNotExist)
	empty := t.TempDir()
	write(t, empty, "notes.txt", "x")
	_, err = manifest.Read(context.Background(), config(t), nil, empty)
	require.ErrorContains(t, err, "has no .yaml, .yml or .json files")
}

// TestMalformedAndHostile: what cannot be read is a Problem naming the
// document; reading goes on with the next file.
func TestMalformedAndHostile(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "1-bad.yaml", virtualMesh+"---\nkind: [unclosed\n")
	write(t, dir, "2-good.yaml", accessPolicy)
	write(t, dir, "3-scalar.yaml", "just a string\n---\n- a\n- list\n")
	write(t, dir, "4-nested.yaml", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items: []\n- 42\n")
	write(t, dir, "5-types.yaml", "apiVersion: 7\nkind: AccessPolicy\n")
	write(t, dir, "6-dup.yaml", accessPolicy)
	w, err := manifest.Read(context.Background(), config(t), nil, dir)
	require.NoError(t, err)
	var got []string
	for _, p := range w.Problems {
		got = append(got, p.String())
	}
	all := strings.Join(got, "\n")
	assert.Contains(t, all, "1-bad.yaml: document 2: not valid YAML or JSON")
	assert.Contains(t, all, "3-scalar.yaml: document 1: a document must be an object, not a string")
	assert.Contains(t, all, "3-scalar.yaml: document 2: a document must be an object, not a list")
	assert.Contains(t, all, "4-nested.yaml: document 1 item 1: a List inside a List is not read")
	assert.Contains(t, all, "4-nested.yaml: document 1 item 2: a List item must be an object, not a number")
	assert.Contains(t, all, "5-types.yaml: document 1: apiVersion and kind must be strings")
	assert.Contains(t, all, "6-dup.yaml: document 1: AccessPolicy relaymesh/reviews: metadata.name: defined twice: first at "+filepath.Join(dir, "2-good.yaml")+": document 1")
	assert.Len(t, w.Input.VirtualMeshes, 1, "the valid document before the syntax error is kept")
	assert.Len(t, w.Input.AccessPolicies, 1)
}

// TestBounds: beyond a bound reading stops with ErrTooLarge, saying which.
func TestBounds(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "a.yaml", strings.Repeat(accessPolicy+"---\n", 3))
	cfg := config(t)
	cfg.MaxBytes = 100
	_, err := manifest.Read(context.Background(), cfg, nil, p)
	require.ErrorIs(t, err, manifest.ErrTooLarge)
	assert.ErrorContains(t, err, "more than 100 bytes")

	cfg = config(t)
	cfg.MaxDocuments = 2
	_, err = manifest.Read(context.Background(), cfg, nil, p)
	require.ErrorIs(t, err, manifest.ErrTooLarge)
	assert.ErrorContains(t, err, "more than 2 documents")

	cfg = config(t)
	cfg.MaxFiles = 1
	write(t, dir, "b.yaml", virtualMesh)
	_, err = manifest.Read(context.Background(), cfg, nil, dir)
	require.ErrorIs(t, err, manifest.ErrTooLarge)

	// Standard input is bounded the same way.
	cfg = config(t)
	cfg.MaxBytes = 10
	_, err = manifest.Read(context.Background(), cfg, strings.NewReader(strings.Repeat("x", 1<<20)), manifest.Stdin)
	require.ErrorIs(t, err, manifest.ErrTooLarge)
	_, err = manifest.Read(context.Background(), config(t), strings.NewReader(""), manifest.Stdin, manifest.Stdin)
	require.ErrorContains(t, err, "named twice")
	_, err = manifest.Read(context.Background(), manifest.Config{}, nil, p)
	require.ErrorContains(t, err, "schemas: required")
}

// TestRuleSetsAndNamespaces: a ConfigMap labelled as a rule set is read in
// the server's namespace only; other ConfigMaps are skipped.
func TestRuleSetsAndNamespaces(t *testing.T) {
	w := readString(t, `apiVersion: v1
kind: ConfigMap
metadata: {name: team-rules, namespace: relaymesh, labels: {relaymesh.io/admission-policy: ""}}
data:
  rules.rego: "package relaymesh.admission.team\n"
  README: not rego
---
apiVersion: v1
kind: ConfigMap
metadata: {name: elsewhere, namespace: apps, labels: {relaymesh.io/admission-policy: ""}}
data: {rules.rego: "package relaymesh.admission.other\n"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: plain, namespace: relaymesh}
---
apiVersion: v1
kind: Namespace
metadata: {name: apps, labels: {relaymesh.io/environment: production}}
`)
	require.Empty(t, w.Problems)
	require.Len(t, w.RuleSets, 1)
	assert.Equal(t, admission.RuleSet{Name: "relaymesh/team-rules", Files: map[string]string{"rules.rego": "package relaymesh.admission.team\n"}}, w.RuleSets[0])
	assert.Equal(t, 1, w.RuleSetAt["relaymesh/team-rules"].Document)
	assert.Contains(t, fmt.Sprint(w.Notes), "counts only in the server's namespace relaymesh")
	assert.Contains(t, fmt.Sprint(w.Notes), "v1 ConfigMap: skipped")
	assert.Equal(t, "production", w.NamespaceLabels["apps"]["relaymesh.io/environment"])
}
