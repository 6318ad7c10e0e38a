package apply_test

import (
	"context"
	"fmt"
	"testing"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
)

// BenchmarkApplyUnchanged measures the steady state: a 100-object set
// (VirtualServices, DestinationRules and ServiceEntries in two namespaces)
// re-applied to a real kube-apiserver where every object is already as the
// set says. Each op lists the owned objects of the six allowed kinds and
// sends one no-op server-side apply per object.
func BenchmarkApplyUnchanged(b *testing.B) {
	const objects = 100
	f := newFixture(b)
	a := f.applier(b, nil)
	var objs []*relaypb.OutputObject
	for i := range objects {
		ns := []string{"app-a", "app-b"}[i%2]
		name := fmt.Sprintf("svc-%03d", i)
		host := name + "." + ns + ".svc.cluster.local"
		var obj map[string]any
		switch i % 3 {
		case 0:
			obj = virtualService(ns, name, host)
		case 1:
			obj = destinationRule(ns, name, host)
		default:
			obj = serviceEntry(ns, name, host)
		}
		objs = append(objs, output(b, obj, "TrafficPolicy/"+ns+"/"+name))
	}
	set := &relaypb.OutputSet{Version: 1, Objects: objs}
	check := func(want string) {
		results, err := a.Apply(context.Background(), set)
		if err != nil {
			b.Fatal(err)
		}
		if len(results) != objects {
			b.Fatalf("%d results, want %d", len(results), objects)
		}
		for _, r := range results {
			if r.GetOutcome() != want {
				b.Fatalf("%s %s/%s: %s %s, want %s", r.GetKind(), r.GetNamespace(), r.GetName(), r.GetOutcome(), r.GetError(), want)
			}
		}
	}
	check("applied")
	check("unchanged") // warm: discovery, connections
	for b.Loop() {
		check("unchanged")
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*objects), "µs/object")
}
