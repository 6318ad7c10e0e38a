package apply_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// TestOwnership checks that the owner label is the only ownership claim the
// agent acts on, including when users change objects between the agent's
// read and its write.
func TestOwnership(t *testing.T) {
	f := newFixture(t)
	hooked := &hookedDynamic{Interface: f.dyn}
	a := f.applier(t, func(c *apply.Config) { c.Dynamic = hooked })
	labelled := func(obj map[string]any, value string) map[string]any {
		return withMeta(obj, "labels", map[string]any{outputs.OwnerLabel: value})
	}
	// unchangedSince asserts that obj is byte-for-byte as the user left it.
	unchangedSince := func(t *testing.T, before *unstructured.Unstructured) {
		t.Helper()
		live := f.get(t, virtualServices, before.GetNamespace(), before.GetName())
		require.NotNil(t, live, "the object still exists")
		assert.Equal(t, before.GetResourceVersion(), live.GetResourceVersion())
		assert.Equal(t, before.Object["spec"], live.Object["spec"])
		assert.Equal(t, before.GetLabels(), live.GetLabels())
		assert.Equal(t, before.GetAnnotations(), live.GetAnnotations())
	}

	t.Run("a user's object of the same name is a conflict and never pruned", func(t *testing.T) {
		user := f.create(t, virtualServices, virtualService("app-a", "user-vs", "user.example.com"))
		got := apply1(t, a, output(t, virtualService("app-a", "user-vs", "agent.example.com"), "TrafficPolicy/app-a/tp"))
		r := got[key("VirtualService", "app-a", "user-vs")]
		require.NotNil(t, r)
		assert.Equal(t, "conflict", r.GetOutcome())
		assert.Equal(t, "exists and is not managed by relaymesh; left untouched", r.GetError())
		unchangedSince(t, user)

		got = apply1(t, a)
		assert.NotContains(t, got, key("VirtualService", "app-a", "user-vs"))
		unchangedSince(t, user)
	})

	t.Run("an object labelled with the agent's owner is the agent's", func(t *testing.T) {
		// The label is the ownership claim, whoever set it.
		inSet := f.create(t, virtualServices, labelled(virtualService("app-a", "claimed", "old.example.com"), owner))
		f.create(t, virtualServices, labelled(virtualService("app-b", "claimed-gone", "gone.example.com"), owner))
		got := apply1(t, a, output(t, virtualService("app-a", "claimed", "new.example.com")))
		assert.Equal(t, map[string]string{
			key("VirtualService", "app-a", "claimed"):      "applied",
			key("VirtualService", "app-b", "claimed-gone"): "pruned",
		}, outcomes(got))
		live := f.get(t, virtualServices, "app-a", "claimed")
		assert.Equal(t, []any{"new.example.com"}, live.Object["spec"].(map[string]any)["hosts"], "forced over the other field manager")
		assert.Equal(t, inSet.GetUID(), live.GetUID())
		assert.Nil(t, f.get(t, virtualServices, "app-b", "claimed-gone"))
	})

	t.Run("another owner's objects are never touched", func(t *testing.T) {
		named := f.create(t, virtualServices, labelled(virtualService("app-a", "other-named", "a.example.com"), "other-agent"))
		unnamed := f.create(t, virtualServices, labelled(virtualService("app-b", "other-unnamed", "b.example.com"), "other-agent"))
		got := apply1(t, a, output(t, virtualService("app-a", "other-named", "mine.example.com")))
		assert.Equal(t, map[string]string{
			key("VirtualService", "app-a", "other-named"): "conflict",
			key("VirtualService", "app-a", "claimed"):     "pruned",
		}, outcomes(got))
		unchangedSince(t, named)
		unchangedSince(t, unnamed)
	})

	t.Run("an object created between the agent's read and its write is not adopted", func(t *testing.T) {
		// The user's object has exactly the spec the agent applies, so a
		// server-side apply without force would see no field conflict and
		// silently adopt it; a create refuses it.
		want := virtualService("app-a", "racy", "racy.example.com")
		var user *unstructured.Unstructured
		hooked.setHooks(func(gvr schema.GroupVersionResource, ns, name string, err error) {
			if gvr == virtualServices && name == "racy" && apierrors.IsNotFound(err) && user == nil {
				user = f.create(t, virtualServices, want)
			}
		}, nil)
		got := apply1(t, a, output(t, want))
		hooked.setHooks(nil, nil)
		require.NotNil(t, user, "the hook ran")
		assert.Equal(t, "conflict", got[key("VirtualService", "app-a", "racy")].GetOutcome())
		unchangedSince(t, user)
		live := f.get(t, virtualServices, "app-a", "racy")
		require.Len(t, live.GetManagedFields(), 1)
		assert.Equal(t, "kubectl", live.GetManagedFields()[0].Manager)

		// Why not server-side apply without force: the API server would have
		// taken the user's object (dry run, to show it).
		body, err := json.Marshal(labelled(want, owner))
		require.NoError(t, err)
		adopted, err := f.dyn.Resource(virtualServices).Namespace("app-a").Patch(context.Background(), "racy", types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: apply.FieldManager, DryRun: []string{metav1.DryRunAll}})
		require.NoError(t, err)
		assert.Equal(t, owner, adopted.GetLabels()[outputs.OwnerLabel])
	})

	t.Run("an object disowned between list and write is neither changed nor pruned", func(t *testing.T) {
		f.create(t, virtualServices, labelled(virtualService("app-a", "disowned-named", "a.example.com"), owner))
		f.create(t, virtualServices, labelled(virtualService("app-b", "disowned-unnamed", "b.example.com"), owner))
		var after []*unstructured.Unstructured
		hooked.setHooks(nil, func(gvr schema.GroupVersionResource) {
			if gvr != virtualServices || after != nil {
				return
			}
			// The user takes both objects back after the agent listed them.
			for _, o := range []struct{ ns, name string }{{"app-a", "disowned-named"}, {"app-b", "disowned-unnamed"}} {
				live := f.get(t, virtualServices, o.ns, o.name)
				live.SetLabels(nil)
				updated, err := f.dyn.Resource(virtualServices).Namespace(o.ns).Update(context.Background(), live, metav1.UpdateOptions{FieldManager: "kubectl"})
				require.NoError(t, err)
				after = append(after, updated)
			}
		})
		got := apply1(t, a, output(t, virtualService("app-a", "disowned-named", "mine.example.com")))
		hooked.setHooks(nil, nil)
		require.Len(t, after, 2, "the hook ran")
		assert.Equal(t, "conflict", got[key("VirtualService", "app-a", "disowned-named")].GetOutcome())
		assert.NotContains(t, got, key("VirtualService", "app-b", "disowned-unnamed"))
		unchangedSince(t, after[0])
		unchangedSince(t, after[1])
		assert.Contains(t, f.logs.String(), "not pruned: no longer the agent's object")
	})
}
