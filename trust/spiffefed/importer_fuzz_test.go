package spiffefed_test

import (
	"bytes"
	"crypto/x509"
	"testing"

	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
)

// FuzzAcceptForeignBundle: whatever a peer sends, Accept never panics,
// and a bundle it accepts is of the trust domain asked for, holds 1 to
// MaxRoots X.509 authorities, each a self-signed CA, and (with a last
// bundle) does not go back in sequence nor change roots at the same
// sequence.
func FuzzAcceptForeignBundle(f *testing.F) {
	root, other := makeRoot(f, "seed root"), makeRoot(f, "seed other")
	leaf, _ := root.svid(f, "spiffe://spire.example/workload")
	f.Add(bundleDoc(f, peerTD, 6, root.cert), true)
	f.Add(bundleDoc(f, peerTD, 5, root.cert, other.cert), true)
	f.Add(bundleDoc(f, peerTD, 0, root.cert), false)
	f.Add(bundleDoc(f, peerTD, 6, root.cert, leaf[0]), false)
	f.Add(bundleDoc(f, peerTD, 6, root.intermediate(f, "spire.example").cert), false)
	f.Add([]byte("\x00garbage<html>"), false)
	f.Add([]byte(`{}`), false)
	f.Add([]byte(`{"keys":[]}`), true)
	last := acceptedBundle(f, 5, root.cert)
	lastSeq, _ := last.SequenceNumber()

	f.Fuzz(func(t *testing.T, body []byte, withLast bool) {
		l := last
		if !withLast {
			l = nil
		}
		acceptInvariants(t, l, lastSeq, body)
	})
}

// FuzzAcceptForeignBundleDocument is FuzzAcceptForeignBundle seeded with
// documents that carry no parsable certificate: the JSON and JWK layer
// (key types, uses, sequence and refresh hint, sizes). Inputs with real
// certificates run about 2 a second under the fuzzer's instrumentation
// (signature checks in instrumented crypto); these run thousands.
func FuzzAcceptForeignBundleDocument(f *testing.F) {
	f.Add([]byte(`{"keys":[]}`))
	f.Add([]byte(`{"keys":[{"kty":"EC","use":"x509-svid","crv":"P-256","x5c":["AAAA"]}],"spiffe_sequence":3,"spiffe_refresh_hint":300}`))
	f.Add([]byte(`{"keys":[{"kty":"EC","use":"jwt-svid","kid":"k","crv":"P-256","x":"AA","y":"AA"}],"spiffe_sequence":18446744073709551615}`))
	f.Add([]byte(`{"keys":[{"kty":"RSA","use":"wit-svid","n":"AQAB","e":"AQAB"}],"spiffe_refresh_hint":-1}`))
	f.Add([]byte(`{"keys":null,"spiffe_sequence":"1"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		acceptInvariants(t, nil, 0, body)
	})
}

// acceptInvariants: whatever body is, Accept never panics, a refusal is a
// bounded printable line, and a bundle it accepts is of the trust domain
// asked for, holds 1 to MaxRoots X.509 authorities, each a self-signed CA
// naming no other trust domain, and (with last) does not go back in
// sequence nor change roots at the same sequence.
func acceptInvariants(t *testing.T, l *spiffebundle.Bundle, lastSeq uint64, body []byte) {
	t.Helper()
	b, err := spiffefed.Accept(peerTD, l, body)
	if err != nil {
		if b != nil {
			t.Fatalf("a refusal with a bundle: %v", err)
		}
		// What a refusal says is bounded and printable, whatever came.
		msg := err.Error()
		if len(msg) > 600 {
			t.Fatalf("a refusal of %d bytes", len(msg))
		}
		for _, c := range []byte(msg) {
			if c < 0x20 || c > 0x7e {
				t.Fatalf("a refusal with byte %#x: %q", c, msg)
			}
		}
		return
	}
	if b == nil {
		t.Fatal("no bundle and no error")
	}
	if b.TrustDomain() != peerTD {
		t.Fatalf("a bundle of %s", b.TrustDomain())
	}
	roots := b.X509Authorities()
	if len(roots) < 1 || len(roots) > spiffefed.MaxRoots {
		t.Fatalf("%d X.509 authorities accepted", len(roots))
	}
	for _, r := range roots {
		if !r.IsCA || !r.BasicConstraintsValid || !bytes.Equal(r.RawIssuer, r.RawSubject) || r.CheckSignatureFrom(r) != nil {
			t.Fatalf("an authority that is not a self-signed CA: %s", r.Subject)
		}
		for _, u := range r.URIs {
			if u.Scheme == "spiffe" && u.Host != peerTD.Name() {
				t.Fatalf("a root naming trust domain %q accepted for %s", u.Host, peerTD.Name())
			}
		}
	}
	if l == nil {
		return
	}
	seq, ok := b.SequenceNumber()
	switch {
	case !ok, seq < lastSeq:
		t.Fatalf("sequence %d (present %v) accepted after %d", seq, ok, lastSeq)
	case seq == lastSeq && !sameRoots(roots, l.X509Authorities()):
		t.Fatalf("other roots accepted at the same sequence %d", seq)
	}
}

// sameRoots reports whether a and b hold the same certificates.
func sameRoots(a, b []*x509.Certificate) bool {
	in := func(c *x509.Certificate, set []*x509.Certificate) bool {
		for _, s := range set {
			if s.Equal(c) {
				return true
			}
		}
		return false
	}
	for _, c := range a {
		if !in(c, b) {
			return false
		}
	}
	for _, c := range b {
		if !in(c, a) {
			return false
		}
	}
	return true
}
