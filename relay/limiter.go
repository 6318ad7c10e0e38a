package relay

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// failureLimiter rate-limits failed bootstrap attempts per peer IP: every
// failure takes a token from the peer's bucket; a peer with an empty bucket
// is refused before its request is looked at, so guessing tokens costs time.
// Successful attempts cost nothing.
type failureLimiter struct {
	mu      sync.Mutex
	limit   rate.Limit
	burst   int
	peers   map[string]*peerLimit
	max     int // bound on tracked peers, so a flood of addresses cannot grow memory without end
	now     func() time.Time
	lastGC  time.Time
	idleTTL time.Duration
}

type peerLimit struct {
	lim  *rate.Limiter
	seen time.Time
}

func newFailureLimiter(perMinute float64, burst, maxPeers int, now func() time.Time) *failureLimiter {
	return &failureLimiter{
		limit:   rate.Limit(perMinute / 60),
		burst:   burst,
		peers:   map[string]*peerLimit{},
		max:     maxPeers,
		now:     now,
		idleTTL: 10 * time.Minute,
	}
}

// blocked reports whether peer has used up its failures.
func (f *failureLimiter) blocked(peer string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.peers[peer]
	if !ok {
		if p, ok = f.peers["overflow"]; !ok || len(f.peers) < f.max {
			return false
		}
	}
	return p.lim.TokensAt(f.now()) < 1
}

// fail records a failure of peer.
func (f *failureLimiter) fail(peer string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	f.gc(now)
	p, ok := f.peers[peer]
	if !ok {
		if len(f.peers) >= f.max {
			// Table full: fold unknown peers into one shared bucket so
			// memory stays bounded and a flood still gets slowed down.
			peer = "overflow"
			if p, ok = f.peers[peer]; !ok {
				p = &peerLimit{lim: rate.NewLimiter(f.limit, f.burst)}
				f.peers[peer] = p
			}
		} else {
			p = &peerLimit{lim: rate.NewLimiter(f.limit, f.burst)}
			f.peers[peer] = p
		}
	}
	p.seen = now
	p.lim.AllowN(now, 1)
}

// gc drops peers idle long enough for their bucket to be full again.
func (f *failureLimiter) gc(now time.Time) {
	if now.Sub(f.lastGC) < time.Minute {
		return
	}
	f.lastGC = now
	for k, p := range f.peers {
		if now.Sub(p.seen) > f.idleTTL {
			delete(f.peers, k)
		}
	}
}
