package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func testEnding(exit bool) ending {
	return ending{
		relaymesh:   "/repo/bin/relaymesh",
		kubeconfigs: []string{"/repo/_demo/clusters/mgmt.kubeconfig", "/repo/_demo/clusters/cluster-1.kubeconfig"},
		metrics:     "127.0.0.1:40001",
		dashboard:   "http://127.0.0.1:40002/",
		tokenCmd:    []string{"/repo/.cache/bin/kubectl", "--kubeconfig", "/repo/_demo/clusters/mgmt.kubeconfig", "-n", "relaymesh", "create", "token", "dashboard-viewer"},
		exit:        exit,
	}
}

// TestClosingLinesPointAtTheClusters: kept up, the demo ends with the
// dashboard and its sign-in command, where relaymesh is, and the exact
// commands (absolute paths) that point it at the clusters.
func TestClosingLinesPointAtTheClusters(t *testing.T) {
	var out bytes.Buffer
	testEnding(false).print(&out)
	s := out.String()
	for _, want := range []string{
		"==> The dashboard: http://127.0.0.1:40002/\n",
		"    /repo/.cache/bin/kubectl --kubeconfig /repo/_demo/clusters/mgmt.kubeconfig -n relaymesh create token dashboard-viewer\n",
		"==> Try it yourself, in another terminal: relaymesh is /repo/bin/relaymesh\n",
		"    export KUBECONFIG=/repo/_demo/clusters/mgmt.kubeconfig:/repo/_demo/clusters/cluster-1.kubeconfig\n",
		"    /repo/bin/relaymesh check --server-metrics-address 127.0.0.1:40001 --server-metrics-plain-http\n",
		"    /repo/bin/relaymesh cluster list\n",
		"    /repo/bin/relaymesh policy audit\n",
		"    /repo/bin/relaymesh describe policy accesspolicy/relaymesh/productpage-to-reviews\n",
	} {
		assert.Contains(t, s, want)
	}
	assert.NotContains(t, s, "DEMO_EXIT")
}

// TestClosingLinesWithDemoExitOfferNoDeadAddress: with DEMO_EXIT=1
// everything stops right after the closing lines, so they print no address
// or command that would no longer answer, say so, and still say where
// relaymesh is.
func TestClosingLinesWithDemoExitOfferNoDeadAddress(t *testing.T) {
	var out bytes.Buffer
	testEnding(true).print(&out)
	s := out.String()
	assert.Contains(t, s, "==> DEMO_EXIT=1: stopping the server, its dashboard, the agents and the clusters now\n")
	assert.Contains(t, s, "relaymesh is /repo/bin/relaymesh; run `make demo` without DEMO_EXIT to keep everything up until Ctrl-C")
	for _, dead := range []string{"127.0.0.1", "create token", "KUBECONFIG=", "==> The dashboard"} {
		assert.NotContains(t, s, dead)
	}
}
