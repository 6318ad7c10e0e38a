package controller_test

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/relaymesh/relaymesh/translation/worldtest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func benchTranslate(b *testing.B, in *translation.Input) {
	var objects int
	for b.Loop() {
		out, _ := all.Translate(in, "relaymesh")
		objects = len(out.Objects())
	}
	b.ReportMetric(float64(objects), "outputs")
}

// BenchmarkTranslate is a full translation of 100 clusters, 1,000 services
// and 1,000 policies: without federation, and with one VirtualMesh that
// federates every service to every other mesh (99,000 ServiceEntries and as
// many DestinationRules).
func BenchmarkTranslate(b *testing.B) {
	b.Run("policies", func(b *testing.B) { benchTranslate(b, worldtest.New(b, worldtest.Translation(100, 1000, 1000, false))) })
	b.Run("policies+federation", func(b *testing.B) { benchTranslate(b, worldtest.New(b, worldtest.Translation(100, 1000, 1000, true))) })
}

// BenchmarkTranslateOneEdit measures incremental translation in the
// 100 × 1,000 × 1,000 world, with and without federation, against a full
// translation of the same world in the same run:
//
//   - policy: one TrafficPolicy's matcher changes (generation bumped, as the
//     apiserver does);
//   - destination: one Destination gets another port, as when one cluster's
//     snapshot changes one Service (federated: re-exported to 99 meshes);
//   - full: the engine from scratch (what start-up costs).
func BenchmarkTranslateOneEdit(b *testing.B) {
	for _, federate := range []bool{false, true} {
		name := "policies"
		if federate {
			name = "policies+federation"
		}
		b.Run(name+"/policy", func(b *testing.B) {
			in := worldtest.WithUIDs(worldtest.New(b, worldtest.Translation(100, 1000, 1000, federate)))
			e := controller.NewEngine("relaymesh")
			e.Translate(in)
			p := &in.TrafficPolicies[0]
			for b.Loop() {
				p.Spec.HTTPRequestMatchers[0].URI.Prefix = new(fmt.Sprintf("/edit%d", p.Generation))
				p.Generation++
				e.Translate(in)
				e.Dirty()
			}
			b.ReportMetric(float64(e.Stats().Recomputed), "units-recomputed")
		})
		b.Run(name+"/destination", func(b *testing.B) {
			in := worldtest.WithUIDs(worldtest.New(b, worldtest.Translation(100, 1000, 1000, federate)))
			e := controller.NewEngine("relaymesh")
			e.Translate(in)
			d := &in.Destinations[0]
			base := d.Spec.KubeService.Ports
			for b.Loop() {
				d.Spec.KubeService.Ports = append(slices.Clone(base), discoveryv1alpha1.ServicePort{Port: int32(9000 + d.Generation%100), Name: "grpc"})
				d.Generation++
				e.Translate(in)
				e.Dirty()
			}
			b.ReportMetric(float64(e.Stats().Recomputed), "units-recomputed")
		})
		b.Run(name+"/full", func(b *testing.B) {
			in := worldtest.WithUIDs(worldtest.New(b, worldtest.Translation(100, 1000, 1000, federate)))
			var e *controller.Engine
			for b.Loop() {
				e = controller.NewEngine("relaymesh")
				e.Translate(in)
			}
			// What the engine keeps between translations: every unit's
			// objects, encoded for the wire, and the indexes.
			b.StopTimer()
			var before, after runtime.MemStats
			e = nil
			runtime.GC()
			runtime.ReadMemStats(&before)
			e = controller.NewEngine("relaymesh")
			e.Translate(in)
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-min(before.HeapAlloc, after.HeapAlloc))/(1<<20), "MB-retained")
			runtime.KeepAlive(e)
		})
	}
}

// fleetWithTimeouts is the fleet edit's world: clusters with one Service
// each, no VirtualMesh, one TrafficPolicy without selectors setting a 5 s
// request timeout, UIDs and generations as from an apiserver.
func fleetWithTimeouts(b *testing.B, clusters int) *translation.Input {
	in := worldtest.New(b, worldtest.Translation(clusters, clusters, 0, false))
	in.TrafficPolicies = []networkingv1alpha1.TrafficPolicy{{
		ObjectMeta: metav1.ObjectMeta{Name: "timeouts", Namespace: "relaymesh", CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
		Spec:       networkingv1alpha1.TrafficPolicySpec{Policy: networkingv1alpha1.Policy{RequestTimeout: &metav1.Duration{Duration: 5 * time.Second}}},
	}}
	return worldtest.WithUIDs(in)
}

// BenchmarkTranslateFleetEdit is issue 21's edit: a fleet of clusters with
// one Service each, no VirtualMesh, and one TrafficPolicy without selectors
// (every Destination, from every cluster's workloads) whose request timeout
// changes (5 s ↔ 7 s). It reports the objects the policy produces and the
// clusters republished per edit.
func BenchmarkTranslateFleetEdit(b *testing.B) {
	for _, clusters := range []int{100, 1000} {
		b.Run(fmt.Sprintf("clusters=%d", clusters), func(b *testing.B) {
			in := fleetWithTimeouts(b, clusters)
			e := controller.NewEngine("relaymesh")
			e.Translate(in)
			e.Dirty()
			p := &in.TrafficPolicies[0]
			dirty := 0
			for b.Loop() {
				p.Spec.Policy.RequestTimeout.Duration = 12*time.Second - p.Spec.Policy.RequestTimeout.Duration
				p.Generation++
				e.Translate(in)
				dirty = len(e.Dirty())
			}
			b.ReportMetric(float64(len(e.Objects())), "outputs")
			b.ReportMetric(float64(dirty), "clusters-republished")
		})
	}
}

// BenchmarkTranslateUnchanged is a translation that finds nothing changed,
// at 1,000 and 10,000 clusters of one Service each and the fleet edit's
// TrafficPolicy: what every cycle of a bootstrap storm pays, besides its
// few new clusters, for reading the whole fleet (issue 31).
func BenchmarkTranslateUnchanged(b *testing.B) {
	for _, clusters := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("clusters=%d", clusters), func(b *testing.B) {
			in := fleetWithTimeouts(b, clusters)
			e := controller.NewEngine("relaymesh")
			e.Translate(in)
			if n := len(e.Dirty()); n != clusters {
				b.Fatalf("the first translation published %d clusters, want %d", n, clusters)
			}
			for b.Loop() {
				e.Translate(in)
			}
			if s, dirty := e.Stats(), e.Dirty(); s.Recomputed != 0 || len(dirty) != 0 {
				b.Fatalf("nothing changed, yet %d units were recomputed and %d clusters republished", s.Recomputed, len(dirty))
			}
		})
	}
}
