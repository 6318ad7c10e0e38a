package catest

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	zx509 "github.com/zmap/zcrypto/x509"
	"github.com/zmap/zlint/v3"
	"github.com/zmap/zlint/v3/lint"
)

// LintSources are the zlint sources Lint checks: the standards every
// X.509 certificate must meet, whoever trusts it.
//
//   - RFC 5280 (the certificate profile), RFC 3279, RFC 5480 and RFC 8813
//     (algorithm and key encodings), RFC 5891 (internationalized names).
//   - Community: zlint's own checks of well-formedness that no standard
//     spells out (printable subjects, DN and SAN encodings, RSA key
//     sanity).
//
// Left out, because they regulate the public web PKI and the certificates
// here are private, trusted only by Relaymesh servers, agents and Istio
// meshes that pin their roots: the CA/Browser Forum's Baseline Requirements
// (CABF_BR: AIA, CRL distribution points, certificate policies, 398-day
// TLS lifetime, subject rules for publicly trusted server certificates),
// its EV and S/MIME guidelines, the Mozilla and Apple root store
// policies, and ETSI's rules for EU qualified certificates.
var LintSources = lint.SourceList{
	lint.RFC5280, lint.RFC3279, lint.RFC5480, lint.RFC8813, lint.RFC5891,
	lint.Community,
}

// lintExceptions are lints of LintSources that Lint does not fail on, each
// with the reason. Keep it empty unless a lint is wrong for these
// certificates; fix the templates instead.
var lintExceptions = map[string]string{}

var lintRegistry = sync.OnceValues(func() (lint.Registry, error) {
	return lint.GlobalRegistry().Filter(lint.FilterOptions{IncludeSources: LintSources})
})

// Lint runs zlint's lints of LintSources on cert and fails the test for
// every error or fatal finding (warnings and notices are logged when the
// test is verbose, not failed).
func Lint(t testing.TB, cert *x509.Certificate) {
	t.Helper()
	if err := LintErrors(cert); err != nil {
		t.Errorf("catest: zlint: %s: %v", lintName(cert), err)
	}
}

// LintErrors is Lint without a test: it returns an error listing every
// error or fatal finding of the lints of LintSources, or nil.
func LintErrors(cert *x509.Certificate) error {
	if cert == nil {
		return fmt.Errorf("no certificate")
	}
	reg, err := lintRegistry()
	if err != nil {
		return fmt.Errorf("filter lints: %w", err)
	}
	zc, err := zx509.ParseCertificate(cert.Raw)
	if err != nil {
		return fmt.Errorf("zcrypto cannot parse the certificate: %w", err)
	}
	rs := zlint.LintCertificateEx(zc, reg)
	var findings []string
	for name, r := range rs.Results {
		if r.Status < lint.Error {
			continue
		}
		if _, ok := lintExceptions[name]; ok {
			continue
		}
		f := fmt.Sprintf("%s (%s, %s)", name, r.Status, r.LintMetadata.Source)
		if r.Details != "" {
			f += ": " + r.Details
		}
		findings = append(findings, f)
	}
	if len(findings) == 0 {
		return nil
	}
	slices.Sort(findings)
	return fmt.Errorf("%d finding(s):\n\t%s", len(findings), strings.Join(findings, "\n\t"))
}

// LintFindings returns every finding of at least level min (such as
// lint.Warn) of the lints of sources (all registered lints for none), as
// "name (level, source)" sorted by name: for tests and notes that
// report what other sources would say.
func LintFindings(cert *x509.Certificate, min lint.LintStatus, sources ...lint.LintSource) ([]string, error) {
	reg := lint.GlobalRegistry()
	if len(sources) > 0 {
		var err error
		if reg, err = reg.Filter(lint.FilterOptions{IncludeSources: sources}); err != nil {
			return nil, err
		}
	}
	zc, err := zx509.ParseCertificate(cert.Raw)
	if err != nil {
		return nil, err
	}
	var out []string
	for name, r := range zlint.LintCertificateEx(zc, reg).Results {
		if r.Status >= min {
			out = append(out, fmt.Sprintf("%s (%s, %s)", name, r.Status, r.LintMetadata.Source))
		}
	}
	slices.Sort(out)
	return out, nil
}

func lintName(c *x509.Certificate) string {
	if c == nil {
		return "nil certificate"
	}
	return fmt.Sprintf("certificate %q (serial %x)", c.Subject.String(), c.SerialNumber)
}
