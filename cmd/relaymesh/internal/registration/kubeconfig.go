package registration

import (
	"context"
	"fmt"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/kubeutil"
	"github.com/relaymesh/relaymesh/server"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// StandaloneKubeconfig is the context of src alone, with every file it
// references inlined, for the Secret of a kubeconfig-mode cluster.
func StandaloneKubeconfig(src kubeclient.Source) ([]byte, error) {
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

// RegisterKubeconfig registers a cluster the server manages itself with
// the kubeconfig raw, kept in the Secret <name>-kubeconfig (the weaker
// mode), granted trust domains grants (none: the default grant). It
// returns that Secret's name.
func RegisterKubeconfig(ctx context.Context, mgmt, remote *kubeclient.Clients, raw []byte, name, ns, domain string, grants []multiclusterv1alpha1.TrustDomainGrant) (string, error) {
	if err := ValidateGrants(grants); err != nil {
		return "", err
	}
	if _, err := server.ParseKubeconfig(raw); err != nil {
		return "", fmt.Errorf("workload cluster kubeconfig: %w", err)
	}
	if _, err := remote.Typed.Discovery().ServerVersion(); err != nil {
		return "", fmt.Errorf("workload cluster unreachable with that kubeconfig: %w", err)
	}
	clusters := mgmt.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns)
	if _, err := clusters.Get(ctx, name, metav1.GetOptions{}); err == nil {
		return "", fmt.Errorf("cluster %s is already registered; deregister it first", name)
	} else if !apierrors.IsNotFound(err) {
		return "", err
	}
	secretName := multiclusterv1alpha1.KubeconfigSecretName(name)
	kc, err := newCluster(ctx, mgmt, ns, name, multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeKubeconfig, ClusterDomain: domain,
		KubeconfigSecretRef: &common.ObjectRef{Name: secretName, Namespace: ns}, TrustDomains: grants})
	if err != nil {
		return "", err
	}
	if err := kubeutil.UpsertSecret(ctx, mgmt.Typed, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh", server.LabelCluster: name}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{multiclusterv1alpha1.KubeconfigKey: raw},
	}); err != nil {
		return "", fmt.Errorf("write %s/%s: %w", ns, secretName, err)
	}
	if _, err := clusters.Create(ctx, kc, metav1.CreateOptions{}); err != nil {
		_ = mgmt.Typed.CoreV1().Secrets(ns).Delete(context.WithoutCancel(ctx), secretName, metav1.DeleteOptions{})
		return "", fmt.Errorf("create KubernetesCluster %s: %w", name, err)
	}
	return secretName, nil
}
