package relay

import (
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// FailureLimiter rate-limits failed attempts per peer: every attempt takes a
// token from the peer's bucket when it starts and gets it back if it
// succeeds, so concurrent attempts cannot slip past the limit, guessing
// tokens or probing without a certificate costs time, and successful agents
// pay nothing. IPv6 peers are keyed by their /64, so rotating addresses
// inside one network does not buy fresh buckets. The table is bounded: when
// full, the peer seen longest ago is forgotten (its history resets; nobody
// else is locked out).
type FailureLimiter struct {
	mu    sync.Mutex
	limit rate.Limit
	burst int
	peers map[string]*peerLimit
	max   int
	now   func() time.Time
	// onFailure charges an attempt only when it fails, instead of
	// reserving a token while it runs: the budget of all peers together,
	// where attempts in flight are legitimate agents of a storm far more
	// often than attackers (whose concurrency the bootstrap semaphore
	// bounds anyway). A failure then costs a token, down to zero.
	onFailure bool
}

// peerLimit is a token bucket: tokens refill at limit per second up to burst.
// (rate.Limiter cannot refund an immediate reservation after the fact,
// which begin/done needs.)
type peerLimit struct {
	tokens float64
	last   time.Time
	seen   time.Time
}

func NewFailureLimiter(perMinute float64, burst, maxPeers int, now func() time.Time) *FailureLimiter {
	return &FailureLimiter{limit: rate.Limit(perMinute / 60), burst: burst, peers: map[string]*peerLimit{}, max: maxPeers, now: now}
}

// NewGlobalFailureLimiter is one budget of failures for all peers together,
// charged only when an attempt fails (see onFailure).
func NewGlobalFailureLimiter(perMinute float64, burst int, now func() time.Time) *FailureLimiter {
	f := NewFailureLimiter(perMinute, burst, 1, now)
	f.onFailure = true
	return f
}

// PeerKey is the address a limit applies to: the IPv4 address, or the /64
// of an IPv6 address.
func PeerKey(host string) string {
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// Begin reserves one failure for peer. It returns false if the peer has no
// failures left (refuse at once). Otherwise the caller MUST call done once:
// done(true) refunds the reservation.
func (f *FailureLimiter) Begin(peer string) (done func(success bool), ok bool) {
	key := PeerKey(peer)
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	p, found := f.peers[key]
	if !found {
		if len(f.peers) >= f.max && !f.evict(now) {
			// Every peer in the table is throttled: a new one is refused
			// rather than let an eviction reset someone's history.
			return nil, false
		}
		p = &peerLimit{tokens: float64(f.burst), last: now}
		f.peers[key] = p
	}
	p.seen = now
	f.refill(p, now)
	if p.tokens < 1 {
		return nil, false
	}
	var once sync.Once
	if f.onFailure {
		return func(success bool) {
			once.Do(func() {
				if !success {
					f.mu.Lock()
					f.refill(p, f.now())
					p.tokens = max(0, p.tokens-1)
					f.mu.Unlock()
				}
			})
		}, true
	}
	p.tokens--
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

func (f *FailureLimiter) refill(p *peerLimit, now time.Time) {
	p.tokens = min(float64(f.burst), p.tokens+now.Sub(p.last).Seconds()*float64(f.limit))
	p.last = now
}

// evict makes room in a full table. It forgets every peer whose budget has
// refilled (forgetting it changes nothing), else the one closest to that,
// seen longest ago; it never forgets a throttled peer (one with less than a
// failure left), so a flood of new addresses cannot reset a throttled
// address's history. It returns false when every peer is throttled.
func (f *FailureLimiter) evict(now time.Time) bool {
	var victim string
	var best *peerLimit
	freed := false
	for k, p := range f.peers {
		f.refill(p, now)
		switch {
		case p.tokens >= float64(f.burst):
			delete(f.peers, k)
			freed = true
		case p.tokens < 1:
		case best == nil || p.tokens > best.tokens || p.tokens == best.tokens && p.seen.Before(best.seen):
			victim, best = k, p
		}
	}
	if freed {
		return true
	}
	if best == nil {
		return false
	}
	delete(f.peers, victim)
	return true
}

// Exhausted reports whether peer has no failure left now, without creating
// an entry for it.
func (f *FailureLimiter) Exhausted(peer string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.peers[PeerKey(peer)]
	if !ok {
		return false
	}
	f.refill(p, f.now())
	return p.tokens < 1
}
