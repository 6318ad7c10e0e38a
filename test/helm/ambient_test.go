package helm

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/federation"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
)

// ambientFederationRBAC: the agent chart's ServiceAccount, as installed in
// namespace agent-<variant> by TestChartsOnARealAPIServer, applies and
// prunes what ambient federation writes (the real translator's objects
// for cluster-1 of the ambient-multinetwork golden, and an ambient
// VirtualDestination hostname's TCPRoute) with the rules of
// ambientFederation.enabled, and may not with the defaults'.
func ambientFederationRBAC(ctx context.Context, t *testing.T, c *localcluster.Cluster) {
	translationtest.InstallGatewayAPI(ctx, t, c)
	cs, err := c.Clientset()
	require.NoError(t, err)
	for _, ns := range []string{"shop", "istio-system"} {
		_, err := cs.CoreV1().Namespaces().Create(ctx, namespaceObject(ns, nil), metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
	}
	set := append(ambientFederationSet(t), tcpHostnameRoute(t))
	applierAs := func(ns string) *apply.Applier {
		sas, err := cs.CoreV1().ServiceAccounts(ns).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		var name string
		for _, sa := range sas.Items {
			if sa.Name != "default" {
				name = sa.Name
			}
		}
		require.NotEmpty(t, name, "the chart's ServiceAccount in %s", ns)
		cfg := rest.CopyConfig(c.RESTConfig())
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + name}
		dyn, err := dynamic.NewForConfig(cfg)
		require.NoError(t, err)
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		require.NoError(t, err)
		a, err := apply.New(apply.Config{Dynamic: dyn, Mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), Owner: "relaymesh-agent",
			Kinds:         slices.Concat(apply.DefaultKinds, apply.GatewayRouteKinds, apply.AmbientFederationKinds),
			OptionalKinds: append(slices.Clone(apply.GatewayRouteKinds), apply.AmbientFederationGateway),
			Logger:        slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		return a
	}
	outcomes := func(results []*relaypb.ObjectResult) map[string]string {
		out := map[string]string{}
		for _, r := range results {
			out[r.GetKind()+"/"+r.GetNamespace()+"/"+r.GetName()] = r.GetOutcome() + " " + r.GetError()
		}
		return out
	}
	want := []string{"Gateway/istio-system/relaymesh-cluster-2-istio-eastwest", "Service/shop/ratings",
		"WorkloadEntry/shop/ratings-cluster-2-10-2-0-21-5ee8b31b", "WorkloadEntry/shop/ratings-cluster-2-10-2-0-22-ebd6ec0f",
		"TCPRoute/shop/relaymesh-vd-reviews-shop"}

	// The defaults' rules: every object refused by RBAC, nothing written.
	results, err := applierAs("agent-defaults").Apply(ctx, &relaypb.OutputSet{Version: 1, Objects: set})
	require.NoError(t, err)
	got := outcomes(results)
	for _, k := range want {
		assert.Regexp(t, `^error .*forbidden`, got[k], k)
	}
	_, err = cs.CoreV1().Services("shop").Get(ctx, "ratings", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "%v", err)

	// ambientFederation.enabled: applied, then pruned.
	a := applierAs("agent-ambient-federation")
	results, err = a.Apply(ctx, &relaypb.OutputSet{Version: 1, Objects: set})
	require.NoError(t, err)
	got = outcomes(results)
	for _, k := range want {
		assert.Equal(t, apply.OutcomeApplied+" ", got[k], k)
	}
	results, err = a.Apply(ctx, &relaypb.OutputSet{Version: 2})
	require.NoError(t, err)
	got = outcomes(results)
	for _, k := range want {
		assert.Equal(t, apply.OutcomePruned+" ", got[k], k)
	}
	_, err = cs.CoreV1().Services("shop").Get(ctx, "ratings", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "%v", err)
}

// tcpHostnameRoute is the TCPRoute the real translator writes into
// cluster-1 for the vd-ambient-failover golden's VirtualDestination on a
// TCP port: its hostname, routed by the waypoint to the Service.
func tcpHostnameRoute(t *testing.T) *relaypb.OutputObject {
	t.Helper()
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "federation", "testdata", "vd-ambient-failover"))
	in.VirtualDestinations[0].Spec.Port.Protocol = "TCP"
	out, r := translation.NewOutput(), translation.NewReport()
	federation.TranslateVirtualDestinations(in, out, r)
	for _, o := range translationtest.OutputSet(t, out, "cluster-1") {
		if bytes.Contains(o.GetManifest(), []byte(`"kind":"TCPRoute"`)) {
			return o
		}
	}
	t.Fatal("no TCPRoute for cluster-1")
	return nil
}

// ambientFederationSet is the real translator's output for cluster-1 of
// the ambient-multinetwork federation golden, as the server sends it.
func ambientFederationSet(t *testing.T) []*relaypb.OutputObject {
	t.Helper()
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "federation", "testdata", "ambient-multinetwork"))
	out, r := translation.NewOutput(), translation.NewReport()
	federation.Translate(in, out, r)
	set := translationtest.OutputSet(t, out, "cluster-1")
	require.Len(t, set, 4)
	return set
}
