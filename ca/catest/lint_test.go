package catest_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zmap/zlint/v3/lint"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
)

// TestLintFailsOnErrors: LintErrors reports error-level findings of the
// checked sources, on certificates made to break them, and passes a
// well-formed one.
func TestLintFailsOnErrors(t *testing.T) {
	issuer := catest.NewRoot(t, catest.CAOptions{})
	key := catest.NewKey(t, catest.RSA2048)
	now := time.Now()
	leaf := func(mutate func(c *x509.Certificate)) *x509.Certificate {
		t.Helper()
		tmpl := &x509.Certificate{
			SerialNumber:          big128(t),
			Subject:               pkix.Name{Organization: []string{"relaymesh"}},
			URIs:                  []*url.URL{catest.AgentID.URL()},
			NotBefore:             now.Add(-time.Minute),
			NotAfter:              now.Add(time.Hour),
			KeyUsage:              x509.KeyUsageDigitalSignature,
			ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			BasicConstraintsValid: true,
		}
		mutate(tmpl)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer.Cert, key.Public(), issuer.Key)
		require.NoError(t, err)
		c, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		return c
	}
	tests := []struct {
		name   string
		mutate func(c *x509.Certificate)
		want   string // "" for no finding
	}{
		{"well-formed", func(*x509.Certificate) {}, ""},
		// The finding that made agent certificates digitalSignature-only.
		{"keyEncipherment with clientAuth", func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageKeyEncipherment }, "e_key_usage_and_extended_key_usage_inconsistent"},
		{"keyCertSign on a leaf", func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCertSign }, "e_ext_key_usage_cert_sign_without_ca"},
		{"no subject and no SAN", func(c *x509.Certificate) { c.Subject, c.URIs = pkix.Name{}, nil }, "e_subject_empty_without_san"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := catest.LintErrors(leaf(tt.mutate))
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// TestLintSources: the sources Lint leaves out do flag our certificates
// (they are about the public web PKI), and Lint does not. The findings are
// logged: they are the list in docs/design/2026-11-22-signer-backends.md.
func TestLintSources(t *testing.T) {
	root, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "vm1"})
	require.NoError(t, err)
	s, err := root.Signer(time.Now())
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP256)
	server, err := a.IssueServer(context.Background(), key.Public(), []string{"relay.example.test"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	agent, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.NoError(t, err)
	icsr, err := ca.ParseIntermediateCSR(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	inter, err := a.IssueIntermediate(context.Background(), icsr, catest.Intermediate)
	require.NoError(t, err)

	left := []lint.LintSource{lint.CABFBaselineRequirements, lint.CABFEVGuidelines, lint.CABFSMIMEBaselineRequirements, lint.MozillaRootStorePolicy, lint.AppleRootStorePolicy, lint.EtsiEsi}
	for name, c := range map[string]*x509.Certificate{"server": server.Certificate, "agent": agent.Certificate, "intermediate": inter.Certificate, "mesh root": root.Cert} {
		catest.Lint(t, c)
		findings, err := catest.LintFindings(c, lint.Error, left...)
		require.NoError(t, err)
		t.Logf("%s: error-level findings of the sources Lint leaves out: %q", name, findings)
		warnings, err := catest.LintFindings(c, lint.Notice, catest.LintSources...)
		require.NoError(t, err)
		t.Logf("%s: notices and warnings of the checked sources: %q", name, warnings)
	}
	findings, err := catest.LintFindings(server.Certificate, lint.Error, lint.CABFBaselineRequirements)
	require.NoError(t, err)
	assert.NotEmpty(t, findings, "the Baseline Requirements flag a private server certificate (no AIA, no policies)")
}

func big128(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	require.NoError(t, err)
	return n.Add(n, big.NewInt(1))
}
