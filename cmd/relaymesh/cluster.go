package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeutil"
	"github.com/relaymesh/relaymesh/relay"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

const clusterSynopsis = `register NAME: create the KubernetesCluster NAME in the management cluster,
  mint a single-use bootstrap token for it, and write the agent's secrets
  (relay-root-tls-secret with the relay root certificate only,
  relay-identity-token-secret with the token) and relaymesh-agent-config into
  the workload cluster. The token is never printed.
deregister NAME: delete the KubernetesCluster and its unused tokens; the
  server ends the cluster's sessions at once and refuses its certificate and
  renewals from then on. With --remote-kubeconfig it also removes the
  agent's secrets from the workload cluster.`

func runCluster(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "register" && args[0] != "deregister") {
		fmt.Fprintf(stderr, "Usage: relaymesh cluster register|deregister NAME [flags]\n\n%s\n", clusterSynopsis)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return fmt.Errorf("%w: want register or deregister", errUsage)
	}
	verb := args[0]
	var mgmtKubeconfig, remoteKubeconfig, namespace, remoteNamespace, serverAddr, clusterDomain, mode string
	var ttl time.Duration
	fs := newFlags("cluster "+verb+" NAME [flags]", clusterSynopsis, stderr)
	fs.StringVar(&mgmtKubeconfig, "mgmt-kubeconfig", "", "management cluster kubeconfig (required)")
	fs.StringVar(&remoteKubeconfig, "remote-kubeconfig", "", "workload cluster kubeconfig (required for register)")
	fs.StringVar(&namespace, "namespace", "relaymesh", "the server's namespace in the management cluster")
	fs.StringVar(&remoteNamespace, "remote-namespace", "relaymesh", "the agent's namespace in the workload cluster")
	if verb == "register" {
		fs.StringVar(&serverAddr, "server-address", "", "relay server host:port the agent dials (required)")
		fs.StringVar(&clusterDomain, "cluster-domain", "cluster.local", "the workload cluster's DNS domain")
		fs.DurationVar(&ttl, "token-ttl", identity.DefaultTokenTTL, "how long the bootstrap token stays valid")
		fs.StringVar(&mode, "mode", "relay", "relay (an agent in the cluster dials out; secure default) or kubeconfig (WEAKER: the server keeps --remote-kubeconfig in a Secret and manages the cluster itself; needs 'relaymesh server --allow-kubeconfig-clusters')")
	}
	pos, err := parsePositional(fs, args[1:], 1)
	if err != nil {
		return err
	}
	var name string
	if len(pos) == 1 {
		name, pos = pos[0], nil
	}
	if name == "" || len(pos) != 0 {
		fs.Usage()
		return fmt.Errorf("%w: want exactly one cluster NAME", errUsage)
	}
	if err := identity.ValidateClusterName(name); err != nil {
		return err
	}
	if mgmtKubeconfig == "" {
		return errors.New("--mgmt-kubeconfig is required")
	}
	if verb == "register" && mode == "kubeconfig" {
		if remoteKubeconfig == "" {
			return errors.New("--remote-kubeconfig is required")
		}
	} else if verb == "register" {
		if mode != "relay" {
			return fmt.Errorf("--mode %q: want relay or kubeconfig", mode)
		}
		if remoteKubeconfig == "" || serverAddr == "" {
			return errors.New("--remote-kubeconfig and --server-address are required")
		}
		if _, _, err := net.SplitHostPort(serverAddr); err != nil {
			return fmt.Errorf("--server-address %q: %w", serverAddr, err)
		}
		if ttl <= 0 || ttl > identity.MaxTokenTTL {
			return fmt.Errorf("--token-ttl %s out of range (0, %s]", ttl, identity.MaxTokenTTL)
		}
	}
	mgmt, err := loadKube(mgmtKubeconfig)
	if err != nil {
		return err
	}
	var remote *kubeClients
	if remoteKubeconfig != "" {
		if remote, err = loadKube(remoteKubeconfig); err != nil {
			return err
		}
	}
	if verb == "register" && mode == "kubeconfig" {
		return registerKubeconfig(ctx, stdout, mgmt, remote, remoteKubeconfig, name, namespace, clusterDomain)
	}
	if verb == "register" {
		return register(ctx, stdout, mgmt, remote, name, namespace, remoteNamespace, serverAddr, clusterDomain, ttl)
	}
	return deregister(ctx, stdout, mgmt, remote, name, namespace, remoteNamespace)
}

func register(ctx context.Context, out io.Writer, mgmt, remote *kubeClients, name, ns, remoteNS, serverAddr, domain string, ttl time.Duration) (err error) {
	// Everything that can fail is checked before anything is written.
	roots, err := ca.RelayRootsPEM(ctx, mgmt.typed, ns)
	if err != nil {
		return fmt.Errorf("relay CA not found in %s (start 'relaymesh server' once first): %w", ns, err)
	}
	clusters := mgmt.dynamic.Resource(relay.KubernetesClusters).Namespace(ns)
	if _, err := clusters.Get(ctx, name, metav1.GetOptions{}); err == nil {
		return fmt.Errorf("cluster %s is already registered; deregister it first, or mint a new token with 'relaymesh token create --cluster %s'", name, name)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	if _, err := remote.typed.Discovery().ServerVersion(); err != nil {
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
		if store, serr := identity.NewKubeTokenStore(mgmt.typed, ns); serr == nil {
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
	if err := remote.typed.CoreV1().Secrets(remoteNS).Delete(ctx, identity.ClientSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the stale %s/%s in the workload cluster: %w", remoteNS, identity.ClientSecret, err)
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: identity.RootSecret, Namespace: remoteNS, Labels: labels}, Data: map[string][]byte{identity.KeyCACert: roots}},
		{ObjectMeta: metav1.ObjectMeta{Name: identity.TokenSecret, Namespace: remoteNS, Labels: labels}, Data: map[string][]byte{identity.KeyToken: []byte(token)}},
	} {
		s.Type = corev1.SecretTypeOpaque
		if err := kubeutil.UpsertSecret(ctx, remote.typed, s); err != nil {
			return fmt.Errorf("write %s/%s in the workload cluster: %w", remoteNS, s.Name, err)
		}
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: agentConfigMap, Namespace: remoteNS, Labels: labels},
		Data:       map[string]string{"cluster": name, "serverAddress": serverAddr},
	}
	if _, err = remote.typed.CoreV1().ConfigMaps(remoteNS).Create(ctx, cm, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = remote.typed.CoreV1().ConfigMaps(remoteNS).Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write %s/%s in the workload cluster: %w", remoteNS, agentConfigMap, err)
	}
	fmt.Fprintf(out, "registered cluster %s: KubernetesCluster %s/%s, bootstrap token %s (single use, expires %s) written to %s/%s in the workload cluster\n",
		name, ns, name, rec.ID, rec.ExpiresAt.Format(time.RFC3339), remoteNS, identity.TokenSecret)
	return nil
}

func mintToken(ctx context.Context, mgmt *kubeClients, ns, cluster string, ttl time.Duration) (string, identity.TokenRecord, error) {
	store, err := identity.NewKubeTokenStore(mgmt.typed, ns)
	if err != nil {
		return "", identity.TokenRecord{}, err
	}
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
	if err != nil {
		return "", identity.TokenRecord{}, err
	}
	return tokens.Mint(ctx, cluster, ttl)
}

func ensureNamespace(ctx context.Context, k *kubeClients, ns string) error {
	_, err := k.typed.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

func deregister(ctx context.Context, out io.Writer, mgmt, remote *kubeClients, name, ns, remoteNS string) error {
	err := mgmt.dynamic.Resource(relay.KubernetesClusters).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster %s is not registered in %s", name, ns)
	}
	if err != nil {
		return err
	}
	store, err := identity.NewKubeTokenStore(mgmt.typed, ns)
	if err != nil {
		return err
	}
	if err := store.DeleteCluster(ctx, name); err != nil {
		return fmt.Errorf("delete bootstrap tokens of %s: %w", name, err)
	}
	if err := mgmt.typed.CoreV1().Secrets(ns).Delete(ctx, relay.KubeconfigSecretName(name), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the kubeconfig secret of %s: %w", name, err)
	}
	fmt.Fprintf(out, "deregistered cluster %s: its sessions end and its certificate is refused from now on\n", name)
	if remote == nil {
		return nil
	}
	for _, s := range []string{identity.ClientSecret, identity.TokenSecret, identity.RootSecret} {
		if err := remote.typed.CoreV1().Secrets(remoteNS).Delete(ctx, s, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s/%s in the workload cluster: %w", remoteNS, s, err)
		}
	}
	if err := remote.typed.CoreV1().ConfigMaps(remoteNS).Delete(ctx, agentConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	fmt.Fprintf(out, "removed the agent's secrets from %s in the workload cluster\n", remoteNS)
	return nil
}

// registerKubeconfig registers a cluster the server manages with a
// kubeconfig kept in the Secret <name>-kubeconfig (the weaker mode).
func registerKubeconfig(ctx context.Context, out io.Writer, mgmt, remote *kubeClients, kubeconfigPath, name, ns, domain string) (err error) {
	raw, err := os.ReadFile(kubeconfigPath)
	if err != nil {
		return err
	}
	if _, err := relay.ParseKubeconfig(raw); err != nil {
		return fmt.Errorf("--remote-kubeconfig: %w", err)
	}
	if _, err := remote.typed.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("workload cluster unreachable with that kubeconfig: %w", err)
	}
	clusters := mgmt.dynamic.Resource(relay.KubernetesClusters).Namespace(ns)
	if _, err := clusters.Get(ctx, name, metav1.GetOptions{}); err == nil {
		return fmt.Errorf("cluster %s is already registered; deregister it first", name)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	secretName := relay.KubeconfigSecretName(name)
	if err := kubeutil.UpsertSecret(ctx, mgmt.typed, &corev1.Secret{
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
		_ = mgmt.typed.CoreV1().Secrets(ns).Delete(context.WithoutCancel(ctx), secretName, metav1.DeleteOptions{})
		return fmt.Errorf("create KubernetesCluster %s: %w", name, err)
	}
	fmt.Fprintf(out, "registered cluster %s in kubeconfig mode (WEAKER: the server holds its credentials in %s/%s); the server manages it only with --allow-kubeconfig-clusters\n", name, ns, secretName)
	return nil
}
