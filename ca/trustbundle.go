package ca

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
)

// Limits of a relay trust bundle (the roots an agent pins): during a root
// rotation it holds two roots; anything much larger is hostile.
const (
	MaxTrustBundleBytes = 64 << 10
	MaxTrustBundleRoots = 4
)

// ErrTrustBundle marks a trust bundle that is malformed, oversized or holds
// something other than distinct self-signed CA certificates.
var ErrTrustBundle = errors.New("invalid relay trust bundle")

// RootFingerprint names a root: hex SHA-256 of its DER certificate.
func RootFingerprint(c *x509.Certificate) string {
	h := sha256.Sum256(c.Raw)
	return hex.EncodeToString(h[:])
}

// TrustBundleFingerprint is BundleFingerprint of roots.
func TrustBundleFingerprint(roots []*x509.Certificate) string {
	fps := make([]string, len(roots))
	for i, r := range roots {
		fps[i] = RootFingerprint(r)
	}
	return BundleFingerprint(fps)
}

// ParseTrustBundle parses a relay trust bundle: PEM CERTIFICATE blocks
// only (no headers, nothing else but whitespace between or after them), at
// most MaxTrustBundleBytes and MaxTrustBundleRoots, each a distinct
// self-signed CA certificate whose signature verifies. Every error wraps
// ErrTrustBundle; it never echoes the input.
func ParseTrustBundle(b []byte) ([]*x509.Certificate, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrTrustBundle, fmt.Sprintf(format, a...))
	}
	if len(b) > MaxTrustBundleBytes {
		return nil, bad("%d bytes, more than %d", len(b), MaxTrustBundleBytes)
	}
	var roots []*x509.Certificate
	rest := b
	for {
		rest = bytes.TrimLeft(rest, " \t\r\n")
		if len(rest) == 0 {
			break
		}
		block, next := pem.Decode(rest)
		if block == nil {
			return nil, bad("data that is not PEM after certificate %d", len(roots))
		}
		rest = next
		if block.Type != "CERTIFICATE" || len(block.Headers) > 0 {
			return nil, bad("block %d is not a plain CERTIFICATE block (type or headers)", len(roots)+1)
		}
		if len(roots) == MaxTrustBundleRoots {
			return nil, bad("more than %d roots", MaxTrustBundleRoots)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, bad("certificate %d: %v", len(roots)+1, err)
		}
		switch {
		case !c.BasicConstraintsValid || !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0:
			return nil, bad("%s is not a CA certificate (CA, certSign)", describe(c))
		case !bytes.Equal(c.RawIssuer, c.RawSubject):
			return nil, bad("%s is not self-signed: not a root", describe(c))
		}
		if err := c.CheckSignatureFrom(c); err != nil {
			return nil, bad("%s: its self-signature does not verify: %v", describe(c), err)
		}
		for _, r := range roots {
			if r.Equal(c) {
				return nil, bad("%s is listed twice", describe(c))
			}
		}
		roots = append(roots, c)
	}
	if len(roots) == 0 {
		return nil, bad("no root")
	}
	return roots, nil
}
