package server

import (
	"crypto/sha256"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
)

func TestRedemptionsMatchOnlyTheSpendingKeyWithinTheWindow(t *testing.T) {
	r := newRedemptions()
	now := time.Unix(1_000_000, 0)
	secret, key := sha256.Sum256([]byte("s")), sha256.Sum256([]byte("k"))
	other := sha256.Sum256([]byte("x"))
	r.spent("id", secret, key, "c1", "uid", now, now.Add(identity.RetryWindow))

	o, _ := r.retry("id", secret, key, "c1", "uid", now)
	assert.Equal(t, retryInFlight, o, "the first call is still issuing")
	r.done("id", nil)
	o, _ = r.retry("id", secret, key, "c1", "uid", now)
	assert.Equal(t, retryIssue, o, "nothing was issued: the same key may issue")
	o, _ = r.retry("id", secret, key, "c1", "uid", now)
	assert.Equal(t, retryInFlight, o, "one issuing call at a time")
	resp := &relaypb.CertificateResponse{SpiffeId: "x"}
	r.done("id", resp)
	o, got := r.retry("id", secret, key, "c1", "uid", now)
	assert.Equal(t, retryAnswer, o)
	assert.Same(t, resp, got)

	for name, try := range map[string]func() retryOutcome{
		"other key":          func() retryOutcome { o, _ := r.retry("id", secret, other, "c1", "uid", now); return o },
		"other secret":       func() retryOutcome { o, _ := r.retry("id", other, key, "c1", "uid", now); return o },
		"other cluster":      func() retryOutcome { o, _ := r.retry("id", secret, key, "c2", "uid", now); return o },
		"other registration": func() retryOutcome { o, _ := r.retry("id", secret, key, "c1", "uid2", now); return o },
		"other id":           func() retryOutcome { o, _ := r.retry("id2", secret, key, "c1", "uid", now); return o },
		"after the window": func() retryOutcome {
			o, _ := r.retry("id", secret, key, "c1", "uid", now.Add(identity.RetryWindow))
			return o
		},
	} {
		assert.Equal(t, retryNone, try(), name)
	}
}

func TestRedemptionsAreBounded(t *testing.T) {
	r := newRedemptions()
	now := time.Unix(1_000_000, 0)
	var s [sha256.Size]byte
	for i := range maxRedemptions + 10 {
		r.spent(fmt.Sprint(i), s, s, "c", "u", now, now.Add(identity.RetryWindow))
	}
	assert.LessOrEqual(t, r.len(), maxRedemptions)
	o, _ := r.retry("0", s, s, "c", "u", now)
	assert.Equal(t, retryNone, o, "the oldest went first")
	late := now.Add(identity.RetryWindow)
	r.spent("late", s, s, "c", "u", late, late.Add(identity.RetryWindow))
	assert.Equal(t, 1, r.len(), "expired entries go on the next insert")
}

// A claim undone (the redemption was refused) leaves nothing to retry, and
// claiming and undoing one token again and again keeps one place in the
// expiry order: a wrong secret sent under a known token ID cannot grow the
// memory until it evicts live entries.
func TestAnUndoneClaimLeavesNothingBehind(t *testing.T) {
	r := newRedemptions()
	now := time.Unix(1_000_000, 0)
	secret, key := sha256.Sum256([]byte("s")), sha256.Sum256([]byte("k"))
	// A live redemption ahead of it in the order: expiry stops there.
	r.spent("live", secret, key, "c0", "uid0", now, now.Add(identity.RetryWindow))
	for range 1000 {
		assert.True(t, r.claim("id", secret, key, "c1", "uid", now))
		r.unclaim("id", secret, key)
		o, _ := r.retry("id", secret, key, "c1", "uid", now)
		assert.Equal(t, retryNone, o, "an undone claim is no redemption")
	}
	assert.Len(t, r.order, 2)
	r.expire(now.Add(identity.RetryWindow))
	assert.Zero(t, r.len(), "an undone claim goes at the expiry that reaches it")
	assert.Empty(t, r.order)
}

// The server's ticker sweeps: answers kept for retries go when their
// window ends even if no agent ever bootstraps again.
func TestRedemptionsAreSweptWithoutANewBootstrap(t *testing.T) {
	r := newRedemptions()
	now := time.Unix(1_000_000, 0)
	var s [sha256.Size]byte
	for i := range 1000 {
		r.spent(fmt.Sprint(i), s, s, "c", "u", now, now.Add(identity.RetryWindow))
		r.done(fmt.Sprint(i), &relaypb.CertificateResponse{SpiffeId: "x"})
	}
	r.sweep(now.Add(identity.RetryWindow - time.Second))
	assert.Equal(t, 1000, r.len(), "nothing goes before its window ends")
	o, _ := r.retry("999", s, s, "c", "u", now)
	assert.Equal(t, retryAnswer, o)

	r.sweep(now.Add(identity.RetryWindow))
	assert.Zero(t, r.len(), "every window ended: all gone")
	assert.Zero(t, cap(r.order), "and the order's backing array with them")
	o, _ = r.retry("999", s, s, "c", "u", now.Add(identity.RetryWindow))
	assert.Equal(t, retryNone, o)
}

// The server's ticker drops the redemptions whose retry window ended: a
// fleet that bootstrapped once and then only renews does not keep every
// agent's answer for as long as the process runs.
func TestTheTickerSweepsEndedRedemptions(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := &Server{cfg: ServerConfig{Clock: clock}, throttle: newThrottleLog(nil, 10*time.Millisecond, clock), redeemed: newRedemptions(),
		stopTicker: make(chan struct{}), tickerDone: make(chan struct{})}
	var d [sha256.Size]byte
	s.redeemed.spent("ended", d, d, "c", "u", now, now.Add(identity.RetryWindow))
	s.redeemed.done("ended", &relaypb.CertificateResponse{SpiffeId: "x"})
	s.redeemed.spent("live", d, d, "c", "u", now, now.Add(2*identity.RetryWindow))
	go s.flushThrottled()
	defer s.stopFlushing()
	mu.Lock()
	now = now.Add(identity.RetryWindow)
	mu.Unlock()
	assert.Eventually(t, func() bool { return s.redeemed.len() == 1 }, 5*time.Second, 10*time.Millisecond,
		"the ended redemption is swept without another bootstrap")
	o, _ := s.redeemed.retry("live", d, d, "c", "u", clock())
	assert.Equal(t, retryInFlight, o, "the live one stays")
}
