package discovery_test

import (
	"testing"

	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestBuildMeshes: which Deployments are meshes, and each mesh field
// (revision, version, trust domain, smart DNS, service account, labels).
func TestBuildMeshes(t *testing.T) {
	podLabels := l("app", "istiod")
	tests := []struct {
		name string
		in   discovery.Inputs
		want []*relaypb.Mesh
	}{{
		name: "app=istiod: version from the image tag, defaults without a ConfigMap",
		in:   discovery.Inputs{Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod", nil)}},
		want: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1",
			TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels,
		}},
	}, {
		name: "istio=pilot, rev=default, operator version label, trust domain and DNS capture from mesh config",
		in: discovery.Inputs{
			Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod", l("istio", "pilot", "istio.io/rev", "default", "operator.istio.io/version", "1.30.2"), func(d *appsv1.Deployment) {
				delete(d.Labels, "app")
			})},
			ConfigMaps: []*corev1.ConfigMap{configMap("istio-system", "istio",
				"trustDomain: example.org\ndefaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: \"true\"\n")},
		},
		want: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.30.2",
			TrustDomain: "example.org", IstiodServiceAccount: "istiod", PodLabels: podLabels, SmartDnsProxying: true,
		}},
	}, {
		name: "revision from the pod template label; mesh config from istio-<rev>",
		in: discovery.Inputs{
			Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod-canary", nil, func(d *appsv1.Deployment) {
				d.Spec.Template.Labels = l("app", "istiod", "istio.io/rev", "canary")
			})},
			ConfigMaps: []*corev1.ConfigMap{
				configMap("istio-system", "istio", "trustDomain: default.org"),
				configMap("istio-system", "istio-canary", "trustDomain: canary.org"),
			},
		},
		want: []*relaypb.Mesh{{
			Name: "istiod-canary", Namespace: "istio-system", Cluster: cluster, Revision: "canary", Version: "1.31.1",
			TrustDomain: "canary.org", IstiodServiceAccount: "istiod", PodLabels: l("app", "istiod", "istio.io/rev", "canary"),
		}},
	}, {
		name: "a ConfigMap in another namespace is not the mesh config",
		in: discovery.Inputs{
			Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod", nil)},
			ConfigMaps:  []*corev1.ConfigMap{configMap("other", "istio", "trustDomain: other.org")},
		},
		want: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1",
			TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels,
		}},
	}, {
		name: "a mesh config that does not parse gives the defaults",
		in: discovery.Inputs{
			Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod", nil)},
			ConfigMaps:  []*corev1.ConfigMap{configMap("istio-system", "istio", "trustDomain: [unclosed\n\t:::")},
		},
		want: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1",
			TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels,
		}},
	}, {
		name: "a wrongly typed trustDomain keeps the default; DNS capture as a YAML boolean",
		in: discovery.Inputs{
			Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod", nil)},
			ConfigMaps: []*corev1.ConfigMap{configMap("istio-system", "istio",
				"trustDomain: {a: b}\ndefaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: true\n")},
		},
		want: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1",
			TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels, SmartDnsProxying: true,
		}},
	}, {
		name: "DNS capture other than true is off",
		in: discovery.Inputs{
			Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod", nil)},
			ConfigMaps: []*corev1.ConfigMap{configMap("istio-system", "istio",
				"defaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: \"TRUE\"\n")},
		},
		want: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1",
			TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels,
		}},
	}, {
		name: "no service account means default; a digest-only image has no tag",
		in: discovery.Inputs{Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod", nil, func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.ServiceAccountName = ""
			d.Spec.Template.Spec.Containers[0].Image = "registry.local:5000/istio/pilot@sha256:0123abcd"
		})}},
		want: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "istio-system", Cluster: cluster,
			TrustDomain: "cluster.local", IstiodServiceAccount: "default", PodLabels: podLabels,
		}},
	}, {
		name: "tag and digest: the tag; no containers: no version",
		in: discovery.Inputs{Deployments: []*appsv1.Deployment{
			istiod("a", "istiod", nil, func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.Containers[0].Image = "registry.local:5000/pilot:1.29.0@sha256:0123"
			}),
			istiod("b", "istiod", nil, func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers = nil }),
		}},
		want: []*relaypb.Mesh{{
			Name: "istiod", Namespace: "a", Cluster: cluster, Version: "1.29.0",
			TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels,
		}, {
			Name: "istiod", Namespace: "b", Cluster: cluster,
			TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels,
		}},
	}, {
		name: "other Deployments are not meshes; meshes sort by namespace then name",
		in: discovery.Inputs{Deployments: []*appsv1.Deployment{
			deployment("istio-system", "prometheus", l("app", "prometheus")),
			istiod("istio-system", "istiod-canary", l("istio.io/rev", "canary")),
			istiod("istio-system", "istiod", nil),
			istiod("alpha", "istiod", nil),
		}},
		want: []*relaypb.Mesh{
			{Name: "istiod", Namespace: "alpha", Cluster: cluster, Version: "1.31.1", TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels},
			{Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1", TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels},
			{Name: "istiod-canary", Namespace: "istio-system", Cluster: cluster, Revision: "canary", Version: "1.31.1", TrustDomain: "cluster.local", IstiodServiceAccount: "istiod", PodLabels: podLabels},
		},
	}, {
		name: "no Deployments, no meshes",
		in:   discovery.Inputs{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertProtos(t, tt.want, discovery.Build(cluster, tt.in).Meshes)
		})
	}
}

// TestBuildGateways: gateway kinds, which mesh a gateway joins, its address
// and TLS port.
func TestBuildGateways(t *testing.T) {
	lb := func(ingress ...corev1.LoadBalancerIngress) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Status.LoadBalancer.Ingress = ingress
		}
	}
	gw := func(ns, name, kind string, opts ...func(*corev1.Service)) *corev1.Service {
		return service(ns, name, l("istio", kind), append([]func(*corev1.Service){withLabels(l("istio", kind))}, opts...)...)
	}
	defaultMesh := istiod("istio-system", "istiod", nil)
	canaryMesh := istiod("istio-system", "istiod-canary", l("istio.io/rev", "canary"))
	type placed struct {
		mesh    string // namespace/name of the mesh
		gateway *relaypb.Gateway
	}
	tests := []struct {
		name     string
		meshes   []*appsv1.Deployment
		services []*corev1.Service
		want     []placed
	}{{
		name:   "ingress gateway: first LB ingress IP, port named tls",
		meshes: []*appsv1.Deployment{defaultMesh},
		services: []*corev1.Service{gw("istio-system", "istio-ingressgateway", "ingressgateway",
			lb(corev1.LoadBalancerIngress{IP: "203.0.113.1"}, corev1.LoadBalancerIngress{IP: "203.0.113.2"}),
			withPorts(corev1.ServicePort{Name: "http2", Port: 80}, corev1.ServicePort{Name: "tls", Port: 8443}, corev1.ServicePort{Name: "x", Port: 15443}))},
		want: []placed{{"istio-system/istiod", &relaypb.Gateway{
			Name: "istio-ingressgateway", Namespace: "istio-system", Kind: "Ingress",
			WorkloadLabels: l("istio", "ingressgateway"), ExternalAddress: "203.0.113.1", TlsPort: 8443,
		}}},
	}, {
		name:   "east-west gateway: LB hostname, unnamed 15443",
		meshes: []*appsv1.Deployment{defaultMesh},
		services: []*corev1.Service{gw("istio-system", "istio-eastwestgateway", "eastwestgateway",
			lb(corev1.LoadBalancerIngress{Hostname: "ew.example.com"}),
			withPorts(corev1.ServicePort{Name: "status-port", Port: 15021}, corev1.ServicePort{Name: "mtls", Port: 15443}))},
		want: []placed{{"istio-system/istiod", &relaypb.Gateway{
			Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest",
			WorkloadLabels: l("istio", "eastwestgateway"), ExternalAddress: "ew.example.com", TlsPort: 15443,
		}}},
	}, {
		name:   "external IP when there is no LB ingress; no TLS port",
		meshes: []*appsv1.Deployment{defaultMesh},
		services: []*corev1.Service{gw("istio-system", "gw", "ingressgateway", func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"198.51.100.7", "198.51.100.8"}
		})},
		want: []placed{{"istio-system/istiod", &relaypb.Gateway{
			Name: "gw", Namespace: "istio-system", Kind: "Ingress",
			WorkloadLabels: l("istio", "ingressgateway"), ExternalAddress: "198.51.100.7",
		}}},
	}, {
		name:     "cluster IP as the last resort",
		meshes:   []*appsv1.Deployment{defaultMesh},
		services: []*corev1.Service{gw("istio-system", "gw", "eastwestgateway")},
		want: []placed{{"istio-system/istiod", &relaypb.Gateway{
			Name: "gw", Namespace: "istio-system", Kind: "EastWest",
			WorkloadLabels: l("istio", "eastwestgateway"), ExternalAddress: "10.96.0.10",
		}}},
	}, {
		name:   "headless: no address",
		meshes: []*appsv1.Deployment{defaultMesh},
		services: []*corev1.Service{gw("istio-system", "gw", "eastwestgateway", func(s *corev1.Service) {
			s.Spec.ClusterIP = corev1.ClusterIPNone
		})},
		want: []placed{{"istio-system/istiod", &relaypb.Gateway{
			Name: "gw", Namespace: "istio-system", Kind: "EastWest", WorkloadLabels: l("istio", "eastwestgateway"),
		}}},
	}, {
		name:     "in another namespace: the default-revision mesh when there are several",
		meshes:   []*appsv1.Deployment{canaryMesh, defaultMesh},
		services: []*corev1.Service{gw("gateways", "gw", "ingressgateway")},
		want: []placed{{"istio-system/istiod", &relaypb.Gateway{
			Name: "gw", Namespace: "gateways", Kind: "Ingress", WorkloadLabels: l("istio", "ingressgateway"), ExternalAddress: "10.96.0.10",
		}}},
	}, {
		name:   "in another namespace with istio.io/rev: that revision's mesh",
		meshes: []*appsv1.Deployment{canaryMesh, defaultMesh},
		services: []*corev1.Service{gw("gateways", "gw", "ingressgateway", func(s *corev1.Service) {
			s.Labels["istio.io/rev"] = "canary"
		})},
		want: []placed{{"istio-system/istiod-canary", &relaypb.Gateway{
			Name: "gw", Namespace: "gateways", Kind: "Ingress", WorkloadLabels: l("istio", "ingressgateway"), ExternalAddress: "10.96.0.10",
		}}},
	}, {
		name:     "in another namespace: the only mesh, even of a revision",
		meshes:   []*appsv1.Deployment{canaryMesh},
		services: []*corev1.Service{gw("gateways", "gw", "ingressgateway")},
		want: []placed{{"istio-system/istiod-canary", &relaypb.Gateway{
			Name: "gw", Namespace: "gateways", Kind: "Ingress", WorkloadLabels: l("istio", "ingressgateway"), ExternalAddress: "10.96.0.10",
		}}},
	}, {
		name:     "in another namespace, several meshes, none default: not reported",
		meshes:   []*appsv1.Deployment{canaryMesh, istiod("istio-system", "istiod-stable", l("istio.io/rev", "stable"))},
		services: []*corev1.Service{gw("gateways", "gw", "ingressgateway")},
	}, {
		name:   "same namespace, several meshes: by revision label, else the default one",
		meshes: []*appsv1.Deployment{canaryMesh, defaultMesh},
		services: []*corev1.Service{
			gw("istio-system", "gw-canary", "ingressgateway", func(s *corev1.Service) { s.Labels["istio.io/rev"] = "canary" }),
			gw("istio-system", "gw", "ingressgateway"),
		},
		want: []placed{
			{"istio-system/istiod", &relaypb.Gateway{Name: "gw", Namespace: "istio-system", Kind: "Ingress", WorkloadLabels: l("istio", "ingressgateway"), ExternalAddress: "10.96.0.10"}},
			{"istio-system/istiod-canary", &relaypb.Gateway{Name: "gw-canary", Namespace: "istio-system", Kind: "Ingress", WorkloadLabels: l("istio", "ingressgateway"), ExternalAddress: "10.96.0.10"}},
		},
	}, {
		name:     "a mesh in the gateway's namespace wins over the default one elsewhere",
		meshes:   []*appsv1.Deployment{defaultMesh, istiod("gateways", "istiod-gw", l("istio.io/rev", "gw"))},
		services: []*corev1.Service{gw("gateways", "gw", "ingressgateway")},
		want: []placed{{"gateways/istiod-gw", &relaypb.Gateway{
			Name: "gw", Namespace: "gateways", Kind: "Ingress", WorkloadLabels: l("istio", "ingressgateway"), ExternalAddress: "10.96.0.10",
		}}},
	}, {
		name:   "other istio label values and plain Services are not gateways",
		meshes: []*appsv1.Deployment{defaultMesh},
		services: []*corev1.Service{
			service("istio-system", "istiod", l("app", "istiod"), withLabels(l("istio", "pilot"))),
			service("istio-system", "plain", l("app", "x")),
		},
	}, {
		name:     "no mesh: no gateways",
		services: []*corev1.Service{gw("istio-system", "gw", "ingressgateway")},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := discovery.Build(cluster, discovery.Inputs{Deployments: tt.meshes, Services: tt.services})
			var got []placed
			for _, m := range s.Meshes {
				for _, g := range m.Gateways {
					got = append(got, placed{m.Namespace + "/" + m.Name, g})
				}
			}
			require.Len(t, got, len(tt.want))
			for i := range tt.want {
				assert.Equal(t, tt.want[i].mesh, got[i].mesh, "gateway %d: mesh", i)
				assertProto(t, tt.want[i].gateway, got[i].gateway, "gateway %d", i)
			}
		})
	}
}

// TestBuildInjection: the sidecar injection rules and revisions, one
// Deployment at a time, with a default and a canary mesh in the cluster.
func TestBuildInjection(t *testing.T) {
	meshes := []*appsv1.Deployment{
		istiod("istio-system", "istiod", nil),
		istiod("istio-system", "istiod-canary", l("istio.io/rev", "canary")),
	}
	tests := []struct {
		name        string
		ns          map[string]string // nil: the Namespace object is missing
		labels      map[string]string // pod template labels besides app=web
		annotations map[string]string
		want        string // the mesh's name, "" for not reported
	}{
		{name: "istio-injection=enabled", ns: l("istio-injection", "enabled"), want: "istiod"},
		{name: "istio-injection=disabled", ns: l("istio-injection", "disabled")},
		{name: "istio-injection other value", ns: l("istio-injection", "yes")},
		{name: "unlabelled namespace", ns: l()},
		{name: "namespace istio.io/rev=canary", ns: l("istio.io/rev", "canary"), want: "istiod-canary"},
		{name: "namespace istio.io/rev=default", ns: l("istio.io/rev", "default"), want: "istiod"},
		{name: "pod istio.io/rev=canary", ns: l(), labels: l("istio.io/rev", "canary"), want: "istiod-canary"},
		{name: "pod istio.io/rev, namespace object missing", labels: l("istio.io/rev", "canary"), want: "istiod-canary"},
		{name: "istio-injection=enabled wins over pod istio.io/rev", ns: l("istio-injection", "enabled"), labels: l("istio.io/rev", "canary"), want: "istiod"},
		{name: "istio-injection=enabled wins over namespace istio.io/rev", ns: l("istio-injection", "enabled", "istio.io/rev", "canary"), want: "istiod"},
		{name: "istio-injection=disabled wins over pod istio.io/rev", ns: l("istio-injection", "disabled"), labels: l("istio.io/rev", "canary")},
		{name: "namespace istio.io/rev wins over pod istio.io/rev", ns: l("istio.io/rev", "canary"), labels: l("istio.io/rev", "default"), want: "istiod-canary"},
		{name: "pod label inject=false", ns: l("istio-injection", "enabled"), labels: l("sidecar.istio.io/inject", "false")},
		{name: "pod annotation inject=false", ns: l("istio.io/rev", "canary"), annotations: l("sidecar.istio.io/inject", "false")},
		{name: "pod label inject=true, unlabelled namespace", ns: l(), labels: l("sidecar.istio.io/inject", "true"), want: "istiod"},
		{name: "pod annotation inject=true overrides istio-injection=disabled", ns: l("istio-injection", "disabled"), annotations: l("sidecar.istio.io/inject", "true"), want: "istiod"},
		{name: "inject=true with pod istio.io/rev", ns: l(), labels: l("sidecar.istio.io/inject", "true", "istio.io/rev", "canary"), want: "istiod-canary"},
		{name: "inject=true with namespace istio.io/rev", ns: l("istio.io/rev", "canary"), labels: l("sidecar.istio.io/inject", "true"), want: "istiod-canary"},
		{name: "inject=true, istio-injection=enabled wins over namespace istio.io/rev", ns: l("istio-injection", "enabled", "istio.io/rev", "canary"), labels: l("sidecar.istio.io/inject", "true"), want: "istiod"},
		{name: "label true wins over annotation false", ns: l(), labels: l("sidecar.istio.io/inject", "true"), annotations: l("sidecar.istio.io/inject", "false"), want: "istiod"},
		{name: "an unknown label value defers to the annotation", ns: l("istio-injection", "enabled"), labels: l("sidecar.istio.io/inject", "yes"), annotations: l("sidecar.istio.io/inject", "false")},
		{name: "unknown values are ignored", ns: l("istio-injection", "enabled"), labels: l("sidecar.istio.io/inject", "yes"), annotations: l("sidecar.istio.io/inject", "no"), want: "istiod"},
		{name: "revision without a mesh", ns: l("istio.io/rev", "stable")},
		{name: "pod revision without a mesh", ns: l(), labels: l("istio.io/rev", "stable")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			labels := l("app", "web")
			for k, v := range tt.labels {
				labels[k] = v
			}
			in := discovery.Inputs{
				Deployments: append([]*appsv1.Deployment{deployment("apps", "web", labels, withAnnotations(tt.annotations))}, meshes...),
			}
			if tt.ns != nil {
				in.Namespaces = []*corev1.Namespace{namespace("apps", tt.ns)}
			}
			s := discovery.Build(cluster, in)
			if tt.want == "" {
				assert.Empty(t, s.Workloads)
				return
			}
			require.Len(t, s.Workloads, 1)
			assert.Equal(t, tt.want, s.Workloads[0].MeshName)
			assert.Equal(t, "istio-system", s.Workloads[0].MeshNamespace)
		})
	}
}

// TestBuildWorkloads: the fields of a workload, the three kinds, the
// excluded Deployments, and the sort order.
func TestBuildWorkloads(t *testing.T) {
	enabled := l("istio-injection", "enabled")
	in := discovery.Inputs{
		Namespaces: []*corev1.Namespace{namespace("istio-system", enabled), namespace("apps", enabled), namespace("db", enabled)},
		Deployments: []*appsv1.Deployment{
			istiod("istio-system", "istiod", nil),
			deployment("istio-system", "istio-ingressgateway", l("istio", "ingressgateway", "app", "istio-ingressgateway")),
			func() *appsv1.Deployment { // labelled on the object only
				d := deployment("istio-system", "ew", l("app", "ew"))
				d.Labels = l("istio", "eastwestgateway")
				return d
			}(),
			deployment("apps", "web", l("app", "web", "version", "v1"), withSA("web")),
			deployment("apps", "cache", l("app", "cache")),
		},
		StatefulSets: []*appsv1.StatefulSet{statefulSet("db", "pg", l("app", "pg"), withSA("pg")), statefulSet("apps", "web", l("app", "web-db"))},
		DaemonSets:   []*appsv1.DaemonSet{daemonSet("apps", "node-agent", l("app", "node-agent")), daemonSet("apps", "gw", l("istio", "eastwestgateway"))},
	}
	want := []*relaypb.Workload{
		{Name: "cache", Namespace: "apps", Cluster: cluster, Kind: "Deployment", PodLabels: l("app", "cache"), ServiceAccount: "default", MeshName: "istiod", MeshNamespace: "istio-system"},
		{Name: "node-agent", Namespace: "apps", Cluster: cluster, Kind: "DaemonSet", PodLabels: l("app", "node-agent"), ServiceAccount: "default", MeshName: "istiod", MeshNamespace: "istio-system"},
		{Name: "web", Namespace: "apps", Cluster: cluster, Kind: "Deployment", PodLabels: l("app", "web", "version", "v1"), ServiceAccount: "web", MeshName: "istiod", MeshNamespace: "istio-system"},
		{Name: "web", Namespace: "apps", Cluster: cluster, Kind: "StatefulSet", PodLabels: l("app", "web-db"), ServiceAccount: "default", MeshName: "istiod", MeshNamespace: "istio-system"},
		{Name: "pg", Namespace: "db", Cluster: cluster, Kind: "StatefulSet", PodLabels: l("app", "pg"), ServiceAccount: "pg", MeshName: "istiod", MeshNamespace: "istio-system"},
	}
	assertProtos(t, want, discovery.Build(cluster, in).Workloads)
}

// TestBuildWorkloadsNoMesh: without an istiod nothing is a workload, however
// it is labelled.
func TestBuildWorkloadsNoMesh(t *testing.T) {
	s := discovery.Build(cluster, discovery.Inputs{
		Namespaces:  []*corev1.Namespace{namespace("apps", l("istio-injection", "enabled"))},
		Deployments: []*appsv1.Deployment{deployment("apps", "web", l("app", "web", "sidecar.istio.io/inject", "true"))},
		Services:    []*corev1.Service{service("apps", "web", l("app", "web"))},
	})
	assert.Empty(t, s.Meshes)
	assert.Empty(t, s.Workloads)
	assert.Empty(t, s.Destinations, "no workloads, no destinations")
}

// bookinfo is an injected namespace with reviews v1, v2 (and a v3 that is
// not injected) around one default mesh.
func bookinfo() discovery.Inputs {
	return discovery.Inputs{
		Namespaces: []*corev1.Namespace{namespace("bookinfo", l("istio-injection", "enabled")), namespace("other", l("istio-injection", "enabled"))},
		Deployments: []*appsv1.Deployment{
			istiod("istio-system", "istiod", nil),
			deployment("bookinfo", "reviews-v1", l("app", "reviews", "version", "v1", "team", "books", "canary", "no"), withSA("reviews")),
			deployment("bookinfo", "reviews-v2", l("app", "reviews", "version", "v2", "team", "books"), withSA("reviews")),
			deployment("bookinfo", "reviews-v3", l("app", "reviews", "version", "v3", "sidecar.istio.io/inject", "false")),
			deployment("other", "ratings", l("app", "ratings")),
		},
	}
}

// TestBuildDestinations: which Services are destinations, and their subsets,
// labels, type, mesh and addresses.
func TestBuildDestinations(t *testing.T) {
	tests := []struct {
		name     string
		services []*corev1.Service
		extra    func(*discovery.Inputs)
		want     []*relaypb.Destination
	}{{
		name:     "subsets: keys on all selected workloads, outside the selector, with differing values",
		services: []*corev1.Service{service("bookinfo", "reviews", l("app", "reviews"), withLabels(l("app", "reviews", "service", "reviews")))},
		want: []*relaypb.Destination{{
			Name: "reviews", Namespace: "bookinfo", Cluster: cluster, Selector: l("app", "reviews"), Labels: l("app", "reviews", "service", "reviews"),
			Ports:       []*relaypb.ServicePort{{Port: 9080, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "9080"}},
			Subsets:     map[string]*relaypb.LabelValues{"version": {Values: []string{"v1", "v2"}}},
			ServiceType: "ClusterIP", MeshName: "istiod", MeshNamespace: "istio-system",
		}},
	}, {
		name:     "one selected workload: no subsets",
		services: []*corev1.Service{service("bookinfo", "reviews-v1", l("app", "reviews", "version", "v1"))},
		want: []*relaypb.Destination{{
			Name: "reviews-v1", Namespace: "bookinfo", Cluster: cluster, Selector: l("app", "reviews", "version", "v1"),
			Ports:       []*relaypb.ServicePort{{Port: 9080, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "9080"}},
			ServiceType: "ClusterIP", MeshName: "istiod", MeshNamespace: "istio-system",
		}},
	}, {
		name: "not destinations: no match, only a non-injected match, another namespace's workload, no selector, gateway",
		services: []*corev1.Service{
			service("bookinfo", "details", l("app", "details")),
			service("bookinfo", "reviews-v3", l("app", "reviews", "version", "v3")),
			service("bookinfo", "ratings", l("app", "ratings")),
			service("bookinfo", "external", nil, func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }),
			service("bookinfo", "gw", l("app", "reviews"), withLabels(l("istio", "ingressgateway"))),
			service("empty", "reviews", l("app", "reviews")),
		},
	}, {
		name: "the mesh of the first selected workload",
		extra: func(in *discovery.Inputs) {
			in.Deployments = append(in.Deployments,
				istiod("istio-system", "istiod-canary", l("istio.io/rev", "canary")),
				deployment("bookinfo", "a-reviews-canary", l("app", "reviews", "version", "v9", "istio.io/rev", "canary", "sidecar.istio.io/inject", "true")))
		},
		services: []*corev1.Service{service("bookinfo", "reviews", l("app", "reviews"))},
		want: []*relaypb.Destination{{
			Name: "reviews", Namespace: "bookinfo", Cluster: cluster, Selector: l("app", "reviews"),
			Ports:       []*relaypb.ServicePort{{Port: 9080, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "9080"}},
			Subsets:     map[string]*relaypb.LabelValues{"version": {Values: []string{"v1", "v2", "v9"}}},
			ServiceType: "ClusterIP", MeshName: "istiod-canary", MeshNamespace: "istio-system",
		}},
	}, {
		name: "LoadBalancer: every ingress address and external IP, once",
		services: []*corev1.Service{service("bookinfo", "reviews", l("app", "reviews", "version", "v2"), func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalIPs = []string{"198.51.100.1", "203.0.113.1"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.1"}, {Hostname: "lb.example.com"}, {}}
		})},
		want: []*relaypb.Destination{{
			Name: "reviews", Namespace: "bookinfo", Cluster: cluster, Selector: l("app", "reviews", "version", "v2"),
			Ports:             []*relaypb.ServicePort{{Port: 9080, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "9080"}},
			ServiceType:       "LoadBalancer",
			ExternalAddresses: []string{"203.0.113.1", "lb.example.com", "198.51.100.1"},
			MeshName:          "istiod", MeshNamespace: "istio-system",
		}},
	}, {
		name: "no type: ClusterIP; destinations sort by namespace/name",
		extra: func(in *discovery.Inputs) {
			in.Deployments = append(in.Deployments, deployment("a-ns", "api", l("app", "api")))
			in.Namespaces = append(in.Namespaces, namespace("a-ns", l("istio-injection", "enabled")))
		},
		services: []*corev1.Service{
			service("bookinfo", "reviews", l("app", "reviews", "version", "v1"), func(s *corev1.Service) { s.Spec.Type = ""; s.Spec.Ports = nil }),
			service("a-ns", "api", l("app", "api"), withPorts()),
		},
		want: []*relaypb.Destination{
			{Name: "api", Namespace: "a-ns", Cluster: cluster, Selector: l("app", "api"), ServiceType: "ClusterIP", MeshName: "istiod", MeshNamespace: "istio-system"},
			{Name: "reviews", Namespace: "bookinfo", Cluster: cluster, Selector: l("app", "reviews", "version", "v1"), ServiceType: "ClusterIP", MeshName: "istiod", MeshNamespace: "istio-system"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := bookinfo()
			if tt.extra != nil {
				tt.extra(&in)
			}
			in.Services = tt.services
			assertProtos(t, tt.want, discovery.Build(cluster, in).Destinations)
		})
	}
}

// TestBuildPorts: protocols, app protocols (given or inferred from the port
// name as Istio does) and target ports.
func TestBuildPorts(t *testing.T) {
	str := func(s string) *string { return &s }
	tests := []struct {
		port corev1.ServicePort
		want *relaypb.ServicePort
	}{
		{corev1.ServicePort{Name: "http", Port: 80}, &relaypb.ServicePort{Port: 80, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "80"}},
		{corev1.ServicePort{Name: "http-web", Port: 80, TargetPort: intstr.FromInt32(8080)}, &relaypb.ServicePort{Port: 80, Name: "http-web", Protocol: "TCP", AppProtocol: "http", TargetPort: "8080"}},
		{corev1.ServicePort{Name: "HTTP2-api", Port: 81, TargetPort: intstr.FromString("api")}, &relaypb.ServicePort{Port: 81, Name: "HTTP2-api", Protocol: "TCP", AppProtocol: "http2", TargetPort: "api"}},
		{corev1.ServicePort{Name: "grpc-web-ui", Port: 82}, &relaypb.ServicePort{Port: 82, Name: "grpc-web-ui", Protocol: "TCP", AppProtocol: "grpc-web", TargetPort: "82"}},
		{corev1.ServicePort{Name: "grpc", Port: 83}, &relaypb.ServicePort{Port: 83, Name: "grpc", Protocol: "TCP", AppProtocol: "grpc", TargetPort: "83"}},
		{corev1.ServicePort{Name: "https-admin", Port: 443}, &relaypb.ServicePort{Port: 443, Name: "https-admin", Protocol: "TCP", AppProtocol: "https", TargetPort: "443"}},
		{corev1.ServicePort{Name: "tls", Port: 15443}, &relaypb.ServicePort{Port: 15443, Name: "tls", Protocol: "TCP", AppProtocol: "tls", TargetPort: "15443"}},
		{corev1.ServicePort{Name: "tcp-db", Port: 5432}, &relaypb.ServicePort{Port: 5432, Name: "tcp-db", Protocol: "TCP", AppProtocol: "tcp", TargetPort: "5432"}},
		{corev1.ServicePort{Name: "mongo", Port: 27017}, &relaypb.ServicePort{Port: 27017, Name: "mongo", Protocol: "TCP", AppProtocol: "mongo", TargetPort: "27017"}},
		{corev1.ServicePort{Name: "redis-cache", Port: 6379}, &relaypb.ServicePort{Port: 6379, Name: "redis-cache", Protocol: "TCP", AppProtocol: "redis", TargetPort: "6379"}},
		{corev1.ServicePort{Name: "mysql", Port: 3306}, &relaypb.ServicePort{Port: 3306, Name: "mysql", Protocol: "TCP", AppProtocol: "mysql", TargetPort: "3306"}},
		{corev1.ServicePort{Name: "http_proxy", Port: 3128}, &relaypb.ServicePort{Port: 3128, Name: "http_proxy", Protocol: "TCP", AppProtocol: "http_proxy", TargetPort: "3128"}},
		{corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}, &relaypb.ServicePort{Port: 53, Name: "dns", Protocol: "UDP", TargetPort: "53"}},
		{corev1.ServicePort{Name: "web", Port: 8000}, &relaypb.ServicePort{Port: 8000, Name: "web", Protocol: "TCP", TargetPort: "8000"}},
		{corev1.ServicePort{Name: "httpx-api", Port: 8001}, &relaypb.ServicePort{Port: 8001, Name: "httpx-api", Protocol: "TCP", TargetPort: "8001"}},
		{corev1.ServicePort{Port: 8002}, &relaypb.ServicePort{Port: 8002, Protocol: "TCP", TargetPort: "8002"}},
		{corev1.ServicePort{Name: "web", Port: 8003, AppProtocol: str("kubernetes.io/h2c")}, &relaypb.ServicePort{Port: 8003, Name: "web", Protocol: "TCP", AppProtocol: "kubernetes.io/h2c", TargetPort: "8003"}},
		{corev1.ServicePort{Name: "http", Port: 8004, AppProtocol: str("grpc")}, &relaypb.ServicePort{Port: 8004, Name: "http", Protocol: "TCP", AppProtocol: "grpc", TargetPort: "8004"}},
	}
	ports := make([]corev1.ServicePort, len(tests))
	want := make([]*relaypb.ServicePort, len(tests))
	for i, tt := range tests {
		ports[i], want[i] = tt.port, tt.want
	}
	in := bookinfo()
	in.Services = []*corev1.Service{service("bookinfo", "reviews", l("app", "reviews"), withPorts(ports...))}
	s := discovery.Build(cluster, in)
	require.Len(t, s.Destinations, 1)
	assertProtos(t, want, s.Destinations[0].Ports, "ports keep the Service's order")
}

// TestBuildEndpoints: which pods are endpoints, and their order.
func TestBuildEndpoints(t *testing.T) {
	v1 := l("app", "reviews", "version", "v1")
	deleting := metav1.Now()
	in := bookinfo()
	in.Services = []*corev1.Service{service("bookinfo", "reviews", l("app", "reviews"))}
	in.Pods = []*corev1.Pod{
		pod("bookinfo", "ready-b", "10.0.0.20", v1),
		pod("bookinfo", "ready-a", "10.0.0.3", l("app", "reviews", "version", "v2")),
		pod("bookinfo", "running-no-conditions", "10.0.0.4", v1, func(p *corev1.Pod) { p.Status.Conditions = nil }),
		pod("bookinfo", "same-ip-a", "10.0.0.5", v1),
		pod("bookinfo", "same-ip-b", "10.0.0.5", v1),
		pod("bookinfo", "not-ready", "10.0.0.6", v1, func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }),
		pod("bookinfo", "pending-no-conditions", "10.0.0.7", v1, func(p *corev1.Pod) { p.Status.Conditions = nil; p.Status.Phase = corev1.PodPending }),
		pod("bookinfo", "conditions-without-ready", "10.0.0.8", v1, func(p *corev1.Pod) { p.Status.Conditions[0].Type = corev1.PodScheduled }),
		pod("bookinfo", "no-ip", "", v1),
		pod("bookinfo", "deleting", "10.0.0.9", v1, func(p *corev1.Pod) { p.DeletionTimestamp = &deleting }),
		pod("bookinfo", "succeeded", "10.0.0.10", v1, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		pod("bookinfo", "other-app", "10.0.0.11", l("app", "details")),
		pod("other", "other-namespace", "10.0.0.12", v1),
		nil,
	}
	s := discovery.Build(cluster, in)
	require.Len(t, s.Destinations, 1)
	v2 := l("app", "reviews", "version", "v2")
	assertProtos(t, []*relaypb.Endpoint{
		{Ip: "10.0.0.20", Labels: v1}, // string order, as sorted
		{Ip: "10.0.0.3", Labels: v2},
		{Ip: "10.0.0.4", Labels: v1},
		{Ip: "10.0.0.5", Labels: v1},
		{Ip: "10.0.0.5", Labels: v1},
	}, s.Destinations[0].Endpoints)
}

// TestBuildCluster: the snapshot and every mesh, workload and destination
// carry the configured cluster name.
func TestBuildCluster(t *testing.T) {
	in := bookinfo()
	in.Services = []*corev1.Service{service("bookinfo", "reviews", l("app", "reviews"))}
	for _, name := range []string{"cluster-1", "east"} {
		s := discovery.Build(name, in)
		assert.Equal(t, name, s.Cluster)
		require.NotEmpty(t, s.Meshes)
		require.NotEmpty(t, s.Workloads)
		require.NotEmpty(t, s.Destinations)
		for _, m := range s.Meshes {
			assert.Equal(t, name, m.Cluster)
		}
		for _, w := range s.Workloads {
			assert.Equal(t, name, w.Cluster)
		}
		for _, d := range s.Destinations {
			assert.Equal(t, name, d.Cluster)
		}
	}
}

// TestBuildDoesNotAlias: Build leaves its input alone, and the snapshot
// shares no maps with it.
func TestBuildDoesNotAlias(t *testing.T) {
	in := bookinfo()
	in.Services = []*corev1.Service{service("bookinfo", "reviews", l("app", "reviews"), withLabels(l("app", "reviews")))}
	in.Pods = []*corev1.Pod{pod("bookinfo", "p", "10.0.0.1", l("app", "reviews", "version", "v1"))}
	before := discovery.Build(cluster, in)
	s := discovery.Build(cluster, in)
	s.Meshes[0].PodLabels["x"] = "y"
	s.Workloads[0].PodLabels["x"] = "y"
	s.Destinations[0].Selector["x"] = "y"
	s.Destinations[0].Labels["x"] = "y"
	s.Destinations[0].Endpoints[0].Labels["x"] = "y"
	after := discovery.Build(cluster, in)
	assertProto(t, before, after)
}
