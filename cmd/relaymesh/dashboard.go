package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"
)

// The dashboard: served by `relaymesh server --dashboard-listen`, opened
// from a workstation by `relaymesh dashboard` through a port-forward.

// dashboardPortName is the server container's port the chart names for the
// dashboard; dashboardPort is its default number.
const (
	dashboardPortName = "dashboard"
	dashboardPort     = 9092
)

// dashboardServeFlags are the server's dashboard flags.
type dashboardServeFlags struct {
	listen, certFile, keyFile, audience string
	plainHTTP                           bool
	idleTimeout, maxLifetime            time.Duration
}

func (f *dashboardServeFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.listen, "dashboard-listen", "", "serve the read-only web dashboard on this address, e.g. :9092, over TLS (bearer token checked by TokenReview for --dashboard-audience, every view authorized by SubjectAccessReview; see docs/dashboard.md); empty: off")
	fs.StringVar(&f.certFile, "dashboard-tls-cert", "", "PEM file of the dashboard's serving certificate (then its intermediates), reloaded when it changes; default: a certificate from the relay CA for --server-dns-names, --server-ips, localhost, 127.0.0.1 and ::1, renewed like the relay port's")
	fs.StringVar(&f.keyFile, "dashboard-tls-key", "", "PEM file of the private key of --dashboard-tls-cert")
	fs.BoolVar(&f.plainHTTP, "dashboard-plain-http", false, "WEAKER: serve the dashboard over plain HTTP, without TLS; allowed only on a loopback --dashboard-listen (e.g. 127.0.0.1:9092), reached through a port-forward; the session cookie then is not Secure")
	fs.StringVar(&f.audience, "dashboard-audience", dashboard.DefaultAudience, "the audience a dashboard sign-in token must be minted for ('kubectl create token NAME --audience "+dashboard.DefaultAudience+"'); tokens for any other audience are refused")
	fs.DurationVar(&f.idleTimeout, "dashboard-session-idle-timeout", 30*time.Minute, "a dashboard session unused this long ends")
	fs.DurationVar(&f.maxLifetime, "dashboard-session-max-lifetime", 8*time.Hour, "a dashboard session ends this long after sign-in at the latest (sooner at its token's expiry)")
}

// validate reports every bad dashboard flag.
func (f dashboardServeFlags) validate() []error {
	var errs []error
	if f.listen == "" {
		if f.certFile != "" || f.keyFile != "" || f.plainHTTP {
			errs = append(errs, errors.New("--dashboard-tls-cert, --dashboard-tls-key and --dashboard-plain-http need --dashboard-listen"))
		}
		return errs
	}
	if (f.certFile == "") != (f.keyFile == "") {
		errs = append(errs, errors.New("--dashboard-tls-cert and --dashboard-tls-key go together"))
	}
	if f.plainHTTP {
		if f.certFile != "" {
			errs = append(errs, errors.New("--dashboard-plain-http and --dashboard-tls-cert are alternatives"))
		}
		if err := loopbackListen(f.listen); err != nil {
			errs = append(errs, err)
		}
	}
	if f.audience == "" || strings.ContainsAny(f.audience, " \t\r\n,") {
		errs = append(errs, fmt.Errorf("--dashboard-audience %q: one audience, without spaces or commas", text.Truncate(f.audience, 80)))
	}
	if f.idleTimeout <= 0 || f.maxLifetime <= 0 {
		errs = append(errs, errors.New("--dashboard-session-idle-timeout and --dashboard-session-max-lifetime must be positive"))
	}
	return errs
}

// loopbackListen refuses a plain-HTTP dashboard address that is not a
// loopback one (the process checks the address it bound, too).
func loopbackListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--dashboard-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("--dashboard-plain-http is allowed only on a loopback --dashboard-listen (e.g. 127.0.0.1:%d), not %q: off loopback the dashboard needs TLS (the default: a certificate from the relay CA; or --dashboard-tls-cert and --dashboard-tls-key)", dashboardPort, addr)
}

// dashboardParts are the server's own state the dashboard shows, and what
// it is served with.
type dashboardParts struct {
	view     *server.View
	pki      dashboard.RelayPKI
	serving  *server.ServingCert
	auditLog *audit.Log
	// shared, if set, holds the Workloads (--snapshot-store=redis).
	shared *server.SharedSnapshots
	// authority issues the dashboard's certificate (unless provided);
	// reg gets its metrics.
	authority *ca.Authority
	reg       prometheus.Registerer
}

// Transports of the dashboard, as relaymesh_dashboard_info's tls label
// says (relaymesh check reads it).
const (
	dashboardTLSRelayCA = "relay-ca"
	dashboardTLSFiles   = "files"
	dashboardTLSNone    = "none"
)

// serveDashboard starts the dashboard on --dashboard-listen; the returned
// function stops it.
func serveDashboard(ctx context.Context, f serverFlags, kube *kubeclient.Clients, p dashboardParts, log *slog.Logger) (func(), error) {
	df := f.dash
	kubeSrc, err := dashboard.StartKubeSource(ctx, kube.Dynamic, f.namespace, time.Minute)
	if err != nil {
		return nil, err
	}
	var src dashboard.Source = kubeSrc
	if p.shared != nil {
		src = dashboard.WithWorkloads(kubeSrc, p.shared)
	}
	auth, err := kubeauth.New(kubeauth.Config{Client: kube.Typed, Audiences: []string{df.audience}, Logger: log})
	if err != nil {
		return nil, err
	}
	cfg := dashboard.Config{Namespace: f.namespace, Source: src, Auth: auth, Audience: df.audience, Agents: viewAgents{v: p.view, replicas: liveReplicas(kube.Typed, f.namespace)}, Relay: p.pki,
		Sessions: dashboard.SessionConfig{IdleTimeout: df.idleTimeout, MaxLifetime: df.maxLifetime},
		AuditLog: f.auditLog, AgentTTL: f.agentTTL, ServerVersion: version(), Registerer: p.reg, Logger: log}
	if p.auditLog != nil {
		cfg.AuditHead = p.auditLog.Head
	}
	if p.serving != nil {
		cfg.Serving = func() (*x509.Certificate, error) {
			c, err := p.serving.Certificate()
			if err != nil {
				return nil, err
			}
			return leafOf(c)
		}
	}
	d, err := dashboard.New(cfg)
	if err != nil {
		return nil, err
	}
	mode, certificate, err := dashboardCertificate(ctx, f, p.authority, log)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", df.listen)
	if err != nil {
		return nil, fmt.Errorf("--dashboard-listen: %w", err)
	}
	bound, _ := lis.Addr().(*net.TCPAddr)
	loopback := bound != nil && bound.IP.IsLoopback()
	if mode == dashboardTLSNone && !loopback {
		_ = lis.Close()
		return nil, fmt.Errorf("--dashboard-plain-http: %s is not a loopback address; off loopback the dashboard needs TLS", lis.Addr())
	}
	if p.reg != nil {
		if err := p.reg.Register(dashboardInfo(mode, loopback)); err != nil {
			return nil, err
		}
		if certificate != nil {
			if err := p.reg.Register(dashboardCertificateExpiry(certificate)); err != nil {
				return nil, err
			}
		}
	}
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 2 * time.Minute,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	if certificate == nil {
		go func() { _ = srv.Serve(lis) }()
		log.Warn("dashboard served over plain HTTP (--dashboard-plain-http, WEAKER): loopback only, its session cookie is not Secure; reach it through a port-forward", "address", lis.Addr().String())
	} else {
		srv.TLSConfig = dashboard.ServerTLS(certificate)
		go func() { _ = srv.ServeTLS(lis, "", "") }()
		log.Info("dashboard listening over TLS (read-only; bearer token for its audience and RBAC per view)", "address", lis.Addr().String(), "certificate", mode, "audience", df.audience)
	}
	return func() { _ = srv.Close() }, nil
}

// dashboardCertificate is what the dashboard is served with: provided
// files, a certificate from the relay CA (renewed until ctx ends), or
// none (plain HTTP).
func dashboardCertificate(ctx context.Context, f serverFlags, authority *ca.Authority, log *slog.Logger) (string, func() (*tls.Certificate, error), error) {
	switch {
	case f.dash.plainHTTP:
		return dashboardTLSNone, nil, nil
	case f.dash.certFile != "":
		files, err := dashboard.LoadCertificateFiles(f.dash.certFile, f.dash.keyFile, time.Now, log)
		if err != nil {
			return "", nil, fmt.Errorf("--dashboard-tls-cert: %w", err)
		}
		return dashboardTLSFiles, files.Certificate, nil
	}
	if authority == nil {
		return "", nil, errors.New("the dashboard's certificate: no relay CA to issue it")
	}
	names, ips := dashboardNames(f)
	cert, err := server.NewServingCert(ctx, authority, names, ips, nil, log.With("for", "dashboard"))
	if err != nil {
		return "", nil, fmt.Errorf("the dashboard's certificate: %w", err)
	}
	go cert.Run(ctx)
	return dashboardTLSRelayCA, cert.Certificate, nil
}

// dashboardNames are the names of the dashboard's relay-CA certificate:
// the server's, and loopback's (a port-forward's URL), each once.
func dashboardNames(f serverFlags) ([]string, []net.IP) {
	var names []string
	for _, n := range append(splitList(f.dnsNames), "localhost") {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	var ips []net.IP
	for _, s := range append(splitList(f.ips), "127.0.0.1", "::1") {
		ip := net.ParseIP(s)
		if ip == nil || slices.ContainsFunc(ips, ip.Equal) {
			continue
		}
		ips = append(ips, ip)
	}
	return names, ips
}

// leafOf is the parsed leaf of c.
func leafOf(c *tls.Certificate) (*x509.Certificate, error) {
	if c.Leaf != nil {
		return c.Leaf, nil
	}
	return x509.ParseCertificate(c.Certificate[0])
}

// metricDashboardInfo says how the dashboard is served (relaymesh check
// reads it).
const metricDashboardInfo = "relaymesh_dashboard_info"

// dashboardInfo is the relaymesh_dashboard_info gauge: 1, with tls
// relay-ca, files or none (WEAKER: --dashboard-plain-http), and listener
// loopback or network (the address bound).
func dashboardInfo(mode string, loopback bool) prometheus.Collector {
	listener := "network"
	if loopback {
		listener = "loopback"
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricDashboardInfo,
		Help: "Always 1 while the dashboard is served; tls is relay-ca (a certificate from the relay CA), files (--dashboard-tls-cert) or none (--dashboard-plain-http), listener loopback or network (the address bound)."},
		[]string{"tls", "listener"})
	g.WithLabelValues(mode, listener).Set(1)
	return g
}

// dashboardCertificateExpiry is the expiry of the certificate the
// dashboard serves now.
func dashboardCertificateExpiry(certificate func() (*tls.Certificate, error)) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "relaymesh_dashboard_certificate_expiry_timestamp_seconds",
		Help: "Expiry of the certificate the dashboard serves (Unix seconds)."}, func() float64 {
		c, err := certificate()
		if err != nil || c == nil {
			return 0
		}
		leaf, err := leafOf(c)
		if err != nil {
			return 0
		}
		return float64(leaf.NotAfter.Unix())
	})
}

// viewAgents shows the relay's View to the dashboard: wire types stay here.
// It also says which replicas are alive (dashboard.Replicas).
type viewAgents struct {
	v        *server.View
	replicas func(context.Context) (map[string]time.Time, error)
}

// Replicas implements dashboard.Replicas.
func (a viewAgents) Replicas(ctx context.Context) (map[string]time.Time, error) {
	if a.replicas == nil {
		return nil, nil
	}
	return a.replicas(ctx)
}

// liveReplicas reads when each live server replica of namespace last
// renewed its Lease (leader.Replicas).
func liveReplicas(client kubernetes.Interface, namespace string) func(context.Context) (map[string]time.Time, error) {
	return func(ctx context.Context) (map[string]time.Time, error) {
		reps, err := leader.Replicas(ctx, client, namespace, time.Now())
		if err != nil {
			return nil, err
		}
		out := map[string]time.Time{}
		for name, r := range reps {
			if r.Alive {
				out[name] = r.Renewed
			}
		}
		return out, nil
	}
}

func (a viewAgents) Agents() map[string]dashboard.AgentState {
	out := map[string]dashboard.AgentState{}
	if a.v == nil {
		return out
	}
	for name, c := range a.v.States() {
		st := dashboard.AgentState{SnapshotAt: c.AcceptedAt, SnapshotError: c.LastError, AckedAt: c.AckedAt}
		if c.Ack != nil {
			st.AckVersion = c.Ack.GetVersion()
		}
		for _, r := range c.Conflicts {
			st.Failures = append(st.Failures, fmt.Sprintf("%s %s/%s: %s: %s", r.GetKind(), r.GetNamespace(), r.GetName(), r.GetOutcome(), r.GetError()))
		}
		out[name] = st
	}
	return out
}

const dashboardSynopsis = `Open the management server's dashboard: forward a local port to the
dashboard port of a running server pod (through the management cluster's
apiserver, like kubectl port-forward) and print the URL to open.

The dashboard is served over TLS; the command prints the certificate it
saw through the forward, which the apiserver authenticated. It signs you in
with a bearer token the management cluster accepts for the dashboard's
audience (relaymesh-dashboard unless the server's --dashboard-audience says
otherwise) and shows each view only if your RBAC allows it: bind the server
chart's ClusterRole <namespace>-<release>-dashboard-viewer to your user or
group, or to a ServiceAccount whose token you create with
'kubectl create token NAME --audience relaymesh-dashboard'. See
docs/dashboard.md.`

type dashboardFlags struct {
	address, pod, selector string
	port, remotePort       int
}

func newDashboardCommand(d deps, g *globals) *cobra.Command {
	var f dashboardFlags
	c := &cobra.Command{
		Use:   "dashboard",
		Short: "Open the server's web dashboard through a port-forward",
		Long:  dashboardSynopsis,
		Example: `  # Forward a free local port to the server and print the URL
  relaymesh dashboard --context mgmt

  # A fixed port, and a token for a ServiceAccount bound to the viewer role
  relaymesh dashboard --port 9092
  kubectl -n relaymesh create token dashboard-viewer --audience relaymesh-dashboard`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if f.port < 0 || f.port > 65535 || f.remotePort < 0 || f.remotePort > 65535 {
				return usagef("--port and --remote-port must be 0–65535")
			}
			kube, err := g.clients()
			if err != nil {
				return err
			}
			return runDashboard(c.Context(), d.stdout, d.stderr, kube, g.namespace, f, forwardPort)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.address, "address", "127.0.0.1", "local address to listen on (keep it loopback: whoever reaches it reaches the dashboard's sign-in; a dashboard served over plain HTTP is forwarded to loopback only)")
	fs.IntVar(&f.port, "port", 0, "local port (0: a free one)")
	fs.StringVar(&f.pod, "pod", "", "the server pod to forward to (default: a running, ready pod matching --selector)")
	fs.StringVar(&f.selector, "selector", "app.kubernetes.io/name=relaymesh-server", "label selector of the server pods in --namespace")
	fs.IntVar(&f.remotePort, "remote-port", 0, "the dashboard's port in the pod (default: the container port named "+dashboardPortName+", else "+strconv.Itoa(dashboardPort)+")")
	return c
}

// forwarder forwards local to port of pod until ctx ends; ready gets the
// local port once it listens.
type forwarder func(ctx context.Context, kube *kubeclient.Clients, pod *corev1.Pod, address string, local, remote int, ready func(int), errOut io.Writer) error

func runDashboard(ctx context.Context, stdout, stderr io.Writer, kube *kubeclient.Clients, namespace string, f dashboardFlags, forward forwarder) error {
	pod, err := serverPod(ctx, kube, namespace, f.pod, f.selector)
	if err != nil {
		return err
	}
	remote := f.remotePort
	if remote == 0 {
		remote = podPort(pod, dashboardPortName, dashboardPort)
	}
	audience := podFlag(pod, "--dashboard-audience", dashboard.DefaultAudience)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var refused error
	ready := func(local int) {
		host := f.address
		if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
			host = "[" + host + "]"
		}
		leaf, plain, err := probeDashboard(ctx, net.JoinHostPort(dialable(f.address), strconv.Itoa(local)))
		scheme := "https"
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "warning: could not tell how the dashboard is served: %v\n", err)
		case plain && !loopbackHost(f.address):
			refused = fmt.Errorf("the dashboard of %s/%s is served over plain HTTP (the server's --dashboard-plain-http): it is forwarded to a loopback --address only, not %s", pod.Namespace, pod.Name, f.address)
			cancel()
			return
		case plain:
			scheme = "http"
		}
		fmt.Fprintf(stdout, "Relaymesh dashboard: %s://%s:%d/\n", scheme, host, local)
		fmt.Fprintf(stdout, "Forwarding to %s/%s port %d; Ctrl-C to stop.\n", pod.Namespace, pod.Name, remote)
		switch {
		case leaf != nil:
			sum := sha256.Sum256(leaf.Raw)
			fmt.Fprintf(stdout, "Served over TLS with a certificate issued by %q, SHA-256 %s (as seen through the apiserver's port-forward);\n", leaf.Issuer.String(), hex.EncodeToString(sum[:]))
			fmt.Fprintf(stdout, "your browser trusts it if it trusts that issuer (the relay CA's root, or the certificate of the chart's dashboard.tls).\n")
		case plain:
			fmt.Fprintf(stdout, "Served over plain HTTP (the server's --dashboard-plain-http, WEAKER): keep this forward on loopback.\n")
		}
		fmt.Fprintf(stdout, "Sign in with a token for the audience %s of a user or ServiceAccount bound to the dashboard-viewer ClusterRole, e.g.:\n", audience)
		fmt.Fprintf(stdout, "  kubectl -n %s create token SERVICE-ACCOUNT --audience %s\n", namespace, audience)
	}
	err = forward(ctx, kube, pod, f.address, f.port, remote, ready, stderr)
	if refused != nil {
		return refused
	}
	return err
}

// probeDashboard tells how the dashboard at addr is served: the leaf it
// presents over TLS, or plain HTTP. The certificate is not verified here:
// the connection runs through the apiserver's port-forward to the pod, and
// the leaf is shown for the user's browser to compare.
func probeDashboard(ctx context.Context, addr string) (*x509.Certificate, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	d := &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} //nolint:gosec // shown, not trusted: see above
	conn, err := d.DialContext(ctx, "tcp", addr)
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &rh):
		return nil, true, nil
	case err != nil:
		return nil, false, err
	}
	defer conn.Close()
	certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, false, errors.New("no certificate presented")
	}
	return certs[0], false, nil
}

// dialable is an address to reach a listener on address from this host.
func dialable(address string) string {
	if ip := net.ParseIP(address); ip != nil && ip.IsUnspecified() {
		return "127.0.0.1"
	}
	return address
}

// loopbackHost says whether a host name or address is loopback.
func loopbackHost(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// podFlag is the value of --name=VALUE (or --name VALUE) in the pod's
// first container's command line, else def.
func podFlag(p *corev1.Pod, name, def string) string {
	if len(p.Spec.Containers) == 0 {
		return def
	}
	c := p.Spec.Containers[0]
	args := append(slices.Clone(c.Command), c.Args...)
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok && v != "" {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return def
}

// serverPod is the named pod, or a running and ready one matching selector
// (the newest first).
func serverPod(ctx context.Context, kube *kubeclient.Clients, namespace, name, selector string) (*corev1.Pod, error) {
	if name != "" {
		pod, err := kube.Typed.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		}
		if pod.Status.Phase != corev1.PodRunning {
			return nil, fmt.Errorf("pod %s/%s is %s, not Running", namespace, name, pod.Status.Phase)
		}
		return pod, nil
	}
	pods, err := kube.Typed.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("server pods in %s (%s): %w", namespace, selector, err)
	}
	var candidates []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && podReady(&p) {
			candidates = append(candidates, p)
		}
	}
	if len(candidates) == 0 {
		return nil, fmt.Errorf("no running, ready server pod in %s matches %s (%d pod(s) found); is the server chart installed? --pod names one", namespace, selector, len(pods.Items))
	}
	sort.Slice(candidates, func(i, j int) bool {
		return candidates[j].CreationTimestamp.Before(&candidates[i].CreationTimestamp)
	})
	return &candidates[0], nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podPort is the number of the container port called name, else def.
func podPort(p *corev1.Pod, name string, def int) int {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == name {
				return int(port.ContainerPort)
			}
		}
	}
	return def
}

// forwardPort forwards through the apiserver's pods/portforward, over
// WebSockets with SPDY as the fallback (as kubectl does).
func forwardPort(ctx context.Context, kube *kubeclient.Clients, pod *corev1.Pod, address string, local, remote int, ready func(int), errOut io.Writer) error {
	req := kube.Typed.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward")
	transport, upgrader, err := spdy.RoundTripperFor(kube.Config)
	if err != nil {
		return err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, req.URL())
	if ws, err := portforward.NewSPDYOverWebsocketDialer(req.URL(), kube.Config); err == nil {
		dialer = portforward.NewFallbackDialer(ws, dialer, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
	stop, readyCh := make(chan struct{}), make(chan struct{})
	pf, err := portforward.NewOnAddresses(dialer, []string{address}, []string{fmt.Sprintf("%d:%d", local, remote)}, stop, readyCh, io.Discard, errOut)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- pf.ForwardPorts() }()
	select {
	case <-readyCh:
	case err := <-errc:
		return fmt.Errorf("port-forward to %s/%s: %w", pod.Namespace, pod.Name, err)
	case <-ctx.Done():
		close(stop)
		return nil
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) == 0 {
		close(stop)
		return errors.Join(errors.New("port-forward: no local port"), err)
	}
	ready(int(ports[0].Local))
	select {
	case <-ctx.Done():
		close(stop)
		<-errc
		return nil
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("port-forward to %s/%s ended: %w", pod.Namespace, pod.Name, err)
		}
		return errors.New("port-forward ended")
	}
}
