package policy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/translation"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingv1 "istio.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tlsModes are the mtls.tlsMode values a TrafficPolicy may ask for.
var tlsModes = map[string]networkingv1.ClientTLSSettings_TLSmode{
	"DISABLE":      networkingv1.ClientTLSSettings_DISABLE,
	"SIMPLE":       networkingv1.ClientTLSSettings_SIMPLE,
	"ISTIO_MUTUAL": networkingv1.ClientTLSSettings_ISTIO_MUTUAL,
}

// Fields a TrafficPolicy sets; two policies setting one field for the same
// Destination and the same route conflict.
const (
	fieldTrafficShift       = "trafficShift"
	fieldFaultInjection     = "faultInjection"
	fieldRequestTimeout     = "requestTimeout"
	fieldRetries            = "retries"
	fieldCORSPolicy         = "corsPolicy"
	fieldMirror             = "mirror"
	fieldHeaderManipulation = "headerManipulation"
	fieldOutlierDetection   = "outlierDetection"
	fieldMTLS               = "mtls"
)

// TranslateTraffic turns TrafficPolicies into a VirtualService, and when
// there is something to put in it a DestinationRule, per selected
// Destination and per cluster the policy's source workloads run in.
//
// Decisions:
//   - In the Destination's own cluster the host is its local hostname; in
//     other clusters it is its federated hostname (the suffix of the
//     VirtualMesh federating it, default "global"). Objects
//     are named relaymesh-<service> (local) or relaymesh-<service>-<cluster>
//     (remote) in the Destination's namespace, except a DestinationRule for
//     a federated host: Istio reads one DestinationRule per host, so its
//     settings go into federation's (same name, the mesh's root namespace)
//     and translation.Output merges the two; a setting both make differently
//     (say mtls SIMPLE against federation's ISTIO_MUTUAL) fails that target.
//   - Policies are considered oldest first (creationTimestamp, then
//     namespace and name). A route is (sourceSelector, one request matcher);
//     policies with equal routes merge into one HTTP route, and two of them
//     setting the same field there (or outlierDetection/mtls on the same
//     Destination) conflict: the later is Invalid, naming the earlier.
//   - Routes are ordered most specific first (exact > regex > prefix URI,
//     longer prefix first, more headers, more query parameters, method,
//     source labels), then a default route to the Destination.
//   - sourceSelector labels and namespaces become sourceLabels and
//     sourceNamespace of the route's matches; clusters decide where the
//     VirtualService goes.
//   - appendRequestHeaders/appendResponseHeaders map to Istio's `add`.
//   - Subsets are named by their sorted labels (`version-v2`) and defined in
//     the DestinationRule of a target in the same cluster. A shift to a
//     subset of a Destination in another cluster than a source is Invalid:
//     the federated host's endpoints are east-west gateways, which carry no
//     subset labels.
func TranslateTraffic(in *translation.Input, out *translation.Output, r *translation.Report) {
	dests := translation.SortedDestinations(in.Destinations)
	byRef := map[common.ClusterObjectRef]*discoveryv1alpha1.Destination{}
	for _, d := range dests {
		if _, dup := byRef[d.Spec.KubeService.Ref]; !dup {
			byRef[d.Spec.KubeService.Ref] = d
		}
	}
	policies := translation.SortedTrafficPolicies(in.TrafficPolicies)

	b := &trafficBuilder{byRef: byRef, subsets: map[string]map[string]subsetSet{}, plan: federation.NewPlan(in), reach: map[*discoveryv1alpha1.Destination][]string{}}
	// Validate each policy on its own, then claim fields oldest first.
	owners := map[string]*networkingv1alpha1.TrafficPolicy{} // dest|route|field → owner
	var accepted []*trafficPolicy
	for _, p := range policies {
		key := trafficKey(p)
		if errs := validateTraffic(p, byRef); len(errs) > 0 {
			for _, e := range errs {
				r.Invalid(key, p.Generation, "%s", e)
			}
			continue
		}
		clusters, workloads := sourceClusters(in, p.Spec.SourceSelector)
		r.Workloads(key, workloads...)
		tp := &trafficPolicy{p: p, clusters: clusters, routes: routeKeys(p), selects: map[*discoveryv1alpha1.Destination]bool{}}
		if err := remoteSubset(p, tp.clusters); err != "" {
			r.Invalid(key, p.Generation, "%s", err)
			continue
		}
		for _, d := range dests {
			if translation.MatchDestination(p.Spec.DestinationSelector, d) {
				tp.dests = append(tp.dests, d)
				tp.selects[d] = true
			}
		}
		if err := unreachableTarget(b, tp); err != "" {
			r.Invalid(key, p.Generation, "%s", err)
			continue
		}
		if conflict := claim(owners, tp); conflict != "" {
			r.Invalid(key, p.Generation, "%s", conflict)
			continue
		}
		r.Accept(key, p.Generation)
		for _, d := range tp.dests {
			ts := common.TargetStatus{Target: translation.DestinationTarget(d), State: common.StateAccepted}
			if len(tp.clusters) == 0 {
				ts.Errors = []string{"sourceSelector matches no workload: the policy applies in no cluster"}
			}
			if note := routeAPINote(d); note != "" {
				ts.Errors = append(ts.Errors, note)
			}
			// A field the Destination's data plane cannot carry fails the
			// policy there, and only there (traffic_ambient.go).
			problems := b.sidecarIntoAmbient(tp)
			switch {
			case ambientOnly(d):
				problems = b.ambientProblems(in, tp, d)
			case gatewayRoutes(d) && routedHere(tp, d):
				// An opted-in sidecar Destination: the policy is in its
				// route. One only for other clusters' clients is only in
				// their VirtualServices, checked as before.
				problems = append(problems, b.ambientProblems(in, tp, d)...)
			}
			if len(problems) > 0 {
				ts.State = common.StateFailed
				ts.Errors = append(ts.Errors, problems...)
				delete(tp.selects, d)
			}
			r.Target(key, ts)
		}
		accepted = append(accepted, tp)
	}

	for _, d := range dests {
		var applied []*trafficPolicy
		for _, tp := range accepted {
			if tp.selects[d] {
				applied = append(applied, tp)
			}
		}
		if len(applied) == 0 {
			continue
		}
		// Gateway API routes in d's own cluster. A sidecar Destination that
		// opted into them keeps its VirtualServices in the other clusters
		// that reach it: they route its federated host, not the Service.
		routed := gatewayRoutes(d)
		if routed {
			b.gatewayRoute(out, r, d, applied)
			if ambientOnly(d) {
				continue
			}
		}
		// Config only where it can take effect: a remote Destination's
		// host exists in a cluster only where a VirtualMesh federates it;
		// elsewhere a VirtualService for it would configure a hostname
		// nothing defines. Walking d's clusters (not the policies') keeps
		// this linear in the fleet.
		for _, c := range b.reachableFrom(d) {
			if routed && c == d.Spec.KubeService.Ref.ClusterName {
				continue
			}
			for _, tp := range applied {
				if tp.clusters[c] {
					b.virtualService(out, r, c, d, applied)
					break
				}
			}
		}
	}
	for _, d := range dests {
		if ambientOnly(d) {
			continue // no DestinationRule for an ambient host
		}
		for _, c := range b.drClusters(d, accepted) {
			b.destinationRule(out, r, c, d, accepted)
		}
	}
}

type trafficPolicy struct {
	p        *networkingv1alpha1.TrafficPolicy
	clusters map[string]bool
	dests    []*discoveryv1alpha1.Destination
	selects  map[*discoveryv1alpha1.Destination]bool // dests, as a set
	routes   []routeKey
}

// routeKey is one route of a policy: its source selector and one request
// matcher (nil: any request), with a canonical string form.
type routeKey struct {
	key     string
	matcher *networkingv1alpha1.HTTPMatcher
}

func routeKeys(p *networkingv1alpha1.TrafficPolicy) []routeKey {
	src, _ := json.Marshal(p.Spec.SourceSelector)
	if len(p.Spec.HTTPRequestMatchers) == 0 {
		return []routeKey{{key: string(src) + "|"}}
	}
	var out []routeKey
	for i := range p.Spec.HTTPRequestMatchers {
		m := &p.Spec.HTTPRequestMatchers[i]
		mj, _ := json.Marshal(m)
		out = append(out, routeKey{key: string(src) + "|" + string(mj), matcher: m})
	}
	return out
}

// routeFields and destFields are the fields a policy sets per route and
// per Destination.
func routeFields(p *networkingv1alpha1.Policy) []string {
	var f []string
	for name, set := range map[string]bool{
		fieldTrafficShift: p.TrafficShift != nil, fieldFaultInjection: p.FaultInjection != nil,
		fieldRequestTimeout: p.RequestTimeout != nil, fieldRetries: p.Retries != nil,
		fieldCORSPolicy: p.CORSPolicy != nil, fieldMirror: p.Mirror != nil,
		fieldHeaderManipulation: p.HeaderManipulation != nil,
	} {
		if set {
			f = append(f, name)
		}
	}
	slices.Sort(f)
	return f
}

func destFields(p *networkingv1alpha1.Policy) []string {
	var f []string
	if p.MTLS != nil {
		f = append(f, fieldMTLS)
	}
	if p.OutlierDetection != nil {
		f = append(f, fieldOutlierDetection)
	}
	return f
}

// claim records tp as the owner of every field it sets, or names the first
// conflict and claims nothing.
func claim(owners map[string]*networkingv1alpha1.TrafficPolicy, tp *trafficPolicy) string {
	var keys []string
	for _, d := range tp.dests {
		for _, rk := range tp.routes {
			for _, f := range routeFields(&tp.p.Spec.Policy) {
				keys = append(keys, translation.DestinationTarget(d)+"\x00"+rk.key+"\x00"+f)
			}
		}
		for _, f := range destFields(&tp.p.Spec.Policy) {
			keys = append(keys, translation.DestinationTarget(d)+"\x00\x00"+f)
		}
	}
	for _, k := range keys {
		if o, ok := owners[k]; ok && o != tp.p {
			parts := strings.Split(k, "\x00")
			return fmt.Sprintf("conflicts with TrafficPolicy %s/%s: both set %s for Destination %s on the same route", o.Namespace, o.Name, parts[2], parts[0])
		}
	}
	for _, k := range keys {
		owners[k] = tp.p
	}
	return ""
}

// validateTraffic reports every reason p cannot be translated.
func validateTraffic(p *networkingv1alpha1.TrafficPolicy, byRef map[common.ClusterObjectRef]*discoveryv1alpha1.Destination) []string {
	var errs []string
	checkRegex := func(path, expr string) {
		if _, err := regexp.Compile(expr); err != nil {
			errs = append(errs, fmt.Sprintf("%s: regex %q does not compile: %v", path, expr, err))
		}
	}
	checkString := func(path string, m *networkingv1alpha1.StringMatch) {
		n := 0
		for _, s := range []*string{m.Exact, m.Prefix, m.Regex} {
			if s != nil {
				n++
			}
		}
		if n != 1 {
			errs = append(errs, path+": exactly one of exact, prefix or regex must be set")
		}
		if m.Regex != nil {
			checkRegex(path+".regex", *m.Regex)
		}
	}
	for i, m := range p.Spec.HTTPRequestMatchers {
		path := fmt.Sprintf("spec.httpRequestMatchers[%d]", i)
		if m.URI != nil {
			checkString(path+".uri", m.URI)
		}
		for j, h := range m.Headers {
			if h.Regex {
				checkRegex(fmt.Sprintf("%s.headers[%d]", path, j), h.Value)
			}
		}
		for j, q := range m.QueryParameters {
			if q.Regex {
				checkRegex(fmt.Sprintf("%s.queryParameters[%d]", path, j), q.Value)
			}
		}
	}
	pol := p.Spec.Policy
	if ts := pol.TrafficShift; ts != nil {
		sum := int32(0)
		for i, wd := range ts.Destinations {
			sum += wd.Weight
			path := fmt.Sprintf("spec.policy.trafficShift.destinations[%d]", i)
			switch {
			case wd.VirtualDestination != nil:
				errs = append(errs, path+": virtualDestination targets are not supported yet")
			case wd.KubeService == nil:
				errs = append(errs, path+": kubeService is required")
			case byRef[wd.KubeService.ClusterObjectRef] == nil:
				ref := wd.KubeService.ClusterObjectRef
				errs = append(errs, fmt.Sprintf("%s: destination %s.%s in cluster %s not found", path, ref.Name, ref.Namespace, ref.ClusterName))
			}
		}
		if len(ts.Destinations) == 0 {
			errs = append(errs, "spec.policy.trafficShift: no destinations")
		} else if sum != 100 {
			errs = append(errs, fmt.Sprintf("spec.policy.trafficShift: weights sum to %d, want 100", sum))
		}
	}
	if f := pol.FaultInjection; f != nil && (f.FixedDelay == nil) == (f.Abort == nil) {
		errs = append(errs, "spec.policy.faultInjection: exactly one of fixedDelay or abort must be set")
	}
	if c := pol.CORSPolicy; c != nil {
		for i := range c.AllowOrigins {
			checkString(fmt.Sprintf("spec.policy.corsPolicy.allowOrigins[%d]", i), &c.AllowOrigins[i])
		}
	}
	if m := pol.Mirror; m != nil && byRef[m.KubeService] == nil {
		errs = append(errs, fmt.Sprintf("spec.policy.mirror: destination %s.%s in cluster %s not found", m.KubeService.Name, m.KubeService.Namespace, m.KubeService.ClusterName))
	}
	if m := pol.MTLS; m != nil {
		if _, ok := tlsModes[m.TLSMode]; !ok {
			errs = append(errs, fmt.Sprintf("spec.policy.mtls.tlsMode: %q is not one of DISABLE, SIMPLE, ISTIO_MUTUAL", m.TLSMode))
		}
	}
	return errs
}

// unreachableTarget refuses a policy that would route or mirror, in a
// cluster where it configures a selected Destination, to a Destination that
// cluster cannot reach (no VirtualMesh federates it there): the route would
// send requests to a hostname nothing defines.
func unreachableTarget(b *trafficBuilder, tp *trafficPolicy) string {
	type ref struct {
		path string
		d    *discoveryv1alpha1.Destination
	}
	var refs []ref
	pol := tp.p.Spec.Policy
	if ts := pol.TrafficShift; ts != nil {
		for i, wd := range ts.Destinations {
			if wd.KubeService != nil {
				refs = append(refs, ref{fmt.Sprintf("policy.trafficShift.destinations[%d]", i), b.byRef[wd.KubeService.ClusterObjectRef]})
			}
		}
	}
	if m := pol.Mirror; m != nil {
		refs = append(refs, ref{"policy.mirror", b.byRef[m.KubeService]})
	}
	if len(refs) == 0 {
		return ""
	}
	configured := map[string]bool{} // clusters where the policy configures a selected Destination
	for _, d := range tp.dests {
		for _, c := range b.reachableFrom(d) {
			if tp.clusters[c] {
				configured[c] = true
			}
		}
	}
	for _, c := range slices.Sorted(maps.Keys(configured)) {
		for _, r := range refs {
			if r.d != nil && !b.reachable(c, r.d) {
				ks := r.d.Spec.KubeService.Ref
				return fmt.Sprintf("%s: %s/%s in cluster %s cannot be reached from cluster %s, where the policy's sources run: no VirtualMesh federates it there (federate it, or limit sourceSelector to clusters that reach it)",
					r.path, ks.Namespace, ks.Name, ks.ClusterName, c)
			}
		}
	}
	return ""
}

// remoteSubset refuses a shift to a subset of a Destination in another
// cluster than a source: a federated host's endpoints are the east-west
// gateways, which carry no version labels, so such a route would name a
// subset with no endpoints (every request would fail).
func remoteSubset(p *networkingv1alpha1.TrafficPolicy, sources map[string]bool) string {
	ts := p.Spec.Policy.TrafficShift
	if ts == nil {
		return ""
	}
	for i, d := range ts.Destinations {
		if d.KubeService == nil || len(d.KubeService.Subset) == 0 {
			continue
		}
		for _, c := range slices.Sorted(maps.Keys(sources)) {
			if c != d.KubeService.ClusterName {
				return fmt.Sprintf("policy.trafficShift.destinations[%d]: a subset of %s/%s in cluster %s cannot be reached from cluster %s, where the policy's sources run (subsets of federated hosts are not supported: their endpoints are the east-west gateways)",
					i, d.KubeService.Namespace, d.KubeService.Name, d.KubeService.ClusterName, c)
			}
		}
	}
	return ""
}

// sourceClusters are the clusters of the workloads sels selects.
func sourceClusters(in *translation.Input, sels []common.WorkloadSelector) (map[string]bool, []string) {
	out := map[string]bool{}
	var names []string
	for i := range in.Workloads {
		w := &in.Workloads[i]
		if c := w.Spec.Kubernetes.Controller.ClusterName; c != "" && translation.MatchWorkload(sels, w) {
			out[c] = true
			names = append(names, w.Name)
		}
	}
	return out, names
}

type trafficBuilder struct {
	byRef map[common.ClusterObjectRef]*discoveryv1alpha1.Destination
	// plan is VirtualMesh federation's: the hostname suffix of a remote
	// Destination and the DestinationRule federation keeps for it.
	plan *federation.Plan
	// subsets: cluster → target → subset name → labels, referenced by
	// VirtualServices and defined by DestinationRules.
	subsets map[string]map[string]subsetSet
	// reach caches reachableFrom.
	reach map[*discoveryv1alpha1.Destination][]string
}

// subsetSet maps a subset name to its labels.
type subsetSet map[string]map[string]string

// reachable reports whether workloads in cluster can reach d by its
// hostname: d runs there, or a VirtualMesh federates d to a mesh there
// (which defines its federated hostname). A VirtualDestination makes d
// reachable by the VirtualDestination's own hostname, not d's, so it does
// not count here.
func (b *trafficBuilder) reachable(cluster string, d *discoveryv1alpha1.Destination) bool {
	if d.Spec.KubeService.Ref.ClusterName == cluster {
		return true
	}
	_, _, ok := b.plan.RemoteDestinationRule(d, cluster)
	return ok
}

// reachableFrom returns the clusters, sorted, that can reach d by its
// hostname (see reachable).
func (b *trafficBuilder) reachableFrom(d *discoveryv1alpha1.Destination) []string {
	if cs, ok := b.reach[d]; ok {
		return cs
	}
	cs := append([]string{d.Spec.KubeService.Ref.ClusterName}, b.plan.FederatedClusters(d)...)
	slices.Sort(cs)
	cs = slices.Compact(cs)
	b.reach[d] = cs
	return cs
}

// host is d's hostname as seen from cluster.
func (b *trafficBuilder) host(cluster string, d *discoveryv1alpha1.Destination) string {
	if d.Spec.KubeService.Ref.ClusterName == cluster {
		return translation.LocalHostname(d, "")
	}
	return translation.FederatedHostname(d, b.plan.HostnameSuffix(d))
}

// objectName is the name of the VirtualService and DestinationRule of d in cluster.
func objectName(cluster string, d *discoveryv1alpha1.Destination) string {
	r := d.Spec.KubeService.Ref
	if r.ClusterName == cluster {
		return namePrefix + r.Name
	}
	return namePrefix + r.Name + "-" + r.ClusterName
}

type route struct {
	key     string
	order   int // first policy's position, for stable ties
	matcher *networkingv1alpha1.HTTPMatcher
	sources []common.WorkloadSelector
	http    *networkingv1.HTTPRoute
	parents []translation.Parent
}

func (b *trafficBuilder) virtualService(out *translation.Output, r *translation.Report, cluster string, d *discoveryv1alpha1.Destination, applied []*trafficPolicy) {
	byKey := map[string]*route{}
	var routes []*route
	var parents []translation.Parent
	for i, tp := range applied {
		if !tp.clusters[cluster] {
			continue
		}
		parent := translation.Parent{Kind: trafficPolicyKind, Namespace: tp.p.Namespace, Name: tp.p.Name}
		parents = append(parents, parent)
		for _, rk := range tp.routes {
			rt := byKey[rk.key]
			if rt == nil {
				rt = &route{key: rk.key, order: i, matcher: rk.matcher, sources: tp.p.Spec.SourceSelector, http: &networkingv1.HTTPRoute{}}
				byKey[rk.key] = rt
				routes = append(routes, rt)
			}
			rt.parents = append(rt.parents, parent)
			b.decorate(rt.http, cluster, d, &tp.p.Spec.Policy)
		}
	}
	if len(routes) == 0 {
		return
	}
	var http []*networkingv1.HTTPRoute
	catchAll := false
	for _, rt := range sortRoutes(routes) {
		rt.http.Match = matches(cluster, rt.matcher, rt.sources)
		if len(rt.http.Match) == 0 {
			if catchAll {
				continue // shadowed by an earlier catch-all route
			}
			catchAll = true
		}
		if len(rt.http.Route) == 0 {
			rt.http.Route = []*networkingv1.HTTPRouteDestination{{Destination: &networkingv1.Destination{Host: b.host(cluster, d)}}}
		}
		http = append(http, rt.http)
	}
	if !catchAll {
		http = append(http, &networkingv1.HTTPRoute{Route: []*networkingv1.HTTPRouteDestination{{Destination: &networkingv1.Destination{Host: b.host(cluster, d)}}}})
	}
	for i, h := range http {
		h.Name = fmt.Sprintf("route-%d", i)
	}
	spec := &networkingv1.VirtualService{Hosts: []string{b.host(cluster, d)}, Http: http}
	if err := out.Add(cluster, networkingAPIVersion, "VirtualService", d.Spec.KubeService.Ref.Namespace, objectName(cluster, d), spec, parents...); err != nil {
		failed(r, parents, d, err)
	}
}

func failed(r *translation.Report, parents []translation.Parent, d *discoveryv1alpha1.Destination, err error) {
	for _, p := range parents {
		r.FailTarget(translation.ObjectKey(p), translation.DestinationTarget(d), err.Error())
	}
}

// decorate applies one policy's route fields to h (claim ensured that no two
// policies set the same field on one route).
func (b *trafficBuilder) decorate(h *networkingv1.HTTPRoute, cluster string, d *discoveryv1alpha1.Destination, p *networkingv1alpha1.Policy) {
	if ts := p.TrafficShift; ts != nil {
		for _, wd := range ts.Destinations {
			t := b.byRef[wd.KubeService.ClusterObjectRef]
			dst := &networkingv1.Destination{Host: b.host(cluster, t)}
			if len(wd.KubeService.Subset) > 0 {
				dst.Subset = subsetName(wd.KubeService.Subset)
				if t.Spec.KubeService.Ref.ClusterName == cluster {
					b.addSubset(cluster, t, dst.Subset, wd.KubeService.Subset)
				}
			}
			if wd.KubeService.Port != 0 {
				dst.Port = &networkingv1.PortSelector{Number: uint32(wd.KubeService.Port)}
			}
			h.Route = append(h.Route, &networkingv1.HTTPRouteDestination{Destination: dst, Weight: wd.Weight})
		}
	}
	if f := p.FaultInjection; f != nil {
		pct := &networkingv1.Percent{Value: f.Percentage}
		h.Fault = &networkingv1.HTTPFaultInjection{}
		if f.FixedDelay != nil {
			h.Fault.Delay = &networkingv1.HTTPFaultInjection_Delay{Percentage: pct,
				HttpDelayType: &networkingv1.HTTPFaultInjection_Delay_FixedDelay{FixedDelay: duration(f.FixedDelay)}}
		} else if f.Abort != nil {
			h.Fault.Abort = &networkingv1.HTTPFaultInjection_Abort{Percentage: pct,
				ErrorType: &networkingv1.HTTPFaultInjection_Abort_HttpStatus{HttpStatus: f.Abort.HTTPStatus}}
		}
	}
	if p.RequestTimeout != nil {
		h.Timeout = duration(p.RequestTimeout)
	}
	if rt := p.Retries; rt != nil {
		h.Retries = &networkingv1.HTTPRetry{Attempts: rt.Attempts, PerTryTimeout: duration(rt.PerTryTimeout), RetryOn: strings.Join(rt.RetryOn, ",")}
	}
	if c := p.CORSPolicy; c != nil {
		cp := &networkingv1.CorsPolicy{AllowMethods: c.AllowMethods, AllowHeaders: c.AllowHeaders, ExposeHeaders: c.ExposeHeaders, MaxAge: duration(c.MaxAge)}
		for i := range c.AllowOrigins {
			cp.AllowOrigins = append(cp.AllowOrigins, stringMatch(&c.AllowOrigins[i]))
		}
		if c.AllowCredentials != nil {
			cp.AllowCredentials = wrapperspb.Bool(*c.AllowCredentials)
		}
		h.CorsPolicy = cp
	}
	if m := p.Mirror; m != nil {
		t := b.byRef[m.KubeService]
		h.Mirror = &networkingv1.Destination{Host: b.host(cluster, t)}
		if m.Port != 0 {
			h.Mirror.Port = &networkingv1.PortSelector{Number: uint32(m.Port)}
		}
		h.MirrorPercentage = &networkingv1.Percent{Value: m.Percentage}
	}
	if hm := p.HeaderManipulation; hm != nil {
		h.Headers = &networkingv1.Headers{}
		if len(hm.AppendRequestHeaders)+len(hm.RemoveRequestHeaders) > 0 {
			h.Headers.Request = &networkingv1.Headers_HeaderOperations{Add: hm.AppendRequestHeaders, Remove: hm.RemoveRequestHeaders}
		}
		if len(hm.AppendResponseHeaders)+len(hm.RemoveResponseHeaders) > 0 {
			h.Headers.Response = &networkingv1.Headers_HeaderOperations{Add: hm.AppendResponseHeaders, Remove: hm.RemoveResponseHeaders}
		}
	}
}

func (b *trafficBuilder) addSubset(cluster string, t *discoveryv1alpha1.Destination, name string, labels map[string]string) {
	if b.subsets[cluster] == nil {
		b.subsets[cluster] = map[string]subsetSet{}
	}
	tn := translation.DestinationTarget(t)
	if b.subsets[cluster][tn] == nil {
		b.subsets[cluster][tn] = subsetSet{}
	}
	b.subsets[cluster][tn][name] = labels
}

// drClusters are the clusters that need a DestinationRule for d: where a
// route references one of its subsets, or where a policy that sets
// outlierDetection or mtls on it applies.
func (b *trafficBuilder) drClusters(d *discoveryv1alpha1.Destination, accepted []*trafficPolicy) []string {
	var setting []*trafficPolicy
	for _, tp := range accepted {
		if len(destFields(&tp.p.Spec.Policy)) > 0 && tp.selects[d] {
			setting = append(setting, tp)
		}
	}
	target := translation.DestinationTarget(d)
	var out []string
	for _, c := range b.reachableFrom(d) {
		need := len(b.subsets[c][target]) > 0
		for _, tp := range setting {
			need = need || tp.clusters[c]
		}
		if need {
			out = append(out, c)
		}
	}
	return out
}

func (b *trafficBuilder) destinationRule(out *translation.Output, r *translation.Report, cluster string, d *discoveryv1alpha1.Destination, accepted []*trafficPolicy) {
	spec := &networkingv1.DestinationRule{Host: b.host(cluster, d)}
	var parents []translation.Parent
	for _, tp := range accepted {
		if !tp.selects[d] && !shiftsTo(tp, d) {
			continue
		}
		if !tp.clusters[cluster] {
			continue
		}
		parents = append(parents, translation.Parent{Kind: trafficPolicyKind, Namespace: tp.p.Namespace, Name: tp.p.Name})
		if !tp.selects[d] {
			continue
		}
		pol := tp.p.Spec.Policy
		if o := pol.OutlierDetection; o != nil {
			spec.TrafficPolicy = cmp.Or(spec.TrafficPolicy, &networkingv1.TrafficPolicy{})
			spec.TrafficPolicy.OutlierDetection = &networkingv1.OutlierDetection{
				Consecutive_5XxErrors: wrapperspb.UInt32(uint32(cmp.Or(o.ConsecutiveErrors, 5))),
				Interval:              durationpb.New(cmp.Or(durationOf(o.Interval), 10e9)),
				BaseEjectionTime:      durationpb.New(cmp.Or(durationOf(o.BaseEjectionTime), 30e9)),
				MaxEjectionPercent:    100,
			}
			if o.MaxEjectionPercent != nil {
				spec.TrafficPolicy.OutlierDetection.MaxEjectionPercent = *o.MaxEjectionPercent
			}
		}
		if m := pol.MTLS; m != nil {
			spec.TrafficPolicy = cmp.Or(spec.TrafficPolicy, &networkingv1.TrafficPolicy{})
			spec.TrafficPolicy.Tls = &networkingv1.ClientTLSSettings{Mode: tlsModes[m.TLSMode]}
		}
	}
	subsets := b.subsets[cluster][translation.DestinationTarget(d)]
	for _, name := range slices.Sorted(maps.Keys(subsets)) {
		spec.Subsets = append(spec.Subsets, &networkingv1.Subset{Name: name, Labels: subsets[name]})
	}
	// In another cluster the host is federated: federation's DestinationRule
	// (ISTIO_MUTUAL with the SNI the east-west gateway routes on) is the one
	// Istio must read, so the subsets and settings go into that object.
	ns, name := d.Spec.KubeService.Ref.Namespace, objectName(cluster, d)
	if fns, fname, ok := b.plan.RemoteDestinationRule(d, cluster); ok && cluster != d.Spec.KubeService.Ref.ClusterName {
		ns, name = fns, fname
	}
	if err := out.Add(cluster, networkingAPIVersion, "DestinationRule", ns, name, spec, parents...); err != nil {
		failed(r, parents, d, err)
	}
}

func shiftsTo(tp *trafficPolicy, d *discoveryv1alpha1.Destination) bool {
	if ts := tp.p.Spec.Policy.TrafficShift; ts != nil {
		for _, wd := range ts.Destinations {
			if wd.KubeService != nil && wd.KubeService.ClusterObjectRef == d.Spec.KubeService.Ref && len(wd.KubeService.Subset) > 0 {
				return true
			}
		}
	}
	return false
}

// matches builds a route's match list: the request matcher combined with
// every (selector, namespace) of the source selector that applies in cluster.
func matches(cluster string, m *networkingv1alpha1.HTTPMatcher, sources []common.WorkloadSelector) []*networkingv1.HTTPMatchRequest {
	type src struct {
		labels map[string]string
		ns     string
	}
	var srcs []src
	for _, s := range sources {
		if len(s.Clusters) > 0 && !slices.Contains(s.Clusters, cluster) {
			continue
		}
		if len(s.Namespaces) == 0 {
			srcs = append(srcs, src{labels: s.Labels})
		}
		for _, ns := range s.Namespaces {
			srcs = append(srcs, src{labels: s.Labels, ns: ns})
		}
	}
	if len(srcs) == 0 {
		srcs = []src{{}}
	}
	var out []*networkingv1.HTTPMatchRequest
	for _, s := range srcs {
		mr := requestMatch(m)
		mr.SourceLabels = s.labels
		mr.SourceNamespace = s.ns
		if mr.Uri == nil && mr.Method == nil && len(mr.Headers)+len(mr.WithoutHeaders)+len(mr.QueryParams)+len(mr.SourceLabels) == 0 && mr.SourceNamespace == "" {
			return nil // matches every request
		}
		out = append(out, mr)
	}
	return out
}

func requestMatch(m *networkingv1alpha1.HTTPMatcher) *networkingv1.HTTPMatchRequest {
	mr := &networkingv1.HTTPMatchRequest{}
	if m == nil {
		return mr
	}
	if m.URI != nil {
		mr.Uri = stringMatch(m.URI)
	}
	if m.Method != "" {
		mr.Method = &networkingv1.StringMatch{MatchType: &networkingv1.StringMatch_Exact{Exact: m.Method}}
	}
	for _, h := range m.Headers {
		sm := valueMatch(h.Value, h.Regex)
		if h.InvertMatch {
			if mr.WithoutHeaders == nil {
				mr.WithoutHeaders = map[string]*networkingv1.StringMatch{}
			}
			mr.WithoutHeaders[strings.ToLower(h.Name)] = sm
		} else {
			if mr.Headers == nil {
				mr.Headers = map[string]*networkingv1.StringMatch{}
			}
			mr.Headers[strings.ToLower(h.Name)] = sm
		}
	}
	for _, q := range m.QueryParameters {
		if mr.QueryParams == nil {
			mr.QueryParams = map[string]*networkingv1.StringMatch{}
		}
		mr.QueryParams[q.Name] = valueMatch(q.Value, q.Regex)
	}
	return mr
}

// valueMatch matches a header or query value; an empty value matches any.
func valueMatch(v string, regex bool) *networkingv1.StringMatch {
	if regex {
		return &networkingv1.StringMatch{MatchType: &networkingv1.StringMatch_Regex{Regex: v}}
	}
	if v == "" {
		return &networkingv1.StringMatch{MatchType: &networkingv1.StringMatch_Regex{Regex: ".*"}}
	}
	return &networkingv1.StringMatch{MatchType: &networkingv1.StringMatch_Exact{Exact: v}}
}

func stringMatch(m *networkingv1alpha1.StringMatch) *networkingv1.StringMatch {
	switch {
	case m.Exact != nil:
		return &networkingv1.StringMatch{MatchType: &networkingv1.StringMatch_Exact{Exact: *m.Exact}}
	case m.Prefix != nil:
		return &networkingv1.StringMatch{MatchType: &networkingv1.StringMatch_Prefix{Prefix: *m.Prefix}}
	case m.Regex != nil:
		return &networkingv1.StringMatch{MatchType: &networkingv1.StringMatch_Regex{Regex: *m.Regex}}
	}
	return nil
}

// sortRoutes orders routes most specific first; catch-all routes last.
func sortRoutes(routes []*route) []*route {
	out := slices.Clone(routes)
	slices.SortStableFunc(out, func(a, b *route) int {
		return cmp.Or(-cmp.Compare(specificity(a), specificity(b)), cmp.Compare(a.order, b.order), cmp.Compare(a.key, b.key))
	})
	return out
}

// specificity ranks a route: URI kind, prefix length, headers, query
// parameters, method, source labels and namespaces, packed in one number.
func specificity(rt *route) int {
	uri, plen, headers, query, method := 0, 0, 0, 0, 0
	if m := rt.matcher; m != nil {
		if m.URI != nil {
			switch {
			case m.URI.Exact != nil:
				uri = 3
			case m.URI.Regex != nil:
				uri = 2
			case m.URI.Prefix != nil:
				uri, plen = 1, min(len(*m.URI.Prefix), 1023)
			}
		}
		headers, query = min(len(m.Headers), 63), min(len(m.QueryParameters), 63)
		if m.Method != "" {
			method = 1
		}
	}
	src := 0
	for _, s := range rt.sources {
		src = max(src, min(len(s.Labels)+len(s.Namespaces), 63))
	}
	return ((((uri*1024+plen)*64+headers)*64+query)*2+method)*64 + src
}

func duration(d *metav1.Duration) *durationpb.Duration {
	if d == nil {
		return nil
	}
	return durationpb.New(d.Duration)
}

func durationOf(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}

// subsetName names a subset by its sorted labels: version-v2, with every
// character Istio does not allow in a name replaced by '-'.
func subsetName(labels map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k, labels[k])
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r - 'A' + 'a'
		}
		return '-'
	}, strings.Join(parts, "-"))
}

func trafficKey(p *networkingv1alpha1.TrafficPolicy) translation.ObjectKey {
	return translation.ObjectKey{Kind: trafficPolicyKind, Namespace: p.Namespace, Name: p.Name}
}
