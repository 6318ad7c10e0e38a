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
	registered map[string]bool
	byCluster  map[string][]multiclusterv1alpha1.TrustDomainGrant
	holders    map[string][]grantHolder // by trust domain, sorted by cluster
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
	g := &Grants{registered: map[string]bool{}, byCluster: map[string][]multiclusterv1alpha1.TrustDomainGrant{}, holders: map[string][]grantHolder{}}
	for i := range clusters {
		kc := &clusters[i]
		g.registered[kc.Name] = true
		seen := map[string]bool{}
		for _, gr := range kc.Grant() {
			if seen[gr.Name] {
				// The schema forbids it (listType=map); a hand-made object
				// repeating a grant holds it once, unshared unless every
				// copy says shared.
				for j := range g.holders[gr.Name] {
					if h := &g.holders[gr.Name][j]; h.cluster == kc.Name {
						h.shared = h.shared && gr.Shared
					}
				}
				continue
			}
			seen[gr.Name] = true
			g.byCluster[kc.Name] = append(g.byCluster[kc.Name], gr)
			g.holders[gr.Name] = append(g.holders[gr.Name], grantHolder{cluster: kc.Name, shared: gr.Shared})
		}
	}
	for td := range g.holders {
		slices.SortFunc(g.holders[td], func(a, b grantHolder) int { return strings.Compare(a.cluster, b.cluster) })
	}
	return g
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
	if g == nil || !g.registered[cluster] {
		return &GrantError{Cluster: cluster, TrustDomain: td, Reason: RefusedUnregistered}
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
func (g *Grants) Registered(cluster string) bool { return g != nil && g.registered[cluster] }

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
	for _, h := range g.holders[td] {
		if h.cluster != cluster {
			out = append(out, h.cluster)
		}
	}
	return out
}
