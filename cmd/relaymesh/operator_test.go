package main

import (
	"encoding/json"
	"io/fs"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/api/crds"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/check"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// checkReport runs relaymesh check with args and decodes its JSON report.
func (w *world) checkReport(args ...string) (*check.Report, int, string) {
	w.t.Helper()
	out, errOut, code := w.relaymesh(append([]string{"check", "--context", "mgmt", "-o", "json"}, args...)...)
	var r check.Report
	require.NoError(w.t, json.Unmarshal([]byte(out), &r), "stdout: %s\nstderr: %s", out, errOut)
	return &r, code, out
}

// findings are the results of a report at least as bad as min, one per line.
func findings(r *check.Report, min check.Severity) string {
	var b strings.Builder
	for _, res := range r.Results {
		if res.Severity >= min {
			b.WriteString(res.Severity.String() + " " + res.Area + " " + res.Subject + ": " + res.Message + "\n")
		}
	}
	return b.String()
}

// requireHealthy runs check until it reports a healthy world (the server
// writes statuses asynchronously), and fails with the findings if it does
// not within the timeout.
func (w *world) requireHealthy(timeout time.Duration) {
	w.t.Helper()
	w.eventually(timeout, "relaymesh check to pass", func() (bool, string) {
		r, code, _ := w.checkReport()
		return code == 0 && r.Summary.Warnings == 0 && r.Summary.Errors == 0, findings(r, check.Warning)
	})
}

// requireFinding runs check (with args) until it exits with code and one
// result of severity in area says want (a breakage takes a moment to show).
func (w *world) requireFinding(timeout time.Duration, code int, sev check.Severity, area, want string, args ...string) *check.Report {
	w.t.Helper()
	var last *check.Report
	w.eventually(timeout, "check to report "+want, func() (bool, string) {
		r, got, _ := w.checkReport(args...)
		last = r
		if got != code {
			return false, "exit " + string(rune('0'+got)) + ": " + findings(r, check.Warning)
		}
		for _, res := range r.Results {
			if res.Severity == sev && res.Area == area && strings.Contains(res.Message, want) {
				return true, ""
			}
		}
		return false, findings(r, check.Warning)
	})
	return last
}

// TestOperatorCLI runs Relaymesh for real (three local clusters, the
// server, two agents, two istiods) and operates it the way a platform
// engineer does: every command with nothing but a merged $KUBECONFIG and
// --context; relaymesh check green on the healthy world, and red — with
// the right exit code and message — on each failure it claims to detect,
// each made real.
func TestOperatorCLI(t *testing.T) {
	w := newWorld(t, 2*time.Minute)

	t.Run("every command with KUBECONFIG and --context alone", func(t *testing.T) {
		defer w.in(t)()
		var list clusterList
		require.NoError(t, json.Unmarshal([]byte(w.mustRelaymesh("cluster", "list", "--context", "mgmt", "-o", "json")), &list))
		require.Len(t, list.Clusters, 2)
		for i, name := range workloadClusters {
			c := list.Clusters[i]
			assert.Equal(t, name, c.Name)
			assert.True(t, c.Connected, name)
			assert.Equal(t, version(), c.AgentVersion)
			require.NotNil(t, c.CertNotAfter)
			assert.WithinDuration(t, time.Now().Add(2*time.Minute), *c.CertNotAfter, 2*time.Minute)
			assert.NotEmpty(t, c.ClockOffset)
		}
		table := w.mustRelaymesh("cluster", "list", "--context", "mgmt", "-o", "wide")
		assert.Regexp(t, `(?m)^cluster-1\s+relay\s+\S+ ago\s+yes\s+now \(replica \S+\)\s+in \S+\s+`+version(), table)

		var v versions
		require.NoError(t, json.Unmarshal([]byte(w.mustRelaymesh("version", "--context", "mgmt", "-o", "json")), &v))
		require.NotNil(t, v.Server)
		assert.Equal(t, version(), v.Server.Version, "the server's version, from its metrics port: %+v", v.Server)
		if hostIP() != "" {
			assert.Contains(t, v.Server.Source, "service proxy relaymesh/https:relaymesh-server:metrics", "the metrics port is served over TLS")
		}
		require.Len(t, v.Agents, 2)
		assert.Equal(t, "agent/cluster-1", v.Agents[0].Component)
		assert.Equal(t, version(), v.Agents[0].Version)

		w.eventually(30*time.Second, "ca status with both meshes' intermediates", func() (bool, string) {
			out, _, _ := w.relaymesh("ca", "status", "--context", "mgmt")
			return strings.Contains(out, "  cluster-1  ") && strings.Contains(out, "  cluster-2  "), out
		})
		var status map[string][]meshTrustStatus
		require.NoError(t, json.Unmarshal([]byte(w.mustRelaymesh("ca", "status", "relaymesh/bookinfo-federation", "--context", "mgmt", "-o", "json")), &status))
		require.Len(t, status["virtualMeshes"], 1)
		assert.Len(t, status["virtualMeshes"][0].SharedTrust.Meshes, 2)

		// ca verify finds the workload clusters from the registrations.
		out := w.mustRelaymesh("ca", "verify", "--context", "mgmt")
		assert.Equal(t, 2, strings.Count(out, "  ok"), out)
		assert.Contains(t, out, "only cluster-1.local")
		out = w.mustRelaymesh("ca", "verify", "--remote-context", "cluster-1", "--remote-context", "cluster-2", "-o", "yaml")
		assert.Contains(t, out, "failed: 0")

		out = w.mustRelaymesh("policy", "audit", "--context", "mgmt")
		assert.Contains(t, out, "ACCESS MATRIX")
		out = w.mustRelaymesh("describe", "policy", "virtualmesh/relaymesh/bookinfo-federation", "--context", "mgmt", "-o", "json")
		assert.Contains(t, out, `"state": "Accepted"`)
		token := w.mustRelaymesh("token", "create", "--cluster", "cluster-1", "--context", "mgmt")
		assert.NotEmpty(t, strings.TrimSpace(token))
		_, errOut, code := w.relaymesh("token", "create", "--cluster", "cluster-9", "--context", "mgmt")
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, "cluster cluster-9 is not registered")

		// ca rotate finds the VirtualMesh through the context alone and
		// judges its real rotation state (a start would rotate the
		// world's root under the tests below; TestRotateAgainstAPIServer
		// drives every verb).
		for verb, want := range map[string]string{"continue": "no rotation that can continue (NotRotating)", "rollback": "no rotation to roll back (NotRotating)"} {
			_, errOut, code = w.relaymesh("ca", "rotate", verb, "relaymesh/bookinfo-federation", "--context", "mgmt")
			assert.NotEqual(t, 0, code, verb)
			assert.Contains(t, errOut, want, verb)
		}

		// Completion offers the merged kubeconfig's three contexts.
		for _, args := range [][]string{{"__complete", "check", "--context", ""}, {"__complete", "cluster", "register", "x", "--remote-context", ""}} {
			out := w.mustRelaymesh(args...)
			for _, name := range []string{"mgmt", "cluster-1", "cluster-2"} {
				assert.Regexp(t, `(?m)^`+name+`(\t|$)`, out, "%v", args)
			}
		}
	})

	t.Run("check is green on the healthy world", func(t *testing.T) {
		defer w.in(t)()
		w.requireHealthy(90 * time.Second)
		// The table form, with nothing but the context.
		out, errOut, code := w.relaymesh("check", "--context", "mgmt")
		require.Equal(t, 0, code, "%s%s", out, errOut)
		for _, want := range []string{"OK      crds", "OK      server", "OK      relay-ca", "agent connected", "the agent's clock is within 5s", "istiod uses the cacerts of relaymesh/bookinfo-federation",
			"the apiserver reaches the webhook", "answers only the apiserver's client certificate", "0 warnings, 0 errors"} {
			assert.Contains(t, out, want)
		}
	})

	t.Run("debug report", w.debugReport)
	t.Run("an idle connected agent is seen now", w.idleAgentsAreSeenNow)
	t.Run("a Service without endpoints is named as such", w.serviceWithoutEndpoints)
	t.Run("names complete and describe takes CLUSTER/NAMESPACE/NAME", w.completionAndNames)
	t.Run("token mints name their minter", w.tokenMintsNameTheMinter)

	t.Run("istiod left on the old CA", func(t *testing.T) {
		defer w.in(t)()
		// istiod was running before its mesh joined the VirtualMesh and
		// was never restarted: it still signs with its own CA.
		w.startIstiod("cluster-1", oldMeshCA(t))
		w.requireFinding(30*time.Second, 2, check.Error, check.AreaIstiod, "istiod is not using the cacerts Relaymesh wrote")
		r, _, _ := w.checkReport()
		for _, res := range r.Results {
			if res.Area == check.AreaIstiod && res.Subject == "cluster-2/istio-system" {
				assert.Equal(t, check.OK, res.Severity, res.Message)
			}
		}
		// Restarted with the cacerts Relaymesh wrote, it is fine again.
		w.startIstiod("cluster-1", w.cacerts("cluster-1"))
		w.requireHealthy(60 * time.Second)
	})

	t.Run("agent stopped", func(t *testing.T) {
		defer w.in(t)()
		w.agents["cluster-2"].stop(t)
		w.waitConnected("cluster-2", false)
		r := w.requireFinding(30*time.Second, 2, check.Error, check.AreaAgents, "agent not connected")
		assert.Contains(t, findings(r, check.Error), "no agent holds the leader Lease relaymesh-agent: none is running")
		w.startAgent("cluster-2", time.Now)
		w.waitConnected("cluster-2", true)
		w.requireHealthy(60 * time.Second)
	})

	t.Run("agent clock skewed", func(t *testing.T) {
		defer w.in(t)()
		w.agents["cluster-2"].stop(t)
		w.waitConnected("cluster-2", false)
		w.startAgent("cluster-2", func() time.Time { return time.Now().Add(3 * time.Minute) })
		w.waitConnected("cluster-2", true)
		r := w.requireFinding(30*time.Second, 2, check.Error, check.AreaClock, "ahead of the server's")
		// The offset is measured over the wire: the skew, less a
		// loaded machine's latency.
		m := regexp.MustCompile(`the agent's clock is (\S+) ahead`).FindStringSubmatch(findings(r, check.Error))
		require.NotNil(t, m, findings(r, check.Error))
		offset, err := time.ParseDuration(m[1])
		require.NoError(t, err)
		assert.InDelta(t, float64(3*time.Minute), float64(offset), float64(2*time.Second), "measured %s", offset)
		w.agents["cluster-2"].stop(t)
		w.waitConnected("cluster-2", false)
		w.startAgent("cluster-2", time.Now)
		w.waitConnected("cluster-2", true)
		w.requireHealthy(60 * time.Second)
	})

	t.Run("CRD deleted", func(t *testing.T) {
		defer w.in(t)()
		const name = "virtualdestinations.networking.relaymesh.io"
		ext := w.ext("mgmt")
		crdYAML, err := fs.ReadFile(crds.FS, "networking.relaymesh.io_virtualdestinations.yaml")
		require.NoError(t, err)
		require.NoError(t, ext.ApiextensionsV1().CustomResourceDefinitions().Delete(w.ctx, name, metav1.DeleteOptions{}))
		w.eventually(30*time.Second, "the CRD gone", func() (bool, string) {
			_, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(w.ctx, name, metav1.GetOptions{})
			return notFound(err), "still there"
		})
		w.requireFinding(10*time.Second, 2, check.Error, check.AreaCRDs, "not installed")
		_, err = w.env.Cluster("mgmt").Apply(w.ctx, "test", crdYAML)
		require.NoError(t, err)
		w.waitEstablished(ext, name)
		w.requireHealthy(60 * time.Second)
	})

	t.Run("CRD schema drifted", func(t *testing.T) {
		defer w.in(t)()
		// Another relaymesh version's CRD: one field more in the schema.
		const name = "trafficpolicies.networking.relaymesh.io"
		crds := w.ext("mgmt").ApiextensionsV1().CustomResourceDefinitions()
		crd, err := crds.Get(w.ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		installed := crd.DeepCopy().Spec.Versions
		for i := range crd.Spec.Versions {
			spec := crd.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"]
			require.NotNil(t, spec.Properties)
			spec.Properties["legacyTimeout"] = apiextensionsv1.JSONSchemaProps{Type: "string"}
			crd.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"] = spec
		}
		_, err = crds.Update(w.ctx, crd, metav1.UpdateOptions{})
		require.NoError(t, err)
		w.requireFinding(30*time.Second, 1, check.Warning, check.AreaCRDs, "schema is not this relaymesh version's")
		crd, err = crds.Get(w.ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		crd.Spec.Versions = installed
		_, err = crds.Update(w.ctx, crd, metav1.UpdateOptions{})
		require.NoError(t, err)
		w.requireHealthy(60 * time.Second)
	})

	t.Run("Istio CRD missing in a workload cluster", func(t *testing.T) {
		defer w.in(t)()
		const name = "gateways.networking.istio.io"
		ext := w.ext("cluster-2")
		crds := ext.ApiextensionsV1().CustomResourceDefinitions()
		saved, err := crds.Get(w.ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		require.NoError(t, crds.Delete(w.ctx, name, metav1.DeleteOptions{}))
		w.eventually(30*time.Second, "the CRD gone", func() (bool, string) {
			_, err := crds.Get(w.ctx, name, metav1.GetOptions{})
			return notFound(err), "still there"
		})
		w.requireFinding(30*time.Second, 2, check.Error, check.AreaCRDs, "Istio CRDs the agent applies are missing: "+name)
		_, err = crds.Create(w.ctx, &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: saved.Name, Labels: saved.Labels, Annotations: saved.Annotations}, Spec: saved.Spec}, metav1.CreateOptions{})
		require.NoError(t, err)
		w.waitEstablished(ext, name)
		w.requireHealthy(60 * time.Second)
	})

	t.Run("server address serving a foreign certificate", func(t *testing.T) {
		defer w.in(t)()
		// Whatever answers at a wrong relay address (here the management
		// kube-apiserver, a real TLS server) does not chain to the relay root.
		u, err := url.Parse(w.env.Cluster("mgmt").RESTConfig().Host)
		require.NoError(t, err)
		w.requireFinding(10*time.Second, 2, check.Error, check.AreaServer, "serves a certificate that does not verify against the relay root", "--server-address", u.Host)
	})

	t.Run("webhook failure policy Ignore", func(t *testing.T) {
		defer w.in(t)()
		hooks := w.clients["mgmt"].AdmissionregistrationV1().ValidatingWebhookConfigurations()
		setPolicy := func(p string) {
			_, err := hooks.Patch(w.ctx, check.WebhookConfiguration, types.JSONPatchType,
				[]byte(`[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"`+p+`"}]`), metav1.PatchOptions{})
			require.NoError(t, err)
		}
		setPolicy("Ignore")
		w.requireFinding(30*time.Second, 1, check.Warning, check.AreaWebhook, "failure policy Ignore (WEAKER)")
		setPolicy("Fail")
		w.requireHealthy(60 * time.Second)
	})

	t.Run("server stopped", func(t *testing.T) {
		defer w.in(t)()
		w.server.stop(t)
		r := w.requireFinding(30*time.Second, 2, check.Error, check.AreaServer, "unreachable")
		bad := findings(r, check.Warning)
		assert.Contains(t, bad, "the apiserver cannot call the webhook")
		assert.Contains(t, bad, "cannot read the server's metrics")
		w.startServer()
		for _, name := range workloadClusters {
			w.waitConnected(name, true)
		}
		w.requireHealthy(90 * time.Second)
	})

	// From here on the world is not made healthy again.
	t.Run("root rotation in progress", func(t *testing.T) {
		defer w.in(t)()
		// Held at its first phase until a continue (none comes): agents
		// ack a phase in about a second, faster than a check of the whole
		// world runs on a loaded machine, so an unheld rotation could be
		// over before any check saw it.
		_, err := w.mgmtDyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace("relaymesh").Patch(w.ctx, "bookinfo-federation", types.MergePatchType,
			[]byte(`{"spec":{"mtls":{"rotationVerification":"Manual"}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		out := w.mustRelaymesh("ca", "rotate", "start", "relaymesh/bookinfo-federation", "--context", "mgmt")
		assert.Contains(t, out, "relaymesh.io/root-generation=2")
		var seen string
		w.eventually(60*time.Second, "check to report the rotation and its pending meshes", func() (bool, string) {
			r, code, _ := w.checkReport()
			for _, res := range r.Results {
				if res.Area == check.AreaVirtualMeshes && res.Subject == "relaymesh/bookinfo-federation" && res.Severity == check.Warning && strings.Contains(res.Message, "rotation in ") {
					seen = res.Message
					return code != 0, res.Message
				}
			}
			return false, findings(r, check.Warning)
		})
		t.Logf("check: %s", seen)
	})

	t.Run("agent certificate expired", func(t *testing.T) {
		defer w.in(t)()
		// Certificates live two minutes here; with the agent gone nothing
		// renews cluster-1's, and it runs out.
		w.agents["cluster-1"].stop(t)
		w.waitConnected("cluster-1", false)
		w.requireFinding(3*time.Minute, 2, check.Error, check.AreaAgents, "the agent's client certificate expired")
	})

	t.Run("agent of a cluster no longer registered", func(t *testing.T) {
		defer w.in(t)()
		// Deregistered on the management side only: cluster-2's agent
		// still runs there with its secrets, and can no longer connect.
		out := w.mustRelaymesh("cluster", "deregister", "cluster-2", "--mgmt-context", "mgmt")
		assert.Contains(t, out, "deregistered cluster cluster-2")
		w.requireFinding(30*time.Second, 2, check.Error, check.AreaAgents, `names cluster "cluster-2", which is not registered`, "--remote-context", "cluster-2")
		// It said what it left in the workload cluster, and how to remove it.
		assert.Contains(t, out, "the Istio objects and cacerts Secrets its agent applied stay in the workload cluster")
		assert.Contains(t, out, "kubectl delete virtualservices.networking.istio.io,")
		assert.Contains(t, out, "-l relaymesh.io/owner=relaymesh-agent")
	})

	t.Run("deregistration with the workload cluster removes what its agent applied", w.deregisterCleansTheWorkloadCluster)
}

// ext is an apiextensions client of a cluster of the world.
func (w *world) ext(cluster string) apiextensionsclient.Interface {
	w.t.Helper()
	ext, err := apiextensionsclient.NewForConfig(w.env.Cluster(cluster).RESTConfig())
	require.NoError(w.t, err)
	return ext
}

// waitEstablished waits until the apiserver serves a CRD.
func (w *world) waitEstablished(ext apiextensionsclient.Interface, name string) {
	w.t.Helper()
	w.eventually(30*time.Second, name+" established", func() (bool, string) {
		crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(w.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, ""
			}
		}
		return false, "not established"
	})
}

// TestCheckRelayCAExpiry gives the server a relay CA made with a short
// lifetime (five days left): check reports the root and the issuing CA as
// errors (under 7 days) and exits 2.
func TestCheckRelayCAExpiry(t *testing.T) {
	w := baseWorld(t, nil, time.Hour, func(w *world) {
		_, err := ca.LoadOrCreateRelayCA(w.ctx, w.clients["mgmt"], "relaymesh", ca.GenerateConfig{RootTTL: 5*24*time.Hour + time.Hour, IssuerTTL: 5 * 24 * time.Hour})
		require.NoError(t, err)
	})
	r := w.requireFinding(30*time.Second, 2, check.Error, check.AreaRelayCA, "expires in 5d")
	// Both certificates are errors; beside them the issuing CA's renewal
	// state (generation 1, not yet due) is an OK finding.
	var subjects []string
	for _, res := range r.Results {
		if res.Area == check.AreaRelayCA && res.Severity == check.Error {
			subjects = append(subjects, res.Subject)
		}
	}
	assert.ElementsMatch(t, []string{"relaymesh/relay-root-tls-secret", "relaymesh/relay-tls-signing-secret"}, subjects)
	assert.Contains(t, findings(r, check.Error), "relay issuing CA")
}
