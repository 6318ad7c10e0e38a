package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Gateway API kinds the traffic translator writes for ambient Destinations
// (docs/design/2026-12-02-ambient-translation.md, "TrafficPolicy").
const (
	gatewayAPIVersion = "gateway.networking.k8s.io/v1"
	kindHTTPRoute     = "HTTPRoute"
	kindGRPCRoute     = "GRPCRoute"
)

// Bounds of Gateway API v1.6's standard CRDs that a translation can reach.
const (
	maxRouteRules      = 16 // spec.rules
	maxHeaderModifiers = 16 // add and remove of a header modifier filter
	maxDurationUnit    = 99999
)

// gatewayMethods are the HTTP methods an HTTPRouteMatch (and a CORS
// filter) may name.
var gatewayMethods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}

// gatewayRoutes says whether d's routing is written as Gateway API routes:
// its workloads run in ambient mode, or in both modes during a migration,
// or its Service opts in (relaymesh.io/route-api=gateway-api). Sidecars
// read an HTTPRoute with a Service parentRef too, and Istio does not
// support a VirtualService and an HTTPRoute for one host, so a mixed
// Destination gets only the route.
func gatewayRoutes(d *discoveryv1alpha1.Destination) bool {
	_, ambient := destinationModes(d)
	return ambient || d.Spec.KubeService.Labels[discoveryv1alpha1.LabelRouteAPI] == discoveryv1alpha1.RouteAPIGatewayAPI
}

// RoutingAPI says in which API d's TrafficPolicies are written in its own
// cluster, and why: "Gateway API (ambient data plane)", "Gateway API
// (relaymesh.io/route-api=gateway-api)"
// or "Istio (VirtualService)".
func RoutingAPI(d *discoveryv1alpha1.Destination) string {
	switch {
	case ambientOnly(d):
		return "Gateway API (" + d.Spec.KubeService.DataPlaneMode + " data plane)"
	case gatewayRoutes(d):
		return "Gateway API (" + discoveryv1alpha1.LabelRouteAPI + "=" + discoveryv1alpha1.RouteAPIGatewayAPI + ")"
	}
	return "Istio (VirtualService)"
}

// ambientOnly says whether d's workloads run in ambient mode (or both): a
// Destination no sidecar-era object may route, in any cluster.
func ambientOnly(d *discoveryv1alpha1.Destination) bool {
	_, ambient := destinationModes(d)
	return ambient
}

// routeContext starts every message about d's Gateway API routes: why d
// gets them.
func routeContext(d *discoveryv1alpha1.Destination) string {
	switch {
	case d.Spec.KubeService.DataPlaneMode == discoveryv1alpha1.DataPlaneMixed:
		return "mixed Destination, sidecar and ambient (Gateway API route): "
	case ambientOnly(d):
		return "ambient Destination (Gateway API route): "
	}
	return "Gateway API route (" + discoveryv1alpha1.LabelRouteAPI + "=" + discoveryv1alpha1.RouteAPIGatewayAPI + " on the Service): "
}

// routeAPINote is a warning for d's target status when its Service's
// relaymesh.io/route-api label is not honoured as written; "" otherwise.
func routeAPINote(d *discoveryv1alpha1.Destination) string {
	v, ok := d.Spec.KubeService.Labels[discoveryv1alpha1.LabelRouteAPI]
	switch {
	case !ok || v == discoveryv1alpha1.RouteAPIGatewayAPI:
		return ""
	case v != discoveryv1alpha1.RouteAPIIstio:
		written := "an Istio VirtualService is written"
		if ambientOnly(d) {
			written = "Gateway API routes are written (the workloads run in ambient mode)"
		}
		return fmt.Sprintf("label %s=%q on the Service is neither %q nor %q and is ignored: %s", discoveryv1alpha1.LabelRouteAPI, v,
			discoveryv1alpha1.RouteAPIGatewayAPI, discoveryv1alpha1.RouteAPIIstio, written)
	case ambientOnly(d):
		return fmt.Sprintf("label %s=%s on the Service is ignored: its workloads run in ambient mode (or both modes), where Istio supports routing only by Gateway API routes", discoveryv1alpha1.LabelRouteAPI, v)
	}
	return ""
}

// The parts of gateway.networking.k8s.io/v1 HTTPRoute and GRPCRoute that
// the translator writes (field names and shapes as the CRDs define them).
type (
	gwParentRef struct {
		Group string `json:"group"` // "" is core; the default would be gateway.networking.k8s.io
		Kind  string `json:"kind"`
		Name  string `json:"name"`
		Port  int32  `json:"port,omitempty"`
	}
	gwBackendRef struct {
		Name   string `json:"name"`
		Port   int32  `json:"port"`
		Weight *int32 `json:"weight,omitempty"`
	}
	gwMatch struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	}
	gwNamedMatch struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	gwHTTPMatch struct {
		Path        *gwMatch       `json:"path,omitempty"`
		Method      string         `json:"method,omitempty"`
		Headers     []gwNamedMatch `json:"headers,omitempty"`
		QueryParams []gwNamedMatch `json:"queryParams,omitempty"`
	}
	gwGRPCMethod struct {
		Type    string `json:"type"`
		Service string `json:"service,omitempty"`
		Method  string `json:"method,omitempty"`
	}
	gwGRPCMatch struct {
		Method  *gwGRPCMethod  `json:"method,omitempty"`
		Headers []gwNamedMatch `json:"headers,omitempty"`
	}
	gwHeader struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	gwHeaderModifier struct {
		Add    []gwHeader `json:"add,omitempty"`
		Remove []string   `json:"remove,omitempty"`
	}
	gwFraction struct {
		Numerator   int32 `json:"numerator"`
		Denominator int32 `json:"denominator"`
	}
	gwMirror struct {
		BackendRef gwBackendRef `json:"backendRef"`
		Percent    *int32       `json:"percent,omitempty"`
		Fraction   *gwFraction  `json:"fraction,omitempty"`
	}
	gwCORS struct {
		AllowOrigins     []string `json:"allowOrigins,omitempty"`
		AllowMethods     []string `json:"allowMethods,omitempty"`
		AllowHeaders     []string `json:"allowHeaders,omitempty"`
		ExposeHeaders    []string `json:"exposeHeaders,omitempty"`
		MaxAge           int32    `json:"maxAge,omitempty"`
		AllowCredentials *bool    `json:"allowCredentials,omitempty"`
	}
	gwFilter struct {
		Type                   string            `json:"type"`
		RequestHeaderModifier  *gwHeaderModifier `json:"requestHeaderModifier,omitempty"`
		ResponseHeaderModifier *gwHeaderModifier `json:"responseHeaderModifier,omitempty"`
		RequestMirror          *gwMirror         `json:"requestMirror,omitempty"`
		CORS                   *gwCORS           `json:"cors,omitempty"`
	}
	gwTimeouts struct {
		Request string `json:"request"`
	}
	gwHTTPRule struct {
		Matches     []gwHTTPMatch  `json:"matches,omitempty"`
		Filters     []gwFilter     `json:"filters,omitempty"`
		BackendRefs []gwBackendRef `json:"backendRefs"`
		Timeouts    *gwTimeouts    `json:"timeouts,omitempty"`
	}
	gwGRPCRule struct {
		Matches     []gwGRPCMatch  `json:"matches,omitempty"`
		Filters     []gwFilter     `json:"filters,omitempty"`
		BackendRefs []gwBackendRef `json:"backendRefs"`
	}
	gwHTTPRouteSpec struct {
		ParentRefs []gwParentRef `json:"parentRefs"`
		Rules      []gwHTTPRule  `json:"rules"`
	}
	gwGRPCRouteSpec struct {
		ParentRefs []gwParentRef `json:"parentRefs"`
		Rules      []gwGRPCRule  `json:"rules"`
	}
)

// routePort is one Service port an ambient Destination's routes are
// written for, and whether it carries gRPC.
type routePort struct {
	port discoveryv1alpha1.ServicePort
	grpc bool
}

// routePorts are the Service ports of an ambient Destination that get a
// route, one each: those Istio treats as HTTP or gRPC, or whose protocol
// it detects (Istio's protocol selection: appProtocol, else the port
// name's prefix). A port it treats as another protocol (tcp, tls, mongo…)
// carries no HTTP and gets none. A Service with no such port has a
// problem.
func routePorts(d *discoveryv1alpha1.Destination) ([]routePort, string) {
	var out []routePort
	var skipped []string
	for _, p := range d.Spec.KubeService.Ports {
		proto := strings.ToLower(p.AppProtocol)
		if proto == "" {
			proto, _, _ = strings.Cut(strings.ToLower(p.Name), "-")
		}
		switch {
		case p.Protocol == "UDP" || p.Protocol == "SCTP":
			skipped = append(skipped, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		case proto == "grpc":
			out = append(out, routePort{p, true})
		case slices.Contains(knownNonHTTP, proto):
			skipped = append(skipped, fmt.Sprintf("%d (%s)", p.Port, proto))
		default: // http, http2, h2c, or detected by Istio
			out = append(out, routePort{p, false})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Sprintf("the Service has no HTTP or gRPC port (ports %s): a Gateway API route has nothing to route", strings.Join(skipped, ", "))
	}
	return out, ""
}

// knownNonHTTP are the protocols Istio selects by port name or appProtocol
// that carry no HTTP.
var knownNonHTTP = []string{"tcp", "tls", "https", "mongo", "mysql", "redis"}

// routeName is the name of d's route for port: relaymesh-<svc> when the
// Service has one port, else relaymesh-<svc>.<port> (a Service name is a
// DNS label, so the dot keeps it from any other Service's route name).
func routeName(d *discoveryv1alpha1.Destination, port int32) string {
	ks := d.Spec.KubeService
	if len(ks.Ports) == 1 {
		return namePrefix + ks.Ref.Name
	}
	return fmt.Sprintf("%s%s.%d", namePrefix, ks.Ref.Name, port)
}

// targetPort is the port a backendRef to t uses from the route of port
// from: the one the policy names, else t's only port, else t's port of
// from's number.
func targetPort(t *discoveryv1alpha1.Destination, named, from int32) (int32, string) {
	if named != 0 {
		return named, ""
	}
	ps := t.Spec.KubeService.Ports
	if len(ps) == 1 {
		return ps[0].Port, ""
	}
	if slices.ContainsFunc(ps, func(p discoveryv1alpha1.ServicePort) bool { return p.Port == from }) {
		return from, ""
	}
	return 0, fmt.Sprintf("names no port and Service %s/%s has %d ports, none of them %d (a Gateway API backendRef to a Service needs one)", t.Spec.KubeService.Ref.Namespace, t.Spec.KubeService.Ref.Name, len(ps), from)
}

// ambientProblems lists why tp cannot be written as a Gateway API route
// for d (ambient, mixed, or a sidecar Destination opted in), each naming
// the field; nil: it can. A sidecar Destination keeps its DestinationRule
// (outlierDetection, mtls), and its sidecars route without a waypoint.
func (b *trafficBuilder) ambientProblems(in *translation.Input, tp *trafficPolicy, d *discoveryv1alpha1.Destination) []string {
	var errs []string
	lead, ambient := routeContext(d), ambientOnly(d)
	prefix := func(format string, args ...any) {
		errs = append(errs, lead+fmt.Sprintf(format, args...))
	}
	if _, _, why := translation.ServingWaypoint(in, d); ambient && why != "" {
		prefix(NeedsWaypoint+": routes of ambient workloads are enforced by the waypoint of their Service, and %s; no route is written for this Destination", why)
	}
	ports, problem := routePorts(d)
	if problem != "" {
		prefix("%s", problem)
	}
	// Which route kinds d gets: a field must be sayable in each.
	var grpc, http bool
	for _, rp := range ports {
		grpc, http = grpc || rp.grpc, http || !rp.grpc
	}
	p := &tp.p.Spec.Policy
	switch {
	case len(tp.p.Spec.SourceSelector) > 0 && !wholeClusters(tp.p.Spec.SourceSelector):
		prefix("spec.sourceSelector: a route with a Service parentRef applies to every client of the Service in its cluster; only a selector of whole clusters (clusters, without labels or namespaces) can be expressed")
	case ambient && !routedHere(tp, d):
		prefix("spec.sourceSelector: selects no client in cluster %s, where the route is written; routes for clients in other clusters of an ambient Destination are not built", d.Spec.KubeService.Ref.ClusterName)
	}
	if p.Retries != nil {
		prefix("policy.retries: Gateway API's standard channel (v1.6) has no retry field (HTTPRoute retry is experimental, GEP-1731)")
	}
	if p.FaultInjection != nil {
		prefix("policy.faultInjection: Gateway API has no fault injection")
	}
	if p.OutlierDetection != nil && ambient {
		prefix("policy.outlierDetection: Gateway API has no outlier detection, and Relaymesh writes no DestinationRule for an ambient host")
	}
	if p.MTLS != nil && ambient {
		prefix("policy.mtls: ambient traffic between workloads is always mutual TLS (HBONE); a route cannot set a TLS mode")
	}
	if p.RequestTimeout != nil {
		if grpc {
			prefix("policy.requestTimeout: GRPCRoute has no timeouts in Gateway API's standard channel (v1.6)")
		}
		if _, err := gatewayDuration(p.RequestTimeout.Duration); http && err != "" {
			prefix("policy.requestTimeout: %s", err)
		}
	}
	if c := p.CORSPolicy; c != nil {
		if grpc {
			prefix("policy.corsPolicy: GRPCRoute has no CORS filter")
		}
		for i, o := range c.AllowOrigins {
			if o.Exact == nil {
				prefix("policy.corsPolicy.allowOrigins[%d]: a Gateway API CORS filter matches origins exactly (or by '*' wildcards), not by prefix or regex", i)
			}
		}
		for i, m := range c.AllowMethods {
			if !slices.Contains(gatewayMethods, m) && m != "*" {
				prefix("policy.corsPolicy.allowMethods[%d]: %q is not a method a Gateway API CORS filter may name", i, m)
			}
		}
		if c.MaxAge != nil && (c.MaxAge.Duration%time.Second != 0 || c.MaxAge.Duration < time.Second || c.MaxAge.Duration > math.MaxInt32*time.Second) {
			prefix("policy.corsPolicy.maxAge: %s is not a whole number of seconds of at least 1", c.MaxAge.Duration)
		}
	}
	if hm := p.HeaderManipulation; hm != nil {
		for _, f := range []struct {
			name string
			n    int
		}{
			{"appendRequestHeaders", len(hm.AppendRequestHeaders)}, {"removeRequestHeaders", len(hm.RemoveRequestHeaders)},
			{"appendResponseHeaders", len(hm.AppendResponseHeaders)}, {"removeResponseHeaders", len(hm.RemoveResponseHeaders)},
		} {
			if f.n > maxHeaderModifiers {
				prefix("policy.headerManipulation.%s: %d headers, a Gateway API header modifier holds at most %d", f.name, f.n, maxHeaderModifiers)
			}
		}
	}
	errs = append(errs, b.ambientTargetProblems(tp, d, ports)...)
	for i, m := range tp.p.Spec.HTTPRequestMatchers {
		var es []string
		if http {
			es = matcherProblems(&m, false)
		}
		if grpc {
			es = append(es, matcherProblems(&m, true)...)
		}
		for _, e := range uniqueStrings(es) {
			prefix("spec.httpRequestMatchers[%d]%s", i, e)
		}
	}
	return errs
}

// wholeClusters says whether every selector of sels picks whole clusters:
// clusters and nothing else. A route written in d's cluster serves every
// client there, so such a policy applies there exactly when it names d's
// cluster (gatewayRoute).
func wholeClusters(sels []common.WorkloadSelector) bool {
	for _, s := range sels {
		if len(s.Clusters) == 0 || len(s.Labels)+len(s.Namespaces) > 0 {
			return false
		}
	}
	return true
}

// routedHere says whether tp's route in d's own cluster carries it: it
// names no sources, or its sources run there.
func routedHere(tp *trafficPolicy, d *discoveryv1alpha1.Destination) bool {
	return len(tp.p.Spec.SourceSelector) == 0 || tp.clusters[d.Spec.KubeService.Ref.ClusterName]
}

// uniqueStrings is ss without repeats, in first-seen order.
func uniqueStrings(ss []string) []string {
	var out []string
	for _, s := range ss {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// ambientTargetProblems checks the Services a route of d sends or mirrors
// to: same cluster and namespace (a backendRef to another namespace needs
// a ReferenceGrant, which Relaymesh does not write), no subset, a port.
func (b *trafficBuilder) ambientTargetProblems(tp *trafficPolicy, d *discoveryv1alpha1.Destination, ports []routePort) []string {
	var errs []string
	self, lead := d.Spec.KubeService.Ref, routeContext(d)
	check := func(path string, t *discoveryv1alpha1.Destination, port int32) {
		if t == nil {
			return // validateTraffic reported it
		}
		ref := t.Spec.KubeService.Ref
		switch {
		case ref.ClusterName != self.ClusterName:
			errs = append(errs, lead+fmt.Sprintf("%s: Service %s/%s is in cluster %s; a route's backends are Services of its own cluster", path, ref.Namespace, ref.Name, ref.ClusterName))
		case ref.Namespace != self.Namespace:
			errs = append(errs, lead+fmt.Sprintf("%s: Service %s/%s is in another namespace than %s/%s; that needs a ReferenceGrant, which Relaymesh does not write", path, ref.Namespace, ref.Name, self.Namespace, self.Name))
		}
		for _, rp := range ports {
			if _, why := targetPort(t, port, rp.port.Port); why != "" {
				errs = append(errs, lead+fmt.Sprintf("%s %s", path, why))
				break
			}
		}
	}
	p := &tp.p.Spec.Policy
	if ts := p.TrafficShift; ts != nil {
		for i, wd := range ts.Destinations {
			if wd.KubeService == nil {
				continue
			}
			path := fmt.Sprintf("policy.trafficShift.destinations[%d]", i)
			if len(wd.KubeService.Subset) > 0 {
				errs = append(errs, lead+fmt.Sprintf("%s.subset: Gateway API routes to Services, not subsets; make one Service per version (say %s-%s) and name it in kubeService", path, wd.KubeService.Name, strings.Join(sortedValues(wd.KubeService.Subset), "-")))
			}
			check(path, b.byRef[wd.KubeService.ClusterObjectRef], wd.KubeService.Port)
		}
	}
	if m := p.Mirror; m != nil {
		check("policy.mirror", b.byRef[m.KubeService], m.Port)
	}
	return errs
}

// sidecarIntoAmbient lists why tp cannot be written as the VirtualService
// of the sidecar Destination d: a subset of an ambient Destination is
// defined nowhere (no DestinationRule is written for an ambient host).
func (b *trafficBuilder) sidecarIntoAmbient(tp *trafficPolicy) []string {
	var errs []string
	if ts := tp.p.Spec.Policy.TrafficShift; ts != nil {
		for i, wd := range ts.Destinations {
			if wd.KubeService == nil || len(wd.KubeService.Subset) == 0 {
				continue
			}
			if t := b.byRef[wd.KubeService.ClusterObjectRef]; t != nil && ambientOnly(t) {
				errs = append(errs, fmt.Sprintf("policy.trafficShift.destinations[%d].subset: %s/%s runs in ambient mode, where Relaymesh defines no subsets (no DestinationRule for an ambient host); make one Service per version and name it in kubeService",
					i, wd.KubeService.Namespace, wd.KubeService.Name))
			}
		}
	}
	return errs
}

// matcherProblems lists what of m a Gateway API route match cannot say.
func matcherProblems(m *networkingv1alpha1.HTTPMatcher, grpc bool) []string {
	var errs []string
	for j, h := range m.Headers {
		if h.InvertMatch {
			errs = append(errs, fmt.Sprintf(".headers[%d].invertMatch: Gateway API header matches cannot be inverted", j))
		}
		if msgs := validation.IsHTTPHeaderName(h.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Sprintf(".headers[%d].name: %s", j, msgs[0]))
		}
	}
	if grpc {
		if len(m.QueryParameters) > 0 {
			errs = append(errs, ".queryParameters: a GRPCRoute has no query parameter matches")
		}
		if m.Method != "" {
			errs = append(errs, ".method: a GRPCRoute matches gRPC methods by uri, not HTTP methods")
		}
		if m.URI != nil {
			if _, ok := grpcMethod(m.URI); !ok {
				errs = append(errs, ".uri: a GRPCRoute matches exactly /<service>/<method> or a prefix /<service>/, not a regex or another path")
			}
		}
		return errs
	}
	if m.Method != "" && !slices.Contains(gatewayMethods, m.Method) {
		errs = append(errs, fmt.Sprintf(".method: %q is not a method an HTTPRoute may match", m.Method))
	}
	if u := m.URI; u != nil && (u.Exact != nil && !strings.HasPrefix(*u.Exact, "/") || u.Exact != nil && strings.Contains(*u.Exact, "//")) {
		errs = append(errs, ".uri.exact: an HTTPRoute path starts with '/' and holds no '//'")
	}
	for j, q := range m.QueryParameters {
		if q.Name == "" {
			errs = append(errs, fmt.Sprintf(".queryParameters[%d].name: required", j))
		}
	}
	return errs
}

// grpcMethod turns a uri match into a GRPCRoute method match: exact
// /<service>/<method>, or prefix /<service>/ (every method of a service).
func grpcMethod(u *networkingv1alpha1.StringMatch) (*gwGRPCMethod, bool) {
	switch {
	case u.Exact != nil:
		svc, method, ok := strings.Cut(strings.TrimPrefix(*u.Exact, "/"), "/")
		if !strings.HasPrefix(*u.Exact, "/") || !ok || svc == "" || method == "" || strings.Contains(method, "/") {
			return nil, false
		}
		return &gwGRPCMethod{Type: "Exact", Service: svc, Method: method}, true
	case u.Prefix != nil:
		svc, ok := strings.CutSuffix(strings.TrimPrefix(*u.Prefix, "/"), "/")
		if !strings.HasPrefix(*u.Prefix, "/") || !ok || svc == "" || strings.Contains(svc, "/") {
			return nil, false
		}
		return &gwGRPCMethod{Type: "Exact", Service: svc}, true
	}
	return nil, false
}

// gatewayDuration renders d in Gateway API's duration format
// (^([0-9]{1,5}(h|m|s|ms)){1,4}$), or says why it cannot.
func gatewayDuration(d time.Duration) (string, string) {
	switch {
	case d < 0:
		return "", fmt.Sprintf("%s is negative", d)
	case d%time.Millisecond != 0:
		return "", fmt.Sprintf("%s is not a whole number of milliseconds (Gateway API durations have millisecond precision)", d)
	}
	h, rest := d/time.Hour, d%time.Hour
	m, rest := rest/time.Minute, rest%time.Minute
	s, ms := rest/time.Second, (rest%time.Second)/time.Millisecond
	if h > maxDurationUnit {
		return "", fmt.Sprintf("%s is longer than %d hours", d, maxDurationUnit)
	}
	var out strings.Builder
	for _, u := range []struct {
		n    time.Duration
		unit string
	}{{h, "h"}, {m, "m"}, {s, "s"}, {ms, "ms"}} {
		if u.n > 0 {
			fmt.Fprintf(&out, "%d%s", u.n, u.unit)
		}
	}
	if out.Len() == 0 {
		return "0s", ""
	}
	return out.String(), ""
}

// ambientRule is one route of an ambient Destination, built from the
// policies that share its matcher.
type ambientRule struct {
	backends []gwBackendRef
	filters  []gwFilter
	timeout  string
}

// gatewayRoute writes d's HTTPRoute (or GRPCRoute): one rule per route of
// the applied policies, most specific first as in the VirtualService, and
// a last rule without matches sending the rest to d.
func (b *trafficBuilder) gatewayRoute(out *translation.Output, r *translation.Report, d *discoveryv1alpha1.Destination, applied []*trafficPolicy) {
	// A policy for the clients of other clusters only is not routed here.
	applied = slices.DeleteFunc(slices.Clone(applied), func(tp *trafficPolicy) bool { return !routedHere(tp, d) })
	ports, problem := routePorts(d)
	if problem != "" || len(applied) == 0 {
		return // reported by ambientProblems; no policy applies
	}
	// One route per port (a route's parentRef names one port, and its
	// kind follows the port's protocol); the same rules in each.
	for _, rp := range ports {
		if !b.gatewayRouteFor(out, r, d, applied, rp) {
			return
		}
	}
}

// gatewayRouteFor writes d's route for one port; false when it failed the
// policies (the same failure would repeat for every port).
func (b *trafficBuilder) gatewayRouteFor(out *translation.Output, r *translation.Report, d *discoveryv1alpha1.Destination, applied []*trafficPolicy, rp routePort) bool {
	port, grpc := rp.port, rp.grpc
	ks := d.Spec.KubeService
	byKey := map[string]*route{}
	rules := map[*route]*ambientRule{}
	owners := map[*route]map[string]translation.Parent{} // field → the policy that set it
	var routes []*route
	var parents []translation.Parent
	for i, tp := range applied {
		parent := translation.Parent{Kind: trafficPolicyKind, Namespace: tp.p.Namespace, Name: tp.p.Name}
		// A route serves every client of its cluster, so policies whose
		// sources differ only by whole clusters share a rule when their
		// request matchers are equal (claim kept them apart): two setting
		// one field there conflict, and the later fails here.
		if conflict := claimRule(byKey, owners, tp, parent); conflict != "" {
			failed(r, []translation.Parent{parent}, d, fmt.Errorf("%s%s", routeContext(d), conflict))
			continue
		}
		parents = append(parents, parent)
		for _, rk := range tp.routes {
			key := matcherKey(rk)
			rt := byKey[key]
			if rt == nil {
				rt = &route{key: key, order: i, matcher: rk.matcher}
				byKey[key] = rt
				rules[rt] = &ambientRule{}
				owners[rt] = map[string]translation.Parent{}
				routes = append(routes, rt)
			}
			for _, f := range routeFields(&tp.p.Spec.Policy) {
				owners[rt][f] = parent
			}
			rt.parents = append(rt.parents, parent)
			b.decorateAmbient(rules[rt], &tp.p.Spec.Policy, port.Port)
		}
	}
	if len(parents) == 0 {
		return true
	}
	self := []gwBackendRef{{Name: ks.Ref.Name, Port: port.Port}}
	var ordered []*route
	catchAll := false
	for _, rt := range sortRoutes(routes) {
		if rt.matcher == nil || isEmptyMatcher(rt.matcher) {
			if catchAll {
				continue
			}
			catchAll = true
		}
		ordered = append(ordered, rt)
	}
	n := len(ordered)
	if !catchAll {
		n++
	}
	if n > maxRouteRules {
		failed(r, parents, d, fmt.Errorf(routeContext(d)+"the policies make %d routes for this Service, and a Gateway API route holds at most %d rules", n, maxRouteRules))
		return false
	}
	parentRefs := []gwParentRef{{Group: "", Kind: "Service", Name: ks.Ref.Name, Port: port.Port}}
	var (
		kind string
		spec any
	)
	if grpc {
		s := gwGRPCRouteSpec{ParentRefs: parentRefs}
		for _, rt := range ordered {
			ar := rules[rt]
			rule := gwGRPCRule{Filters: ar.filters, BackendRefs: cmpBackends(ar.backends, self)}
			if m := grpcMatch(rt.matcher); m != nil {
				rule.Matches = []gwGRPCMatch{*m}
			}
			s.Rules = append(s.Rules, rule)
		}
		if !catchAll {
			s.Rules = append(s.Rules, gwGRPCRule{BackendRefs: self})
		}
		kind, spec = kindGRPCRoute, s
	} else {
		s := gwHTTPRouteSpec{ParentRefs: parentRefs}
		for _, rt := range ordered {
			ar := rules[rt]
			rule := gwHTTPRule{Filters: ar.filters, BackendRefs: cmpBackends(ar.backends, self)}
			if m := httpMatch(rt.matcher); m != nil {
				rule.Matches = []gwHTTPMatch{*m}
			}
			if ar.timeout != "" {
				rule.Timeouts = &gwTimeouts{Request: ar.timeout}
			}
			s.Rules = append(s.Rules, rule)
		}
		if !catchAll {
			s.Rules = append(s.Rules, gwHTTPRule{BackendRefs: self})
		}
		kind, spec = kindHTTPRoute, s
	}
	if err := out.AddObject(ks.Ref.ClusterName, gatewayAPIVersion, kind, ks.Ref.Namespace, routeName(d, port.Port), spec, parents...); err != nil {
		failed(r, parents, d, err)
		return false
	}
	return true
}

// matcherKey is rk's request matcher alone: the key of its rule in a
// route, which serves every client of its cluster.
func matcherKey(rk routeKey) string {
	mj, _ := json.Marshal(rk.matcher)
	return string(mj)
}

// claimRule names the first field tp sets on a rule that an earlier policy
// of this route already set, or "".
func claimRule(byKey map[string]*route, owners map[*route]map[string]translation.Parent, tp *trafficPolicy, parent translation.Parent) string {
	for _, rk := range tp.routes {
		rt := byKey[matcherKey(rk)]
		if rt == nil {
			continue
		}
		for _, f := range routeFields(&tp.p.Spec.Policy) {
			if o, ok := owners[rt][f]; ok && o != parent {
				return fmt.Sprintf("policy.%s: TrafficPolicy %s/%s, older, sets it on the same request match, and a route holds one rule per match for every client of the cluster", f, o.Namespace, o.Name)
			}
		}
	}
	return ""
}

func cmpBackends(set, def []gwBackendRef) []gwBackendRef {
	if len(set) > 0 {
		return set
	}
	return def
}

func isEmptyMatcher(m *networkingv1alpha1.HTTPMatcher) bool {
	return m.URI == nil && m.Method == "" && len(m.Headers)+len(m.QueryParameters) == 0
}

// decorateAmbient applies one policy's route fields to a rule (claim
// ensured no two policies set one field of a route; ambientProblems that
// every field set here can be said).
func (b *trafficBuilder) decorateAmbient(ar *ambientRule, p *networkingv1alpha1.Policy, from int32) {
	if ts := p.TrafficShift; ts != nil {
		for _, wd := range ts.Destinations {
			t := b.byRef[wd.KubeService.ClusterObjectRef]
			port, _ := targetPort(t, wd.KubeService.Port, from)
			ar.backends = append(ar.backends, gwBackendRef{Name: wd.KubeService.Name, Port: port, Weight: new(wd.Weight)})
		}
	}
	if p.RequestTimeout != nil {
		ar.timeout, _ = gatewayDuration(p.RequestTimeout.Duration)
	}
	if hm := p.HeaderManipulation; hm != nil {
		if len(hm.AppendRequestHeaders)+len(hm.RemoveRequestHeaders) > 0 {
			ar.filters = append(ar.filters, gwFilter{Type: "RequestHeaderModifier", RequestHeaderModifier: headerModifier(hm.AppendRequestHeaders, hm.RemoveRequestHeaders)})
		}
		if len(hm.AppendResponseHeaders)+len(hm.RemoveResponseHeaders) > 0 {
			ar.filters = append(ar.filters, gwFilter{Type: "ResponseHeaderModifier", ResponseHeaderModifier: headerModifier(hm.AppendResponseHeaders, hm.RemoveResponseHeaders)})
		}
	}
	if m := p.Mirror; m != nil {
		t := b.byRef[m.KubeService]
		port, _ := targetPort(t, m.Port, from)
		mirror := &gwMirror{BackendRef: gwBackendRef{Name: m.KubeService.Name, Port: port}}
		if pct := m.Percentage; pct == math.Trunc(pct) {
			mirror.Percent = new(int32(pct))
		} else {
			// A millionth: the precision of Istio's mirrorPercentage
			// to four decimals of a percent.
			mirror.Fraction = &gwFraction{Numerator: int32(math.Round(pct * 10000)), Denominator: 1000000}
		}
		ar.filters = append(ar.filters, gwFilter{Type: "RequestMirror", RequestMirror: mirror})
	}
	if c := p.CORSPolicy; c != nil {
		cors := &gwCORS{AllowMethods: c.AllowMethods, AllowHeaders: c.AllowHeaders, ExposeHeaders: c.ExposeHeaders, AllowCredentials: c.AllowCredentials}
		for _, o := range c.AllowOrigins {
			if o.Exact != nil {
				cors.AllowOrigins = append(cors.AllowOrigins, *o.Exact)
			}
		}
		if c.MaxAge != nil {
			cors.MaxAge = int32(c.MaxAge.Duration / time.Second)
		}
		ar.filters = append(ar.filters, gwFilter{Type: "CORS", CORS: cors})
	}
	// Filters in one fixed order, whichever policy set them.
	order := map[string]int{"CORS": 0, "RequestHeaderModifier": 1, "ResponseHeaderModifier": 2, "RequestMirror": 3}
	slices.SortStableFunc(ar.filters, func(x, y gwFilter) int { return order[x.Type] - order[y.Type] })
}

func headerModifier(add map[string]string, remove []string) *gwHeaderModifier {
	hm := &gwHeaderModifier{Remove: slices.Clone(remove)}
	for _, k := range slices.Sorted(maps.Keys(add)) {
		hm.Add = append(hm.Add, gwHeader{Name: k, Value: add[k]})
	}
	return hm
}

// httpMatch is m as an HTTPRouteMatch; nil matches every request. A uri
// prefix other than "/" becomes a regular expression: Gateway API's
// PathPrefix matches whole path segments ("/api" does not match "/apis"),
// Istio's prefix matches characters.
func httpMatch(m *networkingv1alpha1.HTTPMatcher) *gwHTTPMatch {
	if m == nil || isEmptyMatcher(m) {
		return nil
	}
	out := &gwHTTPMatch{Method: m.Method}
	if u := m.URI; u != nil {
		switch {
		case u.Exact != nil:
			out.Path = &gwMatch{Type: "Exact", Value: *u.Exact}
		case u.Prefix != nil && *u.Prefix == "/":
			out.Path = &gwMatch{Type: "PathPrefix", Value: "/"}
		case u.Prefix != nil:
			out.Path = &gwMatch{Type: "RegularExpression", Value: regexp.QuoteMeta(*u.Prefix) + ".*"}
		case u.Regex != nil:
			out.Path = &gwMatch{Type: "RegularExpression", Value: *u.Regex}
		}
	}
	out.Headers = headerMatches(m.Headers)
	for _, q := range m.QueryParameters {
		out.QueryParams = append(out.QueryParams, namedMatch(q.Name, q.Value, q.Regex))
	}
	slices.SortFunc(out.QueryParams, func(a, b gwNamedMatch) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func grpcMatch(m *networkingv1alpha1.HTTPMatcher) *gwGRPCMatch {
	if m == nil || isEmptyMatcher(m) {
		return nil
	}
	out := &gwGRPCMatch{Headers: headerMatches(m.Headers)}
	if m.URI != nil {
		out.Method, _ = grpcMethod(m.URI)
	}
	return out
}

func headerMatches(hs []networkingv1alpha1.HeaderMatcher) []gwNamedMatch {
	var out []gwNamedMatch
	for _, h := range hs {
		out = append(out, namedMatch(strings.ToLower(h.Name), h.Value, h.Regex))
	}
	slices.SortFunc(out, func(a, b gwNamedMatch) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// namedMatch matches a header or query value as valueMatch does: an empty
// value matches any.
func namedMatch(name, value string, regex bool) gwNamedMatch {
	switch {
	case regex:
		return gwNamedMatch{Type: "RegularExpression", Name: name, Value: value}
	case value == "":
		return gwNamedMatch{Type: "RegularExpression", Name: name, Value: ".*"}
	}
	return gwNamedMatch{Type: "Exact", Name: name, Value: value}
}

// sortedValues are m's values in the order of their keys.
func sortedValues(m map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}
