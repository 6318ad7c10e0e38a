package discovery_test

import (
	"fmt"
	"testing"

	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// syntheticCluster has one mesh and, in each of 50 injected namespaces, 20
// Deployments (apps 0-9, versions v1 and v2) of 10 ready pods each and 20
// Services (two per app): 1,000 Deployments, 1,000 Services, 10,000 pods.
func syntheticCluster() (discovery.Inputs, int) {
	const namespaces, appsPerNs, podsPerDeployment = 50, 10, 10
	in := discovery.Inputs{
		Namespaces:  []*corev1.Namespace{namespace("istio-system", nil)},
		Deployments: []*appsv1.Deployment{istiod("istio-system", "istiod", nil)},
		ConfigMaps:  []*corev1.ConfigMap{configMap("istio-system", "istio", "trustDomain: cluster-1.local")},
		Services: []*corev1.Service{service("istio-system", "istio-eastwestgateway", l("istio", "eastwestgateway"),
			withLabels(l("istio", "eastwestgateway")), withPorts(corev1.ServicePort{Name: "tls", Port: 15443}))},
	}
	ip := 0
	for n := range namespaces {
		ns := fmt.Sprintf("ns-%02d", n)
		in.Namespaces = append(in.Namespaces, namespace(ns, l("istio-injection", "enabled")))
		for a := range appsPerNs {
			app := fmt.Sprintf("app-%d", a)
			for _, v := range []string{"v1", "v2"} {
				labels := l("app", app, "version", v, "team", "t"+ns)
				in.Deployments = append(in.Deployments, deployment(ns, app+"-"+v, labels, withSA(app)))
				for p := range podsPerDeployment {
					podLabels := l("app", app, "version", v, "team", "t"+ns, "pod-template-hash", "h"+v)
					in.Pods = append(in.Pods, pod(ns, fmt.Sprintf("%s-%s-%d", app, v, p), fmt.Sprintf("10.%d.%d.%d", ip>>16, (ip>>8)&255, ip&255), podLabels))
					ip++
				}
			}
			in.Services = append(in.Services,
				service(ns, app, l("app", app), withLabels(l("app", app))),
				service(ns, app+"-grpc", l("app", app), withPorts(corev1.ServicePort{Name: "grpc-api", Port: 9090})))
		}
	}
	objects := len(in.Namespaces) + len(in.Deployments) + len(in.Services) + len(in.ConfigMaps) + len(in.Pods)
	return in, objects
}

// BenchmarkBuild10kPods: Build for a cluster of 10,000 pods, 1,000
// Deployments and 1,000 Services in 50 namespaces with one mesh.
func BenchmarkBuild10kPods(b *testing.B) {
	in, objects := syntheticCluster()
	s := discovery.Build(cluster, in)
	if len(in.Pods) != 10000 || len(s.Workloads) != 1000 || len(s.Destinations) != 1000 {
		b.Fatalf("unexpected shape: %d pods, %d workloads, %d destinations", len(in.Pods), len(s.Workloads), len(s.Destinations))
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		discovery.Build(cluster, in)
		n++
	}
	secs := b.Elapsed().Seconds()
	b.ReportMetric(float64(objects), "objects/op")
	b.ReportMetric(float64(n*len(in.Pods))/secs, "pods/s")
	b.ReportMetric(float64(n*objects)/secs, "objects/s")
	b.ReportMetric(float64(proto.Size(s)), "snapshot-bytes")
}

// BenchmarkHash: Hash of the snapshot of BenchmarkBuild10kPods's cluster.
func BenchmarkHash(b *testing.B) {
	in, _ := syntheticCluster()
	s := discovery.Build(cluster, in)
	b.SetBytes(int64(proto.Size(s)))
	b.ReportAllocs()
	for b.Loop() {
		snapshothash.Of(s)
	}
}
