// Package pace spaces the runs of a loop that is woken by changes and
// reads the whole of something each time it runs (the translation
// controller, the trust controller): a burst of changes becomes one run,
// and while changes keep coming a run that takes long is followed by a
// pause as long as itself, so the loop uses at most about half of the
// time however large its input grows.
package pace

import "time"

// DefaultCap is the longest pause the server's paced loops (translation,
// trust) take between two runs; what waits for them to go quiet (the
// fleet harness) must wait longer than this.
const DefaultCap = 5 * time.Second

// Pacer says how long a change waits before the loop acts on it. The zero
// value waits for nothing; set the fields. Not safe for concurrent use:
// the loop's own goroutine owns it.
type Pacer struct {
	// Gather is the least a change waits (for the other changes of one
	// edit), even after a quiet spell.
	Gather time.Duration
	// Debounce is the least time between the end of one run and the start
	// of the next.
	Debounce time.Duration
	// Cap bounds the pause a long run earns: a run slowed by a slow
	// apiserver must not hold the next one back for as long; zero: no cap.
	// The server's loops use DefaultCap.
	Cap time.Duration

	last time.Time     // when the last run ended
	took time.Duration // how long the last paced run took
}

// Wait is how long a change seen at now waits before the loop runs: at
// least Gather, and until max(Debounce, how long the last run took,
// capped) after the last run ended.
func (p *Pacer) Wait(now time.Time) time.Duration {
	earned := p.took
	if p.Cap > 0 {
		earned = min(earned, p.Cap)
	}
	return max(p.Gather, max(p.Debounce, earned)-now.Sub(p.last))
}

// Ran records a run from start to end; the next pause is as long as it
// (Wait).
func (p *Pacer) Ran(start, end time.Time) { p.last, p.took = end, end.Sub(start) }

// Refreshed records a light run that ended at end (a status refresh): the
// next pause counts from it, and is as long as the last paced run earned.
func (p *Pacer) Refreshed(end time.Time) { p.last = end }
