package fleet

import (
	"fmt"

	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// SnapshotSpec is the shape of a simulated workload cluster: one Istio mesh
// (istiod in istio-system, trust domain <cluster>.local) and Services
// services in injected namespaces, each selecting one Deployment of
// PodsPerService ready pods.
type SnapshotSpec struct {
	// Services is the number of Services (and Deployments); default 1.
	Services int
	// PodsPerService ready pods behind each; default 1.
	PodsPerService int
	// ServicesPerNamespace spreads Services over namespaces apps-0,
	// apps-1, …; default 1,000.
	ServicesPerNamespace int
}

func (s SnapshotSpec) withDefaults() SnapshotSpec {
	if s.Services == 0 {
		s.Services = 1
	}
	if s.PodsPerService == 0 {
		s.PodsPerService = 1
	}
	if s.ServicesPerNamespace == 0 {
		s.ServicesPerNamespace = 1000
	}
	return s
}

// Objects is Services + Deployments + pods: what the cluster holds.
func (s SnapshotSpec) Objects() int {
	s = s.withDefaults()
	return s.Services * (2 + s.PodsPerService)
}

// Snapshot builds cluster's snapshot with discovery.Build, the agent's own
// code, from generated Kubernetes objects: a valid snapshot whose hash is
// snapshothash.Of.
func (s SnapshotSpec) Snapshot(cluster string) *relaypb.Snapshot {
	return discovery.Build(cluster, s.Inputs(cluster))
}

// Inputs are the Kubernetes objects of the simulated cluster.
func (s SnapshotSpec) Inputs(cluster string) discovery.Inputs {
	s = s.withDefaults()
	in := discovery.Inputs{
		Namespaces:  []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}},
		ConfigMaps:  []*corev1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "istio", Namespace: "istio-system"}, Data: map[string]string{"mesh": "trustDomain: " + cluster + ".local\n"}}},
		Deployments: []*appsv1.Deployment{deployment("istio-system", "istiod", map[string]string{"app": "istiod", "istio": "pilot"}, "istiod", "docker.io/istio/pilot:1.31.1")},
	}
	nsCount := (s.Services + s.ServicesPerNamespace - 1) / s.ServicesPerNamespace
	for n := range nsCount {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("apps-%d", n), Labels: map[string]string{"istio-injection": "enabled"}}})
	}
	ip := 0
	for i := range s.Services {
		ns := fmt.Sprintf("apps-%d", i/s.ServicesPerNamespace)
		app := fmt.Sprintf("svc-%d", i)
		labels := map[string]string{"app": app, "version": "v1"}
		in.Deployments = append(in.Deployments, deployment(ns, app+"-v1", labels, app, "docker.io/example/app:1.0"))
		in.Services = append(in.Services, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns, Labels: map[string]string{"app": app}},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app}, Type: corev1.ServiceTypeClusterIP,
				Ports: []corev1.ServicePort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}},
		})
		for p := range s.PodsPerService {
			in.Pods = append(in.Pods, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-v1-%d", app, p), Namespace: ns,
					Labels: map[string]string{"app": app, "version": "v1", "pod-template-hash": "5d4f8"}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.%d.%d.%d", ip>>16&255, ip>>8&255, ip&255),
					Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
			})
			ip++
		}
	}
	return in
}

func deployment(ns, name string, labels map[string]string, sa, image string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "main", Image: image}}},
			},
		},
	}
}

// RichSpec is the cluster of discovery's BenchmarkBuild10kPods, by
// namespace: one mesh with an east-west gateway, and in each of Namespaces
// injected namespaces 10 apps of two versions (v1, v2) with 10 ready pods
// each and two Services per app (http and grpc, selecting the same pods);
// pods carry app, version, team and pod-template-hash labels. That is 200
// pods, 20 Deployments and 20 Services per namespace.
type RichSpec struct {
	Namespaces int
}

// Pods in the cluster.
func (s RichSpec) Pods() int { return s.Namespaces * 200 }

// Snapshot builds cluster's snapshot with discovery.Build.
func (s RichSpec) Snapshot(cluster string) *relaypb.Snapshot {
	in := discovery.Inputs{
		Namespaces:  []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}},
		ConfigMaps:  []*corev1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "istio", Namespace: "istio-system"}, Data: map[string]string{"mesh": "trustDomain: " + cluster + ".local\n"}}},
		Deployments: []*appsv1.Deployment{deployment("istio-system", "istiod", map[string]string{"app": "istiod"}, "istiod", "docker.io/istio/pilot:1.31.1")},
		Services: []*corev1.Service{{
			ObjectMeta: metav1.ObjectMeta{Name: "istio-eastwestgateway", Namespace: "istio-system", Labels: map[string]string{"istio": "eastwestgateway"}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", Selector: map[string]string{"istio": "eastwestgateway"},
				Ports: []corev1.ServicePort{{Name: "tls", Port: 15443, Protocol: corev1.ProtocolTCP}}},
		}},
	}
	ip := 0
	svc := func(ns, name string, sel map[string]string, port corev1.ServicePort, labels map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", Selector: sel, Ports: []corev1.ServicePort{port}}}
	}
	for n := range s.Namespaces {
		ns := fmt.Sprintf("ns-%02d", n)
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"istio-injection": "enabled"}}})
		for a := range 10 {
			app := fmt.Sprintf("app-%d", a)
			for _, v := range []string{"v1", "v2"} {
				labels := map[string]string{"app": app, "version": v, "team": "t" + ns}
				in.Deployments = append(in.Deployments, deployment(ns, app+"-"+v, labels, app, "example.com/app:v1"))
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
			in.Services = append(in.Services,
				svc(ns, app, map[string]string{"app": app}, corev1.ServicePort{Name: "http", Port: 9080, Protocol: corev1.ProtocolTCP}, map[string]string{"app": app}),
				svc(ns, app+"-grpc", map[string]string{"app": app}, corev1.ServicePort{Name: "grpc-api", Port: 9090, Protocol: corev1.ProtocolTCP}, nil))
		}
	}
	return discovery.Build(cluster, in)
}

// DiscoveredObjectsOf lists the Mesh, Workload and Destination objects a
// snapshot becomes in the management cluster, by kind and name.
func DiscoveredObjectsOf(s *relaypb.Snapshot) []string {
	var out []string
	for _, m := range s.GetMeshes() {
		out = append(out, "Mesh/"+m.GetNamespace()+"/"+m.GetName())
	}
	for _, w := range s.GetWorkloads() {
		out = append(out, "Workload/"+w.GetNamespace()+"/"+w.GetName()+"/"+w.GetKind())
	}
	for _, d := range s.GetDestinations() {
		out = append(out, "Destination/"+d.GetNamespace()+"/"+d.GetName())
	}
	return out
}
