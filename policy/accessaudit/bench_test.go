package accessaudit_test

import (
	"testing"

	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/translation/worldtest"
)

// BenchmarkAudit audits 10 clusters, 1,000 services (2,000 workloads) and
// 1,000 AccessPolicies (worldtest.Access): translation, matrix and
// findings.
func BenchmarkAudit(b *testing.B) {
	in := worldtest.New(b, worldtest.Access(10, 1000, 1000))
	cfg := auditConfig(b, admin)
	var pairs, findings int
	for b.Loop() {
		r, err := accessaudit.Audit(b.Context(), in, cfg)
		if err != nil {
			b.Fatal(err)
		}
		pairs, findings = len(r.Matrix.Pairs), len(r.Findings)
	}
	b.ReportMetric(float64(pairs), "pairs")
	b.ReportMetric(float64(findings), "findings")
}
