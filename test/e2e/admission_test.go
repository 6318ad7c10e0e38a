package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

const allowAll = `apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: %s, namespace: relaymesh}
spec: {}
`

// TestAdmission: an AccessPolicy the default rules refuse, created while no
// webhook runs, ends up Invalid with the rule's message and is never
// translated; with the webhook registered, the real kube-apiserver calls it
// and kubectl apply is refused with that message.
func TestAdmission(t *testing.T) {
	ctx := context.Background()
	bin, env, dir := Setup(t, "mgmt", "cluster-1")
	mgmt := env.Cluster("mgmt")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	_, err = env.Cluster("cluster-1").Apply(ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", "cluster-1")))
	require.NoError(t, err)

	// First without a webhook.
	relayAddr, opsAddr := Addr(t), Addr(t)
	serverArgs := []string{"server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--audit-log", dir + "/audit.log", "--server-dns-names", "localhost", "--server-ips", Host(relayAddr)}
	server := Start(t, bin, dir, "server", serverArgs...)
	waitHealthy(t, opsAddr)
	_, err = Run(t, bin, "cluster", "register", "cluster-1", "--mgmt-kubeconfig", mgmt.Kubeconfig, "--remote-kubeconfig", env.Cluster("cluster-1").Kubeconfig, "--server-address", relayAddr)
	require.NoError(t, err)
	Start(t, bin, dir, "agent-cluster-1", "agent", "--kubeconfig", env.Cluster("cluster-1").Kubeconfig, "--health-listen", Addr(t), "--metrics-listen", Addr(t))
	mgmtDyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	Eventually(t, 60*time.Second, "cluster-1 discovered", func() (bool, string) {
		l, err := mgmtDyn.Resource(discoveryv1alpha1.Destinations).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 2, fmt.Sprint(err)
	})

	_, err = mgmt.Apply(ctx, "test", []byte(fmt.Sprintf(allowAll, "sneaked-in")))
	require.NoError(t, err, "no webhook: the API server stores it")
	apGVR := networkingv1alpha1.AccessPolicies
	Eventually(t, 10*time.Second, "the stored allow-all AccessPolicy is Invalid with the rule's message", func() (bool, string) {
		o, err := mgmtDyn.Resource(apGVR).Namespace("relaymesh").Get(ctx, "sneaked-in", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		state, _, _ := unstructured.NestedString(o.Object, "status", "state")
		errs, _, _ := unstructured.NestedStringSlice(o.Object, "status", "errors")
		return state == "Invalid" && strings.Contains(strings.Join(errs, ";"), "lets every source reach every destination"), state + fmt.Sprint(errs)
	})
	// Never translated: no AuthorizationPolicy names it as a parent.
	c1, err := dynamic.NewForConfig(env.Cluster("cluster-1").RESTConfig())
	require.NoError(t, err)
	time.Sleep(time.Second) // what translation would have published has had time to arrive
	aps, err := c1.Resource(outputs.AuthorizationPolicies).
		Namespace("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, ap := range aps.Items {
		require.NotContains(t, ap.GetAnnotations()[outputs.ParentsAnnotation], "sneaked-in", "an Invalid policy was translated")
	}

	// Now with the webhook: the kube-apiserver calls it, kubectl is refused.
	require.NoError(t, server.Stop(5*time.Second))
	hookAddr := Addr(t)
	// The webhook answers the kube-apiserver only: its client certificate
	// (from the apiserver's admission configuration) is required.
	Start(t, bin, dir, "server-with-webhook", append(serverArgs, "--webhook-listen", hookAddr, "--webhook-url", "https://"+hookAddr+"/validate",
		"--webhook-client-ca", mgmt.WebhookClientCA)...)
	waitHealthy(t, opsAddr)
	file := filepath.Join(dir, "everyone.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(allowAll, "everyone")), 0o600))
	root, err := localcluster.RepoRoot()
	require.NoError(t, err)
	kubectl := filepath.Join(root, ".cache", "bin", "kubectl")
	var out []byte
	Eventually(t, 20*time.Second, "kubectl apply refused by the webhook", func() (bool, string) {
		out, err = exec.Command(kubectl, "--kubeconfig", mgmt.Kubeconfig, "apply", "-f", file).CombinedOutput()
		return err != nil && strings.Contains(string(out), "denied the request"), string(out)
	})
	require.Contains(t, string(out), "lets every source reach every destination")
	require.Contains(t, string(out), "relaymesh.admission.access_allow_all")
	_, err = mgmtDyn.Resource(apGVR).Namespace("relaymesh").Get(ctx, "everyone", metav1.GetOptions{})
	require.Error(t, err, "nothing was stored")

	// A user rule set from a labelled ConfigMap takes effect without a
	// restart; a broken one is refused (the server says so) and the
	// previous rules keep working.
	mgmtCS, err := mgmt.Clientset()
	require.NoError(t, err)
	rule := func(name, rego string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh", Labels: map[string]string{"relaymesh.io/admission-policy": ""}},
			Data: map[string]string{"rules.rego": rego}}
	}
	_, err = mgmtCS.CoreV1().ConfigMaps("relaymesh").Create(ctx, rule("no-legacy", `package relaymesh.admission.no_legacy

deny contains "names starting with legacy- are retired" if startswith(input.name, "legacy-")

test_legacy if { count(deny) == 1 with input as {"name": "legacy-x"} }
test_other if { count(deny) == 0 with input as {"name": "x"} }
`), metav1.CreateOptions{})
	require.NoError(t, err)
	legacy := filepath.Join(dir, "legacy.yaml")
	require.NoError(t, os.WriteFile(legacy, []byte(`apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: legacy-reviews, namespace: relaymesh}
spec: {destinationSelector: [{kubeServiceMatcher: {namespaces: [bookinfo]}}]}
`), 0o600))
	// admissionStatus is "<name>=<state>" of every rule set the server has.
	debug := DebugReader(t, mgmt, opsAddr)
	admissionStatus := func() string {
		code, b, err := debug("/debug/admission")
		if err != nil {
			return err.Error()
		}
		if code != http.StatusOK {
			return fmt.Sprintf("HTTP %d: %s", code, b)
		}
		var sets []struct{ Name, State string }
		if err := json.Unmarshal(b, &sets); err != nil {
			return err.Error()
		}
		var out []string
		for _, s := range sets {
			out = append(out, s.Name+"="+s.State)
		}
		return strings.Join(out, " ")
	}
	Eventually(t, 20*time.Second, "the ConfigMap rule set is accepted, without a restart", func() (bool, string) {
		st := admissionStatus()
		return strings.Contains(st, "relaymesh/no-legacy=accepted"), st
	})
	out, err = exec.Command(kubectl, "--kubeconfig", mgmt.Kubeconfig, "apply", "-f", legacy).CombinedOutput()
	require.Error(t, err, "the ConfigMap rule refuses legacy-reviews: %s", out)
	require.Contains(t, string(out), "names starting with legacy- are retired")
	_, err = mgmtCS.CoreV1().ConfigMaps("relaymesh").Create(ctx, rule("broken", "package relaymesh.admission.broken\n\ndeny contains msg if {"), metav1.CreateOptions{})
	require.NoError(t, err)
	Eventually(t, 20*time.Second, "the broken rule set is refused and shown", func() (bool, string) {
		st := admissionStatus()
		return strings.Contains(st, "relaymesh/broken=refused"), st
	})
	out, err = exec.Command(kubectl, "--kubeconfig", mgmt.Kubeconfig, "apply", "-f", legacy).CombinedOutput()
	require.Error(t, err, "the previous rules still work: %s", out)
	require.Contains(t, string(out), "names starting with legacy- are retired")

	// The debug endpoints answer only an authenticated, authorized caller.
	resp, err := http.Get("http://" + opsAddr + "/debug/admission")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no token, no debug data")

	// A flood of garbage at the webhook port from someone without the
	// apiserver's client certificate: refused at the TLS handshake, while
	// the apiserver's own calls go on being judged.
	floodCtx, stopFlood := context.WithCancel(ctx)
	var flooded, floodRefused atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
			for floodCtx.Err() == nil {
				flooded.Add(1)
				resp, err := c.Post("https://"+hookAddr+"/validate", "application/json", strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","userInfo":{"username":"forged-admin"}}}`))
				if err != nil {
					floodRefused.Add(1)
					continue
				}
				_ = resp.Body.Close()
			}
		}()
	}
	start := time.Now()
	for i := range 5 {
		out, err = exec.Command(kubectl, "--kubeconfig", mgmt.Kubeconfig, "apply", "-f", legacy).CombinedOutput()
		require.Error(t, err, "during the flood the webhook still judges the apiserver's calls: %s", out)
		require.Contains(t, string(out), "names starting with legacy- are retired", "attempt %d", i)
		allowed := filepath.Join(dir, fmt.Sprintf("allowed-%d.yaml", i))
		require.NoError(t, os.WriteFile(allowed, []byte(fmt.Sprintf(`apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: during-flood-%d, namespace: relaymesh}
spec: {destinationSelector: [{kubeServiceMatcher: {namespaces: [bookinfo]}}]}
`, i)), 0o600))
		out, err = exec.Command(kubectl, "--kubeconfig", mgmt.Kubeconfig, "apply", "-f", allowed).CombinedOutput()
		require.NoError(t, err, "an allowed policy is applied during the flood: %s", out)
	}
	stopFlood()
	wg.Wait()
	t.Logf("webhook garbage flood: %d requests in %s, %d refused at the TLS handshake; 10 kubectl applies through the webhook all judged",
		flooded.Load(), time.Since(start).Round(time.Millisecond), floodRefused.Load())
	require.Equal(t, flooded.Load(), floodRefused.Load(), "no garbage request got past the handshake")

	// The audit log holds the decisions, each naming the authenticated
	// caller, none the forged user; and it still verifies.
	out, err = exec.Command(bin, "audit", "verify", dir+"/audit.log").CombinedOutput()
	require.NoError(t, err, string(out))
	log, err := os.ReadFile(dir + "/audit.log")
	require.NoError(t, err)
	require.Contains(t, string(log), `"admission.decision"`)
	require.Contains(t, string(log), `"result":"failure"`)
	require.Contains(t, string(log), `"caller":"apiserver CN=kube-apiserver"`)
	require.NotContains(t, string(log), "forged-admin")
}
