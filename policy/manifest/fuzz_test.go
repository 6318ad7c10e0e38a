package manifest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/policy/manifest"
	"github.com/stretchr/testify/require"
)

// FuzzSplit: whatever the bytes, splitting into documents and List items
// does not panic, is bounded, and keeps only objects; reading them never
// panics and never keeps an object it reported a problem for.
func FuzzSplit(f *testing.F) {
	for _, s := range []string{virtualMesh, accessPolicy + "---\n" + virtualMesh, "apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(accessPolicy, "\n", "\n  "),
		`{"apiVersion":"v1","kind":"List","items":[{"kind":"List","items":[]}, 3]}`, "kind: [", "---\n---\n", "a: &a [*a]", "- 1\n- 2\n"} {
		f.Add([]byte(s))
	}
	for _, dir := range []string{"../../examples/demo", "../accessaudit/testdata/virtualmesh"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, p := range files {
			b, err := os.ReadFile(p)
			require.NoError(f, err)
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		docs, problems, err := manifest.Split(b, "in", 50)
		if err != nil {
			require.ErrorIs(t, err, manifest.ErrTooLarge)
			return
		}
		require.LessOrEqual(t, len(docs), 50)
		for _, d := range docs {
			require.NotNil(t, d.Object)
			require.Equal(t, "in", d.Source)
			require.Positive(t, d.Document)
		}
		for _, p := range problems {
			require.NotEmpty(t, p.Message)
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "in.yaml")
		require.NoError(t, os.WriteFile(path, b, 0o600))
		cfg := config(t)
		cfg.MaxDocuments = 50
		w, err := manifest.Read(context.Background(), cfg, nil, path)
		if err != nil {
			require.ErrorIs(t, err, manifest.ErrTooLarge)
			return
		}
		require.LessOrEqual(t, w.Objects, len(docs))
		require.Equal(t, w.Objects, len(w.Input.Meshes)+len(w.Input.Workloads)+len(w.Input.Destinations)+len(w.Input.VirtualMeshes)+
			len(w.Input.TrafficPolicies)+len(w.Input.AccessPolicies)+len(w.Input.VirtualDestinations)+len(w.Input.Clusters))
	})
}
