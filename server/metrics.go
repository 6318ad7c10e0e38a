package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/relay"
)

// Metric names, listed in docs/metrics.md.
const (
	MetricIssued            = "relaymesh_ca_issued_certificates_total"
	MetricBootstrapFailures = "relaymesh_bootstrap_failures_total"
	MetricConnectedAgents   = "relaymesh_relay_connected_agents"
	MetricAgentCertExpiry   = "relaymesh_agent_certificate_expiry_timestamp_seconds"
	MetricRefusedCalls      = "relaymesh_relay_refused_calls_total"
	MetricPushClients       = "relay_push_clients_connected"
	MetricPullClients       = "relay_pull_clients_connected"
	MetricSnapshotBytes     = "relaymesh_snapshot_bytes"
	MetricSnapshotObjects   = "relaymesh_snapshot_objects"
	MetricSnapshotAccepted  = "relaymesh_snapshot_accepted_timestamp_seconds"
	MetricSnapshotsRefused  = "relaymesh_snapshots_refused_total"
	MetricSnapshotAssembly  = "relaymesh_snapshot_assembly_bytes"
	MetricApplyResults      = "relaymesh_apply_results_total"
	MetricConnsRefused      = "relaymesh_relay_connections_refused_total"
	MetricOpenConns         = "relaymesh_relay_open_connections"
	MetricSessions          = "relaymesh_relay_sessions"
)

// Metrics are the relay server's Prometheus metrics, on the server's own
// registry. Labels never carry a token, key or certificate.
type Metrics struct {
	issued            *prometheus.CounterVec
	bootstrapFailures *prometheus.CounterVec
	connected         prometheus.Gauge
	certExpiry        *prometheus.GaugeVec
	refused           *prometheus.CounterVec
	pushClients       prometheus.Gauge
	pullClients       prometheus.Gauge
	sessions          *prometheus.GaugeVec
	snapshotBytes     prometheus.Histogram
	snapshotObjects   *prometheus.GaugeVec
	snapshotAccepted  *prometheus.GaugeVec
	snapshotsRefused  *prometheus.CounterVec
	snapshotAssembly  prometheus.Gauge
	applyResults      *prometheus.CounterVec
	connsRefused      *prometheus.CounterVec
	openConns         *prometheus.GaugeVec
	// gate is connsRefused and openConns, for the relay's gate.
	gate *relay.GateMetrics
}

// NewMetrics registers the relay metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricIssued,
			Help: "Agent certificates the relay CA issued or refused, by operation (bootstrap, renew) and result (success, failure).",
		}, []string{"operation", "result"}),
		bootstrapFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricBootstrapFailures,
			Help: "Refused bootstrap attempts by reason (malformed, unknown, wrong_secret, wrong_cluster, expired, already_used, unregistered, bad_csr, rate_limited, ...).",
		}, []string{"reason"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricConnectedAgents,
			Help: "Agents holding an open relay session.",
		}),
		certExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricAgentCertExpiry,
			Help: "Expiry (Unix seconds) of the newest certificate issued to each cluster's agent.",
		}, []string{"cluster"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRefusedCalls,
			Help: "Authenticated-method calls refused, by reason (no_certificate, foreign_issuer, not_agent_id, unregistered, stale_registration, rate_limited).",
		}, []string{"reason"}),
		pushClients: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricPushClients, Help: "Open snapshot (Push) streams."}),
		pullClients: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricPullClients, Help: "Open output (Pull) streams."}),
		sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricSessions,
			Help: "Open agent sessions, by relay protocol (1: Connect, PushChunked and Pull, agents of earlier releases; 2: Session, one stream)."}, []string{"protocol"}),
		snapshotBytes:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricSnapshotBytes, Help: "Size of accepted snapshots in bytes.", Buckets: prometheus.ExponentialBuckets(1024, 4, 8)}),
		snapshotObjects:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricSnapshotObjects, Help: "Meshes, workloads and destinations in each cluster's last accepted snapshot."}, []string{"cluster"}),
		snapshotAccepted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricSnapshotAccepted, Help: "When each cluster's last snapshot was accepted (Unix seconds); its age is time() minus this."}, []string{"cluster"}),
		snapshotsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricSnapshotsRefused, Help: "Snapshots refused, by reason (invalid, rate_limited; of chunked pushes also framing, too_large, deadline, memory, cluster_busy)."}, []string{"reason"}),
		snapshotAssembly: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricSnapshotAssembly, Help: "Memory reserved for snapshots in transit (chunked pushes): their buffered parts, then their decoding."}),
		applyResults:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricApplyResults, Help: "Per-object results agents acked, by cluster and outcome (applied, unchanged, pruned, conflict, error)."}, []string{"cluster", "outcome"}),
		connsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricConnsRefused,
			Help: "Relay connections closed by a limit, by reason (connection_limit, address_connection_limit, preauth_limit, address_preauth_limit, abuse, handshake, preauth_stream_budget, authenticated_stream_budget)."}, []string{"reason"}),
		openConns: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricOpenConns, Help: "Open relay connections, by state (preauth: handshaking or without a client certificate; authenticated)."}, []string{"state"}),
	}
	for _, c := range []prometheus.Collector{m.issued, m.bootstrapFailures, m.connected, m.certExpiry, m.refused,
		m.pushClients, m.pullClients, m.sessions, m.snapshotBytes, m.snapshotObjects, m.snapshotAccepted, m.snapshotsRefused, m.snapshotAssembly, m.applyResults, m.connsRefused, m.openConns} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.gate = &relay.GateMetrics{ConnsRefused: m.connsRefused, OpenConns: m.openConns}
	// Known label values start at zero, so dashboards see them before the first event.
	for _, op := range []string{"bootstrap", "renew"} {
		for _, res := range []string{"success", "failure"} {
			m.issued.WithLabelValues(op, res)
		}
	}
	return m, nil
}
