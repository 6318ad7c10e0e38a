package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
)

// A bootstrap token is single-use, but the call that spends it can fail
// after it is spent: the agent's deadline passes while the server is busy
// (a storm of agents), or the connection drops before the answer arrives.
// The token's record keeps who spent it (identity.Spend), so a retry with
// a CSR for the same key (which only its holder can sign) is redeemed
// again on any replica, within identity.RetryWindow of the spend. This
// memory adds, per process, the answer: a retry that reaches the replica
// that spent the token gets the certificate issued for it (not a second
// one), and one issuing call at a time; if issuing failed, the token's
// record decides again. It holds no secret: digests, the cluster and the
// public answer.

// maxRedemptions bounds the memory; beyond it the oldest entries go (they
// are only a convenience: losing one costs that agent a new token).
const maxRedemptions = 100_000

type redemption struct {
	secret       [sha256.Size]byte // of the token's secret
	key          [sha256.Size]byte // of the CSR's public key
	cluster      string
	registration string
	until        time.Time
	inFlight     bool
	resp         *relaypb.CertificateResponse
}

type redemptions struct {
	mu    sync.Mutex
	byID  map[string]*redemption
	order []string // insertion order, for expiry
}

func newRedemptions() *redemptions { return &redemptions{byID: map[string]*redemption{}} }

// keyDigest identifies a CSR's key.
func keyDigest(csr *x509.CertificateRequest) [sha256.Size]byte {
	return sha256.Sum256(csr.RawSubjectPublicKeyInfo)
}

// retryOutcome is what a remembered redemption allows.
type retryOutcome int

const (
	retryNone     retryOutcome = iota // not a retry: redeem the token as usual
	retryAnswer                       // answer with the remembered response
	retryIssue                        // the token is spent by this key but nothing was issued: issue
	retryInFlight                     // the first call is still issuing: come back later
)

// retry looks up a token spent earlier. A match needs the same secret, the
// same key, the same cluster and registration, within the window; claim
// marks a retryIssue as in flight so only one call issues at a time.
func (r *redemptions) retry(id string, secret, key [sha256.Size]byte, cluster, registration string, now time.Time) (retryOutcome, *relaypb.CertificateResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	if !ok || !now.Before(e.until) {
		return retryNone, nil
	}
	same := subtle.ConstantTimeCompare(e.secret[:], secret[:]) & subtle.ConstantTimeCompare(e.key[:], key[:])
	if same != 1 || e.cluster != cluster || e.registration != registration {
		return retryNone, nil // redeeming finds the token spent and refuses
	}
	switch {
	case e.resp != nil:
		return retryAnswer, e.resp
	case e.inFlight:
		return retryInFlight, nil
	}
	e.inFlight = true
	return retryIssue, nil
}

// spent remembers a token just redeemed by key, in flight, until the end
// of its spend's retry window.
func (r *redemptions) spent(id string, secret, key [sha256.Size]byte, cluster, registration string, now, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire(now)
	r.put(id, secret, key, cluster, registration, until)
}

// put stores an in-flight entry for id; r.mu is held.
func (r *redemptions) put(id string, secret, key [sha256.Size]byte, cluster, registration string, until time.Time) {
	if _, ok := r.byID[id]; !ok {
		r.order = append(r.order, id)
	}
	r.byID[id] = &redemption{secret: secret, key: key, cluster: cluster, registration: registration,
		until: until, inFlight: true}
}

// claim marks a token this call is about to redeem for key as in flight,
// so that a retry by the same key on this replica is asked to come back
// (retryInFlight) instead of redeeming it again and issuing a second
// certificate while the spend is still on its way to the store. It claims
// nothing (false) if the token has a live entry already.
func (r *redemptions) claim(id string, secret, key [sha256.Size]byte, cluster, registration string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire(now)
	if e, ok := r.byID[id]; ok && now.Before(e.until) {
		return false
	}
	r.put(id, secret, key, cluster, registration, now.Add(identity.RetryWindow))
	return true
}

// unclaim drops a claim whose redemption did not happen, if the entry is
// still that claim (not a spend recorded since by another call). The entry
// is expired where it stands, not deleted: its place in order goes with it
// (expire), so a token claimed and refused again and again (a wrong secret
// under a known ID) does not add a place each time.
func (r *redemptions) unclaim(id string, secret, key [sha256.Size]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.byID[id]; ok && e.inFlight && e.resp == nil && e.secret == secret && e.key == key {
		e.until, e.inFlight = time.Time{}, false
	}
}

// done records how issuing for a spent token ended: its answer, or nothing
// (a retry by the same key may try again).
func (r *redemptions) done(id string, resp *relaypb.CertificateResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.byID[id]; ok {
		e.inFlight = false
		e.resp = resp
	}
}

// expire drops entries past their window, and the oldest beyond the bound.
// Entries are appended in about the order their windows end (a retry's
// window started at its spend, earlier), so expiry drops the expired
// prefix; an expired entry behind a live one waits, refused by retry, and
// counts against the bound.
func (r *redemptions) expire(now time.Time) {
	n := 0
	for n < len(r.order) {
		e, ok := r.byID[r.order[n]]
		if ok && now.Before(e.until) && len(r.order)-n < maxRedemptions {
			break
		}
		delete(r.byID, r.order[n])
		n++
	}
	if n > 0 {
		r.order = append(r.order[:0:0], r.order[n:]...)
	}
}

// sweep expires what expire would at the next spend or claim: the entries
// whose window ended by now, up to the first live one (entries come in
// about the order their windows end; one behind a live entry waits for
// it). Without it they went only at the next bootstrap,
// so a fleet that bootstrapped once and then only renewed kept each
// agent's answer, about 4.5 KiB (its certificate chain and trust bundle
// as PEM), for as long as the process ran (issue 31).
func (r *redemptions) sweep(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire(now)
}

// len is the number of remembered redemptions.
func (r *redemptions) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID)
}
