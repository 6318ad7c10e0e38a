package accessaudit_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/")

// admin is the server's namespace in every golden input.
const admin = "relaymesh"

// rendered is the one case whose table and HTML forms are golden too.
const rendered = "virtualmesh"

// golden compares got with the file at path, or with -update writes it.
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test -update")
	require.Equal(t, string(want), string(got), "%s differs; if the change is intended, run go test -update and review the diff", path)
}

func jsonOf(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, accessaudit.WriteJSON(&b, v))
	return b.Bytes()
}

func load(t testing.TB, path string) *translation.Input {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	in := &translation.Input{}
	require.NoError(t, in.Decode(b), path)
	return in
}

// cases are the directories of testdata/ with an input.yaml.
func cases(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob("testdata/*/input.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, dirs)
	for i, d := range dirs {
		dirs[i] = filepath.Dir(d)
	}
	return dirs
}

// TestGolden audits each testdata/<case>/input.yaml and compares the matrix
// and the findings with matrix.json and findings.json; the rendered case
// also with table.txt and page.html.
func TestGolden(t *testing.T) {
	for _, dir := range cases(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			r, err := accessaudit.Audit(t.Context(), load(t, filepath.Join(dir, "input.yaml")), auditConfig(t, admin))
			require.NoError(t, err)
			assert.Equal(t, accessaudit.Schema, r.Schema)
			golden(t, filepath.Join(dir, "matrix.json"), jsonOf(t, r.Matrix))
			golden(t, filepath.Join(dir, "findings.json"), jsonOf(t, r.Findings))
			if filepath.Base(dir) != rendered {
				return
			}
			var table, page bytes.Buffer
			require.NoError(t, accessaudit.WriteTable(&table, r))
			require.NoError(t, accessaudit.WriteHTML(&page, r))
			golden(t, filepath.Join(dir, "table.txt"), table.Bytes())
			golden(t, filepath.Join(dir, "page.html"), page.Bytes())
		})
	}
}

// TestEveryFindingKindIsGolden makes sure the golden cases show every kind
// of finding, so none goes untested.
func TestEveryFindingKindIsGolden(t *testing.T) {
	seen := map[string]bool{}
	for _, dir := range cases(t) {
		b, err := os.ReadFile(filepath.Join(dir, "findings.json"))
		require.NoError(t, err)
		var fs []accessaudit.Finding
		require.NoError(t, json.Unmarshal(b, &fs))
		for _, f := range fs {
			seen[f.Kind] = true
		}
	}
	for _, k := range []string{accessaudit.KindAllowsEveryone, accessaudit.KindShadowed, accessaudit.KindMatchesNothing, accessaudit.KindNotInForce, accessaudit.KindRefused,
		accessaudit.KindReachableOutside, accessaudit.KindTrafficConflict, accessaudit.KindSharedPrincipal, accessaudit.KindUnreachableGrant, accessaudit.KindNeedsWaypoint} {
		assert.True(t, seen[k], "no golden case has a %s finding", k)
	}
}

func shuffle[T any](rng *rand.Rand, s []T) []T {
	out := slices.Clone(s)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// TestDeterministic: the order of the input's lists changes nothing.
func TestDeterministic(t *testing.T) {
	for _, dir := range cases(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			in := load(t, filepath.Join(dir, "input.yaml"))
			want, err := accessaudit.Audit(t.Context(), in, auditConfig(t, admin))
			require.NoError(t, err)
			for seed := range uint64(5) {
				rng := rand.New(rand.NewPCG(seed, 7))
				shuffled := &translation.Input{
					Meshes: shuffle(rng, in.Meshes), Workloads: shuffle(rng, in.Workloads), Destinations: shuffle(rng, in.Destinations),
					VirtualMeshes: shuffle(rng, in.VirtualMeshes), TrafficPolicies: shuffle(rng, in.TrafficPolicies),
					AccessPolicies: shuffle(rng, in.AccessPolicies), VirtualDestinations: shuffle(rng, in.VirtualDestinations),
					Clusters: shuffle(rng, in.Clusters),
				}
				got, err := accessaudit.Audit(t.Context(), shuffled, auditConfig(t, admin))
				require.NoError(t, err)
				require.Equal(t, string(jsonOf(t, want)), string(jsonOf(t, got)), "seed %d", seed)
			}
		})
	}
}

// TestTooLarge: an input above the bound is refused before any work, with a
// message that says so.
func TestTooLarge(t *testing.T) {
	in := load(t, "testdata/virtualmesh/input.yaml")
	_, err := accessaudit.Audit(t.Context(), in, withMax(auditConfig(t, admin), accessaudit.Count(in)-1))
	require.ErrorIs(t, err, accessaudit.ErrTooLarge)
	assert.Contains(t, err.Error(), "objects, at most")
	_, err = accessaudit.Audit(t.Context(), in, withMax(auditConfig(t, admin), accessaudit.Count(in)))
	require.NoError(t, err)
}

// TestEmptyInput: nothing in, an empty matrix out (lists, not nulls).
func TestEmptyInput(t *testing.T) {
	r, err := accessaudit.Audit(t.Context(), &translation.Input{}, auditConfig(t, admin))
	require.NoError(t, err)
	assert.JSONEq(t, `{"schema":"`+accessaudit.Schema+`","matrix":{"sources":[],"destinations":[],"pairs":[]},"findings":[]}`, string(jsonOf(t, r)))
}

// TestNamespaceTenancy: a team's AccessPolicy that reaches into another
// namespace is not in force (all.ScopePolicies), while the same
// policy in the admin namespace is.
func TestNamespaceTenancy(t *testing.T) {
	in := load(t, "testdata/findings/input.yaml")
	r, err := accessaudit.Audit(t.Context(), in, auditConfig(t, admin))
	require.NoError(t, err)
	batch := destination(t, r, "cluster-2/jobs/batch")
	assert.NotContains(t, batch.Policies, "apps/grab-batch")

	r, err = accessaudit.Audit(t.Context(), in, auditConfig(t, "apps"))
	require.NoError(t, err)
	batch = destination(t, r, "cluster-2/jobs/batch")
	assert.Contains(t, batch.Policies, "apps/grab-batch")
}

func destination(t *testing.T, r *accessaudit.Result, id string) accessaudit.Destination {
	t.Helper()
	for _, d := range r.Matrix.Destinations {
		if d.ID == id {
			return d
		}
	}
	require.Failf(t, "no destination", "%s", id)
	return accessaudit.Destination{}
}

// auditConfig is a Config for the server namespace adminNS, judged by the
// default admission rules.
func auditConfig(tb testing.TB, adminNS string) accessaudit.Config {
	return accessaudit.ConfigForTest(tb, adminNS)
}

func withMax(cfg accessaudit.Config, n int) accessaudit.Config {
	cfg.MaxObjects = n
	return cfg
}

// TestARefusedAllowAllIsNotInTheMatrix is the demo with an AccessPolicy
// that selects everything without the opt-in: admission refuses it, so the
// matrix holds the demo's 2 pairs, not 16, no pair names it, the demo's
// policy is not "shadowed", and removing the demo's policy removes its 2
// pairs. With the opt-in the same policy is in force: 16 pairs, and the
// demo's policy shadowed — what the audit said before it applied admission.
func TestARefusedAllowAllIsNotInTheMatrix(t *testing.T) {
	in := load(t, "testdata/refused/input.yaml")
	cfg := auditConfig(t, admin)
	r, err := accessaudit.Audit(t.Context(), in, cfg)
	require.NoError(t, err)
	require.Len(t, r.Matrix.Pairs, 2)
	for _, p := range r.Matrix.Pairs {
		assert.Equal(t, "cluster-1/bookinfo/bookinfo-productpage", p.Source)
		require.Len(t, p.Grants, 1)
		assert.Equal(t, "relaymesh/productpage-to-reviews", p.Grants[0].Policy)
	}
	kinds := map[string][]string{}
	for _, f := range r.Findings {
		kinds[f.Kind] = append(kinds[f.Kind], f.Objects[0])
	}
	assert.Equal(t, []string{"AccessPolicy/relaymesh/allow-all"}, kinds[accessaudit.KindRefused])
	assert.Empty(t, kinds[accessaudit.KindShadowed])
	assert.Empty(t, kinds[accessaudit.KindAllowsEveryone])

	proposed, err := accessaudit.WhatIf(in, nil, []accessaudit.Ref{{Kind: "AccessPolicy", Namespace: admin, Name: "productpage-to-reviews"}})
	require.NoError(t, err)
	after, err := accessaudit.Audit(t.Context(), proposed, cfg)
	require.NoError(t, err)
	assert.Len(t, accessaudit.Compare(r, after).Removed, 2, "removing the only real policy cuts the only access")

	for i := range in.AccessPolicies {
		if in.AccessPolicies[i].Name == "allow-all" {
			in.AccessPolicies[i].Annotations = map[string]string{"relaymesh.io/allow-all": "true"}
		}
	}
	opted, err := accessaudit.Audit(t.Context(), in, cfg)
	require.NoError(t, err)
	assert.Len(t, opted.Matrix.Pairs, 16)
	var shadowed []string
	for _, f := range opted.Findings {
		if f.Kind == accessaudit.KindShadowed {
			shadowed = append(shadowed, f.Objects[0])
		}
	}
	assert.Equal(t, []string{"AccessPolicy/relaymesh/productpage-to-reviews"}, shadowed)

	// Without an admission check the audit refuses to run.
	_, err = accessaudit.Audit(t.Context(), in, accessaudit.Config{AdminNamespace: admin})
	require.ErrorIs(t, err, all.ErrNoAdmission)
}

// TestAnL7GrantAtAnAmbientDestinationWithoutAWaypointIsNotInTheMatrix: an
// AccessPolicy with paths or methods allows no one at an ambient
// Destination no usable waypoint serves (translation writes nothing of it
// there: the target is Failed, "needs a waypoint"), so the matrix holds no
// pair of it there and a needs-waypoint finding names it; at a mixed
// Destination the sidecar pods still admit its sources, and the pair stays
// with a finding. Served by its waypoint, the same kind of grant is in the
// matrix.
func TestAnL7GrantAtAnAmbientDestinationWithoutAWaypointIsNotInTheMatrix(t *testing.T) {
	r, err := accessaudit.Audit(t.Context(), load(t, "testdata/ambient/input.yaml"), auditConfig(t, admin))
	require.NoError(t, err)
	pairs := map[string][]string{}
	for _, p := range r.Matrix.Pairs {
		var gs []string
		for _, g := range p.Grants {
			gs = append(gs, g.Policy)
		}
		pairs[p.Source+" → "+p.Destination] = gs
	}
	assert.Equal(t, map[string][]string{
		"cluster-1/shop/productpage → cluster-1/shop/reviews": {"shop/reviews-get"}, // through the waypoint
		"cluster-1/shop/ratings → cluster-1/shop/reviews":     {"shop/reviews-l4"},
		"cluster-1/shop/reviews → cluster-1/shop/ratings":     {"shop/ratings-l4"},
		"cluster-1/shop/productpage → cluster-1/shop/catalog": {"shop/catalog-get"}, // the sidecar pods of a mixed Destination
	}, pairs, "no productpage → ratings (ratings-paths) nor productpage → details (details-paths)")
	assert.Equal(t, "ambient", destination(t, r, "cluster-1/shop/ratings").DataPlaneMode)
	assert.Equal(t, "mixed", destination(t, r, "cluster-1/shop/catalog").DataPlaneMode)
	assert.Equal(t, []string{"shop/details-paths"}, destination(t, r, "cluster-1/shop/details").Policies, "still restricted by the policy: not open")

	needs := map[string]accessaudit.Finding{}
	for _, f := range r.Findings {
		if f.Kind == accessaudit.KindNeedsWaypoint {
			needs[f.Objects[0]] = f
		}
	}
	require.Len(t, needs, 3)
	for _, ap := range []string{"ratings-paths", "details-paths", "catalog-get"} {
		f := needs["AccessPolicy/shop/"+ap]
		assert.Equal(t, accessaudit.SeverityHigh, f.Severity, ap)
		assert.Contains(t, f.Message, "needs a waypoint", ap)
	}
	assert.Contains(t, needs["AccessPolicy/shop/details-paths"].Message, "is not ready")
	assert.Contains(t, needs["AccessPolicy/shop/catalog-get"].Message, "its pods that still have a sidecar admit them")
}

// TestAnL7GrantAtAHeadlessServiceBehindAWaypointIsNotInTheMatrix: reviews
// made headless (its waypoint still bound and ready): productpage's L7
// grant would be checked by no one and refused at ztunnel, so it leaves the
// matrix with a needs-waypoint finding naming the headless Service; the L4
// grant from ratings stays.
func TestAnL7GrantAtAHeadlessServiceBehindAWaypointIsNotInTheMatrix(t *testing.T) {
	in := load(t, "testdata/ambient/input.yaml")
	for i := range in.Destinations {
		if in.Destinations[i].Spec.KubeService.Ref.Name == "reviews" {
			in.Destinations[i].Spec.KubeService.Headless = true
		}
	}
	r, err := accessaudit.Audit(t.Context(), in, auditConfig(t, admin))
	require.NoError(t, err)
	pairs := map[string]bool{}
	for _, p := range r.Matrix.Pairs {
		pairs[p.Source+" → "+p.Destination] = true
	}
	assert.False(t, pairs["cluster-1/shop/productpage → cluster-1/shop/reviews"], "the L7 grant is not in force at a headless Service")
	assert.True(t, pairs["cluster-1/shop/ratings → cluster-1/shop/reviews"], "the L4 grant is, at ztunnel")
	var found bool
	for _, f := range r.Findings {
		if f.Kind == accessaudit.KindNeedsWaypoint && f.Objects[0] == "AccessPolicy/shop/reviews-get" {
			found = true
			assert.Contains(t, f.Message, "headless")
		}
	}
	assert.True(t, found, "a needs-waypoint finding for reviews-get")
}
