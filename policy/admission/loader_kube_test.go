package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLoaderConfigMaps runs the loader against a real kube-apiserver: user
// rules in labelled ConfigMaps take effect without a restart, and broken
// ones are refused while the rules before them keep working.
func TestLoaderConfigMaps(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, cs, _ := localcluster.Management(t, "")
	for _, ns := range []string{"relaymesh", "elsewhere"} {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	cms := cs.CoreV1().ConfigMaps("relaymesh")
	configMap := func(name string, rs admission.RuleSet, labelled bool) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh"},
			Data: map[string]string{"README.md": "not Rego, ignored"}}
		if labelled {
			cm.Labels = map[string]string{admission.PolicyLabel: ""}
		}
		for k, v := range rs.Files {
			cm.Data[k] = v
		}
		return cm
	}

	// Present before the loader starts: one labelled, one not, one labelled
	// in another namespace.
	_, err := cms.Create(ctx, configMap("team-a", ruleSet("", "team_a", "a"), true), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cms.Create(ctx, configMap("unlabelled", ruleSet("", "unlabelled", "u"), false), metav1.CreateOptions{})
	require.NoError(t, err)
	other := configMap("other", ruleSet("", "other", "o"), true)
	other.Namespace = "elsewhere"
	_, err = cs.CoreV1().ConfigMaps("elsewhere").Create(ctx, other, metav1.CreateOptions{})
	require.NoError(t, err)

	e, _ := newEngine(t, nil)
	l, err := admission.NewLoader(admission.LoaderConfig{Client: cs, Namespace: "relaymesh", Engine: e, Debounce: 20 * time.Millisecond})
	require.NoError(t, err)
	require.Same(t, e, l.Engine())
	require.NoError(t, l.Start(ctx))
	assert.ErrorIs(t, l.Start(ctx), admission.ErrAlreadyStarted)

	// Loaded by the time Start returns.
	assert.Equal(t, admission.StateAccepted, statusOf(t, l.Status(), "relaymesh/team-a").State)
	assert.Len(t, l.Status(), 2, "the default rule set and team-a: %+v", l.Status())
	assert.Equal(t, []string{"relaymesh.admission.team_a"}, deniedBy(t, e, map[string]any{"a": true}))
	assert.Empty(t, deniedBy(t, e, map[string]any{"u": true, "o": true}))

	// A new ConfigMap takes effect without a restart.
	cm, err := cms.Create(ctx, configMap("team-b", ruleSet("", "team_b", "b"), true), metav1.CreateOptions{})
	require.NoError(t, err)
	waitFor(t, l, "relaymesh/team-b", cm.ResourceVersion, admission.StateAccepted)
	assert.Equal(t, []string{"relaymesh.admission.team_b"}, deniedBy(t, e, map[string]any{"b": true}))

	// Broken versions are refused; team-b's accepted version and team-a
	// keep working.
	const pkg = "package relaymesh.admission.team_b\n\n"
	broken := []struct{ name, src, want string }{
		{"syntax error", pkg + "deny contains msg if {\n", "relaymesh/team-b/rules.rego:"},
		{"failing test", pkg + "deny contains \"always\" if { true }\n\ntest_allows if { count(deny) == 0 }\n", "relaymesh.admission.team_b.test_allows: failed"},
		{"no tests", pkg + "deny contains \"always\" if { true }\n", "no test_ rules"},
		{"http.send", pkg + "deny contains \"x\" if { http.send({\"method\": \"get\", \"url\": \"http://example.com\"}) }\n\ntest_ok if { true }\n", "http.send"},
	}
	for _, tc := range broken {
		t.Run(tc.name, func(t *testing.T) {
			cm.Data["rules.rego"] = tc.src
			cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
			require.NoError(t, err)
			s := waitFor(t, l, "relaymesh/team-b", cm.ResourceVersion, admission.StateRefused)
			assert.Contains(t, s.Error, tc.want)
			assert.NotEmpty(t, s.ActiveVersion)
			assert.NotEqual(t, cm.ResourceVersion, s.ActiveVersion)
			assert.Equal(t, []string{"relaymesh.admission.team_b"}, deniedBy(t, e, map[string]any{"b": true}))
			assert.Equal(t, []string{"relaymesh.admission.team_a"}, deniedBy(t, e, map[string]any{"a": true}))
			assert.Empty(t, deniedBy(t, e, map[string]any{}), "no rule denies everything")
		})
	}

	// Fixed: the new version is in force.
	cm.Data["rules.rego"] = ruleSet("", "team_b", "b2").Files["rules.rego"]
	cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, l, "relaymesh/team-b", cm.ResourceVersion, admission.StateAccepted)
	assert.Empty(t, deniedBy(t, e, map[string]any{"b": true}))
	assert.Equal(t, []string{"relaymesh.admission.team_b"}, deniedBy(t, e, map[string]any{"b2": true}))

	// Removing the label or the ConfigMap removes the rules.
	a, err := cms.Get(ctx, "team-a", metav1.GetOptions{})
	require.NoError(t, err)
	a.Labels = nil
	_, err = cms.Update(ctx, a, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, cms.Delete(ctx, "team-b", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(l.Status()) == 1 }, 20*time.Second, 20*time.Millisecond)
	assert.Empty(t, deniedBy(t, e, map[string]any{"a": true, "b2": true}))
}

// waitFor waits until the named rule set's status is about version and
// returns it, failing if its state is not want.
func waitFor(t *testing.T, l *admission.Loader, name, version string, want admission.RuleSetState) admission.RuleSetStatus {
	t.Helper()
	var got admission.RuleSetStatus
	require.Eventually(t, func() bool {
		for _, s := range l.Status() {
			if s.Name == name && s.Version == version {
				got = s
				return true
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "rule set %s never reached version %s: %+v", name, version, l.Status())
	require.Equal(t, want, got.State, "%+v", got)
	return got
}
