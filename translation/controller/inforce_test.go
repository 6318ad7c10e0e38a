package controller_test

import (
	"context"
	"errors"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/worldtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// allowAll is an AccessPolicy selecting every source and destination,
// without the opt-in annotation the default admission rules ask for.
func allowAll(name string) networkingv1alpha1.AccessPolicy {
	return networkingv1alpha1.AccessPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh", Generation: 1}}
}

func defaultAdmission(t *testing.T) *admission.Engine {
	t.Helper()
	e, err := admission.New(admission.Config{Recorder: audit.Discard})
	require.NoError(t, err)
	return e
}

// TestARefusedPolicyIsNotInForce: the allow-all policy admission refuses
// is left out of what is translated — no output names it — and is Invalid
// with the rule's message; with the opt-in annotation it is in force.
func TestARefusedPolicyIsNotInForce(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(2, 4, 2, false))
	in.AccessPolicies = append(in.AccessPolicies, allowAll("everyone"))
	cfg := all.InForceConfig{AdminNamespace: "relaymesh", Admission: defaultAdmission(t)}

	admitted, out, r, err := all.TranslateInForce(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Len(t, admitted.AccessPolicies, len(in.AccessPolicies)-1)
	key := translation.ObjectKey{Kind: translation.KindAccessPolicy, Namespace: "relaymesh", Name: "everyone"}
	st, _, ok := r.Status(key)
	require.True(t, ok)
	assert.Equal(t, common.StateInvalid, st.State)
	require.Len(t, st.Errors, 1)
	assert.Contains(t, st.Errors[0], "refused by admission, so it is not translated: AccessPolicy relaymesh/everyone lets every source reach every destination")
	assert.True(t, all.RefusedByAdmission(st.Errors[0]))
	for _, o := range out.Objects() {
		for _, p := range o.Parents {
			assert.NotEqual(t, "AccessPolicy/relaymesh/everyone", p.String(), "%s %s/%s", o.Object.GetKind(), o.Object.GetNamespace(), o.Object.GetName())
		}
	}
	// The other objects keep the statuses a plain translation gives them.
	_, plain := all.Translate(in, "relaymesh")
	for _, k := range plain.Keys() {
		if k == key {
			continue
		}
		want, _, _ := plain.Status(k)
		got, _, _ := r.Status(k)
		assert.Equal(t, want, got, "%v", k)
	}

	opted := allowAll("everyone")
	opted.Annotations = map[string]string{"relaymesh.io/allow-all": "true"}
	in.AccessPolicies[len(in.AccessPolicies)-1] = opted
	admitted, _, r, err = all.TranslateInForce(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Len(t, admitted.AccessPolicies, len(in.AccessPolicies))
	st, _, _ = r.Status(key)
	assert.Equal(t, common.StateAccepted, st.State)
}

// TestServerStatusCountsForItsGeneration: with ServerStatus, an object the
// server reports Invalid for its current generation is left out (the server
// may judge with rule sets the view cannot read); a status of an older
// generation does not count, nor does any status without ServerStatus.
func TestServerStatusCountsForItsGeneration(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(2, 4, 2, false))
	ap := &in.AccessPolicies[0]
	ap.Generation = 4
	ap.Status.State, ap.Status.ObservedGeneration, ap.Status.Errors = common.StateInvalid, 4, []string{"refused by admission, so it is not translated: team rule"}
	key := translation.ObjectKey{Kind: translation.KindAccessPolicy, Namespace: ap.Namespace, Name: ap.Name}
	cfg := all.InForceConfig{AdminNamespace: "relaymesh", Admission: defaultAdmission(t), ServerStatus: true}

	admitted, r, err := all.InForce(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Len(t, admitted.AccessPolicies, len(in.AccessPolicies)-1)
	st, _, _ := r.Status(key)
	assert.Equal(t, []string{"the server reports it Invalid, so it is not translated: refused by admission, so it is not translated: team rule"}, st.Errors)
	assert.True(t, all.LeftOut(st.Errors[0]))
	assert.True(t, all.RefusedByAdmission(st.Errors[0]), "the server's refusal by its own rules")

	// An Invalid status for another reason is left out, not a refusal.
	ap.Status.Errors = []string{"spec.destinationSelector: something translation refused"}
	_, r, err = all.InForce(context.Background(), in, cfg)
	require.NoError(t, err)
	st, _, _ = r.Status(key)
	assert.True(t, all.LeftOut(st.Errors[0]))
	assert.False(t, all.RefusedByAdmission(st.Errors[0]))

	ap.Generation = 5 // changed since the server judged it
	admitted, _, err = all.InForce(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Len(t, admitted.AccessPolicies, len(in.AccessPolicies))

	ap.Generation = 4
	cfg.ServerStatus = false
	admitted, _, err = all.InForce(context.Background(), in, cfg)
	require.NoError(t, err)
	assert.Len(t, admitted.AccessPolicies, len(in.AccessPolicies))
}

// denyAll is a Decider that refuses everything, or fails.
type denyAll struct{ err error }

func (d denyAll) Decide(context.Context, admission.Request) (admission.Decision, error) {
	if d.err != nil {
		return admission.Decision{}, d.err
	}
	return admission.Decision{Denials: []admission.Denial{{Rule: "test", Message: "no"}}}, nil
}

// TestInForceFailsClosed: no admission is an error, and an admission check
// that fails leaves every user object out — never in.
func TestInForceFailsClosed(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(2, 4, 2, true))
	_, _, err := all.InForce(context.Background(), in, all.InForceConfig{AdminNamespace: "relaymesh"})
	require.ErrorIs(t, err, all.ErrNoAdmission)
	_, _, _, err = all.TranslateInForce(context.Background(), in, all.InForceConfig{AdminNamespace: "relaymesh"})
	require.ErrorIs(t, err, all.ErrNoAdmission)

	for _, d := range []denyAll{{}, {err: errors.New("evaluation timed out")}} {
		admitted, r, err := all.InForce(context.Background(), in, all.InForceConfig{AdminNamespace: "relaymesh", Admission: d})
		require.NoError(t, err)
		assert.Empty(t, admitted.VirtualMeshes)
		assert.Empty(t, admitted.TrafficPolicies)
		assert.Empty(t, admitted.AccessPolicies)
		assert.Empty(t, admitted.VirtualDestinations)
		assert.Equal(t, in.Destinations, admitted.Destinations, "discovered objects are not judged")
		for _, k := range r.Keys() {
			st, _, _ := r.Status(k)
			assert.Equal(t, common.StateInvalid, st.State, "%v", k)
			assert.True(t, all.RefusedByAdmission(st.Errors[0]), "%v: %v", k, st.Errors)
		}
		assert.Len(t, r.Keys(), len(in.VirtualMeshes)+len(in.TrafficPolicies)+len(in.AccessPolicies)+len(in.VirtualDestinations))
	}
}

// TestDescribeSaysARefusedPolicyIsNotInForce: described from what
// TranslateInForce reports, the refused policy is Invalid, not in force,
// and has no outputs, while an accepted one is in force.
func TestDescribeSaysARefusedPolicyIsNotInForce(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(2, 4, 2, false))
	in.AccessPolicies = append(in.AccessPolicies, allowAll("everyone"))
	_, out, r, err := all.TranslateInForce(context.Background(), in, all.InForceConfig{AdminNamespace: "relaymesh", Admission: defaultAdmission(t)})
	require.NoError(t, err)
	d, err := all.DescribePolicy(in, out, r, translation.KindAccessPolicy, "relaymesh", "everyone")
	require.NoError(t, err)
	assert.Equal(t, string(common.StateInvalid), d.State)
	assert.False(t, d.InForce)
	assert.Empty(t, d.Outputs)
	assert.NotEmpty(t, d.Destinations, "what it would select is still shown")

	first := in.AccessPolicies[0]
	d, err = all.DescribePolicy(in, out, r, translation.KindAccessPolicy, first.Namespace, first.Name)
	require.NoError(t, err)
	assert.True(t, d.InForce)
	assert.NotEmpty(t, d.Outputs)
}
