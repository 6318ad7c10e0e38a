package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestDelayBounds(t *testing.T) {
	p := Policy{Min: time.Second, Max: time.Minute}
	for _, r := range []float64{0, 0.5, 0.999999} {
		p.Rand = func() float64 { return r }
		for attempt := 0; attempt < 40; attempt++ {
			d := p.Delay(attempt)
			assert.GreaterOrEqual(t, d, 500*time.Millisecond)
			assert.LessOrEqual(t, d, time.Minute)
		}
	}
	p.Rand = func() float64 { return 0.999999 }
	assert.Less(t, p.Delay(0), 1001*time.Millisecond)
	assert.Greater(t, p.Delay(3), 7*time.Second, "grows exponentially")
	assert.Greater(t, p.Delay(30), 59*time.Second, "capped at Max, no overflow")
}

func TestDefaults(t *testing.T) {
	d := Policy{}.Delay(0)
	assert.GreaterOrEqual(t, d, 500*time.Millisecond)
	assert.LessOrEqual(t, d, time.Second)
}
