// Package e2e runs Relaymesh's binaries as real processes against real local
// clusters: `relaymesh server` in the management cluster, `relaymesh agent`
// per workload cluster, and the admin commands in between.
package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// meshName, deploymentName and serviceName are the names of the discovered
// Mesh (an istiod in istio-system), Workload and Destination objects in the
// management cluster.
func meshName(cluster string) string {
	return discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, cluster, "istio-system", "istiod")
}

func deploymentName(cluster, namespace, name string) string {
	return discoveryv1alpha1.Name(discoveryv1alpha1.OriginDeployment, cluster, namespace, name)
}

func serviceName(cluster, namespace, name string) string {
	return discoveryv1alpha1.Name(discoveryv1alpha1.OriginService, cluster, namespace, name)
}

// Addr is a listen address for a process the test starts, that no other
// process takes first: a port on a private loopback address
// (localcluster.ListenAddr). A server whose agents dial it names its IP in
// its certificate: --server-ips Host(addr).
func Addr(t testing.TB) string {
	t.Helper()
	a, err := localcluster.ListenAddr()
	require.NoError(t, err)
	return a
}

// Host is the host of a host:port address.
func Host(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// Start runs the relaymesh binary with args as a long-lived process whose
// output goes to dir/name.log; the test stops it at the end.
func Start(t testing.TB, bin, dir, name string, args ...string) *localcluster.Process {
	t.Helper()
	localcluster.SkipIfShort(t)
	p, err := localcluster.StartProcess(name, bin, args, filepath.Join(dir, name+".log"), false)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = p.Stop(10 * time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(p.LogPath())
			t.Logf("---- %s log ----\n%s", name, tail(string(b), 60))
		}
	})
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Run runs the relaymesh binary to completion and returns its stdout.
func Run(t testing.TB, bin string, args ...string) (string, error) {
	t.Helper()
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("relaymesh %s: %w: %s", strings.Join(args[:min(2, len(args))], " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Eventually polls cond every 50ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
}

// probeClient reads health and metrics the way a kubelet probes an HTTPS
// port: over TLS without verifying the certificate (the request carries no
// secret). A request with a token goes through DebugReader, which
// verifies.
func probeClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a probe, as the kubelet's
}

// GetBody fetches url (http or, probe-like, https); it returns the status
// and (up to 1 MiB of) the body.
func GetBody(url string) (int, string, error) {
	resp, err := probeClient(2 * time.Second).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// GetJSON fetches url and decodes a JSON body into v; it returns the status.
func GetJSON(url string, v any) (int, error) {
	code, body, err := GetBody(url)
	if err != nil {
		return code, err
	}
	b := []byte(body)
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return code, fmt.Errorf("decode %s: %w", b, err)
		}
	}
	return code, nil
}

// MetricWith sums the samples of name whose labels contain match (e.g.
// `outcome="conflict"`).
func MetricWith(url, name, match string) (float64, error) {
	resp, err := probeClient(2 * time.Second).Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if (strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{")) && strings.Contains(line, match) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				return 0, err
			}
			sum += v
		}
	}
	return sum, nil
}

// Metric reads an unlabelled metric (or sums a labelled one) from a
// Prometheus text endpoint.
func Metric(url, name string) (float64, error) { return MetricWith(url, name, "") }

// Setup builds relaymesh, starts local clusters (the first is the
// management cluster, with the namespace relaymesh) and returns the binary,
// the environment and a directory for logs; everything stops with the test.
func Setup(t *testing.T, clusters ...string) (bin string, env *localcluster.Env, dir string) {
	t.Helper()
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	dir = t.TempDir()
	bin, err := localcluster.BuildRelaymesh(dir)
	require.NoError(t, err)
	env, err = localcluster.Start(ctx, localcluster.Config{Dir: filepath.Join(dir, "clusters"), Clusters: clusters})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	cs, err := env.Cluster(clusters[0]).Clientset()
	require.NoError(t, err)
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return bin, env, dir
}

// DebugReader returns a GET of the server's /debug endpoints with the
// bearer token of a service account "debug-reader" in the relaymesh
// namespace of mgmt, bound to a Role that grants get on relaymesh.io/debug
// (what the server checks with SubjectAccessReview). The returned function
// fetches path from opsAddr and returns the status and body: over plain
// HTTP, or, when opsAddr starts with https://, over TLS verified against
// the relay root of mgmt (relay-root-tls-secret ca.crt).
func DebugReader(t testing.TB, mgmt *localcluster.Cluster, opsAddr string) func(path string) (int, []byte, error) {
	t.Helper()
	ctx := context.Background()
	cs, err := mgmt.Clientset()
	require.NoError(t, err)
	_, err = cs.CoreV1().ServiceAccounts("relaymesh").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "debug-reader"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().Roles("relaymesh").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-debug"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"relaymesh.io"}, Resources: []string{"debug"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().RoleBindings("relaymesh").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-debug"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "relaymesh-debug"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "debug-reader", Namespace: "relaymesh"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	tr, err := cs.CoreV1().ServiceAccounts("relaymesh").CreateToken(ctx, "debug-reader", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	require.NoError(t, err)
	token := tr.Status.Token
	c := http.Client{Timeout: 5 * time.Second}
	url := "http://" + opsAddr
	if addr, ok := strings.CutPrefix(opsAddr, "https://"); ok {
		roots, err := ca.RelayRootsPEM(ctx, cs, "relaymesh")
		require.NoError(t, err)
		pool := x509.NewCertPool()
		require.True(t, pool.AppendCertsFromPEM(roots))
		c.Transport = &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}
		url = "https://" + addr
	}
	return func(path string) (int, []byte, error) {
		req, err := http.NewRequest(http.MethodGet, url+path, nil)
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		return resp.StatusCode, b, err
	}
}
