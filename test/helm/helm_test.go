package helm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// The charts and their releases as the tests (and docs/install.md) install
// them.
const (
	serverChart   = "relaymesh-server"
	agentChart    = "relaymesh-agent"
	namespace     = "relaymesh"
	serverAccount = "relaymesh-server" // the release's full name
	agentAccount  = "relaymesh-agent"
)

// repoRoot is the checkout the tests run in.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := localcluster.RepoRoot()
	require.NoError(t, err)
	return root
}

// chartDir is charts/NAME of the checkout.
func chartDir(t testing.TB, name string) string {
	return filepath.Join(repoRoot(t), "charts", name)
}

// helm runs the helm binary `make tools` built, with its own cache and
// configuration directories (never the user's).
type helm struct {
	bin, home string
}

func newHelm(t testing.TB) helm {
	t.Helper()
	localcluster.SkipIfShort(t)
	bin := filepath.Join(repoRoot(t), ".cache", "bin", "helm")
	_, err := os.Stat(bin)
	require.NoError(t, err, "helm is built by `make tools`")
	return helm{bin: bin, home: t.TempDir()}
}

// run runs helm with args and returns its stdout, or an error with stderr.
func (h helm) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+h.home+"/cache", "HELM_CONFIG_HOME="+h.home+"/config", "HELM_DATA_HOME="+h.home+"/data")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args[:min(2, len(args))], " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// template renders chart (a directory or package) as release in ns.
func (h helm) template(chart, release, ns string, args ...string) ([]*unstructured.Unstructured, error) {
	out, err := h.run(append([]string{"template", release, chart, "--namespace", ns}, args...)...)
	if err != nil {
		return nil, err
	}
	return localcluster.DecodeObjects([]byte(out))
}

// manifest returns the objects of an installed release.
func (h helm) manifest(kubeconfig, release, ns string) ([]*unstructured.Unstructured, error) {
	out, err := h.run("get", "manifest", release, "--namespace", ns, "--kubeconfig", kubeconfig)
	if err != nil {
		return nil, err
	}
	return localcluster.DecodeObjects([]byte(out))
}

// find returns the one object of kind in objs (and fails without it).
func find(t testing.TB, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	require.Len(t, found, 1, "one %s", kind)
	return found[0]
}

// convert turns an unstructured object into a typed one.
func convert[T any](t testing.TB, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out))
	return out
}

// containerArgs returns the args of the only container of a Deployment.
func containerArgs(t testing.TB, objs []*unstructured.Unstructured) []string {
	t.Helper()
	d := convert[appsv1.Deployment](t, find(t, objs, "Deployment"))
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	return append([]string(nil), d.Spec.Template.Spec.Containers[0].Args...)
}

// replaceArgs replaces flags of a chart's args for a process run outside a
// cluster: each key (a flag name with its "=") must match exactly one arg,
// which becomes the value ("" drops it). Unmatched keys fail the test, so a
// chart that stops passing a flag is noticed.
func replaceArgs(t testing.TB, args []string, with map[string]string) []string {
	t.Helper()
	out := make([]string, 0, len(args))
	hit := map[string]int{}
	for _, a := range args {
		replaced := false
		for k, v := range with {
			if strings.HasPrefix(a, k) {
				hit[k]++
				replaced = true
				if v != "" {
					out = append(out, v)
				}
			}
		}
		if !replaced {
			out = append(out, a)
		}
	}
	for k := range with {
		require.Equal(t, 1, hit[k], "chart args %v: flag %s", args, k)
	}
	return out
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates to c as
// ServiceAccount ns/name with a TokenRequest token, as a kubelet would
// mount it into the charts' pods.
func serviceAccountKubeconfig(t testing.TB, c *localcluster.Cluster, ns, name, path string) {
	t.Helper()
	cs, err := c.Clientset()
	require.NoError(t, err)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	require.NoError(t, err, "TokenRequest for %s/%s", ns, name)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.RESTConfig().CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: name}
	cfg.CurrentContext = c.Name
	// Written aside and renamed: a process started earlier may read path
	// (a restart rewrites it), and never sees it half written.
	tmp := path + ".new"
	require.NoError(t, clientcmd.WriteToFile(*cfg, tmp))
	require.NoError(t, os.Rename(tmp, path))
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

// relaymesh builds cmd/relaymesh once per test binary.
func relaymesh(t testing.TB) string {
	t.Helper()
	localcluster.SkipIfShort(t)
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "relaymesh-helm-test-")
		if buildErr == nil {
			builtBin, buildErr = localcluster.BuildRelaymesh(buildDir)
		}
	})
	require.NoError(t, buildErr)
	return builtBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// namespaceObject is a namespace with labels.
func namespaceObject(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}
