package trust

import (
	"testing"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The shared caches hold KubernetesClusters and Meshes typed
// (kubeinformers.Typed): the cluster watch's handler compares their
// status.trustDomains typed, and kubeinformers.As hands out the cached object
// itself, converting only an unstructured one.
func TestTypedCachedObjects(t *testing.T) {
	kc := func(tds ...multiclusterv1alpha1.TrustDomainStatus) *multiclusterv1alpha1.KubernetesCluster {
		return &multiclusterv1alpha1.KubernetesCluster{Status: multiclusterv1alpha1.KubernetesClusterStatus{TrustDomains: tds}}
	}
	accepted := multiclusterv1alpha1.TrustDomainStatus{Name: "a.example", State: "Accepted", Meshes: []string{"istio-system/istiod"}}
	refused := accepted
	refused.State = "Refused"
	assert.True(t, sameTrustDomainsOf(kc(accepted), kc(accepted)))
	assert.True(t, sameTrustDomainsOf(kc(), &multiclusterv1alpha1.KubernetesCluster{Status: multiclusterv1alpha1.KubernetesClusterStatus{TrustDomains: []multiclusterv1alpha1.TrustDomainStatus{}}}),
		"none and an empty list alike")
	assert.False(t, sameTrustDomainsOf(kc(accepted), kc(refused)))
	assert.False(t, sameTrustDomainsOf(kc(accepted), kc()))
	u := func(state string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"trustDomains": []any{map[string]any{"name": "a.example", "state": state}}}}}
	}
	assert.True(t, sameTrustDomainsOf(u("Accepted"), u("Accepted")))
	assert.False(t, sameTrustDomainsOf(u("Accepted"), u("Refused")))
	assert.False(t, sameTrustDomainsOf(kc(accepted), u("Accepted")), "a typed and an unstructured version are a change")
	assert.False(t, sameTrustDomainsOf(u("Accepted"), kc(accepted)))

	cached := &discoveryv1alpha1.Mesh{}
	cached.Name = "istiod-c1"
	got, err := kubeinformers.As[discoveryv1alpha1.Mesh](cached)
	require.NoError(t, err)
	assert.Same(t, cached, got, "the cached object itself")
	got, err = kubeinformers.As[discoveryv1alpha1.Mesh](&unstructured.Unstructured{Object: map[string]any{"kind": "Mesh", "metadata": map[string]any{"name": "m2"}}})
	require.NoError(t, err)
	assert.Equal(t, "m2", got.Name)
	_, err = kubeinformers.As[discoveryv1alpha1.Mesh](&unstructured.Unstructured{Object: map[string]any{"kind": "Mesh", "metadata": map[string]any{"name": "m3"}, "spec": "not an object"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "m3", "an object that does not convert is named")
	got, err = kubeinformers.As[discoveryv1alpha1.Mesh](cached.DeepCopyObject().(*discoveryv1alpha1.Mesh).ObjectMeta)
	require.NoError(t, err)
	assert.Nil(t, got, "anything else is nothing")
}
