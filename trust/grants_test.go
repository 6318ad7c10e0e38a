package trust

import (
	"errors"
	"strings"
	"testing"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func registeredCluster(name string, grants ...multiclusterv1alpha1.TrustDomainGrant) multiclusterv1alpha1.KubernetesCluster {
	return multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: multiclusterv1alpha1.KubernetesClusterSpec{TrustDomains: grants}}
}

func discoveredMesh(cluster, namespace, td string) discoveryv1alpha1.Mesh {
	return discoveryv1alpha1.Mesh{Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
		Installation: discoveryv1alpha1.MeshInstallation{Name: "istiod", Namespace: namespace, Cluster: cluster}, TrustDomain: td}}}
}

// The signing path decides again from the registry and the mesh as they are
// at that moment: a trust domain the mesh no longer reports, or that the
// registry does not (or no longer exclusively) grant, gets nothing.
func TestSigningNeedsTheGrantAndTheReportedTrustDomain(t *testing.T) {
	eu := discoveredMesh("eu", "istio-system", "eu.local")
	switched := discoveredMesh("eu", "istio-system", "cluster-1.local")
	for _, tc := range []struct {
		name     string
		clusters []multiclusterv1alpha1.KubernetesCluster
		mesh     *discoveryv1alpha1.Mesh
		cluster  string
		td       string
		want     string // "": authorized
		grantErr bool
	}{
		{name: "granted", clusters: []multiclusterv1alpha1.KubernetesCluster{registeredCluster("eu")}, mesh: &eu, cluster: "eu", td: "eu.local"},
		{name: "no trust domain", clusters: []multiclusterv1alpha1.KubernetesCluster{registeredCluster("eu")}, mesh: &eu, cluster: "eu", td: "", want: "names no trust domain"},
		{name: "mesh gone", clusters: []multiclusterv1alpha1.KubernetesCluster{registeredCluster("eu")}, cluster: "eu", td: "eu.local", want: "not discovered"},
		{name: "another cluster's mesh", clusters: []multiclusterv1alpha1.KubernetesCluster{registeredCluster("eu"), registeredCluster("c2")}, mesh: &eu, cluster: "c2", td: "eu.local", want: "not in the caller's cluster"},
		{name: "the mesh reports another trust domain now", clusters: []multiclusterv1alpha1.KubernetesCluster{registeredCluster("eu")}, mesh: &switched, cluster: "eu", td: "eu.local",
			want: `now reports trust domain "cluster-1.local", not "eu.local"`},
		{name: "outside the grant", clusters: []multiclusterv1alpha1.KubernetesCluster{registeredCluster("eu"), registeredCluster("cluster-1")}, mesh: &switched, cluster: "eu", td: "cluster-1.local",
			want: `cluster eu is not granted trust domain "cluster-1.local" (its grant: eu.local)`, grantErr: true},
		{name: "granted twice, unshared", clusters: []multiclusterv1alpha1.KubernetesCluster{registeredCluster("eu"), registeredCluster("c2", multiclusterv1alpha1.TrustDomainGrant{Name: "eu.local"})}, mesh: &eu, cluster: "eu", td: "eu.local",
			want: `granted to clusters c2, eu`, grantErr: true},
		{name: "deregistered", clusters: []multiclusterv1alpha1.KubernetesCluster{registeredCluster("c2")}, mesh: &eu, cluster: "eu", td: "eu.local", want: "cluster eu is not registered", grantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := authorizeSigning(tc.clusters, tc.mesh, tc.cluster, tc.td)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrTrustDomainRefused)
			assert.Contains(t, err.Error(), tc.want)
			var ge *translation.GrantError
			assert.Equal(t, tc.grantErr, errors.As(err, &ge))
		})
	}
}

// Every cluster's status names each trust domain it holds and each one its
// meshes report outside the grant, and says why.
func TestGrantStatusesNameTheGrant(t *testing.T) {
	clusters := []multiclusterv1alpha1.KubernetesCluster{
		registeredCluster("cluster-1"),
		registeredCluster("c2", multiclusterv1alpha1.TrustDomainGrant{Name: "c2.local"}, multiclusterv1alpha1.TrustDomainGrant{Name: "cluster.local", Shared: true}),
		registeredCluster("c3", multiclusterv1alpha1.TrustDomainGrant{Name: "cluster.local", Shared: true}),
		registeredCluster("eu"),
		registeredCluster("squatter", multiclusterv1alpha1.TrustDomainGrant{Name: "cluster-1.local"}),
	}
	meshes := []discoveryv1alpha1.Mesh{
		discoveredMesh("cluster-1", "istio-system", "cluster-1.local"),
		discoveredMesh("eu", "istio-system", "cluster-1.local"),
		discoveredMesh("eu", "istio-canary", "cluster-1.local"),
		discoveredMesh("eu", "istio-other", "eu.local"),
		discoveredMesh("c3", "istio-system", "cluster.local"),
		discoveredMesh("unregistered", "istio-system", "x.local"),
		{}, // no istio: ignored
	}
	got := grantStatuses(clusters, meshes)
	require.Len(t, got, len(clusters), "one entry per registered cluster, and only those")

	c1 := got["cluster-1"]
	require.Len(t, c1, 1)
	assert.Equal(t, multiclusterv1alpha1.TrustDomainConflict, c1[0].State)
	assert.Equal(t, []string{"istio-system/istiod"}, c1[0].Meshes)
	assert.Contains(t, c1[0].Message, `"cluster-1.local" is granted to clusters cluster-1, squatter`)
	assert.Equal(t, multiclusterv1alpha1.TrustDomainConflict, got["squatter"][0].State, "both holders are told")

	e := got["eu"]
	require.Len(t, e, 2)
	assert.Equal(t, multiclusterv1alpha1.TrustDomainStatus{Name: "eu.local", State: multiclusterv1alpha1.TrustDomainAuthorized, Meshes: []string{"istio-other/istiod"}}, e[0])
	assert.Equal(t, "cluster-1.local", e[1].Name)
	assert.Equal(t, multiclusterv1alpha1.TrustDomainNotGranted, e[1].State)
	assert.Equal(t, []string{"istio-canary/istiod", "istio-system/istiod"}, e[1].Meshes)
	assert.Contains(t, e[1].Message, `cluster eu is not granted trust domain "cluster-1.local" (its grant: eu.local)`)
	assert.Contains(t, e[1].Message, "they get no intermediate")

	c2 := got["c2"]
	require.Len(t, c2, 2)
	assert.Equal(t, multiclusterv1alpha1.TrustDomainAuthorized, c2[0].State)
	assert.Empty(t, c2[0].Message)
	assert.Equal(t, multiclusterv1alpha1.TrustDomainAuthorized, c2[1].State)
	assert.Contains(t, c2[1].Message, "shared with clusters c3")
	assert.Contains(t, got["c3"][0].Message, "shared with clusters c2")
}

// Whatever the meshes report, the status stays within the CRD's bounds.
func TestGrantStatusesAreBounded(t *testing.T) {
	var meshes []discoveryv1alpha1.Mesh
	for i := range 100 {
		meshes = append(meshes, discoveredMesh("eu", "ns-"+strings.Repeat("x", i%7)+string(rune('a'+i%26)), strings.Repeat("t", 200)+string(rune('a'+i%26))+".local"))
		meshes = append(meshes, discoveredMesh("eu", "ns-"+string(rune('a'+i%26))+strings.Repeat("y", i), "eu.local"))
	}
	got := grantStatuses([]multiclusterv1alpha1.KubernetesCluster{registeredCluster("eu")}, meshes)["eu"]
	require.LessOrEqual(t, len(got), maxGrantStatuses)
	for _, st := range got {
		assert.LessOrEqual(t, len(st.Meshes), maxGrantMeshes)
		assert.LessOrEqual(t, len(st.Message), maxGrantMessageLen)
	}
	assert.Equal(t, "eu.local", got[0].Name, "the grant comes first")
}
