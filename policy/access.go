package policy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	securityv1 "istio.io/api/security/v1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

// Kinds and API versions of the objects this package reads and writes.
const (
	accessPolicyKind  = "AccessPolicy"
	trafficPolicyKind = "TrafficPolicy"

	securityAPIVersion   = "security.istio.io/v1"
	networkingAPIVersion = "networking.istio.io/v1"

	// namePrefix starts the name of every output object:
	// relaymesh-<service>, in the Destination's namespace.
	namePrefix = "relaymesh-"

	// defaultServiceAccount is the account of pods that name none.
	defaultServiceAccount = "default"
)

// TranslateAccess turns AccessPolicies into one ALLOW AuthorizationPolicy per
// selected Destination, in the Destination's cluster and namespace, with one
// rule per AccessPolicy (ordered by namespace and name).
//
// Decisions:
//   - An omitted sourceSelector allows every discovered Workload identity
//     (of every mesh; VirtualMesh membership is not consulted yet).
//   - An AccessPolicy whose sources match no Workload contributes no rule
//     (an empty `from` would allow everyone) and its per-Destination status
//     says so. A Destination whose every AccessPolicy matched no source still
//     gets its AuthorizationPolicy, with no rules: in Istio that allows
//     nothing, which is what the policies asked for (fail closed).
//   - An AccessPolicy that selects no Destination is Accepted with no
//     per-Destination status: it is valid and simply applies nowhere yet.
//   - A Destination selected by no AccessPolicy gets no AuthorizationPolicy
//     (no implicit deny; deny-by-default is the VirtualMesh's
//     globalAccessPolicy).
//   - A Workload whose Mesh is not discovered, or has no trust domain,
//     cannot be named as a principal; it is skipped and the policy's
//     per-Destination status lists it.
//   - spiffeIDs name identities of foreign SPIFFE trust domains (Istio's
//     principal is the ID without "spiffe://"). A Destination admits one
//     only when its valid VirtualMesh names the trust domain in
//     spec.mtls.federatedTrustDomains (so its meshes hold the foreign
//     roots, cross-certified) and no discovered mesh has it; its status says
//     why another is not admitted. Ambient workloads admit none (ztunnel
//     trusts one root).
//   - A Destination whose workloads run in ambient mode (or mixed, during a
//     migration) also gets the ambient objects of access_ambient.go: L4
//     rules at ztunnel, every rule at its waypoint, never an HTTP rule in
//     a selector policy (docs/design/2026-12-02-ambient-translation.md).
//     An ambient-only Destination gets no sidecar-era object.
func TranslateAccess(in *translation.Input, out *translation.Output, r *translation.Report) {
	policies := sortedAccessPolicies(in.AccessPolicies)
	for _, p := range policies {
		r.Accept(accessKey(p), p.Generation)
	}
	sources := make([]accessSources, len(policies))
	var plan *federation.Plan // built once, if a policy names a foreign identity
	for i, p := range policies {
		sources[i] = resolveSources(in, p.Spec.SourceSelector)
		r.Workloads(accessKey(p), sources[i].workloads...)
		if len(sources[i].foreign) > 0 && plan == nil {
			plan = federation.NewPlan(in)
		}
	}
	for _, d := range translation.SortedDestinations(in.Destinations) {
		ks := d.Spec.KubeService
		if ks.Ref.Name == "" || ks.Ref.Namespace == "" || ks.Ref.ClusterName == "" {
			continue // not enough to place an output; discovery never sends this
		}
		var (
			rules   []*securityv1.Rule
			parents []translation.Parent
			amb     *ambientAccess
		)
		sidecar, ambient := destinationModes(d)
		if ambient {
			amb = newAmbientAccess(in, d)
		}
		for i, p := range policies {
			if !translation.MatchDestination(p.Spec.DestinationSelector, d) {
				continue
			}
			key := accessKey(p)
			parents = append(parents, translation.Parent{Kind: accessPolicyKind, Namespace: p.Namespace, Name: p.Name})
			ts := common.TargetStatus{Target: translation.DestinationTarget(d), State: common.StateAccepted, Errors: slices.Clone(sources[i].skipped)}
			workloads, foreign := sources[i].principals, []string(nil)
			if len(sources[i].foreign) > 0 {
				var errs []string
				foreign, errs = admitForeign(plan, in, d, sources[i].foreign)
				ts.Errors = append(ts.Errors, errs...)
			}
			if len(workloads)+len(foreign) == 0 {
				msg := "sourceSelector matches no workload: this policy allows no one"
				if len(sources[i].foreign) > 0 {
					msg = "sourceSelector matches no workload and admits no foreign identity here: this policy allows no one"
				}
				ts.Errors = append(ts.Errors, msg)
			} else {
				rules = append(rules, accessRule(p, sortedUnion(workloads, foreign)))
				if amb != nil && len(workloads) > 0 {
					if msg := amb.add(p, workloads); msg != "" {
						failAmbient(&ts, msg)
					}
				}
				if amb != nil && len(foreign) > 0 {
					ts.Errors = append(ts.Errors, "spiffeIDs reach no ambient workload of this Destination (ztunnel trusts one root only, so no foreign trust domain is delivered to it)")
				}
			}
			r.Target(key, ts)
		}
		if len(parents) == 0 {
			continue
		}
		if amb != nil {
			if err := amb.emit(out, parents); err != nil {
				failed(r, parents, d, err)
			}
		}
		if !sidecar {
			continue
		}
		spec := &securityv1.AuthorizationPolicy{
			Selector: &typev1beta1.WorkloadSelector{MatchLabels: ks.WorkloadSelectorLabels},
			Action:   securityv1.AuthorizationPolicy_ALLOW,
			Rules:    rules,
		}
		if err := out.Add(ks.Ref.ClusterName, securityAPIVersion, "AuthorizationPolicy", ks.Ref.Namespace, namePrefix+ks.Ref.Name, spec, parents...); err != nil {
			failed(r, parents, d, err)
		}
	}
}

// failParents reports err on every policy of a Destination whose output
// could not be added: two Destinations with the same cluster, namespace and
// name are discovery's bug, but every policy involved says so.
// accessSources are the principals an IdentitySelector list resolves to.
type accessSources struct {
	principals []string // sorted, unique
	skipped    []string // workloads (and spiffeIDs) that could not be named, sorted
	workloads  []string // the Workloads selected
	// foreign are the spiffeIDs named, sorted, unique: admitted per
	// Destination (admitForeign).
	foreign []foreignID
}

// ForeignPrincipal parses an AccessPolicy's spiffeIDs entry as
// TranslateAccess does: its trust domain and Istio's principal for it
// (the ID without "spiffe://"), or why it names no workload.
func ForeignPrincipal(id string) (trustDomain, principal string, err error) {
	f, err := parseForeignID(id)
	return f.trustDomain, f.principal, err
}

// AdmitsForeign reports whether Destination d admits identities of
// trustDomain, as TranslateAccess decides (ambient workloads aside): d's
// VirtualMesh names it in spec.mtls.federatedTrustDomains and no
// discovered mesh has it.
func AdmitsForeign(plan *federation.Plan, in *translation.Input, d *discoveryv1alpha1.Destination, trustDomain string) bool {
	return foreignRefusal(plan, in, d, trustDomain) == ""
}

// foreignRefusal is why d admits no identity of trustDomain, or "".
func foreignRefusal(plan *federation.Plan, in *translation.Input, d *discoveryv1alpha1.Destination, trustDomain string) string {
	vm := plan.VirtualMeshOf(d)
	switch {
	case vm == nil:
		return "the Destination is in no valid VirtualMesh, so it trusts no foreign trust domain"
	case vm.Spec.MTLS == nil || vm.Spec.MTLS.Shared == nil:
		return fmt.Sprintf("VirtualMesh %s/%s has no shared trust (spec.mtls.shared), so no foreign root reaches its meshes", vm.Namespace, vm.Name)
	case FleetTrustDomain(in, trustDomain):
		return fmt.Sprintf("%s is this Relaymesh's own trust domain (a discovered mesh's, or granted to a registered cluster), not a foreign one (select its workloads with kubeServiceAccountRefs)", trustDomain)
	case !slices.Contains(vm.Spec.MTLS.FederatedTrustDomains, trustDomain):
		return fmt.Sprintf("trust domain %s is not in spec.mtls.federatedTrustDomains of VirtualMesh %s/%s", trustDomain, vm.Namespace, vm.Name)
	}
	return ""
}

// foreignID is a SPIFFE ID of a foreign trust domain an AccessPolicy names.
type foreignID struct {
	id          string // spiffe://td/path
	trustDomain string
	principal   string // Istio's form: td/path
}

// parseForeignID accepts a SPIFFE ID with a path and no wildcard (Istio
// reads a leading or trailing '*' in a principal as one).
func parseForeignID(s string) (foreignID, error) {
	id, err := spiffeid.FromString(s)
	switch {
	case err != nil:
		return foreignID{}, err
	case id.Path() == "":
		return foreignID{}, errors.New("names a whole trust domain, not a workload")
	case strings.Contains(s, "*"):
		return foreignID{}, errors.New("has a '*', which Istio would read as a wildcard")
	}
	td := id.TrustDomain().Name()
	return foreignID{id: id.String(), trustDomain: td, principal: td + id.Path()}, nil
}

// admitForeign returns the principals of the foreign identities d admits
// (sorted), and why each other one is not admitted: its trust domain must
// be one d's VirtualMesh names in spec.mtls.federatedTrustDomains, and no
// discovered mesh's own.
func admitForeign(plan *federation.Plan, in *translation.Input, d *discoveryv1alpha1.Destination, ids []foreignID) (principals, errs []string) {
	for _, f := range ids {
		if why := foreignRefusal(plan, in, d, f.trustDomain); why != "" {
			errs = append(errs, fmt.Sprintf("spiffeID %q: %s; not allowed", f.id, why))
			continue
		}
		principals = append(principals, f.principal)
	}
	return principals, errs
}

// FleetTrustDomain reports whether td is this Relaymesh's: a discovered
// mesh's, or granted to a registered cluster (compared without case, as
// name constraints are). Never a foreign one: the importer and the trust
// controller refuse those too.
func FleetTrustDomain(in *translation.Input, td string) bool {
	if slices.ContainsFunc(in.Meshes, func(m discoveryv1alpha1.Mesh) bool {
		return m.Spec.Istio != nil && strings.EqualFold(m.Spec.Istio.TrustDomain, td)
	}) {
		return true
	}
	for i := range in.Clusters {
		if slices.ContainsFunc(in.Clusters[i].Grant(), func(g multiclusterv1alpha1.TrustDomainGrant) bool { return strings.EqualFold(g.Name, td) }) {
			return true
		}
	}
	return false
}

// sortedUnion is the sorted union of two sorted lists without duplicates.
func sortedUnion(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// MatchAccessSource reports whether an AccessPolicy's sourceSelector sels
// selects w's identity (its cluster, namespace and service account, "default"
// when it names none).
func MatchAccessSource(sels []common.IdentitySelector, w *discoveryv1alpha1.Workload) bool {
	k := w.Spec.Kubernetes
	return translation.MatchIdentity(sels, k.Controller.ClusterName, k.Controller.Namespace, cmp.Or(k.ServiceAccountName, defaultServiceAccount))
}

func resolveSources(in *translation.Input, sels []common.IdentitySelector) accessSources {
	set := map[string]bool{}
	var skipped, workloads []string
	for i := range in.Workloads {
		w := &in.Workloads[i]
		if !MatchAccessSource(sels, w) {
			continue
		}
		workloads = append(workloads, w.Name)
		k := w.Spec.Kubernetes
		sa := cmp.Or(k.ServiceAccountName, defaultServiceAccount)
		mesh := in.MeshOf(w.Spec.Mesh)
		if mesh == nil || mesh.Spec.Istio == nil || mesh.Spec.Istio.TrustDomain == "" {
			skipped = append(skipped, fmt.Sprintf("workload %s/%s: mesh %q has no known trust domain; not allowed", w.Namespace, w.Name, w.Spec.Mesh.Name))
			continue
		}
		set[mesh.Spec.Istio.TrustDomain+"/ns/"+k.Controller.Namespace+"/sa/"+sa] = true
	}
	principals := make([]string, 0, len(set))
	for p := range set {
		principals = append(principals, p)
	}
	slices.Sort(principals)
	var foreign []foreignID
	for _, sel := range sels {
		for _, s := range sel.SpiffeIDs {
			f, err := parseForeignID(s)
			if err != nil {
				skipped = append(skipped, fmt.Sprintf("spiffeID %q: %v; not allowed", text.Truncate(s, 256), err))
				continue
			}
			foreign = append(foreign, f)
		}
	}
	slices.SortFunc(foreign, func(a, b foreignID) int { return strings.Compare(a.id, b.id) })
	foreign = slices.CompactFunc(foreign, func(a, b foreignID) bool { return a.id == b.id })
	slices.Sort(skipped)
	return accessSources{principals: principals, skipped: slices.Compact(skipped), workloads: workloads, foreign: foreign}
}

func accessRule(p *networkingv1alpha1.AccessPolicy, principals []string) *securityv1.Rule {
	rule := &securityv1.Rule{From: []*securityv1.Rule_From{{Source: &securityv1.Source{Principals: principals}}}}
	s := p.Spec
	if len(s.AllowedPaths)+len(s.AllowedMethods)+len(s.AllowedPorts) > 0 {
		op := &securityv1.Operation{
			Paths:   slices.Clone(s.AllowedPaths),
			Methods: slices.Clone(s.AllowedMethods),
		}
		for _, port := range s.AllowedPorts {
			op.Ports = append(op.Ports, strconv.Itoa(int(port)))
		}
		rule.To = []*securityv1.Rule_To{{Operation: op}}
	}
	return rule
}

func accessKey(p *networkingv1alpha1.AccessPolicy) translation.ObjectKey {
	return translation.ObjectKey{Kind: accessPolicyKind, Namespace: p.Namespace, Name: p.Name}
}

func sortedAccessPolicies(ps []networkingv1alpha1.AccessPolicy) []*networkingv1alpha1.AccessPolicy {
	out := make([]*networkingv1alpha1.AccessPolicy, len(ps))
	for i := range ps {
		out[i] = &ps[i]
	}
	slices.SortFunc(out, func(a, b *networkingv1alpha1.AccessPolicy) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}
