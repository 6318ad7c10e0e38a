package apply_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

func httpRoute(ns, name, service string) map[string]any {
	return map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"parentRefs": []any{map[string]any{"group": "", "kind": "Service", "name": service, "port": int64(9080)}},
			"rules":      []any{map[string]any{"backendRefs": []any{map[string]any{"name": service, "port": int64(9080)}}}},
		},
	}
}

// TestOptionalKindsAreQuietUntilUsed: the Gateway API routes are optional
// kinds of the agent. On a cluster without their CRDs a set of Istio
// objects applies with no error result for them; a route in the set fails
// by itself, saying its kind is not served. Once the CRD is installed the
// next set applies the route, and a set without it prunes it.
func TestOptionalKindsAreQuietUntilUsed(t *testing.T) {
	f := newFixture(t)
	a := f.applier(t, func(c *apply.Config) {
		c.Kinds = append(slices.Clone(apply.DefaultKinds), apply.GatewayRouteKinds...)
		c.OptionalKinds = apply.GatewayRouteKinds
	})
	got := apply1(t, a, output(t, virtualService("app-a", "vs", "vs.example.com")))
	assert.Equal(t, map[string]string{key("VirtualService", "app-a", "vs"): "applied"}, outcomes(got), "no result for the unserved optional kinds")

	route := httpRoute("app-a", "relaymesh-reviews", "reviews")
	got = apply1(t, a, output(t, virtualService("app-a", "vs", "vs.example.com")), output(t, route, "TrafficPolicy/app-a/canary"))
	assert.Equal(t, map[string]string{
		key("VirtualService", "app-a", "vs"):           "unchanged",
		key("HTTPRoute", "app-a", "relaymesh-reviews"): "error",
	}, outcomes(got))
	assert.Contains(t, got[key("HTTPRoute", "app-a", "relaymesh-reviews")].GetError(), "is not served by the cluster")

	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "httproutes.gateway.networking.k8s.io",
			// A *.k8s.io group needs it, as the real CRD has it.
			"annotations": map[string]any{"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/4530"}},
		"spec": map[string]any{
			"group": "gateway.networking.k8s.io", "scope": "Namespaced",
			"names": map[string]any{"kind": "HTTPRoute", "listKind": "HTTPRouteList", "plural": "httproutes", "singular": "httproute"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
			}},
		},
	}}
	_, err := f.dyn.Resource(crds).Create(context.Background(), crd, metav1.CreateOptions{})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := apply1(t, a, output(t, virtualService("app-a", "vs", "vs.example.com")), output(t, route, "TrafficPolicy/app-a/canary"))
		assert.Equal(c, map[string]string{
			key("VirtualService", "app-a", "vs"):           "unchanged",
			key("HTTPRoute", "app-a", "relaymesh-reviews"): "applied",
		}, outcomes(got), "GRPCRoute, still unserved, stays quiet")
	}, 30*time.Second, 200*time.Millisecond)
	routes := schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
	live := f.get(t, routes, "app-a", "relaymesh-reviews")
	require.NotNil(t, live)
	assert.Equal(t, owner, live.GetLabels()["relaymesh.io/owner"])

	got = apply1(t, a, output(t, virtualService("app-a", "vs", "vs.example.com")))
	assert.Equal(t, map[string]string{
		key("VirtualService", "app-a", "vs"):           "unchanged",
		key("HTTPRoute", "app-a", "relaymesh-reviews"): "pruned",
	}, outcomes(got))
	assert.Nil(t, f.get(t, routes, "app-a", "relaymesh-reviews"))
}

// TestOptionalKindsMustBeAllowed: an optional kind that is not one of
// Kinds (or another version of one) is a config error.
func TestOptionalKindsMustBeAllowed(t *testing.T) {
	other := schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1beta1", Kind: "HTTPRoute"}
	for _, c := range []struct {
		kinds, optional []schema.GroupVersionKind
		ok              bool
	}{
		{append(slices.Clone(apply.DefaultKinds), apply.GatewayRouteKinds...), apply.GatewayRouteKinds, true},
		{apply.DefaultKinds, apply.GatewayRouteKinds, false},
		{append(slices.Clone(apply.DefaultKinds), apply.GatewayRouteKinds...), []schema.GroupVersionKind{other}, false},
	} {
		cfg := apply.Config{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Mapper: meta.NewDefaultRESTMapper(nil), Owner: owner, Kinds: c.kinds, OptionalKinds: c.optional}.Default()
		err := cfg.Validate()
		if c.ok {
			assert.NoError(t, err)
		} else {
			assert.ErrorContains(t, err, "optionalKinds[0]")
		}
	}
}
