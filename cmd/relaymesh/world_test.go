package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/istiod"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// syncBuffer is a log sink several goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	f  *os.File
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.Write(p)
}

// proc is a relaymesh command running in this process (server, agent).
type proc struct {
	name   string
	cancel context.CancelFunc
	done   chan int
	log    string
}

func (p *proc) stop(t testing.TB) {
	t.Helper()
	p.cancel()
	select {
	case code := <-p.done:
		p.done <- code // for the cleanup, which waits on it too
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not stop within 60s", p.name)
	}
}

// world is a running Relaymesh: a management cluster and two workload
// clusters (local kube-apiservers), one merged kubeconfig with a context
// per cluster in $KUBECONFIG, the server and an agent per cluster running
// in this process with nothing but --context to find their cluster, and a
// real istiod per workload cluster.
type world struct {
	// root is the test the world lives as long as; t is the (sub)test
	// now running, which assertions fail.
	root       *testing.T
	t          *testing.T
	ctx        context.Context
	dir        string
	env        *localcluster.Env
	kubeconfig string
	relayAddr  string
	opsAddr    string
	serverArgs []string
	server     *proc
	agents     map[string]*proc
	// agentAddrs are each agent's metrics and health addresses.
	agentAddrs map[string][2]string
	istiods    map[string]*istiod.Istiod
	clients    map[string]kubernetes.Interface
	mgmtDyn    dynamic.Interface
}

var workloadClusters = []string{"cluster-1", "cluster-2"}

// hostIP is a non-loopback address of this machine, so the management
// apiserver's service proxy (which refuses loopback endpoints) can reach
// the server's metrics port the way it reaches a pod; "" if there is none.
func hostIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// freeAddr is a listen address no other process takes first: a port the
// kernel found free on host, or with host "" on a private loopback address
// (localcluster.ListenAddr), which a server's certificate must then name.
func freeAddr(t testing.TB, host string) string {
	t.Helper()
	if host == "" {
		a, err := localcluster.ListenAddr()
		require.NoError(t, err)
		return a
	}
	ip, err := netip.ParseAddr(host)
	require.NoError(t, err)
	a, err := localcluster.ListenAddrOn(ip)
	require.NoError(t, err)
	return a
}

// relaymesh runs a command to completion in this process.
func (w *world) relaymesh(args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	code = runWith(w.ctx, deps{stdout: &out, stderr: &errOut, now: time.Now, agentClock: time.Now}, args)
	return out.String(), errOut.String(), code
}

// mustRelaymesh runs a command that must succeed and returns its stdout.
func (w *world) mustRelaymesh(args ...string) string {
	w.t.Helper()
	out, errOut, code := w.relaymesh(args...)
	require.Equal(w.t, 0, code, "relaymesh %s:\nstdout: %s\nstderr: %s", strings.Join(args, " "), out, errOut)
	return out
}

// start runs a long-lived command (server, agent) with clock as the
// agent's clock; its log goes to dir/name.log.
func (w *world) start(name string, clock func() time.Time, args ...string) *proc {
	w.t.Helper()
	path := filepath.Join(w.dir, name+".log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(w.t, err)
	sink := &syncBuffer{f: f}
	ctx, cancel := context.WithCancel(w.ctx)
	p := &proc{name: name, cancel: cancel, done: make(chan int, 1), log: path}
	go func() {
		code := runWith(ctx, deps{stdout: sink, stderr: sink, now: time.Now, agentClock: clock}, args)
		_ = f.Close()
		p.done <- code
	}()
	w.root.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
		}
		if w.root.Failed() {
			b, _ := os.ReadFile(path)
			w.t.Logf("---- %s log (last lines) ----\n%s", name, lastLines(string(b), 40))
		}
	})
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// eventually polls cond until it holds or timeout passes (e2e.Eventually
// for the (sub)test now running).
func (w *world) eventually(timeout time.Duration, what string, cond func() (bool, string)) {
	w.t.Helper()
	e2e.Eventually(w.t, timeout, what, cond)
}

// newWorld starts everything; agent certificates live agentTTL.
func newWorld(t *testing.T, agentTTL time.Duration) *world {
	w := baseWorld(t, workloadClusters, agentTTL)
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	for _, name := range workloadClusters {
		_, err := w.env.Cluster(name).Apply(w.ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
		require.NoError(t, err)
	}
	for _, name := range workloadClusters {
		out := w.mustRelaymesh("cluster", "register", name, "--mgmt-context", "mgmt", "--remote-context", name, "--server-address", w.relayAddr)
		require.Contains(t, out, "registered cluster "+name)
		w.startAgent(name, time.Now)
	}
	for _, name := range workloadClusters {
		w.waitConnected(name, true)
	}
	vm, err := examples.Demo.ReadFile("demo/virtualmesh.yaml")
	require.NoError(t, err)
	_, err = w.env.Cluster("mgmt").Apply(w.ctx, "test", vm)
	require.NoError(t, err)
	for _, name := range workloadClusters {
		w.startIstiod(name, w.cacerts(name))
	}
	return w
}

// baseWorld starts the management cluster and the workload clusters named,
// puts a merged kubeconfig into $KUBECONFIG, runs each of before (with the
// namespace relaymesh in place) and starts the server.
func baseWorld(t *testing.T, workloads []string, agentTTL time.Duration, before ...func(*world)) *world {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &world{root: t, t: t, ctx: ctx, dir: t.TempDir(), agents: map[string]*proc{}, agentAddrs: map[string][2]string{}, istiods: map[string]*istiod.Istiod{}, clients: map[string]kubernetes.Interface{}}
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: filepath.Join(w.dir, "clusters"), Clusters: append([]string{"mgmt"}, workloads...)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	w.env = env
	var paths []string
	for _, c := range env.Clusters() {
		paths = append(paths, c.Kubeconfig)
		cs, err := c.Clientset()
		require.NoError(t, err)
		w.clients[c.Name] = cs
	}
	// One merged kubeconfig with a context per cluster: every command
	// below finds its clusters through it and --context.
	w.kubeconfig = strings.Join(paths, string(os.PathListSeparator))
	t.Setenv("KUBECONFIG", w.kubeconfig)
	mgmt := env.Cluster("mgmt")
	w.mgmtDyn, err = dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	_, err = w.clients["mgmt"].CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// The server's metrics port, behind a Service of the management
	// cluster as the chart makes it (the apiserver's service proxy is how
	// commands reach it without an address).
	ip := hostIP()
	if ip == "" {
		ip = "127.0.0.1"
	}
	w.relayAddr, w.opsAddr = freeAddr(t, ""), freeAddr(t, ip)
	if ip != "127.0.0.1" {
		w.exposeMetrics(ip)
	}
	hookAddr := freeAddr(t, "")
	relayHost, _, _ := net.SplitHostPort(w.relayAddr)
	// The metrics port serves TLS (the default) with a relay-CA
	// certificate for the address it is reached at.
	w.serverArgs = []string{"server", "--context", "mgmt", "--listen", w.relayAddr, "--metrics-listen", w.opsAddr, "--metrics-ips", ip, "--metrics-dns-names", "localhost",
		"--audit-log", filepath.Join(w.dir, "audit.log"),
		"--server-dns-names", "localhost", "--server-ips", relayHost, "--agent-cert-ttl", agentTTL.String(),
		"--webhook-listen", hookAddr, "--webhook-url", "https://" + hookAddr + "/validate", "--webhook-client-ca", mgmt.WebhookClientCA}
	for _, f := range before {
		f(w)
	}
	w.startServer()
	return w
}

// exposeMetrics makes Service relaymesh/relaymesh-server with its metrics
// port lead to the server's metrics listener.
func (w *world) exposeMetrics(ip string) {
	_, port, _ := net.SplitHostPort(w.opsAddr)
	p, _ := strconv.Atoi(port)
	cs := w.clients["mgmt"]
	_, err := cs.CoreV1().Services("relaymesh").Create(w.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-server"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "metrics", Port: 9091, TargetPort: intstr.FromInt32(int32(p))}}}}, metav1.CreateOptions{})
	require.NoError(w.t, err)
	// The proxy only goes to addresses of pods: a Pod object stands for
	// the server process (no kubelet runs it), its IP the host's.
	_, err = cs.CoreV1().ServiceAccounts("relaymesh").Create(w.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-server"}}, metav1.CreateOptions{})
	require.NoError(w.t, err)
	automount := false
	pod, err := cs.CoreV1().Pods("relaymesh").Create(w.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-server-0", Labels: map[string]string{"app.kubernetes.io/name": "relaymesh-server"}},
		Spec: corev1.PodSpec{ServiceAccountName: "relaymesh-server", AutomountServiceAccountToken: &automount, Containers: []corev1.Container{{Name: "server", Image: "relaymesh"}}}}, metav1.CreateOptions{})
	require.NoError(w.t, err)
	pod.Status.PodIP, pod.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	_, err = cs.CoreV1().Pods("relaymesh").UpdateStatus(w.ctx, pod, metav1.UpdateOptions{})
	require.NoError(w.t, err)
	ref := &corev1.ObjectReference{Kind: "Pod", Namespace: "relaymesh", Name: pod.Name}
	//lint:ignore SA1019 the apiserver's service proxy reads Endpoints (not EndpointSlices), and no controller mirrors them here
	subsets := []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: ip, TargetRef: ref}}, Ports: []corev1.EndpointPort{{Name: "metrics", Port: int32(p)}}}}
	//lint:ignore SA1019 as above
	_, err = cs.CoreV1().Endpoints("relaymesh").Create(w.ctx, &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-server"}, Subsets: subsets}, metav1.CreateOptions{})
	require.NoError(w.t, err)
}

// opsGet fetches path from the server's metrics port over HTTPS,
// verified against the relay root of the management cluster (as
// relaymesh's commands do).
func (w *world) opsGet(path string) (*http.Response, error) {
	roots, err := ca.RelayRootsPEM(w.ctx, w.clients["mgmt"], "relaymesh")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}}
	return c.Get("https://" + w.opsAddr + path)
}

func (w *world) startServer() {
	w.server = w.start("server", time.Now, w.serverArgs...)
	w.eventually(60*time.Second, "the server's /healthz", func() (bool, string) {
		resp, err := w.opsGet("/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

func (w *world) startAgent(name string, clock func() time.Time) {
	metrics, health := freeAddr(w.t, ""), freeAddr(w.t, "")
	w.agentAddrs[name] = [2]string{metrics, health}
	w.agents[name] = w.start("agent-"+name, clock, "agent", "--context", name, "--health-listen", health, "--metrics-listen", metrics)
}

func (w *world) cluster(name string) *multiclusterv1alpha1.KubernetesCluster {
	u, err := w.mgmtDyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Get(w.ctx, name, metav1.GetOptions{})
	require.NoError(w.t, err)
	var kc multiclusterv1alpha1.KubernetesCluster
	require.NoError(w.t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &kc))
	return &kc
}

func (w *world) waitConnected(name string, connected bool) {
	w.t.Helper()
	w.eventually(90*time.Second, fmt.Sprintf("%s connected=%t", name, connected), func() (bool, string) {
		kc := w.cluster(name)
		return kc.Status.Connected == connected && (!connected || kc.Status.AgentCertificate != nil), fmt.Sprintf("%+v", kc.Status)
	})
}

// cacerts waits for the cacerts Secret the agent writes for the mesh.
func (w *world) cacerts(name string) map[string][]byte {
	w.t.Helper()
	var data map[string][]byte
	w.eventually(60*time.Second, "cacerts in "+name, func() (bool, string) {
		s, err := w.clients[name].CoreV1().Secrets("istio-system").Get(w.ctx, trust.SecretName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		data = s.Data
		return true, ""
	})
	return data
}

// startIstiod (re)starts the cluster's istiod with the CA files a kubelet
// would mount, and waits until it published their root.
func (w *world) startIstiod(name string, files map[string][]byte) {
	w.t.Helper()
	if d := w.istiods[name]; d != nil {
		require.NoError(w.t, d.Stop())
	}
	d, err := istiod.Start(w.ctx, istiod.Config{Kubeconfig: w.env.Cluster(name).Kubeconfig, ClusterID: name, Dir: w.root.TempDir(), CACerts: files, TrustDomain: name + ".local"})
	require.NoError(w.t, err)
	w.istiods[name] = d
	w.root.Cleanup(func() { _ = d.Stop() })
	w.eventually(60*time.Second, "istiod of "+name+" publishing its root", func() (bool, string) {
		cm, err := w.clients[name].CoreV1().ConfigMaps("istio-system").Get(w.ctx, trust.RootCertConfigMap, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return strings.TrimSpace(cm.Data["root-cert.pem"]) == strings.TrimSpace(string(files[trust.KeyRootCert])), "a different root"
	})
}

// oldMeshCA is a CA of a mesh's own, as istiod had before the mesh joined
// a VirtualMesh: a root and an intermediate, in cacerts' four files.
func oldMeshCA(t *testing.T) map[string][]byte {
	t.Helper()
	root := catest.NewRoot(t, catest.CAOptions{Name: "old root"})
	inter := root.NewIntermediate(t, catest.CAOptions{Name: "old intermediate", PathLenZero: true})
	return map[string][]byte{
		istiod.CACertFile:    catest.CertsPEM(inter.Cert),
		istiod.CAKeyFile:     inter.KeyPEM(t),
		istiod.CertChainFile: catest.CertsPEM(inter.Cert, root.Cert),
		istiod.RootCertFile:  root.RootsPEM(),
	}
}

// in makes t the test assertions fail, until the returned function is
// called: defer w.in(t)() at the start of a subtest.
func (w *world) in(t *testing.T) func() {
	prev := w.t
	w.t = t
	return func() { w.t = prev }
}

// notFound reports whether err is a NotFound from the apiserver.
func notFound(err error) bool { return apierrors.IsNotFound(err) }
