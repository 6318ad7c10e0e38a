package outputs_test

import (
	"testing"

	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestIstioKindsAreOneListInStep: the kinds, their resources and the
// lookup all come from the one list, in its order, and a caller changing
// what it got changes nobody else's.
func TestIstioKindsAreOneListInStep(t *testing.T) {
	kinds, gvks, gvrs := outputs.IstioKinds(), outputs.IstioGroupVersionKinds(), outputs.IstioResources()
	require.Len(t, gvks, len(kinds))
	require.Len(t, gvrs, len(kinds))
	for i, k := range kinds {
		assert.Equal(t, k.Kind, gvks[i])
		assert.Equal(t, k.Resource, gvrs[i])
		assert.Equal(t, k.Kind.GroupVersion(), k.Resource.GroupVersion(), "%s", k.Kind.Kind)
		r, ok := outputs.IstioResource(k.Kind.GroupKind())
		assert.True(t, ok)
		assert.Equal(t, k.Resource, r)
	}
	r, ok := outputs.IstioResource(schema.GroupKind{Group: "gateway.networking.k8s.io", Kind: "Gateway"})
	assert.False(t, ok, "a Gateway API Gateway is not the Istio Gateway")
	assert.Zero(t, r)

	kinds[0].Resource.Resource = "changed"
	gvrs[0].Resource = "changed"
	assert.Equal(t, outputs.VirtualServices, outputs.IstioResources()[0])
	assert.Equal(t, outputs.VirtualServices, outputs.IstioKinds()[0].Resource)
}
