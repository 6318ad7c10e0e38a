package all

import (
	"fmt"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
)

// Translate runs every translator over in. Policies outside adminNamespace
// are scoped to their own namespace first (ScopePolicies).
func Translate(in *translation.Input, adminNamespace string) (*translation.Output, *translation.Report) {
	out, r := translation.NewOutput(), translation.NewReport()
	in = ScopePolicies(in, adminNamespace, r)
	federation.Translate(in, out, r)
	hostnames := federation.TranslateVirtualDestinationsHostnames(in, out, r)
	policy.TranslateHostnameAccess(in, hostnames, out, r)
	policy.TranslateAccess(in, out, r)
	policy.TranslateTraffic(in, out, r)
	r.WarnUntargeted("TrafficPolicy", "AccessPolicy")
	return out, r
}

// ScopePolicies enforces namespace tenancy: a TrafficPolicy or AccessPolicy
// in the admin namespace (the server's) may select anything; one in any other
// namespace may only select, shift to and mirror to Services of its own
// namespace. A policy that reaches further is Invalid, naming what it may not
// target, and is left out of translation. It returns the input translation
// should use (in itself when nothing was removed).
func ScopePolicies(in *translation.Input, adminNamespace string, r *translation.Report) *translation.Input {
	var dests []*discoveryv1alpha1.Destination // sorted on first use: the first foreign one is named
	foreign := func(policyNS string, sels []common.DestinationSelector) string {
		if dests == nil {
			dests = translation.SortedDestinations(in.Destinations)
		}
		for _, d := range dests {
			if ns := d.Spec.KubeService.Ref.Namespace; ns != policyNS && translation.MatchDestination(sels, d) {
				return fmt.Sprintf("Service %s/%s in cluster %s", ns, d.Spec.KubeService.Ref.Name, d.Spec.KubeService.Ref.ClusterName)
			}
		}
		return ""
	}
	scoped := *in
	scoped.TrafficPolicies, scoped.AccessPolicies = nil, nil
	for _, p := range in.TrafficPolicies {
		bad := ""
		if p.Namespace != adminNamespace {
			bad = foreign(p.Namespace, p.Spec.DestinationSelector)
			if ts := p.Spec.Policy.TrafficShift; bad == "" && ts != nil {
				for _, d := range ts.Destinations {
					if d.KubeService != nil && d.KubeService.Namespace != p.Namespace {
						bad = fmt.Sprintf("traffic shift target %s/%s", d.KubeService.Namespace, d.KubeService.Name)
						break
					}
				}
			}
			if m := p.Spec.Policy.Mirror; bad == "" && m != nil && m.KubeService.Namespace != p.Namespace {
				bad = fmt.Sprintf("mirror target %s/%s", m.KubeService.Namespace, m.KubeService.Name)
			}
		}
		if bad != "" {
			r.Invalid(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: p.Namespace, Name: p.Name}, p.Generation,
				"a policy in namespace %s may only target Services in %s (or be created in %s): it reaches %s", p.Namespace, p.Namespace, adminNamespace, bad)
			continue
		}
		scoped.TrafficPolicies = append(scoped.TrafficPolicies, p)
	}
	for _, p := range in.AccessPolicies {
		if p.Namespace != adminNamespace {
			if bad := foreign(p.Namespace, p.Spec.DestinationSelector); bad != "" {
				r.Invalid(translation.ObjectKey{Kind: "AccessPolicy", Namespace: p.Namespace, Name: p.Name}, p.Generation,
					"a policy in namespace %s may only target Services in %s (or be created in %s): it reaches %s", p.Namespace, p.Namespace, adminNamespace, bad)
				continue
			}
		}
		scoped.AccessPolicies = append(scoped.AccessPolicies, p)
	}
	return &scoped
}
