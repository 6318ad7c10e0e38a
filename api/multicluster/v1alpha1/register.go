package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of this package.
var GroupVersion = schema.GroupVersion{Group: "multicluster.relaymesh.io", Version: "v1alpha1"}

// KubernetesClusters is the resource of KubernetesCluster objects.
var KubernetesClusters = GroupVersion.WithResource("kubernetesclusters")

// KubeconfigKey is the key of the kubeconfig in a kubeconfig-mode cluster's
// Secret.
const KubeconfigKey = "kubeconfig"

// KubeconfigSecretName is the Secret `relaymesh cluster register --mode
// kubeconfig` writes in the server's namespace for cluster, and that its
// KubernetesCluster's spec.kubeconfigSecretRef names.
func KubeconfigSecretName(cluster string) string { return "relaymesh-kubeconfig-" + cluster }

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers this package's kinds with a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &KubernetesCluster{}, &KubernetesClusterList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
