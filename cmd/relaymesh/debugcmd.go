package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/check"
	"github.com/relaymesh/relaymesh/internal/debugreport"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/opsclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/spf13/cobra"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const debugReportSynopsis = `Collect one archive (tar.gz, mode 0600) for a bug report or a support case:
the server's /debug snapshots (snapshots/input, snapshots/output,
admission), its metrics, the agents' metrics and health, recent logs (of
the server's and agents' pods, and of the --log-file files of processes
outside pods), versions, the Relaymesh custom resources with their statuses,
the objects around them (ConfigMaps, Leases, events, Secret summaries) in
the management cluster and each workload cluster, and the output of
relaymesh check. manifest.json lists every part and why one is missing.

Nothing secret goes in: Secrets appear only as names, key names, sizes and
certificate summaries; every file is redacted of private keys, JWTs, bearer
and bootstrap tokens, and the value of every Secret read.

/debug/* needs a bearer token the management apiserver accepts whose user
may get relaymesh.io/debug in --namespace (a Role: apiGroups [relaymesh.io],
resources [debug], verbs [get]). With --token-service-account NAME the
command mints a 10-minute token for that service account of --namespace
(TokenRequest; you need create on serviceaccounts/token) and keeps it in
memory only. Otherwise it uses your kubeconfig user's bearer token, if it
has one. A token goes only over HTTPS (the metrics port's default,
verified against the relay root or --server-metrics-ca-file), or over
plain HTTP (--server-metrics-plain-http) to a loopback address: a token
for a non-loopback plain-HTTP address is refused. The apiserver's service
proxy strips bearer tokens, so /debug needs --server-metrics-address.`

type debugFlags struct {
	clusters        twoClusters
	remotes         []string
	remoteNamespace string
	ops             serverOps
	tokenSA         string
	logFiles        []string
	agentMetrics    []string
	agentHealth     []string
	out             string
	output          string
}

// debugPaths are the server's /debug endpoints (server/app/serve.go).
var debugPaths = []string{"/debug/snapshots/input", "/debug/snapshots/output", "/debug/admission"}

func newDebugCommand(d deps, g *globals) *cobra.Command {
	var f debugFlags
	report := &cobra.Command{
		Use:   "report",
		Short: "Collect snapshots, metrics, logs, versions, statuses and check output into one redacted archive",
		Long:  debugReportSynopsis,
		Example: `  # The server's metrics port through a port-forward, a token of a debug-only service account
  kubectl -n relaymesh port-forward svc/relaymesh-server 9091 &
  relaymesh debug report --context mgmt --server-metrics-address 127.0.0.1:9091 \
    --token-service-account relaymesh-debug --out relaymesh-debug.tar.gz

  # Processes outside pods: name their log files
  relaymesh debug report --server-metrics-address 127.0.0.1:9091 --token-service-account relaymesh-debug \
    --log-file server=/var/log/relaymesh/server.log --log-file agent-cluster-1=/var/log/relaymesh/agent.log`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runDebugReport(c.Context(), d, g, &f)
		},
	}
	fs := report.Flags()
	f.clusters.addFlags(fs, g, false)
	fs.StringArrayVar(&f.remotes, "remote-context", nil, "kubeconfig context of a workload cluster to collect from (repeatable; default: every context named after a registered cluster)")
	fs.StringVar(&f.remoteNamespace, "remote-namespace", defaultNamespace, "the agents' namespace in the workload clusters")
	f.ops.addFlags(fs)
	fs.StringVar(&f.tokenSA, "token-service-account", "", "mint a short-lived token of this service account of --namespace to read /debug (it needs get on relaymesh.io/debug)")
	fs.StringArrayVar(&f.logFiles, "log-file", nil, "NAME=PATH of a log to include, for processes outside pods (repeatable; the last 4 MiB)")
	fs.StringArrayVar(&f.agentMetrics, "agent-metrics-address", nil, "CLUSTER=HOST:PORT of an agent's metrics port to read /metrics and /readyz from (repeatable)")
	fs.StringArrayVar(&f.agentHealth, "agent-health-address", nil, "CLUSTER=HOST:PORT of an agent's health port to read its JSON /readyz from (repeatable)")
	fs.StringVar(&f.out, "out", "", "the archive to write (created, mode 0600; default relaymesh-debug-TIME.tar.gz)")
	outputFlag(report, &f.output, printer.Formats)
	_ = report.RegisterFlagCompletionFunc("remote-context", completeContexts(g))
	f.clusters.complete(report, g)
	return groupCommand("debug", "Collect what a bug report needs", "Collect what a bug report or support case needs.",
		"  relaymesh debug report --server-metrics-address 127.0.0.1:9091 --token-service-account relaymesh-debug", report)
}

// manifestView prints a debug report's manifest.
type manifestView struct {
	Archive string `json:"archive"`
	debugreport.Manifest
}

func (m manifestView) Columns(bool) []string { return []string{"PART", "BYTES", "SOURCE", "ERROR"} }

func (m manifestView) Rows(wide bool) [][]string {
	var rows [][]string
	for _, p := range m.Parts {
		src := p.Source
		if !wide && len(src) > 60 {
			src = src[:57] + "..."
		}
		rows = append(rows, []string{p.Path, fmt.Sprint(p.Bytes), src, p.Error})
	}
	return rows
}

func runDebugReport(ctx context.Context, d deps, g *globals, f *debugFlags) error {
	format, err := printer.Parse(f.output, printer.Formats)
	if err != nil {
		return usageError{err}
	}
	logFiles, err := keyValues("--log-file", f.logFiles)
	if err != nil {
		return err
	}
	agentMetrics, err := keyValues("--agent-metrics-address", f.agentMetrics)
	if err != nil {
		return err
	}
	agentHealth, err := keyValues("--agent-health-address", f.agentHealth)
	if err != nil {
		return err
	}
	now := d.now()
	out := f.out
	if out == "" {
		out = "relaymesh-debug-" + now.UTC().Format("20060102T150405Z") + ".tar.gz"
	}
	// The archive is created first: a name that exists is refused before
	// anything is collected.
	file, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	written := false
	defer func() {
		if !written {
			_ = file.Close()
			_ = os.Remove(out)
		}
	}()

	cc := checkFlags{clusters: f.clusters, remotes: f.remotes, remoteNamespace: f.remoteNamespace, leaseName: check.DefaultLeaseName, ops: f.ops}
	cfg, err := checkConfig(ctx, g, &cc)
	if err != nil {
		return err
	}
	server := f.ops.client(cfg.Mgmt, g.namespace)
	redactor := &debugreport.Redactor{}
	tokenNote, err := debugToken(ctx, cfg.Mgmt, g.namespace, f.tokenSA, server, redactor)
	if err != nil {
		return err
	}

	report, _ := check.Run(ctx, cfg, now)
	var checkText bytes.Buffer
	_ = printer.Print(&checkText, printer.Table, report)
	v := versions{Client: componentVersion{Component: "client", Version: version(), Source: "this binary"}}
	_ = collectVersions(ctx, g, &f.ops, &v)

	manifest, err := debugreport.Write(ctx, file, debugreport.Config{
		Clusters:   debugClusters(cfg, g.namespace, f.remoteNamespace, agentMetrics, agentHealth),
		Server:     server,
		DebugPaths: debugPaths,
		LogFiles:   logFiles,
		Extra: map[string]any{
			"version.json": v,
			"check.json":   report,
			"check.txt":    checkText.Bytes(),
			"README.txt":   fmt.Sprintf("relaymesh debug report, %s, by relaymesh %s.\n/debug read with: %s.\nmanifest.json lists every part.\n", now.UTC().Format("2006-01-02T15:04:05Z"), version(), tokenNote),
		},
		Redactor: redactor,
		Now:      now,
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := file.Close(); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	written = true
	return printManifest(d, format, out, manifest)
}

// debugToken picks the token /debug is read with: a short-lived one of
// --token-service-account, else the kubeconfig user's (loopback addresses
// only), else none. It sets it on server, adds it to redactor, and
// returns the note README.txt gives about it.
func debugToken(ctx context.Context, mgmt *kubeclient.Clients, namespace, tokenSA string, server *opsclient.Client, redactor *debugreport.Redactor) (string, error) {
	// A token that could only travel in cleartext to another machine is
	// refused before it is minted or read.
	if tokenSA != "" || (mgmt != nil && (mgmt.Config.BearerToken != "" || mgmt.Config.BearerTokenFile != "")) {
		if err := server.TokenAllowed(); err != nil {
			return "", fmt.Errorf("/debug: %w", err)
		}
	}
	switch {
	case tokenSA != "":
		token, err := mintDebugToken(ctx, mgmt, namespace, tokenSA)
		if err != nil {
			return "", err
		}
		redactor.Add([]byte(token))
		server.Token = token
		return "a 10-minute token of service account " + namespace + "/" + tokenSA, nil
	case mgmt.Config.BearerToken != "" || mgmt.Config.BearerTokenFile != "":
		token := mgmt.Config.BearerToken
		if token == "" {
			b, err := os.ReadFile(mgmt.Config.BearerTokenFile)
			if err != nil {
				return "", fmt.Errorf("your kubeconfig's token file: %w", err)
			}
			token = strings.TrimSpace(string(b))
		}
		redactor.Add([]byte(token))
		server.Token = token
		return "your kubeconfig user's token", nil
	default:
		return "none: /debug is not collected (give --token-service-account)", nil
	}
}

// debugClusters are what the report collects: the management cluster, the
// workload clusters, and the agents' operations addresses given.
func debugClusters(cfg check.Config, namespace, remoteNamespace string, agentMetrics, agentHealth map[string]string) []debugreport.Cluster {
	clusters := []debugreport.Cluster{{Name: "mgmt", Clients: cfg.Mgmt, Namespaces: []string{namespace}, Resources: mgmtResources, PodSelector: "app.kubernetes.io/name=relaymesh-server"}}
	for _, w := range cfg.Workloads {
		c := debugreport.Cluster{Name: w.Context, Clients: w.Clients, Err: w.Err, Namespaces: []string{remoteNamespace, "istio-system"}, PodSelector: "app.kubernetes.io/name=relaymesh-agent"}
		clusters = append(clusters, c)
	}
	for _, cluster := range sortedKeys(agentMetrics) {
		clusters = append(clusters, debugreport.Cluster{Name: "agent-" + cluster + "-metrics", Ops: &opsclient.Client{Address: agentMetrics[cluster]}, OpsPaths: []string{"/metrics", "/readyz"}})
	}
	for _, cluster := range sortedKeys(agentHealth) {
		clusters = append(clusters, debugreport.Cluster{Name: "agent-" + cluster + "-health", Ops: &opsclient.Client{Address: agentHealth[cluster]}, OpsPaths: []string{"/readyz"}})
	}
	return clusters
}

// printManifest prints the report's manifest, and on stderr how many
// parts could not be collected.
func printManifest(d deps, format printer.Format, out string, manifest *debugreport.Manifest) error {
	if err := printer.Print(d.stdout, format, manifestView{Archive: out, Manifest: *manifest}); err != nil {
		return err
	}
	missing := 0
	for _, p := range manifest.Parts {
		if p.Error != "" {
			missing++
		}
	}
	fmt.Fprintf(d.stderr, "wrote %s: %d parts, %d could not be collected (see manifest.json)\n", out, len(manifest.Parts), missing)
	return nil
}

// mgmtResources are the Relaymesh resources of the management cluster.
var mgmtResources = []schema.GroupVersionResource{
	multiclusterv1alpha1.KubernetesClusters,
	networkingv1alpha1.VirtualMeshes,
	networkingv1alpha1.TrafficPolicies,
	networkingv1alpha1.AccessPolicies,
	networkingv1alpha1.VirtualDestinations,
	discoveryv1alpha1.Meshes,
	discoveryv1alpha1.Workloads,
	discoveryv1alpha1.Destinations,
	{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"},
}

// mintDebugToken asks the apiserver for a 10-minute token of a service
// account (the shortest TokenRequest allows).
func mintDebugToken(ctx context.Context, k *kubeclient.Clients, namespace, account string) (string, error) {
	seconds := int64(600)
	tr, err := k.Typed.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, account, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("--token-service-account %s: a token for %s/%s: %w", account, namespace, account, err)
	}
	return tr.Status.Token, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// keyValues parses repeated KEY=VALUE flags.
func keyValues(flag string, values []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range values {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" || val == "" || strings.ContainsAny(k, "/\\") {
			return nil, usageError{fmt.Errorf("%s %q: want NAME=VALUE", flag, v)}
		}
		if _, dup := out[k]; dup {
			return nil, usageError{errors.New(flag + " " + k + " given twice")}
		}
		out[k] = val
	}
	return out, nil
}
