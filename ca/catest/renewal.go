package catest

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/backend"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
)

// Renewable is a relay CA signer whose back end's issuing CA can change
// under the same root: Reload picks the new one up and the replaced one
// stays in AcceptedIssuers while its agent certificates may be valid
// (backend.FileSigner).
type Renewable interface {
	ca.Signer
	ca.IssuerSet
	Reload(ctx context.Context) (bool, error)
}

// Clock is a settable clock for tests, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at now.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// IssuerRenewal is one renewal of a Renewable's issuing CA for
// RunIssuerRenewal.
type IssuerRenewal struct {
	// Signer was built on Clock (which starts near the real time).
	Signer Renewable
	Clock  *Clock
	// Renew gives the back end a new issuing CA under the same root and
	// updates what Signer reloads (its file).
	Renew func(t *testing.T)
	// Keep is how long the signer keeps a replaced issuing CA; it must be
	// at least AgentTTL.
	Keep time.Duration
	// AgentTTL is the agent certificate lifetime the back end issues
	// (default 24h).
	AgentTTL time.Duration
}

// RunIssuerRenewal checks a renewal of the issuing CA on a real back end:
// an agent certificate issued before it; a reload that changes nothing
// reports no change; after Renew, a reload makes the new issuing CA
// current under the same roots, a new agent certificate comes from it,
// and the old agent certificate's issuer is still accepted (so its agent
// can connect and Renew); once Keep has passed, the replaced issuing CA is
// no longer accepted, and by then the old certificate has expired (no
// agent is stranded).
func RunIssuerRenewal(t *testing.T, r IssuerRenewal) {
	t.Helper()
	if r.AgentTTL == 0 {
		r.AgentTTL = 24 * time.Hour
	}
	require.GreaterOrEqual(t, r.Keep, r.AgentTTL, "Keep covers an agent certificate's life")
	ctx := context.Background()
	a := newAuthority(t, ca.Config{Signer: r.Signer, AgentTTL: r.AgentTTL})
	issue := func() *ca.Issued {
		key := NewKey(t, ECDSAP256)
		iss, err := a.IssueAgent(ctx, parseCSR(t, NewCSR(t, key, nil)), AgentID)
		require.NoError(t, err)
		CheckAgentCertificate(t, iss, key.Public(), AgentID)
		return iss
	}
	accepts := func(c *x509.Certificate) bool {
		return slices.ContainsFunc(r.Signer.AcceptedIssuers(), func(i *x509.Certificate) bool { return c.CheckSignatureFrom(i) == nil })
	}
	roots := r.Signer.Roots()
	first := r.Signer.Chain()[0]
	before := issue()
	require.True(t, before.Certificate.CheckSignatureFrom(first) == nil, "issued by the current issuing CA")
	assert.Equal(t, []*x509.Certificate{first}, r.Signer.AcceptedIssuers(), "one issuing CA before the renewal")

	changed, err := r.Signer.Reload(ctx)
	require.NoError(t, err)
	assert.False(t, changed, "a reload of an unchanged back end changes nothing")
	assert.True(t, r.Signer.Chain()[0].Equal(first))

	r.Renew(t)
	changed, err = r.Signer.Reload(ctx)
	require.NoError(t, err)
	require.True(t, changed, "the reload picks up the new issuing CA")
	next := r.Signer.Chain()[0]
	require.False(t, next.Equal(first), "a new issuing CA is current")
	assert.True(t, slices.EqualFunc(roots, r.Signer.Roots(), (*x509.Certificate).Equal), "same roots: agents notice nothing")

	after := issue()
	assert.True(t, after.Certificate.CheckSignatureFrom(next) == nil, "issued by the new issuing CA")
	assert.Error(t, after.Certificate.CheckSignatureFrom(first), "not by the replaced one")
	accepted := r.Signer.AcceptedIssuers()
	require.Len(t, accepted, 2, "the current and the replaced issuing CA")
	assert.True(t, accepted[0].Equal(next), "the current issuing CA first")
	assert.True(t, accepts(before.Certificate), "an agent certificate from before the renewal is still accepted")
	assert.True(t, accepts(after.Certificate))

	// Just before Keep ends the replaced one is still accepted; then it
	// is dropped, and every agent certificate it signed has expired.
	r.Clock.Advance(r.Keep - time.Minute)
	assert.True(t, accepts(before.Certificate), "still accepted within Keep")
	r.Clock.Advance(time.Minute + time.Second)
	assert.Equal(t, []*x509.Certificate{next}, r.Signer.AcceptedIssuers(), "the replaced issuing CA is dropped after Keep")
	assert.False(t, accepts(before.Certificate), "the old agent certificate's issuer is no longer accepted")
	assert.False(t, before.Certificate.NotAfter.After(r.Clock.Now()), "it has expired when its issuer is dropped: no agent is stranded")
	assert.True(t, accepts(after.Certificate))
}

// FileRenewalKeep is the Keep of RunFileRenewal: an agent certificate
// lifetime of 24h plus two check intervals of a minute.
const FileRenewalKeep = 24*time.Hour + 2*time.Minute

// RunFileRenewal builds a backend.FileSigner, as --ca-config does, from
// the CA back-end file at path (already written), on a Clock at the real
// time, and runs RunIssuerRenewal on it with renew rewriting the file. It
// returns the signer (closed when the test ends), its clock and what it
// logged.
func RunFileRenewal(t *testing.T, path string, renew func(t *testing.T)) (Renewable, *Clock, string) {
	t.Helper()
	clock := NewClock(time.Now())
	var logs syncbuf.Buffer
	s, err := backend.NewFileSigner(context.Background(), backend.FileSignerConfig{Path: path, Keep: FileRenewalKeep, Clock: clock.Now,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	t.Cleanup(func() {
		if c, ok := s.(io.Closer); ok {
			assert.NoError(t, c.Close())
		}
	})
	r, ok := s.(Renewable)
	require.True(t, ok, "a FileSigner is renewable")
	RunIssuerRenewal(t, IssuerRenewal{Signer: r, Clock: clock, Keep: FileRenewalKeep, Renew: renew})
	return r, clock, logs.String()
}
