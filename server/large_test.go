package server_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/relaymesh/relaymesh/server"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// largeCluster is the discovery input of a cluster with one mesh and, in
// each of namespaces injected namespaces, 10 apps of two versions (v1, v2)
// with 10 ready pods each and two Services per app (http and grpc, both
// selecting the app's 20 pods): 200 pods, 20 Deployments and 20 Services
// per namespace. 500 namespaces are 100,000 pods, 10,000 Services and
// 10,000 Deployments; every pod is an endpoint of two Services.
func largeCluster(cluster string, namespaces int) discovery.Inputs {
	in := discovery.Inputs{
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}},
		ConfigMaps: []*corev1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "istio", Namespace: "istio-system"},
			Data: map[string]string{"mesh": "trustDomain: " + cluster + ".local\n"}}},
		Deployments: []*appsv1.Deployment{largeDeployment("istio-system", "istiod", map[string]string{"app": "istiod"}, "istiod", "docker.io/istio/pilot:1.31.1")},
	}
	ip := 0
	for n := range namespaces {
		ns := fmt.Sprintf("ns-%03d", n)
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"istio-injection": "enabled"}}})
		for a := range 10 {
			app := fmt.Sprintf("app-%d", a)
			for _, v := range []string{"v1", "v2"} {
				labels := map[string]string{"app": app, "version": v, "team": "t" + ns}
				in.Deployments = append(in.Deployments, largeDeployment(ns, app+"-"+v, labels, app, "example.com/app:v1"))
				for p := range 10 {
					in.Pods = append(in.Pods, &corev1.Pod{
						ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", app, v, p), Namespace: ns,
							Labels: map[string]string{"app": app, "version": v, "team": "t" + ns, "pod-template-hash": "h" + v}},
						Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.%d.%d.%d", ip>>16&255, ip>>8&255, ip&255),
							Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
					})
					ip++
				}
			}
			for _, port := range []corev1.ServicePort{{Name: "http", Port: 9080, Protocol: corev1.ProtocolTCP}, {Name: "grpc-api", Port: 9090, Protocol: corev1.ProtocolTCP}} {
				name := app
				if port.Name != "http" {
					name = app + "-grpc"
				}
				in.Services = append(in.Services, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
					Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", Selector: map[string]string{"app": app}, Ports: []corev1.ServicePort{port}}})
			}
		}
	}
	return in
}

func largeDeployment(ns, name string, labels map[string]string, sa, image string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "main", Image: image}}}},
		},
	}
}

// largeSnapshot is what discovery.Build makes of largeCluster(cluster,
// namespaces) (TestLargeSnapshotIsBuilds checks it), built directly: in
// a race-enabled test Build of 100,000 pods takes a minute.
func largeSnapshot(cluster string, namespaces int) *relaypb.Snapshot {
	s := &relaypb.Snapshot{Cluster: cluster, Meshes: []*relaypb.Mesh{{Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1",
		TrustDomain: cluster + ".local", IstiodServiceAccount: "istiod", PodLabels: map[string]string{"app": "istiod"}}}}
	ip := 0
	for n := range namespaces {
		ns := fmt.Sprintf("ns-%03d", n)
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
			for _, port := range []*relaypb.ServicePort{
				{Port: 9080, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "9080"},
				{Port: 9090, Name: "grpc-api", Protocol: "TCP", AppProtocol: "grpc", TargetPort: "9090"},
			} {
				d := &relaypb.Destination{Name: app, Namespace: ns, Cluster: cluster, Selector: map[string]string{"app": app},
					Labels: map[string]string{"app": app}, Ports: []*relaypb.ServicePort{port},
					Subsets:     map[string]*relaypb.LabelValues{"version": {Values: []string{"v1", "v2"}}},
					ServiceType: "ClusterIP", MeshName: "istiod", MeshNamespace: "istio-system", Endpoints: endpoints}
				if port.Name != "http" {
					d.Name = app + "-grpc"
				}
				s.Destinations = append(s.Destinations, d)
			}
		}
	}
	s.Hash = snapshothash.Of(s)
	return s
}

// large100k is largeSnapshot(cluster-1, 500), built once: 100,000 pods,
// 10,000 Services, 10,000 Deployments.
var large100k = sync.OnceValue(func() *relaypb.Snapshot { return largeSnapshot("cluster-1", 500) })

// The snapshot the tests build directly is the one the agent's discovery
// builds from the cluster's objects.
func TestLargeSnapshotIsBuilds(t *testing.T) {
	want := discovery.Build("cluster-1", largeCluster("cluster-1", 3))
	got := largeSnapshot("cluster-1", 3)
	if !proto.Equal(want, got) {
		t.Fatalf("largeSnapshot differs from discovery.Build:\nwant %v\ngot  %v", prototext.Format(want)[:4000], prototext.Format(got)[:4000])
	}
	s := large100k()
	endpoints := 0
	for _, d := range s.GetDestinations() {
		endpoints += len(d.GetEndpoints())
	}
	if len(s.GetDestinations()) != 10000 || len(s.GetWorkloads()) != 10000 || endpoints != 200000 {
		t.Fatalf("shape: %d destinations, %d workloads, %d endpoints", len(s.GetDestinations()), len(s.GetWorkloads()), endpoints)
	}
}

// BenchmarkSnapshotIngestion100k: what a snapshot pushed whole costs the
// server at 100,000 pods and 10,000 Services — ValidateSnapshot (with the
// re-encoding for its hash) and View.Accept — and the same checks as a
// chunked push runs them (the hash of the received bytes in place of the
// re-encoding).
func BenchmarkSnapshotIngestion100k(b *testing.B) {
	s := large100k()
	view := server.NewView()
	b.Run("whole", func(b *testing.B) {
		for b.Loop() {
			if err := relay.ValidateSnapshot("cluster-1", s, relay.SnapshotLimits{MaxBytes: 64 << 20}); err != nil {
				b.Fatal(err)
			}
			view.Accept("cluster-1", s, time.Now())
		}
	})
	b.Run("chunked", func(b *testing.B) {
		for b.Loop() {
			if err := relay.ValidateAssembled("cluster-1", s, relay.SnapshotLimits{}, s.GetHash()); err != nil {
				b.Fatal(err)
			}
			view.Accept("cluster-1", s, time.Now())
		}
	})
}
