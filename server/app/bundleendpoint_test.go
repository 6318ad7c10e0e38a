package app_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/server/app/apptest"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

func TestBundleEndpointConfigIsValidated(t *testing.T) {
	cfg := app.Default()
	cfg.AuditLog = "audit.log"
	require.NoError(t, cfg.Validate(), "off by default, with a valid refresh hint")
	assert.Empty(t, cfg.SPIFFEBundle.Listen)
	assert.Zero(t, cfg.SPIFFEBundle.FederationWait(), "off: rotations do not wait")
	on := cfg.SPIFFEBundle
	on.Listen = ":8443"
	assert.Equal(t, 45*time.Minute, on.FederationWait(), "3 × 5m hints + Istio's 30m poll")
	for name, tc := range map[string]struct {
		change func(*app.BundleEndpointConfig)
		want   string
	}{
		"a cert without a key":           {func(b *app.BundleEndpointConfig) { b.Listen, b.CertFile = ":8443", "c.pem" }, "go together"},
		"a cert without listen":          {func(b *app.BundleEndpointConfig) { b.CertFile, b.KeyFile = "c.pem", "k.pem" }, "need --spiffe-bundle-listen"},
		"a hint too short":               {func(b *app.BundleEndpointConfig) { b.RefreshHint = time.Second }, "--spiffe-bundle-refresh-hint 1s"},
		"a hint too long":                {func(b *app.BundleEndpointConfig) { b.RefreshHint = 48 * time.Hour }, "--spiffe-bundle-refresh-hint 48h"},
		"served with no hint":            {func(b *app.BundleEndpointConfig) { b.Listen, b.RefreshHint = ":8443", 0 }, "--spiffe-bundle-refresh-hint 0s"},
		"a bad IP":                       {func(b *app.BundleEndpointConfig) { b.Listen, b.IPs = ":8443", []string{"not-an-ip"} }, "--spiffe-bundle-ips"},
		"a negative peer poll":           {func(b *app.BundleEndpointConfig) { b.PeerPoll = -time.Second }, "--spiffe-bundle-peer-poll -1s"},
		"https_spiffe without https_web": {func(b *app.BundleEndpointConfig) { b.SPIFFEListen, b.EndpointID = ":8444", "spiffe://a.local/e" }, "needs --spiffe-bundle-listen"},
		"https_spiffe without an ID":     {func(b *app.BundleEndpointConfig) { b.Listen, b.SPIFFEListen = ":8443", ":8444" }, "needs --spiffe-bundle-endpoint-id"},
		"an ID without https_spiffe":     {func(b *app.BundleEndpointConfig) { b.EndpointID = "spiffe://a.local/e" }, "needs --spiffe-bundle-spiffe-listen"},
		"an ID that is not SPIFFE": {func(b *app.BundleEndpointConfig) {
			b.Listen, b.SPIFFEListen, b.EndpointID = ":8443", ":8444", "https://a.local/e"
		}, "--spiffe-bundle-endpoint-id \"https://a.local/e\""},
		"an ID without a path": {func(b *app.BundleEndpointConfig) {
			b.Listen, b.SPIFFEListen, b.EndpointID = ":8443", ":8444", "spiffe://a.local"
		}, "a SPIFFE ID with a path"},
		"a peer poll too long": {func(b *app.BundleEndpointConfig) { b.PeerPoll = 25 * time.Hour }, "--spiffe-bundle-peer-poll 25h0m0s"},
	} {
		t.Run(name, func(t *testing.T) {
			c := cfg
			tc.change(&c.SPIFFEBundle)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The whole server, on a local apiserver with a VirtualMesh of two meshes
// in two trust domains, serves each trust domain's bundle to go-spiffe's
// federation client (https_web, the relay-CA certificate): the
// VirtualMesh's root, in a bundle per trust domain; a rotation
// (AddingNewRoot; no agent acks it, so it stays there) publishes old + new
// with a higher sequence; nothing else moves the sequence, a restarted
// server serves the same one, and a stored state that was tampered with
// is refused while the bundles served stay.
func TestTheWholeServerServesEachTrustDomainsBundleThroughARotation(t *testing.T) {
	ctx := context.Background()
	const ns = "spiffe"
	mgmt, _, _ := localcluster.Management(t, ns)
	kube := apptest.Clients(t, mgmt)
	applyTwoTrustDomains(t, mgmt, ns)

	cfg := apptest.AppConfig(t, ns, "")
	cfg.LeaderElect = false
	cfg.SPIFFEBundle.Listen = "127.0.0.1:0"
	a := apptest.StartApp(t, kube, cfg)
	require.NotEmpty(t, a.Addrs.SPIFFEBundle)
	roots := relayRoots(t, kube, ns)
	fetch := func(addr, td string) (*spiffebundle.Bundle, error) {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return federation.FetchBundle(fctx, spiffeid.RequireTrustDomainFromString(td), "https://"+addr+"/bundles/"+td, federation.WithWebPKIRoots(roots))
	}
	fingerprints := func(b *spiffebundle.Bundle) []string {
		var out []string
		for _, c := range b.X509Authorities() {
			out = append(out, trust.Fingerprint(c))
		}
		return out
	}
	vm := func() *networkingv1alpha1.VirtualMesh {
		u, err := kube.Dynamic.Resource(networkingv1alpha1.VirtualMeshes).Namespace(ns).Get(ctx, "shared", metav1.GetOptions{})
		require.NoError(t, err)
		var v networkingv1alpha1.VirtualMesh
		require.NoError(t, fromUnstructured(u.Object, &v))
		return &v
	}
	seqs := map[string]uint64{}
	var oldFP string
	require.Eventually(t, func() bool {
		st := vm().Status.SharedTrust
		if st == nil || st.RootFingerprint == "" {
			return false
		}
		oldFP = st.RootFingerprint
		for _, td := range []string{"c1.local", "c2.local"} {
			b, err := fetch(a.Addrs.SPIFFEBundle, td)
			if err != nil || len(b.X509Authorities()) != 1 {
				return false
			}
			seqs[td], _ = b.SequenceNumber()
		}
		return true
	}, 40*time.Second, 250*time.Millisecond, "each trust domain's bundle is served\n%s", a.Logs)
	for _, td := range []string{"c1.local", "c2.local"} {
		b, err := fetch(a.Addrs.SPIFFEBundle, td)
		require.NoError(t, err)
		assert.Equal(t, []string{oldFP}, fingerprints(b), "%s: the VirtualMesh's root", td)
		hint, ok := b.RefreshHint()
		assert.True(t, ok)
		assert.Equal(t, cfg.SPIFFEBundle.RefreshHint, hint)
	}
	// Hostile requests at the real port.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsTo(roots)}}
	for _, c := range []struct {
		method, path string
		code         int
	}{{http.MethodGet, "/bundles/nowhere.local", 404}, {http.MethodPost, "/bundles/c1.local", 405}, {http.MethodGet, "/bundles/" + strings.Repeat("a", 400), 414}} {
		req, err := http.NewRequest(c.method, "https://"+a.Addrs.SPIFFEBundle+c.path, nil)
		require.NoError(t, err)
		res, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		assert.Equal(t, c.code, res.StatusCode, "%s %s", c.method, c.path)
	}

	// A rotation: AddingNewRoot publishes old + new, with a higher sequence.
	rotate(t, kube, ns)
	var newFP string
	require.Eventually(t, func() bool {
		rot := vm().Status.Rotation
		if rot == nil || rot.Phase != networkingv1alpha1.PhaseAddingNewRoot {
			return false
		}
		newFP = rot.NewRootFingerprint
		b, err := fetch(a.Addrs.SPIFFEBundle, "c2.local")
		return err == nil && len(b.X509Authorities()) == 2
	}, 40*time.Second, 250*time.Millisecond, "the new root is published\n%s", a.Logs)
	rotated := map[string]uint64{}
	for _, td := range []string{"c1.local", "c2.local"} {
		b, err := fetch(a.Addrs.SPIFFEBundle, td)
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{oldFP, newFP}, fingerprints(b), "%s: old and new", td)
		rotated[td], _ = b.SequenceNumber()
		assert.Greater(t, rotated[td], seqs[td], "%s: the sequence moved with the roots", td)
	}

	// Nothing else moves it: not time (reconciles, resyncs), not a restart.
	time.Sleep(3 * time.Second)
	for _, td := range []string{"c1.local", "c2.local"} {
		b, err := fetch(a.Addrs.SPIFFEBundle, td)
		require.NoError(t, err)
		s, _ := b.SequenceNumber()
		assert.Equal(t, rotated[td], s, td)
	}
	require.NoError(t, a.Stop())
	b2 := apptest.StartApp(t, kube, cfg)
	require.Eventually(t, func() bool {
		b, err := fetch(b2.Addrs.SPIFFEBundle, "c1.local")
		return err == nil && len(b.X509Authorities()) == 2
	}, 40*time.Second, 250*time.Millisecond, "the restarted server serves the stored bundles\n%s", b2.Logs)
	time.Sleep(2 * time.Second) // its trust controller and writer ran
	for _, td := range []string{"c1.local", "c2.local"} {
		b, err := fetch(b2.Addrs.SPIFFEBundle, td)
		require.NoError(t, err)
		s, _ := b.SequenceNumber()
		assert.Equal(t, rotated[td], s, "%s: the same sequence after a restart", td)
	}

	// A tampered store is refused: the bundles served stay, and the writer
	// stores them anew without moving a sequence backwards.
	cm, err := kube.Typed.CoreV1().ConfigMaps(ns).Get(ctx, app.BundleConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	cm.Data = map[string]string{"state.json": `{"version":1,"counter":1,"bundles":{"c1.local":{"sequence":1,"roots":"x"}}}`}
	_, err = kube.Typed.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return strings.Contains(b2.Logs.String(), "the stored SPIFFE bundles are refused")
	}, 20*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		cm, err := kube.Typed.CoreV1().ConfigMaps(ns).Get(ctx, app.BundleConfigMap, metav1.GetOptions{})
		return err == nil && strings.Contains(cm.Data["state.json"], "c2.local")
	}, 20*time.Second, 100*time.Millisecond, "stored anew")
	for _, td := range []string{"c1.local", "c2.local"} {
		b, err := fetch(b2.Addrs.SPIFFEBundle, td)
		require.NoError(t, err)
		s, _ := b.SequenceNumber()
		assert.GreaterOrEqual(t, s, rotated[td], "%s: never backwards", td)
		assert.ElementsMatch(t, []string{oldFP, newFP}, fingerprints(b), td)
	}
}

func fromUnstructured(obj map[string]any, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(obj, into)
}

func tlsTo(roots *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}

// applyTwoTrustDomains creates, in ns, two registered clusters with one
// discovered mesh each (trust domains c1.local and c2.local) and the
// VirtualMesh shared of both, with a generated root.
func applyTwoTrustDomains(t *testing.T, mgmt *localcluster.Cluster, ns string) {
	t.Helper()
	manifest := ""
	for _, cl := range []string{"c1", "c2"} {
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
    trustDomain: %[1]s.local
---
`, cl, ns)
	}
	manifest += `
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: shared, namespace: ` + ns + `}
spec:
  meshes: [{clusterName: c1, namespace: istio-system, name: istiod}, {clusterName: c2, namespace: istio-system, name: istiod}]
  mtls:
    shared:
      rootCA: {generated: {}}
`
	_, err := mgmt.Apply(context.Background(), "test", []byte(manifest))
	require.NoError(t, err)
}

// rotate starts a rotation of the VirtualMesh shared to a new generated
// root.
func rotate(t *testing.T, kube *kubeclient.Clients, ns string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"2"}}}`, networkingv1alpha1.AnnotationRootGeneration)
	_, err := kube.Dynamic.Resource(networkingv1alpha1.VirtualMeshes).Namespace(ns).Patch(context.Background(), "shared", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	require.NoError(t, err)
}

// Three replicas serve one sequence per trust domain, before and after a
// rotation, and after the Lease holder dies.
func TestEveryReplicaServesOneSequencePerTrustDomain(t *testing.T) {
	const ns = "spiffe-ha"
	mgmt, _, _ := localcluster.Management(t, ns)
	kube := apptest.Clients(t, mgmt)
	applyTwoTrustDomains(t, mgmt, ns)
	apps := map[string]*apptest.App{}
	for i := range 3 {
		name := fmt.Sprintf("replica-%d", i)
		cfg := apptest.AppConfig(t, ns, name)
		cfg.SPIFFEBundle.Listen = "127.0.0.1:0"
		apps[name] = apptest.LaunchApp(t, kube, cfg)
	}
	for _, a := range apps {
		a.WaitServing(t)
	}
	roots := relayRoots(t, kube, ns)
	// served is what every live replica serves: trust domain → "sequence
	// roots"; ok only if all agree and each bundle has want roots.
	served := func(want int) (map[string]uint64, bool) {
		var first map[string]uint64
		for _, a := range apps {
			if a == nil {
				continue
			}
			got := map[string]uint64{}
			for _, td := range []string{"c1.local", "c2.local"} {
				fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				b, err := federation.FetchBundle(fctx, spiffeid.RequireTrustDomainFromString(td), "https://"+a.Addrs.SPIFFEBundle+"/bundles/"+td, federation.WithWebPKIRoots(roots))
				cancel()
				if err != nil || len(b.X509Authorities()) != want {
					return nil, false
				}
				got[td], _ = b.SequenceNumber()
			}
			if first != nil && (first["c1.local"] != got["c1.local"] || first["c2.local"] != got["c2.local"]) {
				return nil, false
			}
			first = got
		}
		return first, true
	}
	var before map[string]uint64
	require.Eventually(t, func() (ok bool) { before, ok = served(1); return ok }, 60*time.Second, 250*time.Millisecond, "every replica serves one root, one sequence")
	holder := waitForOneLeader(t, kube, ns, apps)
	rotate(t, kube, ns)
	var after map[string]uint64
	require.Eventually(t, func() (ok bool) { after, ok = served(2); return ok }, 60*time.Second, 250*time.Millisecond, "every replica serves old + new, one sequence")
	for td, n := range after {
		assert.Greater(t, n, before[td], td)
	}
	require.NoError(t, apps[holder].Stop())
	apps[holder] = nil
	time.Sleep(3 * time.Second)
	require.Eventually(t, func() bool {
		now, ok := served(2)
		return ok && now["c1.local"] == after["c1.local"] && now["c2.local"] == after["c2.local"]
	}, 30*time.Second, 250*time.Millisecond, "the holder gone, the others serve the same sequences")
}
