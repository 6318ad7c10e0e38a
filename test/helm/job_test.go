package helm

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// The VirtualMesh of the job is the demo's (examples/demo/virtualmesh.yaml,
// the one place it is written); the policies too. testdata/job.yaml adds
// a VirtualDestination, so every kind of user object has a status.
const virtualMesh = "bookinfo-federation"

var (
	gvrVirtualMesh  = networkingv1alpha1.VirtualMeshes
	gvrTraffic      = networkingv1alpha1.TrafficPolicies
	gvrAccess       = networkingv1alpha1.AccessPolicies
	gvrVirtualDest  = networkingv1alpha1.VirtualDestinations
	gvrClusters     = multiclusterv1alpha1.KubernetesClusters
	gvrMeshes       = discoveryv1alpha1.Meshes
	gvrWorkloads    = discoveryv1alpha1.Workloads
	gvrDestinations = discoveryv1alpha1.Destinations
	gvrGateways     = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
	// routeKinds are the Gateway API routes the agents write for ambient
	// Destinations (the ambient part of the job).
	routeKinds = []schema.GroupVersionResource{outputs.HTTPRoutes, outputs.GRPCRoutes}
	// istioKinds are what the agents apply (apply.DefaultKinds, as resources).
	istioKinds = outputs.IstioResources()
)

// Values the job installs the charts with: the server's certificate names
// the loopback address the agents dial here, agent certificates live 60s (renewed at 2/3
// of a life that starts a minute back: within 20s) so
// the job sees a renewal, and the admission webhook is on (answering the
// API server's client certificate).
var (
	jobServerValues = []string{"--set", "serverIPs={127.0.0.1}", "--set", "agentCertTTL=60s",
		"--set", "webhook.enabled=true,webhook.clientCAConfigMap=apiserver-webhook-client-ca"}
	jobAgentValues []string
)

// grace is how long a step of a removal run may still succeed after a
// request of the charts' accounts was denied; every step of a passing job
// takes well under it.
const grace = 8 * time.Second

// jobConfig says how to run the job.
type jobConfig struct {
	// workload are the workload clusters; none: only the server starts.
	workload []string
	// serverChart and agentChart are chart directories or packages;
	// default charts/.
	serverChart, agentChart string
	// serverValues are the server chart's helm arguments; default
	// jobServerValues.
	serverValues []string
	// before runs after the charts are installed, before any process starts
	// (a removal run removes its rule here).
	before func(t testing.TB, j *job)
	// failFast makes a step fail once a request was denied more than grace
	// ago, and steps return errors instead of failing the test.
	failFast bool
}

// job is the main job of Relaymesh run by the real processes as the charts'
// ServiceAccounts, on fresh local clusters: each step is a method that
// returns an error when the step does not reach its outcome.
type job struct {
	t                  testing.TB
	ctx                context.Context
	cfg                jobConfig
	bin, dir           string
	h                  helm
	env                *localcluster.Env
	mgmt               *localcluster.Cluster
	mgmtDyn            dynamic.Interface
	mgmtKube           kubernetes.Interface
	dyn                map[string]dynamic.Interface
	kube               map[string]kubernetes.Interface
	relayAddr, opsAddr string
	webhookAddr        string
	serverArgs         []string
	server             *localcluster.Process
	agents             map[string][]*localcluster.Process
	health             map[string][]string
	serials            map[string]string
	roots              map[string][]byte
	steps              []stepWindow

	mu     sync.Mutex
	denial time.Time
}

type stepWindow struct {
	name       string
	start, end time.Time
}

// newJob starts the clusters (with audit logs), installs both charts with
// helm as the admin, applies the sample workloads and writes the
// ServiceAccounts' kubeconfigs.
func newJob(t testing.TB, cfg jobConfig) *job {
	t.Helper()
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	dir := t.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	require.NoError(t, os.WriteFile(policy, []byte(auditPolicy), 0o600))
	clusters := append([]string{"mgmt"}, cfg.workload...)
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: filepath.Join(dir, "clusters"), Clusters: clusters, AuditPolicy: policy})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	if cfg.serverChart == "" {
		cfg.serverChart = chartDir(t, serverChart)
	}
	if cfg.agentChart == "" {
		cfg.agentChart = chartDir(t, agentChart)
	}
	if cfg.serverValues == nil {
		cfg.serverValues = jobServerValues
	}
	j := &job{t: t, ctx: ctx, cfg: cfg, bin: relaymesh(t), dir: dir, h: newHelm(t), env: env, mgmt: env.Cluster("mgmt"),
		dyn: map[string]dynamic.Interface{}, kube: map[string]kubernetes.Interface{}, agents: map[string][]*localcluster.Process{},
		health: map[string][]string{}, serials: map[string]string{}, roots: map[string][]byte{}}
	j.mgmtDyn, err = dynamic.NewForConfig(j.mgmt.RESTConfig())
	require.NoError(t, err)
	j.mgmtKube, err = j.mgmt.Clientset()
	require.NoError(t, err)
	j.install(cfg.serverChart, cfg.agentChart, "install")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	for _, name := range cfg.workload {
		c := env.Cluster(name)
		_, err := c.Apply(ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
		require.NoError(t, err)
		j.dyn[name], err = dynamic.NewForConfig(c.RESTConfig())
		require.NoError(t, err)
		j.kube[name], err = c.Clientset()
		require.NoError(t, err)
	}
	if len(cfg.workload) > 0 {
		j.ambient(j.ambientCluster())
	}
	j.relayAddr, j.opsAddr, j.webhookAddr = e2e.Addr(t), e2e.Addr(t), e2e.Addr(t)
	if cfg.before != nil {
		cfg.before(t, j)
	}
	return j
}

// ambientCluster is the workload cluster with the ambient part: the last,
// whose agents list the way older API servers need (with a watch-list
// client the Gateways' list permission would go unused).
func (j *job) ambientCluster() string { return j.cfg.workload[len(j.cfg.workload)-1] }

// ambient turns the mesh of cluster ambient (its istiod gets
// PILOT_ENABLE_AMBIENT, as the Helm ambient profile sets it), installs
// Gateway API's CRDs there and adds namespace shop behind a ready waypoint
// (testdata/ambient.yaml), before any agent starts: the agent's discovery
// reads Gateways only where the cluster serves them at its start.
func (j *job) ambient(cluster string) {
	t := j.t
	c := j.env.Cluster(cluster)
	env := []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"discovery","env":[{"name":"PILOT_ENABLE_AMBIENT","value":"true"}]}]}}}}`)
	_, err := j.kube[cluster].AppsV1().Deployments("istio-system").Patch(j.ctx, "istiod", types.StrategicMergePatchType, env, metav1.PatchOptions{})
	require.NoError(t, err)
	translationtest.InstallGatewayAPI(j.ctx, t, c)
	world, err := os.ReadFile("testdata/ambient.yaml")
	require.NoError(t, err)
	_, err = c.Apply(j.ctx, "test", world)
	require.NoError(t, err)
	gateways := j.dyn[cluster].Resource(gvrGateways).Namespace("shop")
	gw, err := gateways.Get(j.ctx, "waypoint", metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, unstructured.SetNestedSlice(gw.Object, []any{map[string]any{"type": "Hostname", "value": "waypoint.shop.svc.cluster.local"}}, "status", "addresses"))
	_, err = gateways.UpdateStatus(j.ctx, gw, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// install runs helm install (or upgrade) of both charts, as the admin.
func (j *job) install(server, agent, verb string) {
	t := j.t
	t.Helper()
	args := func(release, chart, kubeconfig string, values []string) []string {
		a := []string{verb, release, chart, "--namespace", namespace, "--kubeconfig", kubeconfig}
		if verb == "install" {
			a = append(a, "--create-namespace")
		}
		return append(a, values...)
	}
	out, err := j.h.run(args("relaymesh-server", server, j.mgmt.Kubeconfig, j.cfg.serverValues)...)
	require.NoError(t, err, out)
	for _, name := range j.cfg.workload {
		out, err := j.h.run(args("relaymesh-agent", agent, j.env.Cluster(name).Kubeconfig, jobAgentValues)...)
		require.NoError(t, err, out)
	}
}

// uninstall runs helm uninstall of both charts, as the admin.
func (j *job) uninstall() {
	j.t.Helper()
	out, err := j.h.run("uninstall", "relaymesh-server", "--namespace", namespace, "--kubeconfig", j.mgmt.Kubeconfig)
	require.NoError(j.t, err, out)
	for _, name := range j.cfg.workload {
		out, err := j.h.run("uninstall", "relaymesh-agent", "--namespace", namespace, "--kubeconfig", j.env.Cluster(name).Kubeconfig)
		require.NoError(j.t, err, out)
	}
}

// step is one part of the job.
type step struct {
	name string
	run  func(*job) error
}

// mainJob is the job the charts' RBAC is proven by: register, bootstrap,
// discovery, translation and apply, shared trust with cacerts, a rotation,
// a renewal, a server restart, pruning, deregistration.
var mainJob = []step{
	{"server", (*job).startServer},
	{"register", (*job).register},
	{"discovery", (*job).discovery},
	{"debug", (*job).debug},
	{"translation", (*job).translation},
	{"trust", (*job).trust},
	{"federation", (*job).federation},
	{"rotation", (*job).rotation},
	{"renewal", (*job).renewal},
	{"restart", (*job).restart},
	{"prune", (*job).prune},
	{"deregister", (*job).deregister},
}

// run runs steps in order; it returns the name of the first step that
// failed and its error (in failFast mode; otherwise a failure fails the
// test).
func (j *job) run(steps []step) (string, error) {
	for _, s := range steps {
		start := time.Now()
		err := s.run(j)
		j.steps = append(j.steps, stepWindow{s.name, start, time.Now()})
		if err != nil {
			if !j.cfg.failFast {
				j.t.Fatalf("step %s: %v", s.name, err)
			}
			return s.name, err
		}
		j.t.Logf("step %s: %s", s.name, time.Since(start).Round(time.Millisecond))
	}
	return "", nil
}

// stepAt names the step that was running at time at.
func (j *job) stepAt(at time.Time) string {
	for _, s := range j.steps {
		if !at.Before(s.start) && at.Before(s.end) {
			return s.name
		}
	}
	return "setup"
}

// audit reads every cluster's audit log.
func (j *job) audit() []request {
	var all []request
	for _, c := range j.env.Clusters() {
		reqs, err := readAudit(c.AuditLog)
		require.NoError(j.t, err)
		all = append(all, reqs...)
	}
	slices.SortFunc(all, func(a, b request) int { return a.at.Compare(b.at) })
	return all
}

// denied returns the denied requests of the charts' accounts so far.
func (j *job) denied() []request {
	var out []request
	for _, r := range j.audit() {
		if r.denied() && strings.HasPrefix(r.user, "system:serviceaccount:"+namespace+":") {
			out = append(out, r)
		}
	}
	return out
}

// wait polls cond until it holds. It fails when a process of the job
// exited, after timeout, and, in failFast mode, once a request was denied
// more than grace ago (and more than grace after the wait began).
func (j *job) wait(what string, timeout time.Duration, cond func() (bool, string)) error {
	return j.waitAtLeast(what, 0, timeout, cond)
}

// waitAtLeast is wait for a condition that takes up to expect in a passing
// job: in failFast mode it fails only expect plus grace after the wait
// began.
func (j *job) waitAtLeast(what string, expect, timeout time.Duration, cond func() (bool, string)) error {
	start := time.Now()
	var last string
	lastAudit := time.Time{}
	for {
		ok, msg := cond()
		if ok {
			return nil
		}
		last = msg
		if err := j.exited(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		now := time.Now()
		if now.Sub(start) > timeout {
			return fmt.Errorf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
		}
		if j.cfg.failFast && now.Sub(lastAudit) > 500*time.Millisecond {
			lastAudit = now
			j.mu.Lock()
			if j.denial.IsZero() {
				if d := j.denied(); len(d) > 0 {
					j.denial = d[0].at
				}
			}
			denial := j.denial
			j.mu.Unlock()
			if !denial.IsZero() && now.Sub(denial) > grace && now.Sub(start) > expect+grace {
				return fmt.Errorf("%s not reached %s after a request was denied (last: %s)", what, grace, last)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// exited reports a process of the job that ended by itself.
func (j *job) exited() error {
	procs := []*localcluster.Process{j.server}
	for _, ps := range j.agents {
		procs = append(procs, ps...)
	}
	for _, p := range procs {
		if p == nil {
			continue
		}
		if done, err := p.Exited(); done {
			b, _ := os.ReadFile(p.LogPath())
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			return fmt.Errorf("%s exited (%v): %s", filepath.Base(p.LogPath()), err, lines[len(lines)-1])
		}
	}
	return nil
}

// serverCommand is the server's command line from the installed release's
// Deployment, with what only a pod has replaced by local equivalents:
// loopback listeners (each on a private loopback address, which the
// certificate names instead of the chart's serverIPs), a file for the
// audit log, the webhook called by URL (no Service routes here), and a
// kubeconfig holding a TokenRequest token of the chart's ServiceAccount.
func (j *job) serverCommand() []string {
	t := j.t
	objs, err := j.h.manifest(j.mgmt.Kubeconfig, "relaymesh-server", namespace)
	require.NoError(t, err)
	kubeconfig := filepath.Join(j.dir, "server-sa.kubeconfig")
	serviceAccountKubeconfig(t, j.mgmt, namespace, serverAccount, kubeconfig)
	args := replaceArgs(t, containerArgs(t, objs), map[string]string{
		"--listen=":            "--listen=" + j.relayAddr,
		"--server-ips=":        "--server-ips=" + e2e.Host(j.relayAddr),
		"--metrics-listen=":    "--metrics-listen=" + j.opsAddr,
		"--audit-log=":         "--audit-log=" + filepath.Join(j.dir, "relaymesh-audit.log"),
		"--webhook-listen=":    "--webhook-listen=" + j.webhookAddr,
		"--webhook-service=":   "--webhook-url=https://" + j.webhookAddr + "/validate",
		"--webhook-client-ca=": "--webhook-client-ca=" + j.mgmt.WebhookClientCA,
		"--dashboard-listen=":  "--dashboard-listen=127.0.0.1:0",
	})
	// The metrics port serves TLS (the chart's default) with a relay-CA
	// certificate that must name the address it is reached at here.
	return append(args, "--kubeconfig="+kubeconfig, "--metrics-ips="+e2e.Host(j.opsAddr))
}

// agentCommand is an agent replica's command line, from the installed
// release's Deployment, the same way.
func (j *job) agentCommand(cluster string, replica int, health string) []string {
	t := j.t
	c := j.env.Cluster(cluster)
	objs, err := j.h.manifest(c.Kubeconfig, "relaymesh-agent", namespace)
	require.NoError(t, err)
	kubeconfig := j.agentKubeconfig(cluster, replica)
	serviceAccountKubeconfig(t, c, namespace, agentAccount, kubeconfig)
	args := replaceArgs(t, containerArgs(t, objs), map[string]string{
		"--health-listen=":  "--health-listen=" + health,
		"--metrics-listen=": "--metrics-listen=" + e2e.Addr(t),
		"--identity=":       fmt.Sprintf("--identity=%s-agent-%d", cluster, replica),
	})
	return append(args, "--kubeconfig="+kubeconfig)
}

// agentKubeconfig is the service-account kubeconfig of one agent replica:
// a file per replica, since a replica reads its kubeconfig while the next
// one's is written.
func (j *job) agentKubeconfig(cluster string, replica int) string {
	return filepath.Join(j.dir, fmt.Sprintf("%s-agent-%d-sa.kubeconfig", cluster, replica))
}

// start runs the relaymesh binary as a process. With listFallback its
// informers list and then watch (KUBE_FEATURE_WatchListClient=false), as
// client-go does against API servers without streaming lists or when a
// streaming list fails; otherwise they stream the initial list in a watch.
func (j *job) start(name string, listFallback bool, args ...string) *localcluster.Process {
	if listFallback {
		return e2e.Start(j.t, "/usr/bin/env", j.dir, name, append([]string{"KUBE_FEATURE_WatchListClient=false", j.bin}, args...)...)
	}
	return e2e.Start(j.t, j.bin, j.dir, name, args...)
}

func (j *job) startServer() error {
	j.serverArgs = j.serverCommand()
	// The server restarted by the job lists the way older API servers need.
	j.server = j.start(fmt.Sprintf("server-%d", len(j.steps)), len(j.steps) > 0, j.serverArgs...)
	return j.wait("the server healthy", 60*time.Second, func() (bool, string) {
		code, err := e2e.GetJSON("https://"+j.opsAddr+"/healthz", nil)
		return err == nil && code == 200, fmt.Sprint(code, err)
	})
}

// startAgents starts the agent replicas of a cluster (two in the first
// workload cluster: a leader and a standby).
func (j *job) startAgents(cluster string) {
	replicas := 1
	if cluster == j.cfg.workload[0] {
		replicas = 2
	}
	j.agents[cluster], j.health[cluster] = nil, nil
	for i := range replicas {
		health := e2e.Addr(j.t)
		// The last cluster's agents list the way older API servers need.
		p := j.start(fmt.Sprintf("agent-%s-%d-%d", cluster, i, len(j.steps)), cluster == j.cfg.workload[len(j.cfg.workload)-1], j.agentCommand(cluster, i, health)...)
		j.agents[cluster] = append(j.agents[cluster], p)
		j.health[cluster] = append(j.health[cluster], health)
	}
}

// connected waits until a replica of each workload cluster leads and holds
// a session, and the server recorded the cluster as connected.
func (j *job) connected() error {
	for _, name := range j.cfg.workload {
		err := j.wait(name+"'s agent connected", 60*time.Second, func() (bool, string) {
			var leading []string
			for _, h := range j.health[name] {
				var st struct {
					OK     bool `json:"ok"`
					Status struct {
						Leader  bool `json:"leader"`
						Session struct {
							Connected bool `json:"connected"`
						} `json:"session"`
					} `json:"status"`
				}
				code, err := e2e.GetJSON("http://"+h+"/readyz", &st)
				if err == nil && code == 200 && st.Status.Leader && st.Status.Session.Connected {
					leading = append(leading, h)
				}
			}
			kc, err := j.mgmtDyn.Resource(gvrClusters).Namespace(namespace).Get(j.ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			connected, _, _ := unstructured.NestedBool(kc.Object, "status", "connected")
			return len(leading) == 1 && connected, fmt.Sprintf("leading+connected replicas %v, status.connected %v", leading, connected)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (j *job) register() error {
	for _, name := range j.cfg.workload {
		out, err := e2e.Run(j.t, j.bin, "cluster", "register", name, "--mgmt-kubeconfig", j.mgmt.Kubeconfig,
			"--remote-kubeconfig", j.env.Cluster(name).Kubeconfig, "--server-address", j.relayAddr)
		if err != nil {
			return fmt.Errorf("register %s: %w: %s", name, err, out)
		}
		j.startAgents(name)
	}
	if err := j.connected(); err != nil {
		return err
	}
	for _, name := range j.cfg.workload {
		serial, err := j.clientSerial(name)
		if err != nil {
			return err
		}
		j.serials[name] = serial
	}
	return nil
}

// clientSerial is the serial of the agent certificate in a workload
// cluster's relay-client-tls-secret.
func (j *job) clientSerial(cluster string) (string, error) {
	s, err := j.kube[cluster].CoreV1().Secrets(namespace).Get(j.ctx, "relay-client-tls-secret", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	b, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if b == nil {
		return "", errors.New("relay-client-tls-secret: no certificate")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return "", err
	}
	return c.SerialNumber.Text(16), nil
}

// count counts the objects of gvr in namespace ns of a cluster's dynamic
// client whose labels match selector.
func (j *job) count(d dynamic.Interface, gvr schema.GroupVersionResource, ns, selector string) (int, error) {
	l, err := d.Resource(gvr).Namespace(ns).List(j.ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return 0, err
	}
	return len(l.Items), nil
}

// discovery waits for both clusters' meshes, workloads and destinations
// in the management cluster, then changes istiod's pod labels, a
// workload's pod labels and a Service's ports in the first cluster and
// waits for the server to update one object of each kind.
func (j *job) discovery() error {
	err := j.wait("both clusters' meshes, workloads and destinations in mgmt", 30*time.Second, func() (bool, string) {
		var got []string
		ok := true
		for _, name := range j.cfg.workload {
			for _, gvr := range []schema.GroupVersionResource{gvrMeshes, gvrWorkloads, gvrDestinations} {
				n, err := j.count(j.mgmtDyn, gvr, namespace, "relaymesh.io/cluster="+name)
				if err != nil {
					return false, err.Error()
				}
				ok = ok && n > 0
				got = append(got, fmt.Sprintf("%s %s=%d", name, gvr.Resource, n))
			}
		}
		return ok, strings.Join(got, ", ")
	})
	if err != nil {
		return err
	}
	cluster := j.cfg.workload[0]
	versions := func(gvr schema.GroupVersionResource) (map[string]string, error) {
		l, err := j.mgmtDyn.Resource(gvr).Namespace(namespace).List(j.ctx, metav1.ListOptions{LabelSelector: "relaymesh.io/cluster=" + cluster})
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		for _, o := range l.Items {
			out[string(o.GetUID())] = o.GetResourceVersion()
		}
		return out, nil
	}
	before := map[schema.GroupVersionResource]map[string]string{}
	for _, gvr := range []schema.GroupVersionResource{gvrMeshes, gvrWorkloads, gvrDestinations} {
		if before[gvr], err = versions(gvr); err != nil {
			return err
		}
	}
	kube := j.kube[cluster]
	label := []byte(`{"spec":{"template":{"metadata":{"labels":{"relaymesh.io/test-changed":"1"}}}}}`)
	if _, err := kube.AppsV1().Deployments("istio-system").Patch(j.ctx, "istiod", types.StrategicMergePatchType, label, metav1.PatchOptions{}); err != nil {
		return err
	}
	if _, err := kube.AppsV1().Deployments("bookinfo").Patch(j.ctx, "productpage-v1", types.StrategicMergePatchType, label, metav1.PatchOptions{}); err != nil {
		return err
	}
	if _, err := kube.CoreV1().Services("bookinfo").Patch(j.ctx, "reviews", types.StrategicMergePatchType,
		[]byte(`{"spec":{"ports":[{"name":"grpc","port":9090}]}}`), metav1.PatchOptions{}); err != nil {
		return err
	}
	return j.wait("a Mesh, a Workload and a Destination updated", 30*time.Second, func() (bool, string) {
		var pending []string
		for gvr, was := range before {
			now, err := versions(gvr)
			if err != nil {
				return false, err.Error()
			}
			updated := false
			for uid, rv := range now {
				updated = updated || (was[uid] != "" && was[uid] != rv)
			}
			if !updated {
				pending = append(pending, gvr.Resource)
			}
		}
		return len(pending) == 0, fmt.Sprint("not updated: ", pending)
	})
}

// debug reads /debug/snapshots/input with the token of a user allowed to
// (the server asks the API server: TokenReview, SubjectAccessReview).
func (j *job) debug() error {
	get := e2e.DebugReader(j.t, j.mgmt, "https://"+j.opsAddr)
	return j.wait("/debug/snapshots/input for an authorized reader", 30*time.Second, func() (bool, string) {
		code, body, err := get("/debug/snapshots/input")
		return err == nil && code == 200 && strings.Contains(string(body), j.cfg.workload[0]), fmt.Sprint(code, " ", err)
	})
}

// userObjects are the job's VirtualMesh, policies and VirtualDestination.
func (j *job) userObjects() []byte {
	var all []string
	for _, f := range []string{"demo/virtualmesh.yaml", "demo/policies.yaml"} {
		b, err := examples.Demo.ReadFile(f)
		require.NoError(j.t, err)
		all = append(all, string(b))
	}
	b, err := os.ReadFile("testdata/job.yaml")
	require.NoError(j.t, err)
	return []byte(strings.Join(append(all, string(b)), "\n---\n"))
}

func (j *job) translation() error {
	// The server (its Lease holder) registers the admission webhook: the
	// apiserver then refuses what the rules refuse. A dry run stores nothing.
	everyone := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": "AccessPolicy",
		"metadata": map[string]any{"name": "everyone", "namespace": namespace}, "spec": map[string]any{},
	}}
	if err := j.wait("the admission webhook refuses an allow-all AccessPolicy", 30*time.Second, func() (bool, string) {
		_, err := j.mgmtDyn.Resource(gvrAccess).Namespace(namespace).Create(j.ctx, everyone, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "denied the request"), fmt.Sprint(err)
	}); err != nil {
		return err
	}
	if _, err := j.mgmt.Apply(j.ctx, "test", j.userObjects()); err != nil {
		return fmt.Errorf("apply the VirtualMesh and policies (the server's admission webhook judges them): %w", err)
	}
	// Strict mTLS too, so every Istio kind the agents may write is written.
	if _, err := j.mgmtDyn.Resource(gvrVirtualMesh).Namespace(namespace).Patch(j.ctx, virtualMesh, types.MergePatchType,
		[]byte(`{"spec":{"mtls":{"strictMTLS":true}}}`), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("VirtualMesh strictMTLS (the admission webhook judges it): %w", err)
	}
	err := j.wait("every Istio kind applied by the agents", 30*time.Second, func() (bool, string) {
		var missing []string
		for _, gvr := range istioKinds {
			n := 0
			for _, name := range j.cfg.workload {
				c, err := j.count(j.dyn[name], gvr, "", outputs.OwnerLabel+"=relaymesh-agent")
				if err != nil {
					return false, err.Error()
				}
				n += c
			}
			if n == 0 {
				missing = append(missing, gvr.Resource)
			}
		}
		for _, gvr := range routeKinds {
			n, err := j.count(j.dyn[j.ambientCluster()], gvr, "shop", outputs.OwnerLabel+"=relaymesh-agent")
			if err != nil {
				return false, err.Error()
			}
			if n == 0 {
				missing = append(missing, gvr.Resource)
			}
		}
		_, err := j.dyn[j.cfg.workload[0]].Resource(istioKinds[0]).Namespace("bookinfo").Get(j.ctx, "relaymesh-reviews", metav1.GetOptions{})
		return len(missing) == 0 && err == nil, fmt.Sprint("missing ", missing, " ", err)
	})
	if err != nil {
		return err
	}
	return j.wait("statuses of every user object, applied", 30*time.Second, func() (bool, string) {
		var states []string
		ok := true
		for _, gvr := range []schema.GroupVersionResource{gvrVirtualMesh, gvrTraffic, gvrAccess, gvrVirtualDest} {
			l, err := j.mgmtDyn.Resource(gvr).Namespace(namespace).List(j.ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, o := range l.Items {
				state, _, _ := unstructured.NestedString(o.Object, "status", "state")
				clusters, _, _ := unstructured.NestedSlice(o.Object, "status", "clusters")
				applied := strings.Contains(fmt.Sprint(clusters), "state:Applied")
				ok = ok && state != "" && state != "Invalid" && applied
				states = append(states, fmt.Sprintf("%s=%s/applied:%v", o.GetKind(), state, applied))
			}
		}
		// The demo's four objects and the ambient part's three.
		return ok && len(states) == 7, strings.Join(states, ",")
	})
}

// cacertsRoot is the root-cert.pem of a workload cluster's cacerts.
func (j *job) cacertsRoot(cluster string) ([]byte, error) {
	s, err := j.kube[cluster].CoreV1().Secrets("istio-system").Get(j.ctx, "cacerts", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return s.Data["root-cert.pem"], nil
}

func (j *job) trust() error {
	return j.wait("cacerts with one shared root in every cluster", 30*time.Second, func() (bool, string) {
		var first []byte
		for _, name := range j.cfg.workload {
			root, err := j.cacertsRoot(name)
			if err != nil {
				return false, name + ": " + err.Error()
			}
			if first != nil && string(first) != string(root) {
				return false, "different roots"
			}
			first = root
			j.roots[name] = root
		}
		return true, ""
	})
}

// federation imports a foreign SPIFFE trust domain: the Lease holder
// fetches the bundle a FederatedTrustDomain names (an https_web endpoint
// in this process) and writes the accepted roots into its status.
func (j *job) federation() error {
	root, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "foreign"})
	require.NoError(j.t, err)
	b := spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("foreign.example"), []*x509.Certificate{root.Cert})
	b.SetSequenceNumber(1)
	doc, err := b.Marshal()
	require.NoError(j.t, err)
	peer := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(doc) }))
	j.t.Cleanup(peer.Close)
	peerRoots := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: peer.Certificate().Raw})
	if _, err := j.mgmt.Apply(j.ctx, "test", []byte(fmt.Sprintf(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: FederatedTrustDomain
metadata: {name: foreign, namespace: %s}
spec: {trustDomain: foreign.example, bundleEndpointURL: %q, profile: https_web, webRootsPEM: %q}
`, namespace, peer.URL+"/bundle", peerRoots))); err != nil {
		return fmt.Errorf("apply a FederatedTrustDomain: %w", err)
	}
	want := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw}))
	return j.wait("the foreign bundle accepted into the FederatedTrustDomain's status", 30*time.Second, func() (bool, string) {
		u, err := j.mgmtDyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(namespace).Get(j.ctx, "foreign", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		state, _, _ := unstructured.NestedString(u.Object, "status", "state")
		got, _, _ := unstructured.NestedString(u.Object, "status", "bundlePEM")
		msg, _, _ := unstructured.NestedString(u.Object, "status", "error")
		return state == "Current" && got == want, state + " " + msg
	})
}

// rotationState is the VirtualMesh's status.rotation.
func (j *job) rotationState() (phase string, step int64, awaiting bool, err error) {
	vm, err := j.mgmtDyn.Resource(gvrVirtualMesh).Namespace(namespace).Get(j.ctx, virtualMesh, metav1.GetOptions{})
	if err != nil {
		return "", 0, false, err
	}
	phase, _, _ = unstructured.NestedString(vm.Object, "status", "rotation", "phase")
	step, _, _ = unstructured.NestedInt64(vm.Object, "status", "rotation", "step")
	awaiting, _, _ = unstructured.NestedBool(vm.Object, "status", "rotation", "awaitingContinue")
	return phase, step, awaiting, nil
}

// rotation rotates the shared root from the generated one to a root the
// user provides in a Secret, with manual verification: the rotation starts
// when the VirtualMesh names the new root, is rolled back, retried with
// `ca rotate start`, and continued after each phase until Finished; then
// every cacerts carries only the new root.
func (j *job) rotation() error {
	// The ambient part first: MultiRoot is refused while a member mesh
	// runs ambient (ztunnel trusts one root), so shop leaves ambient mode,
	// as an operator would before rotating.
	if out, err := e2e.Run(j.t, j.bin, "ca", "rotate", "start", namespace+"/"+virtualMesh, "--kubeconfig", j.mgmt.Kubeconfig); err == nil ||
		!strings.Contains(err.Error(), "MultiRoot is refused while meshes run ambient") {
		return fmt.Errorf("ca rotate start with an ambient member: want it refused, got %v: %s", err, out)
	}
	if _, err := j.kube[j.ambientCluster()].CoreV1().Namespaces().Patch(j.ctx, "shop", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"istio.io/dataplane-mode":null}}}`), metav1.PatchOptions{}); err != nil {
		return err
	}
	if err := j.wait("no member mesh running ambient", 30*time.Second, func() (bool, string) {
		list, err := j.mgmtDyn.Resource(gvrMeshes).Namespace(namespace).List(j.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, m := range list.Items {
			modes, _, _ := unstructured.NestedStringSlice(m.Object, "spec", "istio", "dataPlaneModes")
			if slices.Contains(modes, "ambient") {
				return false, m.GetName() + " runs ambient"
			}
		}
		return true, ""
	}); err != nil {
		return err
	}
	root, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: virtualMesh})
	require.NoError(j.t, err)
	key, err := pemutil.Serialize(root.Key)
	require.NoError(j.t, err)
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw})
	_, err = j.mgmtKube.CoreV1().Secrets(namespace).Create(j.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "team-root", Annotations: map[string]string{"relaymesh.io/virtualmeshes": namespace + "/" + virtualMesh}},
		Type:       corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: rootPEM, corev1.TLSPrivateKeyKey: pem.EncodeToMemory(key)}}, metav1.CreateOptions{})
	require.NoError(j.t, err)
	_, err = j.mgmtDyn.Resource(gvrVirtualMesh).Namespace(namespace).Patch(j.ctx, virtualMesh, types.MergePatchType,
		[]byte(`{"spec":{"mtls":{"rotationVerification":"Manual","shared":{"rootCA":{"generated":null,"secret":{"name":"team-root"}}}}}}`), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("point the VirtualMesh at the new root (the admission webhook judges it): %w", err)
	}
	phase := func(want string, wantStep int64) error {
		return j.wait("rotation "+want, 60*time.Second, func() (bool, string) {
			phase, step, awaiting, err := j.rotationState()
			if err != nil {
				return false, err.Error()
			}
			return phase == want && step == wantStep && (awaiting || phase == "Finished" || phase == "RolledBack"), fmt.Sprint(phase, " ", step, " awaiting ", awaiting)
		})
	}
	if err := phase("AddingNewRoot", 1); err != nil {
		return err
	}
	for _, s := range []struct {
		verb, phase string
		step        int64
	}{{"rollback", "RolledBack", 0}, {"start", "AddingNewRoot", 1}, {"continue", "PropagatingNewIntermediate", 2}, {"continue", "DeletingOldRoot", 3}, {"continue", "Finished", 3}} {
		if out, err := e2e.Run(j.t, j.bin, "ca", "rotate", s.verb, namespace+"/"+virtualMesh, "--kubeconfig", j.mgmt.Kubeconfig); err != nil {
			return fmt.Errorf("ca rotate %s: %w: %s", s.verb, err, out)
		}
		if err := phase(s.phase, s.step); err != nil {
			return err
		}
	}
	return j.wait("only the new root in every cacerts", 30*time.Second, func() (bool, string) {
		for _, name := range j.cfg.workload {
			got, err := j.cacertsRoot(name)
			if err != nil {
				return false, err.Error()
			}
			if strings.TrimSpace(string(got)) != strings.TrimSpace(string(rootPEM)) {
				return false, name + ": not (only) the new root yet"
			}
		}
		return true, ""
	})
}

// renewal waits for every agent to renew its certificate (60s, backdated a
// minute, renewed at about 2/3: within 20s) and store it in
// relay-client-tls-secret.
func (j *job) renewal() error {
	return j.waitAtLeast("every agent renewed its certificate", 20*time.Second, 60*time.Second, func() (bool, string) {
		for _, name := range j.cfg.workload {
			serial, err := j.clientSerial(name)
			if err != nil {
				return false, err.Error()
			}
			if serial == j.serials[name] {
				return false, name + " not renewed yet"
			}
		}
		return true, ""
	})
}

// restart restarts the server and every agent, as a rollout would; the
// agents reconnect with their stored certificates: no bootstrap token is
// left anywhere.
func (j *job) restart() error {
	j.stop()
	if err := j.startServer(); err != nil {
		return err
	}
	for _, name := range j.cfg.workload {
		j.startAgents(name)
	}
	if err := j.connected(); err != nil {
		return err
	}
	return j.noTokens()
}

// stop stops the server and every agent.
func (j *job) stop() {
	if j.server != nil {
		require.NoError(j.t, j.server.Stop(10*time.Second))
	}
	for _, ps := range j.agents {
		for _, p := range ps {
			require.NoError(j.t, p.Stop(10*time.Second))
		}
	}
	j.server, j.agents = nil, map[string][]*localcluster.Process{}
}

// noTokens checks that no unspent bootstrap token exists: every agent that
// is connected did it with its stored certificate. (A spent token's record
// stays for its 15-minute retry window, marked spent-at.)
func (j *job) noTokens() error {
	secrets, err := j.mgmtKube.CoreV1().Secrets(namespace).List(j.ctx, metav1.ListOptions{LabelSelector: "relaymesh.io/bootstrap-token=true"})
	if err != nil {
		return err
	}
	unspent := 0
	for _, s := range secrets.Items {
		if _, spent := s.Data["spent-at"]; !spent {
			unspent++
		}
	}
	if unspent != 0 {
		return fmt.Errorf("%d unspent bootstrap tokens in the management cluster", unspent)
	}
	for _, name := range j.cfg.workload {
		_, err := j.kube[name].CoreV1().Secrets(namespace).Get(j.ctx, "relay-identity-token-secret", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: relay-identity-token-secret: %v (want it deleted after the bootstrap)", name, err)
		}
	}
	return nil
}

// prune deletes the policies, the VirtualDestination and the VirtualMesh:
// the agents delete every Istio object they applied and every cacerts.
func (j *job) prune() error {
	for _, o := range []struct {
		gvr  schema.GroupVersionResource
		name string
	}{{gvrTraffic, "reviews-shift"}, {gvrAccess, "productpage-to-reviews"}, {gvrVirtualDest, "reviews"}, {gvrVirtualMesh, virtualMesh},
		{gvrAccess, "shop-reads"}, {gvrTraffic, "shop-reviews-timeout"}, {gvrTraffic, "shop-ratings-header"}} {
		if err := j.mgmtDyn.Resource(o.gvr).Namespace(namespace).Delete(j.ctx, o.name, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	return j.wait("no Istio object and no cacerts left", 30*time.Second, func() (bool, string) {
		var left []string
		for _, name := range j.cfg.workload {
			for _, gvr := range append(slices.Clone(istioKinds), routeKinds...) {
				if name != j.ambientCluster() && slices.Contains(routeKinds, gvr) {
					continue // Gateway API is served in the ambient cluster only
				}
				n, err := j.count(j.dyn[name], gvr, "", outputs.OwnerLabel+"=relaymesh-agent")
				if err != nil {
					return false, err.Error()
				}
				if n > 0 {
					left = append(left, fmt.Sprintf("%s: %d %s", name, n, gvr.Resource))
				}
			}
			if _, err := j.cacertsRoot(name); !apierrors.IsNotFound(err) {
				left = append(left, name+": cacerts")
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}

// deregister removes the last workload cluster: the server deletes what it
// discovered there.
func (j *job) deregister() error {
	name := j.cfg.workload[len(j.cfg.workload)-1]
	if out, err := e2e.Run(j.t, j.bin, "cluster", "deregister", name, "--mgmt-kubeconfig", j.mgmt.Kubeconfig); err != nil {
		return fmt.Errorf("deregister: %w: %s", err, out)
	}
	return j.wait("the deregistered cluster's discovered objects deleted", 30*time.Second, func() (bool, string) {
		var left []string
		for _, gvr := range []schema.GroupVersionResource{gvrMeshes, gvrWorkloads, gvrDestinations} {
			n, err := j.count(j.mgmtDyn, gvr, namespace, "relaymesh.io/cluster="+name)
			if err != nil {
				return false, err.Error()
			}
			if n > 0 {
				left = append(left, fmt.Sprintf("%d %s", n, gvr.Resource))
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}

// secretsOf returns every Secret of the namespaces, by namespace/name,
// but Helm's own release records (type helm.sh/release.v1: Helm rewrites
// them at every upgrade; they hold no key).
func secretsOf(t testing.TB, cs kubernetes.Interface, namespaces ...string) map[string]corev1.Secret {
	t.Helper()
	out := map[string]corev1.Secret{}
	for _, ns := range namespaces {
		l, err := cs.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		for _, s := range l.Items {
			if s.Type != "helm.sh/release.v1" {
				out[ns+"/"+s.Name] = s
			}
		}
	}
	return out
}

// sameSecrets asserts that every Secret of before is in after with the
// same type and data, byte for byte (and, if untouched, the same UID and
// resourceVersion), and that Helm owns none. Failures name keys, never
// their content.
func sameSecrets(t testing.TB, what string, before, after map[string]corev1.Secret, untouched bool) {
	t.Helper()
	for k, b := range before {
		a, ok := after[k]
		if !assert.True(t, ok, "%s: Secret %s is gone", what, k) {
			continue
		}
		assert.Equal(t, b.Type, a.Type, "%s: %s type", what, k)
		var differ []string
		for key := range b.Data {
			if !bytes.Equal(b.Data[key], a.Data[key]) {
				differ = append(differ, key)
			}
		}
		for key := range a.Data {
			if _, ok := b.Data[key]; !ok {
				differ = append(differ, key)
			}
		}
		assert.Empty(t, differ, "%s: %s changed in these keys", what, k)
		assert.Equal(t, b.UID, a.UID, "%s: %s was re-created", what, k)
		if untouched {
			assert.Equal(t, b.ResourceVersion, a.ResourceVersion, "%s: %s was written", what, k)
		}
		assert.NotContains(t, a.Annotations, "meta.helm.sh/release-name", "%s: %s is owned by Helm", what, k)
	}
}
