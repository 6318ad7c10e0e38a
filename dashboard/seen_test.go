package dashboard

import (
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// An idle agent whose session a live replica holds is seen as of that
// replica's last Lease renewal, however long ago its session's last event
// was; anything less than proof (disconnected, no replica named, the
// replica gone, Leases unknown) falls back to the last event.
func TestAnIdleHeldSessionIsSeenNow(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	event := metav1.NewTime(now.Add(-3 * time.Hour))
	renewed := now.Add(-4 * time.Second)
	live := map[string]time.Time{"server-a": renewed, "server-b": now.Add(-2 * time.Second)}
	held := multiclusterv1alpha1.KubernetesClusterStatus{Connected: true, Replica: "server-a", LastSeen: &event}

	for _, tt := range []struct {
		name     string
		st       multiclusterv1alpha1.KubernetesClusterStatus
		replicas map[string]time.Time
		at       time.Time
		heldBy   string
		says     string
	}{
		{"held by a live replica", held, live, renewed, "server-a", "now (replica server-a)"},
		{"held, replica gone", held, map[string]time.Time{"server-b": now}, event.Time, "", "3h 0m ago"},
		{"held, Leases unknown", held, nil, event.Time, "", "3h 0m ago"},
		{"disconnected", multiclusterv1alpha1.KubernetesClusterStatus{Replica: "server-a", LastSeen: &event}, live, event.Time, "", "3h 0m ago"},
		{"leader election off: no replica named", multiclusterv1alpha1.KubernetesClusterStatus{Connected: true, LastSeen: &event}, live, event.Time, "", "3h 0m ago"},
		{"never connected", multiclusterv1alpha1.KubernetesClusterStatus{}, live, time.Time{}, "", "never"},
		{"replica clock ahead", held, map[string]time.Time{"server-a": now.Add(time.Minute)}, now, "server-a", "now (replica server-a)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := LastSeen(tt.st, tt.replicas, now)
			assert.Equal(t, tt.at, s.At)
			assert.Equal(t, tt.heldBy, s.HeldBy)
			assert.Equal(t, tt.says, SeenAgo(s, now))
		})
	}
}

// A recorded event newer than the replica's renewal is kept (it is later
// proof).
func TestANewerEventWins(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	event := metav1.NewTime(now.Add(-time.Second))
	s := LastSeen(multiclusterv1alpha1.KubernetesClusterStatus{Connected: true, Replica: "a", LastSeen: &event}, map[string]time.Time{"a": now.Add(-5 * time.Second)}, now)
	assert.Equal(t, event.Time, s.At)
	assert.Equal(t, "a", s.HeldBy)
}

// The Fleet page shows a held idle session as seen now, and a lost one
// with its last event among the problems.
func TestFleetShowsHeldSessionsAsSeenNow(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	event := metav1.NewTime(now.Add(-2 * time.Hour))
	kc := func(name string, connected bool) multiclusterv1alpha1.KubernetesCluster {
		c := multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name}}
		c.Status.Connected, c.Status.Replica, c.Status.LastSeen = connected, "server-a", &event
		return c
	}
	rows := fleet(fleetInput{clusters: []multiclusterv1alpha1.KubernetesCluster{kc("idle", true), kc("gone", false)},
		agents: map[string]AgentState{"idle": {SnapshotAt: event.Time}}, replicas: map[string]time.Time{"server-a": now.Add(-3 * time.Second)}, now: now})
	byName := map[string]Cluster{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	assert.Equal(t, "now (replica server-a)", byName["idle"].LastSeenAgo)
	assert.Equal(t, "server-a", byName["idle"].HeldBy)
	assert.WithinDuration(t, now, byName["idle"].LastSeen, 5*time.Second)
	assert.Empty(t, byName["gone"].HeldBy)
	assert.Contains(t, byName["gone"].Problems, "agent not connected (last seen 2h 0m ago)")
}
