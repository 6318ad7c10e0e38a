package v1alpha1_test

import (
	"testing"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The names that used to collide (`<name>-<namespace>-<cluster>`) differ,
// and every name is a short DNS label.
func TestNameIsInjective(t *testing.T) {
	squatter := discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, "eu", "istio-system-prod", "istiod")
	victim := discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, "prod-eu", "istio-system", "istiod")
	assert.NotEqual(t, squatter, victim)
	assert.NotEqual(t, discoveryv1alpha1.Name(discoveryv1alpha1.OriginService, "c", "b", "a-b"), discoveryv1alpha1.Name(discoveryv1alpha1.OriginService, "c", "b-b", "a"))
	assert.NotEqual(t, discoveryv1alpha1.Name(discoveryv1alpha1.OriginDeployment, "c", "ns", "w"), discoveryv1alpha1.Name(discoveryv1alpha1.OriginStatefulSet, "c", "ns", "w"))
	assert.Equal(t, victim, discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, "prod-eu", "istio-system", "istiod"), "deterministic")
	assert.Regexp(t, `^istiod-istio-system-prod-eu-[a-z2-7]{16}$`, victim)
}

// FuzzName: any origin gives a DNS label of at most 51 characters (it is
// also an intermediate's common name), and origins that differ in any part
// give different names.
func FuzzName(f *testing.F) {
	f.Add("Mesh", "prod-eu", "istio-system", "istiod", "eu", "istio-system-prod", "istiod")
	f.Add("Service", "c", "b", "a-b", "c", "b-b", "a")
	f.Add("Deployment", "", "", "", "x", "", "")
	f.Fuzz(func(t *testing.T, kind, c1, n1, name1, c2, n2, name2 string) {
		a := discoveryv1alpha1.Name(kind, c1, n1, name1)
		require.Empty(t, validation.IsDNS1123Label(a), "%q", a)
		require.LessOrEqual(t, len(a), 51)
		b := discoveryv1alpha1.Name(kind, c2, n2, name2)
		if c1 != c2 || n1 != n2 || name1 != name2 {
			require.NotEqual(t, a, b, "(%q %q %q) and (%q %q %q)", c1, n1, name1, c2, n2, name2)
		}
	})
}
