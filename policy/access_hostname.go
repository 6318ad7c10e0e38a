package policy

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/translation"
	"google.golang.org/protobuf/proto"
	securityv1 "istio.io/api/security/v1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

// hostnameSuffix ends the name of a VirtualDestination hostname's waypoint
// policy: relaymesh-vd-<name>-<ns>.hostname. No Service's policy ends so
// (theirs end .ztunnel or .waypoint, or have no dot).
const hostnameSuffix = ".hostname"

// TranslateHostnameAccess writes, for each ambient VirtualDestination
// hostname (federation.TranslateVirtualDestinationsHostnames), the access
// rules of its backend's waypoint on the hostname's ServiceEntry: a
// waypoint applies to a ServiceEntry's filter chain only the policies that
// target that ServiceEntry, so without this the hostname would reach the
// Service past every AccessPolicy that selects it (its route sends to the
// Service's cluster, and the pods' ztunnel admits the waypoint).
//
// The rules are the ones TranslateAccess gives the Service's waypoint, from
// the same AccessPolicies (in must be the input TranslateAccess gets: the
// policies scoped and admitted), with each port condition moved from the
// Service's port to the hostname's: a rule for other ports of the Service
// does not apply to the hostname. A backend no AccessPolicy selects gets no
// policy here either (the Service has none: a VirtualMesh's
// globalAccessPolicy denies both at the waypoint's GatewayClass); one whose
// policies admit no source gets an ALLOW without rules, which admits no one.
// A hostname whose policy cannot be written is taken out of out, and the
// VirtualDestination's target for the backend fails saying so.
func TranslateHostnameAccess(in *translation.Input, hostnames []federation.AmbientHostname, out *translation.Output, r *translation.Report) {
	policies := sortedAccessPolicies(in.AccessPolicies)
	sources := map[int][]string{} // resolved on first use
	for _, h := range hostnames {
		amb := newAmbientAccess(in, h.Backend)
		if amb.waypoint == nil {
			// The VirtualDestination is invalid without one, so this is not
			// reached; were it, no rule could be placed: not published.
			h.Unpublish(out)
			r.FailTarget(translation.ObjectKey{Kind: h.Parent.Kind, Namespace: h.Parent.Namespace, Name: h.Parent.Name}, translation.DestinationTarget(h.Backend),
				fmt.Sprintf("the hostname is not published in %s: %s", h.Cluster, amb.noWaypoint))
			continue
		}
		parents := []translation.Parent{h.Parent}
		for i, p := range policies {
			if !translation.MatchDestination(p.Spec.DestinationSelector, h.Backend) {
				continue
			}
			parents = append(parents, translation.Parent{Kind: accessPolicyKind, Namespace: p.Namespace, Name: p.Name})
			principals, ok := sources[i]
			if !ok {
				principals = resolveSources(in, p.Spec.SourceSelector).principals
				sources[i] = principals
			}
			if len(principals) > 0 {
				amb.add(p, principals)
			}
		}
		if len(parents) == 1 {
			continue // no AccessPolicy selects the Service
		}
		spec := &securityv1.AuthorizationPolicy{
			TargetRefs: []*typev1beta1.PolicyTargetReference{{Group: "networking.istio.io", Kind: "ServiceEntry", Name: h.ServiceEntry}},
			Action:     securityv1.AuthorizationPolicy_ALLOW,
			Rules:      hostnameRules(amb.waypointRules, h.BackendPort, h.Port),
		}
		if err := out.Add(h.Cluster, securityAPIVersion, "AuthorizationPolicy", h.Namespace, h.ServiceEntry+hostnameSuffix, spec, parents...); err != nil {
			// Never reached (the name is the VirtualDestination's own);
			// were it, the hostname goes rather than stay without rules.
			h.Unpublish(out)
			r.FailTarget(translation.ObjectKey{Kind: h.Parent.Kind, Namespace: h.Parent.Namespace, Name: h.Parent.Name}, translation.DestinationTarget(h.Backend),
				fmt.Sprintf("the hostname is not published in %s: its access rules could not be written: %v", h.Cluster, err))
		}
	}
}

// hostnameRules are the Service's waypoint rules for the hostname: a rule
// without a port condition as it is; one whose ports include the Service's
// port the hostname routes to, with the hostname's port instead; any other
// dropped.
func hostnameRules(rules []*securityv1.Rule, servicePort, hostnamePort uint32) []*securityv1.Rule {
	from, to := strconv.FormatUint(uint64(servicePort), 10), strconv.FormatUint(uint64(hostnamePort), 10)
	var out []*securityv1.Rule
	for _, r := range rules {
		r = proto.Clone(r).(*securityv1.Rule)
		keep := true
		for _, t := range r.To {
			if op := t.GetOperation(); op != nil && len(op.Ports) > 0 {
				if !slices.Contains(op.Ports, from) {
					keep = false
					break
				}
				op.Ports = []string{to}
			}
		}
		if keep {
			out = appendUnique(out, r)
		}
	}
	return out
}
