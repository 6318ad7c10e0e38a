package ca_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

func TestParseCSRAcceptsAllowedKeys(t *testing.T) {
	for _, kt := range catest.AllowedKeyTypes {
		t.Run(string(kt), func(t *testing.T) {
			key := catest.NewKey(t, kt)
			der := catest.NewCSR(t, key, nil)
			for name, in := range map[string][]byte{
				"DER":                   der,
				"PEM":                   catest.CSRPEM(der),
				"PEM with white space":  append(append([]byte("\n  \r\n"), catest.CSRPEM(der)...), "\n\n\t"...),
				"NEW CERTIFICATE label": pem.EncodeToMemory(&pem.Block{Type: "NEW CERTIFICATE REQUEST", Bytes: der}),
			} {
				csr, err := ca.ParseCSR(in)
				require.NoError(t, err, name)
				assert.True(t, keyEqual(key.Public(), csr.PublicKey), name)
			}
		})
	}
	t.Run("basicConstraints CA:false request", func(t *testing.T) {
		der := catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), &x509.CertificateRequest{
			ExtraExtensions: []pkix.Extension{catest.BasicConstraintsExtension(t, false)},
		})
		_, err := ca.ParseCSR(der)
		assert.NoError(t, err)
	})
	t.Run("digitalSignature key usage request", func(t *testing.T) {
		der := catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), &x509.CertificateRequest{
			ExtraExtensions: []pkix.Extension{catest.KeyUsageExtension(t, x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment)},
		})
		_, err := ca.ParseCSR(der)
		assert.NoError(t, err)
	})
}

// TestParseCSRRejects covers hostile and broken requests. Each must fail
// with its sentinel and a message that says why; where x509 alone would
// parse the request, IssueAgent must refuse it too (it re-checks requests
// that did not come through ParseCSR).
func TestParseCSRRejects(t *testing.T) {
	p256 := catest.NewKey(t, catest.ECDSAP256)
	good := catest.NewCSR(t, p256, nil)
	goodPEM := catest.CSRPEM(good)
	withExt := func(ext ...pkix.Extension) []byte {
		return catest.NewCSR(t, p256, &x509.CertificateRequest{ExtraExtensions: ext})
	}
	root := catest.NewRoot(t, catest.CAOptions{})

	tests := []struct {
		name    string
		in      []byte
		want    error
		wantMsg string
	}{
		{"bad signature", catest.TamperSignature(good), ca.ErrInvalidCSR, "self-signature"},
		{"bad signature (PEM)", catest.CSRPEM(catest.TamperSignature(good)), ca.ErrInvalidCSR, "self-signature"},
		{"requests CA:true", withExt(catest.BasicConstraintsExtension(t, true)), ca.ErrInvalidCSR, "CA:true"},
		{"requests keyCertSign", withExt(catest.KeyUsageExtension(t, x509.KeyUsageDigitalSignature|x509.KeyUsageCertSign)), ca.ErrInvalidCSR, "keyCertSign"},
		{"requests cRLSign", withExt(catest.KeyUsageExtension(t, x509.KeyUsageCRLSign)), ca.ErrInvalidCSR, "cRLSign"},
		{"malformed basicConstraints request", withExt(pkix.Extension{Id: []int{2, 5, 29, 19}, Value: []byte{0x01, 0x02}}), ca.ErrInvalidCSR, "malformed basicConstraints"},
		{"malformed keyUsage request", withExt(pkix.Extension{Id: []int{2, 5, 29, 15}, Value: []byte{0x30, 0x00}}), ca.ErrInvalidCSR, "malformed keyUsage"},
		{"SHA-1 self-signature", catest.NewCSR(t, p256, &x509.CertificateRequest{SignatureAlgorithm: x509.ECDSAWithSHA1}), ca.ErrInvalidCSR, "signature algorithm"},
		{"RSA-1024", catest.NewCSR(t, catest.NewKey(t, catest.RSA1024), nil), ca.ErrKeyPolicy, "1024 bits"},
		{"P-224", catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP224), nil), ca.ErrKeyPolicy, "P-224"},
		{"P-521", catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP521), nil), ca.ErrKeyPolicy, "P-521"},
		{"empty", nil, ca.ErrInvalidCSR, "empty"},
		{"oversized", append(bytes.Repeat([]byte(" "), ca.MaxCSRSize), goodPEM...), ca.ErrInvalidCSR, "at most 16384"},
		{"garbage bytes", []byte("definitely not a CSR"), ca.ErrInvalidCSR, ""},
		{"garbage PEM", []byte("-----BEGIN CERTIFICATE REQUEST-----\n!!!not base64!!!\n-----END CERTIFICATE REQUEST-----\n"), ca.ErrInvalidCSR, "malformed PEM"},
		{"PEM of garbage DER", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte("garbage")}), ca.ErrInvalidCSR, ""},
		{"two PEM blocks", append(goodPEM, goodPEM...), ca.ErrInvalidCSR, "2 PEM blocks"},
		{"broken block before a good one", append([]byte("-----BEGIN CERTIFICATE REQUEST-----\n"), goodPEM...), ca.ErrInvalidCSR, "2 PEM blocks"},
		{"trailing data after PEM", append(goodPEM, "trailing"...), ca.ErrInvalidCSR, "after the PEM block"},
		{"text before PEM", append([]byte("hello\n"), goodPEM...), ca.ErrInvalidCSR, ""},
		{"PEM headers", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: good}), ca.ErrInvalidCSR, "headers"},
		{"CERTIFICATE block", catest.CertsPEM(root.Cert), ca.ErrInvalidCSR, `"CERTIFICATE"`},
		{"certificate DER", root.Cert.Raw, ca.ErrInvalidCSR, ""},
		{"DER with trailing data", append(bytes.Clone(good), 0x00), ca.ErrInvalidCSR, ""},
		{"truncated DER", good[:len(good)/2], ca.ErrInvalidCSR, ""},
	}
	a := newTestAuthority(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csr, err := ca.ParseCSR(tt.in)
			require.ErrorIs(t, err, tt.want)
			assert.Nil(t, csr)
			assert.Contains(t, err.Error(), tt.wantMsg)
			for _, other := range []error{ca.ErrInvalidCSR, ca.ErrKeyPolicy} {
				if other != tt.want {
					assert.NotErrorIs(t, err, other)
				}
			}

			// A request x509 parses on its own must not be issued either.
			raw, perr := x509.ParseCertificateRequest(tt.in)
			if perr != nil {
				return
			}
			iss, err := a.IssueAgent(context.Background(), raw, catest.AgentID)
			assert.ErrorIs(t, err, tt.want, "IssueAgent re-checks the request")
			assert.Nil(t, iss)
		})
	}
}

// TestIssueAgentIgnoresRequestedSANs: whatever names a CSR asks for, the
// certificate carries only the SPIFFE ID the server chose.
func TestIssueAgentIgnoresRequestedSANs(t *testing.T) {
	key := catest.NewKey(t, catest.ECDSAP256)
	der := catest.NewCSR(t, key, &x509.CertificateRequest{
		Subject:        pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		DNSNames:       []string{"relay.example.com", "*.example.com"},
		IPAddresses:    []net.IP{net.IPv4(10, 0, 0, 1), net.IPv6loopback},
		URIs:           []*url.URL{{Scheme: "spiffe", Host: "relay.test", Path: "/cluster/other/agent"}, {Scheme: "https", Host: "evil.example"}},
		EmailAddresses: []string{"root@example.com"},
		ExtraExtensions: []pkix.Extension{
			catest.BasicConstraintsExtension(t, false),
			catest.KeyUsageExtension(t, x509.KeyUsageDigitalSignature),
		},
	})
	csr, err := ca.ParseCSR(catest.CSRPEM(der))
	require.NoError(t, err, "requested SANs are allowed in the CSR")
	assert.NotEmpty(t, csr.DNSNames, "the caller can see what was asked for")
	assert.Len(t, csr.URIs, 2)

	iss, err := newTestAuthority(t).IssueAgent(context.Background(), csr, catest.AgentID)
	require.NoError(t, err)
	catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)
	c := iss.Certificate
	assert.Equal(t, []string{catest.AgentID.String()}, urlStrings(c.URIs))
	assert.Empty(t, c.DNSNames)
	assert.Empty(t, c.IPAddresses)
	assert.Empty(t, c.EmailAddresses)
	assert.Equal(t, pkix.Name{Organization: []string{"relaymesh"}}.String(), c.Subject.String(), "subject is not copied")
}

func FuzzParseCSR(f *testing.F) {
	for _, kt := range append(append([]catest.KeyType{}, catest.AllowedKeyTypes...), catest.RefusedKeyTypes...) {
		der := catest.NewCSR(f, catest.NewKey(f, kt), &x509.CertificateRequest{DNSNames: []string{"a.example"}})
		f.Add(der)
		f.Add(catest.CSRPEM(der))
		f.Add(catest.TamperSignature(der))
		f.Add(der[:len(der)-7])
	}
	key := catest.NewKey(f, catest.ECDSAP256)
	ca1 := catest.NewCSR(f, key, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{catest.BasicConstraintsExtension(f, true)}})
	f.Add(ca1)
	f.Add(catest.NewCSR(f, key, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{catest.KeyUsageExtension(f, x509.KeyUsageCertSign)}}))
	f.Add(append(catest.CSRPEM(ca1), catest.CSRPEM(ca1)...))
	f.Add([]byte{})
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add([]byte{0x30, 0x82, 0xff, 0xff})

	f.Fuzz(func(t *testing.T, b []byte) {
		csr, err := ca.ParseCSR(b)
		if err != nil {
			if csr != nil {
				t.Fatal("a request was returned with an error")
			}
			if !errors.Is(err, ca.ErrInvalidCSR) && !errors.Is(err, ca.ErrKeyPolicy) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("accepted a request with a bad signature: %v", err)
		}
		if !allowedKey(csr.PublicKey) {
			t.Fatalf("accepted a %T key", csr.PublicKey)
		}
		if len(b) > ca.MaxCSRSize {
			t.Fatalf("accepted %d bytes", len(b))
		}
	})
}

func keyEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

func urlStrings(us []*url.URL) []string {
	var out []string
	for _, u := range us {
		out = append(out, u.String())
	}
	return out
}
