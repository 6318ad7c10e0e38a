// Package leader holds what is the management server's own in running
// several replicas: the name of the Lease its replicas elect a leader with
// (ServerLease) and that elector's metrics (Metrics), and every replica's
// heartbeat Lease (Heartbeat, Alive, Replicas, CollectGone), by which the
// leader tells which replicas are alive.
//
// The leader-election loop itself, shared with the agent, is
// internal/lease: its once-only work runs on one replica at a time, and a
// replica that cannot renew the Lease stops it before another can take
// the Lease over.
package leader

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/internal/lease"
)

// Server elector metric names (docs/metrics.md).
const (
	metricLeader = "relaymesh_server_leader"
	metricTerms  = "relaymesh_server_leader_terms_total"
)

// Metrics returns new metrics for the server's elector
// (lease.Config.Metrics).
func Metrics() lease.Metrics {
	return lease.Metrics{
		Leading: prometheus.NewGauge(prometheus.GaugeOpts{Name: metricLeader, Help: "1 while this replica holds the server's Lease and runs its once-only work."}),
		Terms:   prometheus.NewCounter(prometheus.CounterOpts{Name: metricTerms, Help: "Times this replica started leading."}),
	}
}
