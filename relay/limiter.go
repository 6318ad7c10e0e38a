package relay

import (
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// failureLimiter rate-limits failed attempts per peer: every attempt takes a
// token from the peer's bucket when it starts and gets it back if it
// succeeds, so concurrent attempts cannot slip past the limit, guessing
// tokens or probing without a certificate costs time, and successful agents
// pay nothing. IPv6 peers are keyed by their /64, so rotating addresses
// inside one network does not buy fresh buckets. The table is bounded: when
// full, the peer seen longest ago is forgotten (its history resets; nobody
// else is locked out).
type failureLimiter struct {
	mu    sync.Mutex
	limit rate.Limit
	burst int
	peers map[string]*peerLimit
	max   int
	now   func() time.Time
}

// peerLimit is a token bucket: tokens refill at limit per second up to burst.
// (rate.Limiter cannot refund an immediate reservation after the fact,
// which begin/done needs.)
type peerLimit struct {
	tokens float64
	last   time.Time
	seen   time.Time
}

func newFailureLimiter(perMinute float64, burst, maxPeers int, now func() time.Time) *failureLimiter {
	return &failureLimiter{limit: rate.Limit(perMinute / 60), burst: burst, peers: map[string]*peerLimit{}, max: maxPeers, now: now}
}

// peerKey is the address a limit applies to: the IPv4 address, or the /64
// of an IPv6 address.
func peerKey(host string) string {
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// begin reserves one failure for peer. It returns false if the peer has no
// failures left (refuse at once). Otherwise the caller MUST call done once:
// done(true) refunds the reservation.
func (f *failureLimiter) begin(peer string) (done func(success bool), ok bool) {
	key := peerKey(peer)
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	p, found := f.peers[key]
	if !found {
		if len(f.peers) >= f.max {
			f.evictOldest()
		}
		p = &peerLimit{tokens: float64(f.burst), last: now}
		f.peers[key] = p
	}
	p.seen = now
	p.tokens = min(float64(f.burst), p.tokens+now.Sub(p.last).Seconds()*float64(f.limit))
	p.last = now
	if p.tokens < 1 {
		return nil, false
	}
	p.tokens--
	var once sync.Once
	return func(success bool) {
		once.Do(func() {
			if success {
				f.mu.Lock()
				p.tokens = min(float64(f.burst), p.tokens+1)
				f.mu.Unlock()
			}
		})
	}, true
}

func (f *failureLimiter) evictOldest() {
	var oldestKey string
	var oldest time.Time
	for k, p := range f.peers {
		if oldestKey == "" || p.seen.Before(oldest) {
			oldestKey, oldest = k, p.seen
		}
	}
	delete(f.peers, oldestKey)
}
