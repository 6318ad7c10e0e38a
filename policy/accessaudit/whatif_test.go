package accessaudit_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const whatIfBase = "testdata/virtualmesh/input.yaml"

// TestWhatIfGolden applies each testdata/whatif/<case> (with.yaml added,
// without.txt removed) to the virtualmesh input and compares the difference
// in access with diff.json (and, for change, diff.txt).
func TestWhatIfGolden(t *testing.T) {
	for _, name := range []string{"add", "change", "delete"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata/whatif", name)
			base := load(t, whatIfBase)
			var with *translation.Input
			if _, err := os.Stat(filepath.Join(dir, "with.yaml")); err == nil {
				with = load(t, filepath.Join(dir, "with.yaml"))
			}
			var without []accessaudit.Ref
			if b, err := os.ReadFile(filepath.Join(dir, "without.txt")); err == nil {
				for line := range strings.Lines(string(b)) {
					line = strings.TrimSpace(line)
					if line == "" || strings.HasPrefix(line, "#") {
						continue
					}
					r, err := accessaudit.ParseRef(line)
					require.NoError(t, err)
					without = append(without, r)
				}
			}
			cfg := auditConfig(t, admin)
			before, err := accessaudit.Audit(t.Context(), base, cfg)
			require.NoError(t, err)
			proposed, err := accessaudit.WhatIf(base, with, without)
			require.NoError(t, err)
			after, err := accessaudit.Audit(t.Context(), proposed, cfg)
			require.NoError(t, err)
			diff := accessaudit.Compare(before, after)
			assert.False(t, diff.Empty())
			golden(t, filepath.Join(dir, "diff.json"), jsonOf(t, diff))
			if name == "change" {
				var table bytes.Buffer
				require.NoError(t, accessaudit.WriteDiffTable(&table, diff))
				golden(t, filepath.Join(dir, "diff.txt"), table.Bytes())
			}
			// The base input is not modified, and changing nothing changes nothing.
			again, err := accessaudit.Audit(t.Context(), base, cfg)
			require.NoError(t, err)
			assert.True(t, accessaudit.Compare(before, again).Empty())
		})
	}
}

func policy(ns, name string, methods ...string) networkingv1alpha1.AccessPolicy {
	return networkingv1alpha1.AccessPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1alpha1.AccessPolicySpec{AllowedMethods: methods}}
}

func TestWhatIf(t *testing.T) {
	base := &translation.Input{AccessPolicies: []networkingv1alpha1.AccessPolicy{policy("a", "one", "GET"), policy("a", "two"), policy("b", "one")}}
	with := &translation.Input{AccessPolicies: []networkingv1alpha1.AccessPolicy{policy("a", "one", "POST"), policy("c", "new")}}
	out, err := accessaudit.WhatIf(base, with, []accessaudit.Ref{{Kind: "AccessPolicy", Namespace: "b", Name: "one"}})
	require.NoError(t, err)
	require.Len(t, out.AccessPolicies, 3)
	assert.Equal(t, []string{"POST"}, out.AccessPolicies[0].Spec.AllowedMethods, "replaced in place")
	assert.Equal(t, "two", out.AccessPolicies[1].Name)
	assert.Equal(t, "new", out.AccessPolicies[2].Name)
	assert.Equal(t, []string{"GET"}, base.AccessPolicies[0].Spec.AllowedMethods, "base unchanged")
	assert.Len(t, base.AccessPolicies, 3)

	// Removing what is added in the same change removes it.
	out, err = accessaudit.WhatIf(base, with, []accessaudit.Ref{{Kind: "AccessPolicy", Namespace: "c", Name: "new"}})
	require.NoError(t, err)
	assert.Len(t, out.AccessPolicies, 3)

	// Removing what is not there is an error naming it; kind matters.
	_, err = accessaudit.WhatIf(base, nil, []accessaudit.Ref{{Kind: "AccessPolicy", Namespace: "a", Name: "nope"}, {Kind: "TrafficPolicy", Namespace: "a", Name: "one"}})
	require.ErrorIs(t, err, accessaudit.ErrNotFound)
	assert.Contains(t, err.Error(), "cannot remove AccessPolicy/a/nope")
	assert.Contains(t, err.Error(), "cannot remove TrafficPolicy/a/one")
}

func TestParseRef(t *testing.T) {
	tests := []struct {
		in   string
		want accessaudit.Ref
		err  string
	}{
		{in: "accesspolicy/bookinfo/x", want: accessaudit.Ref{Kind: "AccessPolicy", Namespace: "bookinfo", Name: "x"}},
		{in: "AP/bookinfo/x", want: accessaudit.Ref{Kind: "AccessPolicy", Namespace: "bookinfo", Name: "x"}},
		{in: "trafficpolicies/bookinfo/x", want: accessaudit.Ref{Kind: "TrafficPolicy", Namespace: "bookinfo", Name: "x"}},
		{in: "vm/relaymesh/prod", want: accessaudit.Ref{Kind: "VirtualMesh", Namespace: "relaymesh", Name: "prod"}},
		{in: "vd/relaymesh/reviews", want: accessaudit.Ref{Kind: "VirtualDestination", Namespace: "relaymesh", Name: "reviews"}},
		{in: "Mesh/relaymesh/m", want: accessaudit.Ref{Kind: "Mesh", Namespace: "relaymesh", Name: "m"}},
		{in: "workloads/relaymesh/w", want: accessaudit.Ref{Kind: "Workload", Namespace: "relaymesh", Name: "w"}},
		{in: "destination/relaymesh/d", want: accessaudit.Ref{Kind: "Destination", Namespace: "relaymesh", Name: "d"}},
		{in: "accesspolicy/x", err: "want KIND/NAMESPACE/NAME"},
		{in: "accesspolicy//x", err: "want KIND/NAMESPACE/NAME"},
		{in: "a/b/c/d", err: "want KIND/NAMESPACE/NAME"},
		{in: "service/a/b", err: `unknown kind "service"`},
	}
	for _, tt := range tests {
		got, err := accessaudit.ParseRef(tt.in)
		if tt.err != "" {
			assert.ErrorContains(t, err, tt.err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got)
	}
}
