package federation_test

import (
	"cmp"
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
		// absent: what must not be in cluster-1; default: nothing of ratings.
		absent string
	}{
		{"same network", func(in *translation.Input) { meshOf(in, "cluster-1").Spec.Istio.Ambient.Network = "net-2" },
			`both meshes are on network "net-2"`, ""},
		{"no network", func(in *translation.Input) { meshOf(in, "cluster-1").Spec.Istio.Ambient.Network = "" },
			"needs each mesh's network", ""},
		{"gateway not programmed", func(in *translation.Input) {
			meshOf(in, "cluster-2").Spec.Istio.Ambient.EastWestGateways[0].Addresses = nil
		}, `has no east-west gateway on network "net-2" with an address`, ""},
		{"gateway on another network", func(in *translation.Input) {
			meshOf(in, "cluster-2").Spec.Istio.Ambient.EastWestGateways[0].Network = "net-9"
		}, `has no east-west gateway on network "net-2"`, ""},
		{"trust domains differ", func(in *translation.Input) {
			in.Clusters[1].Spec.TrustDomains[0].Name = "cluster-2.local"
			meshOf(in, "cluster-2").Spec.Istio.TrustDomain = "cluster-2.local"
		}, `names the remote pods by its own trust domain "mesh.local"`, ""},
		{"system namespace", func(in *translation.Input) {
			for i := range in.Destinations {
				if in.Destinations[i].Spec.KubeService.Ref.Name == "ratings" {
					in.Destinations[i].Spec.KubeService.Ref.Namespace = "kube-system"
				}
			}
		}, "namespace kube-system is the cluster's or the mesh's own", ""},
		{"the consuming mesh's root namespace", func(in *translation.Input) {
			for i := range in.Destinations {
				if in.Destinations[i].Spec.KubeService.Ref.Name == "ratings" {
					in.Destinations[i].Spec.KubeService.Ref.Namespace = "istio-system"
				}
			}
		}, "namespace istio-system is the cluster's or the mesh's own", ""},
		{"gateway outside the consumer's root namespace", func(in *translation.Input) {
			meshOf(in, "cluster-2").Spec.Istio.Ambient.EastWestGateways[0].Namespace = "istio-gateways"
		}, "are not in namespace istio-system", ""},
		{"a namespace the consumer does not use", func(in *translation.Input) {
			for i := range in.Destinations {
				if in.Destinations[i].Spec.KubeService.Ref.Name == "ratings" {
					in.Destinations[i].Spec.KubeService.Ref.Namespace = "cert-manager"
				}
			}
			for i := range in.Workloads {
				if in.Workloads[i].Spec.Kubernetes.Controller.Name == "ratings-v1" {
					in.Workloads[i].Spec.Kubernetes.Controller.Namespace = "cert-manager"
				}
			}
		}, "has no discovered workload or Service in namespace cert-manager", ""},
		{"pods of two accounts", func(in *translation.Input) {
			w := in.Workloads[0]
			w.Name, w.Spec.Kubernetes.Controller.Name, w.Spec.Kubernetes.PodLabels, w.Spec.Kubernetes.ServiceAccountName = "ratings-any", "ratings-any", map[string]string{"app": "ratings"}, "other"
			in.Workloads = append(in.Workloads, w)
		}, "workloads of different service accounts (other, ratings) match the pod at 10.2.0.21", "ratings-cluster-2-10-2-0-2[12]"},
		{"consumer's istiod not multi-network", func(in *translation.Input) {
			meshOf(in, "cluster-1").Spec.Istio.Ambient.MultiNetwork = false
		}, "istiod of cluster-1/istio-system/istiod does not run with AMBIENT_ENABLE_MULTI_NETWORK=true", ""},
		{"exporter's mesh config without the global scope", func(in *translation.Input) {
			meshOf(in, "cluster-2").Spec.Istio.Ambient.GlobalServiceScope = false
		}, "the mesh config of cluster-2/istio-system/istiod has no serviceScopeConfigs entry", ""},
		{"the exported Service not global", func(in *translation.Input) {
			for i := range in.Destinations {
				if in.Destinations[i].Spec.KubeService.Ref.Name == "ratings" {
					delete(in.Destinations[i].Spec.KubeService.Labels, "istio.io/global")
				}
			}
		}, "its Service shop/ratings in cluster-2 is not labelled istio.io/global=true", ""},
		{"a network another member reports too", func(in *translation.Input) {
			m3 := *meshOf(in, "cluster-2")
			m3.Name = "istiod-istio-system-cluster-3"
			m3.Spec.Istio = m3.Spec.Istio.DeepCopy()
			m3.Spec.Istio.Installation.Cluster = "cluster-3"
			in.Meshes = append(in.Meshes, m3)
			kc := *in.Clusters[1].DeepCopy()
			kc.Name = "cluster-3"
			in.Clusters = append(in.Clusters, kc)
			in.VirtualMeshes[0].Spec.Meshes = append(in.VirtualMeshes[0].Spec.Meshes, in.VirtualMeshes[0].Spec.Meshes[1])
			in.VirtualMeshes[0].Spec.Meshes[2].ClusterName = "cluster-3"
		}, `network "net-2" is reported by cluster-3/istio-system/istiod too`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ambientInput(t)
			tc.edit(in)
			objs, errs := ambientObjects(t, in, "cluster-1")
			absent := cmp.Or(tc.absent, "ratings")
			for _, o := range objs {
				assert.NotRegexp(t, absent, o, "not in cluster-1")
			}
			assert.Contains(t, strings.Join(errs, "\n"), tc.want)
		})
	}

	// Unedited: ratings reaches cluster-1, network gateway included.
	objs, _ := ambientObjects(t, ambientInput(t), "cluster-1")
	assert.Equal(t, []string{"Gateway/istio-system/relaymesh-cluster-2-istio-eastwest", "WorkloadEntry/shop/ratings-cluster-2-10-2-0-21-5ee8b31b",
		"WorkloadEntry/shop/ratings-cluster-2-10-2-0-22-ebd6ec0f", "Service/shop/ratings"}, objs)
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
