package apply_test

import (
	"context"
	"slices"
	"testing"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/federation"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ambientFailoverSet is cluster-1's for the vd-ambient-failover golden:
// cluster-2's reviews pods as entries that join cluster-1's reviews.
func ambientFailoverSet(t *testing.T) []*relaypb.OutputObject {
	t.Helper()
	return goldenSet(t, "vd-ambient-failover", federation.TranslateVirtualDestinations, 6, "a Gateway, the hostname (ServiceEntry, HTTPRoute), a DestinationRule and two WorkloadEntries")
}

// An entry that joins a user's Service is the one privilege ambient
// failover adds, so the agent takes it only with --ambient-failover, only
// for a Service its owner labelled istio.io/global=true that selects
// exactly the entry's labels, and only on another network than its own:
// every other case is refused with the reason, and nothing is written.
func TestAmbientFailoverEntriesJoinOnlyGlobalServices(t *testing.T) {
	f, ctx := ambientFixture(t), context.Background()
	set := ambientFailoverSet(t)
	entries := []string{
		key("WorkloadEntry", "shop", "reviews-cluster-2-10-2-0-11-7b1a1837"),
		key("WorkloadEntry", "shop", "reviews-cluster-2-10-2-0-12-6382e9f6"),
	}
	withKinds := func(c *apply.Config) {
		c.Kinds = append(append(slices.Clone(apply.DefaultKinds), apply.GatewayRouteKinds...), apply.AmbientFederationKinds...)
		c.OptionalKinds = append(append(c.OptionalKinds, apply.GatewayRouteKinds...), apply.AmbientFederationGateway)
	}
	networks := func(n ...string) func(*apply.Config) {
		return func(c *apply.Config) {
			withKinds(c)
			c.LocalNetworks = func() []string { return n }
		}
	}
	refused := func(a *apply.Applier, want string) {
		t.Helper()
		results := apply1(t, a, set...)
		for _, k := range entries {
			require.Contains(t, results, k)
			assert.Equal(t, apply.OutcomeError, results[k].GetOutcome(), k)
			assert.Contains(t, results[k].GetError(), want, k)
			assert.Nil(t, f.get(t, workloadEntries, "shop", k[len("WorkloadEntry/shop/"):]), "%s not written", k)
		}
		// The DestinationRule and the Gateway do not depend on the entries.
		dr := results[key("DestinationRule", "shop", "relaymesh-vd-reviews-shop")]
		assert.Contains(t, []string{apply.OutcomeApplied, apply.OutcomeUnchanged}, dr.GetOutcome(), dr.GetError())
	}

	// Ambient federation alone: entries with a user's labels are refused.
	refused(f.applier(t, withKinds), "need --ambient-failover")
	// With it, but no Service to join.
	refused(f.applier(t, networks("net-1")), "no Service in namespace shop labelled istio.io/global=true by its owner selects exactly {app=reviews}")

	// The owner's Service, not (yet) global.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews", Namespace: "shop"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "reviews"}, Ports: []corev1.ServicePort{
			{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)},
		}},
	}
	svc, err := f.cs.CoreV1().Services("shop").Create(ctx, svc, metav1.CreateOptions{})
	require.NoError(t, err)
	refused(f.applier(t, networks("net-1")), "no Service in namespace shop labelled istio.io/global=true")

	// A global Service that selects more than the entries' labels does not
	// consent to them either.
	svc.Labels = map[string]string{"istio.io/global": "true"}
	svc.Spec.Selector = map[string]string{"app": "reviews", "tier": "backend"}
	svc, err = f.cs.CoreV1().Services("shop").Update(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	refused(f.applier(t, networks("net-1")), "selects exactly {app=reviews}")

	// A Service some Relaymesh agent wrote is never the consent.
	svc.Labels[outputs.OwnerLabel] = "another-agent"
	svc.Spec.Selector = map[string]string{"app": "reviews"}
	svc, err = f.cs.CoreV1().Services("shop").Update(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	refused(f.applier(t, networks("net-1")), "selects exactly {app=reviews}")

	// The owner's global Service: the entry's network must still not be
	// this cluster's, and the agent must know its own.
	delete(svc.Labels, outputs.OwnerLabel)
	_, err = f.cs.CoreV1().Services("shop").Update(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	refused(f.applier(t, networks("net-2")), `its network "net-2" is this cluster's own`)
	refused(f.applier(t, networks()), "this cluster's own network is not known")

	results := apply1(t, f.applier(t, networks("net-1")), set...)
	for _, k := range entries {
		require.Contains(t, results, k)
		require.Equal(t, apply.OutcomeApplied, results[k].GetOutcome(), "%s: %s", k, results[k].GetError())
	}
	we := f.get(t, workloadEntries, "shop", "reviews-cluster-2-10-2-0-11-7b1a1837")
	require.NotNil(t, we)
	assert.Equal(t, "reviews", we.GetLabels()["app"])
	assert.Equal(t, owner, we.GetLabels()[outputs.OwnerLabel])
	assert.Equal(t, map[string]any{"app": "reviews"}, we.Object["spec"].(map[string]any)["labels"])

	// The owner withdraws consent: the next set refuses the entries, and
	// the ones written are pruned (they are no longer applied).
	svc, err = f.cs.CoreV1().Services("shop").Get(ctx, "reviews", metav1.GetOptions{})
	require.NoError(t, err)
	delete(svc.Labels, "istio.io/global")
	_, err = f.cs.CoreV1().Services("shop").Update(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	results = apply1(t, f.applier(t, networks("net-1")), set...)
	for _, k := range entries {
		require.Contains(t, results, k)
		assert.Nil(t, f.get(t, workloadEntries, "shop", k[len("WorkloadEntry/shop/"):]), "%s pruned once the consent is gone", k)
	}
}

// A VirtualDestination on a TCP port publishes its hostname with a
// TCPRoute: the agent applies it to a cluster serving Gateway API's
// standard CRDs (their schema accepts it), and when the port changes from
// HTTP to TCP the next set applies the TCPRoute and prunes the HTTPRoute.
func TestAmbientFailoverHostnameRouteFollowsTheProtocol(t *testing.T) {
	f := ambientFixture(t)
	a := f.applier(t, func(c *apply.Config) {
		c.Kinds = append(append(slices.Clone(apply.DefaultKinds), apply.GatewayRouteKinds...), apply.AmbientFederationKinds...)
		c.OptionalKinds = append(append(c.OptionalKinds, apply.GatewayRouteKinds...), apply.AmbientFederationGateway)
		c.LocalNetworks = func() []string { return []string{"net-1"} }
	})
	tcp := editedGoldenSet(t, "vd-ambient-failover", func(in *translation.Input) {
		in.VirtualDestinations[0].Spec.Port.Protocol = "TCP"
	}, federation.TranslateVirtualDestinations, 6, "a Gateway, the hostname (ServiceEntry, TCPRoute), a DestinationRule and two WorkloadEntries")
	route := func(kind string) string { return key(kind, "shop", "relaymesh-vd-reviews-shop") }

	results := apply1(t, a, ambientFailoverSet(t)...)
	require.Equal(t, apply.OutcomeApplied, results[route("HTTPRoute")].GetOutcome(), results[route("HTTPRoute")].GetError())
	require.NotNil(t, f.get(t, outputs.HTTPRoutes, "shop", "relaymesh-vd-reviews-shop"))

	results = apply1(t, a, tcp...)
	require.Equal(t, apply.OutcomeApplied, results[route("TCPRoute")].GetOutcome(), results[route("TCPRoute")].GetError())
	live := f.get(t, outputs.TCPRoutes, "shop", "relaymesh-vd-reviews-shop")
	require.NotNil(t, live)
	assert.Equal(t, owner, live.GetLabels()[outputs.OwnerLabel])
	assert.Equal(t, "ServiceEntry", live.Object["spec"].(map[string]any)["parentRefs"].([]any)[0].(map[string]any)["kind"])
	assert.Nil(t, f.get(t, outputs.HTTPRoutes, "shop", "relaymesh-vd-reviews-shop"), "the HTTPRoute is pruned")
	se := f.get(t, serviceEntries, "shop", "relaymesh-vd-reviews-shop")
	require.NotNil(t, se)
	ports, _, _ := unstructured.NestedSlice(se.Object, "spec", "ports")
	require.Len(t, ports, 1)
	assert.Equal(t, "TCP", ports[0].(map[string]any)["protocol"])
}
