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
	cfg := applierConfig(&kubeclient.Clients{Dynamic: dyn}, meta.NewDefaultRESTMapper(nil), slog.New(slog.DiscardHandler))
	assert.Same(t, dyn, cfg.Dynamic)
	routes := []schema.GroupVersionKind{
		{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"},
		{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "GRPCRoute"},
	}
	assert.Equal(t, append(append([]schema.GroupVersionKind(nil), apply.DefaultKinds...), routes...), cfg.Kinds)
	assert.Equal(t, routes, cfg.OptionalKinds)
	assert.Equal(t, Owner, cfg.Owner)
	_, err := apply.New(cfg)
	require.NoError(t, err)
}
