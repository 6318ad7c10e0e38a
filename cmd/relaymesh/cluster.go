package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/cmd/relaymesh/internal/registration"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

const clusterSynopsis = `Workload clusters are registered in the management cluster (one
KubernetesCluster each, in --namespace); their agents then dial out to the
relay server with a single-use bootstrap token.`

const registerSynopsis = `Create the KubernetesCluster NAME in the management cluster, mint a
single-use bootstrap token for it, and write the agent's secrets
(relay-root-tls-secret with the relay root certificate only,
relay-identity-token-secret with the token) and relaymesh-agent-config into
the workload cluster's --remote-namespace. The token is never printed (but
with --dry-run, where printing it is the point).

The management cluster is --mgmt-context (default --context) of the merged
kubeconfig, or --mgmt-kubeconfig; the workload cluster is --remote-context
(default: a context named NAME), or --remote-kubeconfig.

--chart also installs the relaymesh-agent chart into the workload cluster
with the Helm SDK (helm upgrade --install semantics: release --release-name
in --remote-namespace), with the cluster's name and server address as
values over any --values/--set; --wait waits for the agent to be ready.

The management cluster can be its own workload cluster (the single-cluster
layout) with the agent in a namespace of its own: --remote-namespace
relaymesh-agent here, and the agent run with --namespace relaymesh-agent.
Registration (and re-bootstrap, and deregister's cleanup) refuses the
server's namespace before writing anything: the agent's Secrets would
overwrite the server's relay root.

--dry-run is for GitOps: the workload cluster is not touched (and need not
be reachable). The management side is registered for real — the
KubernetesCluster, and the bootstrap token the printed Secret holds (only
its hash is stored) — and what would be written into the workload cluster
is printed instead (-o yaml or json): the namespace, the two Secrets and
the ConfigMap, and with --chart the chart rendered with its values. The
token is single-use and expires after --token-ttl: commit it encrypted
(SOPS, Sealed Secrets), never in plain text.

--trust-domain grants the trust domains the cluster's meshes may use
(default: NAME.local). The grant is the registry's word, not the agent's: a
mesh reporting any other trust domain gets no intermediate and makes every
VirtualMesh naming it Invalid. No two clusters may hold one trust domain
unless both mark it shared (--shared-trust-domain here, shared: true in the
other's KubernetesCluster); registration refuses a grant another cluster
holds, and the server refuses the trust domain to both if one is written
anyway. An administrator changes the grant later in the KubernetesCluster's
spec.trustDomains.

A registration that fails half-way is rolled back, so a retry starts clean.`

const deregisterSynopsis = `Delete the KubernetesCluster NAME and its unused tokens; the server ends the
cluster's sessions at once and refuses its certificate and renewals from
then on.

With --remote-context or --remote-kubeconfig it also cleans the workload
cluster: it removes what the agent applied — the Istio objects carrying the
label relaymesh.io/owner=relaymesh-agent (ServiceEntries, VirtualServices,
DestinationRules, Gateways, AuthorizationPolicies with the global deny,
PeerAuthentications) and the cacerts Secrets carrying it — and the agent's
secrets. Objects without the label (your own, a cacerts you made) are never
touched. Removing the AuthorizationPolicies leaves the mesh to Istio's
default (allow); istiod keeps the removed CA until it restarts. The agent's
Deployment (its Helm release) is left: uninstall it. --keep-istio-config
leaves the applied objects and prints the commands that remove them.

Without a workload cluster named, it prints those commands: run them there.`

type registerFlags struct {
	clusters                                  twoClusters
	remoteNamespace, serverAddr, domain, mode string
	ttl                                       time.Duration
	chart                                     registration.Chart
	dryRun                                    bool
	output                                    string
	trustDomains, sharedTrustDomains          []string
}

func newClusterCommand(d deps, g *globals) *cobra.Command {
	return groupCommand("cluster", "Register, re-bootstrap, deregister and list workload clusters", clusterSynopsis, `  relaymesh cluster list
  relaymesh cluster register cluster-1 --remote-context cluster-1 --server-address relay.example.com:9900
  relaymesh cluster re-bootstrap cluster-1 --remote-context cluster-1
  relaymesh cluster deregister cluster-1 --remote-context cluster-1`,
		newClusterRegisterCommand(d, g), newClusterRebootstrapCommand(d, g), newClusterDeregisterCommand(d, g), newClusterListCommand(d, g))
}

func newClusterRegisterCommand(d deps, g *globals) *cobra.Command {
	var f registerFlags
	c := &cobra.Command{
		Use:   "register NAME",
		Short: "Register a workload cluster, write its agent's bootstrap secrets, optionally install the agent chart",
		Long:  registerSynopsis,
		Example: `  # Both clusters from one merged kubeconfig (KUBECONFIG=mgmt.yaml:cluster-1.yaml), agent installed with Helm
  relaymesh cluster register cluster-1 --mgmt-context mgmt --remote-context cluster-1 \
    --server-address relay.example.com:9900 --chart charts/relaymesh-agent \
    --set image.repository=registry.example.com/platform/relaymesh

  # The same with one kubeconfig file per cluster, secrets only
  relaymesh cluster register cluster-1 --mgmt-kubeconfig mgmt.yaml --remote-kubeconfig cluster-1.yaml \
    --server-address relay.example.com:9900

  # GitOps: print the workload cluster's Secrets, ConfigMap and rendered chart
  relaymesh cluster register cluster-2 --mgmt-context mgmt --server-address relay.example.com:9900 \
    --chart charts/relaymesh-agent --dry-run -o yaml > cluster-2.yaml`,
		Args: exactArgs(1, "exactly one cluster NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			return runRegister(c.Context(), d, g, &f, args[0])
		},
	}
	fs := c.Flags()
	f.clusters.addFlags(fs, g, true)
	fs.StringVar(&f.remoteNamespace, "remote-namespace", defaultNamespace, "the agent's namespace in the workload cluster")
	fs.StringVar(&f.serverAddr, "server-address", "", "relay server host:port the agent dials (required in relay mode)")
	fs.StringVar(&f.domain, "cluster-domain", "cluster.local", "the workload cluster's DNS domain")
	fs.DurationVar(&f.ttl, "token-ttl", identity.DefaultTokenTTL, "how long the bootstrap token stays valid")
	fs.StringVar(&f.mode, "mode", "relay", "relay (an agent in the cluster dials out; secure default) or kubeconfig (WEAKER: the server keeps the workload cluster's credentials in a Secret and manages the cluster itself; needs 'relaymesh server --allow-kubeconfig-clusters')")
	fs.StringVar(&f.chart.Ref, "chart", "", "install the relaymesh-agent chart from this directory, .tgz, oci:// reference or repository URL into the workload cluster (Helm SDK)")
	fs.StringVar(&f.chart.Version, "chart-version", "", "version constraint of --chart (oci and repositories; default the latest)")
	fs.StringVar(&f.chart.Release, "release-name", registration.AgentChartName, "Helm release name of the agent chart")
	fs.StringArrayVarP(&f.chart.ValueFiles, "values", "f", nil, "chart values file (repeatable; the cluster's name and server address always win)")
	fs.StringArrayVar(&f.chart.Set, "set", nil, "chart value KEY=VALUE (repeatable; Helm's --set syntax)")
	fs.BoolVar(&f.chart.Wait, "wait", false, "wait until the agent Deployment is ready")
	fs.DurationVar(&f.chart.Timeout, "timeout", 5*time.Minute, "how long Helm may take")
	fs.StringArrayVar(&f.trustDomains, "trust-domain", nil, "a trust domain the cluster's meshes may use (repeatable; default NAME.local): a mesh reporting any other gets no intermediate")
	fs.StringArrayVar(&f.sharedTrustDomains, "shared-trust-domain", nil, "a trust domain the cluster's meshes may use that other clusters may hold too, if each of them marks it shared as well (repeatable; WEAKER: the meshes of every cluster holding it can sign each other's identities)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "do not touch the workload cluster: register in the management cluster and print what would be written there (see above)")
	outputFlag(c, &f.output, []printer.Format{printer.YAML, printer.JSON})
	f.clusters.complete(c, g)
	_ = c.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{"relay", "kubeconfig"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func runRegister(ctx context.Context, d deps, g *globals, f *registerFlags, name string) error {
	req, format, err := f.request(g, name)
	if err != nil {
		return err
	}
	remoteSrc, err := f.clusters.workload(g, name, f.dryRun, "")
	if err != nil {
		return err
	}
	// The chart and its values are checked before anything is written.
	var chart *registration.Loaded
	if f.chart.Ref != "" {
		if chart, err = f.chart.Load(); err != nil {
			return err
		}
	}
	mgmt, err := f.clusters.mgmtClients(g)
	if err != nil {
		return err
	}
	if f.dryRun {
		return registerDryRun(ctx, d, mgmt, req, f.chart, chart, format)
	}
	remote, err := remoteSrc.Load()
	if err != nil {
		return fmt.Errorf("workload cluster: %w", err)
	}
	// The workload cluster must answer before anything is written.
	if _, err := remote.Typed.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("workload cluster unreachable: %w", err)
	}
	if f.mode == "kubeconfig" {
		return registerKubeconfig(ctx, d, g, f, name, mgmt, remote, remoteSrc, req.TrustDomains)
	}
	return registerRelay(ctx, d, g, f, req, mgmt, remote, remoteSrc, chart)
}

// request is the registration the flags ask for, checked before anything
// is read or written.
func (f *registerFlags) request(g *globals, name string) (registration.Request, printer.Format, error) {
	var req registration.Request
	if err := identity.ValidateClusterName(name); err != nil {
		return req, "", usageError{err}
	}
	format, err := printer.Parse(f.output, []printer.Format{printer.YAML, printer.JSON})
	if err != nil {
		return req, "", usageError{err}
	}
	grants, err := f.grants()
	if err != nil {
		return req, "", err
	}
	req = registration.Request{Cluster: name, Namespace: g.namespace, RemoteNamespace: f.remoteNamespace, ServerAddress: f.serverAddr, ClusterDomain: f.domain, TokenTTL: f.ttl,
		TrustDomains: grants}
	switch f.mode {
	case "relay":
		if err := req.Validate(); err != nil {
			return req, "", usageError{err}
		}
	case "kubeconfig":
		if f.dryRun || f.chart.Ref != "" {
			return req, "", usagef("--mode kubeconfig registers no agent: --dry-run and --chart do not apply")
		}
	default:
		return req, "", usagef("--mode %q: want relay or kubeconfig", text.Truncate(f.mode, 40))
	}
	return req, format, nil
}

// registerKubeconfig registers the cluster in kubeconfig mode: the server
// gets a standalone kubeconfig of it (WEAKER), no agent runs.
func registerKubeconfig(ctx context.Context, d deps, g *globals, f *registerFlags, name string, mgmt, remote *kubeclient.Clients, remoteSrc kubeclient.Source, grants []multiclusterv1alpha1.TrustDomainGrant) error {
	raw, err := registration.StandaloneKubeconfig(remoteSrc)
	if err != nil {
		return err
	}
	secret, err := registration.RegisterKubeconfig(ctx, mgmt, remote, raw, name, g.namespace, f.domain, grants)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.stdout, "registered cluster %s in kubeconfig mode (WEAKER: the server holds its credentials in %s/%s), granted trust domain(s) %s; the server manages it only with --allow-kubeconfig-clusters\n",
		name, g.namespace, secret, grantNames(name, grants))
	return nil
}

// registerRelay registers the cluster for a relay agent: the
// KubernetesCluster and its token in the management cluster, the agent's
// Secrets in the workload cluster (rolled back if they cannot be
// written), and the agent chart if --chart names one.
func registerRelay(ctx context.Context, d deps, g *globals, f *registerFlags, req registration.Request, mgmt, remote *kubeclient.Clients, remoteSrc kubeclient.Source, chart *registration.Loaded) error {
	name, grants := req.Cluster, req.TrustDomains
	if err := registration.CheckAgentNamespace(ctx, mgmt, remote, g.namespace, f.remoteNamespace); err != nil {
		return err
	}
	bundle, rollback, err := registration.Register(ctx, mgmt, req)
	if err != nil {
		return err
	}
	if err := bundle.WriteTo(ctx, remote.Typed); err != nil {
		rollback(ctx)
		fmt.Fprintf(d.stdout, "registration of %s failed; rolled back the KubernetesCluster and its token\n", name)
		return err
	}
	fmt.Fprintf(d.stdout, "registered cluster %s: KubernetesCluster %s/%s granted trust domain(s) %s, bootstrap token %s (single use, expires %s) written to %s/%s in the workload cluster\n",
		name, g.namespace, name, grantNames(name, grants), bundle.TokenID, bundle.ExpiresAt.Format(time.RFC3339), f.remoteNamespace, identity.TokenSecret)
	if f.chart.Ref == "" {
		return nil
	}
	rel, err := registration.InstallChart(ctx, remoteSrc, bundle, f.chart, chart, d.stderr)
	if err != nil {
		// The registration stands: the agent can be installed again (or
		// with helm) with the Secrets in place.
		return fmt.Errorf("the cluster is registered, but installing the agent chart failed (run the command again with --chart after deregistering, or helm install): %w", err)
	}
	fmt.Fprintf(d.stdout, "installed chart %s %s as release %s (revision %d) in %s of the workload cluster\n", rel.Chart.Metadata.Name, rel.Chart.Metadata.Version, rel.Name, rel.Version, rel.Namespace)
	return nil
}

// grants are the trust domains of --trust-domain and --shared-trust-domain,
// checked as the KubernetesCluster schema would; none: the default grant.
func (f *registerFlags) grants() ([]multiclusterv1alpha1.TrustDomainGrant, error) {
	var out []multiclusterv1alpha1.TrustDomainGrant
	for _, td := range f.trustDomains {
		if slices.Contains(f.sharedTrustDomains, td) {
			return nil, usagef("trust domain %q is given both as --trust-domain and as --shared-trust-domain: give it once", td)
		}
		out = append(out, multiclusterv1alpha1.TrustDomainGrant{Name: td})
	}
	for _, td := range f.sharedTrustDomains {
		out = append(out, multiclusterv1alpha1.TrustDomainGrant{Name: td, Shared: true})
	}
	if err := registration.ValidateGrants(out); err != nil {
		return nil, usageError{err}
	}
	return out, nil
}

// grantNames is how a grant reads in a message: "eu.local, shared.example (shared)".
func grantNames(cluster string, grants []multiclusterv1alpha1.TrustDomainGrant) string {
	var names []string
	for _, g := range registration.Grants(cluster, grants) {
		if g.Shared {
			names = append(names, g.Name+" (shared)")
		} else {
			names = append(names, g.Name)
		}
	}
	return strings.Join(names, ", ")
}

// registerDryRun registers in the management cluster and prints what would
// be written into the workload cluster.
func registerDryRun(ctx context.Context, d deps, mgmt *kubeclient.Clients, req registration.Request, chart registration.Chart, loaded *registration.Loaded, format printer.Format) error {
	bundle, rollback, err := registration.Register(ctx, mgmt, req)
	if err != nil {
		return err
	}
	var rendered string
	if loaded != nil {
		if rendered, err = registration.RenderChart(chart, loaded, bundle); err != nil {
			rollback(ctx)
			return err
		}
	}
	var out bytes.Buffer
	if err := writeBundle(&out, format, bundle, rendered); err != nil {
		rollback(ctx)
		return err
	}
	if _, err := d.stdout.Write(out.Bytes()); err != nil {
		return err
	}
	fmt.Fprintf(d.stderr, "registered cluster %s in the management cluster, granted trust domain(s) %s; the bootstrap token %s in the output is single use and expires %s: apply the output to the workload cluster before then, and keep it encrypted\n",
		req.Cluster, grantNames(req.Cluster, req.TrustDomains), bundle.TokenID, bundle.ExpiresAt.Format(time.RFC3339))
	return nil
}

// writeBundle prints the bundle's objects (and the rendered chart): YAML
// documents after a comment with the chart values, or one JSON List.
func writeBundle(w io.Writer, format printer.Format, b *registration.Bundle, rendered string) error {
	objs := b.Objects()
	if format == printer.JSON {
		items := make([]any, 0, len(objs))
		for _, o := range objs {
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
			if err != nil {
				return err
			}
			items = append(items, u)
		}
		for _, doc := range splitYAML(rendered) {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				return fmt.Errorf("rendered chart: %w", err)
			}
			if len(m) > 0 {
				items = append(items, m)
			}
		}
		return printer.WriteJSON(w, map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	}
	if b.Values == nil {
		// A re-bootstrap: the Secrets only, the chart's values stand.
		fmt.Fprintf(w, "# Workload cluster %s: apply to its namespace %s, delete its %s, restart the agent.\n", b.Cluster, b.Namespace, identity.ClientSecret)
	} else {
		values, err := yaml.Marshal(b.Values)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "# Workload cluster %s: apply to its namespace %s. Values of the relaymesh-agent chart:\n", b.Cluster, b.Namespace)
		for _, line := range strings.Split(strings.TrimSpace(string(values)), "\n") {
			fmt.Fprintf(w, "#   %s\n", line)
		}
	}
	for _, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "---\n%s", y)
	}
	if rendered != "" {
		fmt.Fprintf(w, "%s", rendered)
	}
	return nil
}

// splitYAML splits a YAML stream into documents.
func splitYAML(s string) []string {
	var docs []string
	for _, doc := range strings.Split("\n"+s, "\n---") {
		if strings.TrimSpace(doc) != "" {
			docs = append(docs, doc)
		}
	}
	return docs
}

func newClusterDeregisterCommand(d deps, g *globals) *cobra.Command {
	var tc twoClusters
	var remoteNamespace string
	var keepIstio bool
	c := &cobra.Command{
		Use:   "deregister NAME",
		Short: "Deregister a workload cluster: end its sessions, refuse its certificate, remove what its agent applied",
		Long:  deregisterSynopsis,
		Example: `  # Deregister, and remove from the workload cluster what the agent applied and its secrets
  relaymesh cluster deregister cluster-1 --mgmt-context mgmt --remote-context cluster-1

  # Deregister only (the workload cluster is gone or unreachable): prints the cleanup to run there
  relaymesh cluster deregister cluster-1 --mgmt-context mgmt`,
		Args:              exactArgs(1, "exactly one cluster NAME"),
		ValidArgsFunction: completeFrom(func() (kubeclient.Source, error) { return tc.mgmt(g) }, g, false, clusterNames),
		RunE: func(c *cobra.Command, args []string) error {
			name := args[0]
			if err := identity.ValidateClusterName(name); err != nil {
				return usageError{err}
			}
			mgmt, err := tc.mgmtClients(g)
			if err != nil {
				return err
			}
			var remote *kubeclient.Clients
			// Only an explicitly named workload cluster is cleaned up.
			if tc.remoteContext != "" || tc.remoteKubeconfig != "" {
				src, _, err := tc.remote(g, "")
				if err != nil {
					return err
				}
				if remote, err = src.Load(); err != nil {
					return fmt.Errorf("workload cluster: %w", err)
				}
			}
			if remote != nil {
				// Checked first: the cleanup would remove the server's
				// own Secrets.
				if err := registration.CheckAgentNamespace(c.Context(), mgmt, remote, g.namespace, remoteNamespace); err != nil {
					return err
				}
			}
			if err := registration.Deregister(c.Context(), mgmt, g.namespace, name); err != nil {
				return err
			}
			fmt.Fprintf(d.stdout, "deregistered cluster %s: its sessions end and its certificate is refused from now on\n", name)
			if remote == nil || keepIstio {
				why := "the workload cluster was not named (--remote-context or --remote-kubeconfig)"
				if remote != nil {
					why = "--keep-istio-config"
				}
				fmt.Fprintf(d.stdout, "%s: the Istio objects and cacerts Secrets its agent applied stay in the workload cluster. Remove them there with:\n", why)
				for _, cmd := range registration.CleanupCommands(agentOwner) {
					fmt.Fprintf(d.stdout, "  %s\n", cmd)
				}
			}
			if remote == nil {
				return nil
			}
			if !keepIstio {
				removed, err := registration.RemoveApplied(c.Context(), remote, agentOwner, false)
				printRemoved(d.stdout, removed)
				if err != nil {
					return fmt.Errorf("remove what the agent applied in the workload cluster (run the command again to finish): %w", err)
				}
			}
			if err := registration.RemoveAgentSecrets(c.Context(), remote.Typed, remoteNamespace); err != nil {
				return err
			}
			fmt.Fprintf(d.stdout, "removed the agent's secrets from %s in the workload cluster\n", remoteNamespace)
			fmt.Fprintf(d.stdout, "the agent itself still runs there and can no longer connect: helm uninstall it (e.g. helm uninstall relaymesh-agent -n %s) or delete its Deployment\n", remoteNamespace)
			return nil
		},
	}
	tc.addFlags(c.Flags(), g, true)
	c.Flags().StringVar(&remoteNamespace, "remote-namespace", defaultNamespace, "the agent's namespace in the workload cluster")
	c.Flags().BoolVar(&keepIstio, "keep-istio-config", false, "with a workload cluster named, leave the Istio objects and cacerts Secrets the agent applied there (and print the commands that remove them)")
	tc.complete(c, g)
	return c
}

// printRemoved says what RemoveApplied removed, and what that changes.
func printRemoved(w io.Writer, r registration.Applied) {
	byKind := map[string]int{}
	for _, o := range r.Objects {
		kind, _, _ := strings.Cut(o, " ")
		byKind[kind]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(byKind)) {
		parts = append(parts, fmt.Sprintf("%d %s", byKind[k], k))
	}
	if len(parts) == 0 {
		parts = []string{"no Istio objects"}
	}
	fmt.Fprintf(w, "removed what the agent applied in the workload cluster: %s; cacerts Secrets: %d%s\n", strings.Join(parts, ", "), len(r.CACerts), inNamespaces(r.CACerts))
	if r.AuthorizationPolicies > 0 {
		fmt.Fprintf(w, "WARNING: %d AuthorizationPolicies were among them (the global deny too): access in the mesh is Istio's default (allow) until you apply policies of your own\n", r.AuthorizationPolicies)
	}
	if len(r.CACerts) > 0 {
		fmt.Fprintf(w, "note: istiod keeps signing with the removed cacerts' CA until it restarts (kubectl -n %s rollout restart deployment/istiod); then it uses a CA of its own and trust with the other meshes ends\n", r.CACerts[0])
	}
}

func inNamespaces(ns []string) string {
	if len(ns) == 0 {
		return ""
	}
	return " (in " + strings.Join(ns, ", ") + ")"
}
