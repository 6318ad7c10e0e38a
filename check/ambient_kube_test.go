package check

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ambientManifest is a namespace in ambient mode with every pitfall: a
// user's L7 AuthorizationPolicy enforced by ztunnel, a headless Service
// bound to a waypoint for Service traffic, and a user's VirtualService
// beside Relaymesh's HTTPRoute for one Service. Pods never run here: they
// are API objects, as istio-cni and the injector leave them.
const ambientManifest = `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-1, namespace: shop, labels: {app: reviews}}
spec: {containers: [{name: reviews, image: reviews:1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: legacy-1, namespace: shop, labels: {app: legacy}, annotations: {sidecar.istio.io/status: '{}'}}
spec: {containers: [{name: legacy, image: legacy:1}, {name: istio-proxy, image: proxyv2:1}]}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec: {selector: {app: reviews}, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {clusterIP: None, selector: {app: db}, ports: [{name: tcp, port: 5432}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-get, namespace: shop}
spec:
  selector: {matchLabels: {app: reviews}}
  rules:
  - from: [{source: {principals: [cluster.local/ns/shop/sa/productpage]}}]
    to: [{operation: {methods: [GET]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: legacy-get, namespace: shop}
spec:
  selector: {matchLabels: {app: legacy}}
  rules:
  - to: [{operation: {methods: [GET]}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http: [{route: [{destination: {host: reviews}}]}]
`

const gatewayAPIManifest = `
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ingress, namespace: shop}
spec:
  gatewayClassName: istio
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: relaymesh-reviews, namespace: shop, labels: {relaymesh.io/owner: relaymesh-agent}}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 9080}]
  rules: [{backendRefs: [{name: reviews, port: 9080}]}]
`

// Gather reads a workload cluster's own objects and Evaluate names each
// ambient pitfall in it; without Gateway API's CRDs the Gateway API kinds
// are nothing to check, not an error.
func TestGatherAmbientPitfallsFromAPIServer(t *testing.T) {
	ctx := context.Background()
	c, _, _ := localcluster.Management(t, "")
	clients, err := kubeclient.NewClients(c.RESTConfig(), "w")
	require.NoError(t, err)
	_, err = c.Apply(ctx, "relaymesh-test", []byte(ambientManifest))
	require.NoError(t, err)
	cfg := Config{Mgmt: clients, Namespace: "relaymesh", Timeout: 5 * time.Second, Workloads: []WorkloadSource{{Context: "w", Clients: clients}}}
	ambient := func() (*Ambient, []Result) {
		t.Helper()
		o := Gather(ctx, cfg)
		require.Len(t, o.Workloads, 1)
		a := o.Workloads[0].Ambient
		require.NotNil(t, a, "the cluster was reached, so its ambient objects were read")
		return a, find(Evaluate(o, time.Now()), AreaAmbient, "")
	}

	// Before Gateway API: no error, and the L7 policy and nothing else.
	a, rs := ambient()
	assert.Empty(t, a.Errs, "an unserved kind is nothing to check")
	assert.Empty(t, a.Waypoints)
	assert.Len(t, a.Pods, 2)
	require.Len(t, rs, 1, "%v", rs)
	assert.Equal(t, "context w AuthorizationPolicy shop/reviews-get", rs[0].Subject)
	assert.Equal(t, Error, rs[0].Severity)
	for _, want := range []string{"(the user's)", "shop/reviews-1", "to.operation.methods", "denies everyone"} {
		assert.Contains(t, rs[0].Message, want)
	}

	translationtest.InstallGatewayAPI(ctx, t, c)
	_, err = c.Apply(ctx, "relaymesh-test", []byte(gatewayAPIManifest))
	require.NoError(t, err)
	a, rs = ambient()
	assert.Empty(t, a.Errs)
	require.Len(t, a.Waypoints, 1, "only Gateways of class istio-waypoint")
	got := map[string]Result{}
	for _, r := range rs {
		got[r.Subject] = r
	}
	require.Len(t, got, 3, "%v", rs)
	db := got["context w Service shop/db"]
	assert.Equal(t, Warning, db.Severity)
	assert.Contains(t, db.Message, "headless Service (clusterIP: None) bound to waypoint shop/waypoint")
	mixed := got["context w Service shop/reviews"]
	assert.Equal(t, Error, mixed.Severity)
	for _, want := range []string{"VirtualService shop/reviews (the user's)", "HTTPRoute shop/relaymesh-reviews (written by Relaymesh)"} {
		assert.Contains(t, mixed.Message, want)
	}
	assert.True(t, strings.HasPrefix(got["context w AuthorizationPolicy shop/reviews-get"].Message, "ALLOW policy"))
}
