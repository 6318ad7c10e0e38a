package app

import (
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The lowest revision counts only live replicas, and a live replica that
// published no revision (an older server), or one that does not parse,
// has loaded nothing: the rotation waits for it.
func TestLowestLoadedRevisionWaitsForEveryLiveReplica(t *testing.T) {
	at := func(s string) time.Time { v, _ := time.Parse(time.RFC3339, s); return v }
	rep := func(alive bool, rev, loadedAt string) leader.Replica {
		ann := map[string]string{}
		if rev != "" {
			ann[AnnotationRootLoadedRevision] = rev
		}
		if loadedAt != "" {
			ann[AnnotationRootLoadedAt] = loadedAt
		}
		return leader.Replica{Alive: alive, Annotations: ann}
	}
	for _, tc := range []struct {
		name   string
		reps   map[string]leader.Replica
		want   int
		wantAt time.Time
	}{
		{"none", nil, -1, time.Time{}},
		{"only dead ones", map[string]leader.Replica{"a": rep(false, "3", "2026-12-02T10:00:00Z")}, -1, time.Time{}},
		{"one", map[string]leader.Replica{"a": rep(true, "3", "2026-12-02T10:00:00Z")}, 3, at("2026-12-02T10:00:00Z")},
		{"the lowest, and the latest load", map[string]leader.Replica{
			"a": rep(true, "3", "2026-12-02T10:00:05Z"), "b": rep(true, "2", "2026-12-02T09:00:00Z"), "c": rep(false, "1", "2026-12-02T08:00:00Z")},
			2, at("2026-12-02T10:00:05Z")},
		{"a live one without a revision", map[string]leader.Replica{"a": rep(true, "3", "2026-12-02T10:00:00Z"), "b": rep(true, "", "")}, -1, time.Time{}},
		{"a revision that does not parse", map[string]leader.Replica{"a": rep(true, "3x", "2026-12-02T10:00:00Z")}, -1, time.Time{}},
		{"a negative revision", map[string]leader.Replica{"a": rep(true, "-2", "2026-12-02T10:00:00Z")}, -1, time.Time{}},
		{"a time that does not parse", map[string]leader.Replica{"a": rep(true, "3", "yesterday")}, -1, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rev, loadedAt := lowestLoaded(tc.reps)
			assert.Equal(t, tc.want, rev)
			assert.True(t, tc.wantAt.Equal(loadedAt), "loaded at %s, want %s", loadedAt, tc.wantAt)
		})
	}
}

// What the rotation knows of an agent comes from its KubernetesCluster:
// the session from the status, the answers from the annotations, and in
// Switching its certificate counts as under the new root only when it was
// issued after the last replica loaded the switch.
func TestAgentRootObservationFromTheKubernetesCluster(t *testing.T) {
	switchedAt := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	ttl := time.Hour
	switching := ca.RootRotationState{Phase: ca.RootSwitching, Old: "old", New: "new", Revision: 2}
	adding := ca.RootRotationState{Phase: ca.RootAddingNew, Old: "old", New: "new", Revision: 1}
	kc := func(connected bool, ann map[string]string, issued *time.Time) *multiclusterv1alpha1.KubernetesCluster {
		c := &multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: "c1", Annotations: ann}}
		c.Status.Connected = connected
		if issued != nil {
			c.Status.AgentCertificate = &multiclusterv1alpha1.AgentCertificate{NotAfter: metav1.NewTime(issued.Add(ttl))}
		}
		return c
	}
	before, after := switchedAt.Add(-time.Second), switchedAt
	for _, tc := range []struct {
		name string
		kc   *multiclusterv1alpha1.KubernetesCluster
		st   ca.RootRotationState
		want ca.AgentRootObservation
	}{
		{"acknowledged", kc(true, map[string]string{AnnotationBundleAck: "fp"}, nil), adding,
			ca.AgentRootObservation{Cluster: "c1", Connected: true, CanAcknowledge: true, Acked: "fp"}},
		{"offline", kc(false, nil, nil), adding, ca.AgentRootObservation{Cluster: "c1", CanAcknowledge: true}},
		{"refused for a reason: can acknowledge", kc(true, map[string]string{AnnotationBundleRefused: "fp: too big"}, nil), adding,
			ca.AgentRootObservation{Cluster: "c1", Connected: true, CanAcknowledge: true}},
		{"an older agent", kc(true, map[string]string{AnnotationBundleRefused: "fp: " + BundleCannotAck, AnnotationBundleAck: "older"}, nil), adding,
			ca.AgentRootObservation{Cluster: "c1", Connected: true, Acked: "older"}},
		{"switching: issued after the switch", kc(true, nil, &after), switching,
			ca.AgentRootObservation{Cluster: "c1", Connected: true, CanAcknowledge: true, OnRoot: "new"}},
		{"switching: issued before the switch", kc(true, nil, &before), switching,
			ca.AgentRootObservation{Cluster: "c1", Connected: true, CanAcknowledge: true, OnRoot: "old"}},
		{"switching: no certificate recorded counts as the old root", kc(true, nil, nil), switching,
			ca.AgentRootObservation{Cluster: "c1", Connected: true, CanAcknowledge: true, OnRoot: "old"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, agentRootObservation(tc.kc, tc.st, switchedAt, ttl))
		})
	}
}

// A replica publishes the revision it loaded and when it first saw it,
// rounded up: the same revision keeps its time, a new one gets a new time.
func TestRootLoadPublishesWhenARevisionWasFirstLoaded(t *testing.T) {
	var st *ca.RootRotationState
	l := rootLoad{loaded: func() (ca.RootRotationState, bool) {
		if st == nil {
			return ca.RootRotationState{}, false
		}
		return *st, true
	}}
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 300, time.UTC)
	rev, at := l.current(t0)
	assert.Equal(t, 0, rev)
	assert.Equal(t, t0.Truncate(time.Second).Add(time.Second), at, "rounded up")
	_, again := l.current(t0.Add(time.Minute))
	assert.Equal(t, at, again, "the same revision keeps its time")
	st = &ca.RootRotationState{Phase: ca.RootAddingNew, Old: "o", New: "n", Revision: 4}
	rev, at = l.current(t0.Add(2 * time.Minute))
	assert.Equal(t, 4, rev)
	assert.Equal(t, t0.Truncate(time.Second).Add(2*time.Minute+time.Second), at)
	ann := l.annotations()
	assert.Equal(t, "4", ann[AnnotationRootLoadedRevision])
	assert.Equal(t, at.Format(time.RFC3339), ann[AnnotationRootLoadedAt])
}

// The task is in the once-only table, on every process.
func TestRelayRootRotationIsOnceOnlyWork(t *testing.T) {
	for _, s := range []setup{{}, {several: true}} {
		var names []string
		for _, task := range tasksFor(s) {
			names = append(names, task.name)
		}
		assert.Contains(t, names, "relay-root-rotation")
	}
}

// A state read back from the Secret (Since to the second) is the state
// the step decided: no second "moved" log, no second count.
func TestSameRootStateIgnoresSincesPrecision(t *testing.T) {
	st := ca.RootRotationState{Phase: ca.RootAddingNew, Old: "o", New: "n", Revision: 1, Since: time.Date(2026, 12, 2, 10, 0, 0, 123, time.UTC)}
	back := st
	back.Since = st.Since.Truncate(time.Second)
	assert.True(t, sameRootState(st, back))
	moved := back
	moved.Phase, moved.Revision = ca.RootSwitching, 2
	assert.False(t, sameRootState(st, moved))
	swapped := back
	swapped.Old, swapped.New, swapped.RolledBack = "n", "o", true
	assert.False(t, sameRootState(st, swapped))
}
