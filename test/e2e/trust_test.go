package e2e

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/test/istiod"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/test/spire"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestSharedTrust runs the server and two agents as processes: a VirtualMesh
// with a generated shared root gives each mesh an intermediate CA whose key
// is generated in the mesh's own cluster; both chain to the one root, and no
// intermediate key ever reaches the management cluster. Then a real istiod
// per cluster, with the cacerts its agent wrote, signs workload
// certificates, and each verifies against the other cluster's root bundle.
//
// A real spire-server federates (https_web) with the server's SPIFFE
// bundle endpoint for both meshes' trust domains and follows the root
// rotation phase by phase through its own CLI: it holds the new root
// before anything is issued from it (the rotation keeps AddingNewRoot for
// three refresh hints after publishing it), and the old root is gone
// from it once the rotation finished.
func TestSharedTrust(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt", "cluster-1", "cluster-2")
	mgmt := env.Cluster("mgmt")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	clients := map[string]kubernetes.Interface{}
	for _, name := range []string{"cluster-1", "cluster-2"} {
		_, err := env.Cluster(name).Apply(ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
		require.NoError(t, err)
		clients[name], err = env.Cluster(name).Clientset()
		require.NoError(t, err)
	}
	relayAddr, opsAddr, bundleAddr, spiffeBundleAddr := Addr(t), Addr(t), Addr(t), Addr(t)
	const endpointID = "spiffe://cluster-2.local/relaymesh/bundle-endpoint"
	const refreshHint = 10 * time.Second
	serverArgs := []string{"server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", dir + "/audit.log", "--server-dns-names", "localhost", "--server-ips", Host(relayAddr),
		"--spiffe-bundle-listen", bundleAddr, "--spiffe-bundle-ips", Host(bundleAddr), "--spiffe-bundle-refresh-hint", refreshHint.String(),
		"--spiffe-bundle-peer-poll", "0s", "--spiffe-bundle-spiffe-listen", spiffeBundleAddr, "--spiffe-bundle-endpoint-id", endpointID}
	server := Start(t, bin, dir, "server", serverArgs...)
	waitHealthy(t, opsAddr)
	mgmtClient, err := mgmt.Clientset()
	require.NoError(t, err)
	for _, name := range []string{"cluster-1", "cluster-2"} {
		_, err := Run(t, bin, "cluster", "register", name, "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", env.Cluster(name).Kubeconfig, "--server-address", relayAddr)
		require.NoError(t, err)
		Start(t, bin, dir, "agent-"+name, "agent", "--kubeconfig", env.Cluster(name).Kubeconfig, "--health-listen", Addr(t), "--metrics-listen", Addr(t))
	}
	Eventually(t, 60*time.Second, "both meshes discovered", func() (bool, string) {
		l, err := mgmtClient.CoreV1().RESTClient().Get().AbsPath("/apis/discovery.relaymesh.io/v1alpha1/namespaces/relaymesh/meshes").DoRaw(ctx)
		return err == nil && strings.Count(string(l), `"kind":"Mesh"`) == 2, fmt.Sprint(err)
	})

	vm, err := examples.Demo.ReadFile("demo/virtualmesh.yaml")
	require.NoError(t, err)
	start := time.Now()
	_, err = mgmt.Apply(ctx, "test", vm)
	require.NoError(t, err)

	cacerts := map[string]*corev1.Secret{}
	Eventually(t, 30*time.Second, "cacerts in both clusters", func() (bool, string) {
		for name, c := range clients {
			s, err := c.CoreV1().Secrets("istio-system").Get(ctx, trust.SecretName, metav1.GetOptions{})
			if err != nil {
				return false, name + ": " + err.Error()
			}
			cacerts[name] = s
		}
		return true, ""
	})
	t.Logf("both meshes had their intermediate %s after the VirtualMesh was created", time.Since(start).Round(time.Millisecond))

	one, two := cacerts["cluster-1"], cacerts["cluster-2"]
	require.Equal(t, one.Data[trust.KeyRootCert], two.Data[trust.KeyRootCert], "one shared root bundle")
	roots, err := pemutil.ParseCertificateBundle(one.Data[trust.KeyRootCert])
	require.NoError(t, err)
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	var serials []string
	for name, s := range cacerts {
		inter, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
		require.NoError(t, err, name)
		assert.True(t, inter.IsCA && inter.MaxPathLenZero && inter.MaxPathLen == 0, "%s: a CA limited to path length 0", name)
		_, err = inter.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		require.NoError(t, err, "%s: the intermediate chains to the shared root", name)
		serials = append(serials, inter.SerialNumber.String())
	}
	assert.NotEqual(t, serials[0], serials[1])

	// No intermediate key is anywhere in the management cluster.
	all, err := mgmtClient.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, s := range all.Items {
		for k, v := range s.Data {
			for name, c := range cacerts {
				assert.NotContains(t, string(v), strings.TrimSpace(string(c.Data[trust.KeyCAKey])), "%s's intermediate key in mgmt secret %s/%s[%s]", name, s.Namespace, s.Name, k)
			}
		}
	}

	// The management cluster knows the root and what each mesh was issued
	// (the status is written by the reconcile after each signing).
	var out string
	Eventually(t, 10*time.Second, "ca status names the serials the agents hold", func() (bool, string) {
		out, err = Run(t, bin, "ca", "status", "--kubeconfig", mgmt.Kubeconfig)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range cacerts {
			inter, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
			if err != nil || !strings.Contains(out, inter.SerialNumber.Text(16)) {
				return false, out
			}
		}
		return true, ""
	})
	for _, want := range []string{"VIRTUALMESH relaymesh/bookinfo-federation", "ROTATION NotRotating", meshName("cluster-1") + "  cluster-1", meshName("cluster-2") + "  cluster-2"} {
		require.Contains(t, out, want)
	}

	// The operator's check says the same.
	out, err = Run(t, bin, "ca", "verify", "--kubeconfig", env.Cluster("cluster-1").Kubeconfig, "--kubeconfig", env.Cluster("cluster-2").Kubeconfig)
	require.NoError(t, err, out)
	require.Equal(t, 2, strings.Count(out, "  ok"), out)
	require.Contains(t, out, "only cluster-1.local", "each intermediate signs its own mesh's identities only:\n%s", out)

	// A real istiod per cluster, fed the agent's cacerts as a kubelet would
	// mount them; each signs a workload certificate for bookinfo-reviews.
	issued := map[string][]*x509.Certificate{}
	for _, name := range []string{"cluster-1", "cluster-2"} {
		// The sample's mesh config gives cluster-N the trust domain
		// cluster-N.local; its intermediate signs identities of that domain
		// only.
		d, err := istiod.Start(ctx, istiod.Config{Kubeconfig: env.Cluster(name).Kubeconfig, ClusterID: name, Dir: t.TempDir(),
			CACerts: cacerts[name].Data, TrustDomain: name + ".local"})
		require.NoError(t, err, name)
		t.Cleanup(func() { _ = d.Stop() })
		token, err := istiod.ServiceAccountToken(ctx, clients[name], "bookinfo", "bookinfo-reviews", istiod.TokenAudience)
		require.NoError(t, err)
		_, csr, err := istiod.WorkloadCSR("spiffe://" + name + ".local/ns/bookinfo/sa/bookinfo-reviews")
		require.NoError(t, err)
		chain, err := d.WorkloadCertificate(ctx, token, csr)
		require.NoError(t, err, "%s: istiod signs with the plugged-in intermediate\n%s", name, d.LogTail(20))
		issued[name] = chain
	}
	for from, to := range map[string]string{"cluster-1": "cluster-2", "cluster-2": "cluster-1"} {
		roots, err := pemutil.ParseCertificateBundle(cacerts[to].Data[trust.KeyRootCert])
		require.NoError(t, err)
		chain := issued[from]
		_, err = verifyWorkload(chain, roots)
		require.NoError(t, err, "a workload certificate from %s's istiod verifies against %s's root bundle", from, to)
	}
	// The check can fail: against another root it does not verify.
	other, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "other"})
	require.NoError(t, err)
	_, err = verifyWorkload(issued["cluster-1"], []*x509.Certificate{other.Cert})
	require.Error(t, err)

	// Rotate the root, MultiRoot with Manual verification, killing the
	// server in the middle.
	r := &rotation{t: t, ctx: ctx, bin: bin, env: env, clients: clients, mgmt: mgmt.Kubeconfig}
	r.observe("before", issued, cacerts)
	_, err = mgmtClient.CoreV1().RESTClient().Patch("application/merge-patch+json").
		AbsPath("/apis/networking.relaymesh.io/v1alpha1/namespaces/relaymesh/virtualmeshes/bookinfo-federation").
		Body([]byte(`{"spec":{"mtls":{"rotationVerification":"Manual"}}}`)).DoRaw(ctx)
	require.NoError(t, err)
	oldRoot := roots[0]
	// The peer, configured once the meshes' bundles are published: a real
	// spire-server that trusts the relay root for https_web (the
	// endpoint's certificate is the relay CA's).
	relayRoot, err := mgmtClient.CoreV1().Secrets("relaymesh").Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	webRoots := filepath.Join(dir, "relay-root.pem")
	require.NoError(t, os.WriteFile(webRoots, relayRoot.Data["ca.crt"], 0o600))
	// cluster-1.local over https_web; cluster-2.local over https_spiffe:
	// the endpoint serves an X509-SVID for endpointID from the VirtualMesh
	// root, and SPIRE, bootstrapped with the root the meshes hold,
	// authenticates it with the latest bundle it fetched.
	feds := []spire.Federation{
		{TrustDomain: "cluster-1.local", URL: "https://" + bundleAddr + "/bundles/cluster-1.local"},
		{TrustDomain: "cluster-2.local", URL: "https://" + spiffeBundleAddr + "/bundles/cluster-2.local", EndpointSPIFFEID: endpointID},
	}
	peer, err := spire.Start(ctx, spire.Config{TrustDomain: "spire.example", WebRoots: webRoots, FederatesWith: feds[:1], BundleEndpoint: true})
	require.NoError(t, err)
	require.NoError(t, peer.Federate(ctx, feds[1], cacerts["cluster-2"].Data[trust.KeyRootCert]),
		"https_spiffe: the endpoint's SVID verifies with the bootstrap bundle\n%s", peer.LogTail(20))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("spire-server's log:\n%s", peer.LogTail(40))
		}
		_ = peer.Stop()
	})
	// SPIRE keeps a federated bundle's roots, not its sequence (it shows
	// 0): the sequence is proven at the endpoint (server/app).
	spireHolds := func(what string, want ...*x509.Certificate) {
		t.Helper()
		Eventually(t, 45*time.Second, "spire-server holds the "+what+" for both trust domains", func() (bool, string) {
			for _, f := range feds {
				b, err := peer.FederatedBundle(ctx, f.TrustDomain)
				if err != nil {
					return false, err.Error()
				}
				if got := b.X509Authorities(); len(got) != len(want) || !b.HasX509Authority(want[0]) || !b.HasX509Authority(want[len(want)-1]) {
					return false, fmt.Sprintf("%s: %d roots", f.TrustDomain, len(got))
				}
			}
			return true, ""
		})
	}
	spireHolds("old root", oldRoot)

	// And the other way: Relaymesh imports SPIRE's bundle endpoint
	// (https_spiffe, bootstrapped with `spire-server bundle show`). Then an
	// X509-SVID SPIRE mints verifies against Relaymesh's view, and the
	// workload certificate cluster-1's istiod signed against SPIRE's.
	spireRoots, err := peer.BundlePEM(ctx)
	require.NoError(t, err)
	_, err = mgmt.Apply(ctx, "test", []byte(fmt.Sprintf(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: FederatedTrustDomain
metadata: {name: spire, namespace: relaymesh}
spec: {trustDomain: spire.example, bundleEndpointURL: %q, profile: https_spiffe, endpointSPIFFEID: %q, bootstrapBundle: %q}
`, peer.BundleEndpointURL(), peer.EndpointID(), spireRoots)))
	require.NoError(t, err)
	var imported []*x509.Certificate
	Eventually(t, 30*time.Second, "the server's Lease holder imports SPIRE's bundle", func() (bool, string) {
		raw, err := mgmtClient.CoreV1().RESTClient().Get().AbsPath("/apis/networking.relaymesh.io/v1alpha1/namespaces/relaymesh/federatedtrustdomains/spire").DoRaw(ctx)
		if err != nil {
			return false, err.Error()
		}
		var ftd networkingv1alpha1.FederatedTrustDomain
		if err := json.Unmarshal(raw, &ftd); err != nil {
			return false, err.Error()
		}
		if ftd.Status.State != networkingv1alpha1.FederatedCurrent {
			return false, fmt.Sprintf("%s: %s", ftd.Status.State, ftd.Status.Error)
		}
		imported, err = pemutil.ParseCertificateBundle([]byte(ftd.Status.BundlePEM))
		return err == nil, fmt.Sprint(err)
	})
	wantRoots, err := pemutil.ParseCertificateBundle(spireRoots)
	require.NoError(t, err)
	require.ElementsMatch(t, wantRoots, imported, "the imported bundle is SPIRE's")
	svid, err := peer.Mint(ctx, "spiffe://spire.example/ns/default/sa/client")
	require.NoError(t, err)
	id, _, err := x509svid.Verify(svid, x509bundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("spire.example"), imported))
	require.NoError(t, err, "SPIRE's X509-SVID verifies against the bundle Relaymesh imported")
	assert.Equal(t, "spiffe://spire.example/ns/default/sa/client", id.String())
	held, err := peer.FederatedBundle(ctx, "cluster-1.local")
	require.NoError(t, err)
	_, err = verifyWorkload(issued["cluster-1"], held.X509Authorities())
	require.NoError(t, err, "the mesh workload's certificate verifies against the bundle SPIRE holds for cluster-1.local")

	// The meshes trust SPIRE's workloads, as spire.example only: once the
	// VirtualMesh names the imported trust domain, every mesh's
	// root-cert.pem carries SPIRE's root cross-certified by the
	// VirtualMesh root, name-constrained to spire.example. A real istiod
	// runs on it and hands it to its workloads; SPIRE's SVID verifies
	// against what istiod hands out (as proxyless gRPC verifies a peer),
	// and the bundle endpoint still publishes the meshes' own root only
	// (spireHolds and istiodHolds below count exactly).
	_, err = mgmtClient.CoreV1().RESTClient().Patch("application/merge-patch+json").
		AbsPath("/apis/networking.relaymesh.io/v1alpha1/namespaces/relaymesh/virtualmeshes/bookinfo-federation").
		Body([]byte(`{"spec":{"mtls":{"federatedTrustDomains":["spire.example"]}}}`)).DoRaw(ctx)
	require.NoError(t, err)
	federated := map[string]*corev1.Secret{}
	Eventually(t, 60*time.Second, "both meshes' root-cert.pem carry SPIRE's root, cross-certified", func() (bool, string) {
		for name, c := range clients {
			s, err := c.CoreV1().Secrets("istio-system").Get(ctx, trust.SecretName, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			certs, err := pemutil.ParseCertificateBundle(s.Data[trust.KeyRootCert])
			if err != nil || len(certs) != 2 {
				return false, fmt.Sprintf("%s: %d certificates in root-cert.pem (%v)", name, len(certs), err)
			}
			federated[name] = s
		}
		return true, ""
	})
	for name, s := range federated {
		d, err := istiod.Start(ctx, istiod.Config{Kubeconfig: env.Cluster(name).Kubeconfig, ClusterID: name, Dir: t.TempDir(), CACerts: s.Data, TrustDomain: name + ".local"})
		require.NoError(t, err, name)
		token, err := istiod.ServiceAccountToken(ctx, clients[name], "bookinfo", "bookinfo-reviews", istiod.TokenAudience)
		require.NoError(t, err)
		_, csr, err := istiod.WorkloadCSR("spiffe://" + name + ".local/ns/bookinfo/sa/bookinfo-reviews")
		require.NoError(t, err)
		files, err := d.IssueFiles(ctx, istiod.CertificateRequest{Token: token, CSR: csr, TTL: time.Hour})
		require.NoError(t, err, "%s: istiod runs on root-cert.pem with a cross-certificate\n%s", name, d.LogTail(20))
		require.NoError(t, d.Stop())
		handed, err := pemutil.ParseCertificateBundle(files.Roots)
		require.NoError(t, err)
		require.Len(t, handed, 2, "%s: istiod hands its workloads the root and the cross-certificate", name)
		chains, err := verifyWorkload(svid, handed)
		require.NoError(t, err, "%s: SPIRE's SVID verifies against the roots istiod hands out", name)
		require.Len(t, chains[0], 2, "leaf, then the cross-certificate as anchor")
		cross := chains[0][1]
		assert.Equal(t, []string{"spire.example"}, cross.PermittedURIDomains, "%s: the cross-certificate permits spire.example only", name)
		assert.True(t, slices.ContainsFunc(wantRoots, func(r *x509.Certificate) bool {
			return string(r.RawSubjectPublicKeyInfo) == string(cross.RawSubjectPublicKeyInfo)
		}),
			"%s: the cross-certificate carries SPIRE's root key", name)
		mine, err := pemutil.ParseCertificateBundle(files.CertChain)
		require.NoError(t, err)
		_, err = verifyWorkload(mine, handed)
		require.NoError(t, err, "%s: the mesh's own workload certificate still verifies", name)
	}
	// From here on every rotation phase checks SPIRE's SVID too.
	r.foreign = svid
	out, err = Run(t, bin, "ca", "status", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt.Kubeconfig)
	require.NoError(t, err, out)
	require.Regexp(t, `(?m)^  FOREIGN TRUST DOMAIN .*\n  spire\.example +[0-9a-f]{16}… +[0-9a-f]{16}… +\d{4}-\d\d-\d\d`, out, "ca status shows the cross-certified SPIRE root")

	// The other peer: a real istiod of another mesh (trust domain
	// peer.example, its own CA) whose meshConfig.caCertificates names the
	// bundle of cluster-1.local by spiffeBundleUrl; with
	// ISTIO_MULTIROOT_MESH it pushes what it fetched to its proxies
	// (PCDS). It polls every 30 minutes, or when the URL changes: each
	// check below changes a query parameter the endpoint ignores, as a
	// mesh config edit would.
	peerIstiod, peerTrust := startPeerIstiod(t, ctx, env.Cluster("cluster-2"), clients["cluster-2"], webRoots, "https://"+bundleAddr+"/bundles/cluster-1.local")
	fetches := 0
	istiodHolds := func(what string, want ...*x509.Certificate) {
		t.Helper()
		fetches++
		require.NoError(t, peerIstiod.SetMeshConfig(bundleURLMeshConfig(fmt.Sprintf("https://%s/bundles/cluster-1.local?fetch=%d", bundleAddr, fetches))))
		actx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		err := peerTrust.Await(actx, func(res map[string]*anypb.Any) error {
			roots, err := istiod.TrustBundle(res)
			if err != nil {
				return err
			}
			extra := 0
			for _, r := range roots {
				if !slices.ContainsFunc(want, r.Equal) {
					extra++
				}
			}
			for _, w := range want {
				if !slices.ContainsFunc(roots, w.Equal) {
					return fmt.Errorf("%d roots, not the %s", len(roots), what)
				}
			}
			if extra != 1 {
				return fmt.Errorf("%d roots besides the %s, want 1 (its own)", extra, what)
			}
			return nil
		})
		require.NoError(t, err, "the peer istiod distributes the %s\n%s", what, peerIstiod.LogTail(20))
	}
	istiodHolds("old root", oldRoot)

	out, err = Run(t, bin, "ca", "rotate", "start", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt.Kubeconfig, "--wait", "120s")
	require.NoError(t, err, out)
	t.Logf("ca rotate start:\n%s", out)
	require.Contains(t, out, "AddingNewRoot step 1 (awaiting continue)")
	require.Contains(t, out, "the new root has been published at the SPIFFE bundle endpoint since", "AddingNewRoot waited for federated peers")
	r.phase("AddingNewRoot", 3)
	// Nothing is issued from the new root yet, and spire-server, polling
	// on its own (no refresh asked for), already holds it: the wait was
	// three refresh hints, and SPIRE fetches every hint/4 (at least 15s).
	newRoot := r.last["cluster-1"].bundle[0]
	if newRoot.Equal(oldRoot) {
		newRoot = r.last["cluster-1"].bundle[1]
	}
	for _, f := range feds {
		b, err := peer.FederatedBundle(ctx, f.TrustDomain)
		require.NoError(t, err)
		assert.True(t, b.HasX509Authority(oldRoot) && b.HasX509Authority(newRoot), "%s: spire-server holds old and new before anything is issued from the new root", f.TrustDomain)
	}

	out, err = Run(t, bin, "ca", "rotate", "continue", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt.Kubeconfig, "--wait", "60s")
	require.NoError(t, err, out)
	require.Contains(t, out, "PropagatingNewIntermediate step 2 (awaiting continue)")
	r.phase("PropagatingNewIntermediate", 3)

	// The server dies (SIGKILL) and a new one resumes from the status.
	require.NoError(t, server.Kill())
	Start(t, bin, dir, "server-restarted", serverArgs...)
	waitHealthy(t, opsAddr)
	out, err = Run(t, bin, "ca", "status", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt.Kubeconfig)
	require.NoError(t, err, out)
	require.Contains(t, out, "rotation (MultiRoot): PropagatingNewIntermediate step 2", "the restarted server resumed the rotation:\n%s", out)
	Eventually(t, 60*time.Second, "the resumed rotation waits for a continue", func() (bool, string) {
		out, err := Run(t, bin, "ca", "status", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt.Kubeconfig)
		return err == nil && strings.Contains(out, "awaiting `relaymesh ca rotate continue`"), out
	})

	spireHolds("old and the new root", oldRoot, newRoot)
	istiodHolds("old and the new root", oldRoot, newRoot)

	out, err = Run(t, bin, "ca", "rotate", "continue", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt.Kubeconfig, "--wait", "60s")
	require.NoError(t, err, out)
	require.Contains(t, out, "DeletingOldRoot step 3 (awaiting continue)")
	r.phase("DeletingOldRoot", 2)
	spireHolds("new root only", newRoot)
	istiodHolds("new root only", newRoot)

	out, err = Run(t, bin, "ca", "rotate", "continue", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt.Kubeconfig, "--wait", "60s")
	require.NoError(t, err, out)
	require.Contains(t, out, "Finished step 3")
	r.phase("Finished", 2)
	spireHolds("new root only", newRoot)
	// SPIRE, now holding the new root only, still authenticates the
	// https_spiffe endpoint: its SVID moved to the new root.
	require.NoError(t, peer.Refresh(ctx, "cluster-2.local"), "the https_spiffe endpoint's SVID is from the new root\n%s", peer.LogTail(20))
	istiodHolds("new root only", newRoot)
	t.Logf("rotation: %d cross-cluster verifications of istiod-issued workload certificates, 0 failed", r.checks)

	// After Finished the old root is trusted nowhere: neither a bundle
	// carries it, nor does a workload certificate from before the rotation
	// verify against any bundle.
	for name, m := range r.last {
		for _, root := range m.bundle {
			assert.False(t, root.Equal(oldRoot), "%s's bundle still carries the old root", name)
		}
		for from, before := range r.seen[0].certs {
			_, err := verifyWorkload(before, m.bundle)
			assert.Error(t, err, "a certificate %s's istiod issued before the rotation verifies against %s's bundle", from, name)
		}
	}
	out, err = Run(t, bin, "ca", "verify", "--kubeconfig", env.Cluster("cluster-1").Kubeconfig, "--kubeconfig", env.Cluster("cluster-2").Kubeconfig)
	require.NoError(t, err, out)

	// Operators see it in the metrics too.
	metrics := "http://" + opsAddr + "/metrics"
	v, err := MetricWith(metrics, "relaymesh_trust_rotation_phase", `phase="Finished",virtual_mesh="relaymesh/bookinfo-federation"`)
	require.NoError(t, err)
	assert.Equal(t, 1.0, v, "rotation phase metric")
	v, err = MetricWith(metrics, "relaymesh_trust_root_expiry_timestamp_seconds", `virtual_mesh="relaymesh/bookinfo-federation"`)
	require.NoError(t, err)
	assert.Greater(t, v, float64(time.Now().AddDate(5, 0, 0).Unix()), "the new root's expiry (ttl 87600h)")
	v, err = MetricWith(metrics, "relaymesh_trust_intermediate_expiry_timestamp_seconds", `mesh="`+meshName("cluster-1")+`"`)
	require.NoError(t, err)
	assert.Greater(t, v, float64(time.Now().Unix()), "cluster-1's intermediate expiry")
	v, err = MetricWith(metrics, "relaymesh_trust_held", `virtual_mesh="relaymesh/bookinfo-federation"`)
	require.NoError(t, err)
	assert.Equal(t, 0.0, v)
	for _, td := range []string{"cluster-1.local", "cluster-2.local"} {
		v, err = MetricWith(metrics, "relaymesh_spiffe_bundle_sequence", `trust_domain="`+td+`"`)
		require.NoError(t, err)
		assert.Greater(t, v, float64(start.Unix()), "%s: the sequence of the new root's bundle, above the clock at the start", td)
		v, err = MetricWith(metrics, "relaymesh_spiffe_bundle_published_timestamp_seconds", `trust_domain="`+td+`"`)
		require.NoError(t, err)
		assert.Greater(t, v, float64(start.Unix()), "%s: published during the rotation", td)
	}
	v, err = MetricWith(metrics, "relaymesh_spiffe_bundle_endpoint_svid_expiry_timestamp_seconds", "")
	require.NoError(t, err)
	assert.Greater(t, v, float64(time.Now().Add(20*time.Hour).Unix()), "the https_spiffe SVID, issued at the last step, lasts 24h")
}

// rotation follows a root rotation with a real istiod per cluster: at each
// phase it restarts istiod on the cacerts the agent wrote (as
// autoRestartPods, or a kubelet remounting the Secret, would), has it sign a
// workload certificate, and checks every cluster's certificate against
// every other cluster's root bundle, of this phase and of the phase before
// (agents apply a phase at different times, and workloads keep certificates
// of the phase before for a while).
type rotation struct {
	t       *testing.T
	ctx     context.Context
	bin     string
	env     *localcluster.Env
	mgmt    string
	clients map[string]kubernetes.Interface
	seen    []phaseState
	last    map[string]meshState
	checks  int
	// foreign: an SVID of a federated trust domain every mesh's bundle
	// must accept at every phase (nil: none yet).
	foreign []*x509.Certificate
}

type phaseState struct {
	name  string
	certs map[string][]*x509.Certificate // workload chain by cluster
	roots map[string][]*x509.Certificate // root bundle by cluster
}

type meshState struct{ bundle []*x509.Certificate }

func (r *rotation) observe(name string, certs map[string][]*x509.Certificate, cacerts map[string]*corev1.Secret) {
	ps := phaseState{name: name, certs: certs, roots: map[string][]*x509.Certificate{}}
	r.last = map[string]meshState{}
	for cl, s := range cacerts {
		roots, err := pemutil.ParseCertificateBundle(s.Data[trust.KeyRootCert])
		require.NoError(r.t, err)
		ps.roots[cl] = roots
		r.last[cl] = meshState{bundle: roots}
	}
	r.seen = append(r.seen, ps)
}

// phase checks the phase the rotation waits in: each mesh's bundle has
// wantRoots roots, and certificates verify across clusters and phases.
func (r *rotation) phase(name string, wantRoots int) {
	t := r.t
	cacerts := map[string]*corev1.Secret{}
	for cl, c := range r.clients {
		s, err := c.CoreV1().Secrets("istio-system").Get(r.ctx, trust.SecretName, metav1.GetOptions{})
		require.NoError(t, err)
		cacerts[cl] = s
	}
	certs := map[string][]*x509.Certificate{}
	for cl, s := range cacerts {
		d, err := istiod.Start(r.ctx, istiod.Config{Kubeconfig: r.env.Cluster(cl).Kubeconfig, ClusterID: cl, Dir: t.TempDir(), CACerts: s.Data, TrustDomain: cl + ".local"})
		require.NoError(t, err, "%s: %s", name, cl)
		token, err := istiod.ServiceAccountToken(r.ctx, r.clients[cl], "bookinfo", "bookinfo-reviews", istiod.TokenAudience)
		require.NoError(t, err)
		_, csr, err := istiod.WorkloadCSR("spiffe://" + cl + ".local/ns/bookinfo/sa/bookinfo-reviews")
		require.NoError(t, err)
		chain, err := d.WorkloadCertificate(r.ctx, token, csr)
		require.NoError(t, err, "%s: %s's istiod signs\n%s", name, cl, d.LogTail(20))
		require.NoError(t, d.Stop())
		certs[cl] = chain
	}
	r.observe(name, certs, cacerts)
	for cl, roots := range r.seen[len(r.seen)-1].roots {
		assert.Len(t, roots, wantRoots, "%s: %s's root-cert.pem", name, cl)
		if r.foreign != nil {
			_, err := verifyWorkload(r.foreign, roots)
			assert.NoError(t, err, "%s: the federated SVID verifies against %s's bundle", name, cl)
		}
	}
	prev, cur := r.seen[len(r.seen)-2], r.seen[len(r.seen)-1]
	for _, certsOf := range []phaseState{prev, cur} {
		for _, rootsOf := range []phaseState{prev, cur} {
			for from, chain := range certsOf.certs {
				for to, roots := range rootsOf.roots {
					if from == to {
						continue
					}
					r.checks++
					_, err := verifyWorkload(chain, roots)
					assert.NoError(t, err, "%s: a certificate %s's istiod issued in %s verifies against %s's bundle of %s", name, from, certsOf.name, to, rootsOf.name)
				}
			}
		}
	}
}

// verifyWorkload verifies a workload chain (leaf first, as istiod returns
// it) against roots.
func verifyWorkload(chain, roots []*x509.Certificate) ([][]*x509.Certificate, error) {
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	return chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
}

// bundleURLMeshConfig is mesh config that trusts the roots at a SPIFFE
// bundle endpoint.
func bundleURLMeshConfig(url string) string {
	return "caCertificates:\n- spiffeBundleUrl: " + url + "\n  trustDomains: [cluster-1.local]\n"
}

// startPeerIstiod starts, in cluster's apiserver (namespace istio-peer),
// an istiod of another mesh with its own self-signed CA that trusts the
// bundle at bundleURL (https_web, webRoots its only roots), and watches
// the trust bundle it pushes its proxies.
func startPeerIstiod(t *testing.T, ctx context.Context, cluster *localcluster.Cluster, client kubernetes.Interface, webRoots, bundleURL string) (*istiod.Istiod, *istiod.DeltaWatch) {
	t.Helper()
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-peer"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	root, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "peer"})
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(root.Key)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw})
	d, err := istiod.Start(ctx, istiod.Config{Kubeconfig: cluster.Kubeconfig, ClusterID: "peer", Namespace: "istio-peer", Dir: t.TempDir(),
		TrustDomain: "peer.example", MeshConfig: bundleURLMeshConfig(bundleURL),
		Env: map[string]string{"ISTIO_MULTIROOT_MESH": "true", "SSL_CERT_FILE": webRoots},
		CACerts: map[string][]byte{istiod.CACertFile: certPEM, istiod.CAKeyFile: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
			istiod.CertChainFile: certPEM, istiod.RootCertFile: certPEM}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Stop() })
	w, err := d.WatchDelta(ctx, d.SidecarNode("10.9.0.1", "client-0", "default", "default", nil), istiod.ProxyConfigTypeURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return d, w
}
