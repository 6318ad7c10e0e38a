package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca/catest"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	relayserver "github.com/relaymesh/relaymesh/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// TestAgentTrust registers two workload clusters, runs the server and two
// agents as real processes, checks both agents hold mTLS sessions with
// certificates naming their clusters, then deregisters one and checks its
// session ends and its certificate can no longer renew.
func TestAgentTrust(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt", "cluster-1", "cluster-2")
	mgmt := env.Cluster("mgmt")

	relayAddr, opsAddr := Addr(t), Addr(t)
	auditLog := filepath.Join(dir, "audit.log")
	server := Start(t, bin, dir, "server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", auditLog, "--server-dns-names", "localhost", "--server-ips", Host(relayAddr))
	Eventually(t, 30*time.Second, "server ready", func() (bool, string) {
		code, err := GetJSON("http://"+opsAddr+"/healthz", nil)
		return err == nil && code == 200, fmt.Sprint(code, err)
	})

	health := map[string]string{}
	var tokens []string
	for _, name := range []string{"cluster-1", "cluster-2"} {
		out, err := Run(t, bin, "cluster", "register", name, "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", env.Cluster(name).Kubeconfig, "--server-address", relayAddr)
		require.NoError(t, err)
		assert.Contains(t, out, "registered cluster "+name)
		cs, err := env.Cluster(name).Clientset()
		require.NoError(t, err)
		tok, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, "relay-identity-token-secret", metav1.GetOptions{})
		require.NoError(t, err)
		tokens = append(tokens, string(tok.Data["token"]))
		assert.NotContains(t, out, string(tok.Data["token"]), "register never prints the token")
		health[name] = Addr(t)
		Start(t, bin, dir, "agent-"+name, "agent", "--kubeconfig", env.Cluster(name).Kubeconfig, "--health-listen", health[name], "--metrics-listen", Addr(t))
	}

	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	clusters := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh")
	for _, name := range []string{"cluster-1", "cluster-2"} {
		want := "spiffe://relaymesh.local/cluster/" + name + "/agent"
		Eventually(t, 30*time.Second, name+" connected", func() (bool, string) {
			var st struct {
				OK     bool `json:"ok"`
				Status struct {
					Session struct {
						Connected bool   `json:"connected"`
						SPIFFEID  string `json:"spiffeID"`
					} `json:"session"`
				} `json:"status"`
			}
			code, err := GetJSON("http://"+health[name]+"/readyz", &st)
			return err == nil && code == 200 && st.Status.Session.Connected && st.Status.Session.SPIFFEID == want, fmt.Sprintf("%d %v %+v", code, err, st)
		})
		// The management cluster's view of the agent.
		// Up to 10 s of it the status of a fresh agent's first session may
		// wait for its first snapshot (server.StatusConfig.FirstSnapshotWait).
		Eventually(t, 30*time.Second, name+" status", func() (bool, string) {
			kc, err := clusters.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			connected, _, _ := unstructured.NestedBool(kc.Object, "status", "connected")
			id, _, _ := unstructured.NestedString(kc.Object, "status", "agentCertificate", "spiffeID")
			return connected && id == want, fmt.Sprint(kc.Object["status"])
		})
		// The certificate the agent stored in its own cluster.
		cs, err := env.Cluster(name).Clientset()
		require.NoError(t, err)
		sec, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, "relay-client-tls-secret", metav1.GetOptions{})
		require.NoError(t, err)
		block, _ := pem.Decode(sec.Data["tls.crt"])
		require.NotNil(t, block)
		leaf, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		require.Len(t, leaf.URIs, 1)
		assert.Equal(t, want, leaf.URIs[0].String())
		assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, leaf.ExtKeyUsage)
		_, err = cs.CoreV1().Secrets("relaymesh").Get(ctx, "relay-identity-token-secret", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "the used token is removed from the workload cluster")
	}
	connected, err := Metric("http://"+opsAddr+"/metrics", relayserver.MetricConnectedAgents)
	require.NoError(t, err)
	assert.Equal(t, float64(2), connected)

	// Keep cluster-2's credential to try it after deregistration.
	cs2, err := env.Cluster("cluster-2").Clientset()
	require.NoError(t, err)
	sec2, err := cs2.CoreV1().Secrets("relaymesh").Get(ctx, "relay-client-tls-secret", metav1.GetOptions{})
	require.NoError(t, err)

	_, err = Run(t, bin, "cluster", "deregister", "cluster-2", "--mgmt-kubeconfig", mgmt.Kubeconfig)
	require.NoError(t, err)
	start := time.Now()
	Eventually(t, time.Second, "cluster-2's session closed within 1s", func() (bool, string) {
		n, err := Metric("http://"+opsAddr+"/metrics", relayserver.MetricConnectedAgents)
		return err == nil && n == 1, fmt.Sprint(n, err)
	})
	t.Logf("cluster-2's session closed %s after deregistration", time.Since(start).Round(time.Millisecond))
	// The agent sees it too, and says why.
	Eventually(t, 5*time.Second, "agent-2 to report the refusal", func() (bool, string) {
		var st struct {
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		}
		code, err := GetJSON("http://"+health["cluster-2"]+"/readyz", &st)
		return err == nil && code == 503 && !st.OK && strings.Contains(st.Error, "re-register the cluster"), fmt.Sprintf("%d %v %+v", code, err, st)
	})

	// Its certificate is refused for renewal.
	pair, err := tls.X509KeyPair(sec2.Data["tls.crt"], sec2.Data["tls.key"])
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(sec2.Data["ca.crt"]))
	conn, err := grpc.NewClient(relayAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: Host(relayAddr), Certificates: []tls.Certificate{pair},
	})))
	require.NoError(t, err)
	defer conn.Close()
	key := catest.NewKey(t, catest.ECDSAP256)
	_, err = relaypb.NewIdentityClient(conn).Renew(ctx, &relaypb.RenewRequest{Csr: catest.NewCSRPEM(t, key, &x509.CertificateRequest{})})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "renewal of a deregistered cluster: %v", err)

	// cluster-1 is unaffected.
	code, err := GetJSON("http://"+health["cluster-1"]+"/readyz", nil)
	require.NoError(t, err)
	assert.Equal(t, 200, code)

	// The audit log verifies and tells the story.
	out, err := Run(t, bin, "audit", "verify", auditLog)
	require.NoError(t, err)
	assert.Contains(t, out, "records verified")
	b, err := os.ReadFile(auditLog)
	require.NoError(t, err)
	for _, want := range []string{`"type":"token.mint"`, `"type":"token.use"`, `"type":"cert.issue"`, `"type":"cluster.revoke","result":"success","cluster":"cluster-2"`, `"type":"cert.deny"`} {
		assert.Contains(t, string(b), want)
	}
	// No token or key in any log.
	for _, f := range []string{auditLog, server.LogPath(), filepath.Join(dir, "agent-cluster-1.log"), filepath.Join(dir, "agent-cluster-2.log")} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.NotContains(t, string(b), "PRIVATE KEY", f)
		for _, tok := range tokens {
			require.Len(t, tok, 60)
			assert.NotContains(t, string(b), tok[17:], "%s holds a bootstrap token secret", f)
		}
	}
}

// TestProvidedCAAndReregistration runs the server with an enterprise CA
// given as a Secret (root -> issuing intermediate), checks the agent's
// certificate chains to the enterprise root, then deregisters and registers
// the cluster again while the agent runs: the agent drops the refused
// certificate, bootstraps with the new token and reconnects.
func TestProvidedCAAndReregistration(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt", "cluster-1")
	mgmt := env.Cluster("mgmt")
	mgmtCS, err := mgmt.Clientset()
	require.NoError(t, err)
	root := catest.NewRoot(t, catest.CAOptions{Name: "Example Corp Root"})
	issuing := root.NewIntermediate(t, catest.CAOptions{Name: "Example Corp Relay CA", PathLenZero: true})
	_, err = mgmtCS.CoreV1().Secrets("relaymesh").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "enterprise-ca", Namespace: "relaymesh"},
		Data:       map[string][]byte{"tls.crt": catest.CertsPEM(issuing.Cert), "tls.key": issuing.KeyPEM(t), "ca.crt": root.RootsPEM()},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	relayAddr, opsAddr, health := Addr(t), Addr(t), Addr(t)
	Start(t, bin, dir, "server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", filepath.Join(dir, "audit.log"), "--server-dns-names", "localhost", "--server-ips", Host(relayAddr), "--ca-secret", "enterprise-ca")
	Eventually(t, 30*time.Second, "server ready", func() (bool, string) {
		code, err := GetJSON("http://"+opsAddr+"/healthz", nil)
		return err == nil && code == 200, fmt.Sprint(code, err)
	})
	register := func() {
		_, err := Run(t, bin, "cluster", "register", "cluster-1", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", env.Cluster("cluster-1").Kubeconfig, "--server-address", relayAddr)
		require.NoError(t, err)
	}
	register()
	Start(t, bin, dir, "agent", "agent", "--kubeconfig", env.Cluster("cluster-1").Kubeconfig, "--health-listen", health, "--metrics-listen", Addr(t))
	serial := func() (string, bool) {
		var st struct {
			Status struct {
				Credential struct{ Serial string }  `json:"credential"`
				Session    struct{ Connected bool } `json:"session"`
			} `json:"status"`
		}
		code, err := GetJSON("http://"+health+"/readyz", &st)
		return st.Status.Credential.Serial, err == nil && code == 200 && st.Status.Session.Connected
	}
	var first string
	Eventually(t, 30*time.Second, "agent connected", func() (bool, string) { s, ok := serial(); first = s; return ok, s })

	cs, err := env.Cluster("cluster-1").Clientset()
	require.NoError(t, err)
	sec, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, "relay-client-tls-secret", metav1.GetOptions{})
	require.NoError(t, err)
	pair, err := tls.X509KeyPair(sec.Data["tls.crt"], sec.Data["tls.key"])
	require.NoError(t, err)
	inter := x509.NewCertPool()
	inter.AddCert(issuing.Cert)
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	_, err = pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err, "the agent certificate chains to the enterprise root")
	assert.Equal(t, "Example Corp Relay CA", pair.Leaf.Issuer.CommonName)

	_, err = Run(t, bin, "cluster", "deregister", "cluster-1", "--mgmt-kubeconfig", mgmt.Kubeconfig)
	require.NoError(t, err)
	register()
	Eventually(t, 30*time.Second, "agent re-bootstrapped and reconnected", func() (bool, string) {
		s, ok := serial()
		return ok && s != first, s
	})
}
