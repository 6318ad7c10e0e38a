package ca_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

// BenchmarkIssueAgent is the full server-side cost of one agent
// certificate: ParseCSR (PEM, signature check, policy) and IssueAgent
// (template, sign, validate: re-check of the CSR, signature and chain
// verification). CA and agent keys are ECDSA P-256.
func BenchmarkIssueAgent(b *testing.B) {
	s, err := newRelayCA(b, ca.GenerateConfig{}).Signer(time.Now())
	if err != nil {
		b.Fatal(err)
	}
	a, err := ca.New(ca.Config{Signer: s})
	if err != nil {
		b.Fatal(err)
	}
	// Distinct requests, as a fleet renewing sends (ECDSA signatures are
	// randomized): more of them than the server remembers as verified.
	key := catest.NewKey(b, catest.ECDSAP256)
	csrs := make([][]byte, 8192)
	for i := range csrs {
		csrs[i] = catest.NewCSRPEM(b, key, nil)
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		csrPEM := csrs[i%len(csrs)]
		i++
		csr, err := ca.ParseCSR(csrPEM)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.IssueAgent(ctx, csr, catest.AgentID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
}

// BenchmarkRawCreateCertificate is the baseline for BenchmarkIssueAgent:
// x509.CreateCertificate alone with an equivalent template, the same CA
// and the same key types, and no checks.
func BenchmarkRawCreateCertificate(b *testing.B) {
	r := newRelayCA(b, ca.GenerateConfig{})
	pub := catest.NewKey(b, catest.ECDSAP256).Public()
	serial := new(big.Int).Lsh(big.NewInt(1), 128)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"relaymesh"}},
		URIs:                  []*url.URL{catest.AgentID.URL()},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := x509.CreateCertificate(rand.Reader, tmpl, r.Issuer, pub, r.IssuerKey); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
}

// BenchmarkSignParallel is the in-memory baseline of the signer back ends'
// BenchmarkSign (ca/hsm, ca/cfsslca, ca/stepca): IssueAgent from parallel
// callers with a parsed CSR, CA and agent keys ECDSA P-256.
func BenchmarkSignParallel(b *testing.B) {
	s, err := newRelayCA(b, ca.GenerateConfig{}).Signer(time.Now())
	if err != nil {
		b.Fatal(err)
	}
	a, err := ca.New(ca.Config{Signer: s})
	if err != nil {
		b.Fatal(err)
	}
	csr, err := ca.ParseCSR(catest.NewCSR(b, catest.NewKey(b, catest.ECDSAP256), nil))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := a.IssueAgent(context.Background(), csr, catest.AgentID); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
}

// BenchmarkIssueIntermediate is the in-memory baseline of the signer back
// ends' BenchmarkIssueIntermediate: one mesh intermediate (P-256 key) from
// a generated mesh root (P-256), template, sign and full validation.
func BenchmarkIssueIntermediate(b *testing.B) {
	r, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "vm1"})
	if err != nil {
		b.Fatal(err)
	}
	s, err := r.Signer(time.Now())
	if err != nil {
		b.Fatal(err)
	}
	a, err := ca.New(ca.Config{Signer: s})
	if err != nil {
		b.Fatal(err)
	}
	csr, err := ca.ParseIntermediateCSR(catest.NewCSR(b, catest.NewKey(b, catest.ECDSAP256), nil))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.IssueIntermediate(context.Background(), csr, catest.Intermediate); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
}
