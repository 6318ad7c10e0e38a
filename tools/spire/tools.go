//go:build tools

// Package spire pins SPIRE (github.com/spiffe/spire), the SPIFFE reference
// implementation the federation tests run for real: a spire-server that
// federates with Relaymesh's bundle endpoint, and its agent. It is never
// compiled into Relaymesh; the blank imports only keep go.mod honest.
package spire

import (
	_ "github.com/spiffe/spire/cmd/spire-agent"
	_ "github.com/spiffe/spire/cmd/spire-server"
)
