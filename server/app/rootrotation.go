package app

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/server/leader"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
)

// The relay root rotation's once-only task (relay-root-rotation): the
// Lease holder steps ca.StepRootRotation every
// --relay-issuer-check-interval, and at once when an operator's request
// (`relaymesh ca relay rotate start|rollback`) lands on the relay root
// Secret, with what it observed of the agents (their KubernetesClusters)
// and of the replicas (the revision each published on its Lease)
// (docs/design/2026-12-02-relay-root-rotation.md).

// Annotations every replica writes on its replica Lease at each heartbeat:
// the relay root rotation revision it loaded ("0" outside a rotation) and
// when it first saw it loaded, rounded up to the second. A replica
// without them (an older server) has loaded nothing: a rotation waits for
// it.
const (
	AnnotationRootLoadedRevision = "relaymesh.io/relay-root-revision"
	AnnotationRootLoadedAt       = "relaymesh.io/relay-root-loaded-at"
)

// Metrics of the relay root rotation.
const (
	// MetricRelayRootRotationPhase is 1 for the phase this replica loaded
	// (phase label), 0 for the others.
	MetricRelayRootRotationPhase = "relaymesh_relay_root_rotation_phase"
	// MetricRelayRootRotationPendingAgents counts the clusters the
	// rotation waits for, as of the Lease holder's last step.
	MetricRelayRootRotationPendingAgents = "relaymesh_relay_root_rotation_pending_agents"
	// MetricRelayRootRotationSteps counts the transitions this replica
	// wrote (as the Lease holder).
	MetricRelayRootRotationSteps = "relaymesh_relay_root_rotation_steps_total"
	// MetricRelayRootRotationErrors counts this replica's steps that
	// failed.
	MetricRelayRootRotationErrors = "relaymesh_relay_root_rotation_errors_total"
)

// rootRotation is this replica's part in a relay root rotation: the
// revision it loaded, published on its Lease, and the task's metrics.
type rootRotation struct {
	load    rootLoad
	pending prometheus.Gauge
	steps   prometheus.Counter
	errors  prometheus.Counter
}

// newRootRotation registers the rotation's metrics. loaded is the relay
// CA's LoadedRootRotation (nil: a CA the server does not rotate).
func newRootRotation(reg prometheus.Registerer, loaded func() (ca.RootRotationState, bool)) *rootRotation {
	if loaded == nil {
		loaded = func() (ca.RootRotationState, bool) { return ca.RootRotationState{}, false }
	}
	r := &rootRotation{load: rootLoad{loaded: loaded},
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricRelayRootRotationPendingAgents,
			Help: "Registered clusters the relay root rotation waits for (not acknowledged, cannot acknowledge, or still on the old root), as of the Lease holder's last step; 0 on other replicas."}),
		steps: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricRelayRootRotationSteps,
			Help: "Relay root rotation transitions this replica wrote as the Lease holder."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricRelayRootRotationErrors,
			Help: "Relay root rotation steps that failed on this replica (retried at the next check)."}),
	}
	reg.MustRegister(r.pending, r.steps, r.errors)
	for _, phase := range []ca.RootPhase{ca.RootIdle, ca.RootAddingNew, ca.RootSwitching, ca.RootRemovingOld} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricRelayRootRotationPhase,
			Help:        "1 for the relay root rotation phase this replica loaded (phase label), 0 for the others.",
			ConstLabels: prometheus.Labels{"phase": string(phase)}}, func() float64 {
			if loadedPhase(loaded) == phase {
				return 1
			}
			return 0
		}))
	}
	return r
}

func loadedPhase(loaded func() (ca.RootRotationState, bool)) ca.RootPhase {
	if st, ok := loaded(); ok {
		return st.Phase
	}
	return ca.RootIdle
}

// rootLoad remembers when this replica first saw the revision it loaded.
type rootLoad struct {
	loaded   func() (ca.RootRotationState, bool)
	mu       sync.Mutex
	revision int
	at       time.Time
}

// current is the revision loaded now and when it was first seen.
func (l *rootLoad) current(now time.Time) (int, time.Time) {
	rev := 0
	if st, ok := l.loaded(); ok {
		rev = st.Revision
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at.IsZero() || rev != l.revision {
		l.revision, l.at = rev, ceilSecond(now)
	}
	return l.revision, l.at
}

// annotations are what the replica Lease carries of it.
func (l *rootLoad) annotations() map[string]string {
	rev, at := l.current(time.Now())
	return map[string]string{AnnotationRootLoadedRevision: strconv.Itoa(rev), AnnotationRootLoadedAt: at.UTC().Format(time.RFC3339)}
}

func ceilSecond(t time.Time) time.Time {
	if s := t.Truncate(time.Second); !s.Equal(t) {
		return s.Add(time.Second)
	}
	return t
}

// lowestLoaded is the lowest relay root revision the live replicas
// loaded (-1 when one published none, or there is none) and the latest
// time one of them loaded its revision. It is pure.
func lowestLoaded(reps map[string]leader.Replica) (int, time.Time) {
	lowest, latest := math.MaxInt, time.Time{}
	for _, r := range reps {
		if !r.Alive {
			continue
		}
		rev, err := strconv.Atoi(r.Annotations[AnnotationRootLoadedRevision])
		at, atErr := time.Parse(time.RFC3339, r.Annotations[AnnotationRootLoadedAt])
		if err != nil || atErr != nil || rev < 0 {
			return -1, time.Time{}
		}
		lowest = min(lowest, rev)
		if at.After(latest) {
			latest = at
		}
	}
	if lowest == math.MaxInt {
		return -1, time.Time{}
	}
	return lowest, latest
}

// agentRootObservation is what the rotation knows of kc's agent: its
// session from the status, its answers to the bundle from the
// annotations trustBundles writes. In Switching, its certificate counts
// as under the new root only if it was issued (its NotAfter less the
// agent certificate lifetime) after switchedAt, when the last live replica
// loaded the switch; a connected agent without a recorded certificate
// counts as under the old root. It is pure.
func agentRootObservation(kc *multiclusterv1alpha1.KubernetesCluster, st ca.RootRotationState, switchedAt time.Time, agentTTL time.Duration) ca.AgentRootObservation {
	a := ca.AgentRootObservation{Cluster: kc.Name, Connected: kc.Status.Connected, Acked: kc.Annotations[AnnotationBundleAck],
		CanAcknowledge: !strings.HasSuffix(kc.Annotations[AnnotationBundleRefused], ": "+BundleCannotAck)}
	if st.Phase == ca.RootSwitching {
		a.OnRoot = st.Old
		if c := kc.Status.AgentCertificate; c != nil && !c.NotAfter.Add(-agentTTL).Before(switchedAt) {
			a.OnRoot = st.New
		}
	}
	return a
}

// observeRelayRoot is the ca.RootObserver of the task: every relay-mode
// registered cluster's agent and the lowest revision a live replica
// loaded.
func (p *process) observeRelayRoot(ctx context.Context, st ca.RootRotationState) ([]ca.AgentRootObservation, int, error) {
	loaded, switchedAt := p.reps.root.load.current(time.Now())
	if p.reps.several {
		reps, err := leader.Replicas(ctx, p.reps.leases, p.cfg.Namespace, time.Now())
		if err != nil {
			return nil, 0, fmt.Errorf("read the replica Leases: %w", err)
		}
		loaded, switchedAt = lowestLoaded(reps)
	}
	if st.Phase == ca.RootIdle {
		// Idle decides from the root's age and a request alone: no list of
		// every KubernetesCluster each check while nothing rotates.
		return nil, loaded, nil
	}
	list, err := p.kube.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(p.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("list KubernetesClusters: %w", err)
	}
	var agents []ca.AgentRootObservation
	for _, item := range list.Items {
		if _, relay := p.registry.Lookup(item.GetName()); !relay {
			continue
		}
		var kc multiclusterv1alpha1.KubernetesCluster
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &kc); err != nil {
			return nil, 0, fmt.Errorf("KubernetesCluster %s: %w", item.GetName(), err)
		}
		agents = append(agents, agentRootObservation(&kc, st, switchedAt, p.cfg.AgentCertTTL))
	}
	return agents, loaded, nil
}

// rotateRelayRoot is the once-only task relay-root-rotation. Only the
// generated relay CA has a root the server rotates.
func (p *process) rotateRelayRoot(ctx context.Context) {
	r, ok := p.signer.(*ca.RelayIssuers)
	if !ok {
		return
	}
	if p.cfg.CA.rootRotation(p.cfg.AgentCertTTL).Manual {
		p.log.Info("relay root rotation starts only on request: --relay-root-renew-at is 0; rotate before the relay root expires (relaymesh ca relay rotate start)")
	}
	kick := make(chan struct{}, 1)
	go p.watchRootRequests(ctx, kick)
	defer p.reps.root.pending.Set(0)
	var last *rootStepLog
	for {
		last = p.stepRelayRoot(ctx, r, last)
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-time.After(p.cfg.CA.IssuerCheck):
		}
	}
}

// rootStepLog is what the last step logged, so that a step logs only what
// changed.
type rootStepLog struct {
	state     ca.RootRotationState
	waiting   string
	postponed string
}

// stepRelayRoot runs one step and logs what changed since last (nil: the
// term's first step). It never logs key material: phases, revisions,
// root fingerprints and clusters only.
func (p *process) stepRelayRoot(ctx context.Context, r *ca.RelayIssuers, last *rootStepLog) *rootStepLog {
	rr := p.reps.root
	d, err := ca.StepRootRotation(ctx, p.kube.Typed, p.cfg.Namespace, ca.RootStepConfig{
		CA:            ca.GenerateConfig{IssuerTTL: p.cfg.CA.IssuerTTL},
		Rotation:      p.cfg.CA.rootRotation(p.cfg.AgentCertTTL),
		IssuerRenewAt: p.cfg.CA.IssuerRenewAt,
	}, p.observeRelayRoot)
	if err != nil {
		if ctx.Err() == nil {
			rr.errors.Inc()
			p.log.Error("relay root rotation step failed; retrying", "error", err, "retry_in", p.cfg.CA.IssuerCheck)
		}
		return last
	}
	rr.pending.Set(float64(len(d.Blocking)))
	if d.Refused != "" {
		p.log.Warn("refused a relay root rotation request", "reason", d.Refused, "phase", d.State.Phase)
	}
	st := d.State
	moved := last != nil && !sameRootState(last.state, st)
	renewed := slices.Contains(d.Actions, ca.RootActRenewStagedIssuer)
	if renewed {
		p.log.Info("renewed the issuing CA of the new relay root; the replaced one stays accepted while it may have issued", rootAttrs(st)...)
	}
	if moved || renewed {
		// This replica loads what it wrote at once; the others within
		// --relay-issuer-check-interval.
		p.reloadRelayIssuer(ctx, r)
	}
	if d.Postponed != "" && (last == nil || last.postponed != d.Postponed) {
		p.log.Warn("relay root rotation: "+d.Postponed, rootAttrs(st)...)
	}
	switch {
	case last == nil && st.Phase != ca.RootIdle:
		p.log.Info("relay root rotation in progress", rootAttrs(st)...)
	case moved:
		rr.steps.Inc()
		p.log.Info("relay root rotation moved to phase "+string(st.Phase), append(rootAttrs(st), "from", last.state.Phase)...)
	}
	if d.Waiting != "" && (last == nil || last.waiting != d.Waiting || moved) {
		p.log.Info("relay root rotation waiting: "+d.Waiting, "phase", st.Phase, "revision", st.Revision, "blocking", d.Blocking)
	}
	return &rootStepLog{state: st, waiting: d.Waiting, postponed: d.Postponed}
}

// sameRootState compares states as written: Since is stored to the
// second, so the state a step decided and the same state read back differ
// in it.
func sameRootState(a, b ca.RootRotationState) bool {
	a.Since, b.Since = time.Time{}, time.Time{}
	return a == b
}

func rootAttrs(st ca.RootRotationState) []any {
	return []any{"phase", st.Phase, "revision", st.Revision, "old_root", st.Old, "new_root", st.New, "rolled_back", st.RolledBack}
}

// watchRootRequests kicks when the relay root Secret carries an
// operator's request, so the task acts on it at once rather than at the
// next check; a watch that ends is made again a second later.
func (p *process) watchRootRequests(ctx context.Context, kick chan<- struct{}) {
	secrets := p.kube.Typed.CoreV1().Secrets(p.cfg.Namespace)
	sel := fields.OneTermEqualSelector("metadata.name", ca.RootSecretName).String()
	for ctx.Err() == nil {
		w, err := secrets.Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil {
			for ev := range w.ResultChan() {
				if m, err := meta.Accessor(ev.Object); err == nil && m.GetAnnotations()[ca.AnnotationRootRequest] != "" {
					select {
					case kick <- struct{}{}:
					default:
					}
				}
			}
			w.Stop()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
