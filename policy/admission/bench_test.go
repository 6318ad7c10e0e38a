package admission_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/stretchr/testify/require"
)

// BenchmarkDecide measures one decision and reports the p50 and p99 of the
// per-decision times:
//
//   - default, 100-user-rule-sets: a typical AccessPolicy (allowed) with the
//     default rules alone, and with 100 user rule sets that each judge every
//     kind (spec.fieldNNN must not be true);
//   - 100-fleet-rule-sets: one allowed object of each kind in turn
//     (TrafficPolicy, AccessPolicy, VirtualMesh, VirtualDestination) with the
//     100 rule sets of fleetRuleSets, which judge one kind, one namespace or
//     every kind;
//   - 100-every-object-rule-sets: the same objects with 100 rule sets that
//     judge every object with rules no index can leave out (the worst case:
//     every decision evaluates every package).
//
// The recorder is audit.Discard: the numbers are the engine's, not the
// audit log's disk.
func BenchmarkDecide(b *testing.B) {
	ctx := context.Background()
	users := make([]admission.RuleSet, 100)
	for i := range users {
		users[i] = ruleSet(fmt.Sprintf("relaymesh/rules-%03d", i), fmt.Sprintf("team_%03d", i), fmt.Sprintf("field%03d", i))
	}
	req := request("AccessPolicy", map[string]any{
		"sourceSelector":      []any{map[string]any{"kubeIdentityMatcher": map[string]any{"namespaces": []any{"team-a"}, "clusters": []any{"cluster-1"}}}},
		"destinationSelector": []any{map[string]any{"kubeServiceMatcher": map[string]any{"labels": map[string]any{"app": "reviews"}, "namespaces": []any{"team-a"}}}},
		"allowedMethods":      []any{"GET", "HEAD"},
		"allowedPorts":        []any{int64(9080)},
	})
	for _, bc := range []struct {
		name string
		sets []admission.RuleSet
		reqs []admission.Request
	}{
		{"default", nil, []admission.Request{req}},
		{"100-user-rule-sets", users, []admission.Request{req}},
		{"100-fleet-rule-sets", fleetRuleSets(100), fleetRequests()},
		{"100-every-object-rule-sets", everyObjectRuleSets(100), fleetRequests()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e, err := admission.New(admission.Config{Recorder: audit.Discard})
			require.NoError(b, err)
			for _, s := range e.Load(ctx, bc.sets) {
				require.Equal(b, admission.StateAccepted, s.State, "%s: %s", s.Name, s.Error)
			}
			took := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				r := bc.reqs[i%len(bc.reqs)]
				i++
				start := time.Now()
				d, err := e.Decide(ctx, r)
				took = append(took, time.Since(start))
				if err != nil || !d.Allowed {
					b.Fatalf("decision on %s: %+v, %v", r.Kind, d, err)
				}
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2])/1e3, "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100])/1e3, "p99-µs")
		})
	}
}

// BenchmarkLoad measures loading 100 user rule sets into a fresh engine:
// each is parsed, compiled and self-tested alone, then all are compiled
// together (what a server start or a first sync costs).
func BenchmarkLoad(b *testing.B) {
	ctx := context.Background()
	users := make([]admission.RuleSet, 100)
	for i := range users {
		users[i] = ruleSet(fmt.Sprintf("relaymesh/rules-%03d", i), fmt.Sprintf("team_%03d", i), fmt.Sprintf("field%03d", i))
	}
	for b.Loop() {
		e, err := admission.New(admission.Config{Recorder: audit.Discard})
		require.NoError(b, err)
		st := e.Load(ctx, users)
		require.Len(b, st, 101)
	}
}
