package federation_test

import (
	"path/filepath"
	"strings"
	"testing"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ambientInput is the ambient-multinetwork golden's input.
func ambientInput(t *testing.T) *translation.Input {
	return translationtest.LoadInput(t, filepath.Join("testdata", "ambient-multinetwork"))
}

// ambientObjects translates in and returns cluster's objects as
// "Kind/namespace/name", and every target error.
func ambientObjects(t *testing.T, in *translation.Input, cluster string) (objs []string, errs []string) {
	t.Helper()
	out, r := translation.NewOutput(), translation.NewReport()
	federation.Translate(in, out, r)
	for _, o := range out.Objects() {
		if o.Cluster == cluster {
			objs = append(objs, o.Object.GetKind()+"/"+o.Object.GetNamespace()+"/"+o.Object.GetName())
		}
	}
	for _, k := range r.Keys() {
		_, targets, _ := r.Status(k)
		for _, tg := range targets {
			errs = append(errs, tg.Errors...)
		}
	}
	return objs, errs
}

// Each condition of an ambient pair, broken alone, stops that pair and
// says why on the exporting member; nothing half-made is written.
func TestAmbientFederationRefusals(t *testing.T) {
	meshOf := func(in *translation.Input, cluster string) *discoveryv1alpha1.Mesh {
		for i := range in.Meshes {
			if in.Meshes[i].Spec.Istio.Installation.Cluster == cluster {
				return &in.Meshes[i]
			}
		}
		t.Fatalf("no mesh of %s", cluster)
		return nil
	}
	for _, tc := range []struct {
		name string
		edit func(*translation.Input)
		want string
	}{
		{"same network", func(in *translation.Input) { meshOf(in, "cluster-1").Spec.Istio.Ambient.Network = "net-2" },
			`both meshes are on network "net-2"`},
		{"no network", func(in *translation.Input) { meshOf(in, "cluster-1").Spec.Istio.Ambient.Network = "" },
			"needs each mesh's network"},
		{"gateway not programmed", func(in *translation.Input) {
			meshOf(in, "cluster-2").Spec.Istio.Ambient.EastWestGateways[0].Addresses = nil
		}, `has no east-west gateway on network "net-2" with an address`},
		{"gateway on another network", func(in *translation.Input) {
			meshOf(in, "cluster-2").Spec.Istio.Ambient.EastWestGateways[0].Network = "net-9"
		}, `has no east-west gateway on network "net-2"`},
		{"trust domains differ", func(in *translation.Input) {
			in.Clusters[1].Spec.TrustDomains[0].Name = "cluster-2.local"
			meshOf(in, "cluster-2").Spec.Istio.TrustDomain = "cluster-2.local"
		}, `names the remote pods by its own trust domain "mesh.local"`},
		{"system namespace", func(in *translation.Input) {
			for i := range in.Destinations {
				if in.Destinations[i].Spec.KubeService.Ref.Name == "ratings" {
					in.Destinations[i].Spec.KubeService.Ref.Namespace = "kube-system"
				}
			}
		}, "namespace kube-system is the cluster's or the mesh's own"},
		{"the consuming mesh's root namespace", func(in *translation.Input) {
			for i := range in.Destinations {
				if in.Destinations[i].Spec.KubeService.Ref.Name == "ratings" {
					in.Destinations[i].Spec.KubeService.Ref.Namespace = "istio-system"
				}
			}
		}, "namespace istio-system is the cluster's or the mesh's own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ambientInput(t)
			tc.edit(in)
			objs, errs := ambientObjects(t, in, "cluster-1")
			for _, o := range objs {
				assert.False(t, strings.Contains(o, "ratings"), "nothing of ratings in cluster-1: %s", o)
			}
			assert.Contains(t, strings.Join(errs, "\n"), tc.want)
		})
	}

	// Unedited: ratings reaches cluster-1, network gateway included.
	objs, _ := ambientObjects(t, ambientInput(t), "cluster-1")
	assert.Equal(t, []string{"Gateway/istio-system/relaymesh-cluster-2-istio-eastwest", "WorkloadEntry/shop/ratings-cluster-2-10-2-0-21",
		"WorkloadEntry/shop/ratings-cluster-2-10-2-0-22", "Service/shop/ratings"}, objs)
}

// A hostile or malformed pod address never becomes a WorkloadEntry, and
// the translation says so.
func TestAmbientFederationSkipsBadEndpoints(t *testing.T) {
	in := ambientInput(t)
	for i := range in.Destinations {
		if in.Destinations[i].Spec.KubeService.Ref.Name == "ratings" {
			eps := in.Destinations[i].Spec.KubeService.Endpoints
			eps[0].IP = "10.2.0.21; rm -rf /"
			eps[1].IP = "fe80::1%eth0"
		}
	}
	objs, errs := ambientObjects(t, in, "cluster-1")
	for _, o := range objs {
		assert.NotContains(t, o, "WorkloadEntry", "no entry for a bad address")
	}
	joined := strings.Join(errs, "\n")
	assert.Contains(t, joined, `endpoint "10.2.0.21; rm -rf /" is not an IP address`)
	assert.Contains(t, joined, `endpoint "fe80::1%eth0" is not an IP address`)
	require.Contains(t, objs, "Service/shop/ratings", "the service stays, with no endpoint")
}
