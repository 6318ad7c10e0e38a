package dataplane_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/test/dataplane"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// The VirtualMesh of the cross-cluster tests: both clusters' meshes, one
// generated root (Manual verification, so a rotation waits at each phase
// while the workloads pick up new certificates), STRICT mTLS, and every
// Destination federated on the flat pod network.
const (
	vmName          = "dataplane"
	vmKey           = "relaymesh/" + vmName
	virtualMeshYAML = `
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: ` + vmName + `, namespace: relaymesh}
spec:
  meshes:
  - {clusterName: cluster-1, namespace: istio-system, name: istiod}
  - {clusterName: cluster-2, namespace: istio-system, name: istiod}
  mtls:
    shared:
      rootCA: {generated: {ttl: 87600h}}
      intermediateOptions: {ttl: 8760h}
    rotationStrategy: MultiRoot
    rotationVerification: Manual
    strictMTLS: true
  federation:
    flatNetwork: true
    selectors: [{}]
  globalAccessPolicy: MeshDefault
`
	// Federated hosts of the echo Services.
	echoOfCluster1 = "echo.apps.svc.cluster-1.global"
	echoOfCluster2 = "echo.apps.svc.cluster-2.global"
)

var (
	serviceEntries   = outputs.ServiceEntries
	authzPolicies    = outputs.AuthorizationPolicies
	virtualMeshesGVR = policyResources["VirtualMesh"]
)

// mesh is what a cluster's mesh holds of the VirtualMesh's trust: its
// cacerts as the agent wrote them, and the intermediate in it.
type mesh struct {
	cacerts      map[string][]byte
	version      string // the Secret's resourceVersion
	intermediate *x509.Certificate
	roots        []*x509.Certificate
}

// issuer is the intermediate's KeyID: what IssuerID of the certificates
// it signs is.
func (m mesh) issuer() string { return dataplane.KeyID(m.intermediate) }

// federation is the fixture under the VirtualMesh.
type federation struct {
	f      *fixture
	r      *relaymesh
	meshes map[string]mesh // by cluster
}

// TestFederation runs traffic across clusters through Relaymesh: a
// VirtualMesh gives both meshes intermediates of one generated root (the
// agents write cacerts, the clusters' istiods are restarted on them, and
// every workload gets a new certificate), STRICT mTLS and flat-network
// federation; then a federated host, a traffic shift between clusters,
// AccessPolicies across clusters, VirtualDestination failover, a root
// rotation under load, and a real SPIRE server's workload let in by an
// AccessPolicy naming its SPIFFE ID, each counted in RPCs.
func TestFederation(t *testing.T) {
	f := sharedFixture(t)
	r := sharedRelaymesh(t)
	fed := federate(t, f, r)

	// In order: each leaves the VirtualMesh as it found it.
	for _, c := range []struct {
		name  string
		check func(*federation, *testing.T)
	}{
		{"a client in cluster-1 reaches the federated host of cluster-2 over mTLS with each mesh's intermediate; another root fails", (*federation).checkFederatedHost},
		{"traffic shift 80/20 between clusters", (*federation).checkShiftAcrossClusters},
		{"AccessPolicy across clusters with globalAccessPolicy Enabled", (*federation).checkAccessAcrossClusters},
		{"VirtualDestination fails over to the other cluster when the local endpoints go", (*federation).checkFailover},
		{"root rotation under load", (*federation).checkRotationUnderLoad},
		{"a SPIRE workload reaches cluster-2's echo once the VirtualMesh trusts spire.example and an AccessPolicy names it", (*federation).checkSPIREWorkload},
	} {
		t.Run(c.name, func(t *testing.T) {
			fed.subtest(t)
			c.check(fed, t)
		})
	}
}

// federate creates the VirtualMesh, waits for both meshes' cacerts, restarts
// both istiods on them and re-issues every workload's certificate. At the
// end of the test the VirtualMesh is deleted, and the fixture is back at its
// baseline (the istiods keep the last cacerts: every workload's certificate
// comes from them, so the other tests do not mind).
func federate(t *testing.T, f *fixture, r *relaymesh) *federation {
	t.Helper()
	ctx := context.Background()
	fed := &federation{f: f, r: r, meshes: map[string]mesh{}}
	start := time.Now()
	_, err := r.mgmt.Apply(ctx, dataplane.FieldManager, []byte(virtualMeshYAML))
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, r.dyn.Resource(virtualMeshesGVR).Namespace("relaymesh").Delete(ctx, vmName, metav1.DeleteOptions{}))
		fed.waitFor(t, "the VirtualMesh's PeerAuthentications pruned", func() (bool, string) {
			n := 0
			for _, c := range []dynamic.Interface{r.c1, r.c2} {
				l, err := c.Resource(explainedKinds[1]).Namespace("istio-system").List(ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel})
				if err != nil {
					return false, err.Error()
				}
				n += len(l.Items)
			}
			return n == 0, fmt.Sprint(n)
		})
		f.baseline(t)
	})
	fed.waitFor(t, "cacerts in both clusters", func() (bool, string) {
		for _, c := range []string{"cluster-1", "cluster-2"} {
			m, err := fed.readMesh(ctx, c)
			if err != nil {
				return false, err.Error()
			}
			fed.meshes[c] = m
		}
		return true, ""
	})
	t.Logf("both meshes had their intermediate %s after the VirtualMesh was created", time.Since(start).Round(time.Millisecond))
	require.NotEqual(t, fed.meshes["cluster-1"].issuer(), fed.meshes["cluster-2"].issuer(), "each mesh has its own intermediate")
	fed.adopt(t, "the VirtualMesh's trust")
	fed.waitFor(t, "the federated hosts in both clusters", func() (bool, string) {
		for c, host := range map[dynamic.Interface]string{r.c1: echoOfCluster2, r.c2: echoOfCluster1} {
			if _, err := serviceEntryFor(ctx, c, host); err != nil {
				return false, err.Error()
			}
		}
		return true, ""
	})
	t.Logf("federated over a flat network with shared trust %s after the VirtualMesh was created", time.Since(start).Round(time.Millisecond))
	return fed
}

// subtest shows, if the subtest fails, what Relaymesh made of the
// objects.
func (fed *federation) subtest(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			fed.r.explain(t)
		}
	})
}

// readMesh reads the cacerts the agent wrote in cluster's istio-system.
func (fed *federation) readMesh(ctx context.Context, cluster string) (mesh, error) {
	c := fed.f.env.Cluster(cluster)
	s, err := c.Kube().CoreV1().Secrets("istio-system").Get(ctx, trust.SecretName, metav1.GetOptions{})
	if err != nil {
		return mesh{}, fmt.Errorf("%s: %w", cluster, err)
	}
	inter, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
	if err != nil {
		return mesh{}, fmt.Errorf("%s: %s: %w", cluster, trust.KeyCACert, err)
	}
	roots, err := pemutil.ParseCertificateBundle(s.Data[trust.KeyRootCert])
	if err != nil {
		return mesh{}, fmt.Errorf("%s: %s: %w", cluster, trust.KeyRootCert, err)
	}
	return mesh{cacerts: s.Data, version: s.ResourceVersion, intermediate: inter, roots: roots}, nil
}

// adopt restarts both clusters' istiods on fed.meshes' cacerts, side by
// side, then re-issues every workload's certificate from them.
func (fed *federation) adopt(t *testing.T, what string) (restart, renew time.Duration) {
	t.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, c := range []string{"cluster-1", "cluster-2"} {
		wg.Go(func() {
			_, errs[i] = fed.f.env.Cluster(c).RestartIstiod(context.Background(), fed.meshes[c].cacerts)
		})
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	restart = time.Since(start)
	start = time.Now()
	require.NoError(t, fed.f.renewAll(context.Background()))
	renew = time.Since(start)
	t.Logf("%s: istiods restarted in %s, every workload re-issued in %s", what, restart.Round(time.Millisecond), renew.Round(time.Millisecond))
	return restart, renew
}

// renewAll gives every workload of the fixture a new certificate from its
// cluster's istiod.
func (f *fixture) renewAll(ctx context.Context) error {
	ws := append(f.workloadsOf("cluster-1"), f.workloadsOf("cluster-2")...)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { errs[i] = w.RenewCertificate(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (fed *federation) waitFor(t *testing.T, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	start := time.Now()
	require.NoError(t, poll(ctx, what, cond))
	return time.Since(start)
}

// serviceEntryFor finds the Relaymesh ServiceEntry for host in a cluster.
func serviceEntryFor(ctx context.Context, c dynamic.Interface, host string) (*unstructured.Unstructured, error) {
	l, err := c.Resource(serviceEntries).List(ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel})
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		hosts, _, _ := unstructured.NestedStringSlice(l.Items[i].Object, "spec", "hosts")
		if len(hosts) == 1 && hosts[0] == host {
			return &l.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no ServiceEntry for %s yet", host)
}

// checkFederatedHost: cluster-1's sleep calls cluster-2's echo at its
// federated host, and cluster-2's sleep calls cluster-1's; every call is
// answered in the other cluster over mTLS, the server saw the caller's
// identity in the caller's trust domain, and each side's certificate came
// from its own mesh's intermediate. A caller that trusts another root
// cannot reach it.
func (fed *federation) checkFederatedHost(t *testing.T) {
	f, ctx := fed.f, context.Background()
	se, err := serviceEntryFor(ctx, fed.r.c1, echoOfCluster2)
	require.NoError(t, err)
	sans, _, _ := unstructured.NestedStringSlice(se.Object, "spec", "subjectAltNames")
	assert.Equal(t, []string{f.v3.SPIFFEID()}, sans, "the remote identity, in the remote trust domain")
	eps, _, _ := unstructured.NestedSlice(se.Object, "spec", "endpoints")
	require.Len(t, eps, 1)
	assert.Equal(t, f.v3.Address().PodIP, eps[0].(map[string]any)["address"], "the remote Pod IP, as discovery reported it")

	one, two := fed.meshes["cluster-1"], fed.meshes["cluster-2"]
	for name, m := range fed.meshes {
		pool := x509.NewCertPool()
		for _, r := range m.roots {
			pool.AddCert(r)
		}
		_, err := m.intermediate.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		require.NoError(t, err, "%s's intermediate chains to the VirtualMesh's root", name)
	}
	for _, dir := range []struct {
		from     *dataplane.Workload
		host     string
		to       string
		fromMesh mesh
		toMesh   mesh
	}{{f.sleep, echoOfCluster2, "cluster-2", one, two}, {f.sleep2, echoOfCluster1, "cluster-1", two, one}} {
		c, err := dir.from.DialHost(dir.host, echoPort)
		require.NoError(t, err)
		defer c.Close()
		f.settle(t, c, "answered in "+dir.to, dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Cluster(dir.to) == o.Total() })
		o := run(t, c, batch/2, dataplane.CallOptions{})
		assert.Equal(t, batch/2, o.Cluster(dir.to), "every call answered in %s", dir.to)
		assert.Equal(t, batch/2, o.Peer(dir.from.SPIFFEID()), "over mTLS: the server saw the caller's identity")
		assert.Equal(t, batch/2, o.PeerIssuer(dir.fromMesh.issuer()), "the caller's certificate came from its mesh's intermediate")
		assert.Equal(t, batch/2, o.ServerIssuer(dir.toMesh.issuer()), "the server's certificate came from its mesh's intermediate")
	}

	// other trusts another root: its new connections to cluster-2 fail.
	foreign, err := dataplane.NewRoot("foreign")
	require.NoError(t, err)
	require.NoError(t, f.other.WriteRoots(foreign.PEM()))
	t.Cleanup(func() { assert.NoError(t, f.other.RenewCertificate(context.Background())) })
	// Once gRPC reread the roots (within DefaultRefresh; polled, since a
	// loaded machine may run the refresh late): a new connection fails.
	require.Eventually(t, func() bool {
		c, err := f.other.DialHost(echoOfCluster2, echoPort)
		if err != nil {
			return false
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		o, err := c.Run(ctx, 1, dataplane.CallOptions{})
		return err == nil && o.ErrorsWith("certificate signed by unknown authority") == 1
	}, 30*time.Second, 200*time.Millisecond, "other's new roots in use")
	c, err := f.other.DialHost(echoOfCluster2, echoPort)
	require.NoError(t, err)
	defer c.Close()
	o := run(t, c, 100, dataplane.CallOptions{})
	assert.Equal(t, 100, o.ErrorsWith("certificate signed by unknown authority"), "a caller trusting another root cannot verify cluster-2's server")
}

// checkShiftAcrossClusters: a TrafficPolicy sends 20% of cluster-1's calls
// to echo to cluster-2's echo.
func (fed *federation) checkShiftAcrossClusters(t *testing.T) {
	f, r := fed.f, fed.r
	r.apply(t, `
apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: echo-across, namespace: relaymesh}
spec:
  sourceSelector: [{clusters: [cluster-1]}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: echo, namespace: apps, clusterName: cluster-1}]
  policy:
    mtls: {tlsMode: ISTIO_MUTUAL}
    trafficShift:
      destinations:
      - {weight: 80, kubeService: {name: echo, namespace: apps, clusterName: cluster-1}}
      - {weight: 20, kubeService: {name: echo, namespace: apps, clusterName: cluster-2}}
`)
	c, err := f.sleep.Dial("echo", ns, echoPort)
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	f.settle(t, c, "the split between clusters", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		p := o.Percent(o.Cluster("cluster-2"))
		return o.Failed() == 0 && p > 5 && p < 40
	})
	t.Logf("TrafficPolicy to traffic: %s", time.Since(start).Round(time.Millisecond))
	o := run(t, c, batch, dataplane.CallOptions{})
	require.Zero(t, o.Failed())
	within(t, 80, o.Percent(o.Cluster("cluster-1")), "cluster-1")
	within(t, 20, o.Percent(o.Cluster("cluster-2")), "cluster-2")
	assert.Equal(t, batch, o.Peer(f.sleep.SPIFFEID()), "every call over mTLS, in both clusters")
	assert.Positive(t, o.Version("v1"))
	assert.Positive(t, o.Version("v2"))
}

// checkAccessAcrossClusters: with globalAccessPolicy Enabled nobody reaches
// cluster-2's echo; an AccessPolicy for cluster-1's sleep lets it (and only
// it) in: cluster-1's other is denied, and so is cluster-2's own sleep, whose
// service account has the same name in another trust domain.
func (fed *federation) checkAccessAcrossClusters(t *testing.T) {
	f, r, ctx := fed.f, fed.r, context.Background()
	dial := func(w *dataplane.Workload) *dataplane.Client {
		c, err := w.DialHost(echoOfCluster2, echoPort)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	sleep, other := dial(f.sleep), dial(f.other)
	local, err := f.sleep2.Dial("echo", ns, echoPort) // cluster-2's sleep to its own echo
	require.NoError(t, err)
	defer local.Close()
	denied := func(o *dataplane.Outcomes) bool { return o.Code(codes.PermissionDenied) == o.Total() }

	// Before: everyone gets through (cluster-2's own sleep needs
	// ISTIO_MUTUAL to its local echo: a DestinationRule by hand).
	require.NoError(t, f.c2.Apply(ctx, istioMutualDR))
	t.Cleanup(func() { assert.NoError(t, f.c2.Delete(context.Background(), istioMutualDR)) })
	for _, c := range []*dataplane.Client{sleep, other, local} {
		f.settle(t, c, "OK before "+c.Target(), dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == o.Total() })
	}

	// Cleanups run last first: other is checked once the deny-all is gone.
	t.Cleanup(func() {
		f.settle(t, other, "other gets through again", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == o.Total() })
	})
	fed.denyByDefault(t)
	for _, c := range []*dataplane.Client{sleep, other, local} {
		f.settle(t, c, "deny by default for "+c.Target(), dataplane.CallOptions{}, denied)
	}
	o := run(t, sleep, batch/4, dataplane.CallOptions{})
	assert.Equal(t, batch/4, o.Code(codes.PermissionDenied), "globalAccessPolicy Enabled: a caller no AccessPolicy lists is denied")

	r.apply(t, `
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: echo-from-cluster-1, namespace: relaymesh}
spec:
  sourceSelector:
  - kubeServiceAccountRefs:
      serviceAccounts: [{name: sleep, namespace: apps, clusterName: cluster-1}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: echo, namespace: apps, clusterName: cluster-2}]
`)
	f.settle(t, sleep, "the AccessPolicy lets cluster-1's sleep in", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == o.Total() })
	o = run(t, sleep, batch/2, dataplane.CallOptions{})
	assert.Equal(t, batch/2, o.Cluster("cluster-2"), "the allowed service account of cluster-1 gets OK from cluster-2")
	assert.Equal(t, batch/2, o.Peer(f.sleep.SPIFFEID()))
	o = run(t, other, batch/2, dataplane.CallOptions{})
	assert.Equal(t, batch/2, o.Code(codes.PermissionDenied), "another service account of cluster-1 is denied")
	o = run(t, local, batch/4, dataplane.CallOptions{})
	assert.Equal(t, batch/4, o.Code(codes.PermissionDenied), "cluster-2's sleep: same account name, another trust domain, denied")
}

// denyByDefault sets the VirtualMesh's globalAccessPolicy to Enabled and,
// when t ends, back to MeshDefault, waiting until the agents pruned the
// deny-all policies.
func (fed *federation) denyByDefault(t *testing.T) {
	r, ctx := fed.r, context.Background()
	setGlobalAccess := func(v string) {
		_, err := r.dyn.Resource(virtualMeshesGVR).Namespace("relaymesh").Patch(ctx, vmName, types.MergePatchType,
			[]byte(`{"spec":{"globalAccessPolicy":"`+v+`"}}`), metav1.PatchOptions{})
		require.NoError(t, err)
	}
	setGlobalAccess("Enabled")
	t.Cleanup(func() {
		setGlobalAccess("MeshDefault")
		fed.waitFor(t, "the deny-all policies pruned", func() (bool, string) {
			n := 0
			for _, c := range []dynamic.Interface{r.c1, r.c2} {
				l, err := c.Resource(authzPolicies).Namespace("istio-system").List(ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel})
				if err != nil {
					return false, err.Error()
				}
				n += len(l.Items)
			}
			return n == 0, fmt.Sprint(n)
		})
	})
}

// checkFailover: a VirtualDestination over both clusters' echo, cluster-1
// first. cluster-1's sleep is answered in cluster-1; when cluster-1's echo
// Pods go (their endpoints leave the Destination, the ServiceEntry, istiod's
// EDS), its calls are answered in cluster-2; when they come back, in
// cluster-1 again.
func (fed *federation) checkFailover(t *testing.T) {
	f, r, ctx := fed.f, fed.r, context.Background()
	const host = "echo.apps.global"
	r.apply(t, `
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualDestination
metadata: {name: echo, namespace: relaymesh}
spec:
  hostname: `+host+`
  port: {number: 7070, protocol: GRPC}
  virtualMesh: {name: `+vmName+`}
  static:
    destinations:
    - {name: echo, namespace: apps, clusterName: cluster-1}
    - {name: echo, namespace: apps, clusterName: cluster-2}
`)
	c, err := f.sleep.DialHost(host, echoPort)
	require.NoError(t, err)
	defer c.Close()
	f.settle(t, c, "cluster-1 first", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		return o.Cluster("cluster-1") == o.Total() && bothVersions(o)
	})
	o := run(t, c, batch/2, dataplane.CallOptions{})
	assert.Equal(t, batch/2, o.Cluster("cluster-1"), "the first destination takes every call while it has endpoints")

	start := time.Now()
	gone := true
	t.Cleanup(func() {
		if gone {
			for _, w := range []*dataplane.Workload{f.v1, f.v2} {
				assert.NoError(t, w.Register(context.Background()))
			}
		}
	})
	for _, w := range []*dataplane.Workload{f.v1, f.v2} {
		require.NoError(t, w.Unregister(ctx))
	}
	fed.waitFor(t, "cluster-1's echo Destination has no endpoints", func() (bool, string) {
		d, err := r.destination(ctx, "cluster-1")
		if err != nil {
			return false, err.Error()
		}
		eps, _, _ := unstructured.NestedSlice(d.Object, "spec", "kubeService", "endpoints")
		return len(eps) == 0, fmt.Sprint(len(eps))
	})
	f.settle(t, c, "failed over to cluster-2", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Cluster("cluster-2") == o.Total() })
	t.Logf("cluster-1's endpoints gone to traffic in cluster-2: %s", time.Since(start).Round(time.Millisecond))
	o = run(t, c, batch/2, dataplane.CallOptions{})
	assert.Equal(t, batch/2, o.Cluster("cluster-2"), "every call answered in cluster-2")
	assert.Equal(t, batch/2, o.ServerIssuer(fed.meshes["cluster-2"].issuer()), "by cluster-2's mesh, over mTLS")

	start = time.Now()
	gone = false
	for _, w := range []*dataplane.Workload{f.v1, f.v2} {
		require.NoError(t, w.Register(ctx))
	}
	f.settle(t, c, "back to cluster-1", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Cluster("cluster-1") == o.Total() })
	t.Logf("cluster-1's endpoints back to traffic in cluster-1: %s", time.Since(start).Round(time.Millisecond))
}
