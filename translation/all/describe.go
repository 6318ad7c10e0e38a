package all

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
)

// Describing the whole world: which user objects apply to a discovered
// object, and what they produce for it. Federation is described from the
// federation plan (federation.Plan.FederatedTo), the rule that exports.

// ErrNotFound: the object to describe is not in the input.
var ErrNotFound = errors.New("not found")

// NotFoundError names an object that is not in the input and the objects
// whose names share its prefix.
type NotFoundError struct {
	What, Name string
	Similar    []string
}

func (e *NotFoundError) Error() string {
	msg := fmt.Sprintf("%s %q not found", e.What, e.Name)
	if len(e.Similar) > 0 {
		msg += "; did you mean " + strings.Join(e.Similar, ", ") + "?"
	}
	return msg
}

// Is makes a NotFoundError match ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// AppliedPolicy is a user object that applies to the described object, with
// its verdict from the translation.Report.
type AppliedPolicy struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	State     string `json:"state"`
	// InForce: translation accepted it, so what it asks for is enforced
	// (an Invalid object — refused by admission, out of its namespace's
	// reach, or wrong — produces nothing).
	InForce bool     `json:"inForce"`
	Errors  []string `json:"errors,omitempty"`
	// Target is the policy's verdict for the described Destination, if it
	// reported one.
	Target *common.TargetStatus `json:"target,omitempty"`
}

// Federation is a VirtualMesh that makes a Destination reachable from other
// meshes under Hostname.
type Federation struct {
	AppliedPolicy
	Hostname string   `json:"hostname"`
	ToMeshes []string `json:"toMeshes"`
}

// OutputRef names one output object.
type OutputRef struct {
	Cluster    string   `json:"cluster"`
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Name       string   `json:"name"`
	Parents    []string `json:"parents"`
}

// DestinationDescription says which policies apply to a Destination, in
// translation order, and what they produce for it.
type DestinationDescription struct {
	Name    string                  `json:"name"`
	Service common.ClusterObjectRef `json:"service"`
	Mesh    string                  `json:"mesh"`
	// DataPlane is sidecar, ambient or mixed (a migration in progress:
	// both kinds of policy are written).
	DataPlane string `json:"dataPlane"`
	// Waypoint is the namespace/name of the waypoint the Service is bound
	// to, if any.
	Waypoint string `json:"waypoint,omitempty"`
	// Routing is the API its TrafficPolicies are written in, in its own
	// cluster, and why (policy.RoutingAPI).
	Routing   string          `json:"routing"`
	Hostnames []string        `json:"hostnames"`
	Traffic   []AppliedPolicy `json:"trafficPolicies"`
	Access    []AppliedPolicy `json:"accessPolicies"`
	Federated []Federation    `json:"virtualMeshes"`
	Outputs   []OutputRef     `json:"outputs"`
}

// WorkloadDescription says which policies apply to a Workload as a source.
type WorkloadDescription struct {
	Name           string                  `json:"name"`
	Controller     common.ClusterObjectRef `json:"controller"`
	ControllerKind string                  `json:"controllerKind"`
	ServiceAccount string                  `json:"serviceAccount"`
	Mesh           string                  `json:"mesh"`
	Traffic        []AppliedPolicy         `json:"trafficPolicies"`
	Access         []AppliedPolicy         `json:"accessPolicies"`
}

// PolicyDescription says what a user object selects and produces.
type PolicyDescription struct {
	AppliedPolicy
	ObservedGeneration int64                 `json:"observedGeneration,omitempty"`
	Targets            []common.TargetStatus `json:"targets,omitempty"`
	// Destinations and Workloads are the discovered objects it selects
	// (Workloads: as sources); Meshes are a VirtualMesh's members.
	Destinations []string `json:"destinations"`
	Workloads    []string `json:"workloads,omitempty"`
	Meshes       []string `json:"meshes,omitempty"`
	// Outputs by cluster, sorted.
	Outputs []ClusterOutputs `json:"outputs"`
}

// ClusterOutputs are the output objects of one cluster.
type ClusterOutputs struct {
	Cluster string      `json:"cluster"`
	Objects []OutputRef `json:"objects"`
}

// DescribeDestination describes the Destination object named name.
func DescribeDestination(in *translation.Input, out *translation.Output, r *translation.Report, name string) (*DestinationDescription, error) {
	var d *discoveryv1alpha1.Destination
	names := make([]string, 0, len(in.Destinations))
	for i := range in.Destinations {
		names = append(names, in.Destinations[i].Name)
		if in.Destinations[i].Name == name {
			d = &in.Destinations[i]
		}
	}
	if d == nil {
		return nil, notFound("destination", name, names)
	}
	ks := d.Spec.KubeService
	desc := &DestinationDescription{Name: d.Name, Service: ks.Ref, Mesh: d.Spec.Mesh.Name,
		Hostnames: []string{translation.LocalHostname(d, ""), translation.FederatedHostname(d, federation.DefaultHostnameSuffix)},
		Traffic:   []AppliedPolicy{}, Access: []AppliedPolicy{}, Federated: []Federation{}, Outputs: []OutputRef{},
		DataPlane: cmp.Or(ks.DataPlaneMode, discoveryv1alpha1.DataPlaneSidecar), Routing: policy.RoutingAPI(d)}
	if ks.Waypoint != nil {
		desc.Waypoint = ks.Waypoint.Namespace + "/" + ks.Waypoint.Name
	}
	target := translation.DestinationTarget(d)
	parents := map[string]bool{}
	for _, p := range translation.SortedTrafficPolicies(in.TrafficPolicies) {
		if translation.MatchDestination(p.Spec.DestinationSelector, d) {
			desc.Traffic = append(desc.Traffic, applied(r, translation.KindTrafficPolicy, p.Namespace, p.Name, target))
			parents[translation.KindTrafficPolicy+"/"+p.Namespace+"/"+p.Name] = true
		}
	}
	for _, p := range sortedBy(in.AccessPolicies, func(p *networkingv1alpha1.AccessPolicy) string { return p.Namespace + "/" + p.Name }) {
		if translation.MatchDestination(p.Spec.DestinationSelector, d) {
			desc.Access = append(desc.Access, applied(r, translation.KindAccessPolicy, p.Namespace, p.Name, target))
			parents[translation.KindAccessPolicy+"/"+p.Namespace+"/"+p.Name] = true
		}
	}
	hosts := slices.Clone(desc.Hostnames)
	// Federation as the plan exports it: only the valid VirtualMesh that
	// owns d's mesh, and only to the members its selectors name.
	if vm, to := federation.NewPlan(in).FederatedTo(d); vm != nil {
		suffix := cmp.Or(vm.Spec.Federation.HostnameSuffix, federation.DefaultHostnameSuffix)
		f := Federation{AppliedPolicy: applied(r, translation.KindVirtualMesh, vm.Namespace, vm.Name, ""),
			Hostname: translation.FederatedHostname(d, suffix), ToMeshes: meshNames(to)}
		desc.Federated = append(desc.Federated, f)
		parents[translation.KindVirtualMesh+"/"+vm.Namespace+"/"+vm.Name] = true
		desc.Hostnames = append(desc.Hostnames, f.Hostname)
		hosts = append(hosts, f.Hostname, "*."+suffix)
	}
	slices.Sort(desc.Hostnames[1:]) // the local hostname first
	desc.Hostnames = slices.Compact(desc.Hostnames)
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	for _, o := range out.Objects() {
		if hasParent(o, parents) && relates(o, d, hosts) {
			desc.Outputs = append(desc.Outputs, ref(o))
		}
	}
	return desc, nil
}

// relates decides whether an output object concerns Destination d: its spec
// names one of d's hostnames (a wildcard only in d's cluster), or it sits in
// d's cluster and either selects
// d's workloads in d's namespace or selects no workload and names no host
// (a mesh-wide object such as a PeerAuthentication).
func relates(o *translation.Object, d *discoveryv1alpha1.Destination, hosts []string) bool {
	spec, _ := o.Object.Object["spec"].(map[string]any)
	b, _ := json.Marshal(spec)
	ks := d.Spec.KubeService
	local := o.Cluster == ks.Ref.ClusterName
	for _, h := range hosts {
		q, _ := json.Marshal(h)
		// A wildcard (a passthrough Gateway's *.<suffix>) concerns d only
		// in d's own cluster, where it lets d's federated traffic in.
		if strings.Contains(string(b), string(q)) && (local || !strings.HasPrefix(h, "*.")) {
			return true
		}
	}
	if !local {
		return false
	}
	if _, named := spec["hosts"]; named {
		return false
	}
	if _, named := spec["host"]; named {
		return false
	}
	sel, hasSel := spec["selector"].(map[string]any)
	if !hasSel {
		return true
	}
	labels, _ := sel["matchLabels"].(map[string]any)
	if labels == nil || o.Object.GetNamespace() != ks.Ref.Namespace || len(labels) != len(ks.WorkloadSelectorLabels) {
		return false
	}
	for k, v := range ks.WorkloadSelectorLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// DescribeWorkload describes the Workload object named name.
func DescribeWorkload(in *translation.Input, r *translation.Report, name string) (*WorkloadDescription, error) {
	var w *discoveryv1alpha1.Workload
	names := make([]string, 0, len(in.Workloads))
	for i := range in.Workloads {
		names = append(names, in.Workloads[i].Name)
		if in.Workloads[i].Name == name {
			w = &in.Workloads[i]
		}
	}
	if w == nil {
		return nil, notFound("workload", name, names)
	}
	k := w.Spec.Kubernetes
	sa := cmp.Or(k.ServiceAccountName, "default")
	desc := &WorkloadDescription{Name: w.Name, Controller: k.Controller, ControllerKind: k.Kind, ServiceAccount: sa, Mesh: w.Spec.Mesh.Name,
		Traffic: []AppliedPolicy{}, Access: []AppliedPolicy{}}
	for _, p := range translation.SortedTrafficPolicies(in.TrafficPolicies) {
		if translation.MatchWorkload(p.Spec.SourceSelector, w) {
			desc.Traffic = append(desc.Traffic, applied(r, translation.KindTrafficPolicy, p.Namespace, p.Name, ""))
		}
	}
	for _, p := range sortedBy(in.AccessPolicies, func(p *networkingv1alpha1.AccessPolicy) string { return p.Namespace + "/" + p.Name }) {
		if translation.MatchIdentity(p.Spec.SourceSelector, k.Controller.ClusterName, k.Controller.Namespace, sa) {
			desc.Access = append(desc.Access, applied(r, translation.KindAccessPolicy, p.Namespace, p.Name, ""))
		}
	}
	return desc, nil
}

// DescribePolicy describes the user object kind/namespace/name (kind as
// returned by PolicyKind).
func DescribePolicy(in *translation.Input, out *translation.Output, r *translation.Report, kind, namespace, name string) (*PolicyDescription, error) {
	var (
		found     bool
		names     []string
		destSel   func(*discoveryv1alpha1.Destination) bool
		sourceSel func(*discoveryv1alpha1.Workload) bool
		meshes    []string
	)
	switch kind {
	case translation.KindTrafficPolicy:
		for i := range in.TrafficPolicies {
			p := &in.TrafficPolicies[i]
			names = append(names, p.Namespace+"/"+p.Name)
			if p.Namespace == namespace && p.Name == name {
				found = true
				destSel = func(d *discoveryv1alpha1.Destination) bool {
					return translation.MatchDestination(p.Spec.DestinationSelector, d)
				}
				sourceSel = func(w *discoveryv1alpha1.Workload) bool { return translation.MatchWorkload(p.Spec.SourceSelector, w) }
			}
		}
	case translation.KindAccessPolicy:
		for i := range in.AccessPolicies {
			p := &in.AccessPolicies[i]
			names = append(names, p.Namespace+"/"+p.Name)
			if p.Namespace == namespace && p.Name == name {
				found = true
				destSel = func(d *discoveryv1alpha1.Destination) bool {
					return translation.MatchDestination(p.Spec.DestinationSelector, d)
				}
				sourceSel = func(w *discoveryv1alpha1.Workload) bool {
					k := w.Spec.Kubernetes
					return translation.MatchIdentity(p.Spec.SourceSelector, k.Controller.ClusterName, k.Controller.Namespace, cmp.Or(k.ServiceAccountName, "default"))
				}
			}
		}
	case translation.KindVirtualMesh:
		for i := range in.VirtualMeshes {
			vm := &in.VirtualMeshes[i]
			names = append(names, vm.Namespace+"/"+vm.Name)
			if vm.Namespace == namespace && vm.Name == name {
				found = true
				plan := federation.NewPlan(in)
				destSel = func(d *discoveryv1alpha1.Destination) bool {
					owner, to := plan.FederatedTo(d)
					return owner != nil && owner.Namespace == vm.Namespace && owner.Name == vm.Name && len(to) > 0
				}
				for _, m := range vm.Spec.Meshes {
					meshes = append(meshes, translation.MeshRefString(m))
				}
			}
		}
	case translation.KindVirtualDestination:
		for i := range in.VirtualDestinations {
			vd := &in.VirtualDestinations[i]
			names = append(names, vd.Namespace+"/"+vd.Name)
			if vd.Namespace == namespace && vd.Name == name {
				found = true
				destSel = func(d *discoveryv1alpha1.Destination) bool { return backs(vd, d) }
			}
		}
	default:
		return nil, fmt.Errorf("%w %q", translation.ErrUnknownKind, kind)
	}
	if !found {
		return nil, notFound(strings.ToLower(kind), namespace+"/"+name, names)
	}
	desc := &PolicyDescription{AppliedPolicy: applied(r, kind, namespace, name, ""), Meshes: meshes, Destinations: []string{}}
	if st, targets, ok := r.Status(translation.ObjectKey{Kind: kind, Namespace: namespace, Name: name}); ok {
		desc.ObservedGeneration, desc.Targets = st.ObservedGeneration, targets
	}
	for i := range in.Destinations {
		if destSel(&in.Destinations[i]) {
			desc.Destinations = append(desc.Destinations, in.Destinations[i].Name)
		}
	}
	slices.Sort(desc.Destinations)
	if sourceSel != nil {
		desc.Workloads = []string{}
		for i := range in.Workloads {
			if sourceSel(&in.Workloads[i]) {
				desc.Workloads = append(desc.Workloads, in.Workloads[i].Name)
			}
		}
		slices.Sort(desc.Workloads)
	}
	self := map[string]bool{kind + "/" + namespace + "/" + name: true}
	desc.Outputs = []ClusterOutputs{}
	for _, o := range out.Objects() { // sorted by cluster first
		if !hasParent(o, self) {
			continue
		}
		if n := len(desc.Outputs); n == 0 || desc.Outputs[n-1].Cluster != o.Cluster {
			desc.Outputs = append(desc.Outputs, ClusterOutputs{Cluster: o.Cluster})
		}
		last := &desc.Outputs[len(desc.Outputs)-1]
		last.Objects = append(last.Objects, ref(o))
	}
	return desc, nil
}

// meshNames names meshes by their control plane, `<cluster>/<namespace>/<name>`, sorted.
func meshNames(meshes []*discoveryv1alpha1.Mesh) []string {
	out := make([]string, 0, len(meshes))
	for _, m := range meshes {
		inst := m.Spec.Istio.Installation
		out = append(out, translation.MeshRefString(common.ClusterObjectRef{ClusterName: inst.Cluster, Namespace: inst.Namespace, Name: inst.Name}))
	}
	slices.Sort(out)
	return out
}

// backs reports whether d backs a VirtualDestination.
func backs(vd *networkingv1alpha1.VirtualDestination, d *discoveryv1alpha1.Destination) bool {
	if s := vd.Spec.Static; s != nil {
		return slices.Contains(s.Destinations, d.Spec.KubeService.Ref)
	}
	if l := vd.Spec.Localized; l != nil {
		return translation.MatchDestination(l.DestinationSelectors, d)
	}
	return false
}

func applied(r *translation.Report, kind, namespace, name, target string) AppliedPolicy {
	a := AppliedPolicy{Kind: kind, Namespace: namespace, Name: name, State: "NotTranslated"}
	st, targets, ok := r.Status(translation.ObjectKey{Kind: kind, Namespace: namespace, Name: name})
	if !ok {
		return a
	}
	a.State, a.Errors, a.InForce = string(st.State), st.Errors, st.State == common.StateAccepted
	for i := range targets {
		if target != "" && targets[i].Target == target {
			t := targets[i]
			a.Target = &t
		}
	}
	return a
}

func hasParent(o *translation.Object, set map[string]bool) bool {
	for _, p := range o.Parents {
		if set[p.String()] {
			return true
		}
	}
	return false
}

func ref(o *translation.Object) OutputRef {
	r := OutputRef{Cluster: o.Cluster, APIVersion: o.Object.GetAPIVersion(), Kind: o.Object.GetKind(),
		Namespace: o.Object.GetNamespace(), Name: o.Object.GetName(), Parents: []string{}}
	for _, p := range o.Parents {
		r.Parents = append(r.Parents, p.String())
	}
	return r
}

// notFound lists the names that share name's first dash-separated word (or
// of which name is a prefix).
func notFound(what, name string, names []string) error {
	word, _, _ := strings.Cut(name, "-")
	if ns, rest, ok := strings.Cut(name, "/"); ok {
		word, _, _ = strings.Cut(rest, "-")
		word = ns + "/" + word
	}
	var similar []string
	for _, n := range names {
		if strings.HasPrefix(n, word) || strings.HasPrefix(n, name) {
			similar = append(similar, n)
		}
	}
	slices.Sort(similar)
	return &NotFoundError{What: what, Name: name, Similar: slices.Compact(similar)}
}

func sortedBy[T any](xs []T, key func(*T) string) []*T {
	out := make([]*T, len(xs))
	for i := range xs {
		out[i] = &xs[i]
	}
	slices.SortFunc(out, func(a, b *T) int { return cmp.Compare(key(a), key(b)) })
	return out
}
