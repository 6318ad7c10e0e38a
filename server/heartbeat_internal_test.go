package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// heartbeatDue, case by case: at most one write per Heartbeat, once what
// matters settled for half a Heartbeat (or ten Heartbeats after the first
// unwritten event), in the cluster's slot of the next half Heartbeat; the
// same answer whenever it is asked before it is due.
func TestHeartbeatDue(t *testing.T) {
	const h = 30 * time.Second
	k := &KubeStatus{cfg: StatusConfig{Heartbeat: h}}
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	within := func(name string, got, from, to time.Time) {
		t.Helper()
		assert.False(t, got.Before(from), "%s: due %s, before %s", name, got, from)
		assert.True(t, got.Before(to), "%s: due %s, not before %s", name, got, to)
	}
	for _, c := range []string{"cluster-0001", "cluster-0002", "a", "z-very-long-cluster-name-of-sixty-three-characters-at-most-xyz"} {
		last := now.Add(-10 * time.Second)
		within(c+": written 10 s ago, an ack now", k.heartbeatDue(c, now, last, now, now), last.Add(h), last.Add(h*3/2))
		quiet := now.Add(-time.Hour)
		within(c+": quiet for an hour, an ack now", k.heartbeatDue(c, now, quiet, now, now), now.Add(h/2), now.Add(h))
		within(c+": acks for 4 min 50 s, the latest now", k.heartbeatDue(c, now, quiet, now.Add(-290*time.Second), now),
			now.Add(10*time.Second), now.Add(10*time.Second+h/2))
		within(c+": a lastSeen a year ahead", k.heartbeatDue(c, now, now.AddDate(1, 0, 0), now, now), now.Add(h), now.Add(h*3/2))
		within(c+": never written, nothing pending", k.heartbeatDue(c, now, time.Time{}, time.Time{}, time.Time{}), time.Time{}, now)

		due := k.heartbeatDue(c, now, quiet, now, now)
		for _, later := range []time.Duration{time.Second, h / 4, due.Sub(now) - time.Nanosecond} {
			assert.Equal(t, due, k.heartbeatDue(c, now.Add(later), quiet, now, now), "%s: asked again %s later", c, later)
		}
	}
	zero := &KubeStatus{}
	assert.Equal(t, now, zero.heartbeatDue("c", now, now, now, now), "no heartbeat: due when written")
}

// shareOf spreads names alike (cluster-0000 … cluster-0999) evenly over
// the period, and stays within it.
func TestShareOfIsEven(t *testing.T) {
	const d = 15 * time.Second
	quarters := make([]int, 4)
	for i := range 1000 {
		s := shareOf(fmt.Sprintf("cluster-%04d", i), d)
		if !assert.True(t, s >= 0 && s < d, "share %s", s) {
			return
		}
		quarters[s/(d/4)]++
	}
	for q, n := range quarters {
		assert.InDelta(t, 250, n, 60, "quarter %d of the period has %d of 1,000", q, n)
	}
	assert.Zero(t, shareOf("x", 0))
}

// settled clears what waited when the status shows every event the sync
// copied, and keeps later events pending from the copy on.
func TestSettled(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	copied := t0.Add(2 * time.Second)
	k := &KubeStatus{state: map[string]*agentState{"c": {lastSeen: t0.Add(time.Second), pendingSince: t0}}}
	k.settled("c", t0.Add(time.Second), copied)
	assert.True(t, k.state["c"].pendingSince.IsZero(), "nothing waits")

	k.state["c"] = &agentState{lastSeen: t0.Add(3 * time.Second), pendingSince: t0}
	k.settled("c", t0.Add(time.Second), copied)
	assert.Equal(t, copied, k.state["c"].pendingSince, "an event after the copy waits from the copy on")

	k.settled("gone", t0, copied) // a cluster forgotten meanwhile: nothing to do
}
