package ca_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/relaymesh/relaymesh/ca"
)

// pemReference is what CertsPEM must equal: encoding/pem's own blocks.
func pemReference(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		if c != nil {
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
	}
	return out
}

func TestCertsPEMEqualsEncodingPEM(t *testing.T) {
	// Every DER length around the line boundaries, and an empty one.
	var certs []*x509.Certificate
	for n := range 200 {
		der := make([]byte, n)
		for i := range der {
			der[i] = byte(i*31 + n)
		}
		certs = append(certs, &x509.Certificate{Raw: der})
	}
	for _, c := range certs {
		if got, want := ca.CertsPEM(c), pemReference(c); !bytes.Equal(got, want) {
			t.Fatalf("DER of %d bytes:\n got %q\nwant %q", len(c.Raw), got, want)
		}
	}
	if got, want := ca.CertsPEM(certs...), pemReference(certs...); !bytes.Equal(got, want) {
		t.Fatal("all lengths in one: CertsPEM differs from encoding/pem")
	}
	if got, want := ca.CertsPEM(nil, certs[7], nil, certs[150]), pemReference(certs[7], certs[150]); !bytes.Equal(got, want) {
		t.Fatal("nil certificates are not skipped as before")
	}
	if got := ca.CertsPEM(); got != nil {
		t.Fatalf("no certificates: got %q, want nil", got)
	}
	if got := ca.CertsPEM(nil); got != nil {
		t.Fatalf("only a nil certificate: got %q, want nil", got)
	}
	// A real chain round-trips through the decoder.
	chain := newTestAuthority(t).Chain()
	blocks := ca.CertsPEM(chain...)
	for i, c := range chain {
		var b *pem.Block
		b, blocks = pem.Decode(blocks)
		if b == nil || b.Type != "CERTIFICATE" || !bytes.Equal(b.Bytes, c.Raw) {
			t.Fatalf("certificate %d does not decode back to its DER", i)
		}
	}
	if len(blocks) != 0 {
		t.Fatalf("%d bytes after the last block", len(blocks))
	}
}

func FuzzCertsPEM(f *testing.F) {
	f.Add([]byte{}, []byte{1})
	f.Add(bytes.Repeat([]byte{0xff}, 48), bytes.Repeat([]byte{0}, 49))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ca1, ca2 := &x509.Certificate{Raw: a}, &x509.Certificate{Raw: b}
		if got, want := ca.CertsPEM(ca1, nil, ca2), pemReference(ca1, ca2); !bytes.Equal(got, want) {
			t.Fatalf("CertsPEM differs from encoding/pem for DER of %d and %d bytes", len(a), len(b))
		}
	})
}

// BenchmarkCertsPEM compares CertsPEM with encoding/pem on a CA chain.
func BenchmarkCertsPEM(b *testing.B) {
	chain := newTestAuthority(b).Chain()
	for _, enc := range []struct {
		name string
		f    func(...*x509.Certificate) []byte
	}{{"CertsPEM", ca.CertsPEM}, {"encoding-pem", pemReference}} {
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = enc.f(chain...)
			}
		})
	}
}
