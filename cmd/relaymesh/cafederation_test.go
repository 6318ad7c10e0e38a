package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// publishedState is what the Lease holder stores for two trust domains of
// one VirtualMesh in the middle of a root rotation (both roots) and one of
// another VirtualMesh.
func publishedState(t *testing.T) ([]byte, *ca.MeshRoot, *ca.MeshRoot) {
	t.Helper()
	oldRoot, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "bookinfo", TTL: 24 * time.Hour})
	require.NoError(t, err)
	newRoot, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "bookinfo", TTL: 48 * time.Hour})
	require.NoError(t, err)
	other, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "payments", TTL: 24 * time.Hour})
	require.NoError(t, err)
	st, _ := spiffefed.Next(spiffefed.State{}, []spiffefed.Member{
		{VirtualMesh: "relaymesh/bookinfo", TrustDomain: "cluster-1.local", Roots: []*x509.Certificate{oldRoot.Cert, newRoot.Cert}},
		{VirtualMesh: "relaymesh/bookinfo", TrustDomain: "cluster-2.local", Roots: []*x509.Certificate{oldRoot.Cert, newRoot.Cert}},
		{VirtualMesh: "relaymesh/payments", TrustDomain: "payments.example", Roots: []*x509.Certificate{other.Cert}},
	}, time.Now())
	data, err := spiffefed.Encode(st)
	require.NoError(t, err)
	return data, oldRoot, newRoot
}

func TestFederationStatusOf(t *testing.T) {
	s, err := federationStatusOf("relaymesh", nil)
	require.NoError(t, err)
	assert.Empty(t, s.Published)
	var out bytes.Buffer
	require.NoError(t, writeFederationStatus(&out, s))
	assert.Contains(t, out.String(), "no trust bundle is published (relaymesh/relaymesh-spiffe-bundles holds none)")

	data, oldRoot, newRoot := publishedState(t)
	s, err = federationStatusOf("relaymesh", data)
	require.NoError(t, err)
	require.Len(t, s.Published, 3)
	var tds []string
	for _, b := range s.Published {
		tds = append(tds, b.TrustDomain)
		assert.Equal(t, spiffefed.PathPrefix+b.TrustDomain, b.Path)
		assert.Positive(t, b.Sequence)
		require.NotNil(t, b.Published, "%s: its publish time", b.TrustDomain)
		assert.WithinDuration(t, time.Now(), *b.Published, time.Minute)
	}
	assert.Equal(t, []string{"cluster-1.local", "cluster-2.local", "payments.example"}, tds, "sorted by trust domain")
	assert.Equal(t, "relaymesh/bookinfo", s.Published[0].VirtualMesh)
	var fps []string
	for _, r := range s.Published[0].Roots {
		fps = append(fps, r.Fingerprint)
	}
	assert.ElementsMatch(t, []string{ca.RootFingerprint(oldRoot.Cert), ca.RootFingerprint(newRoot.Cert)}, fps, "both roots during the rotation")
	out.Reset()
	require.NoError(t, writeFederationStatus(&out, s))
	assert.Contains(t, out.String(), "TRUST DOMAIN")
	assert.Contains(t, out.String(), ca.RootFingerprint(newRoot.Cert)[:16])
	assert.Contains(t, out.String(), "/bundles/payments.example")
	assert.Contains(t, out.String(), "PUBLISHED")
	assert.Contains(t, out.String(), s.Published[0].Published.Format(time.RFC3339))

	// What the server refuses is refused here, naming the ConfigMap; no
	// half of it is shown.
	for name, bad := range map[string][]byte{
		"garbage":   []byte("{not json"),
		"oversized": bytes.Repeat([]byte("a"), 4<<20),
		"hostile":   []byte(`{"version":1,"counter":1,"bundles":{"../etc":{"virtualMesh":"x","sequence":1,"roots":"x"}}}`),
		"version":   []byte(`{"version":99,"counter":1,"bundles":{}}`),
	} {
		s, err := federationStatusOf("relaymesh", bad)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "ConfigMap relaymesh/relaymesh-spiffe-bundles", name)
		assert.Empty(t, s.Published, name)
	}
}

// TestCAFederationStatusAgainstAPIServer reads the ConfigMap from a real
// apiserver: none, a published state (table and JSON), and a tampered one
// (exit 1, no output).
func TestCAFederationStatusAgainstAPIServer(t *testing.T) {
	ctx := context.Background()
	mgmt, kube, _ := localcluster.Management(t, "relaymesh")
	cli := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := run(ctx, append(append([]string{"ca", "federation", "status"}, args...), "--kubeconfig", mgmt.Kubeconfig), &out, &errOut)
		return out.String(), errOut.String(), code
	}
	out, errOut, code := cli()
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "no trust bundle is published")
	assert.Contains(t, out, "no foreign trust domain is imported")

	data, _, newRoot := publishedState(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: app.BundleConfigMap, Namespace: "relaymesh"}, Data: map[string]string{app.BundleStateKey: string(data)}}
	_, err := kube.CoreV1().ConfigMaps("relaymesh").Create(ctx, cm, metav1.CreateOptions{})
	require.NoError(t, err)
	out, errOut, code = cli()
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "cluster-2.local")
	assert.Contains(t, out, ca.RootFingerprint(newRoot.Cert)[:16])
	out, errOut, code = cli("-o", "json")
	require.Equal(t, 0, code, errOut)
	var st federationStatus
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	assert.Len(t, st.Published, 3)

	// Imported peers: one FederatedTrustDomain, Stale with a hostile error.
	assert.Empty(t, st.Imported)
	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	ftds := dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace("relaymesh")
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": "FederatedTrustDomain",
		"metadata": map[string]any{"name": "spire", "namespace": "relaymesh"},
		"spec":     map[string]any{"trustDomain": "spire.example", "bundleEndpointURL": "https://spire.example:8443/", "profile": "https_web"}}}
	u, err = ftds.Create(ctx, u, metav1.CreateOptions{})
	require.NoError(t, err)
	rootPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: newRoot.Cert.Raw}))
	require.NoError(t, unstructured.SetNestedMap(u.Object, map[string]any{"state": "Stale", "sequence": int64(7), "bundlePEM": rootPEM,
		"lastFetch": "2026-12-03T12:00:00Z", "error": "refused\n\x1b[31mred\ttab"}, "status"))
	_, err = ftds.UpdateStatus(ctx, u, metav1.UpdateOptions{})
	require.NoError(t, err)
	out, errOut, code = cli()
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `spire\.example +spire +https_web +Stale +7 +2026-12-03T12:00:00Z +never +`+ca.RootFingerprint(newRoot.Cert)[:16], out)
	assert.NotContains(t, out, "\x1b", "a hostile error cannot drive the terminal")
	assert.Contains(t, out, "refused  [31mred tab")
	out, errOut, code = cli("-o", "json")
	require.Equal(t, 0, code, errOut)
	st = federationStatus{}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Len(t, st.Imported, 1)
	assert.Equal(t, "Stale", st.Imported[0].State)
	require.Len(t, st.Imported[0].Roots, 1)

	// Without the CRD (an upgrade that did not install it), what is
	// published is still shown.
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	require.NoError(t, dyn.Resource(crds).Delete(ctx, "federatedtrustdomains.networking.relaymesh.io", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		out, _, code = cli()
		return code == 0 && strings.Contains(out, "foreign trust domains not shown")
	}, 30*time.Second, 200*time.Millisecond, "%s", out)
	assert.Contains(t, out, "cluster-2.local", "the published bundles are still shown")

	cm.Data[app.BundleStateKey] = strings.Replace(string(data), `"version":1`, `"version":2`, 1)
	_, err = kube.CoreV1().ConfigMaps("relaymesh").Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	out, errOut, code = cli()
	assert.NotEqual(t, 0, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "ConfigMap relaymesh/relaymesh-spiffe-bundles")
}
