package trust

import (
	"github.com/prometheus/client_golang/prometheus"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
)

// Metric names (docs/metrics.md).
const (
	metricRootExpiry = "relaymesh_trust_root_expiry_timestamp_seconds"
	metricPhase      = "relaymesh_trust_rotation_phase"
	metricHeld       = "relaymesh_trust_held"
	metricInterExp   = "relaymesh_trust_intermediate_expiry_timestamp_seconds"
)

// metrics are the shared-trust gauges, per VirtualMesh (namespace/name).
type metrics struct {
	rootExpiry *prometheus.GaugeVec
	phase      *prometheus.GaugeVec
	held       *prometheus.GaugeVec
	interExp   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		rootExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricRootExpiry,
			Help: "Expiry of the root in force of each VirtualMesh with shared trust."}, []string{"virtual_mesh"}),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricPhase,
			Help: "1 for the root rotation phase each VirtualMesh is in (NotRotating when none ran)."}, []string{"virtual_mesh", "phase"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricHeld,
			Help: "1 while a VirtualMesh's meshes keep their CAs as they are because its root cannot be used."}, []string{"virtual_mesh"}),
		interExp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricInterExp,
			Help: "Expiry of the intermediate last issued to each mesh of a VirtualMesh with shared trust."}, []string{"virtual_mesh", "mesh"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.rootExpiry, m.phase, m.held, m.interExp} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// observe sets the gauges from the plans of one reconcile; VirtualMeshes no
// longer planned disappear.
func (m *metrics) observe(plans []*vmPlan, states map[string]*vmState, issued map[string][]networkingv1alpha1.MeshCAStatus) {
	m.rootExpiry.Reset()
	m.phase.Reset()
	m.held.Reset()
	m.interExp.Reset()
	for _, p := range plans {
		st := states[p.key]
		if st == nil {
			continue
		}
		if !st.notAfter.IsZero() {
			m.rootExpiry.WithLabelValues(p.key).Set(float64(st.notAfter.Unix()))
		}
		phase := networkingv1alpha1.PhaseNotRotating
		if st.rotation != nil {
			phase = st.rotation.Phase
		}
		m.phase.WithLabelValues(p.key, string(phase)).Set(1)
		held := 0.0
		if p.hold {
			held = 1
		}
		m.held.WithLabelValues(p.key).Set(held)
		for _, mesh := range issued[p.key] {
			m.interExp.WithLabelValues(p.key, mesh.Mesh).Set(float64(mesh.NotAfter.Unix()))
		}
	}
}
