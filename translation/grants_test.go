package translation_test

import (
	"errors"
	"fmt"
	"testing"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func kc(name string, grants ...multiclusterv1alpha1.TrustDomainGrant) multiclusterv1alpha1.KubernetesCluster {
	return multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: multiclusterv1alpha1.KubernetesClusterSpec{TrustDomains: grants}}
}

func grant(td string, shared bool) multiclusterv1alpha1.TrustDomainGrant {
	return multiclusterv1alpha1.TrustDomainGrant{Name: td, Shared: shared}
}

// A trust domain is usable by a cluster only when the registry grants it
// to that cluster, and to no other unless every holder marks it shared.
func TestGrantsAuthorizeOnlyWhatTheRegistryGrants(t *testing.T) {
	for _, tc := range []struct {
		name          string
		clusters      []multiclusterv1alpha1.KubernetesCluster
		cluster, td   string
		reason        translation.GrantRefusal // "": authorized
		granted       []string
		holders       []string
		unshared      []string
		sharedWith    []string
		messageHasAll []string
	}{
		{name: "default grant", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("eu")}, cluster: "eu", td: "eu.local", granted: []string{"eu.local"}},
		{name: "outside the default grant", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("eu"), kc("cluster-1")}, cluster: "eu", td: "cluster-1.local",
			reason: translation.RefusedNotGranted, granted: []string{"eu.local"},
			messageHasAll: []string{`cluster eu is not granted trust domain "cluster-1.local" (its grant: eu.local)`, "KubernetesCluster eu, spec.trustDomains"}},
		{name: "an explicit grant replaces the default", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("eu", grant("eu.example", false), grant("eu-2.example", false))}, cluster: "eu", td: "eu.local",
			reason: translation.RefusedNotGranted, granted: []string{"eu.example", "eu-2.example"}, messageHasAll: []string{"(its grant: eu.example, eu-2.example)"}},
		{name: "explicit grant", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("eu", grant("eu.example", false), grant("eu-2.example", false))}, cluster: "eu", td: "eu-2.example",
			granted: []string{"eu.example", "eu-2.example"}},
		{name: "unregistered", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("cluster-1")}, cluster: "eu", td: "eu.local",
			reason: translation.RefusedUnregistered, messageHasAll: []string{"cluster eu is not registered"}},
		{name: "no registry at all", cluster: "eu", td: "eu.local", reason: translation.RefusedUnregistered},
		{name: "the victim loses it too: no first claim wins", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("cluster-1"), kc("eu", grant("cluster-1.local", false))}, cluster: "cluster-1", td: "cluster-1.local",
			reason: translation.RefusedConflict, granted: []string{"cluster-1.local"}, holders: []string{"cluster-1", "eu"}, unshared: []string{"cluster-1", "eu"},
			messageHasAll: []string{`trust domain "cluster-1.local" is granted to clusters cluster-1, eu, and cluster-1, eu do not mark it shared`}},
		{name: "and so does the squatter", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("cluster-1"), kc("eu", grant("cluster-1.local", false))}, cluster: "eu", td: "cluster-1.local",
			reason: translation.RefusedConflict, granted: []string{"cluster-1.local"}, holders: []string{"cluster-1", "eu"}, unshared: []string{"cluster-1", "eu"}},
		{name: "shared on one side only", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("cluster-1", grant("cluster-1.local", true)), kc("eu", grant("cluster-1.local", false))}, cluster: "cluster-1", td: "cluster-1.local",
			reason: translation.RefusedConflict, granted: []string{"cluster-1.local"}, holders: []string{"cluster-1", "eu"}, unshared: []string{"eu"},
			messageHasAll: []string{"and eu does not mark it shared"}},
		{name: "shared on both", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("cluster-1", grant("cluster-1.local", true)), kc("eu", grant("cluster-1.local", true))}, cluster: "eu", td: "cluster-1.local",
			granted: []string{"cluster-1.local"}, sharedWith: []string{"cluster-1"}},
		{name: "shared but held alone", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("eu", grant("cluster.local", true))}, cluster: "eu", td: "cluster.local", granted: []string{"cluster.local"}},
		{name: "a repeated grant is shared only if every copy is", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("a", grant("x", true), grant("x", false)), kc("b", grant("x", true))}, cluster: "b", td: "x",
			reason: translation.RefusedConflict, granted: []string{"x"}, holders: []string{"a", "b"}, unshared: []string{"a"}},
		{name: "a repeated grant held alone", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("a", grant("x", true), grant("x", false))}, cluster: "a", td: "x",
			granted: []string{"x"}},
		{name: "three holders, all sharing, listed in any order", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c", grant("x", true)), kc("a", grant("x", true)), kc("b", grant("x", true), grant("y", false))},
			cluster: "b", td: "x", granted: []string{"x", "y"}, sharedWith: []string{"a", "c"}},
		{name: "one of three does not share", clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c", grant("x", true)), kc("a", grant("x", false)), kc("b", grant("x", true))},
			cluster: "c", td: "x", reason: translation.RefusedConflict, granted: []string{"x"}, holders: []string{"a", "b", "c"}, unshared: []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := translation.NewGrants(tc.clusters)
			err := g.Authorize(tc.cluster, tc.td)
			assert.Equal(t, tc.sharedWith, g.SharedWith(tc.cluster, tc.td))
			if tc.reason == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.granted, g.Granted(tc.cluster))
				return
			}
			var ge *translation.GrantError
			require.True(t, errors.As(err, &ge), "%v", err)
			assert.Equal(t, tc.reason, ge.Reason)
			assert.Equal(t, tc.granted, ge.Granted)
			assert.Equal(t, tc.holders, ge.Holders)
			assert.Equal(t, tc.unshared, ge.Unshared)
			for _, m := range tc.messageHasAll {
				assert.Contains(t, err.Error(), m)
			}
		})
	}
	var nilGrants *translation.Grants
	assert.Error(t, nilGrants.Authorize("eu", "eu.local"), "no registry: nothing is granted")
	assert.Nil(t, nilGrants.SharedWith("eu", "eu.local"))
}

// The registry keeps a cluster's grant as its spec holds it, and never
// writes into it: not when two objects of one name add up their grants,
// nor when a repeated trust domain is merged.
func TestGrantsNeverWriteIntoASpec(t *testing.T) {
	spare := make([]multiclusterv1alpha1.TrustDomainGrant, 1, 2)
	spare[0] = grant("x", true)
	repeated := []multiclusterv1alpha1.TrustDomainGrant{grant("y", true), grant("y", false)}
	clusters := []multiclusterv1alpha1.KubernetesCluster{kc("a"), kc("a"), kc("b", repeated...)}
	clusters[0].Spec.TrustDomains = spare
	clusters[1].Spec.TrustDomains = []multiclusterv1alpha1.TrustDomainGrant{grant("z", false)}
	g := translation.NewGrants(clusters)
	assert.Equal(t, []string{"x", "z"}, g.Granted("a"))
	assert.Equal(t, []string{"y"}, g.Granted("b"))
	assert.Equal(t, multiclusterv1alpha1.TrustDomainGrant{}, spare[:2][1], "nothing appended into the spec's spare capacity")
	assert.Equal(t, []multiclusterv1alpha1.TrustDomainGrant{grant("y", true), grant("y", false)}, repeated)
	require.NoError(t, g.Authorize("b", "y"), "held alone, repeated")
}

// The verdict does not depend on the order the registry lists clusters in.
func TestGrantsIgnoreOrder(t *testing.T) {
	a := []multiclusterv1alpha1.KubernetesCluster{kc("b", grant("x", false)), kc("a", grant("x", false))}
	b := []multiclusterv1alpha1.KubernetesCluster{kc("a", grant("x", false)), kc("b", grant("x", false))}
	ea, eb := translation.NewGrants(a).Authorize("a", "x"), translation.NewGrants(b).Authorize("a", "x")
	require.Error(t, ea)
	assert.Equal(t, ea.Error(), eb.Error())
}

// Whatever the registry holds, a trust domain is authorized to a cluster
// only if that cluster holds it and every holder marks it shared (or holds
// it alone), and the verdict never panics.
func FuzzGrants(f *testing.F) {
	f.Add("a", "a.local", false, "b", "a.local", false, "a.local")
	f.Add("a", "x", true, "b", "x", true, "x")
	f.Add("a", "", false, "a", "", false, "a.local")
	f.Add("0", "0", false, "0", "", false, "0") // two objects of one name: both grants count
	f.Fuzz(func(t *testing.T, c1, td1 string, s1 bool, c2, td2 string, s2 bool, ask string) {
		var clusters []multiclusterv1alpha1.KubernetesCluster
		for _, c := range []struct {
			name, td string
			shared   bool
		}{{c1, td1, s1}, {c2, td2, s2}} {
			var grants []multiclusterv1alpha1.TrustDomainGrant
			if c.td != "" {
				grants = append(grants, grant(c.td, c.shared))
			}
			clusters = append(clusters, kc(c.name, grants...))
		}
		g := translation.NewGrants(clusters)
		for _, cl := range []string{c1, c2} {
			err := g.Authorize(cl, ask)
			if err == nil {
				require.Contains(t, g.Granted(cl), ask)
				for _, k := range clusters {
					if k.Name == cl {
						continue
					}
					for _, gr := range k.Grant() {
						if gr.Name == ask {
							require.True(t, gr.Shared, "%s authorized although %s holds it unshared", cl, k.Name)
						}
					}
				}
				continue
			}
			var ge *translation.GrantError
			require.ErrorAs(t, err, &ge)
			require.NotEmpty(t, err.Error())
		}
	})
}

// BenchmarkNewGrants is the registry the trust controller builds at each
// reconcile (and translation, with VirtualMeshes or VirtualDestinations):
// 10,000 clusters, most with the default grant, one in ten granted two
// trust domains, one shared.
func BenchmarkNewGrants(b *testing.B) {
	clusters := make([]multiclusterv1alpha1.KubernetesCluster, 10000)
	for i := range clusters {
		name := fmt.Sprintf("cluster-%05d", i)
		clusters[i] = kc(name)
		if i%10 == 0 {
			clusters[i] = kc(name, grant(name+".example", false), grant("shared.example", true))
		}
	}
	var g *translation.Grants
	for b.Loop() {
		g = translation.NewGrants(clusters)
	}
	require.NoError(b, g.Authorize("cluster-00010", "shared.example"))
	require.NoError(b, g.Authorize("cluster-00011", multiclusterv1alpha1.DefaultTrustDomain("cluster-00011")))
}
