// Package localcluster runs real Kubernetes control planes as local
// processes, the way envtest does: one etcd and N kube-apiservers, each with
// its own etcd prefix, loopback port, serving certificate, client CA, admin
// credential and service-account keys (so TokenRequest and TokenReview work).
// It installs Relaymesh's CRDs and Istio's CRDs and writes a kubeconfig per
// cluster.
//
// There is no kubelet, scheduler or controller-manager: Pods, Deployments and
// Services exist as API objects only. That is what Relaymesh's agents and
// server read and write, so tests exercise the real API server's validation,
// admission, watch and server-side apply.
//
// Binaries come from `make tools` (.cache/bin). Attached environments die
// with the process that started them; detached ones (the `up` command) live
// until `down`.
package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// MaxClusters bounds one environment; each kube-apiserver takes ~300 MiB.
const MaxClusters = 16

// stateFile records a detached environment for `down`.
const stateFile = "localcluster.json"

var clusterName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Config says what to start.
type Config struct {
	// Dir holds data, certificates, logs and kubeconfigs. Required.
	Dir string
	// Clusters are the cluster names, DNS labels, unique, 1..MaxClusters.
	Clusters []string
	// BinDir holds etcd and kube-apiserver; default: .cache/bin of the
	// repository that contains the working directory.
	BinDir string
	// Detach lets the processes outlive this Go process (for `up`).
	Detach bool
	// ReadyTimeout bounds the wait for each API server; default 90s.
	ReadyTimeout time.Duration
	// AuditPolicy, if set, is the path of an audit policy file: each API
	// server then writes JSON audit events to Cluster.AuditLog.
	AuditPolicy string
	// Profiling serves the API servers' /debug/pprof (to admins), for
	// harnesses that profile them; off by default.
	Profiling bool
}

// Validate reports every problem with the config at once.
func (c Config) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("dir: required"))
	}
	if err := ValidateClusterNames(c.Clusters); err != nil {
		errs = append(errs, fmt.Errorf("clusters: %w", err))
	}
	if c.ReadyTimeout < 0 {
		errs = append(errs, errors.New("readyTimeout: must not be negative"))
	}
	return errors.Join(errs...)
}

// ValidateClusterNames checks a list of cluster names: 1..MaxClusters unique
// DNS labels.
func ValidateClusterNames(names []string) error {
	if len(names) == 0 {
		return errors.New("at least one cluster is required")
	}
	if len(names) > MaxClusters {
		return fmt.Errorf("%d clusters requested, at most %d", len(names), MaxClusters)
	}
	seen := map[string]bool{}
	var errs []error
	for i, n := range names {
		switch {
		case len(n) > 63 || !clusterName.MatchString(n):
			errs = append(errs, fmt.Errorf("[%d] %q is not a DNS label (a-z, 0-9, '-', at most 63)", i, n))
		case seen[n]:
			errs = append(errs, fmt.Errorf("[%d] %q is listed twice", i, n))
		}
		seen[n] = true
	}
	return errors.Join(errs...)
}

// ParseClusterNames splits a comma-separated --clusters value and validates it.
func ParseClusterNames(s string) ([]string, error) {
	if len(s) > MaxClusters*64 {
		return nil, fmt.Errorf("--clusters is %d bytes long, at most %d", len(s), MaxClusters*64)
	}
	var names []string
	for _, n := range strings.Split(s, ",") {
		names = append(names, strings.TrimSpace(n))
	}
	if err := ValidateClusterNames(names); err != nil {
		return nil, err
	}
	return names, nil
}

// Env is a running set of local clusters.
type Env struct {
	dir string
	// ip is the loopback address etcd and every API server listen on
	// (serveAddr).
	ip       netip.Addr
	etcd     *Process
	clusters []*Cluster
	mu       sync.Mutex
	stopped  bool
}

// Cluster is one running kube-apiserver.
type Cluster struct {
	// Name of the cluster.
	Name string
	// URL of its API server, https on loopback.
	URL string
	// Kubeconfig is the path of an admin kubeconfig for it.
	Kubeconfig string
	// AuditLog is the path of its audit log (JSON lines), when
	// Config.AuditPolicy is set.
	AuditLog string
	// WebhookClientCA is the path of the PEM CA that issued the client
	// certificate the API server presents to admission webhooks (CN
	// kube-apiserver, configured through --admission-control-config-file),
	// for webhooks that authenticate their caller.
	WebhookClientCA string

	config *rest.Config
	proc   *Process
}

// RESTConfig returns a copy of the admin client config.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.config) }

// Clientset returns a typed admin client.
func (c *Cluster) Clientset() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(c.RESTConfig())
}

// Pid is the kube-apiserver's process id.
func (c *Cluster) Pid() int { return c.proc.cmd.Process.Pid }

// Dir is where the environment keeps its files.
func (e *Env) Dir() string { return e.dir }

// Clusters returns the clusters in the order they were asked for.
func (e *Env) Clusters() []*Cluster { return append([]*Cluster(nil), e.clusters...) }

// Cluster returns the named cluster, or nil.
func (e *Env) Cluster(name string) *Cluster {
	for _, c := range e.clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Pids are the process ids of etcd and every kube-apiserver.
func (e *Env) Pids() []int {
	pids := []int{e.etcd.cmd.Process.Pid}
	for _, c := range e.clusters {
		pids = append(pids, c.Pid())
	}
	return pids
}

// Start brings up etcd and one kube-apiserver per cluster, waits until each
// is ready and has the CRDs installed. On any error everything started so far
// is stopped again.
func Start(ctx context.Context, cfg Config) (env *Env, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("localcluster config: %w", err)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 90 * time.Second
	}
	if cfg.BinDir == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		cfg.BinDir = filepath.Join(root, ".cache", "bin")
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run `make tools` first: %w", b, cfg.BinDir, err)
		}
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	crds, err := loadCRDs()
	if err != nil {
		return nil, err
	}

	ip, err := serveAddr()
	if err != nil {
		return nil, err
	}
	env = &Env{dir: dir, ip: ip}
	defer func() {
		if err != nil {
			_ = env.Stop()
			env = nil
		}
	}()
	etcd, err := env.startEtcd(cfg)
	if err != nil {
		return env, err
	}
	// A failed seed leaves the CRDs to installCRDs, as for the first start
	// (said on stderr: the start is only slower).
	seeded, seedErr := seedCRDs(ctx, etcd, cfg.BinDir, cfg.Clusters)
	if seedErr != nil {
		fmt.Fprintf(os.Stderr, "localcluster: the CRDs are created through the API servers: %v\n", seedErr)
	}

	env.clusters = make([]*Cluster, len(cfg.Clusters))
	errs := make([]error, len(cfg.Clusters))
	var wg sync.WaitGroup
	for i, name := range cfg.Clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := env.startCluster(ctx, cfg, name, etcd)
			if err != nil {
				errs[i] = fmt.Errorf("cluster %s: %w", name, err)
				return
			}
			env.mu.Lock()
			env.clusters[i] = c
			env.mu.Unlock()
			if err := installCRDs(ctx, c.config, crds, seeded); err != nil {
				errs[i] = fmt.Errorf("cluster %s: %w", name, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return env, err
	}
	if !seeded {
		// Not kept: the next start creates them through its API servers.
		if keepErr := keepCRDs(ctx, etcd, cfg.BinDir, cfg.Clusters[0], len(crds)); keepErr != nil {
			fmt.Fprintf(os.Stderr, "localcluster: the CRDs are not kept for the next start: %v\n", keepErr)
		}
	}
	if cfg.Detach {
		if err := env.writeState(); err != nil {
			return env, err
		}
	}
	return env, nil
}

// etcdTLS is what an API server needs to reach etcd.
type etcdTLS struct {
	url, caFile, certFile, keyFile string
}

func (e *Env) startEtcd(cfg Config) (*etcdTLS, error) {
	dir := filepath.Join(e.dir, "etcd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := newCA("etcd-ca")
	if err != nil {
		return nil, err
	}
	serving, err := newServing(ca, "etcd", e.ip)
	if err != nil {
		return nil, err
	}
	client, err := newClient(ca, "kube-apiserver")
	if err != nil {
		return nil, err
	}
	caFile, _, err := ca.write(dir, "ca")
	if err != nil {
		return nil, err
	}
	servCert, servKey, err := serving.write(dir, "server")
	if err != nil {
		return nil, err
	}
	cliCert, cliKey, err := client.write(dir, "client")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		clientAddr, err := ListenAddrOn(e.ip)
		if err != nil {
			return nil, err
		}
		peerAddr, err := ListenAddrOn(e.ip)
		if err != nil {
			return nil, err
		}
		clientURL, peerURL := "https://"+clientAddr, "http://"+peerAddr
		args := []string{
			"--name=default",
			"--data-dir=" + filepath.Join(dir, "data"),
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=default=" + peerURL,
			"--cert-file=" + servCert,
			"--key-file=" + servKey,
			"--client-cert-auth",
			"--trusted-ca-file=" + caFile,
			"--unsafe-no-fsync",
			"--log-level=warn",
		}
		p, err := StartProcess("etcd", filepath.Join(cfg.BinDir, "etcd"), args, filepath.Join(e.dir, "etcd.log"), cfg.Detach)
		if err != nil {
			return nil, err
		}
		e.etcd = p
		tlsCfg := &etcdTLS{url: clientURL, caFile: caFile, certFile: cliCert, keyFile: cliKey}
		if lastErr = waitPort(p, clientAddr, 30*time.Second); lastErr == nil {
			return tlsCfg, nil
		}
		_ = p.Stop(5 * time.Second)
		_ = os.RemoveAll(filepath.Join(dir, "data"))
	}
	return nil, fmt.Errorf("etcd did not start (see %s): %w", filepath.Join(e.dir, "etcd.log"), lastErr)
}

func (e *Env) startCluster(ctx context.Context, cfg Config, name string, etcd *etcdTLS) (*Cluster, error) {
	dir := filepath.Join(e.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := newCA(name + "-ca")
	if err != nil {
		return nil, err
	}
	serving, err := newServing(ca, "kube-apiserver", e.ip)
	if err != nil {
		return nil, err
	}
	admin, err := newClient(ca, "relaymesh-admin", "system:masters")
	if err != nil {
		return nil, err
	}
	caFile, _, err := ca.write(dir, "ca")
	if err != nil {
		return nil, err
	}
	servCert, servKey, err := serving.write(dir, "apiserver")
	if err != nil {
		return nil, err
	}
	saPub, saKey, err := writeServiceAccountKeys(dir)
	if err != nil {
		return nil, err
	}
	admissionConfig, webhookCA, err := writeWebhookClient(dir, name)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(e.dir, name+".log")
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		addr, err := ListenAddrOn(e.ip)
		if err != nil {
			return nil, err
		}
		port := netip.MustParseAddrPort(addr).Port()
		args := []string{
			"--etcd-servers=" + etcd.url,
			"--etcd-cafile=" + etcd.caFile,
			"--etcd-certfile=" + etcd.certFile,
			"--etcd-keyfile=" + etcd.keyFile,
			"--etcd-prefix=" + etcdPrefix(name),
			"--bind-address=" + e.ip.String(),
			"--advertise-address=" + e.ip.String(),
			"--secure-port=" + strconv.Itoa(int(port)),
			"--tls-cert-file=" + servCert,
			"--tls-private-key-file=" + servKey,
			"--cert-dir=" + dir,
			"--client-ca-file=" + caFile,
			"--anonymous-auth=false",
			"--authorization-mode=RBAC",
			"--service-account-key-file=" + saPub,
			"--service-account-signing-key-file=" + saKey,
			"--service-account-issuer=https://kubernetes.default.svc." + name,
			"--api-audiences=https://kubernetes.default.svc." + name + ",istio-ca",
			"--service-cluster-ip-range=10.96.0.0/16",
			"--allow-privileged=false",
			"--enable-priority-and-fairness=false",
			"--admission-control-config-file=" + admissionConfig,
			"--profiling=" + strconv.FormatBool(cfg.Profiling),
			"--v=1",
		}
		auditLog := ""
		if cfg.AuditPolicy != "" {
			auditLog = filepath.Join(e.dir, name+".audit.log")
			args = append(args, "--audit-policy-file="+cfg.AuditPolicy, "--audit-log-path="+auditLog, "--audit-log-format=json", "--audit-log-maxbackup=0")
		}
		logStart := LogSize(logPath)
		p, err := StartProcess("kube-apiserver "+name, filepath.Join(cfg.BinDir, "kube-apiserver"), args, logPath, cfg.Detach)
		if err != nil {
			return nil, err
		}
		c := &Cluster{Name: name, URL: "https://" + addr, WebhookClientCA: webhookCA, proc: p}
		c.AuditLog = auditLog
		c.config = &rest.Config{
			Host: c.URL,
			TLSClientConfig: rest.TLSClientConfig{
				CAData:   ca.certPEM,
				CertData: admin.certPEM,
				KeyData:  admin.keyPEM,
			},
			QPS:   200,
			Burst: 400,
		}
		if lastErr = waitReady(ctx, c, cfg.ReadyTimeout); lastErr == nil {
			c.Kubeconfig = filepath.Join(e.dir, name+".kubeconfig")
			if err := writeKubeconfig(c.Kubeconfig, name, c.URL, ca.certPEM, admin); err != nil {
				return c, err
			}
			return c, nil
		}
		_ = p.Stop(5 * time.Second)
		if !PortTaken(logPath, logStart) {
			break
		}
	}
	return nil, fmt.Errorf("kube-apiserver not ready (see %s): %w", logPath, lastErr)
}

// writeWebhookClient gives the API server a client certificate for calling
// admission webhooks, from a CA of its own (a webhook that trusts it trusts
// nothing else of the cluster), and the admission configuration that makes
// it present the certificate to every webhook. It returns the paths of the
// configuration and of the CA.
func writeWebhookClient(dir, name string) (admissionConfig, caFile string, err error) {
	ca, err := newCA(name + "-webhook-client-ca")
	if err != nil {
		return "", "", err
	}
	client, err := newClient(ca, "kube-apiserver")
	if err != nil {
		return "", "", err
	}
	if caFile, _, err = ca.write(dir, "webhook-client-ca"); err != nil {
		return "", "", err
	}
	certFile, keyFile, err := client.write(dir, "webhook-client")
	if err != nil {
		return "", "", err
	}
	kubeconfig := filepath.Join(dir, "webhook-client.kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: %q
    client-key: %q
`, certFile, keyFile), 0o600); err != nil {
		return "", "", err
	}
	admissionConfig = filepath.Join(dir, "admission.yaml")
	var b strings.Builder
	b.WriteString("apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n")
	for _, plugin := range []string{"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"} {
		fmt.Fprintf(&b, "- name: %s\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: %q\n", plugin, kubeconfig)
	}
	return admissionConfig, caFile, os.WriteFile(admissionConfig, []byte(b.String()), 0o600)
}

// PortTaken reports whether a process's log, from offset on (this start's
// part: the logs of StartProcess are appended to), says another process
// took its port between FreePort and bind.
func PortTaken(logPath string, offset int64) bool {
	b, err := os.ReadFile(logPath)
	if err != nil || offset > int64(len(b)) {
		return false
	}
	return strings.Contains(string(b[offset:]), "address already in use")
}

// LogSize is the size of the log at path, 0 if there is none: the offset
// of what a start about to append to it will write (PortTaken).
func LogSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// waitPort waits until a process listens on addr (host:port).
func waitPort(p *Process, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if done, err := p.Exited(); done {
			return fmt.Errorf("%s exited: %v", p.name, err)
		}
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not listening on %s after %s", p.name, addr, timeout)
}

// waitReady polls /readyz with the admin credential.
func waitReady(ctx context.Context, c *Cluster, timeout time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if done, err := c.proc.Exited(); done {
			return fmt.Errorf("kube-apiserver exited: %v", err)
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %v", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func writeKubeconfig(path, name, url string, caPEM []byte, admin *keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: url, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[name+"-admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: admin.certPEM, ClientKeyData: admin.keyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name + "-admin"}
	cfg.CurrentContext = name
	return clientcmd.WriteToFile(*cfg, path)
}

// Stop terminates every process and waits for it. It is safe to call twice.
func (e *Env) Stop() error {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return nil
	}
	e.stopped = true
	clusters := e.clusters
	e.mu.Unlock()
	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, c := range clusters {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.proc.Stop(10 * time.Second); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	if e.etcd != nil {
		if err := e.etcd.Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// state is what `up` leaves for `down`.
type state struct {
	Pids     []int             `json:"pids"`
	Clusters map[string]string `json:"kubeconfigs"`
}

func (e *Env) writeState() error {
	s := state{Pids: e.Pids(), Clusters: map[string]string{}}
	for _, c := range e.clusters {
		s.Clusters[c.Name] = c.Kubeconfig
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(e.dir, stateFile), b, 0o600)
}

// Down stops a detached environment started in dir and removes dir. It
// refuses a directory that holds no environment state, so a mistyped --dir
// never deletes anything.
func Down(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return fmt.Errorf("no local clusters recorded in %s: %w", dir, err)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("read %s: %w", filepath.Join(dir, stateFile), err)
	}
	var errs []error
	// API servers first, etcd (the first pid) last.
	for i := len(s.Pids) - 1; i >= 0; i-- {
		if err := killGroup(s.Pids[i], 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// RepoRoot finds the Relaymesh checkout that contains the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/relaymesh/relaymesh\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the relaymesh repository (no go.mod of github.com/relaymesh/relaymesh above the working directory)")
		}
		dir = parent
	}
}

// istioAPIDir locates the istio.io/api module the repository pins.
func istioAPIDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api")
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate istio.io/api module (go list -m): %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", errors.New("istio.io/api module is not downloaded: run `go mod download istio.io/api`")
	}
	return dir, nil
}
