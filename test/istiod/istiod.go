// Package istiod runs a real istiod (the pinned pilot-discovery that
// `make tools` builds) as a local process against a cluster of
// test/localcluster, with a plugged-in CA, and asks its CA for workload
// certificates the way istio-agent does.
//
// istiod runs outside a pod here: it reads the cluster through --kubeconfig
// (an admin credential, which it also uses for TokenReview), loads the CA from
// ./etc/cacerts/ under its working directory (the four files a kubelet would
// mount from the `cacerts` Secret), and serves its CA on the secure gRPC
// port with a serving certificate it signs itself for istiod.<ns>.svc. Every
// listener gets its own free loopback port, so several istiods (one per
// cluster) run side by side.
//
// Tests use it to check that the intermediates Relaymesh issues really work
// in Istio: what istiod signs with them must verify to the mesh's root.
package istiod

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// Names of the files istiod loads from its cacerts directory.
const (
	CACertFile    = "ca-cert.pem"
	CAKeyFile     = "ca-key.pem"
	CertChainFile = "cert-chain.pem"
	RootCertFile  = "root-cert.pem"
)

// cacertsDir is where istiod looks for the plugged-in CA, relative to its
// working directory (its default ROOT_CA_DIR).
const cacertsDir = "etc/cacerts"

// DefaultNamespace is the namespace istiod runs in unless told otherwise.
const DefaultNamespace = "istio-system"

// DefaultTrustDomain is Istio's default trust domain.
const DefaultTrustDomain = "cluster.local"

// DefaultReadyTimeout bounds the wait for istiod to become ready; it starts
// in a few seconds, but the machines tests run on are small and shared.
const DefaultReadyTimeout = 90 * time.Second

// stopGrace is how long Stop waits after SIGTERM before it kills istiod.
const stopGrace = 5 * time.Second

// logTailLines is how much of istiod's log an error carries.
const logTailLines = 30

var (
	dnsLabel   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	clusterIDs = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
)

// Config says which istiod to start.
type Config struct {
	// Bin is the pilot-discovery binary; default: .cache/bin/pilot-discovery
	// of the repository that contains the working directory.
	Bin string
	// Kubeconfig is the path of an admin kubeconfig for the cluster. Required.
	Kubeconfig string
	// ClusterID is the Istio cluster ID (--clusterID). Required.
	ClusterID string
	// Namespace istiod runs in and signs its serving certificate for
	// (istiod.<Namespace>.svc); default DefaultNamespace. The namespace
	// should exist: istiod keeps its leader-election leases there.
	Namespace string
	// Dir is istiod's working directory: its cacerts, mesh config and log
	// go there. Required.
	Dir string
	// CACerts are the plugged-in CA files, keyed by file name, as in the
	// `cacerts` Secret: CACertFile, CAKeyFile, CertChainFile and
	// RootCertFile are required.
	CACerts map[string][]byte
	// TrustDomain of the mesh; default DefaultTrustDomain.
	TrustDomain string
	// ReadyTimeout bounds the wait for istiod; default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Ambient starts istiod in ambient mode (PILOT_ENABLE_AMBIENT=true, as
	// the Helm `ambient` profile does), so it serves ztunnels and
	// waypoints. Its Gateway deployment controller stays off: no waypoint
	// Deployment is wanted (nothing would run it here).
	Ambient bool
	// MeshConfig is more mesh config (YAML), after trustDomain; e.g.
	// caCertificates. SetMeshConfig replaces it while istiod runs.
	MeshConfig string
	// Env is more of istiod's environment, e.g. ISTIO_MULTIROOT_MESH, or
	// SSL_CERT_FILE for the roots it fetches spiffeBundleUrl with (it
	// has no other).
	Env map[string]string
}

// Default returns the config with defaults filled in. It does not read
// the file system; Start finds the default binary.
func (c Config) Default() Config {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.TrustDomain == "" {
		c.TrustDomain = DefaultTrustDomain
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	return c
}

// Validate reports every problem with a defaulted config at once.
func (c Config) Validate() error {
	var errs []error
	if c.Kubeconfig == "" {
		errs = append(errs, errors.New("kubeconfig: required"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("dir: required"))
	}
	if c.ClusterID == "" {
		errs = append(errs, errors.New("clusterID: required"))
	} else if len(c.ClusterID) > 253 || !clusterIDs.MatchString(c.ClusterID) {
		errs = append(errs, fmt.Errorf("clusterID: %q must be letters, digits, '-', '_' or '.'", c.ClusterID))
	}
	if len(c.Namespace) > 63 || !dnsLabel.MatchString(c.Namespace) {
		errs = append(errs, fmt.Errorf("namespace: %q is not a DNS label", c.Namespace))
	}
	if len(c.TrustDomain) > 255 || !validTrustDomain(c.TrustDomain) {
		errs = append(errs, fmt.Errorf("trustDomain: %q is not a trust domain (a-z, 0-9, '.', '-', '_')", c.TrustDomain))
	}
	if c.ReadyTimeout < 0 {
		errs = append(errs, errors.New("readyTimeout: must not be negative"))
	}
	for _, f := range []string{CACertFile, CAKeyFile, CertChainFile, RootCertFile} {
		if len(c.CACerts[f]) == 0 {
			errs = append(errs, fmt.Errorf("caCerts[%s]: required", f))
		}
	}
	for _, name := range sortedKeys(c.CACerts) {
		if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
			errs = append(errs, fmt.Errorf("caCerts[%q]: must be a plain file name", name))
		}
	}
	if len(c.CACerts[RootCertFile]) > 0 {
		if _, err := certPool(c.CACerts[RootCertFile]); err != nil {
			errs = append(errs, fmt.Errorf("caCerts[%s]: %w", RootCertFile, err))
		}
	}
	return errors.Join(errs...)
}

func validTrustDomain(td string) bool {
	if td == "" {
		return false
	}
	for _, r := range td {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Addresses are istiod's loopback listeners, host:port each.
type Addresses struct {
	// HTTP serves /ready and debug endpoints (--httpAddr).
	HTTP string
	// HTTPS serves the injection and validation webhooks (--httpsAddr).
	HTTPS string
	// GRPC is plaintext xDS (--grpcAddr).
	GRPC string
	// SecureGRPC is xDS and the CA over TLS, port 15012 in a cluster
	// (--secureGRPCAddr).
	SecureGRPC string
	// Monitoring serves metrics (--monitoringAddr).
	Monitoring string
	// CtrlZ is the ControlZ introspection page (--ctrlz_port).
	CtrlZ string
}

// Istiod is a running pilot-discovery.
type Istiod struct {
	cfg   Config
	addrs Addresses
	roots *x509.CertPool
	proc  *localcluster.Process
}

// Start writes the cacerts and the mesh config into cfg.Dir, starts
// pilot-discovery there and waits until it reports ready and its secure
// gRPC port presents a certificate that verifies to the plugged root for
// istiod.<namespace>.svc. A port taken by another process between choosing
// and binding it is retried with fresh ports. On error nothing is left
// running, and the error carries the end of istiod's log.
func Start(ctx context.Context, cfg Config) (*Istiod, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("istiod config: %w", err)
	}
	if cfg.Bin == "" {
		root, err := localcluster.RepoRoot()
		if err != nil {
			return nil, err
		}
		cfg.Bin = filepath.Join(root, ".cache", "bin", "pilot-discovery")
	}
	if _, err := os.Stat(cfg.Bin); err != nil {
		return nil, fmt.Errorf("pilot-discovery not found: run `make tools` (or `hack/tools.sh pilot-discovery`): %w", err)
	}
	envBin, err := exec.LookPath("env")
	if err != nil {
		return nil, fmt.Errorf("istiod: %w", err)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	if cfg.Kubeconfig, err = filepath.Abs(cfg.Kubeconfig); err != nil {
		return nil, err
	}
	if _, err := os.Stat(cfg.Kubeconfig); err != nil {
		return nil, fmt.Errorf("istiod: kubeconfig: %w", err)
	}
	if err := writeFiles(cfg); err != nil {
		return nil, fmt.Errorf("istiod: %w", err)
	}
	roots, err := certPool(cfg.CACerts[RootCertFile])
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "istiod.log")
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		addrs, err := freeAddresses()
		if err != nil {
			return nil, err
		}
		args := append(envArgs(cfg), cfg.Bin)
		args = append(args, flags(cfg, addrs)...)
		logStart := localcluster.LogSize(logPath)
		// env gives istiod a working directory and an environment of its
		// own, then execs it: the process keeps the pid, process group
		// and parent-death signal that StartProcess set up.
		p, err := localcluster.StartProcess("istiod "+cfg.ClusterID, envBin, args, logPath, false)
		if err != nil {
			return nil, err
		}
		d := &Istiod{cfg: cfg, addrs: addrs, roots: roots, proc: p}
		if lastErr = d.waitReady(ctx); lastErr == nil {
			return d, nil
		}
		if err := p.Stop(stopGrace); err != nil {
			lastErr = errors.Join(lastErr, err)
		}
		if !localcluster.PortTaken(logPath, logStart) || ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("istiod for cluster %s not ready: %w\n--- last lines of %s ---\n%s", cfg.ClusterID, lastErr, logPath, logTail(logPath, logTailLines))
}

// envArgs are env's arguments: a clean environment with only what istiod
// needs outside a pod, and its working directory.
func envArgs(cfg Config) []string {
	vars := map[string]string{
		// Identity for leader election; in a pod the downward API sets it.
		"POD_NAME":      "istiod-" + strings.ToLower(strings.ReplaceAll(cfg.ClusterID, "_", "-")),
		"POD_NAMESPACE": cfg.Namespace,
		// Defaults, stated: run the CA, and sign istiod's own serving
		// certificate with it.
		"ENABLE_CA_SERVER":    "true",
		"PILOT_CERT_PROVIDER": "istiod",
		// Default, stated: the audience TokenReview checks.
		"TOKEN_AUDIENCES": TokenAudience,
		// Do not patch webhook configurations: none are installed, and in a
		// shared cluster they would belong to someone else.
		"INJECTION_WEBHOOK_CONFIG_NAME":  "",
		"VALIDATION_WEBHOOK_CONFIG_NAME": "",
	}
	for k, v := range cfg.Env {
		vars[k] = v
	}
	if cfg.Ambient {
		vars["PILOT_ENABLE_AMBIENT"] = "true"
		vars["PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER"] = "false"
	}
	args := []string{"-i", "-C", cfg.Dir}
	for _, k := range sortedKeys(vars) {
		args = append(args, k+"="+vars[k])
	}
	return args
}

// flags are pilot-discovery's arguments.
func flags(cfg Config, a Addresses) []string {
	_, ctrlzPort, _ := net.SplitHostPort(a.CtrlZ)
	return []string{
		"discovery",
		"--kubeconfig=" + cfg.Kubeconfig,
		"--clusterID=" + cfg.ClusterID,
		"--namespace=" + cfg.Namespace,
		"--meshConfig=" + filepath.Join(cfg.Dir, meshConfigFile),
		"--networksConfig=" + filepath.Join(cfg.Dir, meshNetworksFile),
		"--httpAddr=" + a.HTTP,
		"--httpsAddr=" + a.HTTPS,
		"--grpcAddr=" + a.GRPC,
		"--secureGRPCAddr=" + a.SecureGRPC,
		"--monitoringAddr=" + a.Monitoring,
		"--ctrlz_address=127.0.0.1",
		"--ctrlz_port=" + ctrlzPort,
		"--shutdownDuration=1s",
	}
}

const (
	meshConfigFile   = "etc/istio/config/mesh"
	meshNetworksFile = "etc/istio/config/meshNetworks"
)

// writeFiles lays out istiod's working directory as a pod would see it.
func writeFiles(cfg Config) error {
	ca := filepath.Join(cfg.Dir, cacertsDir)
	if err := os.MkdirAll(ca, 0o700); err != nil {
		return err
	}
	for name, b := range cfg.CACerts {
		if err := os.WriteFile(filepath.Join(ca, name), b, 0o600); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, filepath.Dir(meshConfigFile)), 0o700); err != nil {
		return err
	}
	if err := writeMeshConfig(cfg); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.Dir, meshNetworksFile), []byte("networks: {}\n"), 0o600)
}

// writeMeshConfig writes the mesh config file istiod watches: written
// whole to a temporary file and renamed, so istiod never reads half of it.
func writeMeshConfig(cfg Config) error {
	mesh := "trustDomain: " + cfg.TrustDomain + "\n" + cfg.MeshConfig
	path := filepath.Join(cfg.Dir, meshConfigFile)
	if err := os.WriteFile(path+".new", []byte(mesh), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".new", path)
}

// SetMeshConfig replaces Config.MeshConfig in the running istiod's mesh
// config file; istiod reloads it as it would a changed ConfigMap.
func (d *Istiod) SetMeshConfig(extra string) error {
	d.cfg.MeshConfig = extra
	return writeMeshConfig(d.cfg)
}

func freeAddresses() (Addresses, error) {
	var ports [6]string
	for i := range ports {
		p, err := localcluster.FreePort()
		if err != nil {
			return Addresses{}, err
		}
		ports[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return Addresses{
		HTTP: ports[0], HTTPS: ports[1], GRPC: ports[2],
		SecureGRPC: ports[3], Monitoring: ports[4], CtrlZ: ports[5],
	}, nil
}

// waitReady polls /ready, then checks the secure gRPC port's certificate.
func (d *Istiod) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.ReadyTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	var last error
	for {
		if done, err := d.proc.Exited(); done {
			return fmt.Errorf("pilot-discovery exited: %v", err)
		}
		if last = d.ready(ctx, client); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %w", d.cfg.ReadyTimeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (d *Istiod) ready(ctx context.Context, client *http.Client) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addrs.HTTP+"/ready", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/ready: %s", resp.Status)
	}
	dialer := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: d.tlsConfig()}
	conn, err := dialer.DialContext(ctx, "tcp", d.addrs.SecureGRPC)
	if err != nil {
		return fmt.Errorf("secure gRPC port %s: %w", d.addrs.SecureGRPC, err)
	}
	return conn.Close()
}

// tlsConfig trusts only the plugged root and expects istiod's service name.
func (d *Istiod) tlsConfig() *tls.Config {
	return &tls.Config{
		RootCAs:    d.roots,
		ServerName: d.ServerName(),
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
	}
}

// ServerName is the DNS name istiod's serving certificate carries and
// clients verify: istiod.<namespace>.svc.
func (d *Istiod) ServerName() string { return "istiod." + d.cfg.Namespace + ".svc" }

// ClusterID is the cluster ID istiod was started with.
func (d *Istiod) ClusterID() string { return d.cfg.ClusterID }

// TrustDomain is the mesh's trust domain.
func (d *Istiod) TrustDomain() string { return d.cfg.TrustDomain }

// CACertsDir is the directory istiod loads its CA from and watches: a test
// that rewrites the files there sees istiod reload them, as it would after
// the `cacerts` Secret changed.
func (d *Istiod) CACertsDir() string { return filepath.Join(d.cfg.Dir, cacertsDir) }

// Addresses are istiod's listeners.
func (d *Istiod) Addresses() Addresses { return d.addrs }

// Pid is pilot-discovery's process id.
func (d *Istiod) Pid() int { return d.proc.Pid() }

// LogPath is the file holding istiod's output.
func (d *Istiod) LogPath() string { return d.proc.LogPath() }

// LogTail returns the last n lines of istiod's log, for failure messages.
func (d *Istiod) LogTail(n int) string { return logTail(d.proc.LogPath(), n) }

// Stop terminates istiod (SIGTERM, then SIGKILL to its process group) and
// waits until it has exited. It is safe to call twice.
func (d *Istiod) Stop() error {
	if err := d.proc.Stop(stopGrace); err != nil {
		return fmt.Errorf("stop istiod for cluster %s: %w", d.cfg.ClusterID, err)
	}
	return nil
}

func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func certPool(pemBytes []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, errors.New("no PEM certificate found")
	}
	return pool, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
