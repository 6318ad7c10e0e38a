package app

import (
	"log/slog"
	"testing"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// The agent's applier manages the Istio kinds and the Gateway API routes
// of ambient Destinations, the routes as optional kinds (a cluster without
// Gateway API's CRDs is not an error), with the process's dynamic client.
func TestApplierManagesTheGatewayRoutes(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	cfg := applierConfig(&kubeclient.Clients{Dynamic: dyn}, meta.NewDefaultRESTMapper(nil), slog.New(slog.DiscardHandler), false)
	assert.Same(t, dyn, cfg.Dynamic)
	routes := []schema.GroupVersionKind{
		{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"},
		{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "GRPCRoute"},
		{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "TCPRoute"},
	}
	assert.Equal(t, append(append([]schema.GroupVersionKind(nil), apply.DefaultKinds...), routes...), cfg.Kinds)
	assert.Equal(t, routes, cfg.OptionalKinds)
	assert.Equal(t, Owner, cfg.Owner)
	_, err := apply.New(cfg)
	require.NoError(t, err)
}

// With ambient federation on, the agent also manages global Services,
// WorkloadEntries and (optionally: Gateway API may be absent) Gateways;
// off, none of them.
func TestApplierManagesAmbientFederationKindsOnlyWhenOn(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	off := applierConfig(&kubeclient.Clients{Dynamic: dyn}, meta.NewDefaultRESTMapper(nil), slog.New(slog.DiscardHandler), false)
	on := applierConfig(&kubeclient.Clients{Dynamic: dyn}, meta.NewDefaultRESTMapper(nil), slog.New(slog.DiscardHandler), true)
	for _, k := range apply.AmbientFederationKinds {
		assert.NotContains(t, off.Kinds, k)
		assert.Contains(t, on.Kinds, k)
	}
	assert.Equal(t, append(off.Kinds, apply.AmbientFederationKinds...), on.Kinds)
	assert.Equal(t, append(off.OptionalKinds, apply.AmbientFederationGateway), on.OptionalKinds)
	_, err := apply.New(on)
	require.NoError(t, err)
}
