package discovery_test

import (
	"fmt"
	"testing"

	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
)

func withEnv(name, value string) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) {
		c := &d.Spec.Template.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	}
}

// waypointGateway is a Gateway API Gateway as the dynamic client returns it.
func waypointGateway(ns, name, class string, labels map[string]string, addresses ...string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1",
		"kind":       "Gateway",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"gatewayClassName": class,
			"listeners":        []any{map[string]any{"name": "mesh", "port": int64(15008), "protocol": "HBONE"}},
		},
	}}
	u.SetLabels(labels)
	if len(addresses) > 0 {
		var as []any
		for _, a := range addresses {
			as = append(as, map[string]any{"type": "Hostname", "value": a})
		}
		u.Object["status"] = map[string]any{"addresses": as}
	}
	return u
}

// ambientShop is one mesh in the middle of a migration: namespace shop is
// ambient (with a waypoint for its Services), namespace legacy still has
// sidecars, and one shop Deployment keeps its sidecar.
func ambientShop() discovery.Inputs {
	return discovery.Inputs{
		Namespaces: []*corev1.Namespace{
			namespace("istio-system", nil),
			namespace("shop", l("istio.io/dataplane-mode", "ambient", "istio.io/use-waypoint", "waypoint")),
			namespace("legacy", l("istio-injection", "enabled")),
			namespace("plain", nil),
		},
		Deployments: []*appsv1.Deployment{
			istiod("istio-system", "istiod", nil, withEnv("PILOT_ENABLE_AMBIENT", "true")),
			deployment("shop", "productpage", l("app", "productpage"), withSA("productpage")),
			deployment("shop", "reviews-v1", l("app", "reviews", "version", "v1"), withSA("reviews")),
			deployment("shop", "ratings", l("app", "ratings", "istio.io/use-waypoint", "none"), withSA("ratings")),
			deployment("shop", "opted-out", l("app", "opted-out", "istio.io/dataplane-mode", "none")),
			deployment("shop", "still-sidecar", l("app", "still-sidecar", "sidecar.istio.io/inject", "true")),
			deployment("shop", "waypoint", l("gateway.networking.k8s.io/gateway-name", "waypoint"), withSA("waypoint")),
			deployment("legacy", "details", l("app", "details")),
			deployment("plain", "own-pod", l("app", "own", "istio.io/dataplane-mode", "ambient")),
		},
		DaemonSets: []*appsv1.DaemonSet{
			daemonSet("istio-system", "ztunnel", l("app", "ztunnel", "istio.io/dataplane-mode", "none")),
		},
		Services: []*corev1.Service{
			service("shop", "reviews", l("app", "reviews")),
			service("shop", "ratings", l("app", "ratings"), withLabels(l("istio.io/use-waypoint", "other-wp", "istio.io/use-waypoint-namespace", "infra"))),
			service("shop", "productpage", l("app", "productpage"), withLabels(l("istio.io/use-waypoint", "none"))),
			service("legacy", "details", l("app", "details")),
		},
		Pods: []*corev1.Pod{
			pod("shop", "reviews-v1-a", "10.0.0.2", l("app", "reviews", "version", "v1"), func(p *corev1.Pod) {
				p.Annotations = l("ambient.istio.io/redirection", "enabled")
			}),
			pod("shop", "reviews-v1-b", "10.0.0.3", l("app", "reviews", "version", "v1")),
		},
		Gateways: []*unstructured.Unstructured{
			waypointGateway("shop", "waypoint", "istio-waypoint", nil, "waypoint.shop.svc.cluster.local"),
			waypointGateway("infra", "other-wp", "istio-waypoint", l("istio.io/waypoint-for", "all")),
			waypointGateway("infra", "bogus-for", "istio-waypoint", l("istio.io/waypoint-for", "everything")),
			waypointGateway("shop", "ingress", "istio", nil, "203.0.113.1"),
		},
	}
}

// TestBuildAmbientMesh: an istiod with PILOT_ENABLE_AMBIENT, its ztunnel
// DaemonSet and the istio-waypoint Gateways make an ambient mesh; ingress
// Gateways and waypoint-for values istiod does not know are not waypoints.
func TestBuildAmbientMesh(t *testing.T) {
	s := discovery.Build(cluster, ambientShop())
	require.Len(t, s.Meshes, 1)
	m := s.Meshes[0]
	assert.True(t, m.Ambient)
	assert.True(t, m.Ztunnel)
	assertProtos(t, []*relaypb.Waypoint{
		{Name: "other-wp", Namespace: "infra", TrafficType: "all"},
		{Name: "waypoint", Namespace: "shop", TrafficType: "service", ServiceAccount: "waypoint", Ready: true},
	}, m.Waypoints)
}

// TestBuildAmbientWorkloads: sidecar wins over ambient, the pod template's
// dataplane-mode beats its namespace's, waypoint and ztunnel pods are not
// workloads, and each ambient workload says which waypoint it is bound to.
func TestBuildAmbientWorkloads(t *testing.T) {
	s := discovery.Build(cluster, ambientShop())
	wp := &relaypb.WaypointRef{Name: "waypoint", Namespace: "shop"}
	w := func(ns, name string, labels map[string]string, sa, mode string, ref *relaypb.WaypointRef) *relaypb.Workload {
		return &relaypb.Workload{Name: name, Namespace: ns, Cluster: cluster, Kind: "Deployment", PodLabels: labels, ServiceAccount: sa,
			MeshName: "istiod", MeshNamespace: "istio-system", DataPlaneMode: mode, Waypoint: ref}
	}
	assertProtos(t, []*relaypb.Workload{
		w("legacy", "details", l("app", "details"), "default", "", nil),
		w("plain", "own-pod", l("app", "own", "istio.io/dataplane-mode", "ambient"), "default", "ambient", nil),
		w("shop", "productpage", l("app", "productpage"), "productpage", "ambient", wp),
		w("shop", "ratings", l("app", "ratings", "istio.io/use-waypoint", "none"), "ratings", "ambient", nil),
		w("shop", "reviews-v1", l("app", "reviews", "version", "v1"), "reviews", "ambient", wp),
		w("shop", "still-sidecar", l("app", "still-sidecar", "sidecar.istio.io/inject", "true"), "default", "", nil),
	}, s.Workloads)
}

// TestBuildAmbientDestinations: a Service's waypoint comes from its own
// labels (with use-waypoint-namespace), else its namespace's, and "none"
// opts out; endpoints say whether istio-cni captured the pod.
func TestBuildAmbientDestinations(t *testing.T) {
	s := discovery.Build(cluster, ambientShop())
	byName := map[string]*relaypb.Destination{}
	for _, d := range s.Destinations {
		byName[d.Namespace+"/"+d.Name] = d
	}
	require.Len(t, byName, 4)
	assertProto(t, &relaypb.WaypointRef{Name: "waypoint", Namespace: "shop"}, byName["shop/reviews"].Waypoint)
	assertProto(t, &relaypb.WaypointRef{Name: "other-wp", Namespace: "infra"}, byName["shop/ratings"].Waypoint)
	assert.Nil(t, byName["shop/productpage"].Waypoint)
	assert.Nil(t, byName["legacy/details"].Waypoint)
	assert.Equal(t, "ambient", byName["shop/reviews"].DataPlaneMode)
	assert.Empty(t, byName["legacy/details"].DataPlaneMode, "sidecar")
	eps := byName["shop/reviews"].Endpoints
	require.Len(t, eps, 2)
	assert.True(t, eps[0].Ambient, "10.0.0.2 carries ambient.istio.io/redirection: enabled")
	assert.False(t, eps[1].Ambient)
}

// TestBuildAmbientCountsRunningPods: the pod templates say where a
// Destination's workloads are going, its ready pods where they are. A
// namespace relabelled for ambient while its pods still run sidecars is
// mixed until the last sidecar pod is gone (so the sidecar-era policy stays
// for them), and so is a rollback that leaves captured pods behind.
func TestBuildAmbientCountsRunningPods(t *testing.T) {
	sidecarStatus := func(p *corev1.Pod) { p.Annotations = l("sidecar.istio.io/status", `{"containers":["istio-proxy"]}`) }
	nativeSidecar := func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "istio-proxy", Image: "proxyv2"}}
	}
	captured := func(p *corev1.Pod) { p.Annotations = l("ambient.istio.io/redirection", "enabled") }
	for _, tc := range []struct {
		name string
		ns   map[string]string
		pods []func(*corev1.Pod)
		want string
	}{
		{"relabelled, both pods still have sidecars", l("istio.io/dataplane-mode", "ambient"), []func(*corev1.Pod){sidecarStatus, sidecarStatus}, "mixed"},
		{"relabelled, one restarted", l("istio.io/dataplane-mode", "ambient"), []func(*corev1.Pod){captured, sidecarStatus}, "mixed"},
		{"relabelled, a native sidecar left", l("istio.io/dataplane-mode", "ambient"), []func(*corev1.Pod){captured, nativeSidecar}, "mixed"},
		{"relabelled, all restarted", l("istio.io/dataplane-mode", "ambient"), []func(*corev1.Pod){captured, captured}, "ambient"},
		{"relabelled, no pod ready yet", l("istio.io/dataplane-mode", "ambient"), nil, "ambient"},
		{"sidecars, all injected", l("istio-injection", "enabled"), []func(*corev1.Pod){sidecarStatus, sidecarStatus}, ""},
		{"rolled back, one still captured", l("istio-injection", "enabled"), []func(*corev1.Pod){captured, sidecarStatus}, "mixed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := discovery.Inputs{
				Namespaces: []*corev1.Namespace{namespace("istio-system", nil), namespace("shop", tc.ns)},
				Deployments: []*appsv1.Deployment{
					istiod("istio-system", "istiod", nil, withEnv("PILOT_ENABLE_AMBIENT", "true")),
					deployment("shop", "reviews", l("app", "reviews"), withSA("reviews")),
				},
				Services: []*corev1.Service{service("shop", "reviews", l("app", "reviews"))},
			}
			for i, opt := range tc.pods {
				in.Pods = append(in.Pods, pod("shop", fmt.Sprintf("reviews-%d", i), fmt.Sprintf("10.0.0.%d", i+2), l("app", "reviews"), opt))
			}
			s := discovery.Build(cluster, in)
			require.Len(t, s.Destinations, 1)
			assert.Equal(t, tc.want, s.Destinations[0].DataPlaneMode)
		})
	}
}

// TestBuildReportsHeadlessServices: a Service with clusterIP None is
// reported headless (translation then knows a waypoint bound to it is not
// in its clients' path); one with a cluster IP is not.
func TestBuildReportsHeadlessServices(t *testing.T) {
	headless := func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }
	in := discovery.Inputs{
		Namespaces: []*corev1.Namespace{namespace("istio-system", nil), namespace("shop", l("istio.io/dataplane-mode", "ambient"))},
		Deployments: []*appsv1.Deployment{
			istiod("istio-system", "istiod", nil, withEnv("PILOT_ENABLE_AMBIENT", "true")),
			deployment("shop", "reviews", l("app", "reviews"), withSA("reviews")),
		},
		Services: []*corev1.Service{service("shop", "reviews", l("app", "reviews"), headless), service("shop", "reviews-vip", l("app", "reviews"))},
	}
	s := discovery.Build(cluster, in)
	require.Len(t, s.Destinations, 2)
	got := map[string]bool{}
	for _, d := range s.Destinations {
		got[d.Name] = d.Headless
	}
	assert.Equal(t, map[string]bool{"reviews": true, "reviews-vip": false}, got)
}

// TestBuildWaypointPodsAreNeverWorkloads: a waypoint deployed into a
// namespace that still injects sidecars (the first step of a migration) is
// not a workload, so its Service is no Destination a namespace-wide policy
// would select.
func TestBuildWaypointPodsAreNeverWorkloads(t *testing.T) {
	in := discovery.Inputs{
		Namespaces: []*corev1.Namespace{namespace("istio-system", nil), namespace("shop", l("istio-injection", "enabled"))},
		Deployments: []*appsv1.Deployment{
			istiod("istio-system", "istiod", nil, withEnv("PILOT_ENABLE_AMBIENT", "true")),
			deployment("shop", "reviews", l("app", "reviews")),
			deployment("shop", "waypoint", l("gateway.networking.k8s.io/gateway-name", "waypoint"), withSA("waypoint")),
		},
		Services: []*corev1.Service{
			service("shop", "reviews", l("app", "reviews")),
			service("shop", "waypoint", l("gateway.networking.k8s.io/gateway-name", "waypoint")),
		},
	}
	s := discovery.Build(cluster, in)
	require.Len(t, s.Workloads, 1)
	assert.Equal(t, "reviews", s.Workloads[0].Name)
	require.Len(t, s.Destinations, 1)
	assert.Equal(t, "reviews", s.Destinations[0].Name)
}

// TestBuildAmbientNeedsAmbientIstiod: without PILOT_ENABLE_AMBIENT (or with
// it false) nothing is captured: ambient-labelled workloads are not
// reported, and Gateways of class istio-waypoint are not waypoints.
func TestBuildAmbientNeedsAmbientIstiod(t *testing.T) {
	for _, env := range []string{"", "false", "yes-please"} {
		in := ambientShop()
		in.Deployments[0] = istiod("istio-system", "istiod", nil)
		if env != "" {
			in.Deployments[0] = istiod("istio-system", "istiod", nil, withEnv("PILOT_ENABLE_AMBIENT", env))
		}
		s := discovery.Build(cluster, in)
		require.Len(t, s.Meshes, 1)
		assert.False(t, s.Meshes[0].Ambient, env)
		assert.False(t, s.Meshes[0].Ztunnel, env)
		assert.Empty(t, s.Meshes[0].Waypoints, env)
		var names []string
		for _, w := range s.Workloads {
			names = append(names, w.Namespace+"/"+w.Name)
			assert.Empty(t, w.DataPlaneMode, env)
		}
		assert.Equal(t, []string{"legacy/details", "shop/still-sidecar"}, names, env)
	}
}

// TestBuildAmbientIsDeterministic: the same objects in reverse order give
// the same snapshot.
func TestBuildAmbientIsDeterministic(t *testing.T) {
	in := ambientShop()
	want := discovery.Build(cluster, in)
	reverse := func(n int, swap func(i, j int)) {
		for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
			swap(i, j)
		}
	}
	reverse(len(in.Gateways), func(i, j int) { in.Gateways[i], in.Gateways[j] = in.Gateways[j], in.Gateways[i] })
	reverse(len(in.Deployments), func(i, j int) { in.Deployments[i], in.Deployments[j] = in.Deployments[j], in.Deployments[i] })
	assert.Equal(t, want.Hash, discovery.Build(cluster, in).Hash)
}

// FuzzBuildAmbientLabels: whatever a workload cluster's users put in the
// ambient labels of namespaces, pod templates, Services and Gateways, Build
// does not panic and its snapshot passes the server's validation (a
// hostile label must not get the cluster's whole discovery refused).
func FuzzBuildAmbientLabels(f *testing.F) {
	f.Add("ambient", "waypoint", "shop", "service", "waypoint", "istio-waypoint")
	f.Add("none", "none", "", "all", "Way Point", "istio-waypoint")
	f.Add("ambient", "a/b", "../x", "everything", "w", "istio")
	f.Fuzz(func(t *testing.T, mode, useWaypoint, useNs, waypointFor, gwName, class string) {
		for _, v := range []string{mode, useWaypoint, useNs, waypointFor} {
			if len(validation.IsValidLabelValue(v)) > 0 {
				return // the apiserver stores no such label
			}
		}
		in := ambientShop()
		in.Namespaces[1].Labels = l("istio.io/dataplane-mode", mode, "istio.io/use-waypoint", useWaypoint, "istio.io/use-waypoint-namespace", useNs)
		in.Deployments[1].Spec.Template.Labels = l("app", "productpage", "istio.io/dataplane-mode", mode, "istio.io/use-waypoint", useWaypoint)
		in.Services[0].Labels = l("istio.io/use-waypoint", useWaypoint, "istio.io/use-waypoint-namespace", useNs)
		in.Gateways = append(in.Gateways, waypointGateway("shop", gwName, class, l("istio.io/waypoint-for", waypointFor), gwName))
		if len(validation.IsDNS1123Subdomain(gwName)) > 0 {
			return // the apiserver stores no Gateway of that name
		}
		s := discovery.Build(cluster, in)
		require.NoError(t, relay.ValidateSnapshot(cluster, s, relay.SnapshotLimits{}))
	})
}

// eastWestGateway is an ambient east-west Gateway on network, listening
// for HBONE on port (no listener when 0), with status addresses.
func eastWestGateway(ns, name, network string, port int64, annotations map[string]string, addresses ...string) *unstructured.Unstructured {
	u := waypointGateway(ns, name, "istio-east-west", nil)
	if network != "" {
		u.SetLabels(l("topology.istio.io/network", network))
	}
	u.SetAnnotations(annotations)
	listeners := []any{map[string]any{"name": "tls", "port": int64(15443), "protocol": "TLS"}}
	if port != 0 {
		listeners = append(listeners, map[string]any{"name": "mesh", "port": port, "protocol": "HBONE", "tls": map[string]any{"mode": "Terminate"}})
	}
	u.Object["spec"].(map[string]any)["listeners"] = listeners
	var as []any
	for _, a := range addresses {
		as = append(as, map[string]any{"type": "IPAddress", "value": a})
	}
	as = append(as, map[string]any{"type": "NamedAddress", "value": "not-an-address"})
	u.Object["status"] = map[string]any{"addresses": as}
	return u
}

// TestBuildAmbientEastWestGateways: an ambient mesh's network is its
// namespace's topology.istio.io/network label, and its east-west gateways
// are the istio-east-west Gateways with a network and an HBONE listener
// (the port of that listener; the service account the annotation's, else
// the Gateway's name; IP and hostname addresses only). A Gateway of
// another class, or without a network or an HBONE listener, is not one;
// a sidecar mesh has neither.
func TestBuildAmbientEastWestGateways(t *testing.T) {
	in := ambientShop()
	in.Namespaces[0] = namespace("istio-system", l("topology.istio.io/network", "net-1"))
	in.Gateways = append(in.Gateways,
		eastWestGateway("istio-system", "istio-eastwest", "net-1", 15008, nil, "192.0.2.10", "192.0.2.11"),
		eastWestGateway("istio-system", "custom-sa", "net-1", 16008, l("gateway.istio.io/service-account", "ew-pods")),
		eastWestGateway("istio-system", "no-network", "", 15008, nil, "192.0.2.12"),
		eastWestGateway("istio-system", "no-hbone", "net-1", 0, nil, "192.0.2.13"),
		eastWestGateway("istio-system", "bad-network", "not a label value!", 15008, nil, "192.0.2.14"),
		waypointGateway("istio-system", "remote", "istio-remote", l("topology.istio.io/network", "net-2"), "192.0.2.15"),
	)
	s := discovery.Build(cluster, in)
	require.Len(t, s.Meshes, 1)
	assert.False(t, s.Meshes[0].MultiNetwork)
	assert.False(t, s.Meshes[0].GlobalServiceScope)
	in.Deployments[0] = istiod("istio-system", "istiod", nil, withEnv("PILOT_ENABLE_AMBIENT", "true"), withEnv("AMBIENT_ENABLE_MULTI_NETWORK", "true"))
	in.ConfigMaps = []*corev1.ConfigMap{configMap("istio-system", "istio",
		"serviceScopeConfigs:\n- servicesSelector:\n    matchExpressions: [{key: istio.io/global, operator: In, values: [\"true\"]}]\n  scope: GLOBAL\n")}
	s = discovery.Build(cluster, in)
	require.Len(t, s.Meshes, 1)
	m := s.Meshes[0]
	assert.True(t, m.MultiNetwork, "AMBIENT_ENABLE_MULTI_NETWORK on istiod")
	assert.True(t, m.GlobalServiceScope, "the ambient profile's serviceScopeConfigs")
	assert.Equal(t, "net-1", m.Network)
	assertProtos(t, []*relaypb.EastWestGateway{
		{Name: "custom-sa", Namespace: "istio-system", Network: "net-1", HbonePort: 16008, ServiceAccount: "ew-pods"},
		{Name: "istio-eastwest", Namespace: "istio-system", Network: "net-1", HbonePort: 15008, ServiceAccount: "istio-eastwest", Addresses: []string{"192.0.2.10", "192.0.2.11"}},
	}, m.EastWestGateways)
	require.NoError(t, relay.ValidateSnapshot(cluster, s, relay.SnapshotLimits{}), "what discovery reports passes the server's checks")

	// The same objects beside a sidecar istiod: no network, no gateway.
	in.Deployments[0] = istiod("istio-system", "istiod", nil, withEnv("AMBIENT_ENABLE_MULTI_NETWORK", "true"))
	s = discovery.Build(cluster, in)
	require.Len(t, s.Meshes, 1)
	assert.Empty(t, s.Meshes[0].Network)
	assert.False(t, s.Meshes[0].MultiNetwork)
	assert.False(t, s.Meshes[0].GlobalServiceScope)
	assert.Empty(t, s.Meshes[0].EastWestGateways)
}
