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
