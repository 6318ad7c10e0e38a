package discovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestParseMeshConfig(t *testing.T) {
	tests := []struct {
		name, doc string
		want      meshConfig
	}{
		{"empty", "", meshConfig{TrustDomain: "cluster.local"}},
		{"trust domain", "trustDomain: east.example", meshConfig{TrustDomain: "east.example"}},
		{"empty trust domain", `trustDomain: ""`, meshConfig{TrustDomain: "cluster.local"}},
		{"JSON", `{"trustDomain":"j.example","defaultConfig":{"proxyMetadata":{"ISTIO_META_DNS_CAPTURE":"true"}}}`, meshConfig{TrustDomain: "j.example", DNSCapture: true}},
		{"DNS capture false", "defaultConfig: {proxyMetadata: {ISTIO_META_DNS_CAPTURE: \"false\"}}", meshConfig{TrustDomain: "cluster.local"}},
		{"proxyMetadata of the wrong type", "trustDomain: t\ndefaultConfig: {proxyMetadata: [a]}", meshConfig{TrustDomain: "t"}},
		{"defaultConfig of the wrong type", "trustDomain: t\ndefaultConfig: 3", meshConfig{TrustDomain: "t"}},
		{"a list document", "- trustDomain: t", meshConfig{TrustDomain: "cluster.local"}},
		{"not YAML", "\t:\t[", meshConfig{TrustDomain: "cluster.local"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, parseMeshConfig(tt.doc))
		})
	}
}

func TestImageTag(t *testing.T) {
	for image, want := range map[string]string{
		"pilot":                         "",
		"pilot:1.2":                     "1.2",
		"docker.io/istio/pilot:1.31.1":  "1.31.1",
		"localhost:5000/pilot":          "",
		"localhost:5000/pilot:v1":       "v1",
		"pilot@sha256:abc":              "",
		"pilot:v2@sha256:abc":           "v2",
		"":                              "",
		":":                             "",
		"a/b:c/d":                       "",
		"registry:5000/x/y:tag@sha:1:2": "tag",
	} {
		assert.Equal(t, want, imageTag(image), image)
	}
}

func TestInferProtocol(t *testing.T) {
	for name, want := range map[string]string{
		"http": "http", "http-x": "http", "HTTP2-x": "http2", "grpc-web": "grpc-web", "GRPC-Web-x": "grpc-web",
		"grpc-x": "grpc", "https": "https", "tls-x": "tls", "tcp": "tcp", "udp-x": "udp", "mongo": "mongo",
		"redis-1": "redis", "mysql": "mysql", "http_proxy-x": "http_proxy",
		"": "", "web": "", "httpx": "", "-http": "", "thrift-x": "", "dubbo": "", "a-very-long-port-name": "",
	} {
		assert.Equal(t, want, inferProtocol(name), name)
	}
}

func TestLabelIndex(t *testing.T) {
	x := newLabelIndex([]map[string]string{
		{"app": "a", "v": "1"},
		{"app": "a", "v": "2"},
		nil,
		{"app": "b", "v": "1"},
		{"app": "a", "v": "1", "x": "y"},
	})
	assert.Equal(t, []int{0, 1, 4}, x.match(map[string]string{"app": "a"}))
	assert.Equal(t, []int{0, 4}, x.match(map[string]string{"app": "a", "v": "1"}))
	assert.Equal(t, []int{4}, x.match(map[string]string{"x": "y", "v": "1"}))
	assert.Empty(t, x.match(map[string]string{"app": "a", "v": "3"}))
	assert.Empty(t, x.match(map[string]string{"app": ""}))
	assert.Empty(t, x.match(nil), "an empty selector selects nothing")
}

// TestTrim: the informer transform keeps what Build reads and drops the
// rest; it is idempotent.
func TestTrim(t *testing.T) {
	meta := metav1.ObjectMeta{
		Namespace: "ns", Name: "p", Labels: map[string]string{"app": "a"},
		Annotations:   map[string]string{"big": "annotation"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
	}
	p := &corev1.Pod{
		ObjectMeta: meta,
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			HostIP:     "192.168.0.1", ContainerStatuses: []corev1.ContainerStatus{{Name: "c"}},
		},
	}
	got, err := trim(p)
	assert.NoError(t, err)
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{"app": "a"}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: p.Status.PodIPs, Conditions: p.Status.Conditions},
	}
	assert.Equal(t, want, got)
	again, err := trim(got)
	assert.NoError(t, err)
	assert.Equal(t, want, again, "idempotent")
	assert.Equal(t, podReady(p), podReady(got.(*corev1.Pod)))

	for name, keep := range map[string]bool{"istio": true, "istio-canary": true, "kube-root-ca.crt": false, "istiox": false} {
		cm := &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"mesh": "x"}, BinaryData: map[string][]byte{"b": nil}}
		cm.Name = name
		got, err := trim(cm)
		assert.NoError(t, err)
		assert.Nil(t, got.(*corev1.ConfigMap).ManagedFields)
		assert.Equal(t, keep, got.(*corev1.ConfigMap).Data != nil, name)
		assert.Equal(t, keep, isMeshConfigMap(got), name)
		assert.Equal(t, keep, isMeshConfigMap(cache.DeletedFinalStateUnknown{Key: "ns/" + name, Obj: got}), name)
	}
	d := &corev1.Service{ObjectMeta: meta}
	got, err = trim(d)
	assert.NoError(t, err)
	assert.Nil(t, got.(*corev1.Service).ManagedFields)
	assert.Equal(t, meta.Annotations, got.(*corev1.Service).Annotations, "only pods lose annotations")

	got, err = trim("not an object")
	assert.NoError(t, err)
	assert.Equal(t, "not an object", got)
}

// FuzzParseMeshConfig: any document parses to a non-empty trust domain
// without panicking.
func FuzzParseMeshConfig(f *testing.F) {
	for _, s := range []string{"", "trustDomain: a", "defaultConfig: {proxyMetadata: {ISTIO_META_DNS_CAPTURE: true}}", "- a", "a: &a [*a]", "{", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		if parseMeshConfig(doc).TrustDomain == "" {
			t.Fatal("empty trust domain")
		}
	})
}

// FuzzImageTag: the tag is a suffix-free substring of the reference without
// '/' or '@'.
func FuzzImageTag(f *testing.F) {
	for _, s := range []string{"", "a:b", "a/b:c@d", "h:1/a", ":::", "@"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, image string) {
		tag := imageTag(image)
		for _, c := range tag {
			if c == '/' || c == '@' {
				t.Fatalf("tag %q of %q holds %q", tag, image, c)
			}
		}
	})
}

// FuzzInferProtocol: the result is "" or one of Istio's protocols.
func FuzzInferProtocol(f *testing.F) {
	for _, s := range []string{"", "http", "grpc-web", "GRPC-WEB-x", "-", "ǅ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if p := inferProtocol(name); p != "" && p != "grpc-web" && !istioProtocols[p] {
			t.Fatalf("inferProtocol(%q) = %q", name, p)
		}
	})
}

// The global service scope ambient federation relies on: the ambient
// profile's entry, an empty selector, and what is not it.
func TestParseMeshConfigGlobalScope(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want bool
	}{
		{"serviceScopeConfigs:\n- servicesSelector:\n    matchExpressions: [{key: istio.io/global, operator: In, values: [\"true\"]}]\n  scope: GLOBAL\n", true},
		{"serviceScopeConfigs:\n- servicesSelector: {matchLabels: {istio.io/global: \"true\"}}\n  scope: GLOBAL\n", true},
		{"serviceScopeConfigs:\n- scope: GLOBAL\n", true},
		{"serviceScopeConfigs:\n- servicesSelector: {matchLabels: {istio.io/global: \"true\"}}\n  scope: LOCAL\n", false},
		{"serviceScopeConfigs:\n- servicesSelector: {matchLabels: {team: a}}\n  scope: GLOBAL\n", false},
		{"serviceScopeConfigs:\n- namespaceSelector: {matchLabels: {x: y}}\n  scope: GLOBAL\n", false},
		{"serviceScopeConfigs:\n- servicesSelector:\n    matchExpressions: [{key: istio.io/global, operator: NotIn, values: [\"true\"]}]\n  scope: GLOBAL\n", false},
		{"serviceScopeConfigs: 7\n", false},
		{"serviceScopeConfigs: [7, {scope: [GLOBAL]}]\n", false},
		{"trustDomain: a.b\n", false},
		{"{not yaml", false},
	} {
		assert.Equal(t, tc.want, parseMeshConfig(tc.doc).GlobalScope, "%q", tc.doc)
	}
}
