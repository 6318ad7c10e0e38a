package discovery_test

import (
	"fmt"
	"testing"

	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/stretchr/testify/assert"
	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// syntheticCluster has one mesh and, in each of namespaces injected
// namespaces, 20 Deployments (apps 0-9, versions v1 and v2) of 10 ready
// pods each and 20 Services (two per app); 50 namespaces are 1,000
// Deployments, 1,000 Services, 10,000 pods. relaytest.Rich builds its
// snapshot directly (TestRichIsWhatBuildMakes).
func syntheticCluster(namespaces int) (discovery.Inputs, int) {
	const appsPerNs, podsPerDeployment = 10, 10
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
	in, objects := syntheticCluster(50)
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
	in, _ := syntheticCluster(50)
	s := discovery.Build(cluster, in)
	b.SetBytes(int64(proto.Size(s)))
	b.ReportAllocs()
	for b.Loop() {
		snapshothash.Of(s)
	}
}

// TestRichIsWhatBuildMakes: the realistic snapshot tests and benchmarks
// build directly (relaytest.Rich) is the one the agent's discovery builds
// from the cluster's objects, also past 100 namespaces (ns-100 sorts
// before ns-11). Equal hashes are equal deterministic encodings; the
// messages are compared (with a diff) only when the hashes differ.
func TestRichIsWhatBuildMakes(t *testing.T) {
	for _, namespaces := range []int{1, 3, 101} {
		in, _ := syntheticCluster(namespaces)
		want := discovery.Build(cluster, in)
		got := relaytest.Rich{Namespaces: namespaces}.Snapshot(cluster)
		if want.GetHash() != got.GetHash() {
			t.Errorf("%d namespaces: relaytest.Rich differs from discovery.Build", namespaces)
			assertFirstDifference(t, want, got)
			return
		}
		assert.Len(t, in.Pods, relaytest.Rich{Namespaces: namespaces}.Pods())
	}
}

// assertFirstDifference shows the first mesh, workload or destination in
// which two large snapshots differ, rather than a diff of them whole.
func assertFirstDifference(t *testing.T, want, got *relaypb.Snapshot) {
	t.Helper()
	assert.Equal(t, want.GetCluster(), got.GetCluster())
	assertProtos(t, want.GetMeshes(), got.GetMeshes())
	for i := range min(len(want.GetWorkloads()), len(got.GetWorkloads())) {
		if !assertProto(t, want.GetWorkloads()[i], got.GetWorkloads()[i], "workloads[%d]", i) {
			return
		}
	}
	for i := range min(len(want.GetDestinations()), len(got.GetDestinations())) {
		if !assertProto(t, want.GetDestinations()[i], got.GetDestinations()[i], "destinations[%d]", i) {
			return
		}
	}
	assert.Len(t, got.GetWorkloads(), len(want.GetWorkloads()))
	assert.Len(t, got.GetDestinations(), len(want.GetDestinations()))
}
