package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/spf13/cobra"
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

// dashboardParts are the server's own state the dashboard shows.
type dashboardParts struct {
	view     *server.View
	pki      dashboard.RelayPKI
	serving  *server.ServingCert
	auditLog *audit.Log
	// shared, if set, holds the Workloads (--snapshot-store=redis).
	shared *server.SharedSnapshots
}

// serveDashboard starts the dashboard on --dashboard-listen; the returned
// function stops it.
func serveDashboard(ctx context.Context, f serverFlags, kube *kubeclient.Clients, p dashboardParts, log *slog.Logger) (func(), error) {
	kubeSrc, err := dashboard.StartKubeSource(ctx, kube.Dynamic, f.namespace, time.Minute)
	if err != nil {
		return nil, err
	}
	var src dashboard.Source = kubeSrc
	if p.shared != nil {
		src = dashboard.WithWorkloads(kubeSrc, p.shared)
	}
	auth, err := kubeauth.New(kubeauth.Config{Client: kube.Typed, Logger: log})
	if err != nil {
		return nil, err
	}
	cfg := dashboard.Config{Namespace: f.namespace, Source: src, Auth: auth, Agents: viewAgents{v: p.view, replicas: liveReplicas(kube.Typed, f.namespace)}, Relay: p.pki,
		AuditLog: f.auditLog, AgentTTL: f.agentTTL, ServerVersion: version(), Logger: log}
	if p.auditLog != nil {
		cfg.AuditHead = p.auditLog.Head
	}
	if p.serving != nil {
		cfg.Serving = func() (*x509.Certificate, error) {
			c, err := p.serving.Certificate()
			if err != nil {
				return nil, err
			}
			if c.Leaf != nil {
				return c.Leaf, nil
			}
			return x509.ParseCertificate(c.Certificate[0])
		}
	}
	d, err := dashboard.New(cfg)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", f.dashboardListen)
	if err != nil {
		return nil, fmt.Errorf("--dashboard-listen: %w", err)
	}
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 2 * time.Minute,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	go func() { _ = srv.Serve(lis) }()
	log.Info("dashboard listening (read-only; bearer token and RBAC per view)", "address", lis.Addr().String())
	return func() { _ = srv.Close() }, nil
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
	for name, c := range a.v.Clusters() {
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

The dashboard signs you in with a bearer token the management cluster
accepts and shows each view only if your RBAC allows it: bind the server
chart's ClusterRole <namespace>-<release>-dashboard-viewer to your user or
group, or to a ServiceAccount whose token you create with
'kubectl create token'. See docs/dashboard.md.`

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
  kubectl -n relaymesh create token dashboard-viewer`,
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
	fs.StringVar(&f.address, "address", "127.0.0.1", "local address to listen on (keep it loopback: whoever reaches it reaches the dashboard's sign-in)")
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
	ready := func(local int) {
		host := f.address
		if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
			host = "[" + host + "]"
		}
		fmt.Fprintf(stdout, "Relaymesh dashboard: http://%s:%d/\n", host, local)
		fmt.Fprintf(stdout, "Forwarding to %s/%s port %d; Ctrl-C to stop.\n", pod.Namespace, pod.Name, remote)
		fmt.Fprintf(stdout, "Sign in with a token of a user or ServiceAccount bound to the dashboard-viewer ClusterRole, e.g.:\n")
		fmt.Fprintf(stdout, "  kubectl -n %s create token SERVICE-ACCOUNT\n", namespace)
	}
	return forward(ctx, kube, pod, f.address, f.port, remote, ready, stderr)
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
