package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/check"
	"github.com/relaymesh/relaymesh/cmd/relaymesh/internal/registration"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
)

// What a new user meets on a running world (issue 28): the operator
// commands' messages, names and views, each checked on TestOperatorCLI's
// world.

// idleAgentsAreSeenNow: cluster list shows a connected agent whose session
// records nothing as seen now, vouched for by the live replica holding its
// session, with its last Lease renewal (every 5 s) as the time.
func (w *world) idleAgentsAreSeenNow(t *testing.T) {
	defer w.in(t)()
	var list clusterList
	require.NoError(t, json.Unmarshal([]byte(w.mustRelaymesh("cluster", "list", "--context", "mgmt", "-o", "json")), &list))
	for _, c := range list.Clusters {
		kc := w.cluster(c.Name)
		require.True(t, kc.Status.Connected, c.Name)
		assert.Equal(t, kc.Status.Replica, c.HeldBy, "%s: held by the replica its status names", c.Name)
		require.NotNil(t, c.LastSeen)
		// The replica renews every 5 s and its Lease lasts 15 s: seen
		// within that of now, whatever the session's last event.
		assert.WithinDuration(t, time.Now(), *c.LastSeen, 3*replicaHeartbeat+5*time.Second, "%s: last seen", c.Name)
		assert.False(t, c.LastSeen.Before(kc.Status.LastSeen.Time), "%s: never earlier than the last event", c.Name)
		t.Logf("%s: last event %s ago, seen %s ago (replica %s)", c.Name, time.Since(kc.Status.LastSeen.Time).Round(time.Second), time.Since(*c.LastSeen).Round(time.Second), c.HeldBy)
	}
	table := w.mustRelaymesh("cluster", "list", "--context", "mgmt")
	assert.Regexp(t, `(?m)^cluster-1\s+relay\s+\S+ ago\s+yes\s+now \(replica \S+\)`, table)
}

// serviceWithoutEndpoints: the service proxy's "not found" is explained —
// a Service no ready pod backs (the by-hand and demo setups) and a missing
// Service are told apart, with the flag that gives the address directly.
func (w *world) serviceWithoutEndpoints(t *testing.T) {
	defer w.in(t)()
	_, err := w.clients["mgmt"].CoreV1().Services("relaymesh").Create(w.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-noeps"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": "nothing"}, Ports: []corev1.ServicePort{{Name: "metrics", Port: 9091, TargetPort: intstr.FromInt32(9091)}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for service, want := range map[string]string{
		"relaymesh-noeps":  "Service relaymesh/relaymesh-noeps exists, but no ready pod backs it",
		"relaymesh-nosuch": "no Service relaymesh/relaymesh-nosuch (is the server installed",
	} {
		out, errOut, code := w.relaymesh("version", "--context", "mgmt", "--server-service", service, "-o", "json")
		assert.Equal(t, 1, code, "%s: %s", out, errOut)
		var v versions
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		require.NotNil(t, v.Server)
		assert.Contains(t, v.Server.Error, want)
		assert.Contains(t, v.Server.Error, "--server-metrics-address HOST:PORT")
		assert.NotContains(t, v.Server.Error, `services "`+service+`" not found`)
	}
	r, _, _ := w.checkReport("--server-service", "relaymesh-noeps")
	assert.Contains(t, findings(r, check.Warning), "no ready pod backs it")
}

// completionAndNames: TAB completes names from the management cluster, and
// describe takes a Destination as CLUSTER/NAMESPACE/NAME.
func (w *world) completionAndNames(t *testing.T) {
	defer w.in(t)()
	lines := func(args ...string) []string {
		out := w.mustRelaymesh(append([]string{"__complete"}, args...)...)
		var names []string
		for _, l := range strings.Split(out, "\n") {
			if l != "" && !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "Completion ended") {
				names = append(names, strings.Split(l, "\t")[0])
			}
		}
		return names
	}
	assert.Equal(t, []string{"cluster-1", "cluster-2"}, lines("cluster", "deregister", "--mgmt-context", "mgmt", ""))
	assert.Equal(t, []string{"cluster-2"}, lines("token", "create", "--context", "mgmt", "--cluster", "cluster-2"))
	for _, verb := range []string{"start", "continue", "rollback"} {
		assert.Equal(t, []string{"relaymesh/bookinfo-federation"}, lines("ca", "rotate", verb, "--context", "mgmt", ""), verb)
	}
	assert.Equal(t, []string{"relaymesh/bookinfo-federation"}, lines("ca", "status", "--context", "mgmt", "relay"))
	assert.Contains(t, lines("describe", "policy", "--context", "mgmt", ""), "virtualmesh/relaymesh/bookinfo-federation")
	dests := lines("describe", "destination", "--context", "mgmt", "cluster-1/")
	require.NotEmpty(t, dests)
	for _, d := range dests {
		assert.Regexp(t, `^cluster-1/[a-z0-9-]+/[a-z0-9-]+$`, d)
	}

	// The form status messages use.
	var desc struct {
		Name    string `json:"name"`
		Service struct {
			ClusterName, Namespace, Name string
		} `json:"service"`
	}
	require.NoError(t, json.Unmarshal([]byte(w.mustRelaymesh("describe", "destination", dests[0], "--context", "mgmt", "-o", "json")), &desc))
	assert.Equal(t, dests[0], desc.Service.ClusterName+"/"+desc.Service.Namespace+"/"+desc.Service.Name)
	_, errOut, code := w.relaymesh("describe", "destination", "cluster-1/bookinfo/no-such-service", "--context", "mgmt")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no Destination was discovered from Service cluster-1/bookinfo/no-such-service")
	assert.Contains(t, errOut, dests[0], "the known ones are listed")
}

// tokenMintsNameTheMinter: the server's token.mint records name the user the
// management apiserver authenticated as the minter.
func (w *world) tokenMintsNameTheMinter(t *testing.T) {
	defer w.in(t)()
	me, err := w.clients["mgmt"].AuthenticationV1().SelfSubjectReviews().Create(w.ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	user := me.Status.UserInfo.Username
	require.NotEmpty(t, user)
	tokens, err := w.clients["mgmt"].CoreV1().Secrets("relaymesh").List(w.ctx, metav1.ListOptions{LabelSelector: "relaymesh.io/bootstrap-token=true"})
	require.NoError(t, err)
	require.NotEmpty(t, tokens.Items, "the world minted tokens")
	for _, s := range tokens.Items {
		assert.Equal(t, user, s.Annotations[identity.MintedByAnnotation], s.Name)
	}
	w.eventually(30*time.Second, "token.mint records with their minter", func() (bool, string) {
		f, err := os.Open(filepath.Join(w.dir, "audit.log"))
		if err != nil {
			return false, err.Error()
		}
		defer f.Close()
		var mints, named int
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var rec struct{ Type, Subject string }
			if json.Unmarshal(sc.Bytes(), &rec) != nil || rec.Type != "token.mint" {
				continue
			}
			mints++
			if rec.Subject == user {
				named++
			}
		}
		return mints > 0 && named == mints, fmt.Sprintf("token.mint records: %d, naming %s: %d", mints, user, named)
	})
}

// deregisterCleansTheWorkloadCluster: deregistration with the workload
// cluster named removes exactly what the agent applied (its Istio objects
// and cacerts) and its secrets, and never a user's object.
func (w *world) deregisterCleansTheWorkloadCluster(t *testing.T) {
	defer w.in(t)()
	const name = "cluster-1"
	dyn, err := dynamic.NewForConfig(w.env.Cluster(name).RESTConfig())
	require.NoError(t, err)
	cs := w.clients[name]
	kinds := map[string]schema.GroupVersionResource{}
	for _, gvk := range apply.DefaultKinds {
		kinds[gvk.Kind] = registration.Resource(gvk)
	}
	owned := func() int {
		n := 0
		for _, gvr := range kinds {
			l, err := dyn.Resource(gvr).Namespace("").List(w.ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel + "=" + agentOwner})
			require.NoError(t, err)
			n += len(l.Items)
		}
		return n
	}
	before := owned()
	require.Positive(t, before, "the agent applied Istio objects")
	ca, err := cs.CoreV1().Secrets("istio-system").Get(w.ctx, trust.SecretName, metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, agentOwner, ca.Labels[outputs.OwnerLabel])

	// A user's own objects: a ServiceEntry without the label, one with the
	// label naming another owner, and a cacerts Secret of their own.
	se := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
		"metadata": map[string]any{"name": "users-own", "namespace": "default"},
		"spec":     map[string]any{"hosts": []any{"api.example.com"}, "location": "MESH_EXTERNAL", "ports": []any{map[string]any{"number": int64(443), "name": "https", "protocol": "TLS"}}}}}
	_, err = dyn.Resource(kinds["ServiceEntry"]).Namespace("default").Create(w.ctx, se, metav1.CreateOptions{})
	require.NoError(t, err)
	other := se.DeepCopy()
	other.SetName("another-owner")
	other.SetLabels(map[string]string{outputs.OwnerLabel: "someone-else"})
	_, err = dyn.Resource(kinds["ServiceEntry"]).Namespace("default").Create(w.ctx, other, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.CoreV1().Namespaces().Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-users"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.CoreV1().Secrets("istio-users").Create(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: trust.SecretName}, Data: map[string][]byte{"x": []byte("y")}}, metav1.CreateOptions{})
	require.NoError(t, err)

	out := w.mustRelaymesh("cluster", "deregister", name, "--mgmt-context", "mgmt", "--remote-context", name)
	t.Logf("deregister:\n%s", out)
	assert.Contains(t, out, "deregistered cluster "+name)
	assert.Contains(t, out, "removed what the agent applied in the workload cluster:")
	assert.Contains(t, out, "cacerts Secrets: 1 (in istio-system)")
	assert.Contains(t, out, "removed the agent's secrets from relaymesh")
	assert.Contains(t, out, "helm uninstall")
	if strings.Contains(out, "AuthorizationPolicy") {
		assert.Contains(t, out, "WARNING: ", "removing AuthorizationPolicies is said to open access")
	}
	assert.Equal(t, 0, owned(), "nothing the agent applied is left")
	_, err = cs.CoreV1().Secrets("istio-system").Get(w.ctx, trust.SecretName, metav1.GetOptions{})
	assert.True(t, notFound(err), "the agent's cacerts is gone: %v", err)
	for _, n := range []string{"users-own", "another-owner"} {
		_, err = dyn.Resource(kinds["ServiceEntry"]).Namespace("default").Get(w.ctx, n, metav1.GetOptions{})
		assert.NoError(t, err, "the user's ServiceEntry %s stays", n)
	}
	_, err = cs.CoreV1().Secrets("istio-users").Get(w.ctx, trust.SecretName, metav1.GetOptions{})
	assert.NoError(t, err, "the user's own cacerts stays")
	for _, s := range []string{identity.ClientSecret, identity.TokenSecret, identity.RootSecret} {
		_, err = cs.CoreV1().Secrets("relaymesh").Get(w.ctx, s, metav1.GetOptions{})
		assert.True(t, notFound(err), "%s removed: %v", s, err)
	}
}
