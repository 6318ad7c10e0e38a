package ha_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/ha"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReplicasStartTogether starts three replicas at the same instant on an
// empty namespace: they must come up with one relay CA between them, each
// serving a certificate valid for its own address and for the Service name,
// chained to that CA; a real agent bootstraps through one replica and then
// connects to another with the certificate it got, without a new token.
func TestReplicasStartTogether(t *testing.T) {
	ctx := context.Background()
	env := ha.Setup(t, bin, ha.Config{Replicas: 3, Workloads: []string{"cluster-1"}})
	var lastRoot *x509.Certificate
	for round := range startRounds {
		if round > 0 {
			// Again from an empty namespace: stop every replica and remove
			// the relay CA and the serving secret.
			for _, r := range env.Replicas {
				require.NoError(t, r.Stop())
			}
			for _, name := range []string{"relay-root-tls-secret", "relay-tls-signing-secret", "relay-server-tls-secret"} {
				require.NoError(t, env.Kube.CoreV1().Secrets(env.Namespace).Delete(ctx, name, metav1.DeleteOptions{}))
			}
		}
		env.Start(t)
		root := checkOneCA(t, env)
		checkServingSecret(t, env)
		if lastRoot != nil {
			assert.False(t, root.Equal(lastRoot), "round %d: the replicas generated a new relay CA", round)
		}
		lastRoot = root
	}
	failedStores := 0
	for _, r := range env.Replicas {
		b, err := os.ReadFile(r.LogPath)
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "could not store serving certificate secret") {
				failedStores++
				t.Logf("%s: %s", r.Name, line)
			}
		}
		assert.NotContains(t, string(b), "half present", r.Name)
	}
	assert.Zero(t, failedStores, "relay-server-tls-secret has one writer (the Lease holder): no write fails on a race")

	// A real agent bootstraps through replica 0 ...
	r0, r1 := env.Replicas[0], env.Replicas[1]
	_, err := env.Run(t, "cluster", "register", "cluster-1", "--mgmt-kubeconfig", env.Mgmt.Kubeconfig, "--namespace", env.Namespace,
		"--remote-kubeconfig", env.Local.Cluster("cluster-1").Kubeconfig, "--server-address", r0.RelayAddr)
	require.NoError(t, err)
	agent := env.StartAgent(t, "agent-1", "cluster-1")
	first := waitConnected(t, agent, "cluster-1")
	waitGauge(t, r0, 1)
	require.NoError(t, agent.Proc.Stop(10*time.Second))
	workload, err := env.Local.Cluster("cluster-1").Clientset()
	require.NoError(t, err)
	_, err = workload.CoreV1().Secrets("relaymesh").Get(ctx, "relay-identity-token-secret", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the used token is gone from the workload cluster: %v", err)
	waitGauge(t, r0, 0)

	// ... and connects to replica 1, through the Service name, with the
	// certificate it stored.
	agent = env.StartAgent(t, "agent-1-again", "cluster-1", "--server-address", r1.RelayAddr, "--server-name", env.ServiceName())
	second := waitConnected(t, agent, "cluster-1")
	assert.Equal(t, first, second, "the agent kept its certificate")
	waitGauge(t, r1, 1)
	n, err := r0.Metric(ha.MetricConnectedAgents)
	require.NoError(t, err)
	assert.Zero(t, n, "replica 0 holds no session")

	issued := 0
	for _, rec := range env.AuditRecords(t) {
		if rec.Cluster == "cluster-1" && rec.Type == "cert.issue" {
			issued++
			assert.Equal(t, 0, rec.Replica, "only the replica that took the token issued")
			assert.Equal(t, first, rec.Serial)
		}
	}
	assert.Equal(t, 1, issued, "one certificate was issued for cluster-1, by bootstrap")
	env.VerifyAudit(t)
	for _, r := range env.Replicas {
		assert.True(t, r.Running(), "%s is still running", r.Name)
	}
}

// checkServingSecret checks relay-server-tls-secret holds the Lease
// holder's serving certificate (its address), written by it alone.
func checkServingSecret(t *testing.T, env *ha.Env) {
	t.Helper()
	ctx := context.Background()
	var holder *ha.Replica
	e2e.Eventually(t, 30*time.Second, "the Lease holder's certificate in relay-server-tls-secret", func() (bool, string) {
		name, err := env.LeaseHolder(ctx)
		if err != nil {
			return false, err.Error()
		}
		holder = env.ReplicaNamed(name)
		sec, err := env.Kube.CoreV1().Secrets(env.Namespace).Get(ctx, "relay-server-tls-secret", metav1.GetOptions{})
		if err != nil || holder == nil {
			return false, fmt.Sprint(name, err)
		}
		certs := parseCerts(t, sec.Data["tls.crt"])
		return len(certs) > 0 && hasIP(certs[0], holder.IP.AsSlice()), fmt.Sprint("holder ", name, ", certificate for ", certs[0].IPAddresses)
	})
	t.Logf("relay-server-tls-secret holds the Lease holder %s's certificate", holder.Name)
}

// startRounds is how often the replicas start together on an empty
// namespace (each a new race to create the relay CA).
const startRounds = 4

// checkOneCA checks the replicas share one relay CA, each serving a
// certificate for its own address and the Service name, and returns the
// root.
func checkOneCA(t *testing.T, env *ha.Env) *x509.Certificate {
	t.Helper()
	ctx := context.Background()
	// One relay CA: one root secret with one root, one signing secret.
	roots := env.Roots(t)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(roots))
	rootCerts := parseCerts(t, roots)
	require.Len(t, rootCerts, 1, "relay-root-tls-secret holds one root")
	for _, name := range []string{"relay-root-tls-secret", "relay-tls-signing-secret"} {
		sec, err := env.Kube.CoreV1().Secrets(env.Namespace).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "relaymesh", sec.Labels["app.kubernetes.io/managed-by"], name)
	}

	// Every replica serves a chain to that root, through the same issuing
	// CA, valid for its own address and for the Service name.
	var issuer *x509.Certificate
	served := map[string]int{}
	for _, r := range env.Replicas {
		for _, name := range []string{r.IP.String(), env.ServiceName()} {
			chain := handshake(t, r.RelayAddr, name, pool)
			leaf := chain[0]
			require.GreaterOrEqual(t, len(chain), 2, "%s serves its issuing CA", r.Name)
			if issuer == nil {
				issuer = chain[1]
			}
			assert.True(t, issuer.Equal(chain[1]), "%s's certificate has another issuer: the replicas disagree on the relay CA", r.Name)
			assert.True(t, rootCerts[0].Equal(chain[len(chain)-1]) || bytes.Equal(chain[len(chain)-1].RawIssuer, rootCerts[0].RawSubject))
			assert.Contains(t, leaf.DNSNames, env.ServiceName(), r.Name)
			assert.True(t, hasIP(leaf, r.IP.AsSlice()), "%s's certificate names %v, not its address %s", r.Name, leaf.IPAddresses, r.IP)
			served[fmt.Sprintf("%x", leaf.SerialNumber)] = r.Index
		}
	}
	assert.Len(t, served, len(env.Replicas), "each replica serves a certificate (and key) of its own")
	// relay-server-tls-secret is written by every replica (last writer
	// wins); say whose it holds and how many replicas failed to write it.
	if sec, err := env.Kube.CoreV1().Secrets(env.Namespace).Get(ctx, "relay-server-tls-secret", metav1.GetOptions{}); err == nil {
		if leaf, err := ha.Leaf(sec.Data["tls.crt"]); err == nil {
			owner, ok := served[fmt.Sprintf("%x", leaf.SerialNumber)]
			t.Logf("relay-server-tls-secret holds the certificate of replica %d (known: %v), valid for %v; the other replicas serve other keys", owner, ok, leaf.IPAddresses)
		}
	} else {
		t.Logf("relay-server-tls-secret: %v", err)
	}
	return rootCerts[0]
}

// handshake opens a TLS connection to addr as an agent would (TLS 1.3,
// roots pinned, serverName verified) and returns the chain it was served.
func handshake(t *testing.T, addr, serverName string, roots *x509.CertPool) []*x509.Certificate {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: serverName, NextProtos: []string{"h2"}})
	require.NoError(t, err, "TLS to %s as %s", addr, serverName)
	defer c.Close()
	st := c.ConnectionState()
	require.NotEmpty(t, st.VerifiedChains)
	return st.VerifiedChains[0]
}

func hasIP(c *x509.Certificate, ip net.IP) bool {
	for _, a := range c.IPAddresses {
		if a.Equal(ip) {
			return true
		}
	}
	return false
}

func parseCerts(t *testing.T, pemBytes []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for rest := pemBytes; ; {
		c, r, err := nextCert(rest)
		if err != nil || c == nil {
			require.NoError(t, err)
			return out
		}
		out, rest = append(out, c), r
	}
}

// waitConnected waits until agent reports a session as cluster's agent and
// returns the serial of its certificate.
func waitConnected(t *testing.T, agent *ha.Agent, cluster string) string {
	t.Helper()
	want := "spiffe://relaymesh.local/cluster/" + cluster + "/agent"
	var serial string
	e2e.Eventually(t, 60*time.Second, agent.Name+" connected", func() (bool, string) {
		code, st, err := agent.Status()
		serial = st.Status.Credential.Serial
		return err == nil && code == 200 && st.Status.Session.Connected && st.Status.Session.SPIFFEID == want, fmt.Sprintf("%d %v %+v", code, err, st)
	})
	require.NotEmpty(t, serial)
	return serial
}

// waitGauge waits until replica r counts n connected agents.
func waitGauge(t *testing.T, r *ha.Replica, n float64) {
	t.Helper()
	e2e.Eventually(t, 30*time.Second, fmt.Sprintf("%s to count %v agents", r.Name, n), func() (bool, string) {
		v, err := r.Metric(ha.MetricConnectedAgents)
		return err == nil && v == n, fmt.Sprint(v, err)
	})
}

func nextCert(b []byte) (*x509.Certificate, []byte, error) {
	for {
		block, rest := pem.Decode(b)
		if block == nil {
			return nil, nil, nil
		}
		if block.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(block.Bytes)
			return c, rest, err
		}
		b = rest
	}
}
