package translationtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
)

// GatewayAPIGroup is the API group of the Gateway API kinds.
const GatewayAPIGroup = "gateway.networking.k8s.io"

// GatewayAPICRDs returns the paths of Gateway API's standard-channel CRDs,
// from the sigs.k8s.io/gateway-api module the pinned Istio builds with
// (tools/istio): the same version the istiod proofs run against.
func GatewayAPICRDs(ctx context.Context, t testing.TB) []string {
	t.Helper()
	root, err := localcluster.RepoRoot()
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api")
	cmd.Dir = filepath.Join(root, "tools", "istio")
	mod, err := cmd.Output()
	require.NoError(t, err, "locate sigs.k8s.io/gateway-api from tools/istio")
	dir := filepath.Join(strings.TrimSpace(string(mod)), "config", "crd", "standard")
	files, err := filepath.Glob(filepath.Join(dir, GatewayAPIGroup+"_*.yaml"))
	require.NoError(t, err)
	var out []string
	for _, f := range files {
		if !strings.Contains(f, "_vap_") { // a ValidatingAdmissionPolicy, not a CRD
			out = append(out, f)
		}
	}
	require.NotEmpty(t, out, "gateway-api CRDs in %s", dir)
	return out
}

// InstallGatewayAPI installs Gateway API's standard CRDs (GatewayAPICRDs)
// into c and waits until every one is established.
func InstallGatewayAPI(ctx context.Context, t testing.TB, c *localcluster.Cluster) {
	t.Helper()
	ext, err := apiextensionsclient.NewForConfig(c.RESTConfig())
	require.NoError(t, err)
	var v1Kinds []string // served at v1: what discovery must list
	for _, f := range GatewayAPICRDs(ctx, t) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		objs, err := c.Apply(ctx, "relaymesh-test", b)
		require.NoError(t, err, f)
		for _, o := range objs {
			kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
			versions, _, _ := unstructured.NestedSlice(o.Object, "spec", "versions")
			for _, v := range versions {
				if m, ok := v.(map[string]any); ok && m["name"] == "v1" && m["served"] == true {
					v1Kinds = append(v1Kinds, kind)
				}
			}
			require.Eventually(t, func() bool {
				crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, o.GetName(), metav1.GetOptions{})
				if err != nil {
					return false
				}
				for _, cond := range crd.Status.Conditions {
					if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
						return true
					}
				}
				return false
			}, 30*time.Second, 100*time.Millisecond, "CRD %s established", o.GetName())
		}
	}
	// Established is not yet listed: the apiserver's discovery document
	// names a new group a moment later, and clients that map kinds through
	// discovery (localcluster's Apply) fail with "no matches for kind"
	// until it does (seen in a clean-clone run).
	dc, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig())
	require.NoError(t, err)
	require.NotEmpty(t, v1Kinds, "the Gateway API CRDs serve v1")
	require.Eventually(t, func() bool {
		l, err := dc.ServerResourcesForGroupVersion(GatewayAPIGroup + "/v1")
		if err != nil {
			return false
		}
		listed := map[string]bool{}
		for _, r := range l.APIResources {
			listed[r.Kind] = true
		}
		for _, k := range v1Kinds {
			if !listed[k] {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "Gateway API v1 kinds %v listed by discovery", v1Kinds)
}

// gatewayAPIInstalled records the API servers a dry run installed the
// Gateway API CRDs into, the first time it needed them.
var gatewayAPIInstalled struct {
	sync.Mutex
	in map[*localcluster.Cluster]bool
}

func ensureGatewayAPI(t testing.TB, c *localcluster.Cluster) {
	t.Helper()
	gatewayAPIInstalled.Lock()
	defer gatewayAPIInstalled.Unlock()
	if gatewayAPIInstalled.in[c] {
		return
	}
	InstallGatewayAPI(context.Background(), t, c)
	if gatewayAPIInstalled.in == nil {
		gatewayAPIInstalled.in = map[*localcluster.Cluster]bool{}
	}
	gatewayAPIInstalled.in[c] = true
}
