package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemoRunsToCompletion is `DEMO_EXIT=1 make demo` inside the test suite:
// the sample objects must pass the real API servers' validation and the
// summary must show them.
func meshName(cluster string) string {
	return discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, cluster, "istio-system", "istiod")
}

func TestDemoRunsToCompletion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	dir := filepath.Join(t.TempDir(), "demo")
	err := run(ctx, config{dir: dir, workloads: []string{"cluster-1", "cluster-2"}, exit: true}, &out)
	require.NoError(t, err, out.String())
	s := out.String()
	for _, want := range []string{
		"cluster-1  bookinfo      enabled    productpage-v1,reviews-v1,reviews-v2  productpage,reviews",
		"cluster-2  istio-system  -          istiod",
		"relaymesh/bookinfo-federation  cluster-1/istio-system/istiod,cluster-2/istio-system/istiod  generated  MultiRoot  global",
		"registered cluster cluster-1",
		"cluster-1  true       spiffe://relaymesh.local/cluster/cluster-1/agent",
		"cluster-2  true       spiffe://relaymesh.local/cluster/cluster-2/agent",
		"cluster-1  Mesh         " + meshName("cluster-1"),
		"cluster-2  Destination  " + discoveryv1alpha1.Name(discoveryv1alpha1.OriginService, "cluster-2", "bookinfo", "reviews"),
		"subsets version=[v1 v2]",
		"VirtualService bookinfo/reviews-v2 applied by the agent, owner=relaymesh-agent",
		"cluster-1  VirtualService",
		"bookinfo/relaymesh-reviews",
		"TrafficPolicy/relaymesh/reviews-shift",
		"ServiceEntry",
		"AuthorizationPolicy",
		meshName("cluster-1") + " intermediate  spiffe://cluster-1.local/…",
		meshName("cluster-2") + " intermediate  spiffe://cluster-2.local/…",
		"one root bundle in every mesh: true",
		"relaymesh.io/root-generation=2",
		"AddingNewRoot step 1",
		"PropagatingNewIntermediate step 2",
		"DeletingOldRoot step 3",
		"Finished step 3",
		"rotation: Finished step 3",
		"After the rotation: each mesh holds only the new root",
		"records verified",
		"ACCESS MATRIX: 2 allowed pairs",
		"cluster-1/bookinfo/bookinfo-productpage  cluster-2/bookinfo/reviews  9080  federated via relaymesh/bookinfo-federation",
		"FINDINGS: 0",
		"==> The dashboard: http://127.0.0.1:",
		"Sign in with a token of the ServiceAccount relaymesh/dashboard-viewer",
		"--kubeconfig " + filepath.Join(dir, "clusters") + "/mgmt.kubeconfig -n relaymesh create token dashboard-viewer --audience relaymesh-dashboard",
		"Stopping local clusters",
	} {
		assert.Contains(t, s, want)
	}
}
