package apply_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/federation"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	services        = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	workloadEntries = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}
	gateways        = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
)

// goldenSet is what the server sends cluster-1 for a federation golden's
// input: the real translator's output, of n objects.
func goldenSet(t *testing.T, golden string, translate func(*translation.Input, *translation.Output, *translation.Report), n int, what string) []*relaypb.OutputObject {
	t.Helper()
	return editedGoldenSet(t, golden, nil, translate, n, what)
}

// editedGoldenSet is goldenSet with the golden's input changed by edit
// first (nil: unchanged).
func editedGoldenSet(t *testing.T, golden string, edit func(*translation.Input), translate func(*translation.Input, *translation.Output, *translation.Report), n int, what string) []*relaypb.OutputObject {
	t.Helper()
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "federation", "testdata", golden))
	if edit != nil {
		edit(in)
	}
	out, r := translation.NewOutput(), translation.NewReport()
	translate(in, out, r)
	set := translationtest.OutputSet(t, out, "cluster-1")
	require.Len(t, set, n, what)
	return set
}

// ambientFixture is a cluster with Gateway API's CRDs and the namespaces
// ambient federation writes into.
func ambientFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t)
	ctx := context.Background()
	translationtest.InstallGatewayAPI(ctx, t, f.cluster)
	for _, ns := range []string{"shop", "istio-system"} {
		_, err := f.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	return f
}

// ambientFederationSet is cluster-1's for the ambient-multinetwork golden.
func ambientFederationSet(t *testing.T) []*relaypb.OutputObject {
	t.Helper()
	return goldenSet(t, "ambient-multinetwork", federation.Translate, 4, "a Gateway, a Service and two WorkloadEntries")
}

// An agent with ambient federation on applies the translator's objects to
// a real apiserver with their labels and annotations (what istiod reads),
// prunes them when they are no longer sent, and never takes over a
// user's Service of the same name; off, it refuses them as not its kinds
// and changes nothing.
func TestAmbientFederationObjectsApplyAndPrune(t *testing.T) {
	f := ambientFixture(t)
	set := ambientFederationSet(t)
	want := []string{
		key("Gateway", "istio-system", "relaymesh-cluster-2-istio-eastwest"),
		key("Service", "shop", "ratings"),
		key("WorkloadEntry", "shop", "ratings-cluster-2-10-2-0-21-5ee8b31b"),
		key("WorkloadEntry", "shop", "ratings-cluster-2-10-2-0-22-ebd6ec0f"),
	}

	// Off (the default): not the agent's kinds, nothing written.
	results := apply1(t, f.applier(t, nil), set...)
	for _, k := range want {
		require.Contains(t, results, k)
		assert.Equal(t, apply.OutcomeError, results[k].GetOutcome(), k)
		assert.Contains(t, results[k].GetError(), "is not managed by the agent", k)
	}
	assert.Nil(t, f.get(t, services, "shop", "ratings"))

	on := f.applier(t, func(c *apply.Config) {
		c.Kinds = append(append(c.Kinds, apply.GatewayRouteKinds...), apply.AmbientFederationKinds...)
		c.OptionalKinds = append(append(c.OptionalKinds, apply.GatewayRouteKinds...), apply.AmbientFederationGateway)
	})
	results = apply1(t, on, set...)
	for _, k := range want {
		require.Contains(t, results, k)
		assert.Equal(t, apply.OutcomeApplied, results[k].GetOutcome(), "%s: %s", k, results[k].GetError())
	}
	svc := f.get(t, services, "shop", "ratings")
	require.NotNil(t, svc)
	assert.Equal(t, "true", svc.GetLabels()["istio.io/global"], "istiod makes it global by this label")
	assert.Equal(t, owner, svc.GetLabels()[outputs.OwnerLabel])
	selector, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	assert.Equal(t, map[string]string{federation.LabelGlobalService: "ratings"}, selector)
	gw := f.get(t, gateways, "istio-system", "relaymesh-cluster-2-istio-eastwest")
	require.NotNil(t, gw)
	assert.Equal(t, "ew-pods", gw.GetAnnotations()["gateway.istio.io/service-account"], "annotations other than the parents survive")
	assert.Equal(t, "net-2", gw.GetLabels()["topology.istio.io/network"])
	we := f.get(t, workloadEntries, "shop", "ratings-cluster-2-10-2-0-21-5ee8b31b")
	require.NotNil(t, we)
	network, _, _ := unstructured.NestedString(we.Object, "spec", "network")
	assert.Equal(t, "net-2", network)

	// No longer sent (cluster-2 deregistered): pruned.
	results = apply1(t, on)
	for _, k := range want {
		require.Contains(t, results, k)
		assert.Equal(t, apply.OutcomePruned, results[k].GetOutcome(), k)
	}
	assert.Nil(t, f.get(t, services, "shop", "ratings"))

	// A user's Service of that name: reported, untouched.
	f.create(t, services, map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": "ratings", "namespace": "shop"},
		"spec":     map[string]any{"selector": map[string]any{"app": "ratings"}, "ports": []any{map[string]any{"port": int64(9080)}}},
	})
	results = apply1(t, on, set...)
	assert.Equal(t, apply.OutcomeConflict, results[key("Service", "shop", "ratings")].GetOutcome())
	svc = f.get(t, services, "shop", "ratings")
	selector, _, _ = unstructured.NestedStringMap(svc.Object, "spec", "selector")
	assert.Equal(t, map[string]string{"app": "ratings"}, selector, "the user's Service is not taken over")
	assert.Empty(t, svc.GetLabels())
}
