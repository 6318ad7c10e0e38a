package ca_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
)

// newRelayCA generates a relay CA valid around now.
func newRelayCA(t testing.TB, cfg ca.GenerateConfig) *ca.RelayCA {
	t.Helper()
	r, err := ca.GenerateRelayCA(cfg)
	require.NoError(t, err)
	return r
}

// newTestAuthority is an Authority with default settings on a fresh
// generated relay CA.
func newTestAuthority(t testing.TB) *ca.Authority {
	t.Helper()
	s, err := newRelayCA(t, ca.GenerateConfig{}).Signer(time.Now())
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(t, err)
	return a
}

// allowedKey is the key policy, written out independently of the package.
func allowedKey(pub crypto.PublicKey) bool {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return k.Curve == elliptic.P256() || k.Curve == elliptic.P384()
	case ed25519.PublicKey:
		return len(k) == ed25519.PublicKeySize
	case *rsa.PublicKey:
		n := k.N.BitLen()
		return n >= 2048 && n <= 8192
	}
	return false
}

// clock is a settable clock.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.Set(t)
	return c
}

func (c *clock) Now() time.Time  { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// isEd25519OrSmallRSA: keys the agent policy allows and the intermediate
// policy does not.
func isEd25519OrSmallRSA(pub crypto.PublicKey) bool {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return true
	case *rsa.PublicKey:
		return k.N.BitLen() < 3072
	}
	return false
}
