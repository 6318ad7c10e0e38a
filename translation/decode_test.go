package translation_test

import (
	"testing"

	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const goodInput = `apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: a, namespace: relaymesh}
spec: {allowedMethods: [GET]}
---
apiVersion: discovery.relaymesh.io/v1alpha1
kind: Mesh
metadata: {name: istiod-istio-system-c1, namespace: relaymesh}
spec: {istio: {installation: {namespace: istio-system, cluster: c1}, trustDomain: c1.local}}
`

func TestDecode(t *testing.T) {
	in := &translation.Input{}
	require.NoError(t, in.Decode([]byte(goodInput)))
	assert.Len(t, in.AccessPolicies, 1)
	assert.Len(t, in.Meshes, 1)

	for name, tt := range map[string]struct{ doc, want string }{
		"unknown field": {"apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: a}\nspec: {allowedMethodz: [GET]}", "unknown field"},
		"not an input":  {"apiVersion: v1\nkind: Secret\nmetadata: {name: s}", "not a translation input"},
		"no name":       {"apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nspec: {}", "metadata.name are required"},
		"garbage":       {"{{{", "document 0"},
		"wrong type":    {"apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: a}\nspec: {allowedPorts: [eighty]}", "AccessPolicy a"},
	} {
		t.Run(name, func(t *testing.T) {
			err := (&translation.Input{}).Decode([]byte(tt.doc))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(goodInput))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		in := &translation.Input{}
		_ = in.Decode(b) // must not panic
	})
}
