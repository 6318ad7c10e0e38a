//go:build !cgo

package hsm_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/hsm"
)

// TestNoCgoRefusesEveryToken: a binary built without cgo (the static image)
// compiles this package, and New refuses a complete config with ErrNoCgo,
// before it reads a file or loads a module; a bad config is still reported
// as such. Run with CGO_ENABLED=0 (`make test` does; -race needs cgo, so
// this one runs without it).
func TestNoCgoRefusesEveryToken(t *testing.T) {
	const pin = "pin-nocgo-7d41a2"
	cfg := hsm.Config{ModulePath: "/nonexistent/libsofthsm2.so", TokenLabel: "t", KeyLabel: "k", PIN: []byte(pin),
		ChainFile: "/nonexistent/chain.pem", RootsFile: "/nonexistent/roots.pem"}
	_, err := hsm.New(context.Background(), cfg)
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	require.ErrorIs(t, err, hsm.ErrNoCgo)
	require.Contains(t, err.Error(), "built without cgo")
	require.NotContains(t, err.Error(), pin)
	require.NotContains(t, err.Error(), "/nonexistent", "refused before any file is read")

	cfg.TokenLabel = ""
	_, err = hsm.New(context.Background(), cfg)
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	require.NotErrorIs(t, err, hsm.ErrNoCgo)
	require.Contains(t, err.Error(), "tokenLabel: required")
}
