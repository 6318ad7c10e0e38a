package policy

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
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
	for i, p := range policies {
		sources[i] = resolveSources(in, p.Spec.SourceSelector)
		r.Workloads(accessKey(p), sources[i].workloads...)
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
			if len(sources[i].principals) == 0 {
				ts.Errors = append(ts.Errors, "sourceSelector matches no workload: this policy allows no one")
			} else {
				rules = append(rules, accessRule(p, sources[i].principals))
				if amb != nil {
					if msg := amb.add(p, sources[i].principals); msg != "" {
						failAmbient(&ts, msg)
					}
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
	skipped    []string // workloads that could not be named, sorted
	workloads  []string // the Workloads selected
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
	slices.Sort(skipped)
	return accessSources{principals: principals, skipped: slices.Compact(skipped), workloads: workloads}
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
