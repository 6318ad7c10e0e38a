package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemoRunsToCompletion is `DEMO_EXIT=1 make demo` inside the test suite:
// the sample objects must pass the real API servers' validation and the
// summary must show them.
func TestDemoRunsToCompletion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, config{dir: filepath.Join(t.TempDir(), "demo"), workloads: []string{"cluster-1", "cluster-2"}, exit: true}, &out)
	require.NoError(t, err, out.String())
	s := out.String()
	for _, want := range []string{
		"cluster-1  bookinfo      enabled    productpage-v1,reviews-v1,reviews-v2  productpage,reviews",
		"cluster-2  istio-system  -          istiod",
		"relaymesh/bookinfo-federation  istiod-istio-system-cluster-1,istiod-istio-system-cluster-2  generated  MultiRoot  global",
		"registered cluster cluster-1",
		"cluster-1  true       spiffe://relaymesh.local/cluster/cluster-1/agent",
		"cluster-2  true       spiffe://relaymesh.local/cluster/cluster-2/agent",
		"cluster-1  Mesh         istiod-istio-system-cluster-1",
		"cluster-2  Destination  reviews-bookinfo-cluster-2",
		"subsets version=[v1 v2]",
		"VirtualService bookinfo/reviews-v2 applied by the agent, owner=relaymesh-agent",
		"cluster-1  VirtualService",
		"bookinfo/relaymesh-reviews",
		"TrafficPolicy/relaymesh/reviews-shift",
		"ServiceEntry",
		"AuthorizationPolicy",
		"istiod-istio-system-cluster-1 intermediate",
		"istiod-istio-system-cluster-2 intermediate",
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
		"cluster-1/bookinfo/bookinfo-productpage  reviews-bookinfo-cluster-2  9080  federated via relaymesh/bookinfo-federation",
		"FINDINGS: 0",
		"Stopping local clusters",
	} {
		assert.Contains(t, s, want)
	}
}
