package dataplane_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/test/dataplane"
	"github.com/relaymesh/relaymesh/test/spire"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// spireClientID is the identity a real spire-server mints for the client.
const spireClientID = "spiffe://spire.example/ns/default/sa/client"

// checkSPIREWorkload: a workload of a real SPIRE server's trust domain,
// holding an X509-SVID that SPIRE minted (and the root-cert.pem its mesh
// hands out), calls cluster-2's echo over mTLS. With globalAccessPolicy
// Enabled and an AccessPolicy naming its SPIFFE ID, it is denied while the
// VirtualMesh does not trust spire.example (the policy's status says so);
// once the server imports SPIRE's bundle endpoint and the VirtualMesh
// names the trust domain, both meshes' roots carry SPIRE's root
// cross-certified, and every call is answered, the server seeing the
// SPIRE identity; an AccessPolicy naming another SPIRE identity denies it
// again.
func (fed *federation) checkSPIREWorkload(t *testing.T) {
	f, r, ctx := fed.f, fed.r, context.Background()
	peer, err := spire.Start(ctx, spire.Config{TrustDomain: "spire.example", BundleEndpoint: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("spire-server's log:\n%s", peer.LogTail(30))
		}
		assert.NoError(t, peer.Stop())
	})
	chain, key, err := peer.MintPEM(ctx, spireClientID)
	require.NoError(t, err)

	setFederated := func(tds string) {
		_, err := r.dyn.Resource(virtualMeshesGVR).Namespace("relaymesh").Patch(ctx, vmName, types.MergePatchType,
			[]byte(`{"spec":{"mtls":{"federatedTrustDomains":`+tds+`}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
	}
	t.Cleanup(func() { setFederated("null") })
	fed.denyByDefault(t)
	policy := func(id string) string {
		return `
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: echo-from-spire, namespace: relaymesh}
spec:
  sourceSelector:
  - spiffeIDs: [` + id + `]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: echo, namespace: apps, clusterName: cluster-2}]
`
	}
	r.apply(t, policy(spireClientID))

	// The SPIRE workload: a client in cluster-1 (istiod's xDS tells it
	// where cluster-2's echo is) with SPIRE's SVID and key, and the roots
	// of its mesh.
	w, err := f.c.StartWorkload(ctx, dataplane.WorkloadConfig{Name: "spire-client", Namespace: ns, ServiceAccount: "spire-client", Labels: map[string]string{"app": "spire-client"}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, w.Stop(context.Background())) })
	roots := func() []byte {
		m, err := fed.readMesh(ctx, "cluster-1")
		require.NoError(t, err)
		return m.cacerts[trust.KeyRootCert]
	}
	require.NoError(t, w.WriteCertificate(chain, key, roots()))
	time.Sleep(2 * dataplane.DefaultRefresh)
	c, err := w.DialHost(echoOfCluster2, echoPort)
	require.NoError(t, err)
	defer c.Close()
	refused := func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == 0 }
	f.settle(t, c, "nothing gets through while the VirtualMesh does not trust spire.example", dataplane.CallOptions{}, refused)
	fed.waitFor(t, "the policy's status says why the SPIRE identity is not admitted", func() (bool, string) {
		u, err := r.dyn.Resource(policyResources["AccessPolicy"]).Namespace("relaymesh").Get(ctx, "echo-from-spire", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		status := fmt.Sprint(u.Object["status"])
		return strings.Contains(status, "is not in spec.mtls.federatedTrustDomains"), status
	})

	// Import SPIRE's bundle endpoint and trust its trust domain.
	bootstrap, err := peer.BundlePEM(ctx)
	require.NoError(t, err)
	r.apply(t, fmt.Sprintf(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: FederatedTrustDomain
metadata: {name: spire, namespace: relaymesh}
spec: {trustDomain: spire.example, bundleEndpointURL: %q, profile: https_spiffe, endpointSPIFFEID: %q, bootstrapBundle: %q}
`, peer.BundleEndpointURL(), peer.EndpointID(), bootstrap))
	setFederated(`["spire.example"]`)
	start := time.Now()
	fed.waitFor(t, "both meshes' root-cert.pem carry SPIRE's root, cross-certified", func() (bool, string) {
		for _, cl := range []string{"cluster-1", "cluster-2"} {
			m, err := fed.readMesh(ctx, cl)
			if err != nil {
				return false, err.Error()
			}
			if !slices.ContainsFunc(m.roots, func(c *x509.Certificate) bool { return slices.Equal(c.PermittedURIDomains, []string{"spire.example"}) }) {
				return false, fmt.Sprintf("%s: %d certificates in root-cert.pem", cl, len(m.roots))
			}
			fed.meshes[cl] = m
		}
		return true, ""
	})
	t.Logf("SPIRE's root reached both meshes %s after the VirtualMesh named spire.example", time.Since(start).Round(time.Millisecond))
	fed.adopt(t, "SPIRE's root cross-certified")
	require.NoError(t, w.WriteCertificate(chain, key, roots()))

	f.settle(t, c, "the SPIRE workload gets in", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == o.Total() })
	o := run(t, c, batch/4, dataplane.CallOptions{})
	assert.Equal(t, batch/4, o.Code(codes.OK), "a SPIRE workload named by an AccessPolicy reaches cluster-2's echo")
	assert.Equal(t, batch/4, o.Cluster("cluster-2"))
	assert.Equal(t, batch/4, o.Peer(spireClientID), "cluster-2's echo sees the SPIRE identity")

	// Another SPIRE identity in the policy: denied.
	_, err = r.mgmt.Apply(ctx, dataplane.FieldManager, []byte(policy("spiffe://spire.example/ns/default/sa/someone-else")))
	require.NoError(t, err)
	f.settle(t, c, "an AccessPolicy naming another SPIRE identity denies it", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		return o.Code(codes.PermissionDenied) == o.Total()
	})
	o = run(t, c, batch/4, dataplane.CallOptions{})
	assert.Equal(t, batch/4, o.Code(codes.PermissionDenied), "a SPIRE identity no AccessPolicy names is denied")
}
