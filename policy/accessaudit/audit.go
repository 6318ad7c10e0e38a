package accessaudit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
)

// Schema names the JSON form of a Result and of a Diff. It changes when the
// meaning of a field does.
const Schema = "relaymesh.io/access-audit/v1alpha1"

// DefaultMaxObjects is the largest input Audit accepts unless told otherwise.
const DefaultMaxObjects = 50_000

// ErrTooLarge means the input has more objects than Config.MaxObjects.
var ErrTooLarge = errors.New("input too large")

// Routes: how a source reaches a destination.
const (
	// RouteLocal: same cluster, through the Service.
	RouteLocal = "local"
	// RouteFederated: through the federated host a VirtualMesh publishes in
	// the source's cluster.
	RouteFederated = "federated"
	// RouteVirtualDestination: through a VirtualDestination's hostname
	// published in the source's cluster, which the destination backs.
	RouteVirtualDestination = "virtualDestination"
	// RouteForeign: an identity of a foreign SPIFFE trust domain the
	// destination's VirtualMesh trusts (spec.mtls.federatedTrustDomains),
	// calling the destination's sidecar pods directly.
	RouteForeign = "foreignTrustDomain"
)

// Port protocols as the server's sidecar treats them.
const (
	// ProtocolHTTP: HTTP, HTTP/2 or gRPC; path and method conditions apply.
	ProtocolHTTP = "HTTP"
	// ProtocolTCP: declared as a non-HTTP protocol; a rule with path or
	// method conditions allows nothing here.
	ProtocolTCP = "TCP"
	// ProtocolAuto: not declared; Istio sniffs it, so conditions apply to
	// HTTP requests and other traffic is denied by a conditional rule.
	ProtocolAuto = "auto"
)

// allowAllAnnotation is the opt-in the default admission rules ask of an
// AccessPolicy that allows every source (policy/admission).
const allowAllAnnotation = "relaymesh.io/allow-all"

// Config configures Audit.
type Config struct {
	// AdminNamespace is the server's namespace: policies there may select
	// any Destination, others only their own namespace's.
	AdminNamespace string
	// Admission judges every user object as the server does before it
	// translates (policy/admission.Engine, with the rule sets the caller
	// can read). Required: an object the server refuses is not in force
	// and must not be in the matrix.
	Admission all.Decider
	// NamespaceLabels are the labels of the user objects' namespaces, which
	// admission rules may read.
	NamespaceLabels map[string]map[string]string
	// ServerStatus: an object the server reports Invalid for its current
	// generation is not in force either (live views; see
	// all.InForceConfig).
	ServerStatus bool
	// MaxObjects refuses larger inputs (all seven kinds counted); 0 means
	// DefaultMaxObjects.
	MaxObjects int
}

// InForce is how the audit decides what is in force: the view's part of
// cfg.
func (cfg Config) InForce() all.InForceConfig {
	return all.InForceConfig{AdminNamespace: cfg.AdminNamespace, Admission: cfg.Admission, NamespaceLabels: cfg.NamespaceLabels, ServerStatus: cfg.ServerStatus}
}

// Result is an audit: the access matrix and the findings.
type Result struct {
	Schema string `json:"schema"`
	// Input is what reading the files found, for an offline audit.
	Input    *InputReport `json:"input,omitempty"`
	Matrix   Matrix       `json:"matrix"`
	Findings []Finding    `json:"findings"`
}

// Matrix is the effective access: the identities, the destinations and every
// allowed (source, destination, port).
type Matrix struct {
	Sources      []Source      `json:"sources"`
	Destinations []Destination `json:"destinations"`
	// Pairs are sorted by destination (as Destinations), port and source
	// (as Sources).
	Pairs []Pair `json:"pairs"`
}

// Source is a workload identity, or an identity of a foreign SPIFFE trust
// domain an AccessPolicy names (spiffeIDs): then ID is the SPIFFE ID,
// TrustDomain is set, and Cluster, Namespace, ServiceAccount, Mesh and
// Workloads are empty.
type Source struct {
	// ID is `<cluster>/<namespace>/<service account>` (followed by
	// `@<mesh namespace>/<mesh name>` when that is not unique).
	ID             string `json:"id"`
	Cluster        string `json:"cluster"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
	// Mesh is `<namespace>/<name>` of its Mesh.
	Mesh string `json:"mesh"`
	// Principal is what Istio calls it, empty when its mesh has no known
	// trust domain (then no AccessPolicy can allow it).
	Principal string `json:"principal,omitempty"`
	// Workloads are the discovered Workloads running as it.
	Workloads []string `json:"workloads"`
	// TrustDomain is the foreign trust domain of a foreign identity.
	TrustDomain string `json:"trustDomain,omitempty"`
}

// Destination is a discovered Destination (a Service).
type Destination struct {
	// ID is `<service>-<namespace>-<cluster>`, the name statuses use.
	ID        string `json:"id"`
	Service   string `json:"service"`
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	Mesh      string `json:"mesh"`
	// DataPlaneMode is how its workloads run when not (only) with
	// sidecars: ambient, or mixed (both, during a migration); empty for
	// sidecars. At ambient workloads a grant with paths or methods needs
	// the Destination's waypoint.
	DataPlaneMode string `json:"dataPlaneMode,omitempty"`
	// VirtualMesh is `<namespace>/<name>` of the valid VirtualMesh its mesh
	// belongs to.
	VirtualMesh string `json:"virtualMesh,omitempty"`
	// DenyByDefault: that VirtualMesh has globalAccessPolicy Enabled.
	DenyByDefault bool `json:"denyByDefault"`
	// Policies are the AccessPolicies in force that select it
	// (`<namespace>/<name>`); none and not DenyByDefault: it is open.
	Policies []string `json:"policies"`
	Ports    []Port   `json:"ports"`
}

// Open says whether anyone with a route may call the destination.
func (d *Destination) Open() bool { return !d.DenyByDefault && len(d.Policies) == 0 }

// Port is a port of a Destination.
type Port struct {
	Number int32  `json:"number"`
	Name   string `json:"name,omitempty"`
	// Protocol is HTTP, TCP or auto (see the constants).
	Protocol string `json:"protocol"`
	// PodPort is the numeric targetPort when it differs from Number:
	// what allowedPorts are compared with.
	PodPort int32 `json:"podPort,omitempty"`
}

// Pair is one allowed (source, destination, port).
type Pair struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	// Port is the Service port; 0 when the Destination lists none.
	Port  int32  `json:"port"`
	Route string `json:"route"`
	// Via names the VirtualMesh or VirtualDestination of a remote route.
	Via string `json:"via,omitempty"`
	// Open: allowed because nothing restricts the destination.
	Open bool `json:"open,omitempty"`
	// Conditional: every grant restricts paths or methods.
	Conditional bool `json:"conditional,omitempty"`
	// Grants are the AccessPolicies that allow it, by namespace/name.
	Grants []Grant `json:"grants,omitempty"`
}

// Grant is one AccessPolicy allowing a pair, with its conditions.
type Grant struct {
	// Policy is `<namespace>/<name>`.
	Policy  string   `json:"policy"`
	Paths   []string `json:"paths,omitempty"`
	Methods []string `json:"methods,omitempty"`
	// Ports restrict a Destination that lists no port.
	Ports []int32 `json:"ports,omitempty"`
}

// Conditional says whether the grant allows only some requests.
func (g Grant) Conditional() bool { return len(g.Paths)+len(g.Methods)+len(g.Ports) > 0 }

// Count is the number of objects of in.
func Count(in *translation.Input) int {
	return len(in.Meshes) + len(in.Workloads) + len(in.Destinations) + len(in.VirtualMeshes) +
		len(in.TrafficPolicies) + len(in.AccessPolicies) + len(in.VirtualDestinations)
}

// Audit computes the access matrix and the findings of in. Only what is in
// force counts (all.TranslateInForce): an object admission refuses,
// or that translation reports Invalid, allows nothing and restricts
// nothing, and is a not-in-force finding.
func Audit(ctx context.Context, in *translation.Input, cfg Config) (*Result, error) {
	limit := cmp.Or(cfg.MaxObjects, DefaultMaxObjects)
	if n := Count(in); n > limit {
		return nil, fmt.Errorf("%w: %d objects, at most %d are audited", ErrTooLarge, n, limit)
	}
	a, _, err := newAuditor(ctx, in, cfg)
	if err != nil {
		return nil, err
	}
	res := &Result{Schema: Schema, Matrix: Matrix{Sources: make([]Source, 0, len(a.srcs)), Destinations: make([]Destination, 0, len(a.dests)), Pairs: a.pairs}}
	for _, s := range a.srcs {
		res.Matrix.Sources = append(res.Matrix.Sources, *s)
	}
	for _, d := range a.dests {
		res.Matrix.Destinations = append(res.Matrix.Destinations, d.Destination)
	}
	if res.Matrix.Pairs == nil {
		res.Matrix.Pairs = []Pair{}
	}
	res.Findings = a.findings()
	return res, nil
}

// newAuditor translates what is in force of in and computes the matrix; it
// also returns the translation's output.
func newAuditor(ctx context.Context, in *translation.Input, cfg Config) (*auditor, *translation.Output, error) {
	admitted, out, report, err := all.TranslateInForce(ctx, in, cfg.InForce())
	if err != nil {
		return nil, nil, err
	}
	// The plan (which VirtualMesh a Destination is in, deny by default)
	// only from what is in force: a refused VirtualMesh denies nothing.
	a := &auditor{in: in, report: report, plan: federation.NewPlan(admitted)}
	a.sources()
	a.destinations()
	a.routes(out)
	a.policies()
	a.matrix()
	return a, out, nil
}

// auditor holds the resolved input while one audit runs.
type auditor struct {
	in     *translation.Input
	report *translation.Report
	plan   *federation.Plan

	srcs        []*Source
	byPrincipal map[string][]int // principal → indexes into srcs
	dests       []*dest
	aps         []*accessPolicy // sorted by namespace/name
	pairs       []Pair
	// outside[d] are the pairs (indexes into pairs) that policies grant to
	// sources from outside d's VirtualMesh.
	outside map[int][]int
}

type dest struct {
	Destination
	d       *discoveryv1alpha1.Destination
	members map[string]bool // mesh keys of its VirtualMesh
	// foreign are the foreign trust domains whose identities its sidecar
	// pods admit (policy.AdmitsForeign), decided once.
	foreign  map[string]bool
	policies []int                       // indexes into aps, in force, selecting it
	fedVia   map[string]string           // cluster → VirtualMesh
	vdVia    map[int32]map[string]string // port → cluster → VirtualDestination
}

// column is a destination port of the matrix: an index into dests and a
// port number.
type column struct {
	dest int
	port int32
}

type accessPolicy struct {
	p         *networkingv1alpha1.AccessPolicy
	id        string
	inForce   bool
	errors    []string
	workloads int             // selected workloads
	principal map[string]bool // principals of the selected workloads
	// foreign are the principals of the foreign identities (spiffeIDs) it
	// names, each admitted only where route says so.
	foreign map[string]bool
	dests   []int
	ports   map[int32]bool
	l7      bool
	// needsWaypoint[d] is why translation could not enforce ap at
	// Destination d's ambient workloads (its target Failed: "needs a
	// waypoint"): there it allows no one.
	needsWaypoint map[int]string

	// What the matrix made of it.
	granted     int
	unreachable map[column]map[int]bool // (dest, port) → sources that have no route
	tcpDropped  int                     // (dest, port) where L7 conditions made it allow nothing
	noWaypoint  int                     // (dest, port) of an ambient Destination where it needs a waypoint
	portMisses  int                     // (dest, port) its allowedPorts exclude
	uncovered   int                     // granted pairs no other policy covers
	common      map[int]bool            // policies covering every granted pair (nil: none seen yet)
	union       map[int]bool            // policies covering some granted pair
}

// meshKey is how a reference to a Mesh is keyed: namespace/name, the
// namespace defaulting to the referring object's.
func meshKey(ref common.ObjectRef, ns string) string {
	return cmp.Or(ref.Namespace, ns) + "/" + ref.Name
}

func (a *auditor) sources() {
	type key struct{ cluster, ns, sa, mesh string }
	byKey := map[key]*Source{}
	for i := range a.in.Workloads {
		w := &a.in.Workloads[i]
		k := w.Spec.Kubernetes
		sa := cmp.Or(k.ServiceAccountName, "default")
		mk, td := meshKey(w.Spec.Mesh, w.Namespace), ""
		if m := a.in.MeshOf(w.Spec.Mesh); m != nil {
			mk = m.Namespace + "/" + m.Name
			if m.Spec.Istio != nil {
				td = m.Spec.Istio.TrustDomain
			}
		}
		id := key{k.Controller.ClusterName, k.Controller.Namespace, sa, mk}
		s := byKey[id]
		if s == nil {
			s = &Source{Cluster: id.cluster, Namespace: id.ns, ServiceAccount: sa, Mesh: mk}
			if td != "" {
				s.Principal = td + "/ns/" + id.ns + "/sa/" + sa
			}
			byKey[id] = s
		}
		s.Workloads = append(s.Workloads, w.Name)
	}
	a.srcs = slices.Collect(maps.Values(byKey))
	slices.SortFunc(a.srcs, func(x, y *Source) int {
		return cmp.Or(cmp.Compare(x.Cluster, y.Cluster), cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.ServiceAccount, y.ServiceAccount), cmp.Compare(x.Mesh, y.Mesh))
	})
	ids := map[string]int{}
	for _, s := range a.srcs {
		s.ID = s.Cluster + "/" + s.Namespace + "/" + s.ServiceAccount
		ids[s.ID]++
		slices.Sort(s.Workloads)
		s.Workloads = slices.Compact(s.Workloads)
	}
	// Foreign identities any AccessPolicy names, after the workloads.
	foreign := map[string]*Source{}
	for i := range a.in.AccessPolicies {
		for _, sel := range a.in.AccessPolicies[i].Spec.SourceSelector {
			for _, id := range sel.SpiffeIDs {
				if td, pr, err := policy.ForeignPrincipal(id); err == nil && foreign[id] == nil && !policy.FleetTrustDomain(a.in, td) {
					foreign[id] = &Source{ID: id, TrustDomain: td, Principal: pr, Workloads: []string{}}
				}
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(foreign)) {
		a.srcs = append(a.srcs, foreign[id])
	}
	a.byPrincipal = map[string][]int{}
	for i, s := range a.srcs {
		if ids[s.ID] > 1 && s.TrustDomain == "" {
			s.ID += "@" + s.Mesh
		}
		if s.Principal != "" {
			a.byPrincipal[s.Principal] = append(a.byPrincipal[s.Principal], i)
		}
	}
}

func (a *auditor) destinations() {
	for _, d := range translation.SortedDestinations(a.in.Destinations) {
		ref := d.Spec.KubeService.Ref
		if ref.Name == "" || ref.Namespace == "" || ref.ClusterName == "" {
			continue // translation cannot place it either
		}
		x := &dest{d: d, Destination: Destination{ID: translation.DestinationTarget(d), Service: ref.Name, Namespace: ref.Namespace,
			Cluster: ref.ClusterName, Mesh: meshKey(d.Spec.Mesh, d.Namespace), DataPlaneMode: dataPlaneMode(d), Policies: []string{}, Ports: ports(d)}}
		if m := a.in.MeshOf(d.Spec.Mesh); m != nil {
			x.Mesh = m.Namespace + "/" + m.Name
		}
		if vm := a.plan.VirtualMeshOf(d); vm != nil {
			x.VirtualMesh = vm.Namespace + "/" + vm.Name
			x.DenyByDefault = vm.Spec.GlobalAccessPolicy == networkingv1alpha1.GlobalAccessEnabled
			x.members = map[string]bool{}
			for _, r := range vm.Spec.Meshes {
				if m, err := a.in.MeshFor(r); err == nil {
					x.members[m.Namespace+"/"+m.Name] = true
				}
			}
			if vm.Spec.MTLS != nil {
				for _, td := range vm.Spec.MTLS.FederatedTrustDomains {
					if policy.AdmitsForeign(a.plan, a.in, d, td) {
						if x.foreign == nil {
							x.foreign = map[string]bool{}
						}
						x.foreign[td] = true
					}
				}
			}
		}
		if len(a.dests) > 0 && a.dests[len(a.dests)-1].ID == x.ID {
			continue // a second Destination for one Service: translation fails it
		}
		a.dests = append(a.dests, x)
	}
}

// dataPlaneMode is d's mode as translation reads it (policy's
// destinationModes): ambient, mixed, or empty for sidecars.
func dataPlaneMode(d *discoveryv1alpha1.Destination) string {
	switch m := d.Spec.KubeService.DataPlaneMode; m {
	case discoveryv1alpha1.DataPlaneAmbient, discoveryv1alpha1.DataPlaneMixed:
		return m
	}
	return ""
}

// ports returns the proxied ports of d, sorted; one port 0 when it lists none.
func ports(d *discoveryv1alpha1.Destination) []Port {
	var out []Port
	seen := map[int32]bool{}
	for _, p := range d.Spec.KubeService.Ports {
		if p.Port <= 0 || p.Port > 65535 || seen[p.Port] {
			continue
		}
		switch strings.ToUpper(p.Protocol) {
		case "UDP", "SCTP":
			continue
		}
		seen[p.Port] = true
		port := Port{Number: p.Port, Name: p.Name, Protocol: protocol(p)}
		if t, err := strconv.ParseInt(p.TargetPort, 10, 32); err == nil && t > 0 && t <= 65535 && int32(t) != p.Port {
			port.PodPort = int32(t)
		}
		out = append(out, port)
	}
	if len(out) == 0 {
		return []Port{{Number: 0, Protocol: ProtocolAuto}}
	}
	slices.SortFunc(out, func(x, y Port) int { return cmp.Compare(x.Number, y.Number) })
	return out
}

// protocol is how Istio's inbound side treats a port: by appProtocol, else
// the port name's `<protocol>[-<suffix>]` prefix, else sniffed.
func protocol(p discoveryv1alpha1.ServicePort) string {
	for _, s := range []string{p.AppProtocol, p.Name} {
		s = strings.ToLower(s)
		if strings.HasPrefix(s, "grpc-web") {
			return ProtocolHTTP
		}
		if i := strings.IndexByte(s, '-'); i >= 0 {
			s = s[:i]
		}
		switch s {
		case "http", "http2", "h2c", "kubernetes.io/h2c", "grpc":
			return ProtocolHTTP
		case "https", "tls", "tcp", "mongo", "mysql", "redis":
			return ProtocolTCP
		}
	}
	return ProtocolAuto
}

// routes finds where translation publishes each Destination: the clusters
// that hold its federated host (VirtualMesh) or a VirtualDestination it backs.
func (a *auditor) routes(out *translation.Output) {
	fed := map[string]map[string]string{} // host → cluster → VirtualMesh
	vdClusters := map[string][]string{}   // VirtualDestination + "\x00" + host → clusters
	for _, o := range out.Objects() {
		if o.Object.GetKind() != "ServiceEntry" {
			continue
		}
		for _, p := range o.Parents {
			switch p.Kind {
			case translation.KindVirtualMesh:
				hosts := specStrings(o.Object.Object, "hosts")
				for _, h := range hosts {
					if fed[h] == nil {
						fed[h] = map[string]string{}
					}
					fed[h][o.Cluster] = p.Namespace + "/" + p.Name
				}
			case translation.KindVirtualDestination:
				for _, h := range specStrings(o.Object.Object, "hosts") {
					key := p.Namespace + "/" + p.Name + "\x00" + h
					vdClusters[key] = append(vdClusters[key], o.Cluster)
				}
			}
		}
	}
	byRef := map[common.ClusterObjectRef]int{}
	for i, d := range a.dests {
		d.fedVia = fed[translation.FederatedHostname(d.d, a.plan.HostnameSuffix(d.d))]
		byRef[d.d.Spec.KubeService.Ref] = i
	}
	for i := range a.in.VirtualDestinations {
		vd := &a.in.VirtualDestinations[i]
		key := vd.Namespace + "/" + vd.Name
		// Where its hostname is published (not where its gateway host is:
		// that one is exported to the east-west gateways only).
		clusters := vdClusters[key+"\x00"+vd.Spec.Hostname]
		st, _, ok := a.report.Status(translation.ObjectKey{Kind: translation.KindVirtualDestination, Namespace: vd.Namespace, Name: vd.Name})
		if !ok || st.State == common.StateInvalid || len(clusters) == 0 {
			continue
		}
		var backends []int
		switch {
		case vd.Spec.Static != nil:
			for _, ref := range vd.Spec.Static.Destinations {
				if j, ok := byRef[ref]; ok {
					backends = append(backends, j)
				}
			}
		case vd.Spec.Localized != nil:
			for j, d := range a.dests {
				if translation.MatchDestination(vd.Spec.Localized.DestinationSelectors, d.d) {
					backends = append(backends, j)
				}
			}
		}
		for _, j := range backends {
			d := a.dests[j]
			port := vdBackendPort(vd.Spec.Port, d)
			if d.vdVia == nil {
				d.vdVia = map[int32]map[string]string{}
			}
			if d.vdVia[port] == nil {
				d.vdVia[port] = map[string]string{}
			}
			for _, c := range clusters {
				if cur, ok := d.vdVia[port][c]; !ok || key < cur {
					d.vdVia[port][c] = key
				}
			}
		}
	}
}

// vdBackendPort is the backing Service port a VirtualDestination sends to:
// targetName looked up on the Destination, else targetNumber, else number.
func vdBackendPort(p networkingv1alpha1.VirtualDestinationPort, d *dest) int32 {
	if p.TargetName != "" {
		for _, sp := range d.d.Spec.KubeService.Ports {
			if sp.Name == p.TargetName {
				return sp.Port
			}
		}
	}
	return cmp.Or(p.TargetNumber, p.Number)
}

// specStrings returns the strings of the list spec.<field> of an output
// object.
func specStrings(obj map[string]any, field string) []string {
	spec, _ := obj["spec"].(map[string]any)
	list, _ := spec[field].([]any)
	out := make([]string, 0, len(list))
	for _, v := range list {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// route says whether source s reaches d on port, and how.
func (a *auditor) route(s *Source, d *dest, port int32) (route, via string, ok bool) {
	if s.TrustDomain != "" {
		// Only sidecar pods hold the foreign roots (ztunnel trusts one).
		if d.DataPlaneMode != discoveryv1alpha1.DataPlaneAmbient && d.foreign[s.TrustDomain] {
			return RouteForeign, d.VirtualMesh, true
		}
		return "", "", false
	}
	if s.Cluster == d.Cluster {
		return RouteLocal, "", true
	}
	if vm, ok := d.fedVia[s.Cluster]; ok {
		return RouteFederated, vm, true
	}
	if vd, ok := d.vdVia[port][s.Cluster]; ok {
		return RouteVirtualDestination, vd, true
	}
	return "", "", false
}

func (a *auditor) policies() {
	aps := make([]*networkingv1alpha1.AccessPolicy, len(a.in.AccessPolicies))
	for i := range a.in.AccessPolicies {
		aps[i] = &a.in.AccessPolicies[i]
	}
	slices.SortFunc(aps, func(x, y *networkingv1alpha1.AccessPolicy) int {
		return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
	})
	for _, p := range aps {
		ap := &accessPolicy{p: p, id: p.Namespace + "/" + p.Name, principal: map[string]bool{},
			l7: len(p.Spec.AllowedPaths)+len(p.Spec.AllowedMethods) > 0}
		st, _, ok := a.report.Status(translation.ObjectKey{Kind: translation.KindAccessPolicy, Namespace: p.Namespace, Name: p.Name})
		ap.inForce = !ok || st.State != common.StateInvalid
		if !ap.inForce {
			ap.errors = st.Errors
		}
		if len(p.Spec.AllowedPorts) > 0 {
			ap.ports = map[int32]bool{}
			for _, n := range p.Spec.AllowedPorts {
				ap.ports[n] = true
			}
		}
		a.aps = append(a.aps, ap)
	}
	// Sources, as policy.TranslateAccess resolves them.
	for i := range a.in.Workloads {
		w := &a.in.Workloads[i]
		for _, ap := range a.aps {
			if !policy.MatchAccessSource(ap.p.Spec.SourceSelector, w) {
				continue
			}
			ap.workloads++
			k := w.Spec.Kubernetes
			sa := cmp.Or(k.ServiceAccountName, "default")
			if m := a.in.MeshOf(w.Spec.Mesh); m != nil && m.Spec.Istio != nil && m.Spec.Istio.TrustDomain != "" {
				ap.principal[m.Spec.Istio.TrustDomain+"/ns/"+k.Controller.Namespace+"/sa/"+sa] = true
			}
		}
	}
	for _, ap := range a.aps {
		for _, sel := range ap.p.Spec.SourceSelector {
			for _, id := range sel.SpiffeIDs {
				if td, pr, err := policy.ForeignPrincipal(id); err == nil && !policy.FleetTrustDomain(a.in, td) {
					if ap.foreign == nil {
						ap.foreign = map[string]bool{}
					}
					ap.foreign[pr] = true
				}
			}
		}
	}
	byID := map[string]int{}
	for j, d := range a.dests {
		byID[d.ID] = j
	}
	for _, ap := range a.aps {
		for j, d := range a.dests {
			if translation.MatchDestination(ap.p.Spec.DestinationSelector, d.d) {
				ap.dests = append(ap.dests, j)
			}
		}
		// The Destinations whose ambient workloads translation could not
		// give this policy's HTTP conditions (policy/access_ambient.go).
		_, targets, _ := a.report.Status(translation.ObjectKey{Kind: translation.KindAccessPolicy, Namespace: ap.p.Namespace, Name: ap.p.Name})
		for _, t := range targets {
			j, ok := byID[t.Target]
			if !ok || t.State != common.StateFailed {
				continue
			}
			if i := slices.IndexFunc(t.Errors, func(e string) bool { return strings.HasPrefix(e, policy.NeedsWaypoint) }); i >= 0 {
				if ap.needsWaypoint == nil {
					ap.needsWaypoint = map[int]string{}
				}
				ap.needsWaypoint[j] = t.Errors[i]
			}
		}
	}
	for pi, ap := range a.aps {
		if !ap.inForce {
			continue
		}
		for _, j := range ap.dests {
			d := a.dests[j]
			d.policies = append(d.policies, pi)
			d.Policies = append(d.Policies, ap.id)
		}
	}
}

// sources are the principals ap names: its workloads' and its foreign
// identities'.
func (ap *accessPolicy) sources() iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, set := range []map[string]bool{ap.principal, ap.foreign} {
			for pr := range set {
				if !yield(pr) {
					return
				}
			}
		}
	}
}

// allowsPort says whether ap's allowedPorts let traffic to port through.
func (ap *accessPolicy) allowsPort(p Port) bool {
	if ap.ports == nil || p.Number == 0 {
		return true
	}
	return ap.ports[cmp.Or(p.PodPort, p.Number)]
}

func (ap *accessPolicy) grant(p Port) Grant {
	g := Grant{Policy: ap.id, Paths: slices.Clone(ap.p.Spec.AllowedPaths), Methods: slices.Clone(ap.p.Spec.AllowedMethods)}
	if p.Number == 0 && len(ap.p.Spec.AllowedPorts) > 0 {
		g.Ports = slices.Sorted(maps.Keys(ap.ports))
	}
	return g
}

func (a *auditor) matrix() {
	a.outside = map[int][]int{}
	grants := make([][]int, len(a.srcs)) // source → policies granting, for one port
	for j, d := range a.dests {
		for _, port := range d.Ports {
			if d.Open() {
				for _, s := range a.srcs {
					if route, via, ok := a.route(s, d, port.Number); ok {
						a.pairs = append(a.pairs, Pair{Source: s.ID, Destination: d.ID, Port: port.Number, Route: route, Via: via, Open: true})
					}
				}
				continue
			}
			var touched []int
			for _, pi := range d.policies {
				ap := a.aps[pi]
				if !ap.allowsPort(port) {
					ap.portMisses++
					continue
				}
				if ap.l7 && port.Protocol == ProtocolTCP {
					ap.tcpDropped++
					continue
				}
				if _, ok := ap.needsWaypoint[j]; ok && d.DataPlaneMode == discoveryv1alpha1.DataPlaneAmbient {
					// Nothing of it is written for this Destination: its
					// sources are not admitted (a mixed Destination's
					// sidecar pods still admit them).
					ap.noWaypoint++
					continue
				}
				for pr := range ap.sources() {
					for _, i := range a.byPrincipal[pr] {
						if _, _, ok := a.route(a.srcs[i], d, port.Number); !ok {
							c := column{j, port.Number}
							if ap.unreachable == nil {
								ap.unreachable = map[column]map[int]bool{}
							}
							if ap.unreachable[c] == nil {
								ap.unreachable[c] = map[int]bool{}
							}
							ap.unreachable[c][i] = true
							continue
						}
						if len(grants[i]) == 0 {
							touched = append(touched, i)
						}
						grants[i] = append(grants[i], pi)
					}
				}
			}
			slices.Sort(touched)
			for _, i := range touched {
				s := a.srcs[i]
				route, via, _ := a.route(s, d, port.Number)
				pair := Pair{Source: s.ID, Destination: d.ID, Port: port.Number, Route: route, Via: via, Conditional: true}
				gs := make([]Grant, len(grants[i]))
				for k, pi := range grants[i] { // d.policies order: namespace/name
					gs[k] = a.aps[pi].grant(port)
					pair.Conditional = pair.Conditional && gs[k].Conditional()
				}
				pair.Grants = gs
				a.shadows(grants[i], gs)
				if d.members != nil && !d.members[s.Mesh] && s.TrustDomain == "" {
					a.outside[j] = append(a.outside[j], len(a.pairs))
				}
				a.pairs = append(a.pairs, pair)
				grants[i] = grants[i][:0]
			}
		}
	}
}

// shadows records, for each policy granting one pair, which other grants of
// the pair cover it.
func (a *auditor) shadows(policies []int, gs []Grant) {
	for k, pi := range policies {
		ap := a.aps[pi]
		ap.granted++
		var by []int
		for m, qi := range policies {
			if m != k && qi != pi && covers(gs[m], gs[k]) {
				by = append(by, qi)
			}
		}
		if len(by) == 0 {
			ap.uncovered++
			ap.common = map[int]bool{}
			continue
		}
		if ap.union == nil {
			ap.union = map[int]bool{}
		}
		for _, q := range by {
			ap.union[q] = true
		}
		if ap.common == nil {
			ap.common = map[int]bool{}
			for _, q := range by {
				ap.common[q] = true
			}
			continue
		}
		for q := range ap.common {
			if !slices.Contains(by, q) {
				delete(ap.common, q)
			}
		}
	}
}

// covers says whether grant q allows every request grant p allows on the
// same pair.
func covers(q, p Grant) bool {
	if len(q.Methods) > 0 && (len(p.Methods) == 0 || !subsetOf(p.Methods, q.Methods)) {
		return false
	}
	if len(q.Ports) > 0 && (len(p.Ports) == 0 || !subsetOf(p.Ports, q.Ports)) {
		return false
	}
	if len(q.Paths) == 0 {
		return true
	}
	if len(p.Paths) == 0 {
		return false
	}
	for _, pp := range p.Paths {
		if !slices.ContainsFunc(q.Paths, func(qp string) bool { return pathCovers(qp, pp) }) {
			return false
		}
	}
	return true
}

func subsetOf[T comparable](xs, ys []T) bool {
	for _, x := range xs {
		if !slices.Contains(ys, x) {
			return false
		}
	}
	return true
}

// pathCovers says whether Istio path pattern q (exact, `prefix*`, `*suffix`
// or `*`) matches every path pattern p matches.
func pathCovers(q, p string) bool {
	switch {
	case q == p || q == "*":
		return true
	case strings.HasSuffix(q, "*"):
		prefix := strings.TrimSuffix(q, "*")
		if strings.HasPrefix(p, "*") {
			return false
		}
		return strings.HasPrefix(strings.TrimSuffix(p, "*"), prefix)
	case strings.HasPrefix(q, "*"):
		suffix := strings.TrimPrefix(q, "*")
		if strings.HasSuffix(p, "*") {
			return false
		}
		return strings.HasSuffix(strings.TrimPrefix(p, "*"), suffix)
	}
	return false
}
