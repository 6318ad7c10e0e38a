package check

import (
	"fmt"
	"testing"

	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// obj decodes one YAML object for the ambient tests.
func obj(t *testing.T, y string) unstructured.Unstructured {
	t.Helper()
	var m map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(y), &m))
	return unstructured.Unstructured{Object: m}
}

func objs(t *testing.T, ys ...string) []unstructured.Unstructured {
	out := make([]unstructured.Unstructured, len(ys))
	for i, y := range ys {
		out[i] = obj(t, y)
	}
	return out
}

// ambientWorld is a namespace shop in ambient mode with pods reviews-1
// (ambient) and legacy-1 (a sidecar), and a namespace plain without
// ambient.
func ambientWorld() *Ambient {
	return &Ambient{
		Namespaces: map[string]map[string]string{
			"shop":  {labelDataplaneMode: "ambient"},
			"plain": nil,
		},
		Pods: []Pod{
			{Namespace: "shop", Name: "reviews-1", Labels: map[string]string{"app": "reviews"}},
			{Namespace: "shop", Name: "legacy-1", Labels: map[string]string{"app": "legacy"}, Sidecar: true},
			{Namespace: "shop", Name: "optout-1", Labels: map[string]string{"app": "optout", labelDataplaneMode: "none"}},
			{Namespace: "plain", Name: "web-1", Labels: map[string]string{"app": "web"}},
		},
	}
}

func policy(ns, name, body string, labels ...string) string {
	meta := fmt.Sprintf("metadata: {name: %q, namespace: %s", name, ns)
	if len(labels) > 0 {
		meta += fmt.Sprintf(", labels: {%q: %s}", outputs.OwnerLabel, labels[0])
	}
	return "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n" + meta + "}\nspec:\n" + body
}

// The ztunnel-enforced AuthorizationPolicies: an ALLOW rule with an HTTP
// attribute on ambient pods is an error (it denies), a DENY one a warning
// (widened to L4); targetRefs, sidecar pods, pods that opted out and
// non-ambient namespaces are left alone.
func TestEvaluateAmbientZtunnelPolicies(t *testing.T) {
	const l7 = "  selector: {matchLabels: {app: reviews}}\n  rules:\n  - from: [{source: {principals: [a]}}]\n    to: [{operation: {methods: [GET], paths: [/x]}}]\n"
	for _, tc := range []struct {
		name     string
		policies []string
		want     Severity
		subject  string
		msg      []string
	}{
		{name: "an ALLOW with methods and paths on an ambient pod denies everyone",
			policies: []string{policy("shop", "reviews-l7", l7)},
			want:     Error, subject: "c1 AuthorizationPolicy shop/reviews-l7",
			msg: []string{"ALLOW policy (the user's)", "shop/reviews-1", "to.operation.methods, to.operation.paths", "denies everyone", "targetRefs"}},
		{name: "requestPrincipals, remoteIpBlocks and an HTTP when key count as HTTP",
			policies: []string{policy("shop", "jwt", "  rules:\n  - from: [{source: {requestPrincipals: ['*'], remoteIpBlocks: [1.2.3.4]}}]\n    when: [{key: 'request.headers[x]', values: [y]}, {key: source.ip, values: [1.2.3.4]}]\n")},
			want:     Error, subject: "c1 AuthorizationPolicy shop/jwt",
			msg: []string{"from.source.remoteIpBlocks, from.source.requestPrincipals, when request.headers[x]", "denies everyone"}},
		{name: "one HTTP rule among L4 rules denies its sources only",
			policies: []string{policy("shop", "mixed", "  rules:\n  - from: [{source: {principals: [a]}}]\n  - to: [{operation: {paths: [/admin]}}]\n")},
			want:     Error, subject: "c1 AuthorizationPolicy shop/mixed",
			msg: []string{"drops the rule that has them (rule 1 of 2)", "the sources it names are denied"}},
		{name: "another ALLOW on the same pods: allows no one, not denies everyone",
			policies: []string{policy("shop", "reviews-l7", l7), policy("shop", "l4", "  rules:\n  - from: [{source: {principals: [b]}}]\n")},
			want:     Error, subject: "c1 AuthorizationPolicy shop/reviews-l7",
			msg: []string{"allows no one", "unless another ALLOW admits them (shop/l4)"}},
		{name: "a DENY with paths is widened to L4",
			policies: []string{policy("shop", "deny-admin", "  action: DENY\n  rules:\n  - to: [{operation: {paths: [/admin]}}]\n")},
			want:     Warning, subject: "c1 AuthorizationPolicy shop/deny-admin",
			msg: []string{"DENY policy", "widens the rule to L4", "every request"}},
		{name: "a root-namespace policy reaches every namespace's ambient pods",
			policies: []string{policy("istio-system", "global", "  rules:\n  - to: [{operation: {methods: [GET]}}]\n")},
			want:     Error, subject: "c1 AuthorizationPolicy istio-system/global",
			msg: []string{"shop/reviews-1"}},
		{name: "targetRefs: enforced by the waypoint",
			policies: []string{policy("shop", "wp", "  targetRefs: [{kind: Service, group: '', name: reviews}]\n  rules:\n  - to: [{operation: {methods: [GET]}}]\n")},
			want:     OK},
		{name: "a sidecar pod reads HTTP rules itself",
			policies: []string{policy("shop", "legacy", "  selector: {matchLabels: {app: legacy}}\n  rules:\n  - to: [{operation: {methods: [GET]}}]\n")},
			want:     OK},
		{name: "a pod that opted out of ambient is not ztunnel's",
			policies: []string{policy("shop", "optout", "  selector: {matchLabels: {app: optout}}\n  rules:\n  - to: [{operation: {methods: [GET]}}]\n")},
			want:     OK},
		{name: "a namespace without ambient is not ztunnel's",
			policies: []string{policy("plain", "web", "  rules:\n  - to: [{operation: {methods: [GET]}}]\n")},
			want:     OK},
		{name: "L4-only rules are fine",
			policies: []string{policy("shop", "l4", "  rules:\n  - from: [{source: {principals: [a], namespaces: [b]}}]\n    to: [{operation: {ports: ['9080']}}]\n    when: [{key: source.namespace, values: [b]}]\n")},
			want:     OK},
		{name: "Relaymesh's sidecar object beside its .ztunnel policy is the migration, not a pitfall",
			policies: []string{policy("shop", "relaymesh-reviews", l7, "agent"), policy("shop", "relaymesh-reviews.ztunnel", "  selector: {matchLabels: {app: reviews}}\n  rules:\n  - from: [{source: {principals: [w]}}]\n", "agent")},
			want:     OK, subject: "c1 AuthorizationPolicy shop/relaymesh-reviews",
			msg: []string{"in migration"}},
		{name: "Relaymesh's object alone is named as Relaymesh's",
			policies: []string{policy("shop", "relaymesh-reviews", l7, "agent")},
			want:     Error, subject: "c1 AuthorizationPolicy shop/relaymesh-reviews",
			msg: []string{"(written by Relaymesh)", "older than it, or a bug"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := ambientWorld()
			a.AuthorizationPolicies = objs(t, tc.policies...)
			rs := evalAmbientCluster("c1", a)
			sev, msgs := worst(rs)
			assert.Equal(t, tc.want, sev, msgs)
			if tc.subject != "" {
				got := find(rs, AreaAmbient, tc.subject)
				require.Len(t, got, 1, msgs)
				for _, m := range tc.msg {
					assert.Contains(t, got[0].Message, m)
				}
			}
			if tc.want == OK && tc.subject == "" {
				require.Len(t, rs, 1)
				assert.Contains(t, rs[0].Message, "no ambient pitfall")
			}
		})
	}
}

const waypointYAML = `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop, labels: {%s}}
spec: {gatewayClassName: istio-waypoint}`

// A headless Service behind a waypoint for Service traffic is a warning
// naming what is not applied; a waypoint for all traffic, a Service with a
// cluster IP, or no binding is fine.
func TestEvaluateAmbientHeadlessService(t *testing.T) {
	route := `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: relaymesh-db, namespace: shop, labels: {relaymesh.io/owner: agent}}
spec: {parentRefs: [{group: '', kind: Service, name: db}]}`
	for _, tc := range []struct {
		name      string
		svc       Service
		nsLabels  map[string]string
		gwLabels  string
		want      Severity
		msg       []string
		withRoute bool
	}{
		{name: "bound on the Service, default traffic type", svc: Service{Namespace: "shop", Name: "db", Headless: true, Labels: map[string]string{labelUseWaypoint: "waypoint"}},
			want: Warning, msg: []string{"headless Service", "waypoint shop/waypoint", "bypasses the waypoint", "not applied"}},
		{name: "bound through the namespace, waypoint-for service, a route attached", svc: Service{Namespace: "shop", Name: "db", Headless: true},
			nsLabels: map[string]string{labelUseWaypoint: "waypoint"}, gwLabels: labelWaypointFor + ": service", withRoute: true,
			want: Warning, msg: []string{"HTTPRoute shop/relaymesh-db (written by Relaymesh)", "those sources are denied"}},
		{name: "a waypoint for all traffic serves the pods too", svc: Service{Namespace: "shop", Name: "db", Headless: true, Labels: map[string]string{labelUseWaypoint: "waypoint"}},
			gwLabels: labelWaypointFor + ": all", want: OK},
		{name: "a cluster IP goes through the waypoint", svc: Service{Namespace: "shop", Name: "db", Labels: map[string]string{labelUseWaypoint: "waypoint"}}, want: OK},
		{name: "none opts out of the namespace's waypoint", svc: Service{Namespace: "shop", Name: "db", Headless: true, Labels: map[string]string{labelUseWaypoint: "none"}},
			nsLabels: map[string]string{labelUseWaypoint: "waypoint"}, want: OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Ambient{Namespaces: map[string]map[string]string{"shop": tc.nsLabels}, Services: []Service{tc.svc},
				Waypoints: objs(t, fmt.Sprintf(waypointYAML, tc.gwLabels))}
			if tc.withRoute {
				a.HTTPRoutes = objs(t, route)
			}
			rs := evalAmbientCluster("c1", a)
			sev, msgs := worst(rs)
			assert.Equal(t, tc.want, sev, msgs)
			if tc.want != OK {
				got := find(rs, AreaAmbient, "c1 Service shop/db")
				require.Len(t, got, 1, msgs)
				for _, m := range tc.msg {
					assert.Contains(t, got[0].Message, m)
				}
			}
		})
	}
}

// A VirtualService host and an HTTPRoute/GRPCRoute Service parentRef on one
// Service is an error that says whose each is; hosts in every form name
// the Service; a gateway-only VirtualService and a Gateway parent do not
// count.
func TestEvaluateAmbientRouteMixing(t *testing.T) {
	vs := func(name, hosts, extra string, owned bool) string {
		labels := ""
		if owned {
			labels = ", labels: {relaymesh.io/owner: agent}"
		}
		return fmt.Sprintf("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: %s, namespace: shop%s}\nspec: {hosts: %s%s}", name, labels, hosts, extra)
	}
	rt := func(kind, parent string, owned bool) string {
		labels := ""
		if owned {
			labels = ", labels: {relaymesh.io/owner: agent}"
		}
		return fmt.Sprintf("apiVersion: gateway.networking.k8s.io/v1\nkind: %s\nmetadata: {name: relaymesh-reviews, namespace: shop%s}\nspec: {parentRefs: [%s]}", kind, labels, parent)
	}
	const svcParent = "{group: '', kind: Service, name: reviews}"
	for _, tc := range []struct {
		name   string
		vs     []string
		routes []string
		kind   string // of the routes: HTTPRoute unless set
		want   Severity
		msg    []string
	}{
		{name: "short host and Relaymesh's HTTPRoute", vs: []string{vs("mine", "[reviews]", "", false)}, routes: []string{rt("HTTPRoute", svcParent, true)},
			want: Error, msg: []string{"VirtualService shop/mine (the user's)", "HTTPRoute shop/relaymesh-reviews (written by Relaymesh)", "delete the user's VirtualService"}},
		{name: "FQDN host and a user's GRPCRoute beside Relaymesh's VirtualService", vs: []string{vs("relaymesh-reviews", "[reviews.shop.svc.cluster.local]", "", true)},
			routes: []string{rt("GRPCRoute", svcParent, false)}, kind: "GRPCRoute",
			want: Error, msg: []string{"GRPCRoute shop/relaymesh-reviews (the user's)", "delete the user's route"}},
		{name: "a user's TCPRoute on the Service beside a user's VirtualService", vs: []string{vs("mine", "[reviews]", "", false)},
			routes: []string{rt("TCPRoute", svcParent, false)}, kind: "TCPRoute",
			want: Error, msg: []string{"VirtualService shop/mine (the user's)", "TCPRoute shop/relaymesh-reviews (the user's)", "keep one API"}},
		{name: "FQDN host with another cluster domain, both the user's", vs: []string{vs("mine", "[reviews.shop.svc.corp.example]", "", false)}, routes: []string{rt("HTTPRoute", svcParent, false)},
			want: Error, msg: []string{"keep one API"}},
		{name: "a VirtualService for gateways only is not mesh routing", vs: []string{vs("mine", "[reviews]", ", gateways: [shop/ingress]", false)},
			routes: []string{rt("HTTPRoute", svcParent, true)}, want: OK},
		{name: "a VirtualService bound to mesh and a gateway is", vs: []string{vs("mine", "[reviews]", ", gateways: [mesh, shop/ingress]", false)},
			routes: []string{rt("HTTPRoute", svcParent, true)}, want: Error},
		{name: "a route whose parent is a Gateway is not on the Service", vs: []string{vs("mine", "[reviews]", "", false)},
			routes: []string{rt("HTTPRoute", "{kind: Gateway, name: reviews}", false)}, want: OK},
		{name: "a Service parent without group '' is defaulted to the Gateway API group: no Service", vs: []string{vs("mine", "[reviews]", "", false)},
			routes: []string{rt("HTTPRoute", "{kind: Service, name: reviews}", false)}, want: OK},
		{name: "another Service's host", vs: []string{vs("mine", "[ratings, '*.shop.svc.cluster.local', reviews.other.svc.cluster.local, reviews.shop, reviews.shop.svc]", "", false)},
			routes: []string{rt("HTTPRoute", svcParent, true)}, want: OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Ambient{VirtualServices: objs(t, tc.vs...)}
			switch tc.kind {
			case "GRPCRoute":
				a.GRPCRoutes = objs(t, tc.routes...)
			case "TCPRoute":
				a.TCPRoutes = objs(t, tc.routes...)
			default:
				a.HTTPRoutes = objs(t, tc.routes...)
			}
			rs := evalAmbientCluster("c1", a)
			sev, msgs := worst(rs)
			assert.Equal(t, tc.want, sev, msgs)
			if tc.want != OK {
				got := find(rs, AreaAmbient, "c1 Service shop/reviews")
				require.Len(t, got, 1, msgs)
				assert.Contains(t, got[0].Message, "Istio does not support")
				for _, m := range tc.msg {
					assert.Contains(t, got[0].Message, m)
				}
			}
		})
	}
}

// Objects of the wrong shape never crash the evaluation: what cannot be
// read is a warning on that object, the rest is still checked.
func TestEvaluateAmbientMalformedObjectsDoNotCrash(t *testing.T) {
	bad := []map[string]any{
		{"spec": "a string"},
		{"metadata": "x", "spec": map[string]any{"rules": "not a list"}},
		{"metadata": map[string]any{"name": 7, "namespace": []any{}, "labels": "x"}, "spec": map[string]any{"rules": []any{"x"}}},
		{"metadata": map[string]any{"name": "a", "namespace": "shop"}, "spec": map[string]any{"selector": "x"}},
		{"metadata": map[string]any{"name": "b", "namespace": "shop"}, "spec": map[string]any{"selector": map[string]any{"matchLabels": []any{1}}}},
		{"metadata": map[string]any{"name": "c", "namespace": "shop"}, "spec": map[string]any{"rules": []any{map[string]any{"to": "x"}}}},
		{"metadata": map[string]any{"name": "d", "namespace": "shop"}, "spec": map[string]any{"rules": []any{map[string]any{"to": []any{map[string]any{"operation": 5}}}}}},
		{"metadata": map[string]any{"name": "e", "namespace": "shop"}, "spec": map[string]any{"rules": []any{map[string]any{"from": []any{7}, "when": []any{map[string]any{"key": 3}}}}}},
		{"metadata": map[string]any{"name": "f", "namespace": "shop"}, "spec": map[string]any{"rules": []any{map[string]any{"when": "x"}}, "targetRefs": "x", "action": 5}},
		{"metadata": map[string]any{"name": "g", "namespace": "shop"}, "spec": map[string]any{"rules": []any{map[string]any{"to": []any{map[string]any{"operation": map[string]any{"paths": "x"}}}}}}},
		{"metadata": map[string]any{"name": "h", "namespace": "shop"}, "spec": map[string]any{"hosts": []any{map[string]any{}, 5, "reviews"}, "gateways": []any{map[string]any{}}, "parentRefs": []any{"x", map[string]any{"kind": 5}, map[string]any{"kind": "Service", "group": "", "name": "reviews", "namespace": 4}}, "targetRefs": []any{"x", map[string]any{"kind": []any{}}}}},
		{"metadata": map[string]any{"name": "i", "namespace": "shop"}, "spec": map[string]any{"hosts": "reviews"}},
		{},
	}
	var us []unstructured.Unstructured
	for _, m := range bad {
		us = append(us, unstructured.Unstructured{Object: m})
	}
	a := ambientWorld()
	a.Services = []Service{{Namespace: "shop", Name: "reviews", Headless: true, Labels: map[string]string{labelUseWaypoint: "waypoint"}}}
	a.AuthorizationPolicies, a.VirtualServices, a.HTTPRoutes, a.GRPCRoutes, a.TCPRoutes, a.Waypoints = us, us, us, us, us, us
	a.AuthorizationPolicies = append(a.AuthorizationPolicies, obj(t, policy("shop", "reviews-l7", "  rules:\n  - to: [{operation: {methods: [GET]}}]\n")))
	var rs []Result
	require.NotPanics(t, func() { rs = evalAmbientCluster("c1", a) })
	assert.NotEmpty(t, find(rs, AreaAmbient, "c1 AuthorizationPolicy shop/a"), "a selector that is not an object is a warning")
	for _, name := range []string{"b", "c", "d", "e", "f"} {
		got := find(rs, AreaAmbient, "c1 AuthorizationPolicy shop/"+name)
		require.Len(t, got, 1, name)
		assert.Equal(t, Warning, got[0].Severity, got[0].Message)
		assert.Contains(t, got[0].Message, "cannot read it")
	}
	got := find(rs, AreaAmbient, "c1 AuthorizationPolicy shop/reviews-l7")
	require.Len(t, got, 1, "a well-formed policy beside malformed ones is still judged")
	assert.Equal(t, Error, got[0].Severity)
	got = find(rs, AreaAmbient, "c1 VirtualService shop/i")
	require.Len(t, got, 1)
	assert.Equal(t, Warning, got[0].Severity)
}

// A list that failed is a warning (the check is incomplete, never green).
func TestEvaluateAmbientListErrorsAreWarnings(t *testing.T) {
	o := &Observations{Workloads: []Workload{{Cluster: "c1", Ambient: &Ambient{Errs: []error{fmt.Errorf("list pods: forbidden")}}}, {Cluster: "c2"}}}
	rs := find(evalAmbient(o), AreaAmbient, "")
	require.Len(t, rs, 1, "c2 was not read: nothing said of it")
	assert.Equal(t, Warning, rs[0].Severity)
	assert.Contains(t, rs[0].Message, "list pods: forbidden")
}

// A policy whose target is a Service no waypoint serves is enforced
// nowhere (fail open): an error for ALLOW and DENY alike; bound to a
// waypoint for Service traffic, or targeting a Gateway, it is fine.
func TestEvaluateAmbientPolicyOnAServiceNoWaypointServes(t *testing.T) {
	target := "  targetRefs: [{group: '', kind: Service, name: reviews}]\n  rules:\n  - to: [{operation: {methods: [GET]}}]\n"
	for _, tc := range []struct {
		name     string
		policy   string
		svc      Service
		nsLabels map[string]string
		gwLabels string
		want     Severity
		msg      []string
	}{
		{name: "ALLOW on an unbound Service restricts nothing", policy: policy("shop", "reviews-get", target),
			svc: Service{Namespace: "shop", Name: "reviews"}, want: Error,
			msg: []string{"ALLOW policy (the user's) targets Service shop/reviews", "bound to no waypoint", "enforced nowhere", "restricts nothing"}},
		{name: "DENY on an unbound Service denies nothing", policy: policy("shop", "reviews-deny", "  action: DENY\n"+target, "agent"),
			svc: Service{Namespace: "shop", Name: "reviews"}, want: Error,
			msg: []string{"DENY policy (written by Relaymesh)", "denies nothing"}},
		{name: "bound to a waypoint for workload traffic", policy: policy("shop", "reviews-get", target),
			svc: Service{Namespace: "shop", Name: "reviews", Labels: map[string]string{labelUseWaypoint: "waypoint"}}, gwLabels: labelWaypointFor + ": workload", want: Error,
			msg: []string{"does not serve Service traffic (istio.io/waypoint-for: workload)"}},
		{name: "bound through its namespace to a waypoint for Service traffic", policy: policy("shop", "reviews-get", target),
			svc: Service{Namespace: "shop", Name: "reviews"}, nsLabels: map[string]string{labelUseWaypoint: "waypoint"}, want: OK},
		{name: "no such Service", policy: policy("shop", "reviews-get", target), svc: Service{Namespace: "shop", Name: "ratings"}, want: OK},
		{name: "a Gateway target", policy: policy("shop", "gw", "  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: reviews}]\n"),
			svc: Service{Namespace: "shop", Name: "reviews"}, want: OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Ambient{Namespaces: map[string]map[string]string{"shop": tc.nsLabels}, Services: []Service{tc.svc},
				Waypoints: objs(t, fmt.Sprintf(waypointYAML, tc.gwLabels)), AuthorizationPolicies: objs(t, tc.policy)}
			rs := evalAmbientCluster("c1", a)
			sev, msgs := worst(rs)
			assert.Equal(t, tc.want, sev, msgs)
			if tc.want != OK {
				require.Len(t, rs, 1, msgs)
				for _, m := range tc.msg {
					assert.Contains(t, rs[0].Message, m)
				}
			}
		})
	}
}
