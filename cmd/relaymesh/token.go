package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/relay"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const tokenSynopsis = `create: mint a single-use bootstrap token for a registered cluster and print
  it once on standard output (only its hash is stored). Put it into the
  workload cluster's relay-identity-token-secret (key token).`

func runToken(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		fmt.Fprintf(stderr, "Usage: relaymesh token create --cluster NAME [flags]\n\n%s\n", tokenSynopsis)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return fmt.Errorf("%w: want create", errUsage)
	}
	var kubeconfig, namespace, cluster string
	var ttl time.Duration
	fs := newFlags("token create --cluster NAME [flags]", tokenSynopsis, stderr)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "management cluster kubeconfig (default: in-cluster)")
	fs.StringVar(&namespace, "namespace", "relaymesh", "the server's namespace")
	fs.StringVar(&cluster, "cluster", "", "registered cluster the token is for (required)")
	fs.DurationVar(&ttl, "ttl", identity.DefaultTokenTTL, "how long the token stays valid (at most 168h)")
	if _, err := parse(fs, args[1:], 0); err != nil {
		return err
	}
	if cluster == "" {
		return errors.New("--cluster is required")
	}
	if err := identity.ValidateClusterName(cluster); err != nil {
		return err
	}
	if ttl <= 0 || ttl > identity.MaxTokenTTL {
		return fmt.Errorf("--ttl %s out of range (0, %s]", ttl, identity.MaxTokenTTL)
	}
	mgmt, err := loadKube(kubeconfig)
	if err != nil {
		return err
	}
	if _, err := mgmt.dynamic.Resource(relay.KubernetesClusters).Namespace(namespace).Get(ctx, cluster, metav1.GetOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster %s is not registered; run 'relaymesh cluster register %s' first", cluster, cluster)
		}
		return err
	}
	token, rec, err := mintToken(ctx, mgmt, namespace, cluster, ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, token)
	fmt.Fprintf(stderr, "token %s for cluster %s, single use, expires %s\n", rec.ID, cluster, rec.ExpiresAt.Format(time.RFC3339))
	return nil
}
