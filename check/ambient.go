package check

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/relaymesh/relaymesh/api/outputs"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The ambient pitfalls (docs/design/2026-12-02-ambient-translation.md):
// what works with sidecars and silently breaks, or half works, in an Istio
// ambient data plane. evalAmbient judges a workload cluster's own objects;
// it never trusts their shape (a field of the wrong type is a warning on
// that object, not a crash).

// istioRootNamespace is Istio's default root namespace: a policy there
// without a selector applies to every workload of the mesh, one with a
// selector to the matching workloads of every namespace.
const istioRootNamespace = "istio-system"

// l4WhenKeys are the `when` keys ztunnel enforces (istiod's
// l4WhenAttributes); any other key is an HTTP attribute to it.
var l4WhenKeys = []string{"source.ip", "source.namespace", "source.principal", "destination.ip", "destination.port"}

// httpOperationFields and httpSourceFields are the fields of a rule's
// to.operation and from.source that ztunnel cannot enforce (istiod's
// httpOperations, httpSources).
var (
	httpOperationFields = []string{"hosts", "notHosts", "methods", "notMethods", "paths", "notPaths"}
	httpSourceFields    = []string{"requestPrincipals", "notRequestPrincipals", "remoteIpBlocks", "notRemoteIpBlocks"}
)

// maxNamedPods bounds the pods a result names.
const maxNamedPods = 3

// evalAmbient reports the ambient pitfalls of every workload cluster that
// was read.
func evalAmbient(o *Observations) []Result {
	var rs []Result
	for i := range o.Workloads {
		w := &o.Workloads[i]
		if w.Ambient == nil {
			continue
		}
		cluster := cmp.Or(w.Cluster, "context "+w.Context)
		rs = append(rs, evalAmbientCluster(cluster, w.Ambient)...)
	}
	return rs
}

func evalAmbientCluster(cluster string, a *Ambient) []Result {
	var rs []Result
	for _, err := range a.Errs {
		rs = append(rs, result(AreaAmbient, cluster, Warning, "%v: the ambient pitfalls that need it are not checked", err))
	}
	found := len(rs)
	pods := ambientPods(a)
	rs = append(rs, evalZtunnelPolicies(cluster, a, pods)...)
	rs = append(rs, evalHeadlessWaypoints(cluster, a)...)
	rs = append(rs, evalUnservedTargets(cluster, a)...)
	rs = append(rs, evalRouteMixing(cluster, a)...)
	if found > 0 {
		return rs // incomplete: never all clear
	}
	for _, r := range rs {
		if r.Severity != OK {
			return rs
		}
	}
	n := 0
	for _, ps := range pods {
		n += len(ps)
	}
	return append(rs, result(AreaAmbient, cluster, OK, "no ambient pitfall among %d ambient pod(s), %d AuthorizationPolicies, %d headless Services, %d VirtualServices and %d Gateway API routes",
		n, len(a.AuthorizationPolicies), countHeadless(a.Services), len(a.VirtualServices), len(a.HTTPRoutes)+len(a.GRPCRoutes)+len(a.TCPRoutes)))
}

func countHeadless(ss []Service) int {
	n := 0
	for _, s := range ss {
		if s.Headless {
			n++
		}
	}
	return n
}

// ambientPods are the pods ztunnel captures, by namespace: istio-cni says
// so, or (without a sidecar) the pod or its namespace is labelled
// istio.io/dataplane-mode=ambient and the pod does not say none.
func ambientPods(a *Ambient) map[string][]Pod {
	out := map[string][]Pod{}
	for _, p := range a.Pods {
		if p.Sidecar {
			continue
		}
		if _, proxy := p.Labels[labelGatewayName]; proxy { // a waypoint's own pod
			continue
		}
		mode := p.Labels[labelDataplaneMode]
		if p.Redirected || mode == "ambient" || (mode != "none" && a.Namespaces[p.Namespace][labelDataplaneMode] == "ambient") {
			out[p.Namespace] = append(out[p.Namespace], p)
		}
	}
	return out
}

// owner says whose an object is: Relaymesh's (its agent applied it) or the
// user's.
func owner(u *unstructured.Unstructured) string {
	if u.GetLabels()[outputs.OwnerLabel] != "" {
		return "written by Relaymesh"
	}
	return "the user's"
}

func relaymeshOwned(u *unstructured.Unstructured) bool {
	return u.GetLabels()[outputs.OwnerLabel] != ""
}

// ztunnelPolicy is an AuthorizationPolicy ztunnel enforces on some ambient
// pods.
type ztunnelPolicy struct {
	u     *unstructured.Unstructured
	allow bool
	pods  []Pod
	// httpRules are the indexes of the rules with HTTP attributes; fields
	// those attributes, sorted.
	httpRules []int
	rules     int
	fields    []string
}

func podKey(p Pod) string { return p.Namespace + "/" + p.Name }

// evalZtunnelPolicies finds the AuthorizationPolicies ztunnel enforces on
// ambient pods (a selector, or none and no targetRefs) that hold HTTP
// attributes: istiod drops an ALLOW rule with one (what it allows is
// denied) and widens a DENY rule to its L4 part (it denies more).
func evalZtunnelPolicies(cluster string, a *Ambient, pods map[string][]Pod) []Result {
	var rs []Result
	var policies []*ztunnelPolicy
	for i := range a.AuthorizationPolicies {
		u := &a.AuthorizationPolicies[i]
		subject := cluster + " AuthorizationPolicy " + u.GetNamespace() + "/" + u.GetName()
		spec, ok := u.Object["spec"].(map[string]any)
		if !ok {
			continue // no spec: an ALLOW nothing, or not an object at all
		}
		if targeted(spec) {
			continue // enforced by a waypoint or gateway, not ztunnel
		}
		zp := &ztunnelPolicy{u: u}
		action, ok := spec["action"].(string)
		if !ok && spec["action"] != nil {
			rs = append(rs, result(AreaAmbient, subject, Warning, "cannot read it (spec.action is a %T, not a string): not checked for ambient pitfalls", spec["action"]))
			continue
		}
		switch action {
		case "", "ALLOW":
			zp.allow = true
		case "DENY":
		default:
			continue // CUSTOM, AUDIT: not ztunnel's
		}
		sel, err := selectorOf(spec)
		if err != nil {
			rs = append(rs, result(AreaAmbient, subject, Warning, "cannot read it (%v): not checked for ambient pitfalls", err))
			continue
		}
		zp.pods = selectPods(pods, u.GetNamespace(), sel)
		if len(zp.pods) == 0 {
			continue
		}
		if err := zp.readRules(spec); err != nil {
			rs = append(rs, result(AreaAmbient, subject, Warning, "cannot read it (%v): not checked for ambient pitfalls", err))
			continue
		}
		policies = append(policies, zp)
	}
	for _, zp := range policies {
		if len(zp.httpRules) == 0 {
			continue
		}
		u := zp.u
		subject := cluster + " AuthorizationPolicy " + u.GetNamespace() + "/" + u.GetName()
		on := fmt.Sprintf("enforced by ztunnel on %d ambient pod(s) (%s)", len(zp.pods), namedPods(zp.pods))
		fields := strings.Join(zp.fields, ", ")
		if !zp.allow {
			rs = append(rs, result(AreaAmbient, subject, Warning, "DENY policy (%s) %s holds HTTP attributes ztunnel cannot enforce (%s): istiod widens %s to L4, so it denies the matching sources on every request, not only those with those attributes; bind the workloads to a waypoint and target it with targetRefs",
				owner(u), on, fields, plural(len(zp.httpRules), "the rule", "those rules")))
			continue
		}
		others := otherAllows(zp, policies)
		if relaymeshOwned(u) && slices.ContainsFunc(others, func(o *ztunnelPolicy) bool {
			return relaymeshOwned(o.u) && o.u.GetNamespace() == u.GetNamespace() && o.u.GetName() == u.GetName()+".ztunnel"
		}) {
			// The sidecar object of a mixed Destination, beside its
			// .ztunnel policy: its HTTP rules serve the sidecar pods.
			rs = append(rs, result(AreaAmbient, subject, OK, "Relaymesh's sidecar policy of a Destination in migration: its HTTP rules (%s) apply to the sidecar pods; on the %d ambient pod(s) Relaymesh's %s.ztunnel policy and its waypoint enforce them",
				fields, len(zp.pods), u.GetName()))
			continue
		}
		var consequence string
		switch {
		case len(zp.httpRules) == zp.rules && len(others) == 0:
			consequence = "istiod drops every rule that has them, so this ALLOW matches nothing and, being the only ALLOW there, denies everyone on those pods"
		case len(zp.httpRules) == zp.rules:
			consequence = fmt.Sprintf("istiod drops every rule that has them, so this ALLOW allows no one: the sources it names are denied there unless another ALLOW admits them (%s)", policyNames(others))
		default:
			consequence = fmt.Sprintf("istiod drops %s (%s of %d), so the sources %s are denied there", plural(len(zp.httpRules), "the rule that has them", "the rules that have them"),
				ruleNumbers(zp.httpRules), zp.rules, map[bool]string{true: "it names", false: "they name"}[len(zp.httpRules) == 1])
		}
		fix := "move the HTTP conditions to a policy with targetRefs to the waypoint serving these workloads (or a Service bound to one)"
		if relaymeshOwned(u) {
			fix = "Relaymesh's ambient translation never writes this: the object is from a Relaymesh older than it, or a bug; report it"
		}
		rs = append(rs, result(AreaAmbient, subject, Error, "ALLOW policy (%s) %s holds HTTP attributes ztunnel cannot enforce (%s): %s; %s",
			owner(u), on, fields, consequence, fix))
	}
	return rs
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func ruleNumbers(idx []int) string {
	s := make([]string, len(idx))
	for i, n := range idx {
		s[i] = fmt.Sprintf("rule %d", n)
	}
	return strings.Join(s, ", ")
}

func namedPods(pods []Pod) string {
	names := make([]string, 0, maxNamedPods)
	for _, p := range pods[:min(len(pods), maxNamedPods)] {
		names = append(names, podKey(p))
	}
	if n := len(pods) - len(names); n > 0 {
		names = append(names, fmt.Sprintf("and %d more", n))
	}
	return strings.Join(names, ", ")
}

func policyNames(ps []*ztunnelPolicy) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.u.GetNamespace() + "/" + p.u.GetName()
	}
	return strings.Join(names, ", ")
}

// otherAllows are the other ztunnel ALLOW policies on any of zp's pods.
func otherAllows(zp *ztunnelPolicy, all []*ztunnelPolicy) []*ztunnelPolicy {
	mine := map[string]bool{}
	for _, p := range zp.pods {
		mine[podKey(p)] = true
	}
	var out []*ztunnelPolicy
	for _, o := range all {
		if o == zp || !o.allow {
			continue
		}
		if slices.ContainsFunc(o.pods, func(p Pod) bool { return mine[podKey(p)] }) {
			out = append(out, o)
		}
	}
	return out
}

// targeted says whether a policy names targets (targetRef or targetRefs):
// ztunnel ignores it.
func targeted(spec map[string]any) bool {
	if ref, ok := spec["targetRef"]; ok && ref != nil {
		return true
	}
	refs, _ := spec["targetRefs"].([]any)
	return len(refs) > 0
}

// selectorOf returns spec.selector.matchLabels; nil without a selector
// (every pod of the namespace), an empty map for an empty one.
func selectorOf(spec map[string]any) (map[string]string, error) {
	raw, ok := spec["selector"]
	if !ok || raw == nil {
		return nil, nil
	}
	sel, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("spec.selector is a %T, not an object", raw)
	}
	m, _, err := unstructured.NestedStringMap(sel, "matchLabels")
	if err != nil {
		return nil, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// selectPods are the ambient pods a policy of namespace ns with selector
// sel applies to: its namespace's, every namespace's in the root
// namespace.
func selectPods(pods map[string][]Pod, ns string, sel map[string]string) []Pod {
	var out []Pod
	for _, pn := range slices.Sorted(maps.Keys(pods)) {
		if pn != ns && ns != istioRootNamespace {
			continue
		}
		for _, p := range pods[pn] {
			if matches(sel, p.Labels) {
				out = append(out, p)
			}
		}
	}
	return out
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if have, ok := labels[k]; !ok || have != v {
			return false
		}
	}
	return true
}

// readRules finds the rules with HTTP attributes, as istiod's handleRule
// does.
func (zp *ztunnelPolicy) readRules(spec map[string]any) error {
	raw, ok := spec["rules"]
	if !ok || raw == nil {
		return nil
	}
	rules, ok := raw.([]any)
	if !ok {
		return fmt.Errorf("spec.rules is a %T, not a list", raw)
	}
	zp.rules = len(rules)
	found := map[string]bool{}
	for i, r := range rules {
		rule, ok := r.(map[string]any)
		if !ok {
			return fmt.Errorf("spec.rules[%d] is a %T, not an object", i, r)
		}
		var http []string
		for _, part := range []struct{ list, inner string }{{"to", "operation"}, {"from", "source"}} {
			fields := httpOperationFields
			if part.list == "from" {
				fields = httpSourceFields
			}
			items, err := listOf(rule, part.list)
			if err != nil {
				return fmt.Errorf("spec.rules[%d].%w", i, err)
			}
			for j, it := range items {
				m, ok := it.(map[string]any)
				if !ok {
					return fmt.Errorf("spec.rules[%d].%s[%d] is a %T, not an object", i, part.list, j, it)
				}
				inner, ok := m[part.inner].(map[string]any)
				if !ok {
					if m[part.inner] != nil {
						return fmt.Errorf("spec.rules[%d].%s[%d].%s is a %T, not an object", i, part.list, j, part.inner, m[part.inner])
					}
					continue
				}
				for _, f := range fields {
					if l, _ := inner[f].([]any); len(l) > 0 {
						http = append(http, part.list+"."+part.inner+"."+f)
					}
				}
			}
		}
		whens, err := listOf(rule, "when")
		if err != nil {
			return fmt.Errorf("spec.rules[%d].%w", i, err)
		}
		for j, it := range whens {
			m, ok := it.(map[string]any)
			if !ok {
				return fmt.Errorf("spec.rules[%d].when[%d] is a %T, not an object", i, j, it)
			}
			key, _ := m["key"].(string)
			if !slices.Contains(l4WhenKeys, key) {
				http = append(http, "when "+key)
			}
		}
		if len(http) > 0 {
			zp.httpRules = append(zp.httpRules, i)
			for _, f := range http {
				found[f] = true
			}
		}
	}
	zp.fields = slices.Sorted(maps.Keys(found))
	return nil
}

// listOf returns m[field] as a list (nil when absent).
func listOf(m map[string]any, field string) ([]any, error) {
	raw, ok := m[field]
	if !ok || raw == nil {
		return nil, nil
	}
	l, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("%s is a %T, not a list", field, raw)
	}
	return l, nil
}

// waypointFor is a waypoint Gateway's traffic type (istio.io/waypoint-for,
// default service).
func waypointFor(gw *unstructured.Unstructured) string {
	return cmp.Or(gw.GetLabels()[labelWaypointFor], "service")
}

// evalHeadlessWaypoints finds headless Services bound to a waypoint that
// serves Service traffic only: clients resolve the pods' IPs and bypass
// it, so the L7 policies and routes of the Service are not applied.
func evalHeadlessWaypoints(cluster string, a *Ambient) []Result {
	waypoints := map[string]*unstructured.Unstructured{}
	for i := range a.Waypoints {
		gw := &a.Waypoints[i]
		waypoints[gw.GetNamespace()+"/"+gw.GetName()] = gw
	}
	var rs []Result
	for _, s := range a.Services {
		if !s.Headless {
			continue
		}
		key := boundWaypoint(a, s)
		if key == "" {
			continue
		}
		gw := waypoints[key]
		if gw == nil || waypointFor(gw) != "service" {
			continue
		}
		l7 := attachedL7(a, s)
		applied := "the L7 policies and routes bound to it are not applied"
		if len(l7) > 0 {
			applied = "these are not applied: " + strings.Join(l7, ", ") + "; with Relaymesh's policies, ztunnel admits only the waypoint for a rule with paths or methods, so those sources are denied"
		}
		rs = append(rs, result(AreaAmbient, cluster+" Service "+s.Namespace+"/"+s.Name, Warning,
			"headless Service (clusterIP: None) bound to waypoint %s, which serves Service traffic only (istio.io/waypoint-for: service): clients resolve the pods' IPs and their traffic bypasses the waypoint, so %s; give the Service a cluster IP, or bind its pods to a waypoint for workload or all traffic",
			key, applied))
	}
	return rs
}

// boundWaypoint is namespace/name of the waypoint Service s is bound to
// (istio.io/use-waypoint on it, else on its namespace; none opts out), ""
// when none.
func boundWaypoint(a *Ambient, s Service) string {
	labels := s.Labels
	name, ok := labels[labelUseWaypoint]
	if !ok {
		labels = a.Namespaces[s.Namespace]
		name = labels[labelUseWaypoint]
	}
	if name == "" || name == "none" {
		return ""
	}
	return cmp.Or(labels[labelUseWaypointNamespace], s.Namespace) + "/" + name
}

// evalUnservedTargets finds AuthorizationPolicies that target a Service
// no waypoint serves: only a waypoint enforces a policy with a Service
// target (sidecars and ztunnel ignore it), so it is enforced nowhere — an
// ALLOW restricts nothing, a DENY denies nothing (fail open).
func evalUnservedTargets(cluster string, a *Ambient) []Result {
	services := map[string]Service{}
	for _, s := range a.Services {
		services[s.Namespace+"/"+s.Name] = s
	}
	waypoints := map[string]*unstructured.Unstructured{}
	for i := range a.Waypoints {
		waypoints[a.Waypoints[i].GetNamespace()+"/"+a.Waypoints[i].GetName()] = &a.Waypoints[i]
	}
	var rs []Result
	for i := range a.AuthorizationPolicies {
		u := &a.AuthorizationPolicies[i]
		spec, _ := u.Object["spec"].(map[string]any)
		for _, name := range serviceTargets(spec) {
			s, ok := services[u.GetNamespace()+"/"+name]
			if !ok {
				continue // not (yet) there: nothing it could apply to
			}
			why := ""
			switch key := boundWaypoint(a, s); {
			case key == "":
				why = "is bound to no waypoint (label istio.io/use-waypoint)"
			case waypoints[key] != nil && waypointFor(waypoints[key]) != "service" && waypointFor(waypoints[key]) != "all":
				why = fmt.Sprintf("is bound to waypoint %s, which does not serve Service traffic (istio.io/waypoint-for: %s)", key, waypointFor(waypoints[key]))
			default:
				continue
			}
			action, _ := spec["action"].(string)
			effect := "it restricts nothing: the Service's pods accept what it would not allow, unless another policy restricts them"
			if action == "DENY" {
				effect = "it denies nothing"
			}
			rs = append(rs, result(AreaAmbient, cluster+" AuthorizationPolicy "+u.GetNamespace()+"/"+u.GetName(), Error,
				"%s policy (%s) targets Service %s/%s, which %s: only a waypoint enforces a policy whose target is a Service (sidecars and ztunnel ignore it), so it is enforced nowhere and %s; bind the Service to a waypoint for service traffic",
				cmp.Or(action, "ALLOW"), owner(u), u.GetNamespace(), name, why, effect))
		}
	}
	return rs
}

// serviceTargets are the names of the Services (group "", kind Service)
// a policy's targetRef and targetRefs name, in its own namespace.
func serviceTargets(spec map[string]any) []string {
	refs, _ := spec["targetRefs"].([]any)
	if ref, ok := spec["targetRef"]; ok && ref != nil {
		refs = append(refs, ref)
	}
	var out []string
	for _, r := range refs {
		m, _ := r.(map[string]any)
		kind, _ := m["kind"].(string)
		name, _ := m["name"].(string)
		group, _ := m["group"].(string)
		if kind == "Service" && group == "" && name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// attachedL7 names the policies and routes that bind to Service s at its
// waypoint: AuthorizationPolicies targeting it, routes with it as parent.
func attachedL7(a *Ambient, s Service) []string {
	var out []string
	for i := range a.AuthorizationPolicies {
		u := &a.AuthorizationPolicies[i]
		if u.GetNamespace() != s.Namespace {
			continue
		}
		spec, _ := u.Object["spec"].(map[string]any)
		if slices.Contains(serviceTargets(spec), s.Name) {
			out = append(out, fmt.Sprintf("AuthorizationPolicy %s/%s (%s)", u.GetNamespace(), u.GetName(), owner(u)))
		}
	}
	for _, r := range routesOf(a) {
		if slices.Contains(r.services, s.Namespace+"/"+s.Name) {
			out = append(out, fmt.Sprintf("%s %s/%s (%s)", r.kind, r.u.GetNamespace(), r.u.GetName(), owner(r.u)))
		}
	}
	return out
}

// route is an HTTPRoute, GRPCRoute or TCPRoute and the Services it is attached to
// (namespace/name of its Service parentRefs).
type route struct {
	kind     string
	u        *unstructured.Unstructured
	services []string
}

func routesOf(a *Ambient) []route {
	var out []route
	for _, l := range []struct {
		kind string
		us   []unstructured.Unstructured
	}{{"HTTPRoute", a.HTTPRoutes}, {"GRPCRoute", a.GRPCRoutes}, {"TCPRoute", a.TCPRoutes}} {
		for i := range l.us {
			u := &l.us[i]
			r := route{kind: l.kind, u: u}
			spec, _ := u.Object["spec"].(map[string]any)
			refs, _ := spec["parentRefs"].([]any)
			for _, ref := range refs {
				m, _ := ref.(map[string]any)
				kind, _ := m["kind"].(string)
				name, _ := m["name"].(string)
				// The CRD defaults group to gateway.networking.k8s.io: a
				// Service parent says group "".
				group, hasGroup := m["group"].(string)
				if kind != "Service" || !hasGroup || group != "" || name == "" {
					continue
				}
				ns, _ := m["namespace"].(string)
				r.services = append(r.services, cmp.Or(ns, u.GetNamespace())+"/"+name)
			}
			if len(r.services) > 0 {
				out = append(out, r)
			}
		}
	}
	return out
}

// serviceOfHost maps a VirtualService host to the Service it names in the
// cluster (namespace/name), "" for a host that names none (wildcards,
// external names). As istiod resolves it (ResolveShortnameToFQDN): a
// name without a dot is in the VirtualService's namespace; any other is
// taken as is, so it names a Service only as
// <name>.<namespace>.svc.<cluster domain>.
func serviceOfHost(host, ns string) string {
	if host == "" || strings.Contains(host, "*") {
		return ""
	}
	parts := strings.Split(host, ".")
	switch {
	case len(parts) == 1:
		return ns + "/" + parts[0]
	case len(parts) >= 4 && parts[2] == "svc" && parts[0] != "" && parts[1] != "":
		return parts[1] + "/" + parts[0]
	}
	return ""
}

// evalRouteMixing finds Services routed by both a VirtualService (for
// mesh traffic) and an HTTPRoute, GRPCRoute or TCPRoute: Istio does not support
// mixing the two on one host, and which wins is not defined.
func evalRouteMixing(cluster string, a *Ambient) []Result {
	byService := map[string][]route{}
	for _, r := range routesOf(a) {
		for _, s := range slices.Compact(slices.Sorted(slices.Values(r.services))) {
			byService[s] = append(byService[s], r)
		}
	}
	if len(byService) == 0 {
		return nil
	}
	vsOf := map[string][]*unstructured.Unstructured{}
	var rs []Result
	for i := range a.VirtualServices {
		u := &a.VirtualServices[i]
		spec, ok := u.Object["spec"].(map[string]any)
		if !ok {
			continue
		}
		if gws, _ := spec["gateways"].([]any); len(gws) > 0 && !slices.ContainsFunc(gws, func(g any) bool { return g == "mesh" }) {
			continue // bound to gateways only: not mesh traffic
		}
		hosts, ok := spec["hosts"].([]any)
		if !ok && spec["hosts"] != nil {
			rs = append(rs, result(AreaAmbient, cluster+" VirtualService "+u.GetNamespace()+"/"+u.GetName(), Warning, "cannot read it (spec.hosts is a %T, not a list): not checked for ambient pitfalls", spec["hosts"]))
			continue
		}
		seen := map[string]bool{}
		for _, h := range hosts {
			host, _ := h.(string)
			if s := serviceOfHost(host, u.GetNamespace()); s != "" && !seen[s] {
				seen[s] = true
				vsOf[s] = append(vsOf[s], u)
			}
		}
	}
	for _, s := range slices.Sorted(maps.Keys(vsOf)) {
		routes := byService[s]
		if len(routes) == 0 {
			continue
		}
		var vsNames, routeNames []string
		ownedVS, ownedRoute := 0, 0
		for _, u := range vsOf[s] {
			vsNames = append(vsNames, fmt.Sprintf("VirtualService %s/%s (%s)", u.GetNamespace(), u.GetName(), owner(u)))
			if relaymeshOwned(u) {
				ownedVS++
			}
		}
		for _, r := range routes {
			routeNames = append(routeNames, fmt.Sprintf("%s %s/%s (%s)", r.kind, r.u.GetNamespace(), r.u.GetName(), owner(r.u)))
			if relaymeshOwned(r.u) {
				ownedRoute++
			}
		}
		fix := "keep one API for this Service: for ambient workloads the route (a VirtualService is Alpha there), and express the other's routing in it"
		switch {
		case ownedRoute > 0 && ownedVS == 0:
			fix = "Relaymesh routes this ambient Service with the route (from TrafficPolicies): delete the user's VirtualService and express its routing as a TrafficPolicy"
		case ownedVS > 0 && ownedRoute == 0:
			fix = "Relaymesh routes this Service with the VirtualService (from TrafficPolicies): delete the user's route and express its routing as a TrafficPolicy"
		case ownedVS > 0 && ownedRoute > 0:
			fix = "Relaymesh never writes both for one Service: one is left from an older Relaymesh, or a bug; report it"
		}
		rs = append(rs, result(AreaAmbient, cluster+" Service "+s, Error, "routed by both %s and %s: Istio does not support a VirtualService and a Gateway API route on one host, and which one applies is not defined; %s",
			strings.Join(vsNames, ", "), strings.Join(routeNames, ", "), fix))
	}
	return rs
}
