package main

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/relaymesh/relaymesh/cmd/relaymesh/internal/registration"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/spf13/cobra"
)

const rebootstrapSynopsis = `Bootstrap the agent of the registered cluster NAME afresh, keeping its
registration: the recovery of an agent that was offline while the relay
root rotated (it pins a root the server no longer chains to, so it can
neither verify the server nor renew) or whose certificate expired. Such an
agent says so in its log and health status, naming this command.

It mints a single-use bootstrap token (as 'token create' does, audited
with who minted it), writes it and the relay roots the server trusts now
(every root of the management cluster's relay-root-tls-secret: during a
rotation, both) into the workload cluster's --remote-namespace — the
Secrets relay-identity-token-secret and relay-root-tls-secret, where
'cluster register' writes them — and removes the agent's stale client
certificate (relay-client-tls-secret), so the agent bootstraps with the new
token. Nothing else changes: the KubernetesCluster (spec, trust domain
grants, status, annotations), the agent's settings (relaymesh-agent-config)
and everything the agent applied stay as they are.

The agent reads these Secrets when it has no usable certificate; one that
still holds a certificate under the old root keeps it, so restart the agent
afterwards (the command prints how): it then bootstraps with the new token.

The management cluster is --mgmt-context (default --context) of the merged
kubeconfig, or --mgmt-kubeconfig; the workload cluster is --remote-context
(default: a context named NAME), or --remote-kubeconfig. The workload
cluster must answer before a token is minted.

--dry-run is for GitOps: the workload cluster is not touched. The token is
minted for real and the two Secrets holding it are printed (-o yaml or
json); apply them, delete relay-client-tls-secret and restart the agent.
The token is single use and expires after --token-ttl: commit it encrypted
(SOPS, Sealed Secrets), never in plain text.`

type rebootstrapFlags struct {
	clusters        twoClusters
	remoteNamespace string
	ttl             time.Duration
	dryRun          bool
	output          string
	// outputSet: -o was given.
	outputSet bool
}

func newClusterRebootstrapCommand(d deps, g *globals) *cobra.Command {
	var f rebootstrapFlags
	c := &cobra.Command{
		Use:   "re-bootstrap NAME",
		Short: "Give a registered cluster's agent a new bootstrap token and the current relay roots (after a relay root rotation it missed, or an expired certificate)",
		Long:  rebootstrapSynopsis,
		Example: `  # The agent of cluster-1 slept through a relay root rotation: new token and roots, then restart it
  relaymesh cluster re-bootstrap cluster-1 --mgmt-context mgmt --remote-context cluster-1
  kubectl --context cluster-1 -n relaymesh rollout restart deployment/relaymesh-agent

  # GitOps: print the two Secrets instead of writing them
  relaymesh cluster re-bootstrap cluster-2 --mgmt-context mgmt --dry-run -o yaml > cluster-2-rebootstrap.yaml`,
		Args:              exactArgs(1, "exactly one cluster NAME"),
		ValidArgsFunction: completeFrom(func() (kubeclient.Source, error) { return f.clusters.mgmt(g) }, g, false, clusterNames),
		RunE: func(c *cobra.Command, args []string) error {
			f.outputSet = c.Flags().Changed("output")
			return runRebootstrap(c.Context(), d, g, &f, args[0])
		},
	}
	fs := c.Flags()
	f.clusters.addFlags(fs, g, true)
	fs.StringVar(&f.remoteNamespace, "remote-namespace", defaultNamespace, "the agent's namespace in the workload cluster")
	fs.DurationVar(&f.ttl, "token-ttl", identity.DefaultTokenTTL, "how long the bootstrap token stays valid (at most 168h)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "do not touch the workload cluster: mint the token and print the Secrets to apply there (see above)")
	outputFlag(c, &f.output, []printer.Format{printer.YAML, printer.JSON})
	f.clusters.complete(c, g)
	return c
}

func runRebootstrap(ctx context.Context, d deps, g *globals, f *rebootstrapFlags, name string) error {
	req := registration.RebootstrapRequest{Cluster: name, Namespace: g.namespace, RemoteNamespace: f.remoteNamespace, TokenTTL: f.ttl}
	if err := identity.ValidateClusterName(name); err != nil {
		return usageError{err}
	}
	format, err := printer.Parse(f.output, []printer.Format{printer.YAML, printer.JSON})
	if err != nil {
		return usageError{err}
	}
	if f.outputSet && !f.dryRun {
		return usagef("-o prints the Secrets of --dry-run: give --dry-run, or leave -o out")
	}
	if err := req.Validate(); err != nil {
		return usageError{err}
	}
	remoteSrc, err := f.clusters.workload(g, name, f.dryRun, ", or --dry-run to print the Secrets")
	if err != nil {
		return err
	}
	mgmt, err := f.clusters.mgmtClients(g)
	if err != nil {
		return err
	}
	restart := fmt.Sprintf("kubectl -n %s rollout restart deployment/%s", f.remoteNamespace, registration.AgentChartName)
	if f.dryRun {
		bundle, err := registration.Rebootstrap(ctx, mgmt, req)
		if err != nil {
			return err
		}
		var out bytes.Buffer
		if err := writeBundle(&out, format, bundle, ""); err != nil {
			return err
		}
		if _, err := d.stdout.Write(out.Bytes()); err != nil {
			return err
		}
		fmt.Fprintf(d.stderr, "minted bootstrap token %s for cluster %s, single use, expires %s; the KubernetesCluster is unchanged. In the workload cluster: apply the output, delete the stale client certificate (kubectl -n %s delete secret %s) and restart the agent (%s). Keep the output encrypted\n",
			bundle.TokenID, name, bundle.ExpiresAt.Format(time.RFC3339), f.remoteNamespace, identity.ClientSecret, restart)
		return nil
	}
	remote, err := remoteSrc.Load()
	if err != nil {
		return fmt.Errorf("workload cluster: %w", err)
	}
	// The workload cluster must answer before a token is minted.
	if _, err := remote.Typed.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("workload cluster unreachable: %w", err)
	}
	if err := registration.CheckAgentNamespace(ctx, mgmt, remote, g.namespace, f.remoteNamespace); err != nil {
		return err
	}
	bundle, err := registration.Rebootstrap(ctx, mgmt, req)
	if err != nil {
		return err
	}
	if err := bundle.WriteTo(ctx, remote.Typed); err != nil {
		if rerr := registration.RevokeToken(ctx, mgmt.Typed, g.namespace, bundle.TokenID); rerr != nil {
			return fmt.Errorf("%w (the bootstrap token %s was minted but not delivered, and could not be revoked: %v; it expires %s — delete it with kubectl -n %s delete secret %s; then run the command again)",
				err, bundle.TokenID, rerr, bundle.ExpiresAt.Format(time.RFC3339), g.namespace, identity.TokenSecretName(bundle.TokenID))
		}
		return fmt.Errorf("%w (the bootstrap token %s was minted but not delivered, and is revoked; run the command again)", err, bundle.TokenID)
	}
	fmt.Fprintf(d.stdout, "re-bootstrapped cluster %s: bootstrap token %s (single use, expires %s) and the current relay roots written to %s/%s and %s/%s in the workload cluster, the stale %s/%s removed; the KubernetesCluster is unchanged\n",
		name, bundle.TokenID, bundle.ExpiresAt.Format(time.RFC3339), f.remoteNamespace, identity.TokenSecret, f.remoteNamespace, identity.RootSecret, f.remoteNamespace, identity.ClientSecret)
	fmt.Fprintf(d.stdout, "restart the agent so it bootstraps with them now (it reads them only when it holds no usable certificate):\n  %s\n", restart)
	return nil
}
