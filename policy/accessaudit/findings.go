package accessaudit

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
)

// Finding kinds.
const (
	// KindAllowsEveryone: an AccessPolicy with no sourceSelector, or one
	// that selects every workload.
	KindAllowsEveryone = "allows-everyone"
	// KindShadowed: every pair an AccessPolicy allows is allowed as broadly
	// by others, and every Destination it selects stays restricted without
	// it: removing it changes nothing.
	KindShadowed = "shadowed"
	// KindMatchesNothing: an AccessPolicy that selects no Destination, whose
	// sources match no workload (or none Istio can name), or that allows no
	// pair at all.
	KindMatchesNothing = "matches-nothing"
	// KindNotInForce: a user object the server does not translate — an
	// AccessPolicy or VirtualMesh translation reports Invalid, or any user
	// object the server reports Invalid — so what it asks for is not
	// enforced.
	KindNotInForce = "not-in-force"
	// KindRefused: a user object admission refuses (the server's rules,
	// policy/admission): the server does not translate it, and the
	// admission webhook refuses to store it.
	KindRefused = "refused-by-admission"
	// KindReachableOutside: Destinations reachable from outside their
	// VirtualMesh: open Destinations of a mesh without deny-by-default, and
	// policy grants to identities of meshes that are not members.
	KindReachableOutside = "reachable-outside-virtualmesh"
	// KindTrafficConflict: a TrafficPolicy translation refuses or fails
	// because it conflicts with another.
	KindTrafficConflict = "traffic-policy-conflict"
	// KindSharedPrincipal: identities Istio cannot tell apart (one
	// principal), so allowing one allows all of them.
	KindSharedPrincipal = "shared-principal"
	// KindUnreachableGrant: an AccessPolicy allows identities that have no
	// route to some of its Destinations (they are not in the matrix).
	KindUnreachableGrant = "unreachable-grant"
	// KindNeedsWaypoint: an AccessPolicy with allowedPaths or
	// allowedMethods selects a Destination whose workloads run in ambient
	// mode and that no usable waypoint serves: ztunnel cannot check HTTP,
	// so translation writes nothing of the policy there and it allows no
	// one at those workloads (a mixed Destination's sidecar pods still
	// admit its sources). The matrix leaves those pairs out.
	KindNeedsWaypoint = "needs-waypoint"
)

// Severities, most severe first.
const (
	SeverityHigh   = "high"
	SeverityMedium = "medium"
	SeverityLow    = "low"
	SeverityInfo   = "info"
)

var severityRank = map[string]int{SeverityHigh: 0, SeverityMedium: 1, SeverityLow: 2, SeverityInfo: 3}

// Finding is something an auditor should look at.
type Finding struct {
	Kind     string `json:"kind"`
	Severity string `json:"severity"`
	// Objects are `<Kind>/<namespace>/<name>` for user objects and Meshes,
	// `Destination/<id>` and `Source/<id>` for matrix entries; the first is
	// the subject.
	Objects []string `json:"objects"`
	Message string   `json:"message"`
}

// listed is how many names a message spells out before "and N more".
const listed = 5

func names(xs []string) string {
	if len(xs) <= listed {
		return strings.Join(xs, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(xs[:listed], ", "), len(xs)-listed)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func apObject(id string) string { return "AccessPolicy/" + id }

func (a *auditor) findings() []Finding {
	var fs []Finding
	add := func(kind, severity, msg string, objects ...string) {
		fs = append(fs, Finding{Kind: kind, Severity: severity, Objects: objects, Message: msg})
	}
	a.policyFindings(add)
	a.reachFindings(add)
	a.otherFindings(add)
	slices.SortFunc(fs, func(x, y Finding) int {
		return cmp.Or(cmp.Compare(severityRank[x.Severity], severityRank[y.Severity]), cmp.Compare(x.Kind, y.Kind),
			slices.Compare(x.Objects, y.Objects), cmp.Compare(x.Message, y.Message))
	})
	if fs == nil {
		fs = []Finding{}
	}
	return fs
}

func (a *auditor) destIDs(idx []int) []string {
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = a.dests[j].ID
	}
	return out
}

func prefixed(prefix string, xs []string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = prefix + x
	}
	return out
}

func (a *auditor) policyFindings(add func(kind, severity, msg string, objects ...string)) {
	shadowed := make([]bool, len(a.aps))
	for pi, ap := range a.aps {
		shadowed[pi] = ap.inForce && ap.granted > 0 && ap.uncovered == 0 && a.staysRestricted(pi)
	}
	for pi, ap := range a.aps {
		subject := apObject(ap.id)
		if !ap.inForce {
			kind, sev := KindNotInForce, SeverityMedium
			if slices.ContainsFunc(ap.errors, all.RefusedByAdmission) {
				kind, sev = KindRefused, SeverityHigh
			}
			add(kind, sev, fmt.Sprintf("AccessPolicy %s is Invalid and not enforced: %s; the Destinations it would select keep their default access",
				ap.id, strings.Join(ap.errors, "; ")), subject)
			continue
		}
		dests := a.destIDs(ap.dests)
		selected := plural(len(dests), "Destination", "Destinations")
		if len(dests) > 0 {
			selected += " (" + names(dests) + ")"
		}
		what := selected
		if len(ap.p.Spec.DestinationSelector) == 0 {
			what = "every Destination"
		}
		// allows-everyone
		if everyone := len(ap.p.Spec.SourceSelector) == 0; everyone || (ap.workloads == len(a.in.Workloads) && len(a.srcs) > 1) {
			why := "it has no sourceSelector, so every workload identity, present and future,"
			if !everyone {
				why = fmt.Sprintf("its sourceSelector selects all %d workloads, so every identity", len(a.in.Workloads))
			}
			sev, opt := SeverityHigh, ""
			if ap.p.Annotations[allowAllAnnotation] == "true" {
				sev, opt = SeverityMedium, " (opted in with "+allowAllAnnotation+")"
			}
			add(KindAllowsEveryone, sev, fmt.Sprintf("AccessPolicy %s allows everyone%s: %s may reach %s", ap.id, opt, why, what), subject)
		}
		// matches-nothing
		switch {
		case len(ap.dests) == 0:
			add(KindMatchesNothing, SeverityLow, fmt.Sprintf("AccessPolicy %s selects no Destination: it applies nowhere", ap.id), subject)
		case ap.workloads == 0 && len(ap.foreign) == 0:
			add(KindMatchesNothing, SeverityMedium, fmt.Sprintf("AccessPolicy %s: sourceSelector matches no workload, so it allows no one, yet the %s it selects %s only what other policies allow",
				ap.id, selected, acceptVerb(len(dests))), append([]string{subject}, prefixed("Destination/", dests)...)...)
		case len(ap.principal) == 0 && len(ap.foreign) == 0:
			add(KindMatchesNothing, SeverityMedium, fmt.Sprintf("AccessPolicy %s: the mesh of its %s has no known trust domain, so Istio cannot name them and it allows no one on %s",
				ap.id, plural(ap.workloads, "source workload", "source workloads"), selected), append([]string{subject}, prefixed("Destination/", dests)...)...)
		case ap.granted == 0:
			var why []string
			if ap.portMisses > 0 {
				why = append(why, "allowedPorts match none of the ports the selected pods listen on")
			}
			if ap.tcpDropped > 0 {
				why = append(why, "allowedPaths/allowedMethods on ports Istio treats as plain TCP, where such a rule is ignored")
			}
			if ap.noWaypoint > 0 {
				why = append(why, "its Destinations run in ambient mode without a waypoint to check allowedPaths/allowedMethods (see the needs-waypoint finding)")
			}
			if len(ap.unreachable) > 0 {
				why = append(why, "its sources have no route to its Destinations")
			}
			add(KindMatchesNothing, SeverityLow, fmt.Sprintf("AccessPolicy %s allows nothing that can happen: %s", ap.id, strings.Join(why, "; ")),
				append([]string{subject}, prefixed("Destination/", dests)...)...)
		}
		// needs-waypoint
		a.needsWaypointFinding(ap, add)
		// unreachable-grant
		if ap.granted > 0 && len(ap.unreachable) > 0 {
			cols := slices.SortedFunc(maps.Keys(ap.unreachable), func(x, y column) int {
				return cmp.Or(cmp.Compare(x.dest, y.dest), cmp.Compare(x.port, y.port))
			})
			var ds, ports, srcs []string
			for _, c := range cols {
				ds = append(ds, a.dests[c.dest].ID)
				ports = append(ports, columnName(a.dests[c.dest].ID, c.port))
				for i := range ap.unreachable[c] {
					srcs = append(srcs, a.srcs[i].ID)
				}
			}
			ds = slices.Compact(ds)
			slices.Sort(srcs)
			srcs = slices.Compact(srcs)
			add(KindUnreachableGrant, SeverityInfo, fmt.Sprintf("AccessPolicy %s allows %s that cannot reach %s (no route: the destination port is neither in their cluster nor published there by a VirtualMesh or VirtualDestination): %s",
				ap.id, plural(len(srcs), "identity", "identities"), names(ports), names(srcs)), append([]string{subject}, prefixed("Destination/", ds)...)...)
		}
		// shadowed
		if shadowed[pi] {
			by := slices.Sorted(maps.Keys(ap.common))
			// Two policies that cover each other: report only the later
			// one, as shadowed by the earlier.
			by = slices.DeleteFunc(by, func(q int) bool { return q > pi && shadowed[q] && a.aps[q].common[pi] })
			together := ""
			if len(ap.common) == 0 {
				by, together = slices.Sorted(maps.Keys(ap.union)), " together"
			} else if len(by) == 0 {
				continue
			}
			ids := make([]string, len(by))
			for k, q := range by {
				ids[k] = a.aps[q].id
			}
			kind := "AccessPolicy"
			if len(ids) > 1 {
				kind = "AccessPolicies"
			}
			add(KindShadowed, SeverityLow, fmt.Sprintf("AccessPolicy %s is shadowed: the %s it allows %s also allowed, as broadly, by %s %s%s; removing it changes nothing",
				ap.id, plural(ap.granted, "pair", "pairs"), map[bool]string{true: "is", false: "are"}[ap.granted == 1], kind, strings.Join(ids, ", "), together),
				append([]string{subject}, prefixed("AccessPolicy/", ids)...)...)
		}
	}
}

// needsWaypointFinding reports the Destinations where ap's HTTP
// conditions need a waypoint that does not serve them: at their ambient
// workloads it allows no one.
func (a *auditor) needsWaypointFinding(ap *accessPolicy, add func(kind, severity, msg string, objects ...string)) {
	if len(ap.needsWaypoint) == 0 {
		return
	}
	idx := slices.Sorted(maps.Keys(ap.needsWaypoint))
	var parts []string
	for _, j := range idx {
		d := a.dests[j]
		part := fmt.Sprintf("at Destination %s (%s): %s", d.ID, cmp.Or(d.DataPlaneMode, "sidecar"), ap.needsWaypoint[j])
		if d.DataPlaneMode == discoveryv1alpha1.DataPlaneMixed {
			part += " (its pods that still have a sidecar admit them: the matrix keeps that pair)"
		}
		parts = append(parts, part)
	}
	add(KindNeedsWaypoint, SeverityHigh, fmt.Sprintf("AccessPolicy %s has allowedPaths/allowedMethods, which ztunnel cannot check; %s; its sources lose that access at the ambient workloads until a ready waypoint for service traffic serves the Service (label istio.io/use-waypoint)",
		ap.id, strings.Join(parts, "; ")), append([]string{apObject(ap.id)}, prefixed("Destination/", a.destIDs(idx))...)...)
}

// staysRestricted says whether every Destination policy pi selects would
// still be restricted without it.
func (a *auditor) staysRestricted(pi int) bool {
	for _, j := range a.aps[pi].dests {
		if d := a.dests[j]; !d.DenyByDefault && len(d.policies) < 2 {
			return false
		}
	}
	return true
}

func (a *auditor) reachFindings(add func(kind, severity, msg string, objects ...string)) {
	// Open Destinations, by mesh.
	open := map[string][]string{}
	vmOf := map[string]string{}
	for _, d := range a.dests {
		if d.Open() {
			open[d.Mesh] = append(open[d.Mesh], d.ID)
			vmOf[d.Mesh] = d.VirtualMesh
		}
	}
	for _, mesh := range slices.Sorted(maps.Keys(open)) {
		ds := open[mesh]
		objects := []string{"Mesh/" + mesh}
		var msg string
		if vm := vmOf[mesh]; vm != "" {
			objects = append(objects, "VirtualMesh/"+vm)
			msg = fmt.Sprintf("VirtualMesh %s does not have globalAccessPolicy Enabled: %s of mesh %s, selected by no AccessPolicy, %s any caller that can reach %s, including workloads outside %s and pods without a sidecar: %s",
				vm, plural(len(ds), "Destination", "Destinations"), mesh, acceptVerb(len(ds)), pronoun(len(ds)), vm, names(ds))
		} else {
			msg = fmt.Sprintf("mesh %s is in no valid VirtualMesh with globalAccessPolicy Enabled: %s, selected by no AccessPolicy, %s any caller that can reach %s, including workloads of other meshes and pods without a sidecar: %s",
				mesh, plural(len(ds), "Destination", "Destinations"), acceptVerb(len(ds)), pronoun(len(ds)), names(ds))
		}
		add(KindReachableOutside, SeverityMedium, msg, append(objects, prefixed("Destination/", ds)...)...)
	}
	// Policy grants to identities outside the Destination's VirtualMesh.
	for _, j := range slices.Sorted(maps.Keys(a.outside)) {
		d := a.dests[j]
		var srcs, policies []string
		for _, pi := range a.outside[j] {
			p := a.pairs[pi]
			srcs = append(srcs, p.Source)
			for _, g := range p.Grants {
				policies = append(policies, g.Policy)
			}
		}
		slices.Sort(srcs)
		srcs = slices.Compact(srcs)
		slices.Sort(policies)
		policies = slices.Compact(policies)
		objects := append([]string{"Destination/" + d.ID}, prefixed("AccessPolicy/", policies)...)
		objects = append(objects, prefixed("Source/", srcs)...)
		add(KindReachableOutside, SeverityMedium, fmt.Sprintf("Destination %s of VirtualMesh %s is allowed to %s of meshes outside it by %s: %s",
			d.ID, d.VirtualMesh, plural(len(srcs), "identity", "identities"), names(prefixed("AccessPolicy ", policies)), names(srcs)), objects...)
	}
}

func acceptVerb(n int) string {
	if n == 1 {
		return "accepts"
	}
	return "accept"
}

func pronoun(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}

// conflictPrefix starts the error policy.TranslateTraffic gives the later of
// two conflicting TrafficPolicies.
const conflictPrefix = "conflicts with TrafficPolicy "

func (a *auditor) otherFindings(add func(kind, severity, msg string, objects ...string)) {
	for _, k := range a.report.Keys() {
		st, targets, _ := a.report.Status(k)
		subject := k.Kind + "/" + k.Namespace + "/" + k.Name
		if k.Kind == translation.KindTrafficPolicy || k.Kind == translation.KindVirtualDestination {
			// Left out before translation (admission, or the server's own
			// verdict): what it asks for does not happen.
			if i := slices.IndexFunc(st.Errors, all.LeftOut); i >= 0 {
				kind, sev := KindNotInForce, SeverityMedium
				if all.RefusedByAdmission(st.Errors[i]) {
					kind, sev = KindRefused, SeverityHigh
				}
				add(kind, sev, fmt.Sprintf("%s %s/%s is not in force: %s", k.Kind, k.Namespace, k.Name, st.Errors[i]), subject)
				continue
			}
		}
		switch k.Kind {
		case translation.KindTrafficPolicy:
			for _, e := range st.Errors {
				if !strings.HasPrefix(e, conflictPrefix) {
					continue
				}
				objects := []string{subject}
				if other, _, ok := strings.Cut(strings.TrimPrefix(e, conflictPrefix), ":"); ok {
					objects = append(objects, "TrafficPolicy/"+other)
				}
				add(KindTrafficConflict, SeverityMedium, fmt.Sprintf("TrafficPolicy %s/%s is Invalid and not applied: %s", k.Namespace, k.Name, e), objects...)
			}
			for _, t := range targets {
				if t.State == common.StateFailed {
					add(KindTrafficConflict, SeverityMedium, fmt.Sprintf("TrafficPolicy %s/%s failed for Destination %s: %s", k.Namespace, k.Name, t.Target, strings.Join(t.Errors, "; ")),
						subject, "Destination/"+t.Target)
				}
			}
		case translation.KindVirtualMesh:
			if st.State != common.StateInvalid {
				continue
			}
			kind, sev, consequence := KindNotInForce, SeverityMedium, "its meshes are not federated by it"
			if vm := a.virtualMesh(k); vm != nil && vm.Spec.GlobalAccessPolicy == networkingv1alpha1.GlobalAccessEnabled {
				sev, consequence = SeverityHigh, "its globalAccessPolicy Enabled (deny by default) is not in force in a fresh translation"
			}
			if slices.ContainsFunc(st.Errors, all.RefusedByAdmission) {
				kind, sev = KindRefused, SeverityHigh
			}
			add(kind, sev, fmt.Sprintf("VirtualMesh %s/%s is Invalid: %s; %s", k.Namespace, k.Name, strings.Join(st.Errors, "; "), consequence), subject)
		}
	}
	// Shared principals.
	for _, pr := range slices.Sorted(maps.Keys(a.byPrincipal)) {
		idx := a.byPrincipal[pr]
		if len(idx) < 2 {
			continue
		}
		ids := make([]string, len(idx))
		for k, i := range idx {
			ids[k] = a.srcs[i].ID
		}
		add(KindSharedPrincipal, SeverityMedium, fmt.Sprintf("identities %s share the principal %s (same trust domain, namespace and service account): Istio cannot tell them apart, so a policy that allows one allows all of them",
			strings.Join(ids, ", "), pr), prefixed("Source/", ids)...)
	}
}

func (a *auditor) virtualMesh(k translation.ObjectKey) *networkingv1alpha1.VirtualMesh {
	for i := range a.in.VirtualMeshes {
		if vm := &a.in.VirtualMeshes[i]; vm.Namespace == k.Namespace && vm.Name == k.Name {
			return vm
		}
	}
	return nil
}
