package dataplane_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/relaymesh/relaymesh/test/dataplane"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// relaymesh is the real management plane over the fixture's cluster: the
// relaymesh binary as a server in mgmt and an agent in cluster-1.
type relaymesh struct {
	f    *fixture
	mgmt *localcluster.Cluster
	dyn  dynamic.Interface // of mgmt
	c1   dynamic.Interface // of cluster-1
}

// The cluster-1 objects Relaymesh's discovery reads: the istiod Deployment
// and its mesh config (the trust domain istiod was started with), the way
// an Istio install leaves them.
const istioInstall = `
apiVersion: v1
kind: ServiceAccount
metadata: {name: istiod, namespace: istio-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: istio, namespace: istio-system, labels: {istio.io/rev: default}}
data:
  mesh: |
    trustDomain: cluster-1.local
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: istiod, namespace: istio-system, labels: {app: istiod, istio: pilot, istio.io/rev: default}}
spec:
  selector: {matchLabels: {app: istiod}}
  template:
    metadata: {labels: {app: istiod, istio: pilot, istio.io/rev: default}}
    spec:
      serviceAccountName: istiod
      containers: [{name: discovery, image: docker.io/istio/pilot:1.31.1, args: [discovery]}]
`

var (
	ownedKinds = []schema.GroupVersionResource{
		{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"},
		{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"},
		{Group: "security.istio.io", Version: "v1", Resource: "authorizationpolicies"},
	}
	destinations    = schema.GroupVersionResource{Group: "discovery.relaymesh.io", Version: "v1alpha1", Resource: "destinations"}
	policyResources = map[string]schema.GroupVersionResource{
		"TrafficPolicy": {Group: "networking.relaymesh.io", Version: "v1alpha1", Resource: "trafficpolicies"},
		"AccessPolicy":  {Group: "networking.relaymesh.io", Version: "v1alpha1", Resource: "accesspolicies"},
	}
)

// startRelaymesh builds relaymesh, runs the server and cluster-1's agent,
// and waits until cluster-1's echo Service is a discovered Destination.
func startRelaymesh(t *testing.T, f *fixture) *relaymesh {
	t.Helper()
	ctx := context.Background()
	c1 := f.env.Local.Cluster("cluster-1")
	_, err := c1.Apply(ctx, dataplane.FieldManager, []byte(istioInstall))
	require.NoError(t, err)
	// Discovery finds workloads through their controllers.
	for _, cfg := range workloadConfigs {
		require.NoError(t, f.c.Deployment(ctx, cfg))
	}

	dir := t.TempDir()
	start := time.Now()
	bin, err := localcluster.BuildRelaymesh(dir)
	require.NoError(t, err)
	t.Logf("built relaymesh in %s", time.Since(start).Round(time.Millisecond))
	mgmt := f.env.Local.Cluster("mgmt")
	r := &relaymesh{f: f, mgmt: mgmt}
	r.dyn, err = dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	r.c1, err = dynamic.NewForConfig(c1.RESTConfig())
	require.NoError(t, err)
	_, err = mgmt.Apply(ctx, dataplane.FieldManager, []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: relaymesh}\n"))
	require.NoError(t, err)

	relayAddr, opsAddr := e2e.Addr(t), e2e.Addr(t)
	e2e.Start(t, bin, dir, "server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr,
		"--audit-log", filepath.Join(dir, "audit.log"), "--server-dns-names", "localhost")
	e2e.Eventually(t, 60*time.Second, "server healthy", func() (bool, string) {
		code, err := e2e.GetJSON("http://"+opsAddr+"/healthz", nil)
		return err == nil && code == 200, fmt.Sprint(code, err)
	})
	_, err = e2e.Run(t, bin, "cluster", "register", "cluster-1", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", c1.Kubeconfig, "--server-address", relayAddr)
	require.NoError(t, err)
	e2e.Start(t, bin, dir, "agent-cluster-1", "agent", "--kubeconfig", c1.Kubeconfig, "--health-listen", e2e.Addr(t), "--metrics-listen", e2e.Addr(t))
	e2e.Eventually(t, 60*time.Second, "cluster-1's echo Service discovered", func() (bool, string) {
		l, err := r.dyn.Resource(destinations).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, d := range l.Items {
			ref, _, _ := unstructured.NestedStringMap(d.Object, "spec", "kubeService", "ref")
			if ref["name"] == "echo" && ref["namespace"] == ns && ref["clusterName"] == "cluster-1" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d destinations", len(l.Items))
	})
	t.Logf("server and agent up, cluster-1 discovered, %s after the build", time.Since(start).Round(time.Millisecond))
	return r
}

// apply writes Relaymesh policies into mgmt for the rest of the subtest;
// at its end they are deleted and the agent must prune their outputs from
// cluster-1.
func (r *relaymesh) apply(t *testing.T, manifest string) {
	t.Helper()
	ctx := context.Background()
	_, err := r.mgmt.Apply(ctx, dataplane.FieldManager, []byte(manifest))
	require.NoError(t, err)
	objs, err := localcluster.DecodeObjects([]byte(manifest))
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, o := range objs {
			gvr, ok := policyResources[o.GetKind()]
			require.True(t, ok, o.GetKind())
			assert.NoError(t, r.dyn.Resource(gvr).Namespace(o.GetNamespace()).Delete(ctx, o.GetName(), metav1.DeleteOptions{}))
			parent := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
			e2e.Eventually(t, 30*time.Second, "the agent prunes the outputs of "+parent, func() (bool, string) {
				n, err := r.outputs(ctx, parent)
				return err == nil && n == 0, fmt.Sprint(n, err)
			})
		}
	})
}

// subtest logs, if the subtest fails, the policies' status and the outputs
// in cluster-1 (what Relaymesh made of the policy); and at its very end
// waits until the traffic is back at the baseline.
func (r *relaymesh) subtest(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			r.explain(t)
		}
		r.f.baseline(t)
	})
}

// outputs counts the Istio objects in the apps namespace that the agent
// owns and that name parent among their parents.
func (r *relaymesh) outputs(ctx context.Context, parent string) (int, error) {
	n := 0
	for _, gvr := range ownedKinds {
		l, err := r.c1.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: "relaymesh.io/owner"})
		if err != nil {
			return 0, err
		}
		for _, o := range l.Items {
			if slices.Contains(strings.Split(o.GetAnnotations()["relaymesh.io/parents"], ","), parent) {
				n++
			}
		}
	}
	return n, nil
}

func (r *relaymesh) explain(t *testing.T) {
	ctx := context.Background()
	for _, gvr := range policyResources {
		l, err := r.dyn.Resource(gvr).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, o := range l.Items {
				t.Logf("%s %s status: %v", o.GetKind(), o.GetName(), o.Object["status"])
			}
		}
	}
	for _, gvr := range ownedKinds {
		l, err := r.c1.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, o := range l.Items {
				t.Logf("cluster-1 %s %s: %v", o.GetKind(), o.GetName(), o.Object["spec"])
			}
		}
	}
}

// trafficPolicy is a TrafficPolicy for cluster-1's echo Service.
func trafficPolicy(name, matchers, policy string) string {
	return `
apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: ` + name + `, namespace: relaymesh}
spec:
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: echo, namespace: apps, clusterName: cluster-1}]
` + matchers + `
  policy:
` + policy
}

func shiftTo(weights ...string) string {
	s := "    trafficShift:\n      destinations:\n"
	for i := 0; i < len(weights); i += 2 {
		s += "      - {weight: " + weights[i+1] + ", kubeService: {name: echo, namespace: apps, clusterName: cluster-1, subset: {version: " + weights[i] + "}}}\n"
	}
	return s
}

// TestTrafficFromRelaymeshPolicies runs the checks of TestTraffic with the
// Istio objects produced by Relaymesh itself: TrafficPolicies and an
// AccessPolicy in the management cluster, translated by the real server,
// applied by the real agent, served by istiod to the proxyless workloads.
func TestTrafficFromRelaymeshPolicies(t *testing.T) {
	f := sharedFixture(t)
	r := startRelaymesh(t, f)

	t.Run("traffic shift 80/20 between subsets", func(t *testing.T) {
		r.subtest(t)
		checkShift(t, f, func(t *testing.T) { r.apply(t, trafficPolicy("echo", "", shiftTo("v1", "80", "v2", "20"))) })
	})

	t.Run("header match routes to a subset", func(t *testing.T) {
		r.subtest(t)
		checkHeaderMatch(t, f, func(t *testing.T) {
			r.apply(t, trafficPolicy("echo-canary", `  httpRequestMatchers:
  - headers: [{name: x-canary, value: "yes"}]`, shiftTo("v2", "100"))+"---\n"+trafficPolicy("echo", "", shiftTo("v1", "100")))
		})
	})

	t.Run("fault injection aborts 30%", func(t *testing.T) {
		r.subtest(t)
		checkAbort(t, f, func(t *testing.T) {
			r.apply(t, trafficPolicy("echo", "", "    faultInjection: {abort: {httpStatus: 503}, percentage: 30}\n"))
		})
	})

	t.Run("request timeout", func(t *testing.T) {
		r.subtest(t)
		checkTimeout(t, f, func(t *testing.T) { r.apply(t, trafficPolicy("echo", "", "    requestTimeout: 250ms\n")) })
	})

	t.Run("mTLS from the policy, and AccessPolicy: the allowed service account gets OK, another PermissionDenied", func(t *testing.T) {
		r.subtest(t)
		checkAccess(t, f, func(t *testing.T) {
			// STRICT comes from the mesh (a VirtualMesh's strictMTLS
			// writes this PeerAuthentication); written here directly. The
			// client side, ISTIO_MUTUAL, comes from the TrafficPolicy.
			f.apply(t, strictPeerAuthentication)
			r.apply(t, trafficPolicy("echo", "", "    mtls: {tlsMode: ISTIO_MUTUAL}\n"))
		}, func(t *testing.T) {
			r.apply(t, `
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: echo-readers, namespace: relaymesh}
spec:
  sourceSelector:
  - kubeServiceAccountRefs:
      serviceAccounts: [{name: sleep, namespace: apps, clusterName: cluster-1}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: echo, namespace: apps, clusterName: cluster-1}]
`)
		})
	})
}
