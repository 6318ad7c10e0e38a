package trust_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
)

// svidFrom is a leaf root's key signs for the SPIFFE ID id.
func svidFrom(t *testing.T, root *testRoot, id string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	u, err := url.Parse(id)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(11), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, URIs: []*url.URL{u}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root.cert, key.Public(), root.key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// twinOf is a self-signed CA with root's subject and another key.
func twinOf(t *testing.T, root *x509.Certificate) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(12), RawSubject: root.RawSubject, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	require.Equal(t, root.RawSubject, c.RawSubject)
	return c
}

// setImported makes FederatedTrustDomain name of td hold state and roots,
// as the importer writes them.
func (w *rotationWorld) setImported(name, td string, state networkingv1alpha1.FederatedTrustDomainState, roots ...*x509.Certificate) {
	w.t.Helper()
	res := w.dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(w.ns)
	u, err := res.Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		_, err = env.Cluster("cluster-1").Apply(w.ctx, "test", []byte(fmt.Sprintf(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: FederatedTrustDomain
metadata: {name: %s, namespace: %s}
spec: {trustDomain: %s, bundleEndpointURL: "https://127.0.0.1:1/", profile: https_web}
`, name, w.ns, td)))
		require.NoError(w.t, err)
		u, err = res.Get(w.ctx, name, metav1.GetOptions{})
		require.NoError(w.t, err)
	}
	st := map[string]any{"state": string(state), "trustDomain": td}
	var pemRoots []string
	for _, r := range roots {
		pemRoots = append(pemRoots, string(ca.CertsPEM(r)))
	}
	if len(roots) > 0 {
		st["bundlePEM"] = strings.Join(pemRoots, "")
		st["sequence"] = int64(len(roots))
	}
	u.Object["status"] = st
	_, err = res.UpdateStatus(w.ctx, u, metav1.UpdateOptions{})
	require.NoError(w.t, err)
}

// federateVM names the foreign trust domains in the VirtualMesh's spec.
func (w *rotationWorld) federateVM(tds ...string) {
	w.t.Helper()
	list := make([]any, 0, len(tds))
	for _, td := range tds {
		list = append(list, td)
	}
	// The controller writes the VirtualMesh's status meanwhile: an update
	// of a stale read conflicts (seen in a clean-clone run), so read again.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Get(w.ctx, "shared", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedSlice(u.Object, list, "spec", "mtls", "federatedTrustDomains"); err != nil {
			return err
		}
		_, err = w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Update(w.ctx, u, metav1.UpdateOptions{})
		return err
	})
	require.NoError(w.t, err)
}

// federation waits until status.sharedTrust.federation satisfies cond.
func (w *rotationWorld) federation(what string, cond func([]networkingv1alpha1.FederatedTrustStatus) bool) []networkingv1alpha1.FederatedTrustStatus {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.sync()
		vm := w.vm()
		var got []networkingv1alpha1.FederatedTrustStatus
		if vm.Status.SharedTrust != nil {
			got = vm.Status.SharedTrust.Federation
		}
		if cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: not within 30s; status.sharedTrust.federation %+v", what, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bundles are the root bundles published to every cluster, by cluster.
func (w *rotationWorld) bundles() map[string]string {
	out := map[string]string{}
	for _, cl := range w.clusters {
		for _, r := range w.outputs.Get(cl).GetTrust() {
			out[cl] = string(r.GetRootBundle())
		}
	}
	return out
}

// A VirtualMesh trusting a foreign trust domain: each of the peer's roots
// reaches every mesh's root-cert.pem as a cross-certificate from the
// VirtualMesh root, under which the peer's SVIDs verify for its own trust
// domain only, never as one of the meshes' identities; the meshes keep
// trusting each other; a replica that does not lead publishes the same
// bytes from the status; the bundle endpoint never publishes them as the
// meshes' roots; and a root the peer's bundle no longer carries, or a
// trust domain the spec no longer names, leaves every mesh.
func TestForeignTrustDomainsReachTheMeshesConstrained(t *testing.T) {
	w := newRotationWorld(t, "{generated: {}}", false)
	w.waitFor("the root is in force", func(*networkingv1alpha1.RotationStatus) bool {
		vm := w.vm()
		return vm.Status.SharedTrust != nil && len(vm.Status.SharedTrust.Meshes) == 2
	})
	before := w.meshCAs()
	spire, spire2 := newRoot(t, "spire root"), newRoot(t, "spire root 2")
	w.setImported("spire", "spire.example", networkingv1alpha1.FederatedCurrent, spire.cert, spire2.cert)
	// Hostile imports: a mesh's own trust domain (its status as if a grant
	// came after the bundle was accepted), and a root with the subject of
	// the VirtualMesh root.
	w.setImported("own", "c1.local", networkingv1alpha1.FederatedCurrent, newRoot(t, "c1 impostor").cert)
	w.setImported("twin", "twin.example", networkingv1alpha1.FederatedCurrent, twinOf(t, before["c1"].Roots[0]))
	w.federateVM("spire.example", "absent.example", "c1.local", "twin.example")

	fed := w.federation("both SPIRE roots cross-certified, the absent trust domain explained", func(es []networkingv1alpha1.FederatedTrustStatus) bool {
		n := 0
		for _, e := range es {
			if e.TrustDomain == "spire.example" && e.CertificatePEM != "" {
				n++
			}
		}
		says := func(td, msg string) bool {
			return slices.ContainsFunc(es, func(e networkingv1alpha1.FederatedTrustStatus) bool {
				return e.TrustDomain == td && e.CertificatePEM == "" && strings.Contains(e.Message, msg)
			})
		}
		return n == 2 && says("absent.example", "no FederatedTrustDomain") && says("c1.local", "this Relaymesh's own trust domain") &&
			says("twin.example", "has the subject or key of the VirtualMesh root")
	})
	for _, e := range fed {
		if e.CertificatePEM != "" {
			assert.Equal(t, trust.Fingerprint(before["c1"].Chain[len(before["c1"].Chain)-1]), e.IssuerFingerprint, "signed by the root in force")
		}
	}
	var cas map[string]*trust.MeshCA
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.sync()
		cas = w.meshCAs()
		if len(cas["c1"].Roots) == 3 && len(cas["c2"].Roots) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	good, mine := svidFrom(t, spire, "spiffe://spire.example/ns/default/sa/client"), svidFrom(t, spire2, "spiffe://spire.example/workload")
	for cl, m := range cas {
		require.Len(t, m.Roots, 3, "%s: root-cert.pem carries the VirtualMesh root and two cross-certificates", cl)
		// As proxyless gRPC uses root-cert.pem: every certificate an anchor.
		anchors := x509.NewCertPool()
		for _, r := range m.Roots {
			anchors.AddCert(r)
		}
		opts := x509.VerifyOptions{Roots: anchors, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
		for _, leaf := range []*x509.Certificate{good, mine} {
			_, err := leaf.Verify(opts)
			assert.NoError(t, err, "%s: a SPIRE SVID verifies", cl)
		}
		for _, id := range []string{"spiffe://c1.local/ns/" + w.meshNS["c1"] + "/sa/default", "spiffe://c2.local/x", "spiffe://evil.spire.example/x"} {
			_, err := svidFrom(t, spire, id).Verify(opts)
			assert.ErrorContains(t, err, "constraint", "%s: the SPIRE key signing %s", cl, id)
		}
	}
	trustEachOther(t, cas)
	for _, m := range cas {
		own, err := spiffefed.ParseMeshRoots(ca.CertsPEM(m.Roots...))
		require.NoError(t, err)
		require.Len(t, own, 1, "the bundle endpoint's view of a mesh's roots: its own root only")
		assert.Equal(t, trust.Fingerprint(before["c1"].Roots[0]), trust.Fingerprint(own[0]))
	}

	// A replica that does not lead publishes exactly the same bytes.
	published := w.bundles()
	follower := &rotationWorld{t: t, ctx: w.ctx, kube: w.kube, dyn: w.dyn, ns: w.ns, clusters: w.clusters, meshNS: w.meshNS, agents: w.agents, verification: w.verification}
	follower.start(func(c *trust.Config) { c.Leading = func() bool { return false } })
	require.Eventually(t, func() bool {
		follower.ctl.Kick()
		b := follower.bundles()
		return b["c1"] == published["c1"] && b["c2"] == published["c2"]
	}, 20*time.Second, 100*time.Millisecond, "a follower publishes the leader's bundle")

	// The peer drops a root: it leaves every mesh; the other stays.
	w.setImported("spire", "spire.example", networkingv1alpha1.FederatedCurrent, spire.cert)
	w.federation("one root left", func(es []networkingv1alpha1.FederatedTrustStatus) bool {
		n := 0
		for _, e := range es {
			if e.CertificatePEM != "" {
				n++
			}
		}
		return n == 1
	})
	require.Eventually(t, func() bool {
		w.sync()
		cas := w.meshCAs()
		return len(cas["c1"].Roots) == 2 && len(cas["c2"].Roots) == 2
	}, 30*time.Second, 100*time.Millisecond)

	// An Invalid import delivers nothing; nor does a spec that names none.
	w.setImported("spire", "spire.example", networkingv1alpha1.FederatedInvalid)
	w.federation("nothing delivered", func(es []networkingv1alpha1.FederatedTrustStatus) bool {
		return !slices.ContainsFunc(es, func(e networkingv1alpha1.FederatedTrustStatus) bool { return e.CertificatePEM != "" })
	})
	w.federateVM()
	w.federation("nothing named", func(es []networkingv1alpha1.FederatedTrustStatus) bool { return len(es) == 0 })
	require.Eventually(t, func() bool {
		w.sync()
		cas := w.meshCAs()
		return len(cas["c1"].Roots) == 1 && len(cas["c2"].Roots) == 1
	}, 30*time.Second, 100*time.Millisecond)
}
