package discovery_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Test fixtures: small constructors for the objects discovery reads, with
// options that edit them in place.

const cluster = "cluster-1"

// l builds a label map from key, value pairs.
func l(kv ...string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func template(labels map[string]string, sa, image string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			Containers:         []corev1.Container{{Name: "main", Image: image}},
		},
	}
}

// istiod is an istiod Deployment labelled app=istiod plus labels, with pod
// template labels app=istiod, service account istiod and image
// pilot:1.31.1.
func istiod(ns, name string, labels map[string]string, opts ...func(*appsv1.Deployment)) *appsv1.Deployment {
	all := l("app", "istiod")
	for k, v := range labels {
		all[k] = v
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: all},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: l("app", "istiod")},
			Template: template(l("app", "istiod"), "istiod", "docker.io/istio/pilot:1.31.1"),
		},
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

// tmplOpt edits a pod template.
type tmplOpt func(*corev1.PodTemplateSpec)

func withSA(sa string) tmplOpt {
	return func(t *corev1.PodTemplateSpec) { t.Spec.ServiceAccountName = sa }
}

func withAnnotations(a map[string]string) tmplOpt {
	return func(t *corev1.PodTemplateSpec) { t.Annotations = a }
}

func deployment(ns, name string, podLabels map[string]string, opts ...tmplOpt) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: podLabels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: template(podLabels, "", "example.com/app:v1"),
		},
	}
	for _, o := range opts {
		o(&d.Spec.Template)
	}
	return d
}

func statefulSet(ns, name string, podLabels map[string]string, opts ...tmplOpt) *appsv1.StatefulSet {
	s := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: template(podLabels, "", "example.com/db:v1"),
		},
	}
	for _, o := range opts {
		o(&s.Spec.Template)
	}
	return s
}

func daemonSet(ns, name string, podLabels map[string]string, opts ...tmplOpt) *appsv1.DaemonSet {
	d := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: template(podLabels, "", "example.com/agent:v1"),
		},
	}
	for _, o := range opts {
		o(&d.Spec.Template)
	}
	return d
}

// service is a ClusterIP Service with one port http:9080.
func service(ns, name string, selector map[string]string, opts ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: "10.96.0.10",
			Selector:  selector,
			Ports:     []corev1.ServicePort{{Name: "http", Port: 9080, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withLabels(labels map[string]string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Labels = labels }
}

func withPorts(ports ...corev1.ServicePort) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Ports = ports }
}

// pod is a Running pod with Ready=True.
func pod(ns, name, ip string, labels map[string]string, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func configMap(ns, name, mesh string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Data:       map[string]string{"mesh": mesh},
	}
}

// assertProto compares messages through their JSON form, for a readable
// diff.
func assertProto(t testing.TB, want, got proto.Message, msgAndArgs ...any) bool {
	t.Helper()
	if proto.Equal(want, got) {
		return true
	}
	return assert.JSONEq(t, protoJSON(t, want), protoJSON(t, got), msgAndArgs...)
}

func protoJSON(t testing.TB, m proto.Message) string {
	t.Helper()
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatalf("protojson: %v", err)
	}
	return string(b)
}

// assertProtos compares two lists of messages.
func assertProtos[M proto.Message](t testing.TB, want, got []M, msgAndArgs ...any) bool {
	t.Helper()
	ws, gs := "[", "["
	for i, m := range want {
		if i > 0 {
			ws += ","
		}
		ws += protoJSON(t, m)
	}
	for i, m := range got {
		if i > 0 {
			gs += ","
		}
		gs += protoJSON(t, m)
	}
	return assert.JSONEq(t, ws+"]", gs+"]", msgAndArgs...)
}
