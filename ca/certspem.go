package ca

import (
	"crypto/x509"
	"encoding/base64"
)

// PEM armour of a CERTIFICATE block, as encoding/pem writes it.
const (
	pemCertHeader = "-----BEGIN CERTIFICATE-----\n"
	pemCertFooter = "-----END CERTIFICATE-----\n"
	// pemLineBytes is the DER that makes one 64-character base64 line.
	pemLineBytes = 48
)

// CertsPEM encodes certificates as CERTIFICATE blocks (nil ones skipped),
// byte for byte as encoding/pem does, into one buffer of the exact size:
// every Renew answer carries the leaf, the chain and the roots, and
// pem.EncodeToMemory's streaming encoder and growing buffers were 18 % of
// the bytes BenchmarkRenew allocated (issue 31).
func CertsPEM(certs ...*x509.Certificate) []byte {
	n := 0
	for _, c := range certs {
		if c != nil {
			n += certPEMLen(len(c.Raw))
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]byte, 0, n)
	for _, c := range certs {
		if c != nil {
			out = appendCertPEM(out, c.Raw)
		}
	}
	return out
}

// certPEMLen is the length of the CERTIFICATE block of der.
func certPEMLen(der int) int {
	lines := (der + pemLineBytes - 1) / pemLineBytes
	return len(pemCertHeader) + base64.StdEncoding.EncodedLen(der) + lines + len(pemCertFooter)
}

// appendCertPEM appends der's CERTIFICATE block to out: base64 in lines of
// 64 characters, each ended by a newline.
func appendCertPEM(out, der []byte) []byte {
	out = append(out, pemCertHeader...)
	for len(der) > 0 {
		line := der[:min(len(der), pemLineBytes)]
		out = base64.StdEncoding.AppendEncode(out, line)
		out = append(out, '\n')
		der = der[len(line):]
	}
	return append(out, pemCertFooter...)
}
