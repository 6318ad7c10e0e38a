package istiod

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/test/internal/workloadapi"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
)

// What the ambient-multinetwork federation golden has cluster-1 hold of
// cluster-2 (docs/design/2026-12-04-ambient-federation.md): networks,
// cluster-2's east-west gateway, and ratings, which runs only there.
const (
	localNetwork    = "net-1"
	remoteNetwork   = "net-2"
	remoteGatewayIP = "192.0.2.20"
	remoteHBONEPort = 15009
	remoteGatewaySA = "ew-pods"
	remoteGateway   = "relaymesh-cluster-2-istio-eastwest"
	ratingsHost     = "ratings.shop.svc.cluster.local"
	sharedDomain    = "mesh.local"
)

// ambientFederation is the real translator's output for cluster-1 from the
// ambient-multinetwork golden input, split into the network gateway and
// the rest. The gateway keeps only its IP address: istiod picks one
// network gateway per network, and the test names which.
func ambientFederation(t *testing.T) (gateway []byte, rest []byte) {
	t.Helper()
	in := translationtest.LoadInput(t, filepath.Join("..", "..", "federation", "testdata", "ambient-multinetwork"))
	for i := range in.Meshes {
		if a := in.Meshes[i].Spec.Istio.Ambient; a != nil {
			for j := range a.EastWestGateways {
				a.EastWestGateways[j].Addresses = a.EastWestGateways[j].Addresses[:min(1, len(a.EastWestGateways[j].Addresses))]
			}
		}
	}
	out, r := translation.NewOutput(), translation.NewReport()
	federation.Translate(in, out, r)
	gw, others := translation.NewOutput(), translation.NewOutput()
	for _, o := range out.Objects() {
		if o.Cluster != "cluster-1" {
			continue
		}
		if o.Object.GetKind() == "Gateway" {
			gw.Put(o)
		} else {
			others.Put(o)
		}
	}
	require.Len(t, gw.Objects(), 1)
	require.Len(t, others.Objects(), 3, "the global Service and one WorkloadEntry per known pod")
	return translationtest.RenderOutput(t, gw), translationtest.RenderOutput(t, others)
}

// globalScope makes the Services labelled istio.io/global=true global,
// as Istio's ambient profile does.
const globalScope = `serviceScopeConfigs:
- servicesSelector:
    matchExpressions: [{key: istio.io/global, operator: In, values: ["true"]}]
  scope: GLOBAL
`

// TestARemoteNetworksServiceFromLocalObjectsOnly proves ambient
// federation's output with a real pilot-discovery in ambient multi-network
// mode and no remote secret: from what the translator writes into cluster-1
// only, istiod tells a posing ztunnel of cluster-1 that ratings lives on
// net-2 behind net-2's east-west gateway — one synthetic workload (double
// HBONE: the gateway's address and HBONE port, the remote pods' count as
// capacity) and never the remote pods themselves — and the service's SANs
// name the remote pods' account in the shared trust domain. Without the
// gateway nothing is reachable; when the WorkloadEntries go (the remote
// cluster deregistered), so does the workload.
func TestARemoteNetworksServiceFromLocalObjectsOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, cs, d := multiNetworkWorld(ctx, t)
	ambientPod(ctx, t, cs, "reviews") // a local workload, for contrast

	gatewayManifest, serviceManifest := ambientFederation(t)
	objs, err := cluster.Apply(ctx, "relaymesh-test", serviceManifest)
	require.NoError(t, err)
	require.Len(t, objs, 3)
	addrs, err := d.WatchDelta(ctx, d.ZtunnelNode("10.0.0.1"), AddressTypeURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = addrs.Close() })
	wait, waitCancel := context.WithTimeout(ctx, 60*time.Second)
	defer waitCancel()

	// No gateway for net-2 yet: ratings is sent, with nothing to reach it
	// through, and its remote pods are not sent as themselves.
	require.NoError(t, addrs.Await(wait, func(res map[string]*anypb.Any) error {
		v, err := viewOf(res)
		if err != nil {
			return err
		}
		switch {
		case len(v.services[ratingsHost].GetSubjectAltNames()) == 0:
			return fmt.Errorf("service %s not sent with its remote SANs (have %v)", ratingsHost, v.describe())
		case v.workloads["reviews-1"] == nil:
			return fmt.Errorf("local workload reviews-1 not sent")
		}
		return nil
	}))
	v := currentView(t, addrs)
	assert.Empty(t, v.splitHorizon(), "no gateway for net-2 yet: nothing to send ratings' traffic to")
	assert.Empty(t, v.onNetwork(remoteNetwork), "remote pods are never sent as themselves")

	// The remote network's gateway: istiod (the Gateway controller's
	// leader) copies its address into the status, which is what the
	// network gateway is read from.
	_, err = cluster.Apply(ctx, "relaymesh-test", gatewayManifest)
	require.NoError(t, err)
	client, err := dynamic.NewForConfig(cluster.RESTConfig())
	require.NoError(t, err)
	wantUID := remoteNetwork + "/SplitHorizonWorkload/" + DefaultNamespace + "/" + remoteGateway + "/" + remoteGatewayIP + "/shop/" + ratingsHost
	require.NoError(t, addrs.Await(wait, func(res map[string]*anypb.Any) error {
		v, err := viewOf(res)
		if err != nil {
			return err
		}
		return v.checkRemoteService(wantUID, 2)
	}), "what istiod told the ztunnel: %v", currentView(t, addrs).describe())
	v = currentView(t, addrs)
	t.Logf("ztunnel was told: %s", v.describe())
	gwObj, err := client.Resource(gateways).Namespace(DefaultNamespace).Get(ctx, remoteGateway, metav1.GetOptions{})
	require.NoError(t, err)
	status, _, _ := unstructured.NestedSlice(gwObj.Object, "status", "addresses")
	assert.Equal(t, []any{map[string]any{"type": "IPAddress", "value": remoteGatewayIP}}, status, "istiod wrote the gateway's status")
	gw := v.workloads[fmt.Sprintf("NetworkGateway/%s/%s/%d", remoteNetwork, remoteGatewayIP, remoteHBONEPort)]
	require.NotNil(t, gw, "the network gateway itself: %s", v.describe())
	assert.Equal(t, remoteGatewaySA, gw.GetServiceAccount(), "the gateway's identity is the remote east-west gateway's account")
	assert.Equal(t, remoteNetwork, gw.GetNetwork())
	assert.Equal(t, sharedDomain, gw.GetTrustDomain(), "istiod stamps its own trust domain on every workload")
	// The service's SANs name the remote pods' account in istiod's own
	// trust domain: ztunnel verifies the remote pods as identities of its
	// own trust domain (why ambient members share one).
	assert.Contains(t, v.services[ratingsHost].GetSubjectAltNames(), "spiffe://"+sharedDomain+"/ns/shop/sa/ratings")
	assert.Empty(t, v.onNetwork(remoteNetwork), "remote pods are never sent as themselves")
	require.NoError(t, v.checkRemoteService(wantUID, 2))

	// One remote pod gone: capacity follows; every pod gone (the remote
	// cluster deregistered): the workload goes, measured.
	require.NoError(t, client.Resource(workloadEntries).Namespace("shop").Delete(ctx, "ratings-cluster-2-10-2-0-22-ebd6ec0f", metav1.DeleteOptions{}))
	require.NoError(t, addrs.Await(wait, func(res map[string]*anypb.Any) error {
		v, err := viewOf(res)
		if err != nil {
			return err
		}
		return v.checkRemoteService(wantUID, 1)
	}))
	start := time.Now()
	require.NoError(t, client.Resource(workloadEntries).Namespace("shop").Delete(ctx, "ratings-cluster-2-10-2-0-21-5ee8b31b", metav1.DeleteOptions{}))
	require.NoError(t, addrs.Await(wait, func(res map[string]*anypb.Any) error {
		v, err := viewOf(res)
		if err != nil {
			return err
		}
		if got := v.splitHorizon(); len(got) > 0 {
			return fmt.Errorf("still sent: %v", got)
		}
		return nil
	}))
	t.Logf("the remote service's workload left the ztunnel's view %v after its last WorkloadEntry was deleted", time.Since(start).Round(time.Millisecond))
	assert.NotNil(t, currentView(t, addrs).workloads["reviews-1"], "the local workload is untouched")
}

// multiNetworkWorld is cluster-1 of an ambient multi-network pair: istiod's
// namespace on net-1, namespace shop in ambient mode, Gateway API's CRDs,
// and a real pilot-discovery in ambient multi-network mode in trust domain
// mesh.local with the ambient profile's global service scope (its log
// shown when the test failed).
func multiNetworkWorld(ctx context.Context, t *testing.T) (*localcluster.Cluster, kubernetes.Interface, *Istiod) {
	t.Helper()
	dir := t.TempDir()
	cluster, cs := startCluster(ctx, t, dir,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace, Labels: map[string]string{"topology.istio.io/network": localNetwork}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"istio.io/dataplane-mode": "ambient"}}},
	)
	translationtest.InstallGatewayAPI(ctx, t, cluster)
	d, err := Start(ctx, Config{
		Kubeconfig: cluster.Kubeconfig, ClusterID: "cluster-1", Dir: filepath.Join(dir, "istiod"),
		CACerts: newTestPKI(t, "mesh-1").cacerts(), TrustDomain: sharedDomain, Ambient: true,
		MeshConfig: globalScope,
		Env:        map[string]string{"AMBIENT_ENABLE_MULTI_NETWORK": "true"},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Stop()) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod log (last lines):\n%s", d.LogTail(80))
		}
	})
	return cluster, cs, d
}

// globalReviewsBehindWaypoint makes the owner's reviews in namespace shop:
// labelled istio.io/global=true, bound to the namespace's waypoint
// (installWaypoint), with one ready pod at localReviewsIP and the
// EndpointSlice Kubernetes' controller would write.
func globalReviewsBehindWaypoint(ctx context.Context, t *testing.T, cs kubernetes.Interface, dyn dynamic.Interface) {
	t.Helper()
	_, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews", Labels: map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/global": "true"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "reviews"}, Ports: []corev1.ServicePort{
			{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	ambientPod(ctx, t, cs, "reviews")
	require.NoError(t, SetEndpointReady(ctx, cs, "shop", "reviews-1", "reviews", localReviewsIP, "http", 9080, true))
	installWaypoint(ctx, t, cs, dyn)
}

var (
	gateways        = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
	workloadEntries = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}
)

// addressView is a ztunnel's Address resources, decoded: workloads by
// name (uid for synthetic ones), services by hostname.
type addressView struct {
	workloads map[string]*workloadapi.Workload
	services  map[string]*workloadapi.Service
}

func viewOf(res map[string]*anypb.Any) (*addressView, error) {
	v := &addressView{workloads: map[string]*workloadapi.Workload{}, services: map[string]*workloadapi.Service{}}
	for _, r := range res {
		addr := &workloadapi.Address{}
		if err := r.UnmarshalTo(addr); err != nil {
			return nil, fmt.Errorf("decode Address: %w", err)
		}
		if wl := addr.GetWorkload(); wl != nil {
			key := wl.GetName()
			if strings.Contains(wl.GetUid(), "/SplitHorizonWorkload/") || strings.HasPrefix(wl.GetUid(), "NetworkGateway/") {
				key = wl.GetUid()
			}
			v.workloads[key] = wl
		}
		if svc := addr.GetService(); svc != nil {
			v.services[svc.GetHostname()] = svc
		}
	}
	return v, nil
}

func currentView(t *testing.T, w *DeltaWatch) *addressView {
	t.Helper()
	res, _, err := w.Snapshot()
	require.NoError(t, err)
	v, err := viewOf(res)
	require.NoError(t, err)
	return v
}

// splitHorizon are the synthetic remote-network workloads' uids.
func (v *addressView) splitHorizon() []string {
	var out []string
	for k := range v.workloads {
		if strings.Contains(k, "/SplitHorizonWorkload/") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// onNetwork are the workloads on network that carry an address of their
// own (a pod, a WorkloadEntry): what must never cross as itself.
func (v *addressView) onNetwork(network string) []string {
	var out []string
	for k, wl := range v.workloads {
		if wl.GetNetwork() == network && len(wl.GetAddresses()) > 0 && !strings.HasPrefix(k, "NetworkGateway/") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// checkRemoteService says how the ratings workload differs from one
// reaching capacity pods of net-2 through its east-west gateway.
func (v *addressView) checkRemoteService(uid string, capacity uint32) error {
	wl := v.workloads[uid]
	if wl == nil {
		return fmt.Errorf("no workload %s (have %v)", uid, v.splitHorizon())
	}
	var problems []string
	gw := wl.GetNetworkGateway()
	gwAddr, _ := netip.AddrFromSlice(gw.GetAddress().GetAddress())
	if gw.GetAddress().GetNetwork() != remoteNetwork || gwAddr.String() != remoteGatewayIP || gw.GetHboneMtlsPort() != remoteHBONEPort {
		problems = append(problems, fmt.Sprintf("network gateway %s/%s:%d, want %s/%s:%d", gw.GetAddress().GetNetwork(), gwAddr, gw.GetHboneMtlsPort(), remoteNetwork, remoteGatewayIP, remoteHBONEPort))
	}
	if wl.GetNetwork() != remoteNetwork {
		problems = append(problems, "network "+wl.GetNetwork())
	}
	if len(wl.GetAddresses()) > 0 {
		problems = append(problems, "has an address of its own")
	}
	if wl.GetTunnelProtocol() != workloadapi.TunnelProtocol_HBONE {
		problems = append(problems, "tunnel "+wl.GetTunnelProtocol().String())
	}
	if got := wl.GetCapacity().GetValue(); got != capacity {
		problems = append(problems, fmt.Sprintf("capacity %d, want %d", got, capacity))
	}
	if _, ok := wl.GetServices()["shop/"+ratingsHost]; !ok {
		problems = append(problems, fmt.Sprintf("services %v", slices.Sorted(mapsKeys(wl.GetServices()))))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s: %s", uid, strings.Join(problems, "; "))
	}
	return nil
}

func (v *addressView) describe() string {
	var parts []string
	for _, k := range slices.Sorted(mapsKeys(v.workloads)) {
		wl := v.workloads[k]
		parts = append(parts, fmt.Sprintf("workload %s (network %q, sa %q, capacity %d)", k, wl.GetNetwork(), wl.GetServiceAccount(), wl.GetCapacity().GetValue()))
	}
	for _, k := range slices.Sorted(mapsKeys(v.services)) {
		parts = append(parts, fmt.Sprintf("service %s (SANs %v)", k, v.services[k].GetSubjectAltNames()))
	}
	return strings.Join(parts, "; ")
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
