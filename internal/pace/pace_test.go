package pace_test

import (
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/pace"
	"github.com/stretchr/testify/assert"
)

// While changes keep coming, a run that takes longer than the debounce is
// followed by a pause as long as itself: the loop is busy at most half the
// time, however large its input. A change after a quiet spell waits only
// Gather, and a light refresh does not lengthen the pause.
func TestALongRunEarnsAPauseAsLongAsItself(t *testing.T) {
	const gather, debounce = 20 * time.Millisecond, 100 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	p := pace.Pacer{Gather: gather, Debounce: debounce}
	assert.Equal(t, gather, p.Wait(t0), "the first change waits only Gather")

	p.Ran(t0, t0.Add(10*time.Millisecond))
	assert.Equal(t, debounce-10*time.Millisecond, p.Wait(t0.Add(20*time.Millisecond)), "a quick run: the debounce")
	assert.Equal(t, gather, p.Wait(t0.Add(time.Second)), "after a quiet spell: Gather")

	// A slow run (a storm at 10,000 clusters): the next waits as long as
	// it took, counted from its end.
	p.Ran(t0, t0.Add(3*time.Second))
	assert.Equal(t, 3*time.Second, p.Wait(t0.Add(3*time.Second)))
	assert.Equal(t, time.Second, p.Wait(t0.Add(5*time.Second)))
	assert.Equal(t, gather, p.Wait(t0.Add(6*time.Second)), "a change after the pause: Gather")

	// Back to back over a minute of changes: busy half the time (and the
	// first run's, which followed a quiet spell).
	const took = 2 * time.Second
	var busy time.Duration
	start := t0.Add(time.Hour)
	now := start
	p = pace.Pacer{Gather: gather, Debounce: debounce}
	for now.Before(start.Add(time.Minute)) {
		now = now.Add(p.Wait(now))
		p.Ran(now, now.Add(took))
		busy += took
		now = now.Add(took)
	}
	assert.LessOrEqual(t, busy, now.Sub(start)/2+took, "busy %v of %v", busy, now.Sub(start))
	assert.GreaterOrEqual(t, busy, now.Sub(start)/2-took, "the pause is no longer than the run: busy %v of %v", busy, now.Sub(start))

	// A refresh moves the pause's start, not its length.
	p.Refreshed(now.Add(time.Second))
	assert.Equal(t, took, p.Wait(now.Add(time.Second)))
}

// A run slowed by something else (an apiserver taking its time) earns at
// most Cap; a Cap below the debounce never shortens the debounce.
func TestThePauseIsCapped(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	p := pace.Pacer{Gather: 100 * time.Millisecond, Debounce: 100 * time.Millisecond, Cap: 5 * time.Second}
	p.Ran(t0, t0.Add(40*time.Second))
	assert.Equal(t, 5*time.Second, p.Wait(t0.Add(40*time.Second)))

	p = pace.Pacer{Debounce: 100 * time.Millisecond, Cap: time.Millisecond}
	p.Ran(t0, t0.Add(time.Second))
	assert.Equal(t, 100*time.Millisecond, p.Wait(t0.Add(time.Second)))
}
