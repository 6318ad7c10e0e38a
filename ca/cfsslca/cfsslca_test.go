package cfsslca_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/backend"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/ca/cfsslca"
)

// server is a running `cfssl serve` (catest.StartCFSSL).
type server = catest.CFSSL

// serverOptions shape a test cfssl.
type serverOptions = catest.CFSSLOptions

func startServer(t testing.TB, o serverOptions) *server { return catest.StartCFSSL(t, o) }

// config is a working Config for s.
func config(s *server) cfsslca.Config {
	return cfsslca.Config{
		URL:          s.URL,
		AuthKeyFile:  s.AuthKeyFile,
		Profiles:     cfsslca.Profiles{Intermediate: "relaymesh-intermediate"},
		ChainFile:    s.ChainFile,
		RootsFile:    s.RootsFile,
		TLSRootsFile: s.TLSRootsFile,
	}
}

func newSigner(t testing.TB, cfg cfsslca.Config) ca.Signer {
	t.Helper()
	s, err := cfsslca.New(context.Background(), cfg)
	require.NoError(t, err)
	return s
}

func TestSignerConformance(t *testing.T) {
	srv := startServer(t, serverOptions{})
	catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
		return newSigner(t, config(srv))
	})
	log := srv.Proc.Log(t)
	assertNoSecret(t, log, srv.AuthKeyHex, "cfssl's log")
	// What TestIntermediates looks for to see that nothing was signed.
	assert.Contains(t, log, "signed certificate with serial number")
}

func TestHTTPSWithPinnedRoot(t *testing.T) {
	srv := startServer(t, serverOptions{HTTPS: true})
	s := newSigner(t, config(srv))
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP256)
	iss, err := a.IssueAgent(context.Background(), parseCSR(t, catest.NewCSR(t, key, nil)), catest.AgentID)
	require.NoError(t, err)
	catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)

	// The relay roots do not vouch for cfssl's TLS certificate, and
	// nothing else is trusted.
	cfg := config(srv)
	cfg.TLSRootsFile = ""
	_, err = cfsslca.New(context.Background(), cfg)
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	assert.ErrorContains(t, err, "certificate signed by unknown authority")
}

// TestNewRejects: every misconfiguration fails at start, clearly, and
// without the auth key in the error or the log.
func TestNewRejects(t *testing.T) {
	srv := startServer(t, serverOptions{})
	other := startServer(t, serverOptions{})
	badUsages := startServer(t, serverOptions{ClientUsages: []string{"digital signature", "key encipherment", "client auth"}})
	badIntermediate := startServer(t, serverOptions{IntermediateUsages: []string{"digital signature", "cert sign", "crl sign"}})
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	wrongKey := write("wrong.key", strings.Repeat("ab", 32))
	notHex := write("nothex.key", "zz"+srv.AuthKeyHex[2:])
	short := write("short.key", "abcdef")
	closed := catest.FreeAddr(t)

	tests := []struct {
		name   string
		modify func(c *cfsslca.Config)
		is     error
		want   []string
	}{
		{"wrong auth key", func(c *cfsslca.Config) { c.AuthKeyFile = wrongKey }, cfsslca.ErrAuth, []string{"refused the authentication key"}},
		{"auth key of another server", func(c *cfsslca.Config) { c.AuthKeyFile = other.AuthKeyFile }, cfsslca.ErrAuth, []string{"refused the authentication key"}},
		{"auth key not hex", func(c *cfsslca.Config) { c.AuthKeyFile = notHex }, ca.ErrInvalidSigner, []string{"is not hex", notHex}},
		{"auth key too short", func(c *cfsslca.Config) { c.AuthKeyFile = short }, ca.ErrInvalidSigner, []string{"3 bytes, want at least 16"}},
		{"auth key variable unset", func(c *cfsslca.Config) { c.AuthKeyFile, c.AuthKeyEnv = "", "RELAYMESH_TEST_UNSET_KEY" }, ca.ErrInvalidSigner, []string{"RELAYMESH_TEST_UNSET_KEY is not set"}},
		{"server signs with another CA", func(c *cfsslca.Config) { c.ChainFile, c.RootsFile = other.ChainFile, other.RootsFile }, ca.ErrInvalidSigner, []string{"the server signs with certificate", "not with the first certificate of chainFile"}},
		{"unknown profile", func(c *cfsslca.Config) { c.Profiles.Server = "nope" }, ca.ErrInvalidSigner, []string{`profile "nope" (profiles.server)`}},
		{"profile with other usages", func(c *cfsslca.Config) { *c = config(badUsages); c.AuthKeyFile = srv.AuthKeyFile }, ca.ErrInvalidSigner, []string{`profile "relaymesh-client" (profiles.client) has usages`}},
		{"unknown intermediate profile", func(c *cfsslca.Config) { c.Profiles.Intermediate = "nope" }, ca.ErrInvalidSigner, []string{`profile "nope" (profiles.intermediate)`}},
		{"intermediate profile with other usages", func(c *cfsslca.Config) { *c = config(badIntermediate); c.AuthKeyFile = srv.AuthKeyFile }, ca.ErrInvalidSigner, []string{`profile "relaymesh-intermediate" (profiles.intermediate) has usages`, `want exactly ["cert sign" "crl sign"]`}},
		{"nobody listening", func(c *cfsslca.Config) { c.URL = "http://" + closed }, ca.ErrInvalidSigner, []string{"connection refused"}},
		{"https to a plain http server", func(c *cfsslca.Config) { c.URL = strings.Replace(c.URL, "http:", "https:", 1) }, ca.ErrInvalidSigner, []string{"HTTP response to HTTPS client"}},
		{"plain http off loopback", func(c *cfsslca.Config) { c.URL = "http://cfssl.example.test:8888" }, ca.ErrInvalidSigner, []string{"plain http is only allowed to a loopback host"}},
		{"wrong auth key in memory", func(c *cfsslca.Config) { c.AuthKeyFile, c.AuthKey = "", []byte(strings.Repeat("ab", 32)) }, cfsslca.ErrAuth, []string{"refused the authentication key"}},
		{"auth key in memory not hex", func(c *cfsslca.Config) { c.AuthKeyFile, c.AuthKey = "", []byte("zz"+srv.AuthKeyHex[2:]) }, ca.ErrInvalidSigner, []string{"is not hex", "field authKey"}},
		{"auth key in memory and in a file", func(c *cfsslca.Config) { c.AuthKey = []byte(srv.AuthKeyHex) }, ca.ErrInvalidSigner, []string{"authKeyFile, authKey: only one may be set"}},
		{"chain and roots in memory of another CA", func(c *cfsslca.Config) {
			o := inMemory(t, config(other))
			c.ChainFile, c.RootsFile, c.ChainPEM, c.RootsPEM = "", "", o.ChainPEM, o.RootsPEM
		}, ca.ErrInvalidSigner, []string{"the server signs with certificate", "not with the first certificate of chainPEM"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			cfg := config(srv)
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			tt.modify(&cfg)
			s, err := cfsslca.New(context.Background(), cfg)
			require.Error(t, err)
			t.Logf("error: %v", err)
			assert.Nil(t, s)
			assert.ErrorIs(t, err, tt.is)
			assert.ErrorIs(t, err, ca.ErrInvalidSigner)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			for _, k := range []string{srv.AuthKeyHex, other.AuthKeyHex, strings.Repeat("ab", 32), srv.AuthKeyHex[2:]} {
				assertNoSecret(t, err.Error(), k, "the error")
				assertNoSecret(t, logs.String(), k, "the log")
			}
		})
	}
	for _, s := range []*server{srv, other, badUsages, badIntermediate} {
		assertNoSecret(t, s.Proc.Log(t), s.AuthKeyHex, "cfssl's log")
	}
}

// inMemory is cfg with the auth key, chain and roots (and TLS roots, if
// any) in memory instead of in files, the way a caller holding a
// Kubernetes Secret passes them.
func inMemory(t testing.TB, cfg cfsslca.Config) cfsslca.Config {
	t.Helper()
	read := func(p string) []byte {
		if p == "" {
			return nil
		}
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return b
	}
	cfg.AuthKey, cfg.ChainPEM, cfg.RootsPEM, cfg.TLSRootsPEM = read(cfg.AuthKeyFile), read(cfg.ChainFile), read(cfg.RootsFile), read(cfg.TLSRootsFile)
	cfg.AuthKeyFile, cfg.ChainFile, cfg.RootsFile, cfg.TLSRootsFile = "", "", "", ""
	return cfg
}

// TestInMemoryConfig: the auth key, chain, roots and TLS roots work from
// memory as from files; without TLS roots of their own, the roots in
// memory are the only ones trusted for HTTPS.
func TestInMemoryConfig(t *testing.T) {
	srv := startServer(t, serverOptions{HTTPS: true})
	cfg := inMemory(t, config(srv))
	require.NotEmpty(t, cfg.TLSRootsPEM)
	catest.IssueIntermediate(t, newSigner(t, cfg))

	cfg.TLSRootsPEM = nil
	_, err := cfsslca.New(context.Background(), cfg)
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	assert.ErrorContains(t, err, "certificate signed by unknown authority")
	assertNoSecret(t, err.Error(), srv.AuthKeyHex, "the error")
}

// TestConfigValidateAlternatives: the auth key, chain, roots and TLS roots
// each come from exactly one place; Validate names the places that
// conflict or says what is missing, and never quotes the key.
func TestConfigValidateAlternatives(t *testing.T) {
	const authKey = "0123456789abcdef0123456789abcdef"
	valid := cfsslca.Config{URL: "http://127.0.0.1:8888", AuthKey: []byte(authKey), ChainPEM: []byte("c"), RootsPEM: []byte("r")}.Default()
	require.NoError(t, valid.Validate(), "everything in memory")
	assert.Equal(t, valid.RootsPEM, valid.TLSRootsPEM, "TLS roots default to the roots in memory")
	tests := []struct {
		name   string
		modify func(c *cfsslca.Config)
		want   []string
	}{
		{"auth key in memory and in a file", func(c *cfsslca.Config) { c.AuthKeyFile = "k" }, []string{"authKeyFile, authKey: only one may be set"}},
		{"auth key from all three", func(c *cfsslca.Config) { c.AuthKeyFile, c.AuthKeyEnv = "k", "K" }, []string{"authKeyFile, authKeyEnv, authKey: only one may be set"}},
		{"no auth key", func(c *cfsslca.Config) { c.AuthKey = nil }, []string{"authKeyFile, authKeyEnv: one is required (or authKey)"}},
		{"chain twice", func(c *cfsslca.Config) { c.ChainFile = "chain.pem" }, []string{"chainFile, chainPEM: only one may be set"}},
		{"roots twice", func(c *cfsslca.Config) { c.RootsFile = "roots.pem" }, []string{"rootsFile, rootsPEM: only one may be set"}},
		{"TLS roots twice", func(c *cfsslca.Config) { c.TLSRootsFile = "tls.pem" }, []string{"tlsRootsFile, tlsRootsPEM: only one may be set"}},
		{"no chain, no roots", func(c *cfsslca.Config) { c.ChainPEM, c.RootsPEM, c.TLSRootsPEM = nil, nil, nil }, []string{"chainFile: required (or chainPEM)", "rootsFile: required (or rootsPEM)", "tlsRootsFile: required (or tlsRootsPEM)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.modify(&cfg)
			err := cfg.Validate()
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assertNoSecret(t, err.Error(), authKey, "the error")
			_, err = cfsslca.New(context.Background(), cfg)
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assertNoSecret(t, err.Error(), authKey, "the error")
		})
	}
	t.Run("roots given twice are not reported for the TLS roots as well", func(t *testing.T) {
		cfg := valid
		cfg.TLSRootsPEM, cfg.RootsFile = nil, "roots.pem"
		err := cfg.Default().Validate()
		assert.ErrorContains(t, err, "rootsFile, rootsPEM: only one may be set")
		assert.NotContains(t, err.Error(), "tlsRoots")
	})
}

func TestConfigValidate(t *testing.T) {
	err := cfsslca.Config{URL: "ftp://x", AuthKeyFile: "a", AuthKeyEnv: "B", ValidityLeeway: time.Hour, Timeout: -1}.Validate()
	require.Error(t, err)
	for _, field := range []string{"url:", "authKeyFile, authKeyEnv: only one", "chainFile: required", "rootsFile: required", "validityLeeway:", "timeout:", "clock: required", "logger: required"} {
		assert.Contains(t, err.Error(), field)
	}
	for _, u := range []string{"http://127.0.0.1:8888", "http://localhost:1", "http://[::1]:8888", "https://cfssl.example.test"} {
		err := cfsslca.Config{URL: u, AuthKeyFile: "k", ChainFile: "c", RootsFile: "r"}.Default().Validate()
		assert.NoError(t, err, u)
	}
	for _, u := range []string{"http://10.0.0.1:8888", "http://cfssl.example.test", "https://user:pw@cfssl.example.test", "https://cfssl.example.test/?x=1", "cfssl.example.test:8888"} {
		err := cfsslca.Config{URL: u, AuthKeyFile: "k", ChainFile: "c", RootsFile: "r"}.Default().Validate()
		assert.ErrorContains(t, err, "url:", u)
	}
	cfg := cfsslca.Config{URL: "http://10.0.0.1:8888", AllowInsecureHTTP: true, AuthKeyFile: "k", ChainFile: "c", RootsFile: "r"}.Default()
	assert.NoError(t, cfg.Validate(), "the named opt-in allows plain http")
}

// TestRequestedNamesAreIgnored: the agent's CSR asks for a subject and
// names of its own; the profile's CSRWhitelist keeps them out, and the
// Authority would refuse them anyway.
func TestRequestedNamesAreIgnored(t *testing.T) {
	srv := startServer(t, serverOptions{})
	a, err := ca.New(ca.Config{Signer: newSigner(t, config(srv))})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr := parseCSR(t, catest.NewCSR(t, key, &x509.CertificateRequest{
		Subject:        pkix.Name{CommonName: "evil", Organization: []string{"evil corp"}, Country: []string{"XX"}},
		DNSNames:       []string{"evil.example.test"},
		EmailAddresses: []string{"evil@example.test"},
	}))
	iss, err := a.IssueAgentFor(context.Background(), csr, catest.AgentID, "reg-1")
	require.NoError(t, err)
	catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)
	assert.Equal(t, "OU=reg-1,O=relaymesh", iss.Certificate.Subject.String())
}

// TestCertificateOutlivingTheCAIsRefused: cfssl does not clamp to its
// CA's lifetime; the Authority refuses what it issues instead.
func TestCertificateOutlivingTheCAIsRefused(t *testing.T) {
	srv := startServer(t, serverOptions{CATTL: 3 * time.Hour})
	a, err := ca.New(ca.Config{Signer: newSigner(t, config(srv))})
	require.NoError(t, err)
	iss, err := a.IssueAgent(context.Background(), parseCSR(t, catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), nil)), catest.AgentID)
	require.ErrorIs(t, err, ca.ErrIssuance)
	assert.ErrorContains(t, err, "outlives")
	assert.Nil(t, iss)
}

// TestProfilesRequireAuthentication: the test configuration itself is
// safe: cfssl's unauthenticated sign endpoint refuses every profile.
func TestProfilesRequireAuthentication(t *testing.T) {
	srv := startServer(t, serverOptions{})
	csrPEM := catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), nil)
	for _, p := range []string{"", "relaymesh-client", "relaymesh-server"} {
		body, err := json.Marshal(map[string]any{"certificate_request": string(csrPEM), "profile": p, "hosts": []string{"x.example.test"}})
		require.NoError(t, err)
		resp, err := http.Post(srv.URL+"/api/v1/cfssl/sign", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		// cfssl does not even serve the endpoint when its profiles need
		// authentication; if it did, it would have to refuse.
		var out struct {
			Success bool `json:"success"`
		}
		signed := resp.StatusCode == http.StatusOK && json.Unmarshal(raw, &out) == nil && out.Success
		assert.False(t, signed, "profile %q signed without authentication: HTTP %d %s", p, resp.StatusCode, raw)
	}
}

func TestSignHonoursContext(t *testing.T) {
	srv := startServer(t, serverOptions{})
	s := newSigner(t, config(srv))
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	key := catest.NewKey(t, catest.ECDSAP256)
	tmpl := &x509.Certificate{Subject: pkix.Name{Organization: []string{"relaymesh"}}, DNSNames: []string{"a.example.test"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	c, err := s.(ca.RequestSigner).SignRequest(ctx, tmpl, parseCSR(t, catest.NewCSR(t, key, nil)))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Nil(t, c)

	_, err = cfsslca.New(ctx, config(srv))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestIntermediates: the intermediate profile's misconfigurations, and
// what cfssl would sign but the Authority refuses.
func TestIntermediates(t *testing.T) {
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := ca.ParseIntermediateCSR(catest.NewIntermediateCSR(t, key))
	require.NoError(t, err)
	issueFor := func(t *testing.T, cfg cfsslca.Config, csr *x509.CertificateRequest) (*ca.Issued, error) {
		t.Helper()
		a, err := ca.New(ca.Config{Signer: newSigner(t, cfg)})
		require.NoError(t, err)
		iss, err := a.IssueIntermediate(context.Background(), csr, catest.Intermediate)
		t.Logf("error: %v", err)
		return iss, err
	}
	issue := func(t *testing.T, cfg cfsslca.Config) (*ca.Issued, error) { return issueFor(t, cfg, csr) }

	t.Run("a request without name constraints is refused: cfssl cannot add them", func(t *testing.T) {
		srv := startServer(t, serverOptions{})
		bare, err := ca.ParseIntermediateCSR(catest.NewCSR(t, key, nil))
		require.NoError(t, err)
		iss, err := issueFor(t, config(srv), bare)
		require.ErrorIs(t, err, ca.ErrIssuance)
		assert.ErrorContains(t, err, "does not ask for the intermediate's name constraints")
		assert.Nil(t, iss)
	})
	t.Run("a profile that does not copy the request's extensions is refused", func(t *testing.T) {
		srv := startServer(t, serverOptions{NoNameConstraints: true})
		iss, err := issue(t, config(srv))
		require.ErrorIs(t, err, ca.ErrIssuance)
		assert.ErrorContains(t, err, `set "copy_extensions": true`)
		assert.Nil(t, iss)
	})

	t.Run("no intermediate profile configured", func(t *testing.T) {
		srv := startServer(t, serverOptions{})
		cfg := config(srv)
		cfg.Profiles.Intermediate = ""
		iss, err := issue(t, cfg)
		require.ErrorIs(t, err, ca.ErrIssuance)
		assert.ErrorContains(t, err, "set profiles.intermediate")
		assert.Nil(t, iss)
	})
	t.Run("a profile without ca_constraint issues a leaf, which is refused", func(t *testing.T) {
		srv := startServer(t, serverOptions{NoCAConstraint: true})
		iss, err := issue(t, config(srv))
		require.ErrorIs(t, err, ca.ErrIssuance)
		assert.ErrorContains(t, err, "is not a CA")
		assert.Nil(t, iss)
	})
	t.Run("a signing CA with pathLen 0 is refused before cfssl is asked", func(t *testing.T) {
		// cfssl checks its CA's path length only against what the request
		// asks for, not against its profile's ca_constraint: it would sign.
		srv := startServer(t, serverOptions{IssuingPathLenZero: true})
		iss, err := issue(t, config(srv))
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.ErrorContains(t, err, "cannot issue intermediates")
		assert.Nil(t, iss)
		assert.NotContains(t, srv.Proc.Log(t), "signed certificate with serial number", "nothing was signed")
	})
}

// BenchmarkIssueIntermediate is the cost of one mesh intermediate (P-256)
// signed by cfssl serve over loopback HTTP, through a ca.Authority.
func BenchmarkIssueIntermediate(b *testing.B) {
	srv := startServer(b, serverOptions{})
	a, err := ca.New(ca.Config{Signer: newSigner(b, config(srv))})
	require.NoError(b, err)
	csr, err := ca.ParseIntermediateCSR(catest.NewCSR(b, catest.NewKey(b, catest.ECDSAP256), nil))
	require.NoError(b, err)
	for b.Loop() {
		if _, err := a.IssueIntermediate(context.Background(), csr, catest.Intermediate); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
}

// BenchmarkSign is the cost of one agent certificate signed by cfssl serve
// over loopback HTTP, through a ca.Authority, from parallel callers.
func BenchmarkSign(b *testing.B) {
	srv := startServer(b, serverOptions{})
	a, err := ca.New(ca.Config{Signer: newSigner(b, config(srv))})
	require.NoError(b, err)
	csr := parseCSR(b, catest.NewCSR(b, catest.NewKey(b, catest.ECDSAP256), nil))
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

func parseCSR(t testing.TB, der []byte) *x509.CertificateRequest {
	t.Helper()
	csr, err := ca.ParseCSR(der)
	require.NoError(t, err)
	return csr
}

func assertNoSecret(t testing.TB, text, secret, where string) {
	t.Helper()
	if secret != "" && strings.Contains(text, secret) {
		t.Errorf("a secret leaked into %s", where)
	}
}

// TestRelayIssuerRenewalOnCFSSL: the relay CA on cfssl, as --ca-config
// gives it (backend.FileSigner). The remote's signing CA is replaced by a
// new one under the same root (here a second cfssl, the file pointing at
// it); the reload issues from the new one, an agent certificate of the
// old one stays accepted until it has expired, and then the old one is
// dropped.
func TestRelayIssuerRenewalOnCFSSL(t *testing.T) {
	first := startServer(t, serverOptions{})
	second := startServer(t, serverOptions{Root: first.Issuing.Root()})
	file := filepath.Join(t.TempDir(), "ca.yaml")
	write := func(s *server) {
		y := fmt.Sprintf("type: cfssl\ncfssl:\n  url: %s\n  authKeyFile: %s\n  chainFile: %s\n  rootsFile: %s\n", s.URL, s.AuthKeyFile, s.ChainFile, s.RootsFile)
		require.NoError(t, os.WriteFile(file, []byte(y), 0o600))
	}
	write(first)
	r, clock, _ := catest.RunFileRenewal(t, file, func(t *testing.T) { write(second) })
	_, isRequest := r.(ca.RequestSigner)
	assert.True(t, isRequest, "cfssl signs requests, through the FileSigner too")
	keep := catest.FileRenewalKeep

	// A reload that fails changes nothing: the signer keeps issuing from
	// and accepting what it had.
	current, accepted := r.Chain()[0], r.AcceptedIssuers()
	foreign := startServer(t, serverOptions{})
	good, err := os.ReadFile(file)
	require.NoError(t, err)
	for _, tc := range []struct{ name, file, want string }{
		{"not YAML", "{{{", "invalid CA back-end file"},
		{"another type", "type: stepca\nstepca:\n  url: https://x\n", "type changed from cfssl to stepca"},
		{"an inline auth key", string(good) + "  authKey: " + second.AuthKeyHex + "\n", "cfssl.authKey: a secret is never written"},
		{"a chain the server does not sign with", strings.Replace(string(good), second.ChainFile, first.ChainFile, 1), "not with the first certificate of chainFile"},
		{"a new root", fmt.Sprintf("type: cfssl\ncfssl:\n  url: %s\n  authKeyFile: %s\n  chainFile: %s\n  rootsFile: %s\n", foreign.URL, foreign.AuthKeyFile, foreign.ChainFile, foreign.RootsFile), "the roots changed"},
		{"a previous issuer of a foreign root", string(good) + "previousIssuersFile: " + foreign.ChainFile + "\n", "not signed by the relay CA's roots"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(file, []byte(tc.file), 0o600))
			changed, err := r.Reload(context.Background())
			require.Error(t, err)
			assert.False(t, changed)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), second.AuthKeyHex, "the auth key is not echoed")
			assert.True(t, r.Chain()[0].Equal(current), "still the same issuing CA")
			assert.Equal(t, accepted, r.AcceptedIssuers(), "still the same accepted issuing CAs")
		})
	}
	require.NoError(t, os.WriteFile(file, good, 0o600))
	changed, err := r.Reload(context.Background())
	require.NoError(t, err)
	assert.False(t, changed, "the file as it was: no change")

	// A replica that starts after the renewal knows the replaced issuing
	// CA only from previousIssuersFile: the operator lists it there.
	prev := filepath.Join(t.TempDir(), "previous.pem")
	require.NoError(t, os.WriteFile(prev, catest.CertsPEM(first.Issuing.Cert), 0o600))
	require.NoError(t, os.WriteFile(file, append(good, []byte("previousIssuersFile: "+prev+"\n")...), 0o600))
	restarted, err := backend.NewFileSigner(context.Background(), backend.FileSignerConfig{Path: file, Keep: keep, Clock: clock.Now})
	require.NoError(t, err)
	got := restarted.(catest.Renewable).AcceptedIssuers()
	require.Len(t, got, 2)
	assert.True(t, got[0].Equal(current) && got[1].Equal(first.Issuing.Cert), "the current issuing CA, then the listed previous one")
	for _, tc := range []struct {
		name string
		pem  []byte
		want string
	}{
		{"the current issuing CA", catest.CertsPEM(second.Issuing.Cert), "is the current issuing CA"},
		{"a leaf", catest.CertsPEM(issueLeaf(t, second)), "is not a CA"},
		{"five", catest.CertsPEM(first.Issuing.Cert, first.Issuing.Cert, first.Issuing.Cert, first.Issuing.Cert, first.Issuing.Cert), "more than 4"},
		{"twice", catest.CertsPEM(first.Issuing.Cert, first.Issuing.Cert), "listed twice"},
		{"not PEM", []byte("garbage"), "previousIssuersFile"},
	} {
		t.Run("refused previous issuers: "+tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(prev, tc.pem, 0o600))
			_, err := backend.NewFileSigner(context.Background(), backend.FileSignerConfig{Path: file, Keep: keep, Clock: clock.Now})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// issueLeaf is an agent certificate of s.
func issueLeaf(t *testing.T, s *server) *x509.Certificate {
	t.Helper()
	a, err := ca.New(ca.Config{Signer: newSigner(t, config(s))})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := x509.ParseCertificateRequest(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.NoError(t, err)
	return iss.Certificate
}
