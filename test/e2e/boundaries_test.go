package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/identity"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/istiod"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// TestTrustBoundaries replays, against the server and agents as processes,
// what a compromised workload cluster did to the previous release, and
// checks each is refused:
//
//   - cluster eu pushes an istiod in namespace istio-system-prod, whose old
//     discovered name (<name>-<namespace>-<cluster>) was prod-eu's real mesh:
//     both meshes now exist side by side, and a VirtualMesh that names
//     prod-eu's control plane never reaches eu's;
//   - eu claims prod-eu's trust domain: a VirtualMesh with both is Invalid
//     and nobody gets an intermediate;
//   - eu's agent asks for prod-eu's intermediate with its own certificate:
//     refused, nothing issued;
//   - eu claims prod-eu's trust domain in a VirtualMesh with cluster us, not
//     with prod-eu (issue 27): refused, because the registry grants eu only
//     eu.local; no intermediate for eu or us. An administrator granting it
//     to eu as well takes it from both; marking it shared on both opens the
//     gate;
//   - with intermediates issued to both (eu now with a trust domain of its
//     own), eu's real istiod, configured to mint prod-eu's identities, signs
//     a workload certificate that Go's and OpenSSL's verifiers refuse
//     against the shared root, while prod-eu's own verifies;
//   - eu, now a member with an intermediate for eu.local, starts reporting
//     prod-eu.local without anyone editing the VirtualMesh: its
//     intermediate is neither renewed nor reissued, and the statuses say
//     why; a new trust domain works once an administrator grants it.
func TestTrustBoundaries(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt", "prod-eu", "eu", "us")
	mgmt := env.Cluster("mgmt")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	_, err = env.Cluster("prod-eu").Apply(ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", "prod-eu")))
	require.NoError(t, err)
	squat := strings.ReplaceAll(string(sample), "CLUSTER.local", "prod-eu.local")
	squat = strings.ReplaceAll(squat, "istio-system", "istio-system-prod")
	_, err = env.Cluster("eu").Apply(ctx, "test", []byte(strings.ReplaceAll(squat, "CLUSTER", "eu")))
	require.NoError(t, err)
	_, err = env.Cluster("us").Apply(ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", "us")))
	require.NoError(t, err)
	clients := map[string]kubernetes.Interface{}
	for _, name := range []string{"prod-eu", "eu", "us"} {
		clients[name], err = env.Cluster(name).Clientset()
		require.NoError(t, err)
	}

	relayAddr, opsAddr := Addr(t), Addr(t)
	Start(t, bin, dir, "server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", dir+"/audit.log", "--server-dns-names", "localhost", "--server-ips", Host(relayAddr))
	waitHealthy(t, opsAddr)
	for _, name := range []string{"prod-eu", "eu", "us"} {
		args := []string{"cluster", "register", name, "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", env.Cluster(name).Kubeconfig, "--server-address", relayAddr}
		if name == "eu" {
			args = append(args, "--trust-domain", "eu.local") // the default, spelled out
		}
		out, err := Run(t, bin, args...)
		require.NoError(t, err)
		require.Contains(t, out, "granted trust domain(s) "+name+".local")
		Start(t, bin, dir, "agent-"+name, "agent", "--kubeconfig", env.Cluster(name).Kubeconfig, "--health-listen", Addr(t), "--metrics-listen", Addr(t))
	}
	// Registration refuses a grant another cluster holds.
	_, err = Run(t, bin, "cluster", "register", "squatter", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--server-address", relayAddr, "--dry-run", "--trust-domain", "prod-eu.local")
	require.ErrorContains(t, err, `trust domain "prod-eu.local" is already granted to cluster prod-eu`)
	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	meshes := dyn.Resource(discoveryv1alpha1.Meshes).Namespace("relaymesh")
	victim := discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, "prod-eu", "istio-system", "istiod")
	squatter := discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, "eu", "istio-system-prod", "istiod")
	Eventually(t, 60*time.Second, "every mesh discovered, each under its own name", func() (bool, string) {
		l, err := meshes.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		got := map[string]string{}
		for _, m := range l.Items {
			got[m.GetName()] = m.GetLabels()[discoveryv1alpha1.LabelCluster]
		}
		return len(got) == 3 && got[victim] == "prod-eu" && got[squatter] == "eu" && got[meshName("us")] == "us", fmt.Sprint(got)
	})
	require.NotEqual(t, victim, squatter)

	vms := dyn.Resource(schemaVirtualMeshes).Namespace("relaymesh")
	applyNamedVM := func(name, meshes string) {
		t.Helper()
		_, err := mgmt.Apply(ctx, "test", []byte(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: `+name+`, namespace: relaymesh}
spec:
  meshes: `+meshes+`
  mtls: {shared: {rootCA: {generated: {}}}}
`))
		require.NoError(t, err)
	}
	applyVM := func(meshes string) { t.Helper(); applyNamedVM("shared", meshes) }
	cacerts := func(cluster, ns string) (*corev1.Secret, error) {
		return clients[cluster].CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
	}
	vmState := func(name, state, msg string) {
		t.Helper()
		Eventually(t, 30*time.Second, "VirtualMesh "+name+" "+state+": "+msg, func() (bool, string) {
			o, err := vms.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			st, _, _ := unstructured.NestedString(o.Object, "status", "state")
			errs, _, _ := unstructured.NestedStringSlice(o.Object, "status", "errors")
			warns, _, _ := unstructured.NestedStringSlice(o.Object, "status", "warnings")
			all := strings.Join(append(errs, warns...), ";")
			return st == state && strings.Contains(all, msg), st + fmt.Sprint(all)
		})
	}
	kcs := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh")
	grant := func(cluster, grants string) {
		t.Helper()
		_, err := kcs.Patch(ctx, cluster, types.MergePatchType, []byte(`{"spec":{"trustDomains":`+grants+`}}`), metav1.PatchOptions{})
		require.NoError(t, err)
	}
	kcSays := func(cluster, td string, state multiclusterv1alpha1.TrustDomainState, msg string) {
		t.Helper()
		Eventually(t, 30*time.Second, fmt.Sprintf("KubernetesCluster %s: %s %s", cluster, td, state), func() (bool, string) {
			o, err := kcs.Get(ctx, cluster, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			var kc multiclusterv1alpha1.KubernetesCluster
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &kc); err != nil {
				return false, err.Error()
			}
			for _, st := range kc.Status.TrustDomains {
				if st.Name == td && st.State == state && strings.Contains(st.Message, msg) {
					return true, ""
				}
			}
			return false, fmt.Sprint(kc.Status.TrustDomains)
		})
	}
	// refusedNow: eu's agent, with its real certificate, asks for an
	// intermediate of its mesh constrained to td; the server refuses.
	refusedNow := func(td string) {
		t.Helper()
		conn := agentConn(t, ctx, clients["eu"], relayAddr)
		_, err := relaypb.NewTrustClient(conn).SignIntermediate(ctx, &relaypb.IntermediateRequest{Mesh: squatter, Csr: meshCSR(t, td)})
		require.Error(t, err, "an intermediate for %s", td)
		assert.Contains(t, []codes.Code{codes.FailedPrecondition, codes.Unavailable, codes.PermissionDenied}, status.Code(err), err.Error())
	}
	setTrustDomain := func(cluster, ns, from, to string) {
		t.Helper()
		cm, err := clients[cluster].CoreV1().ConfigMaps(ns).Get(ctx, "istio", metav1.GetOptions{})
		require.NoError(t, err)
		require.Contains(t, cm.Data["mesh"], from)
		cm.Data["mesh"] = strings.ReplaceAll(cm.Data["mesh"], from, to)
		_, err = clients[cluster].CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	constrainedTo := func(s *corev1.Secret) []string {
		c, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
		require.NoError(t, err)
		return c.PermittedURIDomains
	}

	// 1. Both meshes claim prod-eu.local: the VirtualMesh is Invalid (eu is
	// not granted it), and neither mesh gets an intermediate.
	applyVM("[{clusterName: prod-eu, namespace: istio-system, name: istiod}, {clusterName: eu, namespace: istio-system-prod, name: istiod}]")
	vmState("shared", "Invalid", `cluster eu is not granted trust domain "prod-eu.local" (its grant: eu.local)`)
	time.Sleep(2 * time.Second) // what would have been issued has had time
	for cluster, ns := range map[string]string{"prod-eu": "istio-system", "eu": "istio-system-prod"} {
		_, err := cacerts(cluster, ns)
		require.Error(t, err, "%s got an intermediate from an Invalid VirtualMesh", cluster)
	}

	// 2. The VirtualMesh the operator meant names prod-eu's control plane:
	// only prod-eu gets an intermediate.
	applyVM("[{clusterName: prod-eu, namespace: istio-system, name: istiod}]")
	Eventually(t, 30*time.Second, "prod-eu's intermediate", func() (bool, string) {
		_, err := cacerts("prod-eu", "istio-system")
		return err == nil, fmt.Sprint(err)
	})

	// 3. eu's agent asks for prod-eu's intermediate, and for its own mesh's,
	// with its real certificate: refused.
	conn := agentConn(t, ctx, clients["eu"], relayAddr)
	for _, tc := range []struct {
		mesh string
		code codes.Code
	}{{victim, codes.PermissionDenied}, {squatter, codes.FailedPrecondition}} {
		csr := meshCSR(t, "prod-eu.local")
		_, err := relaypb.NewTrustClient(conn).SignIntermediate(ctx, &relaypb.IntermediateRequest{Mesh: tc.mesh, Csr: csr})
		require.Error(t, err)
		assert.Equal(t, tc.code, status.Code(err), "%s: %v", tc.mesh, err)
	}
	_, err = cacerts("eu", "istio-system-prod")
	require.Error(t, err, "eu has no intermediate")

	// 3b. Issue 27: eu claims prod-eu.local in a VirtualMesh with us, which
	// prod-eu is not in. Uniqueness within one VirtualMesh does not see it;
	// the registry's grant does: the VirtualMesh is Invalid, nobody gets an
	// intermediate, and eu's KubernetesCluster says why.
	applyNamedVM("eu-us", "[{clusterName: eu, namespace: istio-system-prod, name: istiod}, {clusterName: us, namespace: istio-system, name: istiod}]")
	vmState("eu-us", "Invalid", `mesh eu/istio-system-prod/istiod reports trust domain "prod-eu.local": cluster eu is not granted trust domain "prod-eu.local" (its grant: eu.local)`)
	kcSays("eu", "prod-eu.local", multiclusterv1alpha1.TrustDomainNotGranted, "they get no intermediate")
	vmState("shared", "Accepted", "")
	refusedNow("prod-eu.local")
	time.Sleep(2 * time.Second) // what would have been issued has had time
	for cluster, ns := range map[string]string{"eu": "istio-system-prod", "us": "istio-system"} {
		_, err := cacerts(cluster, ns)
		require.Error(t, err, "%s got an intermediate from a VirtualMesh with a trust domain outside a grant", cluster)
	}
	// So no certificate for prod-eu's identities can come from eu's mesh,
	// and none can verify against a bundle us carries: there is none.

	// An administrator granting prod-eu.local to eu as well, unshared (or
	// shared on eu's side only), takes it from both clusters: "first claim
	// wins" would have left it to whoever registered it first.
	grant("eu", `[{"name":"eu.local"},{"name":"prod-eu.local","shared":true}]`)
	kcSays("prod-eu", "prod-eu.local", multiclusterv1alpha1.TrustDomainConflict, `granted to clusters eu, prod-eu, and prod-eu does not mark it shared`)
	kcSays("eu", "prod-eu.local", multiclusterv1alpha1.TrustDomainConflict, "granted to clusters eu, prod-eu")
	vmState("shared", "Invalid", `trust domain "prod-eu.local" is granted to clusters eu, prod-eu`)
	vmState("eu-us", "Invalid", `trust domain "prod-eu.local" is granted to clusters eu, prod-eu`)
	refusedNow("prod-eu.local")
	// Shared on both: the gate opens, eu's mesh gets an intermediate for
	// prod-eu.local (the administrator's explicit, warned choice).
	grant("prod-eu", `[{"name":"prod-eu.local","shared":true}]`)
	vmState("eu-us", "Accepted", `uses trust domain "prod-eu.local", which clusters prod-eu hold too`)
	kcSays("eu", "prod-eu.local", multiclusterv1alpha1.TrustDomainAuthorized, "shared with clusters prod-eu")
	Eventually(t, 60*time.Second, "eu's and us's intermediates of VirtualMesh eu-us", func() (bool, string) {
		euSecret, err1 := cacerts("eu", "istio-system-prod")
		usSecret, err2 := cacerts("us", "istio-system")
		if err1 != nil || err2 != nil {
			return false, fmt.Sprint(err1, err2)
		}
		return slicesEqual(constrainedTo(euSecret), []string{"prod-eu.local"}) && slicesEqual(constrainedTo(usSecret), []string{"us.local"}), ""
	})
	// Back to exclusive grants for what follows.
	require.NoError(t, vms.Delete(ctx, "eu-us", metav1.DeleteOptions{}))
	grant("prod-eu", `[]`)
	grant("eu", `[{"name":"eu.local"}]`)
	kcSays("prod-eu", "prod-eu.local", multiclusterv1alpha1.TrustDomainAuthorized, "")

	// 4. eu gets a trust domain of its own and joins: both meshes have
	// intermediates from one root, each constrained to its trust domain.
	setTrustDomain("eu", "istio-system-prod", "prod-eu.local", "eu.local")
	applyVM("[{clusterName: prod-eu, namespace: istio-system, name: istiod}, {clusterName: eu, namespace: istio-system-prod, name: istiod}]")
	var prodCA, euCA *corev1.Secret
	Eventually(t, 60*time.Second, "both intermediates", func() (bool, string) {
		var err1, err2 error
		prodCA, err1 = cacerts("prod-eu", "istio-system")
		euCA, err2 = cacerts("eu", "istio-system-prod")
		if err1 != nil || err2 != nil {
			return false, fmt.Sprint(err1, err2)
		}
		c, err := pemutil.ParseCertificate(euCA.Data[trust.KeyCACert])
		return err == nil && slicesEqual(c.PermittedURIDomains, []string{"eu.local"}), fmt.Sprint(err)
	})
	prodInter, err := pemutil.ParseCertificate(prodCA.Data[trust.KeyCACert])
	require.NoError(t, err)
	assert.Equal(t, []string{"prod-eu.local"}, prodInter.PermittedURIDomains)
	require.Equal(t, prodCA.Data[trust.KeyRootCert], euCA.Data[trust.KeyRootCert], "one shared root")
	roots, err := pemutil.ParseCertificateBundle(prodCA.Data[trust.KeyRootCert])
	require.NoError(t, err)

	// 5. Real istiods: prod-eu's mints its own identities; eu's, configured
	// by the attacker with prod-eu's trust domain, mints a certificate for
	// prod-eu's reviews account that no verifier accepts.
	mint := func(cluster, ns, td string, ca *corev1.Secret) ([]*x509.Certificate, error) {
		d, err := istiod.Start(ctx, istiod.Config{Kubeconfig: env.Cluster(cluster).Kubeconfig, ClusterID: cluster, Dir: t.TempDir(),
			Namespace: ns, CACerts: ca.Data, TrustDomain: td})
		require.NoError(t, err, cluster)
		t.Cleanup(func() { _ = d.Stop() })
		token, err := istiod.ServiceAccountToken(ctx, clients[cluster], "bookinfo", "bookinfo-reviews", istiod.TokenAudience)
		require.NoError(t, err)
		_, csr, err := istiod.WorkloadCSR("spiffe://" + td + "/ns/bookinfo/sa/bookinfo-reviews")
		require.NoError(t, err)
		return d.WorkloadCertificate(ctx, token, csr)
	}
	good, err := mint("prod-eu", "istio-system", "prod-eu.local", prodCA)
	require.NoError(t, err)
	_, err = verifyWorkload(good, roots)
	require.NoError(t, err, "prod-eu's own identity verifies")
	require.NoError(t, opensslVerify(t, good, roots), "and OpenSSL agrees")

	forged, err := mint("eu", "istio-system-prod", "prod-eu.local", euCA)
	if err != nil {
		t.Logf("eu's istiod refused to mint prod-eu's identity: %v", err)
	} else {
		require.Equal(t, "spiffe://prod-eu.local/ns/bookinfo/sa/bookinfo-reviews", forged[0].URIs[0].String(), "the attacker's istiod signed a foreign identity")
		_, err = verifyWorkload(forged, roots)
		var invalid x509.CertificateInvalidError
		require.ErrorAs(t, err, &invalid, "Go's verifier refuses prod-eu's identity from eu's intermediate")
		assert.Equal(t, x509.CANotAuthorizedForThisName, invalid.Reason)
		oerr := opensslVerify(t, forged, roots)
		require.Error(t, oerr, "OpenSSL refuses it too")
		t.Logf("a prod-eu identity minted by eu's istiod: Go: %v; OpenSSL: %v", err, oerr)
	}
	// eu's own identities still work across clusters.
	own, err := mint("eu", "istio-system-prod", "eu.local", euCA)
	require.NoError(t, err)
	_, err = verifyWorkload(own, roots)
	require.NoError(t, err, "eu's own identity verifies against the shared root")

	// 6. Issue 27: eu, a member with an intermediate for eu.local, starts
	// reporting prod-eu.local; nobody edits the VirtualMesh. It turns
	// Invalid naming the grant, eu's intermediate is neither renewed nor
	// reissued (the server refuses to sign), and eu's status says why.
	euSerial := func() string {
		s, err := cacerts("eu", "istio-system-prod")
		require.NoError(t, err)
		c, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
		require.NoError(t, err)
		return c.SerialNumber.String()
	}
	before := euSerial()
	setTrustDomain("eu", "istio-system-prod", "eu.local", "prod-eu.local")
	vmState("shared", "Invalid", `cluster eu is not granted trust domain "prod-eu.local" (its grant: eu.local)`)
	kcSays("eu", "prod-eu.local", multiclusterv1alpha1.TrustDomainNotGranted, "they get no intermediate")
	refusedNow("prod-eu.local")
	refusedNow("eu.local")
	time.Sleep(2 * time.Second) // a reissue would have happened by now
	assert.Equal(t, before, euSerial(), "eu's intermediate was not reissued")
	euCA, err = cacerts("eu", "istio-system-prod")
	require.NoError(t, err)
	assert.Equal(t, []string{"eu.local"}, constrainedTo(euCA), "and it still signs eu.local only")

	// A new trust domain of eu's own is refused until an administrator
	// grants it; then eu gets an intermediate for it.
	setTrustDomain("eu", "istio-system-prod", "prod-eu.local", "eu-west.local")
	vmState("shared", "Invalid", `cluster eu is not granted trust domain "eu-west.local" (its grant: eu.local)`)
	refusedNow("eu-west.local")
	grant("eu", `[{"name":"eu.local"},{"name":"eu-west.local"}]`)
	vmState("shared", "Accepted", "")
	Eventually(t, 60*time.Second, "eu's intermediate for eu-west.local", func() (bool, string) {
		s, err := cacerts("eu", "istio-system-prod")
		if err != nil {
			return false, err.Error()
		}
		got := constrainedTo(s)
		return slicesEqual(got, []string{"eu-west.local"}), fmt.Sprint(got)
	})

	// The refusals are on the record.
	log, err := os.ReadFile(dir + "/audit.log")
	require.NoError(t, err)
	assert.Contains(t, string(log), `"cert.deny"`)
	out, err := exec.Command(bin, "audit", "verify", dir+"/audit.log").CombinedOutput()
	require.NoError(t, err, string(out))
}

var schemaVirtualMeshes = networkingv1alpha1.VirtualMeshes

func slicesEqual(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00")
}

// agentConn dials the relay with the certificate cluster's agent holds in
// its relay-client-tls-secret, as an attacker in that cluster could.
func agentConn(t *testing.T, ctx context.Context, cs kubernetes.Interface, addr string) *grpc.ClientConn {
	t.Helper()
	var sec *corev1.Secret
	Eventually(t, 30*time.Second, "the agent's stored credential", func() (bool, string) {
		var err error
		sec, err = cs.CoreV1().Secrets("relaymesh").Get(ctx, identity.ClientSecret, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	cert, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(sec.Data["ca.crt"]))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13,
		RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{cert}})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// meshCSR is what an agent sends for a mesh of trust domain td.
func meshCSR(t *testing.T, td string) []byte {
	t.Helper()
	k, err := keyutil.GenerateDefaultSigner()
	require.NoError(t, err)
	ext, err := ca.NameConstraintsRequest(td)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{}, ExtraExtensions: []pkix.Extension{ext}}, k)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// opensslVerify runs `openssl verify` on chain[0] with the rest of chain as
// untrusted intermediates and roots as trust anchors.
func opensslVerify(t *testing.T, chain, roots []*x509.Certificate) error {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, certs ...*x509.Certificate) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, ca.CertsPEM(certs...), 0o600))
		return p
	}
	args := []string{"verify", "-purpose", "any", "-CAfile", write("roots.pem", roots...)}
	if len(chain) > 1 {
		args = append(args, "-untrusted", write("chain.pem", chain[1:]...))
	}
	args = append(args, write("leaf.pem", chain[0]))
	out, err := exec.Command("openssl", args...).CombinedOutput()
	if err != nil {
		return errors.New(strings.TrimSpace(string(out)))
	}
	return nil
}
