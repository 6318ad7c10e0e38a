package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/internal/workloadapi"
	"github.com/relaymesh/relaymesh/test/internal/workloadapi/security"
	"github.com/relaymesh/relaymesh/test/istiod"
	"github.com/relaymesh/relaymesh/translation/translationtest"
)

// ambientCluster is one workload cluster's ambient installation as API
// objects (no pods run here: the test sets pods' and the east-west
// gateway's status as kubelets and Istio's controllers would): istiod on
// network net-<n> in trust domain mesh.local, a ztunnel DaemonSet, an
// east-west gateway of class istio-east-west, and namespace shop in
// ambient mode.
func ambientClusterManifest(n int) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: Namespace
metadata: {name: istio-system, labels: {topology.istio.io/network: net-%[1]d}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: istio, namespace: istio-system, labels: {istio.io/rev: default}}
data:
  mesh: |
    trustDomain: mesh.local
    serviceScopeConfigs:
    - servicesSelector:
        matchExpressions: [{key: istio.io/global, operator: In, values: ["true"]}]
      scope: GLOBAL
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: istiod, namespace: istio-system, labels: {app: istiod, istio: pilot, istio.io/rev: default}}
spec:
  selector: {matchLabels: {app: istiod}}
  template:
    metadata: {labels: {app: istiod, istio: pilot, istio.io/rev: default}}
    spec:
      containers:
      - name: discovery
        image: docker.io/istio/pilot:1.31.1
        env:
        - {name: PILOT_ENABLE_AMBIENT, value: "true"}
        - {name: AMBIENT_ENABLE_MULTI_NETWORK, value: "true"}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ztunnel, namespace: istio-system}
spec:
  selector: {matchLabels: {app: ztunnel}}
  template:
    metadata: {labels: {app: ztunnel}}
    spec:
      containers:
      - {name: istio-proxy, image: docker.io/istio/ztunnel:1.31.1}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: istio-eastwest, namespace: istio-system, labels: {topology.istio.io/network: net-%[1]d}}
spec:
  gatewayClassName: istio-east-west
  listeners:
  - {name: mesh, port: 15008, protocol: HBONE, tls: {mode: Terminate, options: {gateway.istio.io/tls-terminate-mode: ISTIO_MUTUAL}}}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}
`, n)
}

// globalAppManifest is app, its account and its Service, labelled global
// (a cluster's east-west gateway forwards only global services). ratings
// runs only in cluster-2, details only in cluster-1: the two directions.
func globalAppManifest(app string) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: ServiceAccount
metadata: {name: %[1]s, namespace: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: shop}
spec:
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      serviceAccountName: %[1]s
      containers:
      - {name: %[1]s, image: example.invalid/%[1]s}
---
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: shop, labels: {istio.io/global: "true"}}
spec:
  selector: {app: %[1]s}
  ports:
  - {name: http, port: 9080}
`, app)
}

// productpageManifest is ratings' client in cluster-1: the consuming
// mesh uses namespace shop, so ambient federation may write there.
const productpageManifest = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: productpage, namespace: shop}
spec:
  selector: {matchLabels: {app: productpage}}
  template:
    metadata: {labels: {app: productpage}}
    spec:
      containers:
      - {name: productpage, image: example.invalid/productpage}
`

// ratingsToDetails lets cluster-2's ratings, and only it, reach
// cluster-1's details on 9080: cluster-1's ztunnel must be told to admit
// exactly that principal, of cluster-2's trust domain.
const ratingsToDetails = `
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: ratings-to-details, namespace: relaymesh}
spec:
  sourceSelector:
  - kubeServiceAccountRefs:
      serviceAccounts: [{name: ratings, namespace: shop, clusterName: cluster-2}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: details, namespace: shop, clusterName: cluster-1}]
  allowedPorts: [9080]
`

// ambientVirtualMesh federates every Destination of the two ambient
// meshes, which share trust domain mesh.local.
const ambientVirtualMesh = `
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: shop, namespace: relaymesh}
spec:
  meshes:
  - {clusterName: cluster-1, namespace: istio-system, name: istiod}
  - {clusterName: cluster-2, namespace: istio-system, name: istiod}
  mtls: {trustDomains: Shared}
  federation:
    selectors: [{}]
`

// globalScopeMeshConfig is the ambient profile's service scope: Services
// labelled istio.io/global=true are global.
const globalScopeMeshConfig = `serviceScopeConfigs:
- servicesSelector:
    matchExpressions: [{key: istio.io/global, operator: In, values: ["true"]}]
  scope: GLOBAL
`

// TestAmbientFederationAcrossNetworks: two workload clusters, each an
// ambient mesh on a network of its own, no remote secret anywhere; the
// relay server and both agents (--ambient-federation) as processes, and a
// real pilot-discovery in ambient multi-network mode in each cluster. A Go
// client posing as cluster-1's ztunnel is told that ratings, which runs
// only in cluster-2, lives on net-2 behind cluster-2's east-west gateway
// (its address, its HBONE port, its account), with one workload for the
// two remote pods and the remote pods' identity in the service's SANs; one
// posing as cluster-2's is told the same of cluster-1's details. Cluster-1's
// is told to admit exactly the principal an AccessPolicy names (cluster-2's
// ratings, to details on 9080). A static VirtualDestination over both
// clusters' reviews (each global, bound to its waypoint) fails over at
// cluster-1's waypoint (checkAmbientFailover). After `relaymesh cluster deregister
// cluster-2`, cluster-1's is told ratings has no endpoint any more and the
// rule admits no one (both measured).
func TestAmbientFederationAcrossNetworks(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt", "cluster-1", "cluster-2")
	mgmt := env.Cluster("mgmt")
	clients := map[string]kubernetes.Interface{}
	for i, name := range []string{"cluster-1", "cluster-2"} {
		c := env.Cluster(name)
		translationtest.InstallGatewayAPI(ctx, t, c)
		_, err := c.Apply(ctx, "test", []byte(ambientClusterManifest(i+1)))
		require.NoError(t, err)
		cs, err := c.Clientset()
		require.NoError(t, err)
		clients[name] = cs
		dyn, err := dynamic.NewForConfig(c.RESTConfig())
		require.NoError(t, err)
		// The address a LoadBalancer would give the east-west gateway.
		setGatewayAddress(ctx, t, dyn, "istio-system", "istio-eastwest", "IPAddress", fmt.Sprintf("192.0.2.%d0", i+1))
	}
	c2 := env.Cluster("cluster-2")
	_, err := c2.Apply(ctx, "test", []byte(globalAppManifest("ratings")))
	require.NoError(t, err)
	_, err = env.Cluster("cluster-1").Apply(ctx, "test", []byte(productpageManifest+"---"+globalAppManifest("details")))
	require.NoError(t, err)
	for i, ip := range []string{"10.2.0.21", "10.2.0.22"} {
		readyPod(ctx, t, clients["cluster-2"], "shop", fmt.Sprintf("ratings-%d", i), ip, map[string]string{"app": "ratings"}, "ratings")
	}
	for i, ip := range []string{"10.1.0.31", "10.1.0.32"} {
		readyPod(ctx, t, clients["cluster-1"], "shop", fmt.Sprintf("details-%d", i), ip, map[string]string{"app": "details"}, "details")
	}
	for i, name := range []string{"cluster-1", "cluster-2"} {
		installFailoverBackend(ctx, t, env.Cluster(name), clients[name], i+1)
	}

	relayAddr, opsAddr := Addr(t), Addr(t)
	Start(t, bin, dir, "server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", dir+"/audit.log", "--server-dns-names", "localhost", "--server-ips", Host(relayAddr))
	waitHealthy(t, opsAddr)
	for _, name := range []string{"cluster-1", "cluster-2"} {
		out, err := Run(t, bin, "cluster", "register", name, "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", env.Cluster(name).Kubeconfig,
			"--server-address", relayAddr, "--shared-trust-domain", "mesh.local")
		require.NoError(t, err, out)
		Start(t, bin, dir, "agent-"+name, "agent", "--kubeconfig", env.Cluster(name).Kubeconfig, "--ambient-federation", "--ambient-failover",
			"--health-listen", Addr(t), "--metrics-listen", Addr(t))
	}
	_, err = mgmt.Apply(ctx, "test", []byte(ambientVirtualMesh+"---"+ratingsToDetails))
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
		if err != nil {
			return
		}
		if vm, err := dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace("relaymesh").Get(ctx, "shop", metav1.GetOptions{}); err == nil {
			t.Logf("VirtualMesh status: %v", vm.Object["status"])
		}
	})

	// Each cluster's istiod, in ambient multi-network mode, reads only its
	// own cluster's apiserver (no remote secret exists); one root, as the
	// shared trust domain has.
	root, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "e2e"})
	require.NoError(t, err)
	ztunnel := map[string]*istiod.DeltaWatch{}
	istiods := map[string]*istiod.Istiod{}
	var authz *istiod.DeltaWatch
	for i, name := range []string{"cluster-1", "cluster-2"} {
		d := startAmbientIstiod(ctx, t, env.Cluster(name).Kubeconfig, name, root)
		istiods[name] = d
		w, err := d.WatchDelta(ctx, d.ZtunnelNode(fmt.Sprintf("10.%d.0.1", i+1)), istiod.AddressTypeURL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Close() })
		ztunnel[name] = w
		if name == "cluster-1" {
			authz, err = d.WatchDelta(ctx, d.ZtunnelNode("10.1.0.1"), istiod.AuthorizationTypeURL)
			require.NoError(t, err)
			t.Cleanup(func() { _ = authz.Close() })
		}
	}

	// Both directions: cluster-1's ztunnel is told of cluster-2's ratings
	// behind cluster-2's east-west gateway, and cluster-2's of cluster-1's
	// details behind cluster-1's.
	const (
		ratingsUID = "net-2/SplitHorizonWorkload/istio-system/relaymesh-cluster-2-istio-eastwest/192.0.2.20/shop/ratings.shop.svc.cluster.local"
		detailsUID = "net-1/SplitHorizonWorkload/istio-system/relaymesh-cluster-1-istio-eastwest/192.0.2.10/shop/details.shop.svc.cluster.local"
	)
	wait, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for _, c := range []struct{ client, uid, network, gateway, host, san string }{
		{"cluster-1", ratingsUID, "net-2", "192.0.2.20", "ratings.shop.svc.cluster.local", "spiffe://mesh.local/ns/shop/sa/ratings"},
		{"cluster-2", detailsUID, "net-1", "192.0.2.10", "details.shop.svc.cluster.local", "spiffe://mesh.local/ns/shop/sa/details"},
	} {
		w := ztunnel[c.client]
		require.NoError(t, w.Await(wait, func(res map[string]*anypb.Any) error {
			return remoteService(res, c.uid, c.network, c.gateway, 2)
		}), "what %s's ztunnel was told", c.client)
		res, _, err := w.Snapshot()
		require.NoError(t, err)
		for _, a := range addresses(t, res) {
			if wl := a.GetWorkload(); wl != nil {
				remotePod := wl.GetNetwork() == c.network && len(wl.GetAddresses()) > 0 && !strings.HasPrefix(wl.GetUid(), "NetworkGateway/")
				assert.False(t, remotePod, "a remote pod is never sent as itself to %s's ztunnel: %s", c.client, wl.GetUid())
				if strings.HasPrefix(wl.GetUid(), "NetworkGateway/"+c.network+"/") {
					assert.Equal(t, "istio-eastwest", wl.GetServiceAccount(), "the gateway runs as the other cluster's east-west gateway")
				}
			}
			if s := a.GetService(); s != nil && s.GetHostname() == c.host {
				assert.Contains(t, s.GetSubjectAltNames(), c.san, "%s's ztunnel verifies the remote pods' identity", c.client)
			}
		}
	}

	// The AccessPolicy: cluster-1's ztunnel admits cluster-2's ratings,
	// named in cluster-2's trust domain, to details on 9080, and nothing
	// else.
	const detailsAuthz = "shop/relaymesh-details.ztunnel"
	admitsRatings := []string{"port=9080 & principal=mesh.local/ns/shop/sa/ratings"}
	require.NoError(t, authz.Await(wait, func(res map[string]*anypb.Any) error {
		return ztunnelAllows(res, detailsAuthz, admitsRatings)
	}), "what cluster-1's ztunnel was told about details")

	// VirtualDestination failover between the two clusters' reviews, at
	// cluster-1's waypoint (the agents run with --ambient-failover).
	checkAmbientFailover(ctx, t, mgmt, env.Cluster("cluster-1"), istiods["cluster-1"], clients["cluster-1"])

	// No remote secret anywhere.
	for name, cs := range clients {
		l, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{LabelSelector: "istio/multiCluster=true"})
		require.NoError(t, err)
		assert.Empty(t, l.Items, "remote secrets in %s", name)
	}

	// cluster-2 leaves: ratings leaves cluster-1's ztunnel view, and
	// cluster-1's ztunnel no longer admits cluster-2's ratings (the
	// policy stays, admitting no one: fail closed).
	start := time.Now()
	out, err := Run(t, bin, "cluster", "deregister", "cluster-2", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", c2.Kubeconfig)
	require.NoError(t, err, out)
	require.NoError(t, ztunnel["cluster-1"].Await(wait, func(res map[string]*anypb.Any) error {
		for _, a := range addressesOf(res) {
			if wl := a.GetWorkload(); wl != nil && wl.GetUid() == ratingsUID {
				return fmt.Errorf("%s still sent", ratingsUID)
			}
		}
		return nil
	}))
	t.Logf("ratings left cluster-1's ztunnel view %v after `relaymesh cluster deregister cluster-2` started", time.Since(start).Round(time.Millisecond))
	require.NoError(t, authz.Await(wait, func(res map[string]*anypb.Any) error {
		return ztunnelAllows(res, detailsAuthz, nil)
	}), "what cluster-1's ztunnel was told about details after cluster-2 left")
	t.Logf("cluster-1's ztunnel stopped admitting cluster-2's ratings %v after `relaymesh cluster deregister cluster-2` started", time.Since(start).Round(time.Millisecond))
	dyn1, err := dynamic.NewForConfig(env.Cluster("cluster-1").RESTConfig())
	require.NoError(t, err)
	Eventually(t, 30*time.Second, "ambient federation's objects pruned from cluster-1", func() (bool, string) {
		var left []string
		for _, r := range []struct {
			gvr schema.GroupVersionResource
			ns  string
		}{{workloadEntriesGVR, "shop"}, {gatewaysGVR, "istio-system"}, {schema.GroupVersionResource{Version: "v1", Resource: "services"}, "shop"}} {
			l, err := dyn1.Resource(r.gvr).Namespace(r.ns).List(ctx, metav1.ListOptions{LabelSelector: "relaymesh.io/owner"})
			if err != nil {
				return false, err.Error()
			}
			for _, o := range l.Items {
				left = append(left, o.GetKind()+"/"+o.GetName())
			}
		}
		slices.Sort(left)
		return len(left) == 0, fmt.Sprint(left)
	})
}

var workloadEntriesGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}

// readyPod creates a pod and gives it the status a kubelet would: running,
// ready, with ip.
func readyPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, ip string, labels map[string]string, sa string) {
	t.Helper()
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{"ambient.istio.io/redirection": "enabled"}},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func addressesOf(res map[string]*anypb.Any) []*workloadapi.Address {
	var out []*workloadapi.Address
	for _, r := range res {
		a := &workloadapi.Address{}
		if r.UnmarshalTo(a) == nil {
			out = append(out, a)
		}
	}
	return out
}

func addresses(t *testing.T, res map[string]*anypb.Any) []*workloadapi.Address {
	t.Helper()
	out := addressesOf(res)
	require.Len(t, out, len(res), "every Address decodes")
	return out
}

// remoteService says how the workload uid of res differs from one
// reaching capacity pods on network through gateway:15008.
func remoteService(res map[string]*anypb.Any, uid, network, gateway string, capacity uint32) error {
	var uids []string
	for _, a := range addressesOf(res) {
		wl := a.GetWorkload()
		if wl == nil {
			continue
		}
		uids = append(uids, wl.GetUid())
		if wl.GetUid() != uid {
			continue
		}
		gw := wl.GetNetworkGateway()
		addr, _ := netip.AddrFromSlice(gw.GetAddress().GetAddress())
		switch {
		case gw.GetAddress().GetNetwork() != network || addr.String() != gateway || gw.GetHboneMtlsPort() != 15008:
			return fmt.Errorf("network gateway %s/%s:%d", gw.GetAddress().GetNetwork(), addr, gw.GetHboneMtlsPort())
		case wl.GetNetwork() != network || len(wl.GetAddresses()) > 0:
			return fmt.Errorf("network %q, %d addresses", wl.GetNetwork(), len(wl.GetAddresses()))
		case wl.GetCapacity().GetValue() != capacity:
			return fmt.Errorf("capacity %d, want %d", wl.GetCapacity().GetValue(), capacity)
		}
		return nil
	}
	slices.Sort(uids)
	return fmt.Errorf("no workload %s among %v", uid, uids)
}

// ztunnelAllows says how the Authorization name of res differs from an
// ALLOW policy for selected workloads whose rule groups are groups (in
// istiod.RenderGroups' form; none: it admits no one).
func ztunnelAllows(res map[string]*anypb.Any, name string, groups []string) error {
	a, err := istiod.DecodeAuthorization(res[name])
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if got := istiod.RenderGroups(a); a.GetAction() != security.Action_ALLOW || a.GetScope() != security.Scope_WORKLOAD_SELECTOR || !slices.Equal(got, groups) {
		return fmt.Errorf("%s: %s %s %q, want ALLOW WORKLOAD_SELECTOR %q", name, a.GetScope(), a.GetAction(), got, groups)
	}
	return nil
}

// startAmbientIstiod runs a real pilot-discovery for one cluster in
// ambient multi-network mode, signing with root.
func startAmbientIstiod(ctx context.Context, t *testing.T, kubeconfig, clusterID string, root *ca.MeshRoot) *istiod.Istiod {
	t.Helper()
	keyDER, err := x509.MarshalPKCS8PrivateKey(root.Key)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw})
	d, err := istiod.Start(ctx, istiod.Config{Kubeconfig: kubeconfig, ClusterID: clusterID, Dir: t.TempDir(), TrustDomain: "mesh.local",
		Ambient: true, MeshConfig: globalScopeMeshConfig, Env: map[string]string{"AMBIENT_ENABLE_MULTI_NETWORK": "true"},
		CACerts: map[string][]byte{istiod.CACertFile: certPEM, istiod.CAKeyFile: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
			istiod.CertChainFile: certPEM, istiod.RootCertFile: certPEM}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Stop() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod of %s, log (last lines):\n%s", clusterID, d.LogTail(40))
		}
	})
	return d
}
