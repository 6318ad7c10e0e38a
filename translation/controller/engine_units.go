package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
)

// index relates policies to the objects (Destinations, Workloads) their
// selectors select, both ways.
type index struct {
	fwd map[string]map[string]bool // policy → objects
	rev map[string]map[string]bool // object → policies
}

func newIndex() index {
	return index{fwd: map[string]map[string]bool{}, rev: map[string]map[string]bool{}}
}

func (x index) set(p, o string) {
	if x.fwd[p] == nil {
		x.fwd[p] = map[string]bool{}
	}
	if x.rev[o] == nil {
		x.rev[o] = map[string]bool{}
	}
	x.fwd[p][o], x.rev[o][p] = true, true
}

func (x index) dropPolicy(p string) {
	for o := range x.fwd[p] {
		delete(x.rev[o], p)
	}
	delete(x.fwd, p)
}

func (x index) dropObject(o string) {
	for p := range x.rev[o] {
		delete(x.fwd[p], o)
	}
	delete(x.rev, o)
}

// updateIndexes re-matches changed policies against every object and
// changed objects against every policy; removed ones leave the indexes.
func (e *Engine) updateIndexes(c *cycle) {
	for _, k := range c.removed {
		switch kind, _, _ := strings.Cut(k, "/"); kind {
		case "TrafficPolicy":
			e.tpDest.dropPolicy(k)
			e.tpWork.dropPolicy(k)
		case "AccessPolicy":
			e.apDest.dropPolicy(k)
			e.apWork.dropPolicy(k)
		case "Destination":
			e.tpDest.dropObject(k)
			e.apDest.dropObject(k)
		case "Workload":
			e.tpWork.dropObject(k)
			e.apWork.dropObject(k)
		}
	}
	rematch(e.tpDest, c.changed, c.tps, c.dests, func(p *networkingv1alpha1.TrafficPolicy, d *discoveryv1alpha1.Destination) bool {
		return translation.MatchDestination(p.Spec.DestinationSelector, d)
	})
	rematch(e.apDest, c.changed, c.aps, c.dests, func(p *networkingv1alpha1.AccessPolicy, d *discoveryv1alpha1.Destination) bool {
		return translation.MatchDestination(p.Spec.DestinationSelector, d)
	})
	rematch(e.tpWork, c.changed, c.tps, c.works, func(p *networkingv1alpha1.TrafficPolicy, w *discoveryv1alpha1.Workload) bool {
		return translation.MatchWorkload(p.Spec.SourceSelector, w)
	})
	rematch(e.apWork, c.changed, c.aps, c.works, func(p *networkingv1alpha1.AccessPolicy, w *discoveryv1alpha1.Workload) bool {
		return policy.MatchAccessSource(p.Spec.SourceSelector, w)
	})
}

// rematch updates one index: every changed policy is matched against every
// object, every changed object against every policy.
func rematch[P, O any](x index, changed map[string]bool, policies map[string]*P, objects map[string]*O, match func(*P, *O) bool) {
	for k := range changed {
		if p := policies[k]; p != nil {
			x.dropPolicy(k)
			for ok, o := range objects {
				if match(p, o) {
					x.set(k, ok)
				}
			}
		}
	}
	for k := range changed {
		if o := objects[k]; o != nil {
			x.dropObject(k)
			for pk, p := range policies {
				if match(p, o) {
					x.set(pk, k)
				}
			}
		}
	}
}

// scope applies namespace tenancy (ScopePolicies) to the policies outside
// the admin namespace, with the Destinations they select, and returns the
// keys of the policies it found Invalid (reported in r).
func (e *Engine) scope(c *cycle, r *translation.Report) map[string]bool {
	sub := &translation.Input{}
	dests := map[string]bool{}
	for _, k := range slices.Sorted(maps.Keys(c.tps)) {
		if p := c.tps[k]; p.Namespace != e.admin {
			sub.TrafficPolicies = append(sub.TrafficPolicies, *p)
			maps.Copy(dests, e.tpDest.fwd[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(c.aps)) {
		if p := c.aps[k]; p.Namespace != e.admin {
			sub.AccessPolicies = append(sub.AccessPolicies, *p)
			maps.Copy(dests, e.apDest.fwd[k])
		}
	}
	invalid := map[string]bool{}
	if len(sub.TrafficPolicies)+len(sub.AccessPolicies) == 0 {
		return invalid
	}
	for _, dk := range slices.Sorted(maps.Keys(dests)) {
		sub.Destinations = append(sub.Destinations, *c.dests[dk])
	}
	scoped := all.ScopePolicies(sub, e.admin, r)
	kept := map[string]bool{}
	for _, p := range scoped.TrafficPolicies {
		kept[objectKey("TrafficPolicy", p.Namespace, p.Name)] = true
	}
	for _, p := range scoped.AccessPolicies {
		kept[objectKey("AccessPolicy", p.Namespace, p.Name)] = true
	}
	for _, p := range sub.TrafficPolicies {
		if k := objectKey("TrafficPolicy", p.Namespace, p.Name); !kept[k] {
			invalid[k] = true
		}
	}
	for _, p := range sub.AccessPolicies {
		if k := objectKey("AccessPolicy", p.Namespace, p.Name); !kept[k] {
			invalid[k] = true
		}
	}
	return invalid
}

type runFunc func(key, deps string, compute func() *unit) *unit

// trafficUnits groups the valid TrafficPolicies with every Destination they
// select, shift or mirror to (union-find), and translates each group.
func (e *Engine) trafficUnits(c *cycle, invalid map[string]bool, run runFunc) {
	byRef := map[common.ClusterObjectRef][]string{}
	for dk, d := range c.dests {
		byRef[d.Spec.KubeService.Ref] = append(byRef[d.Spec.KubeService.Ref], dk)
	}
	parent := map[string]string{}
	var find func(string) string
	find = func(x string) string {
		p, ok := parent[x]
		if !ok || p == x {
			parent[x] = x
			return x
		}
		root := find(p)
		parent[x] = root
		return root
	}
	union := func(a, b string) {
		ra, rb := find(a), find(b)
		if ra != rb {
			// The smaller key names the group, so it does not depend on
			// the order of unions.
			if rb < ra {
				ra, rb = rb, ra
			}
			parent[rb] = ra
		}
	}
	var policies []string
	for _, k := range slices.Sorted(maps.Keys(c.tps)) {
		if invalid[k] {
			continue
		}
		policies = append(policies, k)
		find(k)
		for dk := range e.tpDest.fwd[k] {
			union(k, dk)
		}
		spec := c.tps[k].Spec.Policy
		var refs []common.ClusterObjectRef
		if ts := spec.TrafficShift; ts != nil {
			for _, d := range ts.Destinations {
				if d.KubeService != nil {
					refs = append(refs, d.KubeService.ClusterObjectRef)
				}
			}
		}
		if spec.Mirror != nil {
			refs = append(refs, spec.Mirror.KubeService)
		}
		for _, ref := range refs {
			for _, dk := range byRef[ref] {
				union(k, dk)
			}
		}
	}
	fh := sha256.New()
	writeVersions(fh, c, "VirtualMesh")
	io.WriteString(fh, c.meshes)
	io.WriteString(fh, c.grants)
	federationDeps := hex.EncodeToString(fh.Sum(nil))
	type group struct{ policies, dests, works []string }
	groups := map[string]*group{}
	for _, k := range policies {
		root := find(k)
		g := groups[root]
		if g == nil {
			g = &group{}
			groups[root] = g
		}
		g.policies = append(g.policies, k)
	}
	for x := range parent {
		if strings.HasPrefix(x, "Destination/") {
			if g := groups[find(x)]; g != nil {
				g.dests = append(g.dests, x)
			}
		}
	}
	for _, root := range slices.Sorted(maps.Keys(groups)) {
		g := groups[root]
		slices.Sort(g.dests)
		works := map[string]bool{}
		for _, p := range g.policies {
			maps.Copy(works, e.tpWork.fwd[p])
		}
		g.works = slices.Sorted(maps.Keys(works))
		h := sha256.New()
		// Federation decides remote hostnames and where a remote
		// DestinationRule goes.
		h.Write([]byte(federationDeps))
		for _, keys := range [][]string{g.policies, g.dests, g.works} {
			for _, k := range keys {
				writeKV(h, k, c.vers[k])
			}
			h.Write([]byte{1})
		}
		run("traffic/"+g.policies[0], hex.EncodeToString(h.Sum(nil)), func() *unit {
			sub := &translation.Input{VirtualMeshes: c.in.VirtualMeshes, Meshes: c.in.Meshes, Clusters: c.in.Clusters,
				// Sized once: a policy for every Destination copies a
				// fleet's worth of them, and growing by appending copied
				// them several times more.
				TrafficPolicies: make([]networkingv1alpha1.TrafficPolicy, 0, len(g.policies)),
				Destinations:    make([]discoveryv1alpha1.Destination, 0, len(g.dests)),
				Workloads:       make([]discoveryv1alpha1.Workload, 0, len(g.works))}
			for _, k := range g.policies {
				sub.TrafficPolicies = append(sub.TrafficPolicies, *c.tps[k])
			}
			for _, k := range g.dests {
				sub.Destinations = append(sub.Destinations, *c.dests[k])
			}
			for _, k := range g.works {
				sub.Workloads = append(sub.Workloads, *c.works[k])
			}
			out, r := translation.NewOutput(), translation.NewReport()
			policy.TranslateTraffic(sub, out, r)
			return &unit{objects: objectsOf(out), report: r}
		})
	}
}

// accessUnits translates the AuthorizationPolicy of every Destination some
// valid AccessPolicy selects, and reports the policies that select none.
func (e *Engine) accessUnits(c *cycle, invalid map[string]bool, run runFunc) {
	sources := map[string]string{} // policy → hash of what its sources resolve from
	sourceDeps := func(pk string) string {
		if s, ok := sources[pk]; ok {
			return s
		}
		h := sha256.New()
		fmt.Fprintf(h, "%s\x00", c.meshes)
		for _, wk := range slices.Sorted(maps.Keys(e.apWork.fwd[pk])) {
			writeKV(h, wk, c.vers[wk])
		}
		s := hex.EncodeToString(h.Sum(nil))
		sources[pk] = s
		return s
	}
	var idle []string
	for _, pk := range slices.Sorted(maps.Keys(c.aps)) {
		if !invalid[pk] && len(e.apDest.fwd[pk]) == 0 {
			idle = append(idle, pk)
		}
	}
	for _, dk := range slices.Sorted(maps.Keys(c.dests)) {
		var aps []string
		for pk := range e.apDest.rev[dk] {
			if !invalid[pk] {
				aps = append(aps, pk)
			}
		}
		if len(aps) == 0 {
			continue
		}
		slices.Sort(aps)
		h := sha256.New()
		writeKV(h, dk, c.vers[dk])
		foreign := false
		for _, pk := range aps {
			writeKV(h, pk, c.vers[pk]+"/"+sourceDeps(pk))
			foreign = foreign || namesForeignIdentities(c.aps[pk])
		}
		if foreign {
			// Whether the Destination admits a foreign identity depends on
			// its VirtualMesh (spec.mtls.federatedTrustDomains, members).
			fh := sha256.New()
			writeVersions(fh, c, "VirtualMesh")
			io.WriteString(fh, c.meshes)
			io.WriteString(fh, c.grants)
			h.Write(fh.Sum(nil))
		}
		run("access/"+dk, hex.EncodeToString(h.Sum(nil)), func() *unit {
			sub := &translation.Input{Meshes: c.in.Meshes, Destinations: []discoveryv1alpha1.Destination{*c.dests[dk]}}
			if foreign {
				sub.VirtualMeshes, sub.Clusters = c.in.VirtualMeshes, c.in.Clusters
			}
			works := map[string]bool{}
			for _, pk := range aps {
				sub.AccessPolicies = append(sub.AccessPolicies, *c.aps[pk])
				maps.Copy(works, e.apWork.fwd[pk])
			}
			for _, wk := range slices.Sorted(maps.Keys(works)) {
				sub.Workloads = append(sub.Workloads, *c.works[wk])
			}
			out, r := translation.NewOutput(), translation.NewReport()
			policy.TranslateAccess(sub, out, r)
			return &unit{objects: objectsOf(out), report: r}
		})
	}
	if len(idle) > 0 {
		h := sha256.New()
		for _, pk := range idle {
			writeKV(h, pk, c.vers[pk]+"/"+sourceDeps(pk))
		}
		run("access-idle", hex.EncodeToString(h.Sum(nil)), func() *unit {
			// No Destination: only the policies' statuses (and the
			// workloads their sources select).
			sub := &translation.Input{Meshes: c.in.Meshes}
			works := map[string]bool{}
			for _, pk := range idle {
				sub.AccessPolicies = append(sub.AccessPolicies, *c.aps[pk])
				maps.Copy(works, e.apWork.fwd[pk])
			}
			for _, wk := range slices.Sorted(maps.Keys(works)) {
				sub.Workloads = append(sub.Workloads, *c.works[wk])
			}
			out, r := translation.NewOutput(), translation.NewReport()
			policy.TranslateAccess(sub, out, r)
			return &unit{objects: objectsOf(out), report: r}
		})
	}
}

// namesForeignIdentities reports whether an AccessPolicy names SPIFFE IDs
// of foreign trust domains.
func namesForeignIdentities(p *networkingv1alpha1.AccessPolicy) bool {
	return slices.ContainsFunc(p.Spec.SourceSelector, func(s common.IdentitySelector) bool { return len(s.SpiffeIDs) > 0 })
}
