package ha

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Metric names the tests read (docs/metrics.md).
const (
	MetricConnectedAgents = "relaymesh_relay_connected_agents"
	MetricAgentConnected  = "relaymesh_agent_relay_connected"
)

// Ports every replica uses inside its own network namespace.
const (
	RelayPort = 9900
	OpsPort   = 9091
)

// Config says what one environment runs.
type Config struct {
	// Replicas is how many replica namespaces (and Replica values) there
	// are; default 3. Replicas start with Env.Start.
	Replicas int
	// Workloads are workload clusters to run beside the management cluster,
	// for real agents.
	Workloads []string
	// Namespace of the server in the management cluster; default relaymesh.
	Namespace string
	// ServerArgs are extra flags for every replica.
	ServerArgs []string
	// Redis runs redis-server (TLS, a password) in a namespace of its own
	// and has the replicas keep full snapshots in it
	// (--snapshot-store=redis).
	Redis bool
}

// Env is one management cluster (real etcd and kube-apiserver processes),
// optional workload clusters, and N `relaymesh server` replicas sharing one
// namespace, each in its own network namespace with its own address, audit
// log and log.
type Env struct {
	Bin, Dir, Namespace string
	Local               *localcluster.Env
	Mgmt                *localcluster.Cluster
	Kube                kubernetes.Interface
	Net                 *Network
	Replicas            []*Replica
	// Redis is the replicas' snapshot store, with Config.Redis.
	Redis *localcluster.Redis
	// replicaKubeconfig reaches the apiserver through the store address.
	replicaKubeconfig string
	serverArgs        []string
}

// Setup starts the clusters and the network; everything is stopped and
// removed when the test ends, passed or failed.
func Setup(t *testing.T, bin string, cfg Config) *Env {
	t.Helper()
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "relaymesh"
	}
	e := &Env{Bin: bin, Dir: t.TempDir(), Namespace: cfg.Namespace, serverArgs: cfg.ServerArgs}
	local, err := localcluster.Start(ctx, localcluster.Config{Dir: filepath.Join(e.Dir, "clusters"), Clusters: append([]string{"mgmt"}, cfg.Workloads...)})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, local.Stop()) })
	e.Local, e.Mgmt = local, local.Cluster("mgmt")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(local.Dir(), "mgmt.log"))
			t.Logf("---- management apiserver (pid %d, alive %v) log (last lines) ----\n%s", e.Mgmt.Pid(), localcluster.Alive(e.Mgmt.Pid()), tail(string(b), 30))
		}
	})
	cs, err := e.Mgmt.Clientset()
	require.NoError(t, err)
	e.Kube = cs
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.Namespace}}, metav1.CreateOptions{})
	require.NoError(t, err)

	u, err := url.Parse(e.Mgmt.URL)
	require.NoError(t, err)
	e.Net, err = NewNetwork(cfg.Replicas, u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.Net.Close(), "remove the network namespaces and links") })
	if cfg.Redis {
		require.NoError(t, e.Net.AddRedis())
		dir := filepath.Join(e.Dir, "redis")
		require.NoError(t, os.MkdirAll(dir, 0o700))
		e.Redis, err = localcluster.StartRedis(ctx, localcluster.RedisConfig{Dir: dir, Netns: e.Net.RedisNamespace(),
			Bind: []net.IP{e.Net.RedisAddr().Addr().AsSlice()}, Port: RedisPort})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = e.Redis.Stop()
			if t.Failed() {
				b, _ := os.ReadFile(e.Redis.Log())
				t.Logf("---- redis-server log (last lines) ----\n%s", tail(string(b), 20))
			}
		})
		e.serverArgs = append(e.serverArgs, "--snapshot-store=redis", "--redis-address", e.Net.RedisAddr().String(),
			"--redis-password-file", e.Redis.PasswordFile(), "--redis-ca-file", e.Redis.CAFile())
	}
	e.replicaKubeconfig = filepath.Join(e.Dir, "replica.kubeconfig")
	require.NoError(t, writeStoreKubeconfig(e.Mgmt.Kubeconfig, e.replicaKubeconfig, "https://"+e.Net.StoreAddr().String()))

	for i := range cfg.Replicas {
		r := &Replica{Index: i, Name: "replica-" + strconv.Itoa(i), IP: e.Net.ReplicaIP(i), env: e}
		r.RelayAddr = netip.AddrPortFrom(r.IP, RelayPort).String()
		r.OpsAddr = netip.AddrPortFrom(r.IP, OpsPort).String()
		r.AuditLog = filepath.Join(e.Dir, r.Name+"-audit.log")
		r.LogPath = filepath.Join(e.Dir, r.Name+".log")
		e.Replicas = append(e.Replicas, r)
		t.Cleanup(func() {
			_ = r.Stop()
			if t.Failed() {
				b, _ := os.ReadFile(r.LogPath)
				t.Logf("---- %s log (last lines) ----\n%s", r.Name, tail(string(b), 40))
			}
		})
	}
	return e
}

// writeStoreKubeconfig copies the admin kubeconfig at src to dst with the
// server at server; the apiserver's certificate names localhost, which the
// copy asks for instead of the store's address.
func writeStoreKubeconfig(src, dst, server string) error {
	cfg, err := clientcmd.LoadFromFile(src)
	if err != nil {
		return err
	}
	for _, c := range cfg.Clusters {
		c.Server = server
		c.TLSServerName = "localhost"
	}
	return clientcmd.WriteToFile(*cfg, dst)
}

// ServiceName is the DNS name every replica's serving certificate carries,
// the name of the Service in front of them (as the server chart sets it).
func (e *Env) ServiceName() string { return "relaymesh-server." + e.Namespace + ".svc" }

// Start starts the replicas idx (all when none is given) at the same
// instant and waits until each serves /healthz.
func (e *Env) Start(t *testing.T, idx ...int) {
	t.Helper()
	if len(idx) == 0 {
		for i := range e.Replicas {
			idx = append(idx, i)
		}
	}
	go1 := make(chan struct{})
	errs := make([]error, len(idx))
	var wg sync.WaitGroup
	for k, i := range idx {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-go1
			if errs[k] = e.Replicas[i].start(); errs[k] == nil {
				errs[k] = e.Replicas[i].WaitReady(90 * time.Second)
			}
		}()
	}
	close(go1)
	wg.Wait()
	for k, err := range errs {
		require.NoError(t, err, "replica %d", idx[k])
	}
}

// Replica is one `relaymesh server` process in its own network namespace.
type Replica struct {
	Index int
	// Name is replica-<Index>: its --replica-name (the Lease holder and
	// KubernetesCluster status.replica say it) and its name in logs.
	Name string
	// IP is its address; RelayAddr (gRPC) and OpsAddr (metrics, health)
	// are on it.
	IP                 netip.Addr
	RelayAddr, OpsAddr string
	// AuditLog and LogPath are its files; a restart appends to both.
	AuditLog, LogPath string

	env  *Env
	mu   sync.Mutex
	proc *localcluster.Process
}

// Args are the replica's `relaymesh server` flags.
func (r *Replica) Args() []string {
	e := r.env
	return append([]string{"server", "--kubeconfig", e.replicaKubeconfig, "--namespace", e.Namespace,
		"--listen", r.RelayAddr, "--metrics-listen", r.OpsAddr, "--metrics-ips", e2e.Host(r.OpsAddr), "--audit-log", r.AuditLog,
		"--server-dns-names", e.ServiceName(), "--server-ips", r.IP.String(), "--replica-name", r.Name}, e.serverArgs...)
}

func (r *Replica) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		if done, _ := r.proc.Exited(); !done {
			return fmt.Errorf("%s is running", r.Name)
		}
	}
	args := append([]string{"netns", "exec", r.env.Net.Namespace(r.Index), r.env.Bin}, r.Args()...)
	p, err := localcluster.StartProcess(r.Name, "ip", args, r.LogPath, false)
	if err != nil {
		return err
	}
	r.proc = p
	return nil
}

// Start starts the replica again (after Stop or Kill) and waits until it is
// ready.
func (r *Replica) Start() error {
	if err := r.start(); err != nil {
		return err
	}
	return r.WaitReady(90 * time.Second)
}

// WaitReady waits until the replica serves /healthz, or fails as soon as
// its process exits.
func (r *Replica) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		r.mu.Lock()
		p := r.proc
		r.mu.Unlock()
		if p == nil {
			return fmt.Errorf("%s was never started", r.Name)
		}
		if done, err := p.Exited(); done {
			b, _ := os.ReadFile(r.LogPath)
			return fmt.Errorf("%s exited (%v); log:\n%s", r.Name, err, tail(string(b), 20))
		}
		if code, err := e2e.GetJSON("https://"+r.OpsAddr+"/healthz", nil); err == nil && code == 200 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s (see %s)", r.Name, timeout, r.LogPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Running reports whether the replica's process is alive.
func (r *Replica) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return false
	}
	done, _ := r.proc.Exited()
	return !done
}

// Stop ends the replica with SIGTERM (SIGKILL after 10 s).
func (r *Replica) Stop() error {
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(10 * time.Second)
}

// Kill ends the replica with SIGKILL, as a crash would.
func (r *Replica) Kill() error {
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Kill()
}

// Metric sums a metric of the replica's /metrics.
func (r *Replica) Metric(name string) (float64, error) {
	return e2e.Metric("https://"+r.OpsAddr+"/metrics", name)
}

// Run runs the relaymesh binary (in the root namespace) and returns its
// standard output.
func (e *Env) Run(t testing.TB, args ...string) (string, error) {
	t.Helper()
	return e2e.Run(t, e.Bin, args...)
}

// RegisterOnly registers cluster in the management cluster alone
// (`cluster register --dry-run`): a KubernetesCluster and a token nobody
// will use; the printed bundle, which holds that token, is discarded.
func (e *Env) RegisterOnly(t testing.TB, cluster string, replica int) {
	t.Helper()
	_, err := e.Run(t, "cluster", "register", cluster, "--mgmt-kubeconfig", e.Mgmt.Kubeconfig, "--namespace", e.Namespace,
		"--server-address", e.Replicas[replica].RelayAddr, "--dry-run")
	require.NoError(t, err)
}

// MintToken mints a bootstrap token for cluster with `relaymesh token
// create`. The token is a secret: never log it.
func (e *Env) MintToken(t testing.TB, cluster string) string {
	t.Helper()
	out, err := e.Run(t, "token", "create", "--cluster", cluster, "--kubeconfig", e.Mgmt.Kubeconfig, "--namespace", e.Namespace)
	require.NoError(t, err)
	tok := strings.TrimSpace(out)
	require.NotEmpty(t, tok, "token create printed no token")
	return tok
}

// Roots returns the relay roots (PEM) from relay-root-tls-secret.
func (e *Env) Roots(t testing.TB) []byte {
	t.Helper()
	roots, err := ca.RelayRootsPEM(context.Background(), e.Kube, e.Namespace)
	require.NoError(t, err)
	return roots
}

// Agent is a `relaymesh agent` process in the root namespace.
type Agent struct {
	Name                   string
	HealthAddr, MetricsAdr string
	Proc                   *localcluster.Process
}

// StartAgent runs an agent for workload cluster (its kubeconfig, its
// registration's secrets), without leader election so that several may run
// for one cluster; args are extra flags (e.g. --server-address).
func (e *Env) StartAgent(t *testing.T, name, workload string, args ...string) *Agent {
	t.Helper()
	a := &Agent{Name: name, HealthAddr: e2e.Addr(t), MetricsAdr: e2e.Addr(t)}
	a.Proc = e2e.Start(t, e.Bin, e.Dir, name, append([]string{"agent", "--kubeconfig", e.Local.Cluster(workload).Kubeconfig,
		"--leader-elect=false", "--health-listen", a.HealthAddr, "--metrics-listen", a.MetricsAdr}, args...)...)
	return a
}

// AgentStatus is what an agent's /readyz says.
type AgentStatus struct {
	OK     bool   `json:"ok"`
	Error  string `json:"error"`
	Status struct {
		Credential struct {
			Serial string `json:"serial"`
		} `json:"credential"`
		Session struct {
			Connected bool      `json:"connected"`
			SPIFFEID  string    `json:"spiffeID"`
			Since     time.Time `json:"since"`
			// AppliedVersion is the output version the agent applied last.
			AppliedVersion uint64 `json:"appliedVersion"`
		} `json:"session"`
	} `json:"status"`
}

// Status reads the agent's /readyz.
func (a *Agent) Status() (int, AgentStatus, error) {
	var st AgentStatus
	code, err := e2e.GetJSON("http://"+a.HealthAddr+"/readyz", &st)
	return code, st, err
}

// Connected reads the agent's relaymesh_agent_relay_connected gauge.
func (a *Agent) Connected() (bool, error) {
	v, err := e2e.Metric("http://"+a.MetricsAdr+"/metrics", MetricAgentConnected)
	return v == 1, err
}

// AuditRecords reads every record of the replicas' audit logs, each with
// the index of the replica that wrote it.
func (e *Env) AuditRecords(t testing.TB) []AuditRecord {
	t.Helper()
	var out []AuditRecord
	for _, r := range e.Replicas {
		f, err := os.Open(r.AuditLog)
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var rec audit.Record
			require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), "%s", r.AuditLog)
			out = append(out, AuditRecord{Replica: r.Index, Record: rec})
		}
		require.NoError(t, sc.Err())
		f.Close()
	}
	return out
}

// AuditRecord is one audit record and the replica whose log holds it.
type AuditRecord struct {
	Replica int
	audit.Record
}

// VerifyAudit runs `relaymesh audit verify` on every replica's log.
func (e *Env) VerifyAudit(t testing.TB) {
	t.Helper()
	for _, r := range e.Replicas {
		if _, err := os.Stat(r.AuditLog); os.IsNotExist(err) {
			continue
		}
		out, err := e.Run(t, "audit", "verify", r.AuditLog)
		require.NoError(t, err, r.Name)
		assert.Contains(t, out, "records verified", r.Name)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
