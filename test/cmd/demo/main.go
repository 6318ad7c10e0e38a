// Command demo runs Relaymesh's main job end to end on local clusters
// (`make demo`): it starts a management cluster and two workload clusters,
// applies Istio-shaped sample workloads to the workload clusters and a
// VirtualMesh to the management cluster, starts `relaymesh server`,
// registers both workload clusters, starts an agent in each (real
// processes), shows the identities the agents were issued, the meshes,
// workloads and destinations they discovered, and one output applied through
// the relay, and keeps everything up until Ctrl-C. With DEMO_EXIT=1 it stops and exits after the
// summary, for scripts.
//
// It ends by saying where the relaymesh binary is and how to point
// `relaymesh check`, the CLI and the dashboard at the demo's clusters; the
// demo runs those commands itself first, so what it prints works.
//
// `make demo` (hack/demo.sh) builds it and relaymesh beforehand and runs
// `bin/demo -relaymesh bin/relaymesh -started UNIX-SECONDS`, so the step
// headings keep the clock of the whole `make demo`.
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/trust"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

const fieldManager = "relaymesh-demo"

// config is what the demo needs from its environment.
type config struct {
	dir       string   // where clusters keep their files
	workloads []string // workload cluster names
	exit      bool     // stop after the summary instead of waiting for a signal
	relaymesh string   // a relaymesh binary built beforehand; "": build one into dir
}

// began is when the demo started: step headings show the time since.
var began = time.Now()

func main() {
	cfg := config{dir: "_demo", workloads: []string{"cluster-1", "cluster-2"}}
	flag.StringVar(&cfg.relaymesh, "relaymesh", "", "a relaymesh binary built beforehand (default: build ./cmd/relaymesh into DEMO_DIR)")
	started := flag.Int64("started", 0, "when `make demo` started (Unix seconds), for the step headings' clock (default: now)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "demo: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if *started > 0 {
		began = time.Unix(*started, 0)
	}
	if d := os.Getenv("DEMO_DIR"); d != "" {
		cfg.dir = d
	}
	switch v := os.Getenv("DEMO_EXIT"); v {
	case "", "0", "false":
	case "1", "true":
		cfg.exit = true
	default:
		fmt.Fprintf(os.Stderr, "demo: DEMO_EXIT=%q: want 1 or 0\n", v)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, out io.Writer) (err error) {
	// A fresh directory each run: old etcd data would mix with the new.
	if err := os.RemoveAll(cfg.dir); err != nil {
		return err
	}
	step(out, "Starting local clusters: mgmt, %s", strings.Join(cfg.workloads, ", "))
	start := time.Now()
	env, err := localcluster.Start(ctx, localcluster.Config{
		Dir:      filepath.Join(cfg.dir, "clusters"),
		Clusters: append([]string{"mgmt"}, cfg.workloads...),
	})
	if err != nil {
		return err
	}
	defer func() {
		step(out, "Stopping local clusters")
		err = errors.Join(err, env.Stop())
	}()
	fmt.Fprintf(out, "  %d kube-apiservers and one etcd ready in %s\n", len(env.Clusters()), time.Since(start).Round(100*time.Millisecond))
	for _, c := range env.Clusters() {
		fmt.Fprintf(out, "  %-10s %s  KUBECONFIG=%s\n", c.Name, c.URL, c.Kubeconfig)
	}

	step(out, "Applying sample Istio-shaped workloads")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	if err != nil {
		return err
	}
	for _, name := range cfg.workloads {
		objs, err := env.Cluster(name).Apply(ctx, fieldManager, []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(out, "  %-10s %d objects applied\n", name, len(objs))
	}

	step(out, "Applying the sample VirtualMesh to mgmt")
	vm, err := examples.Demo.ReadFile("demo/virtualmesh.yaml")
	if err != nil {
		return err
	}
	if _, err := env.Cluster("mgmt").Apply(ctx, fieldManager, vm); err != nil {
		return fmt.Errorf("mgmt: %w", err)
	}

	step(out, "What is there")
	if err := summarize(ctx, env, cfg.workloads, out); err != nil {
		return err
	}

	var end ending
	stopAgents, err := agentTrust(ctx, env, cfg, out, &end)
	defer stopAgents()
	if err != nil {
		return err
	}
	if err := end.tryCheck(ctx, out); err != nil {
		return err
	}
	end.print(out)
	if cfg.exit {
		return nil
	}
	step(out, "Clusters are up; press Ctrl-C to stop them")
	<-ctx.Done()
	return nil
}

// step prints a heading with the time since the demo began.
func step(out io.Writer, format string, args ...any) {
	fmt.Fprintf(out, "\n%s ==> "+format+"\n", append([]any{clock(time.Since(began))}, args...)...)
}

// clock formats d as M:SS.
func clock(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

var (
	gvrNamespaces   = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	gvrDeployments  = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	gvrServices     = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	gvrVirtualMeshs = networkingv1alpha1.VirtualMeshes
)

// summarize prints, per workload cluster, the mesh namespaces and their
// Deployments and Services, then the management cluster's VirtualMeshes as
// the API server stored them (defaults applied).
func summarize(ctx context.Context, env *localcluster.Env, workloads []string, out io.Writer) error {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tNAMESPACE\tINJECTION\tDEPLOYMENTS\tSERVICES")
	for _, name := range workloads {
		dyn, err := dynamic.NewForConfig(env.Cluster(name).RESTConfig())
		if err != nil {
			return err
		}
		for _, ns := range []string{"istio-system", "bookinfo"} {
			nsObj, err := dyn.Resource(gvrNamespaces).Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("%s: namespace %s: %w", name, ns, err)
			}
			inject := nsObj.GetLabels()["istio-injection"]
			if inject == "" {
				inject = "-"
			}
			deps, err := names(ctx, dyn.Resource(gvrDeployments).Namespace(ns))
			if err != nil {
				return err
			}
			svcs, err := names(ctx, dyn.Resource(gvrServices).Namespace(ns))
			if err != nil {
				return err
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, ns, inject, deps, svcs)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	dyn, err := dynamic.NewForConfig(env.Cluster("mgmt").RESTConfig())
	if err != nil {
		return err
	}
	vms, err := dyn.Resource(gvrVirtualMeshs).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VIRTUALMESH\tMESHES\tROOT CA\tROTATION\tHOSTNAME SUFFIX\tGLOBAL ACCESS")
	for _, vm := range vms.Items {
		meshes, _, _ := unstructured.NestedSlice(vm.Object, "spec", "meshes")
		var meshNames []string
		for _, m := range meshes {
			if mm, ok := m.(map[string]any); ok {
				// A mesh is named by its control plane: cluster/namespace/istiod.
				meshNames = append(meshNames, fmt.Sprintf("%v/%v/%v", mm["clusterName"], mm["namespace"], mm["name"]))
			}
		}
		root, _, _ := unstructured.NestedMap(vm.Object, "spec", "mtls", "shared", "rootCA")
		var rootKinds []string
		for k := range root {
			rootKinds = append(rootKinds, k)
		}
		sort.Strings(rootKinds)
		rotation, _, _ := unstructured.NestedString(vm.Object, "spec", "mtls", "rotationStrategy")
		suffix, _, _ := unstructured.NestedString(vm.Object, "spec", "federation", "hostnameSuffix")
		access, _, _ := unstructured.NestedString(vm.Object, "spec", "globalAccessPolicy")
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\t%s\n", vm.GetNamespace(), vm.GetName(),
			strings.Join(meshNames, ","), strings.Join(rootKinds, ","), rotation, suffix, access)
	}
	return tw.Flush()
}

func names(ctx context.Context, ri dynamic.ResourceInterface) (string, error) {
	list, err := ri.List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	var out []string
	for _, o := range list.Items {
		out = append(out, o.GetName())
	}
	sort.Strings(out)
	return strings.Join(out, ","), nil
}

// agentTrust runs the server, registers the workload clusters and starts
// their agents, then prints the identities the agents hold, and fills end
// with how to reach them. The returned function stops the processes.
func agentTrust(ctx context.Context, env *localcluster.Env, cfg config, out io.Writer, end *ending) (func(), error) {
	var procs []*localcluster.Process
	stop := func() {
		for i := len(procs) - 1; i >= 0; i-- {
			_ = procs[i].Stop(10 * time.Second)
		}
	}
	logs := filepath.Join(cfg.dir, "logs")
	if err := os.MkdirAll(logs, 0o700); err != nil {
		return stop, err
	}
	bin := cfg.relaymesh
	if bin == "" {
		step(out, "Building relaymesh and starting the management server")
		b, err := localcluster.BuildRelaymesh(cfg.dir)
		if err != nil {
			return stop, err
		}
		bin = b
	} else {
		step(out, "Starting the management server")
	}
	bin, err := filepath.Abs(bin)
	if err != nil {
		return stop, err
	}
	mgmt := env.Cluster("mgmt")
	cs, err := mgmt.Clientset()
	if err != nil {
		return stop, err
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "relaymesh", metav1.GetOptions{}); err != nil {
		return stop, fmt.Errorf("namespace relaymesh: %w", err)
	}
	relayAddr, err := loopbackAddr()
	if err != nil {
		return stop, err
	}
	// The agents dial relayAddr: the server's certificate names its IP.
	relayHost, _, err := net.SplitHostPort(relayAddr)
	if err != nil {
		return stop, err
	}
	start := func(name string, args ...string) error {
		p, err := localcluster.StartProcess(name, bin, args, filepath.Join(logs, name+".log"), false)
		if err == nil {
			procs = append(procs, p)
		}
		return err
	}
	auditLog := filepath.Join(cfg.dir, "audit.log")
	// The metrics and dashboard addresses are the ones a reader types, on
	// 127.0.0.1, where another process can take a port before the server
	// binds it: a server that lost one starts again on fresh ports.
	var opsAddr, dashAddr string
	for attempt := 1; ; attempt++ {
		if opsAddr, err = localcluster.ListenAddrOn(netip.AddrFrom4([4]byte{127, 0, 0, 1})); err != nil {
			return stop, err
		}
		if dashAddr, err = localcluster.ListenAddrOn(netip.AddrFrom4([4]byte{127, 0, 0, 1})); err != nil {
			return stop, err
		}
		serverLog := filepath.Join(logs, "server.log")
		logStart := fileSize(serverLog)
		// The demo's dashboard is on loopback, for a browser on this machine:
		// plain HTTP (the named, WEAKER opt-in the server allows there only)
		// spares it a certificate warning.
		if err := start("server", "server", "--kubeconfig", mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
			"--dashboard-listen", dashAddr, "--dashboard-plain-http", "--audit-log", auditLog, "--server-dns-names", "localhost", "--server-ips", relayHost); err != nil {
			return stop, err
		}
		server := procs[len(procs)-1]
		err := waitUp(ctx, server, "http://"+opsAddr+"/healthz", 30*time.Second)
		if err == nil {
			break
		}
		if attempt == 3 || !portTaken(serverLog, logStart) {
			return stop, fmt.Errorf("server did not come up (see %s): %w", serverLog, err)
		}
		_ = server.Stop(10 * time.Second)
		procs = procs[:len(procs)-1]
	}
	fmt.Fprintf(out, "  relay gRPC %s, metrics http://%s/metrics, audit log %s, logs in %s\n", relayAddr, opsAddr, auditLog, logs)
	if err := dashboardViewer(ctx, cs); err != nil {
		return stop, err
	}
	dashURL, tokenCmd := "http://"+dashAddr+"/", tokenCommand(mgmt.Kubeconfig)
	if err := checkDashboard(ctx, dashURL, tokenCmd); err != nil {
		return stop, err
	}
	fmt.Fprintf(out, "  dashboard %s\n", dashURL)

	step(out, "Registering the workload clusters and starting their agents")
	for _, name := range cfg.workloads {
		cmd := exec.CommandContext(ctx, bin, "cluster", "register", name, "--mgmt-kubeconfig", mgmt.Kubeconfig,
			"--remote-kubeconfig", env.Cluster(name).Kubeconfig, "--server-address", relayAddr)
		b, err := cmd.CombinedOutput()
		if err != nil {
			return stop, fmt.Errorf("register %s: %w: %s", name, err, b)
		}
		fmt.Fprintf(out, "  %s", b)
		health, err := loopbackAddr()
		if err != nil {
			return stop, err
		}
		metrics, err := loopbackAddr()
		if err != nil {
			return stop, err
		}
		if err := start("agent-"+name, "agent", "--kubeconfig", env.Cluster(name).Kubeconfig, "--health-listen", health, "--metrics-listen", metrics); err != nil {
			return stop, err
		}
	}

	step(out, "Agent identities (KubernetesCluster status in mgmt, written by the server)")
	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	if err != nil {
		return stop, err
	}
	clusters := dyn.Resource(gvrClusters).Namespace("relaymesh")
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tCONNECTED\tSPIFFE ID\tSERIAL\tEXPIRES")
	for _, name := range cfg.workloads {
		deadline := time.Now().Add(60 * time.Second)
		for {
			kc, err := clusters.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return stop, err
			}
			connected, _, _ := unstructured.NestedBool(kc.Object, "status", "connected")
			id, _, _ := unstructured.NestedString(kc.Object, "status", "agentCertificate", "spiffeID")
			serial, _, _ := unstructured.NestedString(kc.Object, "status", "agentCertificate", "serial")
			notAfter, _, _ := unstructured.NestedString(kc.Object, "status", "agentCertificate", "notAfter")
			if connected && id != "" {
				if len(serial) > 16 {
					serial = serial[:16] + "…"
				}
				fmt.Fprintf(tw, "%s\t%t\t%s\t%s\t%s\n", name, connected, id, serial, notAfter)
				break
			}
			if time.Now().After(deadline) {
				return stop, fmt.Errorf("agent of %s did not connect within 60s (see %s)", name, filepath.Join(logs, "agent-"+name+".log"))
			}
			select {
			case <-ctx.Done():
				return stop, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return stop, err
	}
	if err := showDiscovery(ctx, dyn, cfg.workloads, out); err != nil {
		return stop, err
	}
	if err := showOutputs(ctx, env, cfg.workloads[0], out); err != nil {
		return stop, err
	}
	if err := showTranslation(ctx, env, cfg.workloads, out); err != nil {
		return stop, err
	}
	if err := showTrust(ctx, env, cfg.workloads, out); err != nil {
		return stop, err
	}
	if err := showRotation(ctx, env, bin, cfg.workloads, out); err != nil {
		return stop, err
	}

	verify := exec.CommandContext(ctx, bin, "audit", "verify", auditLog)
	b, err := verify.CombinedOutput()
	if err != nil {
		return stop, fmt.Errorf("audit verify: %w: %s", err, b)
	}
	fmt.Fprintf(out, "\n  audit: %s", b)

	step(out, "Who can reach what: relaymesh policy audit --kubeconfig %s", env.Cluster("mgmt").Kubeconfig)
	// --fail-on none: findings are shown, not a failure of the demo (exit 1).
	audit := exec.CommandContext(ctx, bin, "policy", "audit", "--kubeconfig", env.Cluster("mgmt").Kubeconfig, "--fail-on", "none")
	b, err = audit.CombinedOutput()
	if err != nil {
		return stop, fmt.Errorf("policy audit: %w: %s", err, b)
	}
	fmt.Fprintf(out, "%s", b)

	kubeconfigs := []string{mgmt.Kubeconfig}
	for _, name := range cfg.workloads {
		kubeconfigs = append(kubeconfigs, env.Cluster(name).Kubeconfig)
	}
	*end = ending{relaymesh: bin, kubeconfigs: kubeconfigs, metrics: opsAddr, dashboard: dashURL, tokenCmd: tokenCmd, exit: cfg.exit}
	return stop, nil
}

var gvrClusters = multiclusterv1alpha1.KubernetesClusters

// loopbackAddr is a listen address for one of the demo's processes that no
// other process takes before it binds: a port on a private loopback
// address (localcluster.ListenAddr). Nothing retries these starts.
func loopbackAddr() (string, error) {
	return localcluster.ListenAddr()
}

// waitUp is waitHTTP for a process that may exit first.
func waitUp(ctx context.Context, p *localcluster.Process, url string, timeout time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if done, _ := p.Exited(); done {
				cancel()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	err := waitHTTP(ctx, url, timeout)
	if done, exitErr := p.Exited(); done && err != nil {
		return fmt.Errorf("%s exited: %v", p.LogPath(), exitErr)
	}
	return err
}

// fileSize is the size of the file at path, 0 if there is none.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// portTaken reports whether the log, from offset on, says a listener's
// port was taken between its pick and the bind.
func portTaken(path string, offset int64) bool {
	b, err := os.ReadFile(path)
	return err == nil && int64(len(b)) >= offset && strings.Contains(string(b[offset:]), "address already in use")
}

// waitHTTP polls url until it answers 200.
func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	c := http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %v", url, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var (
	gvrMeshes       = discoveryv1alpha1.Meshes
	gvrWorkloads    = discoveryv1alpha1.Workloads
	gvrDestinations = discoveryv1alpha1.Destinations
	gvrVirtualSvcs  = outputs.VirtualServices
)

// showDiscovery waits until the agents' snapshots are in the management
// cluster and prints the discovered meshes, workloads and destinations.
func showDiscovery(ctx context.Context, dyn dynamic.Interface, workloads []string, out io.Writer) error {
	step(out, "Discovered by the agents (Mesh, Workload, Destination objects in mgmt)")
	list := func(gvr schema.GroupVersionResource, cluster string) ([]unstructured.Unstructured, error) {
		l, err := dyn.Resource(gvr).Namespace("relaymesh").List(ctx, metav1.ListOptions{LabelSelector: "relaymesh.io/cluster=" + cluster})
		if err != nil {
			return nil, err
		}
		sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].GetName() < l.Items[j].GetName() })
		return l.Items, nil
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tKIND\tNAME\tDETAILS")
	for _, c := range workloads {
		deadline := time.Now().Add(60 * time.Second)
		for {
			d, err := list(gvrDestinations, c)
			if err != nil {
				return err
			}
			if len(d) >= 2 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no destinations of %s discovered within 60s", c)
			}
			time.Sleep(100 * time.Millisecond)
		}
		meshes, err := list(gvrMeshes, c)
		if err != nil {
			return err
		}
		for _, m := range meshes {
			td, _, _ := unstructured.NestedString(m.Object, "spec", "istio", "trustDomain")
			gws, _, _ := unstructured.NestedSlice(m.Object, "spec", "istio", "gateways")
			fmt.Fprintf(tw, "%s\tMesh\t%s\ttrust domain %s, %d gateway(s)\n", c, m.GetName(), td, len(gws))
		}
		wls, err := list(gvrWorkloads, c)
		if err != nil {
			return err
		}
		for _, w := range wls {
			sa, _, _ := unstructured.NestedString(w.Object, "spec", "kubernetes", "serviceAccountName")
			fmt.Fprintf(tw, "%s\tWorkload\t%s\tservice account %s\n", c, w.GetName(), sa)
		}
		dests, err := list(gvrDestinations, c)
		if err != nil {
			return err
		}
		for _, d := range dests {
			subsets, _, _ := unstructured.NestedMap(d.Object, "spec", "kubeService", "subsets")
			var parts []string
			for k, v := range subsets {
				parts = append(parts, fmt.Sprintf("%s=%v", k, v))
			}
			sort.Strings(parts)
			detail := "no subsets"
			if len(parts) > 0 {
				detail = "subsets " + strings.Join(parts, " ")
			}
			fmt.Fprintf(tw, "%s\tDestination\t%s\t%s\n", c, d.GetName(), detail)
		}
	}
	return tw.Flush()
}

// showOutputs sends one pass-through VirtualService to cluster and shows the
// agent applied it with its ownership label.
func showOutputs(ctx context.Context, env *localcluster.Env, cluster string, out io.Writer) error {
	step(out, "Sending a VirtualService to %s through the relay (pass-through output)", cluster)
	_, err := env.Cluster("mgmt").Apply(ctx, fieldManager, []byte(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews-v2
  namespace: relaymesh
  labels: {relaymesh.io/target-cluster: `+cluster+`}
  annotations: {relaymesh.io/target-namespace: bookinfo}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v2}}]}]}
`))
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(env.Cluster(cluster).RESTConfig())
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		vs, err := dyn.Resource(gvrVirtualSvcs).Namespace("bookinfo").Get(ctx, "reviews-v2", metav1.GetOptions{})
		if err == nil {
			fmt.Fprintf(out, "  %s: VirtualService bookinfo/reviews-v2 applied by the agent, owner=%s, parents=%s\n",
				cluster, vs.GetLabels()[outputs.OwnerLabel], vs.GetAnnotations()[outputs.ParentsAnnotation])
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the VirtualService did not reach %s within 30s: %w", cluster, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// istioKinds are the Istio resources the agents apply.
var istioKinds = outputs.IstioResources()

// showTranslation applies the sample TrafficPolicy and AccessPolicy, waits
// for their Istio objects, and prints every object the agents applied, per
// cluster, with the user objects it came from.
func showTranslation(ctx context.Context, env *localcluster.Env, workloads []string, out io.Writer) error {
	step(out, "Applying a TrafficPolicy (20%% of reviews to cluster-2) and an AccessPolicy to mgmt")
	policies, err := examples.Demo.ReadFile("demo/policies.yaml")
	if err != nil {
		return err
	}
	if _, err := env.Cluster("mgmt").Apply(ctx, fieldManager, policies); err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(env.Cluster(workloads[0]).RESTConfig())
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := dyn.Resource(istioKinds[0]).Namespace("bookinfo").Get(ctx, "relaymesh-reviews", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the TrafficPolicy's VirtualService did not reach %s within 30s", workloads[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // let the federation outputs settle too
	step(out, "Istio objects the agents applied (translated from the VirtualMesh and the policies)")
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tKIND\tNAMESPACE/NAME\tFROM")
	for _, c := range workloads {
		d, err := dynamic.NewForConfig(env.Cluster(c).RESTConfig())
		if err != nil {
			return err
		}
		for _, gvr := range istioKinds {
			l, err := d.Resource(gvr).Namespace("").List(ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel + "=relaymesh-agent"})
			if err != nil {
				return err
			}
			sort.Slice(l.Items, func(i, j int) bool {
				return l.Items[i].GetNamespace()+l.Items[i].GetName() < l.Items[j].GetNamespace()+l.Items[j].GetName()
			})
			for _, o := range l.Items {
				fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%s\n", c, o.GetKind(), o.GetNamespace(), o.GetName(), o.GetAnnotations()[outputs.ParentsAnnotation])
			}
		}
	}
	return tw.Flush()
}

// showTrust waits for every mesh's cacerts (the agent generates the key and
// sends only a CSR) and shows each intermediate chaining to the one root of
// the VirtualMesh.
// showRotation rotates the VirtualMesh's root (MultiRoot, verification
// None: every phase moves on once both agents acked the one before) and
// shows the phases and where each mesh ends up.
func showRotation(ctx context.Context, env *localcluster.Env, bin string, workloads []string, out io.Writer) error {
	mgmt := env.Cluster("mgmt").Kubeconfig
	step(out, "Rotating the shared root with no failed handshake: relaymesh ca rotate start relaymesh/bookinfo-federation --wait 2m")
	b, err := exec.CommandContext(ctx, bin, "ca", "rotate", "start", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt, "--wait", "2m").CombinedOutput()
	fmt.Fprintf(out, "%s", b)
	if err != nil {
		return fmt.Errorf("ca rotate start: %w", err)
	}
	b, err = exec.CommandContext(ctx, bin, "ca", "status", "relaymesh/bookinfo-federation", "--kubeconfig", mgmt).CombinedOutput()
	fmt.Fprintf(out, "\n%s", b)
	if err != nil {
		return fmt.Errorf("ca status: %w", err)
	}
	return showIntermediates(ctx, env, workloads, "After the rotation: each mesh holds only the new root, and an intermediate from it", out)
}

func showTrust(ctx context.Context, env *localcluster.Env, workloads []string, out io.Writer) error {
	return showIntermediates(ctx, env, workloads, "Shared trust: each mesh's intermediate CA (key generated in its own cluster) chains to the VirtualMesh's root", out)
}

func showIntermediates(ctx context.Context, env *localcluster.Env, workloads []string, title string, out io.Writer) error {
	step(out, "%s", title)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tSECRET\tINTERMEDIATE\tSIGNS ONLY\tSERIAL\tEXPIRES\tROOTS IN BUNDLE\tCHAINS TO ROOT")
	bundles := map[string]string{}
	for _, c := range workloads {
		cs, err := env.Cluster(c).Clientset()
		if err != nil {
			return err
		}
		var sec *corev1.Secret
		deadline := time.Now().Add(30 * time.Second)
		for {
			sec, err = cs.CoreV1().Secrets("istio-system").Get(ctx, trust.SecretName, metav1.GetOptions{})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: no %s Secret within 30s: %w", c, trust.SecretName, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		inter, err := pemutil.ParseCertificate(sec.Data[trust.KeyCACert])
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		roots, err := pemutil.ParseCertificateBundle(sec.Data[trust.KeyRootCert])
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		pool := x509.NewCertPool()
		for _, r := range roots {
			pool.AddCert(r)
		}
		_, verr := inter.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		bundles[c] = string(sec.Data[trust.KeyRootCert])
		var fps []string
		for _, r := range roots {
			fps = append(fps, trust.ShortFingerprint(trust.Fingerprint(r))+"…")
		}
		// Name constraints: the intermediate signs identities of its own
		// mesh's trust domain only.
		signs := "ANY TRUST DOMAIN"
		if len(inter.PermittedURIDomains) > 0 {
			signs = "spiffe://" + strings.Join(inter.PermittedURIDomains, ",") + "/…"
		}
		fmt.Fprintf(tw, "%s\tistio-system/%s\t%s\t%s\t%s…\t%s\t%s\t%t\n", c, trust.SecretName, inter.Subject.CommonName, signs,
			inter.SerialNumber.Text(16)[:12], inter.NotAfter.UTC().Format(time.DateOnly), strings.Join(fps, " "), verr == nil)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	same := true
	for _, c := range workloads[1:] {
		same = same && bundles[c] == bundles[workloads[0]]
	}
	fmt.Fprintf(out, "  one root bundle in every mesh: %t; intermediate keys never left their clusters (only CSRs did)\n", same)
	if !same {
		return errors.New("the meshes carry different root bundles")
	}
	return nil
}
