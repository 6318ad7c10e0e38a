package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/check"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/debugreport"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/opsclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// readArchive returns the files of a tar.gz by path below its top directory.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	info, err := f.Stat()
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the archive is private")
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		_, rest, ok := strings.Cut(h.Name, "/")
		require.True(t, ok, h.Name)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[rest] = b
	}
	return files
}

// allSecretValues are the data of every Secret of every cluster of the
// world, the values that must never be in a debug report.
func (w *world) allSecretValues(t *testing.T) map[string][]byte {
	t.Helper()
	values := map[string][]byte{}
	for name, c := range w.clients {
		list, err := c.CoreV1().Secrets("").List(w.ctx, metav1.ListOptions{})
		require.NoError(t, err)
		for _, s := range list.Items {
			for k, v := range s.Data {
				if s.Type == identity.TokenSecretType && (k == "expires-at" || k == "spent-registration" || k == "spent-at") {
					continue // a token record's public fields
				}
				// Certificates are public, and so is a value that is also
				// one of the Secret's labels (a token record's cluster).
				if len(bytes.TrimSpace(v)) >= 8 && !bytes.HasPrefix(bytes.TrimSpace(v), []byte("-----BEGIN CERTIFICATE-----")) && !slices.Contains(slices.Collect(maps.Values(s.Labels)), string(v)) {
					values[name+":"+s.Namespace+"/"+s.Name+"["+k+"]"] = bytes.TrimSpace(v)
				}
			}
		}
	}
	return values
}

// debugReport is the debug report subtest of TestOperatorCLI.
func (w *world) debugReport(t *testing.T) {
	defer w.in(t)()
	cs := w.clients["mgmt"]
	// A service account that may read /debug and nothing else.
	_, err := cs.CoreV1().ServiceAccounts("relaymesh").Create(w.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-debug"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().Roles("relaymesh").Create(w.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-debug"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"relaymesh.io"}, Resources: []string{"debug"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().RoleBindings("relaymesh").Create(w.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-debug"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "relaymesh-debug"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "relaymesh-debug", Namespace: "relaymesh"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// A bootstrap token minted now is somewhere in the world's Secrets.
	bootstrap := strings.TrimSpace(w.mustRelaymesh("token", "create", "--cluster", "cluster-2", "--context", "mgmt"))

	out := filepath.Join(t.TempDir(), "report.tar.gz")
	stdout := w.mustRelaymesh("debug", "report", "--context", "mgmt", "--server-metrics-address", w.opsAddr, "--token-service-account", "relaymesh-debug",
		"--log-file", "server="+w.server.log, "--log-file", "agent-cluster-1="+w.agents["cluster-1"].log,
		"--agent-metrics-address", "cluster-1="+w.agentAddrs["cluster-1"][0], "--agent-health-address", "cluster-1="+w.agentAddrs["cluster-1"][1],
		"--out", out, "-o", "json")
	var m manifestView
	require.NoError(t, json.Unmarshal([]byte(stdout), &m))
	assert.Equal(t, out, m.Archive)
	files := readArchive(t, out)

	// The listed parts, each with content.
	for _, part := range []string{"manifest.json", "README.txt", "version.json", "check.json", "check.txt", "server/metrics.txt",
		"server/debug/snapshots-input.json", "server/debug/snapshots-output.json", "server/debug/admission.json",
		"logs/server.log", "logs/agent-cluster-1.log",
		"clusters/mgmt/kubernetes-version.json",
		"clusters/mgmt/resources/kubernetesclusters.multicluster.relaymesh.io.yaml",
		"clusters/mgmt/resources/virtualmeshes.networking.relaymesh.io.yaml",
		"clusters/mgmt/resources/meshes.discovery.relaymesh.io.yaml",
		"clusters/mgmt/namespaces/relaymesh/secrets.json", "clusters/mgmt/namespaces/relaymesh/leases.json",
		"clusters/cluster-1/namespaces/relaymesh/secrets.json", "clusters/cluster-1/namespaces/relaymesh/configmaps.yaml",
		"clusters/cluster-1/namespaces/istio-system/secrets.json", "clusters/cluster-2/namespaces/relaymesh/leases.json",
		"clusters/agent-cluster-1-metrics/metrics.txt", "clusters/agent-cluster-1-health/readyz.txt",
	} {
		assert.NotEmpty(t, files[part], "%s missing or empty; manifest: %s", part, files["manifest.json"])
	}
	for _, part := range []string{"server/debug/snapshots-input.json", "server/debug/snapshots-output.json", "server/debug/admission.json", "check.json", "version.json"} {
		assert.True(t, json.Valid(files[part]), "%s is JSON", part)
	}
	assert.Contains(t, string(files["server/debug/snapshots-input.json"]), "cluster-1", "the server's view of the agents' snapshots")
	assert.Contains(t, string(files["server/metrics.txt"]), "relaymesh_relay_connected_agents 2")
	assert.Contains(t, string(files["clusters/agent-cluster-1-metrics/metrics.txt"]), "relaymesh_agent_relay_connected 1")
	assert.Contains(t, string(files["clusters/agent-cluster-1-health/readyz.txt"]), `"connected":true`)
	// Degraded, not unready: this cluster serves no Gateway API, so no waypoint.
	assert.Contains(t, string(files["clusters/agent-cluster-1-health/readyz.txt"]), `"noWaypoints":"the cluster serves no gateway.networking.k8s.io/v1 Gateways"`)
	assert.Contains(t, string(files["clusters/mgmt/resources/kubernetesclusters.multicluster.relaymesh.io.yaml"]), "connected: true")
	assert.Contains(t, string(files["clusters/mgmt/resources/virtualmeshes.networking.relaymesh.io.yaml"]), "sharedTrust:")
	assert.Contains(t, string(files["logs/server.log"]), "relay server listening")
	assert.Contains(t, string(files["clusters/cluster-1/namespaces/istio-system/secrets.json"]), `"ca-key.pem"`, "Secrets are summarised by key")
	assert.Contains(t, string(files["clusters/cluster-1/namespaces/relaymesh/secrets.json"]), "spiffe://relaymesh.local/cluster/cluster-1/agent", "certificates are described")
	var rep check.Report
	require.NoError(t, json.Unmarshal(files["check.json"], &rep))
	assert.NotEmpty(t, rep.Results)
	var v versions
	require.NoError(t, json.Unmarshal(files["version.json"], &v))
	assert.Equal(t, version(), v.Server.Version)
	// Pod logs cannot be read without a kubelet: the manifest says so.
	assert.Contains(t, string(files["manifest.json"]), "clusters/mgmt/namespaces/relaymesh/logs/relaymesh-server-0_server.log")

	// No Secret value, private key, token or bearer credential anywhere.
	secrets := w.allSecretValues(t)
	require.NotEmpty(t, secrets)
	var keys int
	for id, v := range secrets {
		if strings.Contains(id, "ca-key.pem") || strings.Contains(id, "tls.key") {
			keys++
		}
		for name, body := range files {
			assert.False(t, bytes.Contains(body, v), "%s (%d bytes) is in %s", id, len(v), name)
			assert.False(t, bytes.Contains(body, []byte(base64.StdEncoding.EncodeToString(v))), "%s, base64, is in %s", id, name)
		}
	}
	assert.GreaterOrEqual(t, keys, 4, "the private keys of the world were among the values looked for")
	_, secret, _ := strings.Cut(bootstrap, ".")
	require.Len(t, secret, 43)
	for name, body := range files {
		assert.NotContains(t, string(body), secret, "the bootstrap token's secret is in %s", name)
		assert.NotContains(t, string(body), "PRIVATE KEY-----\nM", "a private key is in %s", name)
		assert.NotRegexp(t, `eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.`, string(body), "a JWT is in %s", name)
		assert.NotRegexp(t, `(?i)bearer [A-Za-z0-9._-]{8,}`, string(body), "a bearer token is in %s", name)
	}

	// An existing file is never overwritten.
	_, errOut, code := w.relaymesh("debug", "report", "--context", "mgmt", "--out", out)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "file exists")
	// Without a token /debug is left out, and the report says why.
	out2 := filepath.Join(t.TempDir(), "report.tar.gz")
	w.mustRelaymesh("debug", "report", "--context", "mgmt", "--server-metrics-address", w.opsAddr, "--out", out2)
	files = readArchive(t, out2)
	assert.Empty(t, files["server/debug/admission.json"])
	assert.Contains(t, string(files["manifest.json"]), "401")
	assert.Contains(t, string(files["README.txt"]), "give --token-service-account")

	// A token is never sent over plain HTTP to another machine: refused
	// before it is minted, nothing written (192.0.2.1 is never dialed).
	out3 := filepath.Join(t.TempDir(), "report.tar.gz")
	_, errOut, code = w.relaymesh("debug", "report", "--context", "mgmt", "--server-metrics-address", "192.0.2.1:9091", "--server-metrics-plain-http",
		"--token-service-account", "relaymesh-debug", "--out", out3)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "refusing to send a bearer token over plain HTTP to a non-loopback address")
	assert.Contains(t, errOut, "serve the metrics port over TLS")
	assert.NoFileExists(t, out3)
}

// The refusal comes first: debugToken neither mints nor reads a token for
// a plain-HTTP, non-loopback address (a nil management client would
// panic if it tried), and the error quotes no token; over HTTPS, or to
// loopback, the same address is fine.
func TestDebugTokenRefusesCleartextOffLoopbackBeforeMinting(t *testing.T) {
	for _, addr := range []string{"192.0.2.1:9091", "[2001:db8::1]:9091", "relaymesh-server.relaymesh.svc:9091"} {
		_, err := debugToken(t.Context(), nil, "relaymesh", "relaymesh-debug", &opsclient.Client{Address: addr}, &debugreport.Redactor{})
		require.ErrorIs(t, err, opsclient.ErrCleartextToken, addr)
		assert.Contains(t, err.Error(), addr)
	}
	https := &opsclient.Client{Address: "192.0.2.1:9091", RootCAs: func(context.Context) (*x509.CertPool, error) { return x509.NewCertPool(), nil }}
	require.NoError(t, https.TokenAllowed())
	require.NoError(t, (&opsclient.Client{Address: "127.0.0.1:9091"}).TokenAllowed())
	// The kubeconfig user's token is refused the same way.
	mgmt := &kubeclient.Clients{Config: &rest.Config{BearerToken: "s3cret-kube-token"}}
	_, err := debugToken(t.Context(), mgmt, "relaymesh", "", &opsclient.Client{Address: "192.0.2.1:9091"}, &debugreport.Redactor{})
	require.ErrorIs(t, err, opsclient.ErrCleartextToken)
	assert.NotContains(t, err.Error(), "s3cret-kube-token")
}
