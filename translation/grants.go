package translation

import (
	"fmt"
	"slices"
	"strings"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
)

// Grants are the trust domains each registered cluster's meshes may use,
// read from the KubernetesClusters of the management cluster (the
// registry), never from what an agent reports. A trust domain is usable by
// a cluster when the cluster holds it and every other cluster holding it
// too — if any — marks it shared, as does the cluster itself: two clusters
// written with one grant by mistake (or by an attacker's guess of a
// victim's trust domain) both lose it, so whoever claims first wins
// nothing. A nil *Grants holds nothing: every trust domain is refused.
type Grants struct {
	// byCluster holds every registered cluster's grant, never empty (the
	// default when its spec has none): it is the registry too.
	byCluster map[string][]multiclusterv1alpha1.TrustDomainGrant
	// sole: a trust domain held by one cluster → that holder (most are,
	// and need no slice of their own); holders: one held by several →
	// them, sorted by cluster.
	sole    map[string]grantHolder
	holders map[string][]grantHolder
}

type grantHolder struct {
	cluster string
	shared  bool
}

// NewGrants reads the grants of clusters (KubernetesCluster.Grant: the
// spec's, or the default `<name>.local`). Every KubernetesCluster holds its
// grant, whatever its mode or state, so a conflict cannot be hidden by, say,
// a cluster being deleted.
func NewGrants(clusters []multiclusterv1alpha1.KubernetesCluster) *Grants {
	// Built over the whole fleet by each trust reconcile and by
	// translations with VirtualMeshes or VirtualDestinations: sized once,
	// and a cluster's grant kept as its spec holds it (read, never
	// modified) unless it repeats a trust domain.
	g := &Grants{byCluster: make(map[string][]multiclusterv1alpha1.TrustDomainGrant, len(clusters)),
		sole: make(map[string]grantHolder, len(clusters)), holders: map[string][]grantHolder{}}
	for i := range clusters {
		kc := &clusters[i]
		grants := kc.Grant()
		if repeatsATrustDomain(grants) {
			grants = g.mergeRepeats(kc.Name, grants)
		} else {
			for _, gr := range grants {
				g.add(gr.Name, grantHolder{cluster: kc.Name, shared: gr.Shared})
			}
		}
		if prev, ok := g.byCluster[kc.Name]; ok {
			// Two objects of one name (not from one apiserver): keep both
			// grants, copied so appending never writes into a spec's slice.
			grants = append(slices.Clip(prev), grants...)
		}
		g.byCluster[kc.Name] = grants
	}
	for _, hs := range g.holders {
		slices.SortFunc(hs, func(a, b grantHolder) int { return strings.Compare(a.cluster, b.cluster) })
	}
	return g
}

func (g *Grants) add(td string, h grantHolder) {
	if hs, ok := g.holders[td]; ok {
		g.holders[td] = append(hs, h)
	} else if first, ok := g.sole[td]; ok {
		delete(g.sole, td)
		g.holders[td] = []grantHolder{first, h}
	} else {
		g.sole[td] = h
	}
}

// holdersOf returns the holders of td, sorted by cluster.
func (g *Grants) holdersOf(td string) []grantHolder {
	if h, ok := g.sole[td]; ok {
		return []grantHolder{h}
	}
	return g.holders[td]
}

func repeatsATrustDomain(grants []multiclusterv1alpha1.TrustDomainGrant) bool {
	for i := 1; i < len(grants); i++ {
		for j := range i {
			if grants[i].Name == grants[j].Name {
				return true
			}
		}
	}
	return false
}

// mergeRepeats records a grant that repeats a trust domain, which the
// schema forbids (listType=map) but a hand-made object may do: the trust
// domain is held once, unshared unless every copy says shared. It returns
// the grant without the repeats.
func (g *Grants) mergeRepeats(cluster string, grants []multiclusterv1alpha1.TrustDomainGrant) []multiclusterv1alpha1.TrustDomainGrant {
	var kept []multiclusterv1alpha1.TrustDomainGrant
	for _, gr := range grants {
		if slices.ContainsFunc(kept, func(k multiclusterv1alpha1.TrustDomainGrant) bool { return k.Name == gr.Name }) {
			// This cluster's holding is the trust domain's last added:
			// clusters are added one at a time, and sorted only at the end.
			if h, ok := g.sole[gr.Name]; ok {
				h.shared = h.shared && gr.Shared
				g.sole[gr.Name] = h
			} else {
				hs := g.holders[gr.Name]
				hs[len(hs)-1].shared = hs[len(hs)-1].shared && gr.Shared
			}
			continue
		}
		kept = append(kept, gr)
		g.add(gr.Name, grantHolder{cluster: cluster, shared: gr.Shared})
	}
	return kept
}

// GrantRefusal is why a trust domain is refused to a cluster.
type GrantRefusal string

// Reasons for GrantError.
const (
	// RefusedUnregistered: no KubernetesCluster of that name.
	RefusedUnregistered GrantRefusal = "unregistered"
	// RefusedNotGranted: the cluster's grant does not hold it.
	RefusedNotGranted GrantRefusal = "not granted"
	// RefusedConflict: several clusters hold it, not all marking it shared.
	RefusedConflict GrantRefusal = "conflict"
)

// GrantError is a trust domain refused to a cluster. Its message names the
// grant and what an administrator can change.
type GrantError struct {
	Cluster, TrustDomain string
	Reason               GrantRefusal
	// Granted is the cluster's grant (its trust domains).
	Granted []string
	// Holders are the clusters holding TrustDomain (for RefusedConflict),
	// and Unshared those of them that do not mark it shared.
	Holders, Unshared []string
}

func (e *GrantError) Error() string {
	switch e.Reason {
	case RefusedUnregistered:
		return fmt.Sprintf("cluster %s is not registered (no KubernetesCluster): its meshes may use no trust domain", e.Cluster)
	case RefusedConflict:
		return fmt.Sprintf("trust domain %q is granted to clusters %s, and %s not mark it shared: no mesh of any of them may use it until an administrator leaves it to one KubernetesCluster's spec.trustDomains or marks it shared on every one",
			e.TrustDomain, strings.Join(e.Holders, ", "), doesOrDo(e.Unshared))
	default:
		return fmt.Sprintf("cluster %s is not granted trust domain %q (its grant: %s); an administrator grants trust domains in KubernetesCluster %s, spec.trustDomains",
			e.Cluster, e.TrustDomain, strings.Join(e.Granted, ", "), e.Cluster)
	}
}

func doesOrDo(clusters []string) string {
	if len(clusters) == 1 {
		return clusters[0] + " does"
	}
	return strings.Join(clusters, ", ") + " do"
}

// Authorize returns nil when a mesh of cluster may use trust domain td,
// else a *GrantError.
func (g *Grants) Authorize(cluster, td string) error {
	if !g.Registered(cluster) {
		return &GrantError{Cluster: cluster, TrustDomain: td, Reason: RefusedUnregistered}
	}
	if h, ok := g.sole[td]; ok && h.cluster == cluster {
		return nil
	}
	hs := g.holders[td]
	if !slices.ContainsFunc(hs, func(h grantHolder) bool { return h.cluster == cluster }) {
		return &GrantError{Cluster: cluster, TrustDomain: td, Reason: RefusedNotGranted, Granted: g.Granted(cluster)}
	}
	if len(hs) == 1 {
		return nil
	}
	var holders, unshared []string
	for _, h := range hs {
		holders = append(holders, h.cluster)
		if !h.shared {
			unshared = append(unshared, h.cluster)
		}
	}
	if len(unshared) == 0 {
		return nil
	}
	return &GrantError{Cluster: cluster, TrustDomain: td, Reason: RefusedConflict, Granted: g.Granted(cluster), Holders: holders, Unshared: unshared}
}

// Registered says whether cluster has a KubernetesCluster.
func (g *Grants) Registered(cluster string) bool {
	if g == nil {
		return false
	}
	_, ok := g.byCluster[cluster]
	return ok
}

// Granted returns the trust domains cluster holds, in its spec's order.
func (g *Grants) Granted(cluster string) []string {
	if g == nil {
		return nil
	}
	var out []string
	for _, gr := range g.byCluster[cluster] {
		out = append(out, gr.Name)
	}
	return out
}

// SharedWith returns the other clusters holding td when cluster may use it
// (all of them marking it shared), sorted; nil when no other does.
func (g *Grants) SharedWith(cluster, td string) []string {
	if g.Authorize(cluster, td) != nil {
		return nil
	}
	var out []string
	for _, h := range g.holdersOf(td) {
		if h.cluster != cluster {
			out = append(out, h.cluster)
		}
	}
	return out
}
