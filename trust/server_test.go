package trust_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	"go.step.sm/crypto/x509util"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// published records what the controller publishes per cluster.
type published struct {
	mu   sync.Mutex
	sets map[string][]*relaypb.TrustRequest
}

func (p *published) SetTrust(cluster string, reqs []*relaypb.TrustRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sets[cluster] = reqs
}

func (p *published) TrustVersion(string) uint64 { return 0 }

func (p *published) get(cluster string) []*relaypb.TrustRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sets[cluster]
}

func csrPEM(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	csr, err := x509util.CreateCertificateRequest("", nil, k)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr.Raw})
}

// The controller asks each cluster for the CAs of its meshes that belong to
// a valid VirtualMesh with shared trust, and signs intermediates only for a
// mesh of the caller's own cluster.
func TestControllerPublishesAndAuthorizes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	localcluster.SkipIfShort(t)
	cl := env.Cluster("cluster-1")
	kube := client(t)
	ns := namespace(t, kube)
	dyn, err := dynamic.NewForConfig(cl.RESTConfig())
	require.NoError(t, err)
	manifest := ""
	for i, c := range []string{"c1", "c2"} {
		manifest += fmt.Sprintf(`
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: %[1]s, namespace: %[2]s}
spec: {}
---
apiVersion: discovery.relaymesh.io/v1alpha1
kind: Mesh
metadata: {name: istiod-istio-system-%[1]s, namespace: %[2]s}
spec:
  istio:
    installation: {name: istiod, namespace: istio-system, cluster: %[1]s}
    trustDomain: %[1]s.local
---
`, c, ns)
		_ = i
	}
	manifest += fmt.Sprintf(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: shared, namespace: %[1]s}
spec:
  meshes: [{clusterName: c1, namespace: istio-system, name: istiod}, {clusterName: c2, namespace: istio-system, name: istiod}]
  mtls:
    shared:
      rootCA: {generated: {}}
      intermediateOptions: {ttl: 2h, renewAtPercent: 50}
`, ns)
	_, err = cl.Apply(ctx, "test", []byte(manifest))
	require.NoError(t, err)

	pub := &published{sets: map[string][]*relaypb.TrustRequest{}}
	ctl, err := trust.Start(ctx, trust.Config{Dynamic: dyn, Kube: kube, Namespace: ns, Outputs: pub,
		Clusters: func() []string { return []string{"c1", "c2", "c3"} }, Audit: audit.Discard})
	require.NoError(t, err)

	require.Len(t, pub.get("c1"), 1)
	require.Len(t, pub.get("c2"), 1)
	assert.Empty(t, pub.get("c3"), "a cluster without a member mesh gets an empty set")
	req := pub.get("c1")[0]
	assert.Equal(t, "istiod-istio-system-c1", req.GetMesh())
	assert.Equal(t, "istio-system", req.GetNamespace())
	assert.Equal(t, "c1.local", req.GetTrustDomain(), "the mesh's discovered trust domain")
	assert.Equal(t, int32(50), req.GetRenewAtPercent())
	assert.Equal(t, pub.get("c2")[0].GetRootBundle(), req.GetRootBundle(), "one root for the VirtualMesh")
	roots, err := pemutil.ParseCertificateBundle(req.GetRootBundle())
	require.NoError(t, err)
	require.Len(t, roots, 1)
	assert.Equal(t, trust.Fingerprint(roots[0]), req.GetIssuer())
	secrets, err := kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "relaymesh.io/virtualmesh-root=true"})
	require.NoError(t, err)
	require.Len(t, secrets.Items, 1, "the generated root lives in one Secret of the server's namespace")

	resp, err := ctl.SignIntermediate(ctx, "c1", &relaypb.IntermediateRequest{Mesh: "istiod-istio-system-c1", Csr: csrPEM(t)})
	require.NoError(t, err)
	chain, err := pemutil.ParseCertificateBundle(resp.GetCertificateChain())
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(roots[0])
	_, err = chain[0].Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	require.NoError(t, err)
	assert.True(t, chain[0].IsCA && chain[0].MaxPathLenZero)
	assert.WithinDuration(t, time.Now().Add(2*time.Hour), chain[0].NotAfter, 5*time.Minute, "intermediateOptions.ttl")
	assert.Equal(t, req.GetIssuer(), resp.GetIssuer())
	assert.Equal(t, []string{"c1.local"}, chain[0].PermittedURIDomains, "the intermediate signs identities of its mesh's trust domain only")
	assert.Equal(t, []string{".c1.local"}, chain[0].ExcludedURIDomains)
	require.Eventually(t, func() bool {
		u, err := dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(ns).Get(ctx, "shared", metav1.GetOptions{})
		require.NoError(t, err)
		var vm networkingv1alpha1.VirtualMesh
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &vm))
		return vm.Status.SharedTrust != nil && len(vm.Status.SharedTrust.Meshes) == 1 && vm.Status.SharedTrust.Meshes[0].TrustDomain == "c1.local"
	}, 10*time.Second, 50*time.Millisecond, "the status records the intermediate's trust domain")

	foreignSubject := func() []byte {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		csr, err := x509util.CreateCertificateRequest("istiod-istio-system-c2 intermediate", nil, k)
		require.NoError(t, err)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr.Raw})
	}
	otherConstraints := func() []byte {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		ext, err := ca.NameConstraintsRequest("c2.local")
		require.NoError(t, err)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{ext}}, k)
		require.NoError(t, err)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	for _, tc := range []struct {
		name, cluster, mesh string
		csr                 []byte
		code                codes.Code
	}{
		{"a mesh of another cluster", "c2", "istiod-istio-system-c1", csrPEM(t), codes.PermissionDenied},
		{"an unknown mesh", "c1", "istiod-nowhere", csrPEM(t), codes.FailedPrecondition},
		{"garbage CSR", "c1", "istiod-istio-system-c1", []byte("not a csr"), codes.InvalidArgument},
		// The caller's request is at fault, not the server: InvalidArgument.
		{"a foreign subject", "c1", "istiod-istio-system-c1", foreignSubject(), codes.InvalidArgument},
		{"another trust domain's constraints", "c1", "istiod-istio-system-c1", otherConstraints(), codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ctl.SignIntermediate(ctx, tc.cluster, &relaypb.IntermediateRequest{Mesh: tc.mesh, Csr: tc.csr})
			require.Error(t, err)
			assert.Equal(t, tc.code, status.Code(err), err.Error())
		})
	}

	// A VirtualMesh that stops asking for shared trust: no more requests.
	_, err = cl.Apply(ctx, "test", []byte(fmt.Sprintf(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: shared, namespace: %s}
spec:
  meshes: [{clusterName: c1, namespace: istio-system, name: istiod}, {clusterName: c2, namespace: istio-system, name: istiod}]
`, ns)))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(pub.get("c1")) == 0 && len(pub.get("c2")) == 0 }, 10*time.Second, 50*time.Millisecond)
	_, err = ctl.SignIntermediate(ctx, "c1", &relaypb.IntermediateRequest{Mesh: "istiod-istio-system-c1", Csr: csrPEM(t)})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
}

// A VirtualMesh cannot make the server sign with a key from another
// namespace: a root Secret outside the server's namespace is refused and
// nothing is asked of the meshes.
func TestRootSecretMustBeInTheServersNamespace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	localcluster.SkipIfShort(t)
	cl := env.Cluster("cluster-1")
	kube := client(t)
	server, other := namespace(t, kube), "default"
	dyn, err := dynamic.NewForConfig(cl.RESTConfig())
	require.NoError(t, err)
	root, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "stolen"})
	require.NoError(t, err)
	keyBlock, err := pemutil.Serialize(root.Key)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw})
	_, err = kube.CoreV1().Secrets(other).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "team-root-" + server, Namespace: other},
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: pem.EncodeToMemory(keyBlock)}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cl.Apply(ctx, "test", []byte(fmt.Sprintf(`
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: c9, namespace: %[1]s}
spec: {}
---
apiVersion: discovery.relaymesh.io/v1alpha1
kind: Mesh
metadata: {name: istiod-c9, namespace: %[1]s}
spec:
  istio:
    installation: {name: istiod, namespace: istio-system, cluster: c9}
    trustDomain: c9.local
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: stolen, namespace: %[1]s}
spec:
  meshes: [{clusterName: c9, namespace: istio-system, name: istiod}]
  mtls:
    shared:
      rootCA: {secret: {name: team-root-%[1]s, namespace: %[2]s}}
`, server, other)))
	require.NoError(t, err)
	pub := &published{sets: map[string][]*relaypb.TrustRequest{}}
	ctl, err := trust.Start(ctx, trust.Config{Dynamic: dyn, Kube: kube, Namespace: server, Outputs: pub,
		Clusters: func() []string { return []string{"c9"} }, Audit: audit.Discard})
	require.NoError(t, err)
	assert.Empty(t, pub.get("c9"))
	_, err = ctl.SignIntermediate(ctx, "c9", &relaypb.IntermediateRequest{Mesh: "istiod-c9", Csr: csrPEM(t)})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
}

// Intermediates are issued only for a trust domain the registry grants to
// the mesh's cluster alone (or shared by every holder): a mesh that starts
// reporting another trust domain gets nothing until an administrator
// grants it, a grant written onto a second cluster takes it from both, and
// marking it shared on both gives it back. Each cluster's status says why.
func TestIntermediatesOnlyForAGrantedTrustDomain(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	localcluster.SkipIfShort(t)
	cl := env.Cluster("cluster-1")
	kube := client(t)
	ns := namespace(t, kube)
	// Clusters g1 and g2: VirtualMeshes of other tests (in every
	// namespace, which the controller watches) name meshes of c1 and c2.
	dyn, err := dynamic.NewForConfig(cl.RESTConfig())
	require.NoError(t, err)
	apply := func(manifest string) {
		t.Helper()
		_, err := cl.Apply(ctx, "test", []byte(strings.ReplaceAll(manifest, "NS", ns)))
		require.NoError(t, err)
	}
	mesh := func(cluster, td string) {
		t.Helper()
		apply(meshManifest(cluster, td))
	}
	grant := func(cluster, grants string) {
		t.Helper()
		apply(fmt.Sprintf(`
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: %s, namespace: NS}
spec: {trustDomains: %s}
`, cluster, grants))
	}
	grant("g1", "[]")
	grant("g2", "[]")
	mesh("g1", "g1.local")
	mesh("g2", "g2.local")
	apply(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: shared, namespace: NS}
spec:
  meshes: [{clusterName: g1, namespace: istio-system, name: istiod}, {clusterName: g2, namespace: istio-system, name: istiod}]
  mtls: {shared: {rootCA: {generated: {}}}}
`)
	t.Cleanup(func() {
		_ = dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(ns).Delete(context.Background(), "shared", metav1.DeleteOptions{})
	})
	pub := &published{sets: map[string][]*relaypb.TrustRequest{}}
	var logs syncbuf.Buffer
	ctl, err := trust.Start(ctx, trust.Config{Dynamic: dyn, Kube: kube, Namespace: ns, Outputs: pub,
		Clusters: func() []string { return []string{"g1", "g2"} }, Audit: audit.Discard,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("controller log:\n%s", logs.String())
		// What federation decides from the apiserver's objects now.
		in := &translation.Input{}
		for _, r := range []struct {
			gvr schema.GroupVersionResource
			ns  string
		}{{networkingv1alpha1.VirtualMeshes, ""}, {discoveryv1alpha1.Meshes, ns},
			{multiclusterv1alpha1.KubernetesClusters, ns}} {
			l, err := dyn.Resource(r.gvr).Namespace(r.ns).List(context.Background(), metav1.ListOptions{})
			require.NoError(t, err)
			for _, u := range l.Items {
				b, _ := u.MarshalJSON()
				require.NoError(t, in.Decode(b))
			}
		}
		out, rep := translation.NewOutput(), translation.NewReport()
		federation.Translate(in, out, rep)
		for _, k := range rep.Keys() {
			st, targets, _ := rep.Status(k)
			t.Logf("%v: %s %v %v", k, st.State, st.Errors, targets)
		}
	})
	sign := func() ([]string, error) {
		resp, err := ctl.SignIntermediate(ctx, "g1", &relaypb.IntermediateRequest{Mesh: "istiod-g1", Csr: csrPEM(t)})
		if err != nil {
			return nil, err
		}
		chain, err := pemutil.ParseCertificateBundle(resp.GetCertificateChain())
		require.NoError(t, err)
		return chain[0].PermittedURIDomains, nil
	}
	signs := func(what, td string) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			got, err := sign()
			if err == nil && len(got) == 1 && got[0] == td {
				return
			}
			last = fmt.Sprint(got, err)
		}
		t.Fatalf("%s: no intermediate for %s (last: %s; published: %v)", what, td, last, pub.get("g1"))
	}
	refused := func(what string) {
		t.Helper()
		require.Eventually(t, func() bool {
			_, err := sign()
			code := status.Code(err)
			return code == codes.PermissionDenied || code == codes.FailedPrecondition || code == codes.Unavailable
		}, 30*time.Second, 50*time.Millisecond, what)
		// And it stays refused: no reconcile gives it back.
		time.Sleep(300 * time.Millisecond)
		_, err := sign()
		require.Error(t, err, what)
		for _, r := range pub.get("g1") {
			assert.True(t, r.GetHold() || r.GetTrustDomain() != "g1-new.local", "no request to sign outside the grant: %v", r)
		}
	}
	kcStatus := func(cluster, td string, state multiclusterv1alpha1.TrustDomainState, msg string) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			u, err := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns).Get(ctx, cluster, metav1.GetOptions{})
			require.NoError(t, err)
			var kc multiclusterv1alpha1.KubernetesCluster
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &kc))
			last = fmt.Sprint(kc.Status.TrustDomains)
			for _, st := range kc.Status.TrustDomains {
				if st.Name == td && st.State == state && strings.Contains(st.Message, msg) {
					return
				}
			}
		}
		t.Fatalf("%s: no %s %s in status.trustDomains (last: %s)", cluster, td, state, last)
	}

	signs("the default grant", "g1.local")
	kcStatus("g1", "g1.local", multiclusterv1alpha1.TrustDomainAuthorized, "")

	// The mesh reports a trust domain nobody granted: nothing is signed.
	mesh("g1", "g1-new.local")
	refused("a trust domain outside the grant")
	kcStatus("g1", "g1-new.local", multiclusterv1alpha1.TrustDomainNotGranted, `cluster g1 is not granted trust domain "g1-new.local" (its grant: g1.local)`)

	// An administrator grants it: the mesh gets an intermediate for it.
	grant("g1", "[{name: g1-new.local}]")
	signs("granted by an administrator", "g1-new.local")
	kcStatus("g1", "g1-new.local", multiclusterv1alpha1.TrustDomainAuthorized, "")

	// The same grant written onto g2 as well takes it from both.
	grant("g2", "[{name: g2.local}, {name: g1-new.local}]")
	refused("a trust domain granted to two clusters")
	kcStatus("g1", "g1-new.local", multiclusterv1alpha1.TrustDomainConflict, `granted to clusters g1, g2`)
	kcStatus("g2", "g1-new.local", multiclusterv1alpha1.TrustDomainConflict, `granted to clusters g1, g2`)

	// Shared on one side is not enough; on both, it is usable again.
	grant("g2", "[{name: g2.local}, {name: g1-new.local, shared: true}]")
	refused("shared by one holder only")
	grant("g1", "[{name: g1-new.local, shared: true}]")
	signs("shared by both holders", "g1-new.local")
	kcStatus("g2", "g1-new.local", multiclusterv1alpha1.TrustDomainAuthorized, "shared with clusters g1")
}

// Each VirtualMesh is judged by its own members, whatever order the watch
// lists them in: a VirtualMesh refused for a trust domain outside a grant
// never has another VirtualMesh's verdict (or members) taken for its own.
func TestEveryVirtualMeshIsJudgedByItsOwnMembers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	localcluster.SkipIfShort(t)
	cl := env.Cluster("cluster-1")
	kube := client(t)
	ns := namespace(t, kube)
	dyn, err := dynamic.NewForConfig(cl.RESTConfig())
	require.NoError(t, err)
	clusters := []string{"h1", "h2", "h3", "h4", "h5"}
	manifest := ""
	for i, c := range clusters {
		td := c + ".local"
		if i == 0 {
			td = "elsewhere.local" // not granted: VirtualMesh vm-h1 is Invalid
		}
		manifest += fmt.Sprintf(`
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: %[1]s, namespace: %[2]s}
spec: {}
---
apiVersion: discovery.relaymesh.io/v1alpha1
kind: Mesh
metadata: {name: istiod-%[1]s, namespace: %[2]s}
spec:
  istio:
    installation: {name: istiod, namespace: istio-system, cluster: %[1]s}
    trustDomain: %[3]s
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: vm-%[1]s, namespace: %[2]s}
spec:
  meshes: [{clusterName: %[1]s, namespace: istio-system, name: istiod}]
  mtls: {shared: {rootCA: {generated: {}}}}
---
`, c, ns, td)
	}
	_, err = cl.Apply(ctx, "test", []byte(manifest))
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range clusters {
			_ = dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(ns).Delete(context.Background(), "vm-"+c, metav1.DeleteOptions{})
		}
	})
	pub := &published{sets: map[string][]*relaypb.TrustRequest{}}
	ctl, err := trust.Start(ctx, trust.Config{Dynamic: dyn, Kube: kube, Namespace: ns, Outputs: pub,
		Clusters: func() []string { return clusters }, Audit: audit.Discard})
	require.NoError(t, err)
	// Every reconcile lists the VirtualMeshes in the watch's (map) order.
	for round := range 20 {
		if round > 0 {
			ctl.Kick()
			time.Sleep(150 * time.Millisecond)
		}
		for _, r := range pub.get("h1") {
			require.True(t, r.GetHold(), "round %d: the mesh outside its grant is asked to take a CA: %v", round, r)
		}
		_, err := ctl.SignIntermediate(ctx, "h1", &relaypb.IntermediateRequest{Mesh: "istiod-h1", Csr: csrPEM(t)})
		require.Error(t, err, "round %d", round)
		for _, c := range clusters[1:] {
			reqs := pub.get(c)
			require.Len(t, reqs, 1, "round %d: %s", round, c)
			assert.Equal(t, ns+"/vm-"+c, reqs[0].GetVirtualMesh(), "round %d: %s", round, c)
			assert.Equal(t, c+".local", reqs[0].GetTrustDomain(), "round %d: %s", round, c)
		}
	}
}

// statusWrites counts the PATCH requests to KubernetesClusters' status
// subresource made through a client.
type statusWrites struct{ n atomic.Int64 }

func (w *statusWrites) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodPatch && strings.Contains(req.URL.Path, "/kubernetesclusters/") && strings.HasSuffix(req.URL.Path, "/status") {
			w.n.Add(1)
		}
		return rt.RoundTrip(req)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// A controller starting over statuses that already show its verdicts (a
// restarted server, a new Lease holder) writes none of them again: at a
// fleet's size that was a status write per cluster, for nothing. A
// verdict that changes is still written.
func TestShownGrantStatusesAreNotWrittenAgain(t *testing.T) {
	localcluster.SkipIfShort(t)
	cl := env.Cluster("cluster-1")
	kube := client(t)
	ns := namespace(t, kube)
	ctx := t.Context()
	apply := func(manifest string) {
		t.Helper()
		_, err := cl.Apply(ctx, "test", []byte(strings.ReplaceAll(manifest, "NS", ns)))
		require.NoError(t, err)
	}
	for _, c := range []string{"s1", "s2"} {
		apply(fmt.Sprintf(`
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: %s, namespace: NS}
spec: {}
`, c))
		apply(meshManifest(c, c+".local"))
	}
	// The verdicts go through ClusterStatus (the server's status writer's
	// client, a budget of its own), none through Dynamic.
	var viaDynamic statusWrites
	t.Cleanup(func() { assert.Zero(t, viaDynamic.n.Load(), "status writes through Dynamic, not ClusterStatus") })
	start := func() (*statusWrites, context.CancelFunc) {
		t.Helper()
		writes := &statusWrites{}
		counted := func(w *statusWrites) dynamic.Interface {
			cfg := rest.CopyConfig(cl.RESTConfig())
			cfg.Wrap(w.wrap)
			dyn, err := dynamic.NewForConfig(cfg)
			require.NoError(t, err)
			return dyn
		}
		cctx, cancel := context.WithCancel(ctx)
		_, err := trust.Start(cctx, trust.Config{Dynamic: counted(&viaDynamic), ClusterStatus: counted(writes), Kube: kube, Namespace: ns,
			Outputs:  &published{sets: map[string][]*relaypb.TrustRequest{}},
			Clusters: func() []string { return []string{"s1", "s2"} }, Audit: audit.Discard})
		require.NoError(t, err)
		return writes, cancel
	}
	shown := func(cluster string) []multiclusterv1alpha1.TrustDomainStatus {
		u, err := dynamic.NewForConfigOrDie(cl.RESTConfig()).Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns).Get(ctx, cluster, metav1.GetOptions{})
		require.NoError(t, err)
		var kc multiclusterv1alpha1.KubernetesCluster
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &kc))
		return kc.Status.TrustDomains
	}
	authorized := func(cluster string, meshes ...string) bool {
		st := shown(cluster)
		return len(st) == 1 && st[0].Name == cluster+".local" && st[0].State == multiclusterv1alpha1.TrustDomainAuthorized && slices.Equal(st[0].Meshes, meshes)
	}

	first, stop := start()
	require.Eventually(t, func() bool {
		return authorized("s1", "istio-system/istiod") && authorized("s2", "istio-system/istiod")
	}, 30*time.Second, 50*time.Millisecond)
	assert.GreaterOrEqual(t, first.n.Load(), int64(2), "the first controller wrote both verdicts")
	stop()

	// trust.Start returns after its first reconcile, on a synced cache.
	again, stop := start()
	defer stop()
	assert.Zero(t, again.n.Load(), "the verdicts the statuses show were written again")

	// A verdict that changes is written: s2's mesh goes away.
	require.NoError(t, dynamic.NewForConfigOrDie(cl.RESTConfig()).Resource(discoveryv1alpha1.Meshes).Namespace(ns).Delete(ctx, "istiod-s2", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return authorized("s2") }, 30*time.Second, 50*time.Millisecond)
	assert.True(t, authorized("s1", "istio-system/istiod"))
	assert.Equal(t, int64(1), again.n.Load(), "only the changed verdict was written")

	// Someone else's write over the verdict is undone: what the status
	// shows is the controller's verdict, not what was last written.
	_, err := dynamic.NewForConfigOrDie(cl.RESTConfig()).Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns).Patch(ctx, "s1",
		types.MergePatchType, []byte(`{"status":{"trustDomains":[{"name":"s1.local","state":"Authorized","meshes":["elsewhere/istiod"]}]}}`), metav1.PatchOptions{}, "status")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return authorized("s1", "istio-system/istiod") }, 30*time.Second, 50*time.Millisecond)
	written := again.n.Load()
	assert.Equal(t, int64(2), written, "one write back")
	time.Sleep(time.Second)
	assert.Equal(t, written, again.n.Load(), "writes went on after the status showed the verdict")
}

// meshManifest is a discovered Mesh of cluster (its istiod in
// istio-system) reporting trust domain td, in namespace NS.
func meshManifest(cluster, td string) string {
	return fmt.Sprintf(`
apiVersion: discovery.relaymesh.io/v1alpha1
kind: Mesh
metadata: {name: istiod-%[1]s, namespace: NS}
spec:
  istio:
    installation: {name: istiod, namespace: istio-system, cluster: %[1]s}
    trustDomain: %[2]s
`, cluster, td)
}
