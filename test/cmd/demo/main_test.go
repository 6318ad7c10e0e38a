package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

func meshName(cluster string) string {
	return discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, cluster, "istio-system", "istiod")
}

// ctrlC is the demo's output. Once the demo says the clusters are up, it
// runs the commands the demo told the user to try, as a user would paste
// them, then cancels the demo's context, as Ctrl-C does.
type ctrlC struct {
	bytes.Buffer
	cancel context.CancelFunc
	tried  []string // each command tried and its outcome
}

func (w *ctrlC) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if strings.Contains(string(p), "press Ctrl-C to stop them") {
		w.tried = tryPrinted(w.String())
		w.cancel()
	}
	return n, err
}

// tryPrinted runs the commands under the demo's "Try it yourself" heading
// in a shell, after its export line; `relaymesh check` is left out (it exits
// 2 for the istiod no demo runs, and the demo ran it already).
func tryPrinted(out string) []string {
	_, block, ok := strings.Cut(out, "==> Try it yourself")
	if !ok {
		return []string{"no \"Try it yourself\" heading"}
	}
	var export string
	var tried []string
	for _, line := range strings.Split(block, "\n")[2:] {
		cmd, ok := strings.CutPrefix(line, "    ")
		if !ok {
			break
		}
		if strings.HasPrefix(cmd, "export ") {
			export = cmd
			continue
		}
		if strings.Contains(cmd, " check ") {
			continue
		}
		b, err := exec.Command("bash", "-ec", export+"\n"+cmd).CombinedOutput()
		tried = append(tried, fmt.Sprintf("%s: err=%v\n%s", cmd, err, b))
	}
	return tried
}

// TestDemoRunsToCompletion is `make demo` inside the test suite, Ctrl-C
// included: the sample objects must pass the real API servers' validation,
// the summary must show them, the `relaymesh check` the closing lines print
// must pass against the clusters (the demo runs it), and the closing lines
// must say where relaymesh is and how to point it at the clusters.
func TestDemoRunsToCompletion(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ctx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	out := &ctrlC{cancel: interrupt}
	dir := filepath.Join(t.TempDir(), "demo")
	err := run(ctx, config{dir: dir, workloads: []string{"cluster-1", "cluster-2"}}, out)
	require.NoError(t, err, out.String())
	s := out.String()
	clusters := filepath.Join(dir, "clusters")
	bin := filepath.Join(dir, "relaymesh")
	kubeconfig := clusters + "/mgmt.kubeconfig:" + clusters + "/cluster-1.kubeconfig:" + clusters + "/cluster-2.kubeconfig"
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
		"rotation (MultiRoot): Finished step 3",
		"After the rotation: each mesh holds only the new root",
		"records verified",
		"ACCESS MATRIX: 2 allowed pairs",
		"cluster-1/bookinfo/bookinfo-productpage  cluster-2/bookinfo/reviews  9080  federated via relaymesh/bookinfo-federation",
		"FINDINGS: 0",
		"==> The dashboard: http://127.0.0.1:",
		"Sign in with a token of the ServiceAccount relaymesh/dashboard-viewer",
		"--kubeconfig " + filepath.Join(dir, "clusters") + "/mgmt.kubeconfig -n relaymesh create token dashboard-viewer --audience relaymesh-dashboard",
		"==> Checking the installation: KUBECONFIG=" + kubeconfig + " relaymesh check --server-metrics-address 127.0.0.1:",
		"agent connected",
		"The 2 istiod errors are expected here: no istiod runs in the demo",
		"==> Try it yourself, in another terminal: relaymesh is " + bin + "\n",
		"    export KUBECONFIG=" + kubeconfig + "\n",
		"    " + bin + " check --server-metrics-address 127.0.0.1:",
		"    " + bin + " policy audit\n",
		"==> Clusters are up; press Ctrl-C to stop them",
		"==> Stopping local clusters",
	} {
		assert.Contains(t, s, want)
	}
	assert.Less(t, strings.Index(s, "press Ctrl-C"), strings.Index(s, "Stopping local clusters"), "the clusters stop after Ctrl-C, not before")
	require.Len(t, out.tried, 3, "cluster list, policy audit, describe")
	for _, tried := range out.tried {
		assert.Contains(t, tried, ": err=<nil>\n")
	}
	assert.Contains(t, out.tried[0], "cluster-2")
	assert.Contains(t, out.tried[1], "ACCESS MATRIX: 2 allowed pairs")
	assert.Contains(t, out.tried[2], "productpage-to-reviews")
}
