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

	t.Run("success consumes", func(t *testing.T) {
		tok := mint()
		before := store.Len()
		_, err := tokens.Redeem(ctx, "cluster-1", tok)
		require.NoError(t, err)
		assert.Equal(t, before-1, store.Len())
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
			_, err := tokens.Redeem(ctx, "cluster-1", tok)
			require.NoError(t, err)
			return tok
		}, "cluster-1", identity.ReasonUnknown, false},
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
			before := store.Len()
			_, err := tokens.Redeem(ctx, tt.cluster, tok)
			require.Error(t, err)
			assert.ErrorIs(t, err, identity.ErrBootstrapDenied)
			var d *identity.DenialError
			require.True(t, errors.As(err, &d))
			assert.Equal(t, tt.reason, d.Reason)
			assert.Equal(t, before, store.Len(), "a refused token changes nothing")
			if len(tok) > 17 {
				assert.NotContains(t, err.Error(), tok[17:], "error must not echo the secret")
			}
		})
	}

	t.Run("expired", func(t *testing.T) {
		tok := mint()
		c.advance(time.Hour)
		before := store.Len()
		_, err := tokens.Redeem(ctx, "cluster-1", tok)
		var d *identity.DenialError
		require.ErrorAs(t, err, &d)
		assert.Equal(t, identity.ReasonExpired, d.Reason)
		assert.Equal(t, before, store.Len())
	})
}

// RaceRedeem redeems one token from n goroutines and returns how many won.
func raceRedeem(t *testing.T, tokens *identity.Tokens, cluster, tok string, n int) int32 {
	t.Helper()
	var wins atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := tokens.Redeem(context.Background(), cluster, tok); err == nil {
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
