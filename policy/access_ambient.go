package policy

import (
	"fmt"
	"slices"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"google.golang.org/protobuf/proto"
	securityv1 "istio.io/api/security/v1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

// Suffixes of the ambient AuthorizationPolicies of a Destination. A Service
// name is a DNS label (no '.'), so relaymesh-<svc>.ztunnel never equals the
// sidecar object relaymesh-<other svc> of any Service.
const (
	ztunnelSuffix  = ".ztunnel"
	waypointSuffix = ".waypoint"
)

// NeedsWaypoint starts the error an AccessPolicy's target gets where it asks
// for HTTP conditions at ambient workloads no usable waypoint serves (it
// allows no one there); policy/accessaudit reads it from the report.
const NeedsWaypoint = "needs a waypoint"

// ambientAccess collects one ambient Destination's AuthorizationPolicies
// (see docs/design/2026-12-02-ambient-translation.md): L4 rules for
// ztunnel, full rules for the waypoint that serves the Destination, and
// the waypoint's identity admitted at ztunnel.
type ambientAccess struct {
	d        *discoveryv1alpha1.Destination
	waypoint *discoveryv1alpha1.WaypointInfo // nil: none usable
	// principal is the waypoint's SPIFFE principal; noWaypoint says why
	// there is none.
	principal, noWaypoint string

	ztunnel, waypointRules []*securityv1.Rule
	// The waypoint is admitted at ztunnel on waypointPorts, or on every
	// port when a policy names none.
	admitted, anyPort bool
	waypointPorts     []int32
}

func newAmbientAccess(in *translation.Input, d *discoveryv1alpha1.Destination) *ambientAccess {
	a := &ambientAccess{d: d}
	a.waypoint, a.principal, a.noWaypoint = translation.ServingWaypoint(in, d)
	return a
}

// add places one AccessPolicy's rule, whose sources resolved to principals.
// It returns an error for the policy's status when the policy cannot be
// enforced at this Destination's ambient workloads.
func (a *ambientAccess) add(p *networkingv1alpha1.AccessPolicy, principals []string) string {
	rule := accessRule(p, principals)
	l7 := len(p.Spec.AllowedPaths)+len(p.Spec.AllowedMethods) > 0
	if a.waypoint != nil {
		// Traffic through the waypoint reaches ztunnel as the waypoint:
		// every policy is enforced there, and ztunnel admits the waypoint
		// on the policy's ports.
		a.waypointRules = append(a.waypointRules, rule)
		a.admitWaypoint(p)
	}
	if !l7 {
		// Pure L4 also holds for traffic that bypasses the waypoint
		// (straight to a pod IP): ztunnel can enforce it itself.
		a.ztunnel = appendUnique(a.ztunnel, rule)
		return ""
	}
	if a.waypoint == nil {
		var fields []string
		if len(p.Spec.AllowedMethods) > 0 {
			fields = append(fields, "allowedMethods")
		}
		if len(p.Spec.AllowedPaths) > 0 {
			fields = append(fields, "allowedPaths")
		}
		return fmt.Sprintf(NeedsWaypoint+": ztunnel cannot enforce %s (HTTP) for the ambient workloads of this Destination, and %s; this policy allows no one there", strings.Join(fields, " and "), a.noWaypoint)
	}
	return ""
}

// admitWaypoint admits, at ztunnel, the waypoint on p's ports. Their union
// is enough there: which source may use which port is checked at the
// waypoint.
func (a *ambientAccess) admitWaypoint(p *networkingv1alpha1.AccessPolicy) {
	a.admitted = true
	if len(p.Spec.AllowedPorts) == 0 {
		a.anyPort = true
	}
	for _, port := range p.Spec.AllowedPorts {
		if !slices.Contains(a.waypointPorts, port) {
			a.waypointPorts = append(a.waypointPorts, port)
		}
	}
}

// waypointRule is the ztunnel rule that admits the waypoint, or nil.
func (a *ambientAccess) waypointRule() *securityv1.Rule {
	if !a.admitted {
		return nil
	}
	l4 := &networkingv1alpha1.AccessPolicy{}
	if !a.anyPort {
		l4.Spec.AllowedPorts = slices.Sorted(slices.Values(a.waypointPorts))
	}
	return accessRule(l4, []string{a.principal})
}

func appendUnique(rules []*securityv1.Rule, r *securityv1.Rule) []*securityv1.Rule {
	if slices.ContainsFunc(rules, func(have *securityv1.Rule) bool { return proto.Equal(have, r) }) {
		return rules
	}
	return append(rules, r)
}

// emit adds the ztunnel policy (always: with no rule it allows no one, as
// the sidecar policy does) and, when a waypoint serves the Destination, the
// waypoint policy.
func (a *ambientAccess) emit(out *translation.Output, parents []translation.Parent) error {
	ks := a.d.Spec.KubeService
	rules := a.ztunnel
	if r := a.waypointRule(); r != nil {
		rules = append([]*securityv1.Rule{r}, rules...)
	}
	ztunnel := &securityv1.AuthorizationPolicy{
		Selector: &typev1beta1.WorkloadSelector{MatchLabels: ks.WorkloadSelectorLabels},
		Action:   securityv1.AuthorizationPolicy_ALLOW,
		Rules:    rules,
	}
	if err := out.Add(ks.Ref.ClusterName, securityAPIVersion, "AuthorizationPolicy", ks.Ref.Namespace, namePrefix+ks.Ref.Name+ztunnelSuffix, ztunnel, parents...); err != nil {
		return err
	}
	if a.waypoint == nil {
		return nil
	}
	waypoint := &securityv1.AuthorizationPolicy{
		TargetRefs: []*typev1beta1.PolicyTargetReference{{Group: "", Kind: "Service", Name: ks.Ref.Name}},
		Action:     securityv1.AuthorizationPolicy_ALLOW,
		Rules:      a.waypointRules,
	}
	return out.Add(ks.Ref.ClusterName, securityAPIVersion, "AuthorizationPolicy", ks.Ref.Namespace, namePrefix+ks.Ref.Name+waypointSuffix, waypoint, parents...)
}

// destinationModes says which enforcement points read a Destination's
// access policy: sidecars (also when discovery said nothing: agents before
// ambient), ztunnel and waypoints, or both during a migration.
func destinationModes(d *discoveryv1alpha1.Destination) (sidecar, ambient bool) {
	switch d.Spec.KubeService.DataPlaneMode {
	case discoveryv1alpha1.DataPlaneAmbient:
		return false, true
	case discoveryv1alpha1.DataPlaneMixed:
		return true, true
	}
	return true, false
}

// failAmbient marks a target Failed with msg.
func failAmbient(ts *common.TargetStatus, msg string) {
	ts.State = common.StateFailed
	ts.Errors = append(ts.Errors, msg)
}
