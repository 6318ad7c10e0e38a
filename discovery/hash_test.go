package discovery_test

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// richInputs exercises every part of a snapshot: two meshes, gateways,
// three workload kinds, destinations with subsets and endpoints. Every call
// returns fresh objects.
func richInputs() discovery.Inputs {
	in := bookinfo()
	in.Namespaces = append(in.Namespaces, namespace("istio-system", nil), namespace("db", l("istio.io/rev", "canary")))
	in.Deployments = append(in.Deployments,
		istiod("istio-system", "istiod-canary", l("istio.io/rev", "canary")),
		deployment("bookinfo", "productpage-v1", l("app", "productpage", "version", "v1")))
	in.StatefulSets = []*appsv1.StatefulSet{statefulSet("db", "mysql", l("app", "mysql", "version", "8"))}
	in.DaemonSets = []*appsv1.DaemonSet{daemonSet("bookinfo", "log-agent", l("app", "log-agent"))}
	in.ConfigMaps = []*corev1.ConfigMap{
		configMap("istio-system", "istio", "trustDomain: cluster-1.local\ndefaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: \"true\"\n"),
		configMap("istio-system", "istio-canary", "trustDomain: canary.local"),
	}
	in.Services = []*corev1.Service{
		service("istio-system", "istio-eastwestgateway", l("istio", "eastwestgateway"), withLabels(l("istio", "eastwestgateway")), func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
			s.Spec.Ports = []corev1.ServicePort{{Name: "tls", Port: 15443}}
		}),
		service("istio-system", "istio-ingressgateway", l("istio", "ingressgateway"), withLabels(l("istio", "ingressgateway"))),
		service("bookinfo", "reviews", l("app", "reviews"), withLabels(l("app", "reviews"))),
		service("bookinfo", "productpage", l("app", "productpage"), withPorts(corev1.ServicePort{Name: "http", Port: 9080}, corev1.ServicePort{Name: "grpc-x", Port: 9090})),
		service("db", "mysql", l("app", "mysql"), withPorts(corev1.ServicePort{Name: "mysql", Port: 3306})),
	}
	for i := range 6 {
		in.Pods = append(in.Pods,
			pod("bookinfo", fmt.Sprintf("reviews-v1-%d", i), fmt.Sprintf("10.1.0.%d", i), l("app", "reviews", "version", "v1", "pod-template-hash", "abc")),
			pod("bookinfo", fmt.Sprintf("reviews-v2-%d", i), fmt.Sprintf("10.1.1.%d", i), l("app", "reviews", "version", "v2", "pod-template-hash", "def")),
			pod("db", fmt.Sprintf("mysql-%d", i), fmt.Sprintf("10.2.0.%d", i), l("app", "mysql", "version", "8")))
	}
	return in
}

func shuffled[T any](r *rand.Rand, s []T) []T {
	c := slices.Clone(s)
	r.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
	return c
}

// TestBuildDeterministic: the same objects in any order give the same
// snapshot, byte for byte, and the same Hash; the Hash is set and is the
// hash of the content.
func TestBuildDeterministic(t *testing.T) {
	want := discovery.Build(cluster, richInputs())
	require.Len(t, want.Meshes, 2)
	require.Len(t, want.Meshes[0].Gateways, 2)
	require.Len(t, want.Workloads, 6)
	require.Len(t, want.Destinations, 3)
	assert.Regexp(t, regexp.MustCompile(`^[0-9a-f]{64}$`), want.Hash)
	assert.Equal(t, snapshothash.Of(want), want.Hash)
	wantBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	require.NoError(t, err)

	r := rand.New(rand.NewPCG(1, 2))
	for i := range 50 {
		in := richInputs()
		in = discovery.Inputs{
			Namespaces:   shuffled(r, in.Namespaces),
			Deployments:  shuffled(r, in.Deployments),
			StatefulSets: shuffled(r, in.StatefulSets),
			DaemonSets:   shuffled(r, in.DaemonSets),
			Services:     shuffled(r, in.Services),
			ConfigMaps:   shuffled(r, in.ConfigMaps),
			Pods:         shuffled(r, in.Pods),
		}
		got := discovery.Build(cluster, in)
		require.Equal(t, want.Hash, got.Hash, "shuffle %d", i)
		gotBytes, err := proto.MarshalOptions{Deterministic: true}.Marshal(got)
		require.NoError(t, err)
		require.Equal(t, wantBytes, gotBytes, "shuffle %d", i)
	}
}

// TestBuildHashChanges: any change to what discovery reads that changes the
// snapshot changes the Hash.
func TestBuildHashChanges(t *testing.T) {
	base := discovery.Build(cluster, richInputs()).Hash
	find := func(in *discovery.Inputs, ns, name string) *corev1.Service {
		for _, s := range in.Services {
			if s.Namespace == ns && s.Name == name {
				return s
			}
		}
		t.Fatalf("no service %s/%s", ns, name)
		return nil
	}
	tests := []struct {
		name    string
		cluster string
		change  func(*discovery.Inputs)
	}{
		{name: "cluster name", cluster: "cluster-2"},
		{name: "trust domain", change: func(in *discovery.Inputs) { in.ConfigMaps[0].Data["mesh"] = "trustDomain: other.local" }},
		{name: "istiod image", change: func(in *discovery.Inputs) {
			in.Deployments[0].Spec.Template.Spec.Containers[0].Image = "docker.io/istio/pilot:1.31.2"
		}},
		{name: "gateway address", change: func(in *discovery.Inputs) {
			find(in, "istio-system", "istio-eastwestgateway").Status.LoadBalancer.Ingress[0].IP = "203.0.113.11"
		}},
		{name: "gateway TLS port", change: func(in *discovery.Inputs) {
			find(in, "istio-system", "istio-eastwestgateway").Spec.Ports[0].Port = 15444
		}},
		{name: "workload label", change: func(in *discovery.Inputs) { in.Deployments[2].Spec.Template.Labels["version"] = "v1b" }},
		{name: "workload service account", change: func(in *discovery.Inputs) { in.Deployments[2].Spec.Template.Spec.ServiceAccountName = "x" }},
		{name: "namespace injection", change: func(in *discovery.Inputs) { in.Namespaces[1].Labels["istio-injection"] = "disabled" }},
		{name: "service port", change: func(in *discovery.Inputs) { find(in, "bookinfo", "reviews").Spec.Ports[0].Port = 9081 }},
		{name: "service label", change: func(in *discovery.Inputs) { find(in, "bookinfo", "reviews").Labels["team"] = "x" }},
		{name: "service removed", change: func(in *discovery.Inputs) { in.Services = in.Services[:len(in.Services)-1] }},
		{name: "pod IP", change: func(in *discovery.Inputs) { in.Pods[0].Status.PodIP = "10.9.9.9" }},
		{name: "pod readiness", change: func(in *discovery.Inputs) {
			in.Pods[0].Status.Conditions[0].Status = corev1.ConditionFalse
		}},
		{name: "pod label", change: func(in *discovery.Inputs) { in.Pods[0].Labels["pod-template-hash"] = "zzz" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := richInputs()
			if tt.change != nil {
				tt.change(&in)
			}
			c := tt.cluster
			if c == "" {
				c = cluster
			}
			assert.NotEqual(t, base, discovery.Build(c, in).Hash)
		})
	}
}

// TestHash: every field counts except the hash itself; Hash does not modify
// its argument.
func TestHash(t *testing.T) {
	s := discovery.Build(cluster, richInputs())
	h := s.Hash
	s.Hash = "something else"
	assert.Equal(t, h, snapshothash.Of(s), "the hash field is not hashed")
	assert.Equal(t, "something else", s.Hash, "Hash does not modify its argument")
	assert.Equal(t, snapshothash.Of(&relaypb.Snapshot{}), snapshothash.Of(nil))

	mutations := map[string]func(*relaypb.Snapshot){
		"cluster":            func(s *relaypb.Snapshot) { s.Cluster = "x" },
		"mesh revision":      func(s *relaypb.Snapshot) { s.Meshes[0].Revision = "x" },
		"mesh smart DNS":     func(s *relaypb.Snapshot) { s.Meshes[0].SmartDnsProxying = !s.Meshes[0].SmartDnsProxying },
		"mesh pod label":     func(s *relaypb.Snapshot) { s.Meshes[0].PodLabels["x"] = "y" },
		"gateway kind":       func(s *relaypb.Snapshot) { s.Meshes[0].Gateways[0].Kind = "x" },
		"workload mesh":      func(s *relaypb.Snapshot) { s.Workloads[0].MeshName = "x" },
		"workload order":     func(s *relaypb.Snapshot) { s.Workloads[0], s.Workloads[1] = s.Workloads[1], s.Workloads[0] },
		"destination subset": func(s *relaypb.Snapshot) { s.Destinations[1].Subsets["version"].Values[0] = "x" },
		"destination port":   func(s *relaypb.Snapshot) { s.Destinations[0].Ports[0].AppProtocol = "x" },
		"endpoint IP":        func(s *relaypb.Snapshot) { s.Destinations[1].Endpoints[0].Ip = "x" },
		"endpoint added": func(s *relaypb.Snapshot) {
			s.Destinations[0].Endpoints = append(s.Destinations[0].Endpoints, &relaypb.Endpoint{})
		},
		"destination external": func(s *relaypb.Snapshot) { s.Destinations[0].ExternalAddresses = []string{"x"} },
	}
	for name, mutate := range mutations {
		t.Run(name, func(t *testing.T) {
			c := proto.Clone(s).(*relaypb.Snapshot)
			mutate(c)
			assert.NotEqual(t, h, snapshothash.Of(c))
		})
	}
}

// TestBuildHostile: huge label maps and selectors, odd names, nil objects
// and a huge or malicious mesh config neither crash Build nor make it slow
// (the test's time is the bound).
func TestBuildHostile(t *testing.T) {
	huge := l("app", "big")
	for i := range 5000 {
		huge[fmt.Sprintf("k%05d", i)] = strings.Repeat("v", i%64)
	}
	hugeSelector := l("app", "big")
	for i := range 1000 {
		hugeSelector[fmt.Sprintf("k%05d", i)] = strings.Repeat("v", i%64)
	}
	weird := []string{"", "ü-名前", strings.Repeat("x", 10000), "a/b", "\x00", "../..", "istio-"}
	in := discovery.Inputs{
		Namespaces:  []*corev1.Namespace{nil, namespace("big", l("istio-injection", "enabled"))},
		Deployments: []*appsv1.Deployment{nil, istiod("istio-system", "istiod", nil)},
		ConfigMaps: []*corev1.ConfigMap{nil, configMap("istio-system", "istio",
			"a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"+
				"b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"+
				"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"+
				"f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"+
				"h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"+
				"trustDomain: bomb.local\n")},
		StatefulSets: []*appsv1.StatefulSet{nil},
		DaemonSets:   []*appsv1.DaemonSet{nil},
		Services:     []*corev1.Service{nil, service("big", "big", hugeSelector, withLabels(huge))},
		Pods:         []*corev1.Pod{nil},
	}
	const bigWorkloads = 10
	for i := range bigWorkloads {
		labels := make(map[string]string, len(huge)+1)
		for k, v := range huge {
			labels[k] = v
		}
		labels["version"] = fmt.Sprint(i % 3)
		in.Deployments = append(in.Deployments, deployment("big", fmt.Sprintf("big-%03d", i), labels))
	}
	for i, name := range weird {
		in.Deployments = append(in.Deployments, deployment("big", name, l("app", "big", "weird", fmt.Sprint(i))))
		in.Services = append(in.Services, service(name, name, l("app", name)))
		in.Pods = append(in.Pods, pod("big", name, fmt.Sprintf("10.3.0.%d", i), huge))
	}
	// Many Services and pods in one namespace, each Service selecting one
	// pod: the label index keeps this linear.
	for i := range 3000 {
		in.Services = append(in.Services, service("big", fmt.Sprintf("svc-%d", i), l("app", "big", "pod", fmt.Sprint(i))))
		in.Pods = append(in.Pods, pod("big", fmt.Sprintf("pod-%d", i), fmt.Sprintf("10.4.%d.%d", i/256, i%256), l("app", "big", "pod", fmt.Sprint(i))))
	}

	s := discovery.Build(cluster, in)
	require.Len(t, s.Meshes, 1)
	assert.Equal(t, "cluster.local", s.Meshes[0].TrustDomain, "a YAML alias bomb is refused, not expanded")
	assert.Len(t, s.Workloads, bigWorkloads+len(weird))
	var big *relaypb.Destination
	for _, d := range s.Destinations {
		if d.Name == "big" {
			big = d
		}
	}
	require.NotNil(t, big, "the huge selector matches the huge workloads")
	assert.Equal(t, []string{"0", "1", "2"}, big.Subsets["version"].GetValues())
	assert.Len(t, big.Subsets, 1)
	assert.Len(t, big.Endpoints, len(weird))
	assert.Equal(t, s.Hash, discovery.Build(cluster, in).Hash)
}

// TestBuildInvalidUTF8: strings that are not UTF-8 (impossible from an API
// server, possible from other callers) are repaired, so the snapshot still
// encodes and hashes; Hash of a snapshot that does not encode is "".
func TestBuildInvalidUTF8(t *testing.T) {
	bad := "bad\xff"
	in := bookinfo()
	in.Deployments = append(in.Deployments, deployment("bookinfo", "reviews-"+bad, l("app", "reviews", "version", bad, "k"+bad, "v")))
	in.Services = []*corev1.Service{service("bookinfo", "reviews", l("app", "reviews"), withLabels(l("x", bad)), withPorts(corev1.ServicePort{Name: bad, Port: 1}))}
	in.Pods = []*corev1.Pod{pod("bookinfo", "p", "10.0.0.1"+bad, l("app", "reviews", bad, "x"))}
	s := discovery.Build(cluster+bad, in)
	_, err := proto.Marshal(s)
	require.NoError(t, err)
	assert.Len(t, s.Hash, 64)
	assert.Equal(t, "cluster-1bad\uFFFD", s.Cluster)
	w := s.Workloads[slices.IndexFunc(s.Workloads, func(w *relaypb.Workload) bool { return w.Name == "reviews-bad\uFFFD" })]
	assert.Equal(t, l("app", "reviews", "version", "bad\uFFFD"), w.PodLabels, "invalid keys are dropped, values repaired")
	assert.Equal(t, []string{"bad\uFFFD", "v1", "v2"}, s.Destinations[0].Subsets["version"].GetValues())
	assert.Equal(t, "10.0.0.1bad\uFFFD", s.Destinations[0].Endpoints[0].Ip)
	assert.Equal(t, l("app", "reviews"), s.Destinations[0].Endpoints[0].Labels)

	assert.Empty(t, snapshothash.Of(&relaypb.Snapshot{Cluster: bad}))
}
