package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/cmd/relaymesh/internal/registration"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// federatingVirtualMesh federates the one mesh of a cluster with a global
// deny, so its agent applies a cacerts Secret and AuthorizationPolicies.
func federatingVirtualMesh(cluster string) string {
	return fmt.Sprintf(`apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: vm-%[1]s, namespace: relaymesh}
spec:
  meshes:
  - {clusterName: %[1]s, namespace: istio-system, name: istiod}
  mtls:
    shared:
      rootCA:
        generated: {ttl: 87600h}
      intermediateOptions: {ttl: 8760h}
  globalAccessPolicy: Enabled
`, cluster)
}

// agentReadyz is the agent's /readyz: its error and its session's relay
// trust reason.
func (w *world) agentReadyz(name string) (errText, relayTrust string, err error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + w.agentAddrs[name][1] + "/readyz")
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", "", err
	}
	var st struct {
		Error  string `json:"error"`
		Status struct {
			Session struct {
				RelayTrust string `json:"relayTrust"`
			} `json:"session"`
		} `json:"status"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return "", "", fmt.Errorf("%w: %s", err, body)
	}
	return st.Error, st.Status.Session.RelayTrust, nil
}

// halt stops p and leaves its exit code in p.done for the world's
// clean-up, which otherwise waits 30 s for a process proc.stop already
// reaped.
func halt(t *testing.T, p *proc) {
	t.Helper()
	p.cancel()
	select {
	case code := <-p.done:
		p.done <- code
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not stop within 60s", p.name)
	}
}

// restartAgentReady stops name's agent, starts it again (the restart
// re-bootstrap prints) and waits until it is connected and ready with no
// relay trust reason.
func (w *world) restartAgentReady(name string) {
	w.t.Helper()
	halt(w.t, w.agents[name])
	w.startAgent(name, time.Now)
	w.waitConnected(name, true)
	w.eventually(30*time.Second, name+" ready", func() (bool, string) {
		errText, reason, err := w.agentReadyz(name)
		if err != nil {
			return false, err.Error()
		}
		return errText == "" && reason == "", errText
	})
}

// TestRebootstrapRecoversAnAgentThatPinsARetiredRelayRoot runs a real
// management server, a real agent and real local apiservers. The agent is
// stopped; while it is, the server's relay root is replaced: its relay CA
// Secrets are removed and the server restarted, so it makes a new root
// and serves and accepts agent certificates under that one only. That is
// what an agent meets that slept through a relay root rotation and comes
// back once the old root has left (the server neither chains to the root
// it pins nor accepts its certificate), reached in seconds instead of
// after a rotation's grace window (at least an agent certificate's
// lifetime). The agent's certificate is still valid here — the harder case
// of the two the design note names, since an agent whose certificate
// expired drops it and reads its Secrets again by itself, while this one
// keeps it until restarted.
//
// The agent reports the documented reason in /readyz; `cluster
// re-bootstrap` refuses an unknown cluster and, for the real one, leaves
// the KubernetesCluster untouched (same resourceVersion), and after the
// restart it prints the agent connects again with what it applied unchanged.
func TestRebootstrapRecoversAnAgentThatPinsARetiredRelayRoot(t *testing.T) {
	const name = "cluster-1"
	start := time.Now()
	step := func(what string) { t.Logf("%6s %s", time.Since(start).Round(100*time.Millisecond), what) }
	w := baseWorld(t, []string{name}, time.Hour)
	step("world up")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	_, err = w.env.Cluster(name).Apply(w.ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
	require.NoError(t, err)
	w.mustRelaymesh("cluster", "register", name, "--mgmt-context", "mgmt", "--remote-context", name, "--server-address", w.relayAddr)
	w.startAgent(name, time.Now)
	w.waitConnected(name, true)
	_, err = w.env.Cluster("mgmt").Apply(w.ctx, "test", []byte(federatingVirtualMesh(name)))
	require.NoError(t, err)
	step("registered, connected, VirtualMesh applied")
	cacerts := w.cacerts(name)
	remote := w.clients[name]
	remoteClients := &kubeclient.Clients{Config: w.env.Cluster(name).RESTConfig(), Typed: remote}
	remoteClients.Dynamic, err = dynamic.NewForConfig(remoteClients.Config)
	require.NoError(t, err)
	var applied registration.Applied
	w.eventually(60*time.Second, "the agent's output applied", func() (bool, string) {
		// A dry run of deregister's cleanup: what the agent applied.
		applied, err = registration.RemoveApplied(w.ctx, remoteClients, agentOwner, true)
		if err != nil {
			return false, err.Error()
		}
		return applied.AuthorizationPolicies > 0 && len(applied.CACerts) == 1, fmt.Sprintf("%+v", applied)
	})
	step("output applied")
	before := w.cluster(name)
	oldRoots, err := ca.RelayRootsPEM(w.ctx, w.clients["mgmt"], "relaymesh")
	require.NoError(t, err)

	// The agent sleeps; the relay root is replaced.
	halt(t, w.agents[name])
	halt(t, w.server)
	for _, s := range []string{ca.SigningSecretName, ca.RootSecretName} {
		require.NoError(t, w.clients["mgmt"].CoreV1().Secrets("relaymesh").Delete(w.ctx, s, metav1.DeleteOptions{}))
	}
	w.startServer()
	step("server restarted with a new relay root")
	newRoots, err := ca.RelayRootsPEM(w.ctx, w.clients["mgmt"], "relaymesh")
	require.NoError(t, err)
	require.NotEqual(t, oldRoots, newRoots, "the server made a new relay root")

	w.startAgent(name, time.Now)
	want := "the relay server's certificate does not chain to the pinned relay root; the relay root was probably rotated while this agent was offline: run `relaymesh cluster re-bootstrap cluster-1`"
	w.eventually(30*time.Second, "the agent's documented reason", func() (bool, string) {
		errText, reason, err := w.agentReadyz(name)
		if err != nil {
			return false, err.Error()
		}
		return reason == want && errText == "not connected to the relay server: "+want, errText
	})
	step("reason reported")
	b, err := os.ReadFile(w.agents[name].log)
	require.NoError(t, err)
	assert.Contains(t, string(b), "relay trust broken", "the agent logs it")

	// Refusals change nothing: an unknown cluster is named as such.
	_, errOut, code := w.relaymesh("cluster", "re-bootstrap", "cluster-9", "--mgmt-context", "mgmt", "--remote-context", name)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no KubernetesCluster cluster-9 in relaymesh; register it with 'relaymesh cluster register cluster-9'")

	// A cluster without an agent (kubeconfig mode) is refused before a
	// token is minted.
	w.mustRelaymesh("cluster", "register", "kc-1", "--mode", "kubeconfig", "--mgmt-context", "mgmt", "--remote-context", name)
	_, errOut, code = w.relaymesh("cluster", "re-bootstrap", "kc-1", "--mgmt-context", "mgmt", "--dry-run")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "cluster kc-1 is registered in kubeconfig mode: no agent runs there")
	tokens, err := w.clients["mgmt"].CoreV1().Secrets("relaymesh").List(w.ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, s := range tokens.Items {
		assert.NotEqual(t, "kc-1", string(s.Data["cluster"]), "a token minted for kc-1: %s", s.Name)
	}

	// --dry-run prints the Secrets with every current root and a token.
	out := w.mustRelaymesh("cluster", "re-bootstrap", name, "--mgmt-context", "mgmt", "--dry-run", "-o", "yaml")
	for _, s := range []string{"name: " + identity.RootSecret, "name: " + identity.TokenSecret, "kind: Namespace"} {
		assert.Contains(t, out, s)
	}
	assert.NotContains(t, out, "relaymesh-agent-config", "the registration's settings stand")

	step("dry run")
	pre := w.cluster(name)
	out = w.mustRelaymesh("cluster", "re-bootstrap", name, "--mgmt-context", "mgmt", "--remote-context", name)
	assert.Contains(t, out, "re-bootstrapped cluster cluster-1")
	assert.Contains(t, out, "kubectl -n relaymesh rollout restart deployment/relaymesh-agent")
	tok, err := remote.CoreV1().Secrets("relaymesh").Get(w.ctx, identity.TokenSecret, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, tok.Data[identity.KeyToken])
	assert.NotContains(t, out, string(tok.Data[identity.KeyToken]), "the token is never printed")
	// The token's mint is in the server's audit log, as token create's is.
	m := regexp.MustCompile(`bootstrap token (\S+) `).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	w.eventually(30*time.Second, "the mint audited", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(w.dir, "audit.log"))
		if err != nil {
			return false, err.Error()
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"type":"token.mint"`) && strings.Contains(line, `"token_id":"`+m[1]+`"`) && strings.Contains(line, `"cluster":"cluster-1"`) {
				return true, ""
			}
		}
		return false, "no token.mint of " + m[1]
	})
	root, err := remote.CoreV1().Secrets("relaymesh").Get(w.ctx, identity.RootSecret, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, newRoots, root.Data[identity.KeyCACert], "the roots the server trusts now")
	_, err = remote.CoreV1().Secrets("relaymesh").Get(w.ctx, identity.ClientSecret, metav1.GetOptions{})
	assert.True(t, notFound(err), "the stale client certificate is gone: %v", err)
	after := w.cluster(name)
	assert.Equal(t, pre.ResourceVersion, after.ResourceVersion, "the KubernetesCluster is not written (spec, status, annotations)")
	assert.Equal(t, before.Spec, after.Spec)

	step("re-bootstrapped")
	w.restartAgentReady(name) // the restart the command printed
	step("reconnected")
	now := w.cluster(name)
	assert.Equal(t, before.Spec, now.Spec, "spec and grants kept")
	assert.Equal(t, before.Annotations, now.Annotations)
	assert.Equal(t, before.Status.State, now.Status.State, "the registry's verdict kept")
	kept, err := remote.CoreV1().Secrets("istio-system").Get(w.ctx, trust.SecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, cacerts, kept.Data, "the mesh CA the agent applied is unchanged")
	again, err := registration.RemoveApplied(w.ctx, remoteClients, agentOwner, true)
	require.NoError(t, err)
	assert.Equal(t, applied, again, "what the agent applied is kept")
}
