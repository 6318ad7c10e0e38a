package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFailureLimiter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := NewFailureLimiter(6, 3, 2, func() time.Time { return now })

	// Successes are refunded: any number of them costs nothing.
	for range 100 {
		done, ok := l.Begin("10.0.0.1")
		require.True(t, ok)
		done(true)
	}
	// Failures use up the burst.
	for range 3 {
		done, ok := l.Begin("10.0.0.1")
		require.True(t, ok)
		done(false)
	}
	_, ok := l.Begin("10.0.0.1")
	assert.False(t, ok, "blocked after the burst")
	// Concurrent attempts reserve before they finish.
	done, ok := l.Begin("10.0.0.2")
	require.True(t, ok)
	_, ok2 := l.Begin("10.0.0.2")
	_, ok3 := l.Begin("10.0.0.2")
	_, ok4 := l.Begin("10.0.0.2")
	assert.Equal(t, []bool{true, true, false}, []bool{ok2, ok3, ok4})
	done(true)
	done(true) // idempotent
	// Refill: 6/min is one every 10s.
	now = now.Add(10 * time.Second)
	_, ok = l.Begin("10.0.0.1")
	assert.True(t, ok)
	// IPv6 peers share their /64.
	assert.Equal(t, PeerKey("2001:db8::1"), PeerKey("2001:db8::ffff:1"))
	assert.NotEqual(t, PeerKey("2001:db8::1"), PeerKey("2001:db8:0:1::1"))
	// The table is bounded; the oldest peer is forgotten.
	now = now.Add(time.Second)
	_, _ = l.Begin("10.0.0.3")
	assert.LessOrEqual(t, len(l.peers), 2)
}

// A flood of new addresses does not reset a throttled address: the table
// forgets peers whose budget refilled, then the least throttled, never one
// with no failure left; when every peer is throttled a new one is refused.
func TestFailureLimiterEvictionKeepsThrottledPeers(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := NewFailureLimiter(6, 5, 10000, func() time.Time { return now })
	fail := func(peer string) bool {
		done, ok := l.Begin(peer)
		if ok {
			done(false)
		}
		return ok
	}
	for fail("203.0.113.7") {
	}
	// 10,500 other addresses, each failing once.
	for i := range 10500 {
		fail(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
	}
	assert.LessOrEqual(t, len(l.peers), 10000)
	_, ok := l.Begin("203.0.113.7")
	assert.False(t, ok, "the throttled address is still throttled after 10,500 others")

	// Every entry throttled: a newcomer is refused, nobody is forgotten.
	full := NewFailureLimiter(6, 1, 3, func() time.Time { return now })
	for _, p := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		done, ok := full.Begin(p)
		require.True(t, ok)
		done(false)
	}
	_, ok = full.Begin("10.0.0.4")
	assert.False(t, ok)
	assert.Len(t, full.peers, 3)
	// Refilled peers make room again.
	now = now.Add(time.Minute)
	done, ok := full.Begin("10.0.0.4")
	require.True(t, ok)
	done(true)
}

// The budget of all peers charges failures only: a storm of legitimate
// bootstraps in flight at once is not refused for being many, while
// failures still use it up.
func TestGlobalFailureLimiterChargesFailuresOnly(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := NewGlobalFailureLimiter(1.0/60, 3, func() time.Time { return now })
	var inFlight []func(bool)
	for range 1000 {
		done, ok := l.Begin("*")
		require.True(t, ok, "attempts in flight cost nothing")
		inFlight = append(inFlight, done)
	}
	for _, done := range inFlight[:997] {
		done(true)
	}
	for _, done := range inFlight[997:] {
		done(false)
		done(false) // once only
	}
	_, ok := l.Begin("*")
	assert.False(t, ok, "three failures spent the budget of three")
	now = now.Add(time.Hour)
	done, ok := l.Begin("*")
	require.True(t, ok, "it refills")
	done(false)
	_, ok = l.Begin("*")
	assert.False(t, ok, "a failure costs one, never less than zero")
	now = now.Add(time.Hour) // one an hour
	_, ok = l.Begin("*")
	assert.True(t, ok)
}
