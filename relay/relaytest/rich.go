package relaytest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
)

// Rich is a realistic cluster, built without the agent's discovery: the
// snapshot discovery.Build makes of the cluster of its BenchmarkBuild10kPods
// (discovery's TestRichIsWhatBuildMakes holds the two equal). One mesh
// (istiod, with an east-west gateway) and, in each of Namespaces injected
// namespaces ns-00, ns-01, …, 10 apps of two versions (Deployments
// app-N-v1 and app-N-v2) with 10 ready pods each, and two Services per app
// (app-N on port 9080 and app-N-grpc on 9090) that both select the app's
// 20 pods. Pods carry app, version, team and pod-template-hash labels.
// Per namespace that is 200 pods, 20 Workloads and 20 Destinations of 20
// endpoints each; 500 namespaces are 100,000 pods.
type Rich struct {
	Namespaces int
}

// Pods in the cluster.
func (r Rich) Pods() int { return r.Namespaces * 200 }

// Snapshot is cluster's snapshot, with its hash (snapshothash.Of).
func (r Rich) Snapshot(cluster string) *relaypb.Snapshot {
	s := &relaypb.Snapshot{Cluster: cluster, Meshes: []*relaypb.Mesh{{Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1",
		TrustDomain: cluster + ".local", IstiodServiceAccount: "istiod", PodLabels: map[string]string{"app": "istiod"},
		Gateways: []*relaypb.Gateway{{Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest",
			WorkloadLabels: map[string]string{"istio": "eastwestgateway"}, ExternalAddress: "10.96.0.10", TlsPort: 15443}}}}}
	ip := 0
	for n := range r.Namespaces {
		ns := fmt.Sprintf("ns-%02d", n)
		for a := range 10 {
			app := fmt.Sprintf("app-%d", a)
			var endpoints []*relaypb.Endpoint
			for _, v := range []string{"v1", "v2"} {
				s.Workloads = append(s.Workloads, &relaypb.Workload{Name: app + "-" + v, Namespace: ns, Cluster: cluster, Kind: "Deployment",
					PodLabels: map[string]string{"app": app, "version": v, "team": "t" + ns}, ServiceAccount: app, MeshName: "istiod", MeshNamespace: "istio-system"})
				for range 10 {
					endpoints = append(endpoints, &relaypb.Endpoint{Ip: fmt.Sprintf("10.%d.%d.%d", ip>>16&255, ip>>8&255, ip&255),
						Labels: map[string]string{"app": app, "version": v, "team": "t" + ns, "pod-template-hash": "h" + v}})
					ip++
				}
			}
			// discovery orders endpoints by IP, as text.
			slices.SortFunc(endpoints, func(a, b *relaypb.Endpoint) int { return strings.Compare(a.GetIp(), b.GetIp()) })
			s.Destinations = append(s.Destinations,
				&relaypb.Destination{Name: app, Namespace: ns, Cluster: cluster, Selector: map[string]string{"app": app}, Labels: map[string]string{"app": app},
					Ports:   []*relaypb.ServicePort{{Port: 9080, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "9080"}},
					Subsets: map[string]*relaypb.LabelValues{"version": {Values: []string{"v1", "v2"}}}, ServiceType: "ClusterIP",
					MeshName: "istiod", MeshNamespace: "istio-system", Endpoints: endpoints},
				&relaypb.Destination{Name: app + "-grpc", Namespace: ns, Cluster: cluster, Selector: map[string]string{"app": app},
					Ports:   []*relaypb.ServicePort{{Port: 9090, Name: "grpc-api", Protocol: "TCP", AppProtocol: "grpc", TargetPort: "9090"}},
					Subsets: map[string]*relaypb.LabelValues{"version": {Values: []string{"v1", "v2"}}}, ServiceType: "ClusterIP",
					MeshName: "istiod", MeshNamespace: "istio-system", Endpoints: endpoints})
		}
	}
	// discovery orders workloads and destinations by namespace and name,
	// as text (ns-100 comes before ns-11).
	byNamespaceName := func(ns1, n1, ns2, n2 string) int { return cmp.Or(strings.Compare(ns1, ns2), strings.Compare(n1, n2)) }
	slices.SortStableFunc(s.Workloads, func(a, b *relaypb.Workload) int {
		return byNamespaceName(a.GetNamespace(), a.GetName(), b.GetNamespace(), b.GetName())
	})
	slices.SortStableFunc(s.Destinations, func(a, b *relaypb.Destination) int {
		return byNamespaceName(a.GetNamespace(), a.GetName(), b.GetNamespace(), b.GetName())
	})
	return Rehash(s)
}
