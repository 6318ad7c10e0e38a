package controller_test

import (
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A policy whose destination selector matches nothing is Accepted (it is
// not wrong) but its status says it has no effect.
func TestSelectorMatchingNothingIsReported(t *testing.T) {
	in := world(2, 4, 2, false)
	nothing := []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "does-not-exist"}}}}
	in.TrafficPolicies[0].Spec.DestinationSelector = nothing
	in.AccessPolicies = append(in.AccessPolicies, networkingv1alpha1.AccessPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "nothing", Namespace: "relaymesh", Generation: 3},
		Spec:       networkingv1alpha1.AccessPolicySpec{DestinationSelector: nothing},
	})
	_, r := controller.Translate(in)

	st, _, ok := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: "relaymesh", Name: in.TrafficPolicies[0].Name})
	require.True(t, ok)
	assert.Equal(t, common.StateAccepted, st.State)
	assert.Contains(t, st.Warnings, "destinationSelector matches no Destination: the policy has no effect")

	st, _, ok = r.Status(translation.ObjectKey{Kind: "AccessPolicy", Namespace: "relaymesh", Name: "nothing"})
	require.True(t, ok)
	assert.Equal(t, int64(3), st.ObservedGeneration)
	assert.NotEmpty(t, st.Warnings)

	st, _, _ = r.Status(translation.ObjectKey{Kind: "AccessPolicy", Namespace: "relaymesh", Name: in.AccessPolicies[0].Name})
	assert.Empty(t, st.Warnings, "a policy that selects something gets no warning")
}
