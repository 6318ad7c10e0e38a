package apply_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent/apply"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestRefusedSet checks that a set over the limit is refused whole: nothing
// is created and nothing is pruned.
func TestRefusedSet(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	small := f.applier(t, func(c *apply.Config) { c.MaxObjects = 3 })
	got := apply1(t, small, output(t, virtualService("app-a", "existing", "existing.example.com")))
	require.Equal(t, "applied", got[key("VirtualService", "app-a", "existing")].GetOutcome())
	existing := f.get(t, virtualServices, "app-a", "existing")

	var four []*relaypb.OutputObject
	for _, name := range []string{"n1", "n2", "n3", "n4"} {
		four = append(four, output(t, virtualService("app-b", name, name+".example.com")))
	}
	results, err := small.Apply(ctx, &relaypb.OutputSet{Version: 2, Objects: four})
	require.ErrorIs(t, err, apply.ErrSetRefused)
	assert.EqualError(t, err, "output set refused: 4 objects, at most 3")
	assert.Nil(t, results)
	for _, name := range []string{"n1", "n2", "n3", "n4"} {
		assert.Nil(t, f.get(t, virtualServices, "app-b", name), "nothing of a refused set is created")
	}
	assert.Equal(t, existing.GetResourceVersion(), f.get(t, virtualServices, "app-a", "existing").GetResourceVersion(), "nothing is pruned")

	_, err = small.Apply(ctx, nil)
	require.ErrorIs(t, err, apply.ErrSetRefused)

	got = apply1(t, small, four[:3]...)
	assert.Equal(t, map[string]string{
		key("VirtualService", "app-b", "n1"):       "applied",
		key("VirtualService", "app-b", "n2"):       "applied",
		key("VirtualService", "app-b", "n3"):       "applied",
		key("VirtualService", "app-a", "existing"): "pruned",
	}, outcomes(got), "a set at the limit is applied")
}

// TestMissingKind checks that an allowed kind the cluster does not serve
// (its CRD is not installed) is reported once and disturbs nothing else.
func TestMissingKind(t *testing.T) {
	f := newFixture(t)
	nonexistent := schema.GroupVersionKind{Group: "networking.istio.io", Version: "v1", Kind: "Nonexistent"}
	a := f.applier(t, func(c *apply.Config) {
		c.Kinds = append(append([]schema.GroupVersionKind(nil), apply.DefaultKinds...), nonexistent)
	})
	dr := destinationRule("app-a", "old", "old.example.com")
	got := apply1(t, a, output(t, dr))
	require.Equal(t, "applied", got[key("DestinationRule", "app-a", "old")].GetOutcome())
	user := f.create(t, virtualServices, virtualService("app-b", "user", "user.example.com"))

	ghost := map[string]any{"apiVersion": "networking.istio.io/v1", "kind": "Nonexistent", "metadata": map[string]any{"name": "ghost", "namespace": "app-a"}, "spec": map[string]any{}}
	got = apply1(t, a, output(t, virtualService("app-a", "good", "good.example.com")), output(t, ghost))
	assert.Equal(t, map[string]string{
		key("VirtualService", "app-a", "good"): "applied",
		key("Nonexistent", "app-a", "ghost"):   "error",
		key("Nonexistent", "", ""):             "error",
		key("DestinationRule", "app-a", "old"): "pruned",
	}, outcomes(got))
	kindErr := got[key("Nonexistent", "", "")]
	assert.Equal(t, "networking.istio.io/v1", kindErr.GetApiVersion())
	assert.Contains(t, kindErr.GetError(), "kind Nonexistent (networking.istio.io/v1) is not served by the cluster (is its CRD installed?)")
	assert.Contains(t, kindErr.GetError(), "owned objects of this kind were not pruned")
	assert.Contains(t, got[key("Nonexistent", "app-a", "ghost")].GetError(), "is not served by the cluster")
	assert.NotNil(t, f.get(t, virtualServices, "app-a", "good"))
	assert.Nil(t, f.get(t, destinationRules, "app-a", "old"))
	live := f.get(t, virtualServices, "app-b", "user")
	assert.Equal(t, user.GetResourceVersion(), live.GetResourceVersion())

	t.Run("a kind installed later is picked up by the next set", func(t *testing.T) {
		crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": "nonexistents.networking.istio.io"},
			"spec": map[string]any{
				"group": "networking.istio.io", "scope": "Namespaced",
				"names": map[string]any{"kind": "Nonexistent", "listKind": "NonexistentList", "plural": "nonexistents", "singular": "nonexistent"},
				"versions": []any{map[string]any{
					"name": "v1", "served": true, "storage": true,
					"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
				}},
			},
		}}
		_, err := f.dyn.Resource(crds).Create(context.Background(), crd, metav1.CreateOptions{})
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := apply1(t, a, output(t, virtualService("app-a", "good", "good.example.com")), output(t, ghost))
			assert.Equal(c, map[string]string{
				key("VirtualService", "app-a", "good"): "unchanged",
				key("Nonexistent", "app-a", "ghost"):   "applied",
			}, outcomes(got))
		}, 30*time.Second, 200*time.Millisecond)
	})
}
