package dataplane_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/test/dataplane"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// relaymesh is the real management plane over the fixture's clusters: the
// relaymesh binary as a server in mgmt and an agent in each workload
// cluster, started once for the package (sharedRelaymesh).
type relaymesh struct {
	f       *fixture
	bin     string
	dir     string
	mgmt    *localcluster.Cluster
	dyn     dynamic.Interface // of mgmt
	c1      dynamic.Interface // of cluster-1
	c2      dynamic.Interface // of cluster-2
	procs   []*localcluster.Process
	took    time.Duration // from the build to both clusters discovered
	buildIn time.Duration
}

// istioInstall is what Relaymesh's discovery reads in a workload cluster:
// the istiod Deployment and its mesh config (the trust domain istiod was
// started with), the way an Istio install leaves them.
func istioInstall(cluster string) string {
	return `
apiVersion: v1
kind: ServiceAccount
metadata: {name: istiod, namespace: istio-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: istio, namespace: istio-system, labels: {istio.io/rev: default}}
data:
  mesh: |
    trustDomain: ` + cluster + `.local
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
}

var (
	ownedKinds = []schema.GroupVersionResource{
		outputs.VirtualServices,
		outputs.DestinationRules,
		outputs.AuthorizationPolicies,
		// Served once TestGatewayAPIRoutesFromRelaymeshPolicies installed
		// Gateway API's CRDs; until then there is nothing of them to list.
		outputs.HTTPRoutes,
		outputs.GRPCRoutes,
	}
	explainedKinds = append([]schema.GroupVersionResource{
		outputs.ServiceEntries,
		outputs.PeerAuthentications,
	}, ownedKinds...)
	destinations    = discoveryv1alpha1.Destinations
	policyResources = map[string]schema.GroupVersionResource{
		"TrafficPolicy":      networkingv1alpha1.TrafficPolicies,
		"AccessPolicy":       networkingv1alpha1.AccessPolicies,
		"VirtualMesh":        networkingv1alpha1.VirtualMeshes,
		"VirtualDestination": networkingv1alpha1.VirtualDestinations,
		// No outputs of its own: what it imports reaches the meshes
		// through the VirtualMesh's trust.
		"FederatedTrustDomain": networkingv1alpha1.FederatedTrustDomains,
	}
)

// sharedRM is the package's one Relaymesh: building and starting it once
// keeps the package's run time down.
var sharedRM struct {
	once sync.Once
	r    *relaymesh
	err  error
}

// sharedRelaymesh starts Relaymesh on first use; a test that uses it shows
// the server's and agents' logs when it fails.
func sharedRelaymesh(t *testing.T) *relaymesh {
	t.Helper()
	f := sharedFixture(t)
	sharedRM.once.Do(func() { sharedRM.r, sharedRM.err = startRelaymesh(f) })
	require.NoError(t, sharedRM.err)
	r := sharedRM.r
	t.Logf("relaymesh: built in %s; server and both agents up, both clusters discovered %s after the build", r.buildIn.Round(time.Millisecond), r.took.Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range r.procs {
				b, _ := os.ReadFile(p.LogPath())
				t.Logf("---- %s (last lines) ----\n%s", filepath.Base(p.LogPath()), lastLines(string(b), 40))
			}
		}
	})
	return r
}

// stopRelaymesh stops the shared Relaymesh, if it ran (TestMain).
func stopRelaymesh() error {
	if sharedRM.r == nil {
		return nil
	}
	var errs []error
	for _, p := range slices.Backward(sharedRM.r.procs) {
		errs = append(errs, p.Stop(10*time.Second))
	}
	return errors.Join(errs...)
}

// startRelaymesh builds relaymesh, runs the server and both clusters'
// agents, and waits until each cluster's echo Service is a discovered
// Destination with its endpoints.
func startRelaymesh(f *fixture) (_ *relaymesh, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp(shared.dir, "relaymesh-")
	if err != nil {
		return nil, err
	}
	r := &relaymesh{f: f, dir: dir, mgmt: f.env.Local.Cluster("mgmt")}
	defer func() {
		if err != nil {
			for _, p := range r.procs {
				b, _ := os.ReadFile(p.LogPath())
				err = fmt.Errorf("%w\n---- %s ----\n%s", err, filepath.Base(p.LogPath()), lastLines(string(b), 30))
				_ = p.Stop(5 * time.Second)
			}
		}
	}()
	for _, c := range []struct {
		name string
		ws   []dataplane.WorkloadConfig
		dc   *dataplane.Cluster
	}{{"cluster-1", append(slices.Clone(workloadConfigs), pingConfig("cluster-1")), f.c}, {"cluster-2", append(slices.Clone(cluster2Configs), pingConfig("cluster-2")), f.c2}} {
		if _, err := f.env.Local.Cluster(c.name).Apply(ctx, dataplane.FieldManager, []byte(istioInstall(c.name))); err != nil {
			return nil, err
		}
		// Discovery finds workloads through their controllers.
		for _, cfg := range c.ws {
			if err := c.dc.Deployment(ctx, cfg); err != nil {
				return nil, err
			}
		}
	}
	start := time.Now()
	if r.bin, err = localcluster.BuildRelaymesh(dir); err != nil {
		return nil, err
	}
	r.buildIn = time.Since(start)
	start = time.Now()
	mgmt := r.mgmt
	if r.dyn, err = dynamic.NewForConfig(mgmt.RESTConfig()); err != nil {
		return nil, err
	}
	if r.c1, err = dynamic.NewForConfig(f.env.Local.Cluster("cluster-1").RESTConfig()); err != nil {
		return nil, err
	}
	if r.c2, err = dynamic.NewForConfig(f.env.Local.Cluster("cluster-2").RESTConfig()); err != nil {
		return nil, err
	}
	if _, err := mgmt.Apply(ctx, dataplane.FieldManager, []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: relaymesh}\n")); err != nil {
		return nil, err
	}
	relayAddr, opsAddr := freeAddr(), freeAddr()
	if err := r.start("server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", filepath.Join(dir, "audit.log"), "--server-dns-names", "localhost", "--server-ips", e2e.Host(relayAddr)); err != nil {
		return nil, err
	}
	if err := poll(ctx, "the server is healthy", func() (bool, string) {
		code, err := e2e.GetJSON("http://"+opsAddr+"/healthz", nil)
		return err == nil && code == 200, fmt.Sprint(code, err)
	}); err != nil {
		return nil, err
	}
	for _, name := range []string{"cluster-1", "cluster-2"} {
		lc := f.env.Local.Cluster(name)
		if _, err := r.run(ctx, "cluster", "register", name, "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", lc.Kubeconfig, "--server-address", relayAddr); err != nil {
			return nil, err
		}
		if err := r.start("agent-"+name, "agent", "--kubeconfig", lc.Kubeconfig, "--health-listen", freeAddr(), "--metrics-listen", freeAddr()); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{"cluster-1", "cluster-2"} {
		if err := poll(ctx, name+"'s echo Service discovered with its endpoints", func() (bool, string) {
			d, err := r.destination(ctx, name)
			if err != nil {
				return false, err.Error()
			}
			eps, _, _ := unstructured.NestedSlice(d.Object, "spec", "kubeService", "endpoints")
			return len(eps) > 0, fmt.Sprintf("%d endpoints", len(eps))
		}); err != nil {
			return nil, err
		}
	}
	r.took = time.Since(start)
	return r, nil
}

// start runs the relaymesh binary as a long-lived process of the package.
func (r *relaymesh) start(name string, args ...string) error {
	p, err := localcluster.StartProcess(name, r.bin, args, filepath.Join(r.dir, name+".log"), false)
	if err != nil {
		return err
	}
	r.procs = append(r.procs, p)
	return nil
}

// run runs the relaymesh CLI to completion and returns its stdout.
func (r *relaymesh) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("relaymesh %s: %w: %s", strings.Join(args[:min(3, len(args))], " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// destination is the discovered Destination of the echo Service of cluster.
func (r *relaymesh) destination(ctx context.Context, cluster string) (*unstructured.Unstructured, error) {
	l, err := r.dyn.Resource(destinations).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		d := &l.Items[i]
		ref, _, _ := unstructured.NestedStringMap(d.Object, "spec", "kubeService", "ref")
		if ref["name"] == "echo" && ref["namespace"] == ns && ref["clusterName"] == cluster {
			return d, nil
		}
	}
	return nil, fmt.Errorf("no Destination for echo in %s among %d", cluster, len(l.Items))
}

// freeAddr is a listen address no other process takes first, on a
// private loopback address (localcluster.ListenAddr).
func freeAddr() string {
	a, err := localcluster.ListenAddr()
	if err != nil {
		panic(err) // only in tests; ListenAddr fails only without a loopback interface
	}
	return a
}

// poll checks cond every 100ms until it holds, or ctx ends.
func poll(ctx context.Context, what string, cond func() (bool, string)) error {
	last := ""
	for {
		ok, msg := cond()
		if ok {
			return nil
		}
		last = msg
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not before %w (last: %s)", what, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
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
		l, err := r.c1.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel})
		if apierrors.IsNotFound(err) && gvr.Group == translationtest.GatewayAPIGroup {
			continue // not served: Gateway API's CRDs are not installed
		}
		if err != nil {
			return 0, err
		}
		for _, o := range l.Items {
			if slices.Contains(strings.Split(o.GetAnnotations()[outputs.ParentsAnnotation], ","), parent) {
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
	for name, c := range map[string]dynamic.Interface{"cluster-1": r.c1, "cluster-2": r.c2} {
		for _, gvr := range explainedKinds {
			l, err := c.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel})
			if err == nil {
				for _, o := range l.Items {
					t.Logf("%s %s %s/%s: %v", name, o.GetKind(), o.GetNamespace(), o.GetName(), o.Object["spec"])
				}
			}
		}
	}
}

// trafficPolicy is a TrafficPolicy for cluster-1's echo Service, for
// cluster-1's clients (a shift to a subset is refused for clients in
// another cluster, and cluster-2 has clients too).
func trafficPolicy(name, matchers, policy string) string {
	return trafficPolicyFor(name, "echo", matchers, policy)
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
	r := sharedRelaymesh(t)

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

	t.Run("the access audit's matrix is what the data plane enforces, with an AccessPolicy admission refuses", func(t *testing.T) {
		r.subtest(t)
		checkAuditMatchesTraffic(t, f, r)
	})
}
