// Package backoff computes retry delays: exponential growth with full
// jitter, so many agents retrying after a server outage spread out instead
// of arriving together.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff with full jitter.
type Policy struct {
	Min, Max time.Duration
	// Rand returns a float in [0,1); default math/rand/v2.
	Rand func() float64
}

// Delay returns the wait before retry number attempt (0-based): a uniform
// draw from [Min/2, min(Max, Min·2^attempt)].
func (p Policy) Delay(attempt int) time.Duration {
	lo, hi := p.Min, p.Max
	if lo <= 0 {
		lo = time.Second
	}
	if hi < lo {
		hi = lo
	}
	ceiling := lo
	for i := 0; i < attempt && ceiling < hi; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, hi)
	r := p.Rand
	if r == nil {
		r = rand.Float64
	}
	floor := lo / 2
	return floor + time.Duration(r()*float64(ceiling-floor))
}
