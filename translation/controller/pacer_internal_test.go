package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// While changes keep coming, a translation that takes longer than the
// debounce is followed by a pause as long as itself: translation uses at
// most half of the time, however large the fleet. A change after a quiet
// spell waits only gather, and a status refresh does not lengthen the
// pause.
func TestTranslationsTakeAtMostHalfTheTimeUnderChange(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var p pacer
	assert.Equal(t, gather, p.wait(t0), "the first change waits only gather")

	p.translated(t0, t0.Add(10*time.Millisecond))
	assert.Equal(t, debounce-10*time.Millisecond, p.wait(t0.Add(20*time.Millisecond)), "a quick translation: the debounce")
	assert.Equal(t, gather, p.wait(t0.Add(time.Second)), "after a quiet spell: gather")

	// A slow translation (a storm at 10,000 clusters): the next waits as
	// long as it took, counted from its end.
	p.translated(t0, t0.Add(3*time.Second))
	assert.Equal(t, 3*time.Second, p.wait(t0.Add(3*time.Second)))
	assert.Equal(t, time.Second, p.wait(t0.Add(5*time.Second)))
	assert.Equal(t, gather, p.wait(t0.Add(6*time.Second)), "a change after the pause: gather")

	// Back to back over a minute of changes: busy half the time (and
	// the first translation's, which followed a quiet spell).
	const took = 2 * time.Second
	var busy time.Duration
	start := t0.Add(time.Hour)
	now := start
	p = pacer{}
	for now.Before(start.Add(time.Minute)) {
		now = now.Add(p.wait(now))
		p.translated(now, now.Add(took))
		busy += took
		now = now.Add(took)
	}
	assert.LessOrEqual(t, busy, now.Sub(start)/2+took, "busy %v of %v", busy, now.Sub(start))
	assert.GreaterOrEqual(t, busy, now.Sub(start)/2-took, "the pause is no longer than the translation: busy %v of %v", busy, now.Sub(start))

	// A status refresh moves the pause's start, not its length.
	p.refreshed(now.Add(time.Second))
	assert.Equal(t, 2*time.Second, p.wait(now.Add(time.Second)))
}
