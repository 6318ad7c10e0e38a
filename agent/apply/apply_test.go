package apply_test

import (
	"context"
	"testing"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/api/outputs"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestApplyLifecycle walks one set through create, no-op, change, field
// removal and prune on a real kube-apiserver.
func TestApplyLifecycle(t *testing.T) {
	f := newFixture(t)
	hooked := &hookedDynamic{Interface: f.dyn}
	a := f.applier(t, func(c *apply.Config) { c.Dynamic = hooked })
	vs := virtualService("app-a", "reviews", "reviews.app-a.svc.cluster.local")
	dr := destinationRule("app-a", "reviews", "reviews.app-a.svc.cluster.local")
	se := serviceEntry("app-b", "api", "api.example.com")
	set := func(vs map[string]any, more ...*relaypb.OutputObject) []*relaypb.OutputObject {
		return append([]*relaypb.OutputObject{output(t, vs, "TrafficPolicy/app-a/tp-2", "TrafficPolicy/app-a/tp-1", "TrafficPolicy/app-a/tp-2")}, more...)
	}
	full := set(vs, output(t, dr, "TrafficPolicy/app-a/tp-1"), output(t, se, "VirtualDestination/app-b/api"))
	var rv map[string]string

	t.Run("new objects are applied, labelled and annotated", func(t *testing.T) {
		results, err := a.Apply(context.Background(), &relaypb.OutputSet{Version: 1, Objects: full})
		require.NoError(t, err)
		// Sorted by apiVersion, kind, namespace, name.
		var order []string
		for _, r := range results {
			order = append(order, r.GetKind()+"/"+r.GetNamespace()+"/"+r.GetName()+"="+r.GetOutcome()+r.GetError())
		}
		assert.Equal(t, []string{
			"DestinationRule/app-a/reviews=applied",
			"ServiceEntry/app-b/api=applied",
			"VirtualService/app-a/reviews=applied",
		}, order)
		rv = map[string]string{}
		for _, c := range []struct {
			obj     *unstructured.Unstructured
			parents string
		}{
			{f.get(t, virtualServices, "app-a", "reviews"), "TrafficPolicy/app-a/tp-1,TrafficPolicy/app-a/tp-2"},
			{f.get(t, destinationRules, "app-a", "reviews"), "TrafficPolicy/app-a/tp-1"},
			{f.get(t, serviceEntries, "app-b", "api"), "VirtualDestination/app-b/api"},
		} {
			require.NotNil(t, c.obj)
			assert.Equal(t, owner, c.obj.GetLabels()[outputs.OwnerLabel])
			assert.Equal(t, c.parents, c.obj.GetAnnotations()[outputs.ParentsAnnotation], "sorted and de-duplicated")
			// Created with a plain create, then owned exactly as a
			// server-side apply would own it.
			mf := c.obj.GetManagedFields()
			require.Len(t, mf, 1)
			assert.Equal(t, apply.FieldManager, mf[0].Manager)
			assert.Equal(t, metav1.ManagedFieldsOperationApply, mf[0].Operation)
			rv[c.obj.GetKind()] = c.obj.GetResourceVersion()
		}
		assert.Contains(t, f.logs.String(), "msg=applied")
		assert.NotContains(t, f.logs.String(), "tp-1", "the log never carries manifests")
	})

	t.Run("the same set again changes nothing", func(t *testing.T) {
		writes := hooked.writeCount()
		got := apply1(t, a, full...)
		assert.Equal(t, writes, hooked.writeCount(), "an up-to-date object costs no write request")
		assert.Equal(t, map[string]string{
			key("VirtualService", "app-a", "reviews"):  "unchanged",
			key("DestinationRule", "app-a", "reviews"): "unchanged",
			key("ServiceEntry", "app-b", "api"):        "unchanged",
		}, outcomes(got))
		assert.Equal(t, rv["VirtualService"], f.get(t, virtualServices, "app-a", "reviews").GetResourceVersion())
		assert.Equal(t, rv["DestinationRule"], f.get(t, destinationRules, "app-a", "reviews").GetResourceVersion())
	})

	t.Run("a changed object is applied and a dropped field removed", func(t *testing.T) {
		changed := deepCopy(vs)
		spec := changed["spec"].(map[string]any)
		delete(spec, "gateways")
		spec["http"].([]any)[0].(map[string]any)["timeout"] = "5s"
		got := apply1(t, a, set(changed, full[1:]...)...)
		assert.Equal(t, map[string]string{
			key("VirtualService", "app-a", "reviews"):  "applied",
			key("DestinationRule", "app-a", "reviews"): "unchanged",
			key("ServiceEntry", "app-b", "api"):        "unchanged",
		}, outcomes(got))
		live := f.get(t, virtualServices, "app-a", "reviews")
		_, found, _ := unstructured.NestedSlice(live.Object, "spec", "gateways")
		assert.False(t, found, "a field the agent no longer applies is removed")
		http, _, _ := unstructured.NestedSlice(live.Object, "spec", "http")
		require.Len(t, http, 1)
		assert.Equal(t, "5s", http[0].(map[string]any)["timeout"])
		full[0] = set(changed)[0]
	})

	t.Run("drift by another writer is repaired", func(t *testing.T) {
		// A user edits fields the agent owns: a plain field of the
		// VirtualService and an item of the ServiceEntry's keyed port list.
		for _, e := range []struct {
			gvr  schema.GroupVersionResource
			ns   string
			edit func(o *unstructured.Unstructured)
		}{
			{virtualServices, "app-a", func(o *unstructured.Unstructured) {
				require.NoError(t, unstructured.SetNestedStringSlice(o.Object, []string{"evil.example.com"}, "spec", "hosts"))
			}},
			{serviceEntries, "app-b", func(o *unstructured.Unstructured) {
				ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
				ports[0].(map[string]any)["number"] = int64(8443)
				require.NoError(t, unstructured.SetNestedSlice(o.Object, ports, "spec", "ports"))
			}},
		} {
			name := map[string]string{"app-a": "reviews", "app-b": "api"}[e.ns]
			live := f.get(t, e.gvr, e.ns, name)
			e.edit(live)
			_, err := f.dyn.Resource(e.gvr).Namespace(e.ns).Update(context.Background(), live, metav1.UpdateOptions{FieldManager: "kubectl-edit"})
			require.NoError(t, err)
		}
		got := apply1(t, a, full...)
		assert.Equal(t, map[string]string{
			key("VirtualService", "app-a", "reviews"):  "applied",
			key("DestinationRule", "app-a", "reviews"): "unchanged",
			key("ServiceEntry", "app-b", "api"):        "applied",
		}, outcomes(got))
		hosts, _, _ := unstructured.NestedStringSlice(f.get(t, virtualServices, "app-a", "reviews").Object, "spec", "hosts")
		assert.Equal(t, []string{"reviews.app-a.svc.cluster.local"}, hosts)
		ports, _, _ := unstructured.NestedSlice(f.get(t, serviceEntries, "app-b", "api").Object, "spec", "ports")
		assert.Equal(t, int64(443), ports[0].(map[string]any)["number"])
		writes := hooked.writeCount()
		got = apply1(t, a, full...)
		assert.Equal(t, writes, hooked.writeCount(), "repaired objects are up to date again")
		for k, r := range got {
			assert.Equal(t, "unchanged", r.GetOutcome(), k)
		}
	})

	t.Run("an object missing from the set is pruned", func(t *testing.T) {
		seBefore := f.get(t, serviceEntries, "app-b", "api").GetResourceVersion()
		got := apply1(t, a, full[0], full[2])
		assert.Equal(t, map[string]string{
			key("VirtualService", "app-a", "reviews"):  "unchanged",
			key("DestinationRule", "app-a", "reviews"): "pruned",
			key("ServiceEntry", "app-b", "api"):        "unchanged",
		}, outcomes(got))
		assert.Equal(t, "networking.istio.io/v1", got[key("DestinationRule", "app-a", "reviews")].GetApiVersion())
		assert.Nil(t, f.get(t, destinationRules, "app-a", "reviews"))
		assert.Equal(t, seBefore, f.get(t, serviceEntries, "app-b", "api").GetResourceVersion(), "others untouched")
		assert.Contains(t, f.logs.String(), "msg=pruned")
	})

	t.Run("a manifest of unknown identity suspends pruning", func(t *testing.T) {
		garbage := &relaypb.OutputObject{Manifest: []byte(`{"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": {"name": 7}}`)}
		got := apply1(t, a, full[0], garbage)
		require.Len(t, got, 2)
		assert.Equal(t, "unchanged", got[key("VirtualService", "app-a", "reviews")].GetOutcome())
		bad := got[key("ServiceEntry", "", "")]
		require.NotNil(t, bad)
		assert.Equal(t, "error", bad.GetOutcome())
		assert.Contains(t, bad.GetError(), "metadata.name: required string")
		assert.Contains(t, bad.GetError(), "nothing was pruned")
		assert.NotNil(t, f.get(t, serviceEntries, "app-b", "api"), "it might have been the ServiceEntry the set meant")

		got = apply1(t, a, full[0], output(t, withMeta(se, "finalizers", []any{"x"})))
		assert.Equal(t, "error", got[key("ServiceEntry", "app-b", "api")].GetOutcome())
		assert.NotNil(t, f.get(t, serviceEntries, "app-b", "api"), "an invalid object the set names is kept as last applied")

		got = apply1(t, a, full[0])
		assert.Equal(t, "pruned", got[key("ServiceEntry", "app-b", "api")].GetOutcome())
	})

	t.Run("an empty set prunes everything the agent owns", func(t *testing.T) {
		got := apply1(t, a)
		assert.Equal(t, map[string]string{key("VirtualService", "app-a", "reviews"): "pruned"}, outcomes(got))
		assert.Nil(t, f.get(t, virtualServices, "app-a", "reviews"))
	})
}
