package main

import (
	"context"
	"fmt"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/cmd/relaymesh/internal/registration"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const tokenSynopsis = `create: mint a single-use bootstrap token for a registered cluster and print
  it once on standard output (only its hash is stored). Put it into the
  workload cluster's relay-identity-token-secret (key token).`

func newTokenCommand(d deps, g *globals) *cobra.Command {
	var cluster string
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create",
		Short: "Mint a single-use bootstrap token for a registered cluster",
		Long:  tokenSynopsis,
		Example: `  # A new token for cluster-1, straight into its workload cluster's Secret
  relaymesh token create --cluster cluster-1 --context mgmt | \
    kubectl --context cluster-1 -n relaymesh create secret generic relay-identity-token-secret \
      --from-file=token=/dev/stdin --dry-run=client -o yaml | kubectl --context cluster-1 apply -f -`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runTokenCreate(c.Context(), d, g, cluster, ttl)
		},
	}
	create.Flags().StringVar(&cluster, "cluster", "", "registered cluster the token is for (required)")
	create.Flags().DurationVar(&ttl, "ttl", identity.DefaultTokenTTL, "how long the token stays valid (at most 168h)")
	_ = create.RegisterFlagCompletionFunc("cluster", completeFrom(g.source, g, true, clusterNames))
	return groupCommand("token", "Mint bootstrap tokens", tokenSynopsis, "  relaymesh token create --cluster cluster-1", create)
}

func runTokenCreate(ctx context.Context, d deps, g *globals, cluster string, ttl time.Duration) error {
	stdout, stderr, namespace := d.stdout, d.stderr, g.namespace
	if cluster == "" {
		return usagef("--cluster is required")
	}
	if err := identity.ValidateClusterName(cluster); err != nil {
		return usageError{err}
	}
	if ttl <= 0 || ttl > identity.MaxTokenTTL {
		return usagef("--ttl %s out of range (0, %s]", ttl, identity.MaxTokenTTL)
	}
	mgmt, err := g.clients()
	if err != nil {
		return err
	}
	if _, err := mgmt.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(namespace).Get(ctx, cluster, metav1.GetOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster %s is not registered; run 'relaymesh cluster register %s' first", cluster, cluster)
		}
		return err
	}
	token, rec, err := registration.MintToken(ctx, mgmt.Typed, namespace, cluster, ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, token)
	fmt.Fprintf(stderr, "token %s for cluster %s, single use, expires %s\n", rec.ID, cluster, rec.ExpiresAt.Format(time.RFC3339))
	return nil
}
