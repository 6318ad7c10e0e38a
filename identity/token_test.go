package identity_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTokens(t *testing.T, store identity.TokenStore) (*identity.Tokens, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}
	tok, err := identity.NewTokens(identity.TokensConfig{Store: store, Clock: c.now})
	require.NoError(t, err)
	return tok, c
}

func TestMintShapeAndStorage(t *testing.T) {
	store := identitytest.NewMemTokenStore()
	tokens, c := newTokens(t, store)
	tok, rec, err := tokens.Mint(context.Background(), "cluster-1", time.Hour)
	require.NoError(t, err)
	assert.Len(t, tok, identity.TokenLen)
	p, err := identity.ParseToken(tok)
	require.NoError(t, err)
	assert.Equal(t, rec.ID, p.ID)
	assert.Equal(t, c.t.Add(time.Hour), rec.ExpiresAt)
	stored, err := store.Get(context.Background(), rec.ID)
	require.NoError(t, err)
	secret, err := base64.RawURLEncoding.DecodeString(tok[17:])
	require.NoError(t, err)
	assert.Len(t, secret, 32, "256-bit secret")
	assert.Equal(t, sha256.Sum256(secret), stored.SecretHash, "only the hash is stored")

	tok2, _, err := tokens.Mint(context.Background(), "cluster-1", time.Hour)
	require.NoError(t, err)
	assert.NotEqual(t, tok, tok2)
}

func TestMintRejectsBadInput(t *testing.T) {
	tokens, _ := newTokens(t, identitytest.NewMemTokenStore())
	for _, tt := range []struct {
		cluster string
		ttl     time.Duration
		want    string
	}{
		{"Cluster", time.Hour, "not a DNS label"},
		{"", time.Hour, "not a DNS label"},
		{"c", 0, "out of range"},
		{"c", -time.Second, "out of range"},
		{"c", 8 * 24 * time.Hour, "out of range"},
	} {
		_, _, err := tokens.Mint(context.Background(), tt.cluster, tt.ttl)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tt.want)
	}
}

func TestRedeem(t *testing.T) {
	ctx := context.Background()
	store := identitytest.NewMemTokenStore()
	tokens, c := newTokens(t, store)
	mint := func() string {
		tok, _, err := tokens.Mint(ctx, "cluster-1", time.Hour)
		require.NoError(t, err)
		return tok
	}
	flip := func(tok string) string { // same id, different valid secret
		b := []byte(tok)
		if b[20] == 'A' {
			b[20] = 'B'
		} else {
			b[20] = 'A'
		}
		return string(b)
	}

	t.Run("success spends", func(t *testing.T) {
		tok := mint()
		before := store.Unspent()
		r, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
		require.NoError(t, err)
		assert.False(t, r.Retry)
		require.NotNil(t, r.Record.Spent)
		assert.Equal(t, redeemer(1).Key, r.Record.Spent.Key)
		assert.Equal(t, "registration-1", r.Record.Spent.Registration)
		assert.Equal(t, c.now().UTC().Truncate(time.Second), r.Record.Spent.At)
		assert.Equal(t, before-1, store.Unspent())
	})

	cases := []struct {
		name     string
		token    func() string
		cluster  string
		reason   string
		consumed bool
	}{
		{"reused", func() string {
			tok := mint()
			_, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
			require.NoError(t, err)
			return tok
		}, "cluster-1", identity.ReasonUsed, false},
		{"other cluster", mint, "cluster-2", identity.ReasonWrongCluster, false},
		{"wrong secret", func() string { return flip(mint()) }, "cluster-1", identity.ReasonWrongSecret, false},
		{"unknown id", func() string { tok := mint(); return "0000000000000000" + tok[16:] }, "cluster-1", identity.ReasonUnknown, false},
		{"malformed", func() string { return "not-a-token" }, "cluster-1", identity.ReasonMalformed, false},
		{"empty", func() string { return "" }, "cluster-1", identity.ReasonMalformed, false},
		{"oversized", func() string { return strings.Repeat("a", 1<<20) }, "cluster-1", identity.ReasonMalformed, false},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			tok := tt.token()
			before := store.Unspent()
			recBefore, errBefore := recordOf(store, tok)
			_, err := tokens.Redeem(ctx, tt.cluster, tok, redeemer(2))
			require.Error(t, err)
			assert.ErrorIs(t, err, identity.ErrBootstrapDenied)
			var d *identity.DenialError
			require.True(t, errors.As(err, &d))
			assert.Equal(t, tt.reason, d.Reason)
			assert.Equal(t, before, store.Unspent(), "a refused token changes nothing")
			recAfter, errAfter := recordOf(store, tok)
			assert.Equal(t, recBefore, recAfter, "a refused token's record is unchanged")
			assert.Equal(t, errBefore, errAfter)
			if len(tok) > 17 {
				assert.NotContains(t, err.Error(), tok[17:], "error must not echo the secret")
			}
		})
	}

	t.Run("a redeemer without a registration spends nothing", func(t *testing.T) {
		tok := mint()
		before := store.Unspent()
		for _, reg := range []string{"", strings.Repeat("u", identity.MaxRegistrationLen+1)} {
			_, err := tokens.Redeem(ctx, "cluster-1", tok, identity.Redeemer{Key: redeemer(1).Key, Registration: reg})
			var d *identity.DenialError
			require.ErrorAs(t, err, &d)
			assert.Equal(t, identity.ReasonStore, d.Reason)
		}
		assert.Equal(t, before, store.Unspent())
	})

	t.Run("expired", func(t *testing.T) {
		tok := mint()
		c.advance(time.Hour)
		before := store.Unspent()
		_, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
		var d *identity.DenialError
		require.ErrorAs(t, err, &d)
		assert.Equal(t, identity.ReasonExpired, d.Reason)
		assert.Equal(t, before, store.Unspent())
	})
}

// recordOf is the stored record of tok, if tok parses.
func recordOf(store *identitytest.MemTokenStore, tok string) (identity.TokenRecord, error) {
	p, err := identity.ParseToken(tok)
	if err != nil {
		return identity.TokenRecord{}, err
	}
	return store.GetLatest(context.Background(), p.ID)
}

// A watch cache behind the store: a spend it does not show yet fails its
// precondition and is read from the store (another key refused, the
// spending key retried); a retry of a record revoked since the cache saw
// it is refused; a record only annotated since is spent.
func TestRedeemThroughALaggingCache(t *testing.T) {
	ctx := context.Background()
	store := identitytest.NewMemTokenStore()
	tokens, _ := newTokens(t, store)
	tok, _, err := tokens.Mint(ctx, "cluster-1", time.Hour)
	require.NoError(t, err)
	store.Lag()
	first, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.NoError(t, err)
	assert.False(t, first.Retry)
	_, err = tokens.Redeem(ctx, "cluster-1", tok, redeemer(2))
	var d *identity.DenialError
	require.ErrorAs(t, err, &d, "another key, the cache showing the token unspent")
	assert.Equal(t, identity.ReasonUsed, d.Reason)
	again, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.NoError(t, err, "the spending key, the cache showing the token unspent")
	assert.True(t, again.Retry)

	// Revoked after the cache saw it spent: no retry.
	store.CatchUp()
	store.Lag()
	require.NoError(t, store.Consume(ctx, first.Record))
	_, err = tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.ErrorAs(t, err, &d, "a revoked token, the cache showing it spent")
	assert.Equal(t, identity.ReasonUnknown, d.Reason)
	store.CatchUp()

	// Annotated after the cache saw it: spent all the same.
	tok2, rec2, err := tokens.Mint(ctx, "cluster-1", time.Hour)
	require.NoError(t, err)
	store.Lag()
	store.Touch(rec2.ID)
	r, err := tokens.Redeem(ctx, "cluster-1", tok2, redeemer(1))
	require.NoError(t, err)
	assert.False(t, r.Retry)
	assert.Equal(t, 0, store.Unspent())
}

// redeemer is the n-th CSR key, of registration-1.
func redeemer(n int) identity.Redeemer {
	return identity.Redeemer{Key: sha256.Sum256([]byte{byte(n)}), Registration: "registration-1"}
}

// A spent token is redeemed again only by the key that spent it, for the
// same registration, within RetryWindow (also after the token's own
// expiry: the window runs from the spend); it is a retry, not a spend.
func TestRedeemRetryBySpendingKey(t *testing.T) {
	ctx := context.Background()
	store := identitytest.NewMemTokenStore()
	tokens, c := newTokens(t, store)
	tok, _, err := tokens.Mint(ctx, "cluster-1", time.Minute)
	require.NoError(t, err)
	first, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.NoError(t, err)
	require.False(t, first.Retry)
	c.advance(2 * time.Minute) // past the token's expiry, within the window

	again, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.NoError(t, err)
	assert.True(t, again.Retry)
	assert.Equal(t, first.Record.Spent, again.Record.Spent, "a retry does not spend again")

	otherRegistration := redeemer(1)
	otherRegistration.Registration = "registration-2"
	for name, by := range map[string]identity.Redeemer{"another key": redeemer(2), "another registration": otherRegistration} {
		_, err := tokens.Redeem(ctx, "cluster-1", tok, by)
		var d *identity.DenialError
		require.ErrorAs(t, err, &d, name)
		assert.Equal(t, identity.ReasonUsed, d.Reason, name)
	}
	_, err = tokens.Redeem(ctx, "cluster-2", tok, redeemer(1))
	var d *identity.DenialError
	require.ErrorAs(t, err, &d)
	assert.Equal(t, identity.ReasonWrongCluster, d.Reason)

	c.advance(identity.RetryWindow)
	_, err = tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.ErrorAs(t, err, &d)
	assert.Equal(t, identity.ReasonUsed, d.Reason, "after the window")
	assert.True(t, first.Record.Spent.Collectable(c.now()))
	assert.False(t, (&identity.Spend{At: c.now()}).Collectable(c.now()), "within its window")
	assert.True(t, (&identity.Spend{At: c.now().Add(time.Hour)}).Collectable(c.now()), "dated ahead: no retry, collected")
}

// A record goes when nothing can use it any more: a spent one after its
// retry window, an unspent one a retention after it expired; a spend
// decides over the expiry (a spent token's retry does not look at it).
func TestTokenRecordCollectable(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for name, c := range map[string]struct {
		rec  identity.TokenRecord
		want bool
	}{
		"unspent, not expired":                  {identity.TokenRecord{ExpiresAt: now.Add(time.Hour)}, false},
		"unspent, expired within its retention": {identity.TokenRecord{ExpiresAt: now.Add(-identity.ExpiredRetention + time.Second)}, false},
		"unspent, expired a retention ago":      {identity.TokenRecord{ExpiresAt: now.Add(-identity.ExpiredRetention)}, true},
		"unspent, no expiry read":               {identity.TokenRecord{}, false},
		"spent within its window, long expired": {identity.TokenRecord{ExpiresAt: now.Add(-48 * time.Hour), Spent: &identity.Spend{At: now.Add(-time.Minute)}}, false},
		"spent a window ago, not expired":       {identity.TokenRecord{ExpiresAt: now.Add(time.Hour), Spent: &identity.Spend{At: now.Add(-identity.RetryWindow)}}, true},
		"spent, dated ahead":                    {identity.TokenRecord{ExpiresAt: now.Add(time.Hour), Spent: &identity.Spend{At: now.Add(time.Hour)}}, true},
	} {
		assert.Equal(t, c.want, c.rec.Collectable(now), name)
	}
}

// Of racing redemptions by one key, exactly one spends the token and the
// others are its retries.
func TestRedeemRaceBySameKey(t *testing.T) {
	tokens, _ := newTokens(t, identitytest.NewMemTokenStore())
	for range 20 {
		tok, _, err := tokens.Mint(context.Background(), "cluster-1", time.Hour)
		require.NoError(t, err)
		var spends, retries atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				<-start
				r, err := tokens.Redeem(context.Background(), "cluster-1", tok, redeemer(1))
				if assert.NoError(t, err) && r.Retry {
					retries.Add(1)
				} else if err == nil {
					spends.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, int32(1), spends.Load())
		require.Equal(t, int32(7), retries.Load())
	}
}

// RaceRedeem redeems one token from n goroutines, each with its own key,
// and returns how many won.
func raceRedeem(t *testing.T, tokens *identity.Tokens, cluster, tok string, n int) int32 {
	t.Helper()
	var wins atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := tokens.Redeem(context.Background(), cluster, tok, redeemer(i)); err == nil {
				wins.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	return wins.Load()
}

func TestRedeemRaceMemory(t *testing.T) {
	tokens, _ := newTokens(t, identitytest.NewMemTokenStore())
	for range 50 {
		tok, _, err := tokens.Mint(context.Background(), "cluster-1", time.Hour)
		require.NoError(t, err)
		require.Equal(t, int32(1), raceRedeem(t, tokens, "cluster-1", tok, 8))
	}
}

func TestParseToken(t *testing.T) {
	good := "0123456789abcdef." + strings.Repeat("A", 43)
	_, err := identity.ParseToken(good)
	require.NoError(t, err)
	for _, bad := range []string{
		"", good[:len(good)-1], good + "A", strings.Replace(good, ".", "-", 1),
		"0123456789ABCDEF." + strings.Repeat("A", 43),       // upper-case id
		"0123456789abcdeg." + strings.Repeat("A", 43),       // not hex
		"0123456789abcdef." + strings.Repeat("+", 43),       // not base64url
		"0123456789abcdef." + strings.Repeat("A", 42) + "B", // non-canonical trailing bits
	} {
		_, err := identity.ParseToken(bad)
		assert.Error(t, err, "%q", bad)
		if len(bad) > 17 {
			assert.NotContains(t, err.Error(), bad[17:])
		}
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add("0123456789abcdef." + strings.Repeat("A", 43))
	f.Add("")
	f.Add("0123456789abcdef.")
	f.Add(strings.Repeat(".", 60))
	f.Fuzz(func(t *testing.T, s string) {
		p, err := identity.ParseToken(s)
		if err != nil {
			if len(s) >= 16 {
				assert.NotContains(t, err.Error(), s, "error must not echo input")
			}
			return
		}
		require.Len(t, s, identity.TokenLen)
		require.Equal(t, s[:16], p.ID)
	})
}

func TestSharedToken(t *testing.T) {
	_, err := identity.NewSharedToken("short")
	require.Error(t, err)
	s, err := identity.NewSharedToken(strings.Repeat("k", 40))
	require.NoError(t, err)
	require.NoError(t, s.Check(strings.Repeat("k", 40)))
	err = s.Check(strings.Repeat("k", 39) + "j")
	require.ErrorIs(t, err, identity.ErrBootstrapDenied)
}
