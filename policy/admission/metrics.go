package admission

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, listed in docs/metrics.md. Labels never carry an object's
// name or a rule's message.
const (
	MetricRuleSets        = "relaymesh_admission_rulesets"
	MetricDecisions       = "relaymesh_admission_decisions_total"
	MetricDecisionSeconds = "relaymesh_admission_decision_seconds"
	MetricReloadFailures  = "relaymesh_admission_reload_failures_total"
)

// metricKinds are the kind label values; any other kind counts as "other".
var metricKinds = []string{"VirtualMesh", "TrafficPolicy", "AccessPolicy", "VirtualDestination", "other"}

type metrics struct {
	ruleSets       *prometheus.GaugeVec
	decisions      *prometheus.CounterVec
	seconds        prometheus.Histogram
	reloadFailures prometheus.Counter
}

// newMetrics creates the engine's metrics and registers them with reg, if
// not nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		ruleSets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricRuleSets,
			Help: "Admission rule sets (the default one included) by the state of their latest version (accepted, refused).",
		}, []string{"state"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricDecisions,
			Help: "Admission decisions by kind (VirtualMesh, TrafficPolicy, AccessPolicy, VirtualDestination, other) and result (allowed, denied, error).",
		}, []string{"kind", "result"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricDecisionSeconds,
			Help:    "Time to decide one admission request, audit record included.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16), // 25µs … ~0.8s
		}),
		reloadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricReloadFailures,
			Help: "Rule set versions refused (parse, compile, self-test, overlap or limit).",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.ruleSets, m.decisions, m.seconds, m.reloadFailures} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	for _, k := range metricKinds {
		for _, r := range []string{"allowed", "denied", "error"} {
			m.decisions.WithLabelValues(k, r)
		}
	}
	return m, nil
}

func (m *metrics) decided(kind, result string, took time.Duration) {
	known := "other"
	for _, k := range metricKinds {
		if k == kind {
			known = k
		}
	}
	m.decisions.WithLabelValues(known, result).Inc()
	m.seconds.Observe(took.Seconds())
}
