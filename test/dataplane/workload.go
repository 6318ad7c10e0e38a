package dataplane

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/xds"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relaymesh/relaymesh/test/istiod"
)

// WorkloadConfig says what a workload is.
type WorkloadConfig struct {
	// Name of the workload's Pod. Required.
	Name string
	// Namespace of the Pod; it must exist. Required.
	Namespace string
	// ServiceAccount the Pod runs as, created when missing; its token gets
	// the workload certificate. Required.
	ServiceAccount string
	// Labels of the Pod: Services select it by them, subsets by "version",
	// VirtualService sourceLabels match them.
	Labels map[string]string
	// Serve runs the Echo service on an xDS-enabled gRPC server; otherwise
	// the workload is only a client.
	Serve bool
	// Port is the server's container port; 0: any free port. Every
	// workload binds its own address, so servers can share a number, as
	// the Pods of a Deployment do.
	Port int32
	// MaxConnectionAge makes the server end each connection (GOAWAY,
	// then MaxConnectionAgeGrace for the calls in flight) after about
	// this long, so clients reconnect and both sides handshake again with
	// the certificate files as they are then; established connections
	// never re-handshake otherwise. 0: connections live on.
	MaxConnectionAge time.Duration
}

// MaxConnectionAgeGrace is how long a server that ends a connection for
// its age lets the calls in flight finish.
const MaxConnectionAgeGrace = 5 * time.Second

// Validate reports every problem with cfg at once.
func (cfg WorkloadConfig) Validate() error {
	var errs []error
	if len(cfg.Name) > 63 || !dnsLabel.MatchString(cfg.Name) {
		errs = append(errs, fmt.Errorf("name: %q is not a DNS label", cfg.Name))
	}
	if len(cfg.Namespace) > 63 || !dnsLabel.MatchString(cfg.Namespace) {
		errs = append(errs, fmt.Errorf("namespace: %q is not a DNS label", cfg.Namespace))
	}
	if len(cfg.ServiceAccount) > 253 || !dnsSubdom.MatchString(cfg.ServiceAccount) {
		errs = append(errs, fmt.Errorf("serviceAccount: %q is not a DNS subdomain", cfg.ServiceAccount))
	}
	errs = append(errs, validateLabels("labels", cfg.Labels)...)
	if cfg.Port < 0 || cfg.Port > 65535 || cfg.Port > 0 && !cfg.Serve {
		errs = append(errs, fmt.Errorf("port: %d is not a port of a server", cfg.Port))
	}
	if cfg.MaxConnectionAge < 0 || cfg.MaxConnectionAge > 0 && (!cfg.Serve || cfg.MaxConnectionAge < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("maxConnectionAge: %v is not at least 100ms of a server", cfg.MaxConnectionAge))
	}
	return errors.Join(errs...)
}

// Workload is a running proxyless gRPC workload: a Pod in its cluster, a
// certificate from its istiod in files, and (if it serves) an xDS gRPC
// server on its own loopback address.
type Workload struct {
	cluster *Cluster
	cfg     WorkloadConfig
	addr    Address
	dir     string

	lis    net.Listener
	port   int
	server *xds.GRPCServer
	served atomic.Int64

	mu       sync.Mutex
	mode     connectivity.ServingMode
	modeErr  error
	modeSeen chan struct{} // closed and replaced on every mode change
	resolver resolver.Builder
	clients  []*Client
	stopped  bool
}

// StartWorkload registers a workload in the cluster and starts it: it takes
// an address, gets a certificate from istiod's CA for the service account
// and writes it as files, writes the Pod (with status Running, Ready and
// the address, as a kubelet would) and the EndpointSlices of the Services
// that select it, and, for a server, serves the Echo service once istiod
// has sent the inbound listener. On error nothing is left registered or
// running.
func (c *Cluster) StartWorkload(ctx context.Context, cfg WorkloadConfig) (_ *Workload, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	addr, err := c.cfg.IPs.Next()
	if err != nil {
		return nil, err
	}
	dir, err := c.workloadDir(cfg.Namespace, cfg.Name)
	if err != nil {
		return nil, err
	}
	w := &Workload{cluster: c, cfg: cfg, addr: addr, dir: dir, modeSeen: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = w.Stop(context.WithoutCancel(ctx))
		}
	}()
	if cfg.Serve {
		if w.lis, err = net.Listen("tcp", net.JoinHostPort(addr.Bind, strconv.Itoa(int(cfg.Port)))); err != nil {
			return nil, fmt.Errorf("workload %s: listen: %w", cfg.Name, err)
		}
		w.port = w.lis.Addr().(*net.TCPAddr).Port
	}
	if err := w.RenewCertificate(ctx); err != nil {
		return nil, err
	}
	if err := w.register(ctx); err != nil {
		return nil, err
	}
	if cfg.Serve {
		if err := w.serve(ctx); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	c.workloads = append(c.workloads, w)
	c.mu.Unlock()
	c.log.Info("workload started", "workload", cfg.Namespace+"/"+cfg.Name, "podIP", addr.PodIP, "bind", addr.Bind, "port", w.port, "serve", cfg.Serve)
	return w, nil
}

// Name is the workload's Pod name.
func (w *Workload) Name() string { return w.cfg.Name }

// Address is the workload's Pod IP and the loopback address it binds.
func (w *Workload) Address() Address { return w.addr }

// Port is the server's container port (PortName) on its address; 0 for a
// client-only workload.
func (w *Workload) Port() int { return w.port }

// Served is how many calls the workload's server answered.
func (w *Workload) Served() int64 { return w.served.Load() }

// SPIFFEID is the identity istiod certifies for the workload.
func (w *Workload) SPIFFEID() string {
	return "spiffe://" + w.cluster.TrustDomain() + "/ns/" + w.cfg.Namespace + "/sa/" + w.cfg.ServiceAccount
}

// CertDir holds the workload's certificate files.
func (w *Workload) CertDir() string { return filepath.Join(w.dir, "certs") }

// node is what the workload tells istiod.
func (w *Workload) node() Node {
	return Node{
		IP: w.addr.PodIP, Pod: w.cfg.Name, Namespace: w.cfg.Namespace, ServiceAccount: w.cfg.ServiceAccount,
		ClusterID: w.cluster.Name(), Labels: w.cfg.Labels, Port: w.port,
	}
}

func (w *Workload) bootstrap() ([]byte, error) {
	return Bootstrap(BootstrapConfig{Node: w.node(), XDSAddress: w.cluster.XDSAddress(), CertDir: w.CertDir()})
}

// RenewCertificate gets a new certificate from istiod's CA the way
// istio-agent does (a TokenRequest token for the service account, a fresh
// key and CSR) and replaces the files gRPC's file_watcher provider reads:
// each file is written to a temporary name and renamed, so a reader sees
// the old file or the new one, never a mix. gRPC picks the new files up
// within DefaultRefresh.
func (w *Workload) RenewCertificate(ctx context.Context) error {
	d := w.cluster.Istiod()
	token, err := istiod.ServiceAccountToken(ctx, w.cluster.kube, w.cfg.Namespace, w.cfg.ServiceAccount, istiod.TokenAudience)
	if err != nil {
		return fmt.Errorf("workload %s: %w", w.cfg.Name, err)
	}
	key, csr, err := istiod.WorkloadCSR(w.SPIFFEID())
	if err != nil {
		return fmt.Errorf("workload %s: csr: %w", w.cfg.Name, err)
	}
	files, err := d.IssueFiles(ctx, istiod.CertificateRequest{Token: token, CSR: csr})
	if err != nil {
		return fmt.Errorf("workload %s: certificate: %w", w.cfg.Name, err)
	}
	keyPEM, err := pkcs8PEM(key)
	if err != nil {
		return err
	}
	return w.WriteCertificate(files.CertChain, keyPEM, files.Roots)
}

// WriteCertificate replaces the workload's key, certificate chain and root
// bundle (istiod's, or ones issued elsewhere: a SPIRE server's X509-SVID).
// The key first: a reader that sees the new chain finds its key. (pemfile
// rejects a chain and key that do not match and keeps what it had, so the
// order only shortens the window.) gRPC picks them up within
// DefaultRefresh.
func (w *Workload) WriteCertificate(chain, key, roots []byte) error {
	dir := w.CertDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{KeyFile, key}, {CertChainFile, chain}, {RootCertFile, roots}} {
		if err := writeAtomic(filepath.Join(dir, f.name), f.data); err != nil {
			return fmt.Errorf("workload %s: %w", w.cfg.Name, err)
		}
	}
	return nil
}

// WriteRoots replaces the workload's root bundle file with roots, as a
// rotation that distributes a new bundle would.
func (w *Workload) WriteRoots(roots []byte) error {
	return writeAtomic(filepath.Join(w.CertDir(), RootCertFile), roots)
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// register writes the Pod as a kubelet would leave it, then the
// EndpointSlices of the Services that select it.
func (w *Workload) register(ctx context.Context) error {
	pods := w.cluster.kube.CoreV1().Pods(w.cfg.Namespace)
	ctr := corev1.Container{Name: "app", Image: workloadImage}
	if w.port != 0 {
		ctr.Ports = []corev1.ContainerPort{{Name: PortName, ContainerPort: int32(w.port), Protocol: corev1.ProtocolTCP}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: w.cfg.Name, Namespace: w.cfg.Namespace, Labels: w.cfg.Labels,
			// What Istio's injector marks a proxyless workload with.
			Annotations: map[string]string{"inject.istio.io/templates": "grpc-agent"},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName:           w.cfg.ServiceAccount,
			AutomountServiceAccountToken: new(false),
			Containers:                   []corev1.Container{ctr},
		},
	}
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("workload %s: pod: %w", w.cfg.Name, err)
	}
	now := metav1.Now()
	created.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     w.addr.PodIP,
		PodIPs:    []corev1.PodIP{{IP: w.addr.PodIP}},
		HostIP:    "127.0.0.1",
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if _, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("workload %s: pod status: %w", w.cfg.Name, err)
	}
	return w.cluster.SyncEndpoints(ctx, w.cfg.Namespace)
}

// Server start-up: how long to wait for the inbound listener, and how often
// to reconnect to istiod if it did not come (istiod computes a proxy's
// service targets when it connects; a Pod its informer had not yet seen
// then is found on the next connection).
const (
	servingAttemptTimeout = 15 * time.Second
	servingAttempts       = 4
)

// serve starts the xDS gRPC server and waits until it serves.
func (w *Workload) serve(ctx context.Context) error {
	boot, err := w.bootstrap()
	if err != nil {
		return err
	}
	var last error
	for attempt := 1; attempt <= servingAttempts; attempt++ {
		if attempt > 1 {
			// The stopped server closed the listener; the address is the
			// workload's own, so it is free to bind again.
			if w.lis, err = net.Listen("tcp", net.JoinHostPort(w.addr.Bind, strconv.Itoa(w.port))); err != nil {
				return fmt.Errorf("workload %s: listen again: %w", w.cfg.Name, err)
			}
		}
		creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
		if err != nil {
			return err
		}
		opts := []grpc.ServerOption{grpc.Creds(creds), xds.BootstrapContentsForTesting(boot), xds.ServingModeCallback(w.modeChanged)}
		if age := w.cfg.MaxConnectionAge; age > 0 {
			opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: age, MaxConnectionAgeGrace: MaxConnectionAgeGrace}))
		}
		srv, err := xds.NewGRPCServer(opts...)
		if err != nil {
			return fmt.Errorf("workload %s: xds server: %w", w.cfg.Name, err)
		}
		reply := Reply{
			Workload: w.cfg.Name, Namespace: w.cfg.Namespace, Cluster: w.cluster.Name(),
			ServiceAccount: w.cfg.ServiceAccount, Version: w.cfg.Labels["version"],
		}
		srv.RegisterService(&echoServiceDesc, &echoServer{reply: reply, served: func() { w.served.Add(1) }})
		w.mu.Lock()
		w.server = srv
		w.mu.Unlock()
		lis := w.lis
		go func() { _ = srv.Serve(lis) }()
		if last = w.waitServing(ctx, servingAttemptTimeout); last == nil {
			return nil
		}
		w.cluster.log.Warn("server not serving; reconnecting to istiod", "workload", w.cfg.Name, "attempt", attempt, "err", last)
		srv.Stop()
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("workload %s on %s:%d: %w (istiod log:\n%s)", w.cfg.Name, w.addr.Bind, w.port, last, w.cluster.Istiod().LogTail(20))
}

func (w *Workload) modeChanged(addr net.Addr, args xds.ServingModeChangeArgs) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mode, w.modeErr = args.Mode, args.Err
	close(w.modeSeen)
	w.modeSeen = make(chan struct{})
}

// waitServing waits until the server reports SERVING.
func (w *Workload) waitServing(ctx context.Context, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		w.mu.Lock()
		mode, modeErr, seen := w.mode, w.modeErr, w.modeSeen
		w.mu.Unlock()
		if mode == connectivity.ServingModeServing {
			return nil
		}
		select {
		case <-seen:
		case <-t.C:
			return fmt.Errorf("no inbound listener from istiod after %s (mode %s, %v)", timeout, mode, modeErr)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Serving reports whether the server is serving now.
func (w *Workload) Serving() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode == connectivity.ServingModeServing
}

// Dial returns a client of the workload for a Service:
// xds:///<service>.<namespace>.svc.cluster.local:<port>. gRPC asks istiod
// for the listener, route, clusters and endpoints of that name, and uses
// TLS exactly when istiod's cluster says so (a DestinationRule with
// ISTIO_MUTUAL); otherwise plaintext.
func (w *Workload) Dial(service, namespace string, port int32) (*Client, error) {
	if len(service) > 63 || !dnsLabel.MatchString(service) || len(namespace) > 63 || !dnsLabel.MatchString(namespace) || port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial: %q.%q:%d is not a Service and port", service, namespace, port)
	}
	return w.DialHost(service+"."+namespace+".svc."+DomainSuffix, port)
}

// DialHost is Dial for any host istiod knows (a ServiceEntry's, for one).
func (w *Workload) DialHost(host string, port int32) (*Client, error) {
	if len(host) > 253 || !dnsSubdom.MatchString(host) || port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial: %q:%d is not a host and port", host, port)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return nil, errors.New("dial: workload stopped")
	}
	if w.resolver == nil {
		boot, err := w.bootstrap()
		if err != nil {
			return nil, err
		}
		if w.resolver, err = xds.NewXDSResolverWithConfigForTesting(boot); err != nil {
			return nil, fmt.Errorf("workload %s: xds resolver: %w", w.cfg.Name, err)
		}
	}
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		return nil, err
	}
	target := "xds:///" + net.JoinHostPort(host, strconv.Itoa(int(port)))
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds), grpc.WithResolvers(w.resolver),
		grpc.WithContextDialer(w.dialPod), grpc.WithConnectParams(reconnect))
	if err != nil {
		return nil, fmt.Errorf("workload %s: dial %s: %w", w.cfg.Name, target, err)
	}
	c := &Client{from: w.cfg.Name, target: target, conn: conn, closed: w.forget}
	w.clients = append(w.clients, c)
	return c, nil
}

// forget drops a closed client from the workload's list.
func (w *Workload) forget(c *Client) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clients = slices.DeleteFunc(w.clients, func(x *Client) bool { return x == c })
}

// reconnect is how the workloads' clients retry a failed connection: at
// most a second apart, where gRPC's default backs off to two minutes. A
// policy change that fails connections for a while (STRICT before the
// client's ISTIO_MUTUAL arrives) would otherwise leave an endpoint
// unused for long after the configuration is right again.
var reconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// dialPod is the pod network: it connects to a Pod IP at its loopback twin,
// from the workload's own loopback address.
func (w *Workload) dialPod(ctx context.Context, addr string) (net.Conn, error) {
	to, err := Loopback(addr)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(w.addr.Bind)}}
	return d.DialContext(ctx, "tcp", to)
}

// Register writes the workload's Pod and endpoints again after Unregister,
// as when the Pod comes back (at the same address).
func (w *Workload) Register(ctx context.Context) error { return w.register(ctx) }

// Unregister deletes the workload's Pod and its endpoints, as when a Pod
// goes away; the server keeps running (a test can show traffic leaving it).
func (w *Workload) Unregister(ctx context.Context) error {
	err := w.cluster.kube.CoreV1().Pods(w.cfg.Namespace).Delete(ctx, w.cfg.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("workload %s: delete pod: %w", w.cfg.Name, err)
	}
	return w.cluster.SyncEndpoints(ctx, w.cfg.Namespace)
}

// Stop closes the workload's clients and server and unregisters it. It is
// safe to call twice.
func (w *Workload) Stop(ctx context.Context) error {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return nil
	}
	w.stopped = true
	srv, clients := w.server, w.clients
	w.clients = nil
	w.mu.Unlock()
	var errs []error
	for _, c := range clients {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if srv != nil {
		srv.Stop()
	}
	if w.lis != nil {
		if err := w.lis.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, w.Unregister(ctx))
	return errors.Join(errs...)
}

// pkcs8PEM encodes a workload key as istio-agent writes key.pem.
func pkcs8PEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("workload key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
