package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/kubeutil"
	"github.com/relaymesh/relaymesh/relay"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const clusterSynopsis = `Workload clusters are registered in the management cluster (one
KubernetesCluster each, in --namespace); their agents then dial out to the
relay server with a single-use bootstrap token.`

const registerSynopsis = `Create the KubernetesCluster NAME in the management cluster, mint a
single-use bootstrap token for it, and write the agent's secrets
(relay-root-tls-secret with the relay root certificate only,
relay-identity-token-secret with the token) and relaymesh-agent-config into
the workload cluster's --remote-namespace. The token is never printed.

The management cluster is --mgmt-context (default --context) of the merged
kubeconfig, or --mgmt-kubeconfig; the workload cluster is --remote-context
(default: a context named NAME), or --remote-kubeconfig.

A registration that fails half-way is rolled back, so a retry starts clean.`

const deregisterSynopsis = `Delete the KubernetesCluster NAME and its unused tokens; the server ends the
cluster's sessions at once and refuses its certificate and renewals from
then on. With --remote-context or --remote-kubeconfig it also removes the
agent's secrets from the workload cluster.`

type registerFlags struct {
	clusters                                  twoClusters
	remoteNamespace, serverAddr, domain, mode string
	ttl                                       time.Duration
}

func newClusterCommand(d deps, g *globals) *cobra.Command {
	return groupCommand("cluster", "Register, deregister and list workload clusters", clusterSynopsis, `  relaymesh cluster list
  relaymesh cluster register cluster-1 --remote-context cluster-1 --server-address relay.example.com:9900
  relaymesh cluster deregister cluster-1 --remote-context cluster-1`,
		newClusterRegisterCommand(d, g), newClusterDeregisterCommand(d, g), newClusterListCommand(d, g))
}

func newClusterRegisterCommand(d deps, g *globals) *cobra.Command {
	var f registerFlags
	c := &cobra.Command{
		Use:   "register NAME",
		Short: "Register a workload cluster and write its agent's bootstrap secrets",
		Long:  registerSynopsis,
		Example: `  # Both clusters from one merged kubeconfig (KUBECONFIG=mgmt.yaml:cluster-1.yaml)
  relaymesh cluster register cluster-1 --mgmt-context mgmt --remote-context cluster-1 \
    --server-address relay.example.com:9900

  # The same with one kubeconfig file per cluster
  relaymesh cluster register cluster-1 --mgmt-kubeconfig mgmt.yaml --remote-kubeconfig cluster-1.yaml \
    --server-address relay.example.com:9900`,
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
	f.clusters.complete(c, g)
	_ = c.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{"relay", "kubeconfig"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func runRegister(ctx context.Context, d deps, g *globals, f *registerFlags, name string) error {
	if err := identity.ValidateClusterName(name); err != nil {
		return err
	}
	switch f.mode {
	case "relay":
		if f.serverAddr == "" {
			return errors.New("--server-address is required: the relay server's host:port as the agent reaches it")
		}
		if _, _, err := net.SplitHostPort(f.serverAddr); err != nil {
			return fmt.Errorf("--server-address %q: %w", f.serverAddr, err)
		}
		if f.ttl <= 0 || f.ttl > identity.MaxTokenTTL {
			return fmt.Errorf("--token-ttl %s out of range (0, %s]", f.ttl, identity.MaxTokenTTL)
		}
	case "kubeconfig":
	default:
		return fmt.Errorf("--mode %q: want relay or kubeconfig", f.mode)
	}
	remoteSrc, ok, err := f.clusters.remote(g, name)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no workload cluster: give --remote-context (a context of your kubeconfig; default: a context named %s) or --remote-kubeconfig", name)
	}
	mgmtSrc, err := f.clusters.mgmt(g)
	if err != nil {
		return err
	}
	mgmt, err := mgmtSrc.Load()
	if err != nil {
		return fmt.Errorf("management cluster: %w", err)
	}
	remote, err := remoteSrc.Load()
	if err != nil {
		return fmt.Errorf("workload cluster: %w", err)
	}
	if f.mode == "kubeconfig" {
		raw, err := standaloneKubeconfig(remoteSrc)
		if err != nil {
			return err
		}
		return registerKubeconfig(ctx, d.stdout, mgmt, remote, raw, name, g.namespace, f.domain)
	}
	return register(ctx, d.stdout, mgmt, remote, name, g.namespace, f.remoteNamespace, f.serverAddr, f.domain, f.ttl)
}

// standaloneKubeconfig is the workload cluster's context alone, with every
// file it references inlined, for the Secret of a kubeconfig-mode cluster.
func standaloneKubeconfig(src kubeclient.Source) ([]byte, error) {
	raw, err := src.Raw()
	if err != nil {
		return nil, err
	}
	if src.Context != "" {
		raw.CurrentContext = src.Context
	}
	if err := clientcmdapi.MinifyConfig(&raw); err != nil {
		return nil, fmt.Errorf("workload cluster kubeconfig: %w", err)
	}
	if err := clientcmdapi.FlattenConfig(&raw); err != nil {
		return nil, fmt.Errorf("workload cluster kubeconfig: %w", err)
	}
	return clientcmd.Write(raw)
}

func newClusterDeregisterCommand(d deps, g *globals) *cobra.Command {
	var tc twoClusters
	var remoteNamespace string
	c := &cobra.Command{
		Use:   "deregister NAME",
		Short: "Deregister a workload cluster: end its sessions, refuse its certificate",
		Long:  deregisterSynopsis,
		Example: `  # Deregister and remove the agent's secrets from the workload cluster
  relaymesh cluster deregister cluster-1 --mgmt-context mgmt --remote-context cluster-1

  # Deregister only (the workload cluster is gone or unreachable)
  relaymesh cluster deregister cluster-1 --mgmt-context mgmt`,
		Args: exactArgs(1, "exactly one cluster NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			name := args[0]
			if err := identity.ValidateClusterName(name); err != nil {
				return err
			}
			mgmtSrc, err := tc.mgmt(g)
			if err != nil {
				return err
			}
			mgmt, err := mgmtSrc.Load()
			if err != nil {
				return fmt.Errorf("management cluster: %w", err)
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
			return deregister(c.Context(), d.stdout, mgmt, remote, name, g.namespace, remoteNamespace)
		},
	}
	tc.addFlags(c.Flags(), g, true)
	c.Flags().StringVar(&remoteNamespace, "remote-namespace", defaultNamespace, "the agent's namespace in the workload cluster")
	tc.complete(c, g)
	return c
}

func register(ctx context.Context, out io.Writer, mgmt, remote *kubeclient.Clients, name, ns, remoteNS, serverAddr, domain string, ttl time.Duration) (err error) {
	// Everything that can fail is checked before anything is written.
	roots, err := ca.RelayRootsPEM(ctx, mgmt.Typed, ns)
	if err != nil {
		return fmt.Errorf("relay CA not found in %s (start 'relaymesh server' once first): %w", ns, err)
	}
	clusters := mgmt.Dynamic.Resource(relay.KubernetesClusters).Namespace(ns)
	if _, err := clusters.Get(ctx, name, metav1.GetOptions{}); err == nil {
		return fmt.Errorf("cluster %s is already registered; deregister it first, or mint a new token with 'relaymesh token create --cluster %s'", name, name)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	if _, err := remote.Typed.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("workload cluster unreachable: %w", err)
	}

	kc := &multiclusterv1alpha1.KubernetesCluster{
		TypeMeta:   metav1.TypeMeta{APIVersion: multiclusterv1alpha1.GroupVersion.String(), Kind: "KubernetesCluster"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay, ClusterDomain: domain},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(kc)
	if err != nil {
		return err
	}
	if _, err := clusters.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create KubernetesCluster %s: %w", name, err)
	}
	// A registration that fails half-way is rolled back, so a retry starts clean.
	defer func() {
		if err == nil {
			return
		}
		_ = clusters.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
		if store, serr := identity.NewKubeTokenStore(mgmt.Typed, ns); serr == nil {
			_ = store.DeleteCluster(context.WithoutCancel(ctx), name)
		}
		fmt.Fprintf(out, "registration of %s failed; rolled back the KubernetesCluster and its token\n", name)
	}()
	token, rec, err := mintToken(ctx, mgmt, ns, name, ttl)
	if err != nil {
		return err
	}
	if err := ensureNamespace(ctx, remote, remoteNS); err != nil {
		return err
	}
	// A client certificate of an earlier registration is useless now (the
	// server binds certificates to one registration); remove it so the
	// agent bootstraps with the new token.
	if err := remote.Typed.CoreV1().Secrets(remoteNS).Delete(ctx, identity.ClientSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the stale %s/%s in the workload cluster: %w", remoteNS, identity.ClientSecret, err)
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: identity.RootSecret, Namespace: remoteNS, Labels: labels}, Data: map[string][]byte{identity.KeyCACert: roots}},
		{ObjectMeta: metav1.ObjectMeta{Name: identity.TokenSecret, Namespace: remoteNS, Labels: labels}, Data: map[string][]byte{identity.KeyToken: []byte(token)}},
	} {
		s.Type = corev1.SecretTypeOpaque
		if err := kubeutil.UpsertSecret(ctx, remote.Typed, s); err != nil {
			return fmt.Errorf("write %s/%s in the workload cluster: %w", remoteNS, s.Name, err)
		}
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: agentConfigMap, Namespace: remoteNS, Labels: labels},
		Data:       map[string]string{"cluster": name, "serverAddress": serverAddr},
	}
	if _, err = remote.Typed.CoreV1().ConfigMaps(remoteNS).Create(ctx, cm, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = remote.Typed.CoreV1().ConfigMaps(remoteNS).Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write %s/%s in the workload cluster: %w", remoteNS, agentConfigMap, err)
	}
	fmt.Fprintf(out, "registered cluster %s: KubernetesCluster %s/%s, bootstrap token %s (single use, expires %s) written to %s/%s in the workload cluster\n",
		name, ns, name, rec.ID, rec.ExpiresAt.Format(time.RFC3339), remoteNS, identity.TokenSecret)
	return nil
}

func mintToken(ctx context.Context, mgmt *kubeclient.Clients, ns, cluster string, ttl time.Duration) (string, identity.TokenRecord, error) {
	store, err := identity.NewKubeTokenStore(mgmt.Typed, ns)
	if err != nil {
		return "", identity.TokenRecord{}, err
	}
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
	if err != nil {
		return "", identity.TokenRecord{}, err
	}
	return tokens.Mint(ctx, cluster, ttl)
}

func ensureNamespace(ctx context.Context, k *kubeclient.Clients, ns string) error {
	_, err := k.Typed.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

func deregister(ctx context.Context, out io.Writer, mgmt, remote *kubeclient.Clients, name, ns, remoteNS string) error {
	err := mgmt.Dynamic.Resource(relay.KubernetesClusters).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster %s is not registered in %s", name, ns)
	}
	if err != nil {
		return err
	}
	store, err := identity.NewKubeTokenStore(mgmt.Typed, ns)
	if err != nil {
		return err
	}
	if err := store.DeleteCluster(ctx, name); err != nil {
		return fmt.Errorf("delete bootstrap tokens of %s: %w", name, err)
	}
	if err := mgmt.Typed.CoreV1().Secrets(ns).Delete(ctx, relay.KubeconfigSecretName(name), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the kubeconfig secret of %s: %w", name, err)
	}
	fmt.Fprintf(out, "deregistered cluster %s: its sessions end and its certificate is refused from now on\n", name)
	if remote == nil {
		return nil
	}
	for _, s := range []string{identity.ClientSecret, identity.TokenSecret, identity.RootSecret} {
		if err := remote.Typed.CoreV1().Secrets(remoteNS).Delete(ctx, s, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s/%s in the workload cluster: %w", remoteNS, s, err)
		}
	}
	if err := remote.Typed.CoreV1().ConfigMaps(remoteNS).Delete(ctx, agentConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	fmt.Fprintf(out, "removed the agent's secrets from %s in the workload cluster\n", remoteNS)
	return nil
}

// registerKubeconfig registers a cluster the server manages with a
// kubeconfig kept in the Secret <name>-kubeconfig (the weaker mode).
func registerKubeconfig(ctx context.Context, out io.Writer, mgmt, remote *kubeclient.Clients, raw []byte, name, ns, domain string) (err error) {
	if _, err := relay.ParseKubeconfig(raw); err != nil {
		return fmt.Errorf("workload cluster kubeconfig: %w", err)
	}
	if _, err := remote.Typed.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("workload cluster unreachable with that kubeconfig: %w", err)
	}
	clusters := mgmt.Dynamic.Resource(relay.KubernetesClusters).Namespace(ns)
	if _, err := clusters.Get(ctx, name, metav1.GetOptions{}); err == nil {
		return fmt.Errorf("cluster %s is already registered; deregister it first", name)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	secretName := relay.KubeconfigSecretName(name)
	if err := kubeutil.UpsertSecret(ctx, mgmt.Typed, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh", relay.LabelCluster: name}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{relay.KubeconfigKey: raw},
	}); err != nil {
		return fmt.Errorf("write %s/%s: %w", ns, secretName, err)
	}
	kc := &multiclusterv1alpha1.KubernetesCluster{
		TypeMeta:   metav1.TypeMeta{APIVersion: multiclusterv1alpha1.GroupVersion.String(), Kind: "KubernetesCluster"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeKubeconfig, ClusterDomain: domain,
			KubeconfigSecretRef: &common.ObjectRef{Name: secretName, Namespace: ns}},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(kc)
	if err != nil {
		return err
	}
	if _, err := clusters.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		_ = mgmt.Typed.CoreV1().Secrets(ns).Delete(context.WithoutCancel(ctx), secretName, metav1.DeleteOptions{})
		return fmt.Errorf("create KubernetesCluster %s: %w", name, err)
	}
	fmt.Fprintf(out, "registered cluster %s in kubeconfig mode (WEAKER: the server holds its credentials in %s/%s); the server manages it only with --allow-kubeconfig-clusters\n", name, ns, secretName)
	return nil
}
