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

// BenchmarkDecide measures one decision on a typical AccessPolicy (allowed)
// with the default rules alone and with 100 user rule sets, and reports the
// p50 and p99 of the per-decision times. The recorder is audit.Discard: the
// numbers are the engine's, not the audit log's disk.
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
	}{{"default", nil}, {"100-user-rule-sets", users}} {
		b.Run(bc.name, func(b *testing.B) {
			e, err := admission.New(admission.Config{Recorder: audit.Discard})
			require.NoError(b, err)
			for _, s := range e.Load(ctx, bc.sets) {
				require.Equal(b, admission.StateAccepted, s.State, "%s: %s", s.Name, s.Error)
			}
			took := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				d, err := e.Decide(ctx, req)
				took = append(took, time.Since(start))
				if err != nil || !d.Allowed {
					b.Fatalf("decision: %+v, %v", d, err)
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
