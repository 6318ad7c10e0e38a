package discovery_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/discovery"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestDiscovererKube runs discovery against a real kube-apiserver: an
// Istio-shaped cluster created as API objects is discovered; a Service added
// later shows up within 2 s of its creation and disappears after its
// deletion; and the snapshot from the informer caches equals Build over the
// objects listed straight from the API server.
func TestDiscovererKube(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: t.TempDir(), Clusters: []string{cluster}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	cs, err := env.Cluster(cluster).Clientset()
	require.NoError(t, err)

	d, err := discovery.New(discovery.Config{Client: cs, Cluster: cluster, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		assert.NoError(t, <-done)
	})
	select {
	case <-d.Synced():
	case <-ctx.Done():
		t.Fatal("caches did not sync")
	}

	createIstioShapedCluster(ctx, t, cs)

	s := waitSnapshot(t, d, 10*time.Second, func(s *relaypb.Snapshot) bool {
		return len(s.Meshes) == 1 && len(s.Meshes[0].Gateways) == 1 && s.Meshes[0].Gateways[0].ExternalAddress == "203.0.113.10" &&
			s.Meshes[0].TrustDomain == "cluster-1.local" && len(s.Workloads) == 2 && len(s.Destinations) == 1 &&
			len(s.Destinations[0].Endpoints) == 1
	})
	assert.Equal(t, cluster, s.Cluster)
	assertProto(t, &relaypb.Mesh{
		Name: "istiod", Namespace: "istio-system", Cluster: cluster, Version: "1.31.1",
		TrustDomain: "cluster-1.local", IstiodServiceAccount: "istiod", PodLabels: l("app", "istiod"), SmartDnsProxying: true,
		Gateways: []*relaypb.Gateway{{
			Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest",
			WorkloadLabels: l("istio", "eastwestgateway"), ExternalAddress: "203.0.113.10", TlsPort: 15443,
		}},
	}, s.Meshes[0])
	v1, v2 := l("app", "reviews", "version", "v1"), l("app", "reviews", "version", "v2")
	assertProtos(t, []*relaypb.Workload{
		{Name: "reviews-v1", Namespace: "bookinfo", Cluster: cluster, Kind: "Deployment", PodLabels: v1, ServiceAccount: "bookinfo-reviews", MeshName: "istiod", MeshNamespace: "istio-system"},
		{Name: "reviews-v2", Namespace: "bookinfo", Cluster: cluster, Kind: "Deployment", PodLabels: v2, ServiceAccount: "bookinfo-reviews", MeshName: "istiod", MeshNamespace: "istio-system"},
	}, s.Workloads)
	assertProto(t, &relaypb.Destination{
		Name: "reviews", Namespace: "bookinfo", Cluster: cluster, Selector: l("app", "reviews"), Labels: l("app", "reviews"),
		Ports:       []*relaypb.ServicePort{{Port: 9080, Name: "http", Protocol: "TCP", AppProtocol: "http", TargetPort: "9080"}},
		Subsets:     map[string]*relaypb.LabelValues{"version": {Values: []string{"v1", "v2"}}},
		ServiceType: "ClusterIP", MeshName: "istiod", MeshNamespace: "istio-system",
		Endpoints: []*relaypb.Endpoint{{Ip: "10.244.0.5", Labels: v1}},
	}, s.Destinations[0])
	assert.Equal(t, discovery.Build(cluster, listInputs(ctx, t, cs)).Hash, s.Hash, "the informer caches hold what Build needs")

	// Let the burst of creation events settle, then time one change.
	drainChanges(d, time.Second)
	const maxLatency = 2 * time.Second
	hasReviewsV2 := func(s *relaypb.Snapshot) bool {
		return slices.ContainsFunc(s.Destinations, func(d *relaypb.Destination) bool { return d.Name == "reviews-v2" })
	}
	start := time.Now()
	_, err = cs.CoreV1().Services("bookinfo").Create(ctx, kubeService(service("bookinfo", "reviews-v2", v2,
		withPorts(corev1.ServicePort{Name: "grpc-api", Port: 9090}))), metav1.CreateOptions{})
	require.NoError(t, err)
	s, latency := waitChangeUntil(t, d, start, maxLatency, hasReviewsV2)
	t.Logf("Service added: Changes fired and the snapshot held it %v after Create", latency.Round(time.Millisecond))
	added := s.Destinations[slices.IndexFunc(s.Destinations, func(d *relaypb.Destination) bool { return d.Name == "reviews-v2" })]
	assertProtos(t, []*relaypb.ServicePort{{Port: 9090, Name: "grpc-api", Protocol: "TCP", AppProtocol: "grpc", TargetPort: "9090"}}, added.Ports)

	drainChanges(d, time.Second)
	start = time.Now()
	require.NoError(t, cs.CoreV1().Services("bookinfo").Delete(ctx, "reviews-v2", metav1.DeleteOptions{}))
	s, latency = waitChangeUntil(t, d, start, maxLatency, func(s *relaypb.Snapshot) bool { return !hasReviewsV2(s) })
	t.Logf("Service deleted: Changes fired and the snapshot lost it %v after Delete", latency.Round(time.Millisecond))
	assert.Len(t, s.Destinations, 1)
}

// createIstioShapedCluster creates, as API objects only, an istiod with its
// mesh config and an east-west gateway (with a load balancer address), and
// an injected bookinfo namespace with reviews v1 and v2, the Service reviews
// and one ready and one unready pod.
func createIstioShapedCluster(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	must := func(_ any, err error) { t.Helper(); require.NoError(t, err) }
	opts := metav1.CreateOptions{}
	must(cs.CoreV1().Namespaces().Create(ctx, namespace("istio-system", nil), opts))
	must(cs.CoreV1().Namespaces().Create(ctx, namespace("bookinfo", l("istio-injection", "enabled")), opts))
	// No controller-manager runs: create the ServiceAccounts pods need.
	for _, sa := range []struct{ ns, name string }{{"bookinfo", "default"}, {"bookinfo", "bookinfo-reviews"}} {
		must(cs.CoreV1().ServiceAccounts(sa.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: sa.ns, Name: sa.name}}, opts))
	}
	must(cs.CoreV1().ConfigMaps("istio-system").Create(ctx, configMap("istio-system", "istio",
		"trustDomain: cluster-1.local\ndefaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: \"true\"\n"), opts))
	must(cs.AppsV1().Deployments("istio-system").Create(ctx, istiod("istio-system", "istiod", nil), opts))
	ew, err := cs.CoreV1().Services("istio-system").Create(ctx, kubeService(service("istio-system", "istio-eastwestgateway", l("istio", "eastwestgateway"),
		withLabels(l("istio", "eastwestgateway")),
		withPorts(corev1.ServicePort{Name: "status-port", Port: 15021}, corev1.ServicePort{Name: "tls", Port: 15443}),
		func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })), opts)
	require.NoError(t, err)
	ew.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
	must(cs.CoreV1().Services("istio-system").UpdateStatus(ctx, ew, metav1.UpdateOptions{}))

	for _, v := range []string{"v1", "v2"} {
		must(cs.AppsV1().Deployments("bookinfo").Create(ctx, deployment("bookinfo", "reviews-"+v, l("app", "reviews", "version", v), withSA("bookinfo-reviews")), opts))
	}
	must(cs.CoreV1().Services("bookinfo").Create(ctx, kubeService(service("bookinfo", "reviews", l("app", "reviews"), withLabels(l("app", "reviews")))), opts))
	for _, p := range []struct {
		name, version, ip string
		ready             corev1.ConditionStatus
	}{{"reviews-v1-0", "v1", "10.244.0.5", corev1.ConditionTrue}, {"reviews-v2-0", "v2", "10.244.0.6", corev1.ConditionFalse}} {
		created, err := cs.CoreV1().Pods("bookinfo").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bookinfo", Name: p.name, Labels: l("app", "reviews", "version", p.version)},
			Spec: corev1.PodSpec{
				ServiceAccountName: "bookinfo-reviews",
				Containers:         []corev1.Container{{Name: "reviews", Image: "docker.io/istio/examples-bookinfo-reviews-" + p.version + ":1.20.2"}},
			},
		}, opts)
		require.NoError(t, err)
		created.Status = corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      p.ip,
			PodIPs:     []corev1.PodIP{{IP: p.ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: p.ready, LastTransitionTime: metav1.Now()}},
		}
		must(cs.CoreV1().Pods("bookinfo").UpdateStatus(ctx, created, metav1.UpdateOptions{}))
	}
}

// kubeService prepares a fixture Service for a real API server, which
// allocates the cluster IP.
func kubeService(s *corev1.Service) *corev1.Service {
	s.Spec.ClusterIP = ""
	return s
}

// listInputs reads the Inputs straight from the API server.
func listInputs(ctx context.Context, t *testing.T, cs kubernetes.Interface) discovery.Inputs {
	t.Helper()
	var in discovery.Inputs
	all := metav1.ListOptions{}
	nss, err := cs.CoreV1().Namespaces().List(ctx, all)
	require.NoError(t, err)
	for i := range nss.Items {
		in.Namespaces = append(in.Namespaces, &nss.Items[i])
	}
	ds, err := cs.AppsV1().Deployments("").List(ctx, all)
	require.NoError(t, err)
	for i := range ds.Items {
		in.Deployments = append(in.Deployments, &ds.Items[i])
	}
	sts, err := cs.AppsV1().StatefulSets("").List(ctx, all)
	require.NoError(t, err)
	for i := range sts.Items {
		in.StatefulSets = append(in.StatefulSets, &sts.Items[i])
	}
	dss, err := cs.AppsV1().DaemonSets("").List(ctx, all)
	require.NoError(t, err)
	for i := range dss.Items {
		in.DaemonSets = append(in.DaemonSets, &dss.Items[i])
	}
	svcs, err := cs.CoreV1().Services("").List(ctx, all)
	require.NoError(t, err)
	for i := range svcs.Items {
		in.Services = append(in.Services, &svcs.Items[i])
	}
	cms, err := cs.CoreV1().ConfigMaps("").List(ctx, all)
	require.NoError(t, err)
	for i := range cms.Items {
		in.ConfigMaps = append(in.ConfigMaps, &cms.Items[i])
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, all)
	require.NoError(t, err)
	for i := range pods.Items {
		in.Pods = append(in.Pods, &pods.Items[i])
	}
	return in
}

// waitSnapshot returns the first snapshot that satisfies ok, checking after
// every value on Changes.
func waitSnapshot(t *testing.T, d *discovery.Discoverer, timeout time.Duration, ok func(*relaypb.Snapshot) bool) *relaypb.Snapshot {
	t.Helper()
	deadline := time.After(timeout)
	for {
		s, err := d.Snapshot()
		require.NoError(t, err)
		if ok(s) {
			return s
		}
		select {
		case <-d.Changes():
		case <-deadline:
			t.Fatalf("no matching snapshot within %v; last: %s", timeout, protoJSON(t, s))
		}
	}
}

// waitChangeUntil waits for values on Changes until the snapshot satisfies
// ok, and returns it with the time since start. It fails after limit, and if
// the snapshot changed without a value on Changes.
func waitChangeUntil(t *testing.T, d *discovery.Discoverer, start time.Time, limit time.Duration, ok func(*relaypb.Snapshot) bool) (*relaypb.Snapshot, time.Duration) {
	t.Helper()
	deadline := time.After(limit - time.Since(start))
	for {
		select {
		case <-d.Changes():
		case <-deadline:
			s, err := d.Snapshot()
			require.NoError(t, err)
			t.Fatalf("no Changes value with the expected snapshot within %v (snapshot matches now: %v)", limit, ok(s))
		}
		s, err := d.Snapshot()
		require.NoError(t, err)
		if ok(s) {
			return s, time.Since(start)
		}
	}
}

// drainChanges discards Changes values until none arrives for quiet.
func drainChanges(d *discovery.Discoverer, quiet time.Duration) {
	for {
		select {
		case <-d.Changes():
		case <-time.After(quiet):
			return
		}
	}
}
