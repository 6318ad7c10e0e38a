//go:build tools

// Package pki pins the external certificate authorities that the CA signer
// back-end tests run for real: cfssl (`cfssl serve`) and step-ca. It is never
// compiled into Relaymesh; the blank imports only keep go.mod honest.
package pki

import (
	_ "github.com/cloudflare/cfssl/cmd/cfssl"
	_ "github.com/smallstep/certificates/cmd/step-ca"
)
