package controller_test

import (
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/worldtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A policy whose destination selector matches nothing is Accepted (it is
// not wrong) but its status says it has no effect.
func TestSelectorMatchingNothingIsReported(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(2, 4, 2, false))
	nothing := []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "does-not-exist"}}}}
	in.TrafficPolicies[0].Spec.DestinationSelector = nothing
	in.AccessPolicies = append(in.AccessPolicies, networkingv1alpha1.AccessPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "nothing", Namespace: "relaymesh", Generation: 3},
		Spec:       networkingv1alpha1.AccessPolicySpec{DestinationSelector: nothing},
	})
	_, r := all.Translate(in, "relaymesh")

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

// A policy outside the admin namespace may only reach Services of its own
// namespace: selecting, shifting to or mirroring to another namespace makes
// it Invalid and it produces nothing.
func TestPoliciesAreScopedToTheirNamespace(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(2, 4, 4, false))
	tenant := in.TrafficPolicies[0]
	tenant.Namespace, tenant.Name = "team-a", "reaches-apps"
	own := in.TrafficPolicies[1]
	apps := own.Spec.DestinationSelector[0].KubeServiceRefs.Services[0].Namespace // the namespace of the Service it shifts
	own.Namespace, own.Name = apps, "own-namespace"
	access := in.AccessPolicies[0]
	access.Namespace, access.Name = "team-a", "access-apps"
	in.TrafficPolicies = append(in.TrafficPolicies, tenant, own)
	in.AccessPolicies = append(in.AccessPolicies, access)

	out, r := all.Translate(in, "relaymesh")
	for _, k := range []translation.ObjectKey{{Kind: "TrafficPolicy", Namespace: "team-a", Name: "reaches-apps"}, {Kind: "AccessPolicy", Namespace: "team-a", Name: "access-apps"}} {
		st, _, ok := r.Status(k)
		require.True(t, ok, "%v", k)
		assert.Equal(t, common.StateInvalid, st.State, "%v", k)
		require.NotEmpty(t, st.Errors)
		assert.Contains(t, st.Errors[0], "a policy in namespace team-a may only target Services in team-a")
	}
	st, _, _ := r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: apps, Name: "own-namespace"})
	assert.Equal(t, common.StateAccepted, st.State, "a policy in the Services' own namespace is fine: %v", st.Errors)
	st, _, _ = r.Status(translation.ObjectKey{Kind: "TrafficPolicy", Namespace: "relaymesh", Name: in.TrafficPolicies[0].Name})
	assert.Equal(t, common.StateAccepted, st.State, "the admin namespace may target anything")
	for _, o := range out.Objects() {
		for _, p := range o.Parents {
			assert.NotEqual(t, "team-a", p.Namespace, "an Invalid policy produced %s", o.Object.GetName())
		}
	}
}
