package main

import (
	"context"
	"fmt"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/check"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/spf13/cobra"
)

const checkSynopsis = `Check a Relaymesh installation from the management cluster and every
workload cluster it has a context for, and say what is broken. It is never
green on a broken setup: what it cannot observe is a warning, not a pass.

Checked: the CRDs (installed, established, at this version, with this
version's schema; the Istio CRDs in each workload cluster); the relay server
(reachable at its relay address, serving a certificate that chains to the
relay root and is not near expiry); the server's replicas (one holds the
Lease relaymesh-server and renews it; every replica renews its own Lease;
with --snapshot-store=redis, every replica reaches Redis);
the relay CA (its roots, the issuing CA's generation, and a relay root
rotation in progress: its phase, how long it has run, the agents that have
not acknowledged the new root, those that refused it and why, and a
rotation stuck past the grace the server recorded), agent certificates,
per-mesh intermediates and VirtualMesh roots with days to expiry (warning
under 30 days, error under 7; certificates the software renews are judged
against their lifetime); every registered cluster's agent connected, no
session held by an agent that is not registered, each agent's leader Lease
renewed and its clock within 5s of the server's (error from 1m); each
VirtualMesh's state, rotation phase and the meshes it waits for; istiod in
each mesh actually using the cacerts Relaymesh wrote (its
istio-ca-root-cert holds exactly the cacerts roots: istiod restarted after
joining) and each intermediate constrained to its mesh's trust domain;
the foreign trust domains imported (the FederatedTrustDomains of the
server's namespace): Invalid is an error, Stale or no bundle accepted yet a
warning, and so is a last fetch older than twice the bundle's refresh hint
(clamped to [30s, 1h], 5m without one) plus a minute (is the server's
Lease holder running?); each accepted foreign root is a warning under 7
days to expiry and an error once expired; the
admission webhook (registered, reachable by the apiserver, its failure
policy, and whether it answers only the apiserver's client certificate);
the ambient pitfalls in each workload cluster, from its own objects: an
AuthorizationPolicy enforced by ztunnel (a selector or no target, on pods
in ambient mode) that holds HTTP attributes (methods, paths, hosts,
requestPrincipals, remoteIpBlocks, request.* conditions) is an error for
ALLOW (istiod drops those rules: what they allow is denied, and an ALLOW
left with no rule denies everyone) and a warning for DENY (widened to L4);
a headless Service bound to a waypoint for Service traffic only is a
warning (clients reach the pods directly, bypassing its L7 policies and
routes); a VirtualService and an HTTPRoute, GRPCRoute or TCPRoute on one Service is
an error (Istio does not support mixing them); so is an
AuthorizationPolicy whose target is a Service no waypoint serves (only a
waypoint enforces it: it is enforced nowhere). Each names whose objects
they are: Relaymesh's (label relaymesh.io/owner) or the user's. A
Gateway API kind the cluster does not serve is nothing to check.
Across the clusters of each VirtualMesh: an Istio remote secret (a Secret
labelled istio/multiCluster=true, listed as metadata only) in a member
cluster is an error (its istiod holds another cluster's credentials,
which Relaymesh's federation does without); a Service held by several
member clusters and served by different waypoints there (bound in one
and not another, differently named, absent, or serving other traffic) is
a warning (Istio's ambient multicluster requires identical waypoints).

The workload clusters are the --remote-context list, or by default every
context named after a registered cluster. The relay address is
--server-address, or the one registration wrote into a workload cluster's
relaymesh-agent-config. The server's metrics are read at
--server-metrics-address, or through the management apiserver's service
proxy.

Exit code: 0 when every check passes, 1 with warnings, 2 with errors.`

type checkFlags struct {
	clusters        twoClusters
	remotes         []string
	remoteNamespace string
	leaseName       string
	serverAddress   string
	serverName      string
	ops             serverOps
	output          string
}

func newCheckCommand(d deps, g *globals) *cobra.Command {
	var f checkFlags
	c := &cobra.Command{
		Use:   "check",
		Short: "Check the installation: CRDs, server and its replicas, CA expiry, agents, clocks, VirtualMeshes, federation, remote secrets, istiod, webhook, ambient pitfalls and waypoints",
		Long:  checkSynopsis,
		Example: `  # Everything, from one merged kubeconfig with a context per cluster
  KUBECONFIG=mgmt.yaml:cluster-1.yaml:cluster-2.yaml relaymesh check --context mgmt

  # The server's metrics through a port-forward; JSON for scripts
  kubectl -n relaymesh port-forward svc/relaymesh-server 9091 &
  relaymesh check --server-metrics-address 127.0.0.1:9091 -o json | jq '.results[] | select(.severity != "ok")'`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			format, err := printer.Parse(f.output, printer.Formats)
			if err != nil {
				return usageError{err}
			}
			cfg, err := checkConfig(c.Context(), g, &f)
			if err != nil {
				if isUsage(err) {
					return err
				}
				// Nothing can be checked: as bad as the worst finding.
				return codedError{int(check.Error), err}
			}
			report, _ := check.Run(c.Context(), cfg, d.now())
			if err := printer.Print(d.stdout, format, report); err != nil {
				return err
			}
			if format == printer.Table || format == printer.Wide {
				fmt.Fprintln(d.stdout)
				fmt.Fprintln(d.stdout, report.Line())
			}
			if code := report.ExitCode(); code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
	fs := c.Flags()
	f.clusters.addFlags(fs, g, false)
	fs.StringArrayVar(&f.remotes, "remote-context", nil, "kubeconfig context of a workload cluster to check from its side (repeatable; default: every context named after a registered cluster)")
	fs.StringVar(&f.remoteNamespace, "remote-namespace", defaultNamespace, "the agents' namespace in the workload clusters")
	fs.StringVar(&f.leaseName, "lease-name", check.DefaultLeaseName, "the agents' leader-election Lease")
	fs.StringVar(&f.serverAddress, "server-address", "", "relay server host:port to dial (default: from a workload cluster's relaymesh-agent-config)")
	fs.StringVar(&f.serverName, "server-name", "", "name the server certificate must carry (default: the host of the relay address)")
	f.ops.addFlags(fs)
	outputFlag(c, &f.output, printer.Formats)
	_ = c.RegisterFlagCompletionFunc("remote-context", completeContexts(g))
	f.clusters.complete(c, g)
	return c
}

// checkConfig resolves the clusters check reads.
func checkConfig(ctx context.Context, g *globals, f *checkFlags) (check.Config, error) {
	mgmtSrc, err := f.clusters.mgmt(g)
	if err != nil {
		return check.Config{}, err
	}
	mgmt, err := mgmtSrc.Load()
	if err != nil {
		return check.Config{}, fmt.Errorf("management cluster: %w", err)
	}
	cfg := check.Config{Mgmt: mgmt, Namespace: g.namespace, AgentNamespace: f.remoteNamespace, LeaseName: f.leaseName,
		ServerAddress: f.serverAddress, ServerName: f.serverName, Ops: f.ops.client(mgmt, g.namespace)}
	cfg.Workloads, err = workloadSources(ctx, g, mgmt, mgmtSrc.Kubeconfig, f.remotes)
	return cfg, err
}

// workloadSources are the named contexts, or every context named after a
// cluster registered in mgmt. A context that cannot be loaded is kept with
// its error (check reports it).
func workloadSources(ctx context.Context, g *globals, mgmt *kubeclient.Clients, kubeconfig string, remotes []string) ([]check.WorkloadSource, error) {
	file, err := g.kubeconfig.file()
	if err != nil {
		return nil, err
	}
	if file == "" {
		file = kubeconfig
	}
	names := remotes
	if len(names) == 0 {
		kcs, err := listAs[multiclusterv1alpha1.KubernetesCluster](ctx, mgmt.Dynamic, multiclusterv1alpha1.KubernetesClusters, g.namespace)
		if err != nil {
			// check reports the listing; no workload cluster is read.
			return nil, nil
		}
		for _, kc := range kcs {
			if kc.Spec.Mode == multiclusterv1alpha1.ModeKubeconfig {
				continue
			}
			if (kubeclient.Source{Kubeconfig: file, Context: kc.Name}).HasContext(kc.Name) {
				names = append(names, kc.Name)
			}
		}
	}
	var out []check.WorkloadSource
	for _, n := range names {
		k, err := kubeclient.Source{Kubeconfig: file, Context: n}.Load()
		out = append(out, check.WorkloadSource{Context: n, Clients: k, Err: err})
	}
	return out, nil
}
