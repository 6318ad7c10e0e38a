package dataplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/test/dataplane"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// perVersion are the Services a Gateway API route sends a version's share
// to (a route names Services, not subsets), and echo-h2: the same pods
// behind a port whose appProtocol is http2, which makes Relaymesh's route
// for it an HTTPRoute (echo's gRPC port gets a GRPCRoute).
var perVersion = []dataplane.ServiceConfig{
	{Name: "echo-v1", Namespace: ns, Selector: map[string]string{"app": "echo", "version": "v1"}, Port: echoPort, TargetPort: echoPort},
	{Name: "echo-v2", Namespace: ns, Selector: map[string]string{"app": "echo", "version": "v2"}, Port: echoPort, TargetPort: echoPort},
	{Name: "echo-h2", Namespace: ns, Selector: map[string]string{"app": "echo"}, Port: echoPort, TargetPort: echoPort, AppProtocol: "http2",
		Labels: map[string]string{discoveryv1alpha1.LabelRouteAPI: discoveryv1alpha1.RouteAPIGatewayAPI}},
}

// TestGatewayAPIRoutesFromRelaymeshPolicies runs TestTrafficFromRelaymeshPolicies's
// routing checks on a sidecar mesh whose echo Service opted into Gateway
// API routes (relaymesh.io/route-api=gateway-api): the real server writes
// a GRPCRoute (an HTTPRoute for an http2 port) with the Service as parent
// and no VirtualService, the real agent applies it, and a real istiod
// serves it to the proxyless gRPC clients. The counted RPCs must show the
// weights (±5 points over 2,000 RPCs), the header match and, on the
// HTTPRoute, the timeout; a timeout on the gRPC port cannot be carried
// (Gateway API's GRPCRoute has none) and the calls show it is not applied.
func TestGatewayAPIRoutesFromRelaymeshPolicies(t *testing.T) {
	f := sharedFixture(t)
	r := sharedRelaymesh(t)
	optIntoGatewayAPI(t, f, r)

	t.Run("traffic shift 80/20 between per-version Services", func(t *testing.T) {
		r.subtest(t)
		checkShift(t, f, func(t *testing.T) {
			r.apply(t, trafficPolicyFor("echo", "echo", "", shiftToServices("echo-v1", "80", "echo-v2", "20")))
		})
		r.wantRoutedBy(t, outputs.GRPCRoutes, "relaymesh-echo")
	})

	t.Run("header match routes to a per-version Service", func(t *testing.T) {
		r.subtest(t)
		checkHeaderMatch(t, f, func(t *testing.T) {
			r.apply(t, trafficPolicyFor("echo-canary", "echo", `  httpRequestMatchers:
  - headers: [{name: x-canary, value: "yes"}]`, shiftToServices("echo-v2", "100"))+"---\n"+trafficPolicyFor("echo", "echo", "", shiftToServices("echo-v1", "100")))
		})
		route := r.wantRoutedBy(t, outputs.GRPCRoutes, "relaymesh-echo")
		rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
		assert.Len(t, rules, 2, "the header rule, then the rest")
	})

	t.Run("request timeout through an HTTPRoute", func(t *testing.T) {
		r.subtest(t)
		h2, err := f.sleep.Dial("echo-h2", ns, echoPort)
		require.NoError(t, err)
		defer h2.Close()
		slow := dataplane.CallOptions{Request: dataplane.Request{Delay: time.Second}, Concurrency: 20}
		o := run(t, h2, 20, slow)
		require.Equal(t, 20, o.Code(codes.OK), "no timeout: slow calls succeed")
		r.apply(t, trafficPolicyFor("echo-h2", "echo-h2", "", "    requestTimeout: 250ms\n"))
		f.settle(t, h2, "timeouts", dataplane.CallOptions{Request: dataplane.Request{Delay: time.Second}, Concurrency: 50}, func(o *dataplane.Outcomes) bool {
			return o.Code(codes.DeadlineExceeded) == o.Total()
		})
		start := time.Now()
		o = run(t, h2, 40, slow)
		assert.Equal(t, 40, o.Code(codes.DeadlineExceeded), "a 1s answer exceeds the 250ms timeout")
		assert.Less(t, time.Since(start), 2*time.Second, "calls ended at the timeout, not at the answer")
		o = run(t, h2, batch/4, dataplane.CallOptions{})
		assert.Equal(t, batch/4, o.Code(codes.OK), "fast calls are unaffected")
		route := r.wantRoutedBy(t, outputs.HTTPRoutes, "relaymesh-echo-h2")
		rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
		require.NotEmpty(t, rules)
		timeout, _, _ := unstructured.NestedString(rules[0].(map[string]any), "timeouts", "request")
		assert.Equal(t, "250ms", timeout)
	})

	t.Run("a timeout on the gRPC port is refused by name and not applied", func(t *testing.T) {
		r.subtest(t)
		r.apply(t, trafficPolicyFor("echo", "echo", "", "    requestTimeout: 250ms\n"))
		e2e.Eventually(t, 30*time.Second, "the policy's target on echo is Failed, naming the field", func() (bool, string) {
			state, errs, err := r.targetStatus(context.Background(), "echo", "cluster-1/apps/echo")
			msg := strings.Join(errs, " ")
			return err == nil && state == "Failed" && strings.Contains(msg, "policy.requestTimeout: GRPCRoute has no timeouts"), fmt.Sprint(state, errs, err)
		})
		n, err := r.outputs(context.Background(), "TrafficPolicy/relaymesh/echo")
		require.NoError(t, err)
		assert.Zero(t, n, "nothing of the policy is written with the field dropped")
		// A later policy that can be carried (the same timeout on the
		// http2 port) reaching the clients means the translation, the
		// agent and istiod have all moved past the refused one: had a
		// route with its timeout been written, it would be in force now.
		h2, err := f.sleep.Dial("echo-h2", ns, echoPort)
		require.NoError(t, err)
		defer h2.Close()
		r.apply(t, trafficPolicyFor("echo-h2", "echo-h2", "", "    requestTimeout: 250ms\n"))
		f.settle(t, h2, "the later policy's timeout", dataplane.CallOptions{Request: dataplane.Request{Delay: time.Second}, Concurrency: 50}, func(o *dataplane.Outcomes) bool {
			return o.Code(codes.DeadlineExceeded) == o.Total()
		})
		o := run(t, f.toEcho, 20, dataplane.CallOptions{Request: dataplane.Request{Delay: time.Second}, Concurrency: 20})
		assert.Equal(t, 20, o.Code(codes.OK), "no timeout is in force on the gRPC port: every 1s call succeeds")
	})
}

// optIntoGatewayAPI installs Gateway API's CRDs in cluster-1 (for good:
// CRDs are cluster-wide and later tests list the route kinds), writes the
// per-version Services and labels echo relaymesh.io/route-api=gateway-api,
// and waits until Relaymesh discovered all of it. At the end of the test
// the label and the Services go, and it waits until Relaymesh knows.
func optIntoGatewayAPI(t *testing.T, f *fixture, r *relaymesh) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	translationtest.InstallGatewayAPI(ctx, t, f.env.Local.Cluster("cluster-1"))
	for _, s := range perVersion {
		require.NoError(t, f.c.Service(ctx, s))
	}
	optedIn := echoService
	optedIn.Labels = map[string]string{discoveryv1alpha1.LabelRouteAPI: discoveryv1alpha1.RouteAPIGatewayAPI}
	require.NoError(t, f.c.Service(ctx, optedIn))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		assert.NoError(t, f.c.Service(ctx, echoService))
		for _, s := range perVersion {
			err := f.c.Kube().CoreV1().Services(ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
			assert.True(t, err == nil || apierrors.IsNotFound(err), "delete %s: %v", s.Name, err)
		}
		assert.NoError(t, f.c.SyncEndpoints(ctx, ns))
		e2e.Eventually(t, time.Minute, "Relaymesh forgets the per-version Services and echo's label", func() (bool, string) {
			names, labelled, err := r.echoDestinations(ctx)
			return err == nil && len(names) == 1 && !labelled, fmt.Sprint(names, labelled, err)
		})
	})
	e2e.Eventually(t, time.Minute, "Relaymesh discovers the per-version Services and echo's label", func() (bool, string) {
		names, labelled, err := r.echoDestinations(ctx)
		return err == nil && len(names) == 1+len(perVersion) && labelled, fmt.Sprint(names, labelled, err)
	})
}

// echoDestinations are the names of cluster-1's discovered Destinations
// whose Service is echo or starts with echo-, and whether echo's says
// relaymesh.io/route-api=gateway-api.
func (r *relaymesh) echoDestinations(ctx context.Context) ([]string, bool, error) {
	l, err := r.dyn.Resource(destinations).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, false, err
	}
	var names []string
	labelled := false
	for _, d := range l.Items {
		ref, _, _ := unstructured.NestedStringMap(d.Object, "spec", "kubeService", "ref")
		if ref["clusterName"] != "cluster-1" || ref["namespace"] != ns || (ref["name"] != "echo" && !strings.HasPrefix(ref["name"], "echo-")) {
			continue
		}
		names = append(names, ref["name"])
		if ref["name"] == "echo" {
			labels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "kubeService", "labels")
			labelled = labels[discoveryv1alpha1.LabelRouteAPI] == discoveryv1alpha1.RouteAPIGatewayAPI
		}
	}
	return names, labelled, nil
}

// wantRoutedBy asserts that cluster-1 holds Relaymesh's route name of the
// kind gvr in apps, and no VirtualService of Relaymesh for the same
// Service (Istio does not support both on one host); it returns the route.
func (r *relaymesh) wantRoutedBy(t *testing.T, gvr schema.GroupVersionResource, name string) *unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	route, err := r.c1.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err, "Relaymesh's %s %s/%s", gvr.Resource, ns, name)
	assert.Contains(t, route.GetLabels(), outputs.OwnerLabel)
	refs, _, _ := unstructured.NestedSlice(route.Object, "spec", "parentRefs")
	require.Len(t, refs, 1)
	assert.Equal(t, "Service", refs[0].(map[string]any)["kind"])
	vss, err := r.c1.Resource(outputs.VirtualServices).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel})
	require.NoError(t, err)
	for _, vs := range vss.Items {
		t.Errorf("VirtualService %s/%s beside the route", vs.GetNamespace(), vs.GetName())
	}
	return route
}

// targetStatus is the state and errors of the TrafficPolicy name's result
// on target (cluster/namespace/name).
func (r *relaymesh) targetStatus(ctx context.Context, name, target string) (string, []string, error) {
	tp, err := r.dyn.Resource(networkingv1alpha1.TrafficPolicies).Namespace("relaymesh").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", nil, err
	}
	targets, _, _ := unstructured.NestedSlice(tp.Object, "status", "destinations")
	for _, ts := range targets {
		m, _ := ts.(map[string]any)
		if m["target"] != target {
			continue
		}
		state, _ := m["state"].(string)
		errs, _, _ := unstructured.NestedStringSlice(m, "errors")
		return state, errs, nil
	}
	return "", nil, fmt.Errorf("no result on %s yet", target)
}

// trafficPolicyFor is a TrafficPolicy for the clients of cluster-1 (a
// selector of whole clusters, which a Gateway API route can carry) to
// cluster-1's Service.
func trafficPolicyFor(name, service, matchers, policy string) string {
	return `
apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: ` + name + `, namespace: relaymesh}
spec:
  sourceSelector: [{clusters: [cluster-1]}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: ` + service + `, namespace: apps, clusterName: cluster-1}]
` + matchers + `
  policy:
` + policy
}

// shiftToServices shifts to per-version Services: name, weight, ….
func shiftToServices(weights ...string) string {
	s := "    trafficShift:\n      destinations:\n"
	for i := 0; i < len(weights); i += 2 {
		s += "      - {weight: " + weights[i+1] + ", kubeService: {name: " + weights[i] + ", namespace: apps, clusterName: cluster-1}}\n"
	}
	return s
}
