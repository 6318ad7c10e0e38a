package policy_test

import (
	"path/filepath"
	"strings"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// httpFields are the AuthorizationPolicy operation fields ztunnel cannot
// enforce: in an ALLOW it drops the whole rule, in a DENY it widens it.
var httpFields = []string{"methods", "notMethods", "paths", "notPaths", "hosts", "notHosts"}

// TestNoHTTPRuleReachesZtunnel: every access golden input, with each of its
// Destinations turned ambient (with and without a ready waypoint), never
// yields an HTTP condition in a policy ztunnel enforces (one with a
// selector); every waypoint policy targets the Destination's Service; and
// an HTTP policy without a waypoint fails its target saying it needs one.
func TestNoHTTPRuleReachesZtunnel(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("testdata", "access", "*"))
	require.NoError(t, err)
	for _, dir := range dirs {
		for _, withWaypoint := range []bool{false, true} {
			in := translationtest.LoadInput(t, dir)
			ambientEverywhere(in, withWaypoint)
			out, r := translation.NewOutput(), translation.NewReport()
			policy.TranslateAccess(in, out, r)
			for _, o := range out.Objects() {
				spec, _ := o.Object.Object["spec"].(map[string]any)
				_, selector := spec["selector"]
				_, targeted := spec["targetRefs"]
				require.True(t, selector != targeted, "%s: %s has exactly one of selector and targetRefs", dir, o.Object.GetName())
				if targeted {
					assert.True(t, strings.HasSuffix(o.Object.GetName(), ".waypoint"), o.Object.GetName())
					refs, _, _ := unstructured.NestedSlice(spec, "targetRefs")
					require.Len(t, refs, 1)
					assert.Equal(t, "Service", refs[0].(map[string]any)["kind"])
					continue
				}
				rules, _, _ := unstructured.NestedSlice(spec, "rules")
				for _, rule := range rules {
					tos, _, _ := unstructured.NestedSlice(rule.(map[string]any), "to")
					for _, to := range tos {
						op, _, _ := unstructured.NestedMap(to.(map[string]any), "operation")
						for _, f := range httpFields {
							assert.NotContains(t, op, f, "%s (waypoint %v): %s carries %s at ztunnel", dir, withWaypoint, o.Object.GetName(), f)
						}
					}
				}
			}
			for _, p := range in.AccessPolicies {
				_, targets, _ := r.Status(translation.ObjectKey{Kind: "AccessPolicy", Namespace: p.Namespace, Name: p.Name})
				http := len(p.Spec.AllowedMethods)+len(p.Spec.AllowedPaths) > 0
				for _, ts := range targets {
					needs := ts.State == common.StateFailed && strings.Contains(strings.Join(ts.Errors, " "), "needs a waypoint")
					if http && !withWaypoint && !strings.Contains(strings.Join(ts.Errors, " "), "allows no one") {
						assert.True(t, needs, "%s: %s/%s on %s needs a waypoint and says so: %v", dir, p.Namespace, p.Name, ts.Target, ts.Errors)
					}
					if withWaypoint || !http {
						assert.False(t, needs, "%s: %s/%s on %s: %v", dir, p.Namespace, p.Name, ts.Target, ts.Errors)
					}
				}
			}
		}
	}
}

// ambientEverywhere turns every Destination of in ambient; withWaypoint
// binds each to a ready waypoint "wp" of its namespace in its mesh.
func ambientEverywhere(in *translation.Input, withWaypoint bool) {
	for i := range in.Destinations {
		ks := &in.Destinations[i].Spec.KubeService
		ks.DataPlaneMode = discoveryv1alpha1.DataPlaneAmbient
		ks.Waypoint = nil
		if withWaypoint {
			ks.Waypoint = &discoveryv1alpha1.WaypointRef{Name: "wp", Namespace: ks.Ref.Namespace}
		}
	}
	for i := range in.Meshes {
		ist := in.Meshes[i].Spec.Istio
		if ist == nil {
			continue
		}
		ist.Ambient = &discoveryv1alpha1.AmbientMesh{Ztunnel: true}
		if withWaypoint {
			seen := map[string]bool{}
			for _, d := range in.Destinations {
				ns := d.Spec.KubeService.Ref.Namespace
				if !seen[ns] {
					seen[ns] = true
					ist.Ambient.Waypoints = append(ist.Ambient.Waypoints, discoveryv1alpha1.WaypointInfo{Name: "wp", Namespace: ns, TrafficType: "service", ServiceAccount: "wp", Ready: true})
				}
			}
		}
	}
}

// TestWaypointIsAdmittedOnlyWhereItSits: for an L7 policy the destination's
// ztunnel admits the waypoint's identity and not the client's (a client
// that skips the waypoint by dialling a pod IP must not skip the path
// check); the sidecar policy of a sidecar Destination is untouched.
func TestWaypointIsAdmittedOnlyWhereItSits(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("testdata", "access", "ambient-waypoint"))
	out, r := translation.NewOutput(), translation.NewReport()
	policy.TranslateAccess(in, out, r)
	byName := map[string]*unstructured.Unstructured{}
	for _, o := range out.Objects() {
		byName[o.Object.GetName()] = o.Object
	}
	principals := func(name string) []string {
		var all []string
		rules, _, _ := unstructured.NestedSlice(byName[name].Object, "spec", "rules")
		for _, rule := range rules {
			froms, _, _ := unstructured.NestedSlice(rule.(map[string]any), "from")
			for _, f := range froms {
				ps, _, _ := unstructured.NestedStringSlice(f.(map[string]any), "source", "principals")
				all = append(all, ps...)
			}
		}
		return all
	}
	require.Contains(t, byName, "relaymesh-reviews.ztunnel")
	assert.Contains(t, principals("relaymesh-reviews.ztunnel"), "cluster-1.local/ns/shop/sa/waypoint")
	assert.NotContains(t, principals("relaymesh-reviews.ztunnel"), "cluster-1.local/ns/shop/sa/productpage", "the L7 client is checked at the waypoint only")
	assert.Contains(t, principals("relaymesh-reviews.waypoint"), "cluster-1.local/ns/shop/sa/productpage")
	assert.NotContains(t, principals("relaymesh-ratings.ztunnel"), "cluster-1.local/ns/shop/sa/waypoint", "no waypoint serves ratings")
	assert.NotContains(t, byName, "relaymesh-ratings.waypoint")
	assert.NotContains(t, byName, "relaymesh-reviews", "an ambient-only Destination gets no sidecar-era policy")
}

// TestAHeadlessServiceIsNotServedByItsWaypoint: reviews made headless, its
// waypoint bound and ready: clients reach the pod IPs past the waypoint, so
// the L7 policy fails "needs a waypoint" naming the headless Service (no
// .waypoint object enforced by no one, no ztunnel rule admitting only the
// waypoint, which would deny the L7 client), and the L4 policy admits its
// source at ztunnel itself.
func TestAHeadlessServiceIsNotServedByItsWaypoint(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("testdata", "access", "ambient-waypoint"))
	for i := range in.Destinations {
		if in.Destinations[i].Spec.KubeService.Ref.Name == "reviews" {
			in.Destinations[i].Spec.KubeService.Headless = true
		}
	}
	out, r := translation.NewOutput(), translation.NewReport()
	policy.TranslateAccess(in, out, r)
	byName := map[string]*unstructured.Unstructured{}
	for _, o := range out.Objects() {
		byName[o.Object.GetName()] = o.Object
	}
	assert.NotContains(t, byName, "relaymesh-reviews.waypoint")
	require.Contains(t, byName, "relaymesh-reviews.ztunnel")
	rules, _, _ := unstructured.NestedSlice(byName["relaymesh-reviews.ztunnel"].Object, "spec", "rules")
	var principals []string
	for _, rule := range rules {
		froms, _, _ := unstructured.NestedSlice(rule.(map[string]any), "from")
		for _, f := range froms {
			ps, _, _ := unstructured.NestedStringSlice(f.(map[string]any), "source", "principals")
			principals = append(principals, ps...)
		}
	}
	assert.Equal(t, []string{"cluster-1.local/ns/shop/sa/ratings"}, principals, "reviews-l4's source, at ztunnel; not the waypoint")
	_, targets, _ := r.Status(translation.ObjectKey{Kind: "AccessPolicy", Namespace: "shop", Name: "reviews-get"})
	require.Len(t, targets, 1)
	assert.Equal(t, common.StateFailed, targets[0].State)
	msg := strings.Join(targets[0].Errors, " ")
	assert.Contains(t, msg, policy.NeedsWaypoint)
	assert.Contains(t, msg, "headless")
}
