package stepca_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/jose"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/ca/stepca"
)

// provisionerName is the JWK provisioner every test step-ca has.
const provisionerName = "relaymesh"

// The password of the encrypted provisioner key: long and distinctive, so
// that a search for it in errors and logs cannot miss a leak.
const keyPassword = "pw-3c9a17e5d2b4-relaymesh"

// server is a running step-ca and what a Config needs to use it.
type server struct {
	url                  string
	chainFile, rootsFile string
	// keyFile is the provisioner's private JWK in the clear; encKeyFile
	// the same key encrypted with keyPassword (passwordFile), the way
	// ca.json keeps it.
	keyFile, encKeyFile, passwordFile string
	key                               *jose.JSONWebKey
	proc                              *catest.Process
	dir                               string
	// issuing is step-ca's intermediate.
	issuing *catest.CA
}

// serverOptions shape a test step-ca.
type serverOptions struct {
	// template replaces stepca.ProvisionerTemplate.
	template string
	// keepSmallstepExtensions leaves step-ca's provisioner extension on.
	keepSmallstepExtensions bool
	// maxCertDuration replaces the provisioner's maxTLSCertDuration.
	maxCertDuration string
	// intermediatePathLenZero gives step-ca's intermediate pathLen 0.
	intermediatePathLenZero bool
	// root signs the intermediate instead of a fresh root (a renewal
	// under the same root).
	root *catest.CA
}

// startServer starts step-ca on a free loopback port with a fresh root,
// intermediate and JWK provisioner, no database ("db": null keeps used
// token ids in memory), and waits until it answers.
func startServer(t testing.TB, o serverOptions) *server {
	t.Helper()
	bin := catest.Binary(t, "step-ca")
	dir := t.TempDir()
	root := o.root
	if root == nil {
		root = catest.NewRoot(t, catest.CAOptions{Name: "step-ca test root"})
	}
	// pathLen 1 leaves room for mesh intermediates.
	interOpts := catest.CAOptions{Name: "step-ca test intermediate", MaxPathLen: 1}
	if o.intermediatePathLenZero {
		interOpts.MaxPathLen, interOpts.PathLenZero = 0, true
	}
	inter := root.NewIntermediate(t, interOpts)
	s := &server{dir: dir, issuing: inter}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	s.chainFile = write("intermediate.pem", inter.ChainPEM())
	s.rootsFile = write("root.pem", inter.RootsPEM())
	interKey := write("intermediate-key.pem", inter.KeyPEM(t))

	key, err := jose.GenerateJWK("EC", "P-256", "ES256", "sig", "", 0)
	require.NoError(t, err)
	s.key = key
	priv, err := json.Marshal(key)
	require.NoError(t, err)
	s.keyFile = write("provisioner.jwk", priv)
	enc, err := jose.EncryptJWK(key, []byte(keyPassword))
	require.NoError(t, err)
	compact, err := enc.CompactSerialize()
	require.NoError(t, err)
	s.encKeyFile = write("provisioner.jwe", []byte(compact))
	s.passwordFile = write("password", []byte(keyPassword+"\n"))
	pub := key.Public()

	template := stepca.ProvisionerTemplate
	if o.template != "" {
		template = o.template
	}
	// A year-long intermediate (step-ca tolerates its own backdate, 1m,
	// on top of the maximum).
	maxDuration := "8760h"
	if o.maxCertDuration != "" {
		maxDuration = o.maxCertDuration
	}
	pool := x509.NewCertPool()
	pool.AddCert(root.Cert)
	args := func(addr string) []string {
		host, _, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		cfg := map[string]any{
			"root":     s.rootsFile,
			"crt":      s.chainFile,
			"key":      interKey,
			"address":  addr,
			"dnsNames": []string{host},
			"logger":   map[string]string{"format": "text"},
			"db":       nil,
			"authority": map[string]any{
				"provisioners": []map[string]any{{
					"type":         "JWK",
					"name":         provisionerName,
					"key":          &pub,
					"encryptedKey": compact,
					"claims": map[string]any{
						"minTLSCertDuration":         "5s",
						"maxTLSCertDuration":         maxDuration,
						"defaultTLSCertDuration":     "24h",
						"disableRenewal":             true,
						"disableSmallstepExtensions": !o.keepSmallstepExtensions,
					},
					"options": map[string]any{"x509": map[string]any{"template": template}},
				}},
			},
			"tls": map[string]any{"minVersion": 1.2, "maxVersion": 1.3},
		}
		b, err := json.MarshalIndent(cfg, "", "  ")
		require.NoError(t, err)
		return []string{write("ca.json", b)}
	}
	s.proc, s.url = catest.StartServer(t, catest.Server{Name: "step-ca", Bin: bin, Dir: dir, Args: args, Scheme: "https", Health: "/health", Roots: pool})
	return s
}

// config is a working Config for s, with the encrypted key.
func (s *server) config() stepca.Config {
	return stepca.Config{
		URL:                     s.url,
		Provisioner:             provisionerName,
		ProvisionerKeyFile:      s.encKeyFile,
		ProvisionerPasswordFile: s.passwordFile,
		ChainFile:               s.chainFile,
		RootsFile:               s.rootsFile,
	}
}

// plainConfig is config with the key in the clear: decrypting the key
// (PBKDF2) costs about a second, which the conformance suite would pay
// for each of its subtests.
func (s *server) plainConfig() stepca.Config {
	cfg := s.config()
	cfg.ProvisionerKeyFile, cfg.ProvisionerPasswordFile = s.keyFile, ""
	return cfg
}

func newSigner(t testing.TB, cfg stepca.Config) ca.Signer {
	t.Helper()
	s, err := stepca.New(context.Background(), cfg)
	require.NoError(t, err)
	return s
}

func TestSignerConformance(t *testing.T) {
	srv := startServer(t, serverOptions{})
	catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
		return newSigner(t, srv.plainConfig())
	})
	log := srv.proc.Log(t)
	assert.NotContains(t, log, keyPassword, "step-ca's log")
}

// TestEncryptedProvisionerKey: the provisioner key as ca.json keeps it
// (encryptedKey, a JWE), with its password in a file.
func TestEncryptedProvisionerKey(t *testing.T) {
	srv := startServer(t, serverOptions{})
	a, err := ca.New(ca.Config{Signer: newSigner(t, srv.config())})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.Ed25519)
	iss, err := a.IssueAgentFor(context.Background(), parseCSR(t, catest.NewCSR(t, key, nil)), catest.AgentID, "reg-7")
	require.NoError(t, err)
	catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)
	assert.Equal(t, "OU=reg-7,O=relaymesh", iss.Certificate.Subject.String())
}

// TestNewRejects: every misconfiguration fails at start, clearly, and
// without the key or its password in the error or the log.
func TestNewRejects(t *testing.T) {
	srv := startServer(t, serverOptions{})
	other := startServer(t, serverOptions{})
	dir := t.TempDir()
	wrongPassword := filepath.Join(dir, "wrong-password")
	require.NoError(t, os.WriteFile(wrongPassword, []byte("wrong-"+keyPassword), 0o600))
	garbage := filepath.Join(dir, "garbage")
	require.NoError(t, os.WriteFile(garbage, []byte("not a key "+keyPassword), 0o600))
	privJSON, err := json.Marshal(srv.key)
	require.NoError(t, err)

	tests := []struct {
		name   string
		modify func(c *stepca.Config)
		want   []string
	}{
		{"wrong password", func(c *stepca.Config) { c.ProvisionerPasswordFile = wrongPassword }, []string{"wrong password"}},
		{"encrypted key, no password", func(c *stepca.Config) { c.ProvisionerPasswordFile = "" }, []string{"encrypted and no provisionerPasswordFile"}},
		{"not a key", func(c *stepca.Config) { c.ProvisionerKeyFile, c.ProvisionerPasswordFile = garbage, "" }, []string{"not a JWK"}},
		{"key of another CA's provisioner", func(c *stepca.Config) {
			c.ProvisionerKeyFile, c.ProvisionerPasswordFile = other.keyFile, ""
		}, []string{`no JWK provisioner "relaymesh" with key id ` + other.key.KeyID}},
		{"unknown provisioner", func(c *stepca.Config) { c.Provisioner = "nobody" }, []string{`no JWK provisioner "nobody"`}},
		{"another CA's chain", func(c *stepca.Config) {
			c.ChainFile, c.RootsFile, c.TLSRootsFile = other.chainFile, other.rootsFile, srv.rootsFile
		}, []string{"does not sign with the first certificate of chainFile"}},
		{"TLS not pinned to the server's root", func(c *stepca.Config) { c.ChainFile, c.RootsFile = other.chainFile, other.rootsFile }, []string{"certificate signed by unknown authority"}},
		{"plain http", func(c *stepca.Config) { c.URL = strings.Replace(c.URL, "https:", "http:", 1) }, []string{"scheme must be https"}},
		{"wrong password in memory", func(c *stepca.Config) {
			*c = inMemory(t, *c)
			c.ProvisionerPassword = []byte("wrong-" + keyPassword)
		}, []string{"wrong password (provisionerPassword)"}},
		{"encrypted key in memory, no password", func(c *stepca.Config) { *c = inMemory(t, *c); c.ProvisionerPassword = nil }, []string{"encrypted and no provisionerPasswordFile or provisionerPassword"}},
		{"not a key in memory", func(c *stepca.Config) {
			*c = inMemory(t, *c)
			c.ProvisionerKey, c.ProvisionerPassword = []byte("not a key "+keyPassword), nil
		}, []string{"provisioner key (provisionerKey)", "not a JWK"}},
		{"key in memory of another CA's provisioner", func(c *stepca.Config) {
			*c = inMemory(t, *c)
			c.ProvisionerKey, c.ProvisionerPassword = inMemory(t, other.plainConfig()).ProvisionerKey, nil
		}, []string{`no JWK provisioner "relaymesh" with key id ` + other.key.KeyID, "(the key in provisionerKey)"}},
		{"another CA's chain in memory", func(c *stepca.Config) {
			*c = inMemory(t, srv.plainConfig())
			o := inMemory(t, other.config())
			c.ChainPEM, c.RootsPEM, c.TLSRootsPEM = o.ChainPEM, o.RootsPEM, inMemory(t, srv.config()).RootsPEM
		}, []string{"does not sign with the first certificate of chainPEM"}},
		{"password in memory and in a file", func(c *stepca.Config) { c.ProvisionerPassword = []byte(keyPassword) }, []string{"provisionerPasswordFile, provisionerPassword: only one may be set"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			cfg := srv.config()
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			tt.modify(&cfg)
			s, err := stepca.New(context.Background(), cfg)
			require.Error(t, err)
			t.Logf("error: %v", err)
			assert.Nil(t, s)
			assert.ErrorIs(t, err, ca.ErrInvalidSigner)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			for _, secret := range []string{keyPassword, string(privJSON), catest.JWKPrivateD(t, srv.key), catest.JWKPrivateD(t, other.key)} {
				assert.NotContains(t, err.Error(), secret, "a secret leaked into the error")
				assert.NotContains(t, logs.String(), secret, "a secret leaked into the log")
			}
		})
	}
}

// TestBadTokenIsRefused: a token signed by a key the provisioner does not
// have is refused by step-ca, and the error says so.
func TestBadTokenIsRefused(t *testing.T) {
	srv := startServer(t, serverOptions{})
	// A forged key that claims the provisioner's key id: New finds it out
	// from the provisioner's public key; a signer that skipped that check
	// sends tokens step-ca refuses.
	forged, err := jose.GenerateJWK("EC", "P-256", "ES256", "sig", srv.key.KeyID, 0)
	require.NoError(t, err)
	cfg := srv.config()
	cfg.ProvisionerKeyFile, cfg.ProvisionerPasswordFile = forgedKeyFile(t, forged), ""
	_, err = stepca.New(context.Background(), cfg)
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	assert.ErrorContains(t, err, "another public key than provisionerKeyFile")

	s, err := stepca.NewWithoutProbe(cfg)
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(t, err)
	iss, err := a.IssueAgent(context.Background(), parseCSR(t, catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), nil)), catest.AgentID)
	require.ErrorIs(t, err, stepca.ErrAuth)
	assert.Nil(t, iss)
	t.Logf("error: %v", err)

	// Tokens from a clock ten minutes behind are expired on arrival.
	cfg = srv.config()
	cfg.Clock = func() time.Time { return time.Now().Add(-10 * time.Minute) }
	a, err = ca.New(ca.Config{Signer: newSigner(t, cfg)})
	require.NoError(t, err)
	iss, err = a.IssueAgent(context.Background(), parseCSR(t, catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), nil)), catest.AgentID)
	require.ErrorIs(t, err, stepca.ErrAuth)
	assert.Nil(t, iss)
	t.Logf("error: %v", err)
}

// TestTemplateMismatchIsRefused: a provisioner template that issues
// something else than asked for (here: every certificate also gets
// serverAuth, and smallstep's extension stays on) fails closed.
func TestTemplateMismatchIsRefused(t *testing.T) {
	for name, o := range map[string]serverOptions{
		"extra extended key usage": {template: strings.Replace(stepca.ProvisionerTemplate, `"extKeyUsage": {{ toJson .Token.relaymesh.extKeyUsage }}`, `"extKeyUsage": ["clientAuth", "serverAuth"]`, 1)},
		"smallstep extension":      {keepSmallstepExtensions: true},
	} {
		t.Run(name, func(t *testing.T) {
			srv := startServer(t, o)
			a, err := ca.New(ca.Config{Signer: newSigner(t, srv.plainConfig())})
			require.NoError(t, err)
			iss, err := a.IssueAgent(context.Background(), parseCSR(t, catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), nil)), catest.AgentID)
			require.ErrorIs(t, err, ca.ErrIssuance)
			assert.ErrorContains(t, err, "rejected")
			assert.Nil(t, iss)
			t.Logf("error: %v", err)
		})
	}
}

// TestIntermediates: what a provisioner must allow for intermediates, and
// what step-ca would sign but the Authority refuses.
func TestIntermediates(t *testing.T) {
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := ca.ParseIntermediateCSR(catest.NewCSR(t, key, nil))
	require.NoError(t, err)
	issue := func(t *testing.T, o serverOptions) (*ca.Issued, *server, error) {
		t.Helper()
		srv := startServer(t, o)
		a, err := ca.New(ca.Config{Signer: newSigner(t, srv.plainConfig())})
		require.NoError(t, err)
		iss, err := a.IssueIntermediate(context.Background(), csr, catest.Intermediate)
		t.Logf("error: %v", err)
		return iss, srv, err
	}

	t.Run("the request may carry the intermediate's common name", func(t *testing.T) {
		srv := startServer(t, serverOptions{})
		a, err := ca.New(ca.Config{Signer: newSigner(t, srv.plainConfig())})
		require.NoError(t, err)
		named, err := ca.ParseIntermediateCSR(catest.NewCSR(t, key, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{catest.Intermediate.VirtualMesh}, CommonName: catest.Intermediate.Mesh + " intermediate"}}))
		require.NoError(t, err)
		iss, err := a.IssueIntermediate(context.Background(), named, catest.Intermediate)
		require.NoError(t, err)
		catest.CheckIntermediateCertificate(t, iss, key.Public(), catest.Intermediate)
	})
	t.Run("a template without the CA branch adds a SAN, which is refused", func(t *testing.T) {
		old := strings.Replace(stepca.ProvisionerTemplate, "{{- if not .Token.relaymesh.basicConstraints.isCA }}", "{{- if true }}", 1)
		require.NotEqual(t, stepca.ProvisionerTemplate, old)
		iss, _, err := issue(t, serverOptions{template: old})
		require.ErrorIs(t, err, ca.ErrIssuance)
		assert.ErrorContains(t, err, "subject alternative names")
		assert.Nil(t, iss)
	})
	t.Run("a provisioner whose maximum is shorter than the intermediate's lifetime", func(t *testing.T) {
		iss, _, err := issue(t, serverOptions{maxCertDuration: "4380h"})
		require.ErrorIs(t, err, ca.ErrIssuance)
		assert.ErrorContains(t, err, "duration")
		assert.Nil(t, iss)
	})
	t.Run("an intermediate with pathLen 0 is refused before step-ca is asked", func(t *testing.T) {
		iss, _, err := issue(t, serverOptions{intermediatePathLenZero: true})
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.ErrorContains(t, err, "cannot issue intermediates")
		assert.Nil(t, iss)
	})
}

// TestRequestedNamesAreRefused: step-ca refuses a certificate request
// that names a common name or SANs other than the token's, where the
// Authority would only ignore them. Fail closed, and say why.
func TestRequestedNamesAreRefused(t *testing.T) {
	srv := startServer(t, serverOptions{})
	a, err := ca.New(ca.Config{Signer: newSigner(t, srv.plainConfig())})
	require.NoError(t, err)
	csr := parseCSR(t, catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "evil"},
		DNSNames: []string{"evil.example.test"},
	}))
	iss, err := a.IssueAgent(context.Background(), csr, catest.AgentID)
	require.ErrorIs(t, err, ca.ErrIssuance)
	assert.Nil(t, iss)
	t.Logf("error: %v", err)
}

// inMemory is cfg with the provisioner key, its password, the chain and
// the roots (and TLS roots, if any) in memory instead of in files, the way
// a caller holding a Kubernetes Secret passes them.
func inMemory(t testing.TB, cfg stepca.Config) stepca.Config {
	t.Helper()
	read := func(p string) []byte {
		if p == "" {
			return nil
		}
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return b
	}
	cfg.ProvisionerKey, cfg.ProvisionerPassword = read(cfg.ProvisionerKeyFile), read(cfg.ProvisionerPasswordFile)
	cfg.ChainPEM, cfg.RootsPEM, cfg.TLSRootsPEM = read(cfg.ChainFile), read(cfg.RootsFile), read(cfg.TLSRootsFile)
	cfg.ProvisionerKeyFile, cfg.ProvisionerPasswordFile = "", ""
	cfg.ChainFile, cfg.RootsFile, cfg.TLSRootsFile = "", "", ""
	return cfg
}

// TestInMemoryConfig: the encrypted provisioner key (as ca.json keeps it),
// its password (with a trailing newline, as a Secret made from a file has
// it), the chain and the roots work from memory as from files; the roots
// in memory are the only ones trusted for HTTPS.
func TestInMemoryConfig(t *testing.T) {
	srv := startServer(t, serverOptions{})
	cfg := inMemory(t, srv.config())
	require.Equal(t, keyPassword+"\n", string(cfg.ProvisionerPassword))
	catest.IssueIntermediate(t, newSigner(t, cfg))

	other := catest.NewRoot(t, catest.CAOptions{})
	cfg.TLSRootsPEM = other.RootsPEM()
	_, err := stepca.New(context.Background(), cfg)
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	assert.ErrorContains(t, err, "certificate signed by unknown authority")
}

// TestConfigValidateAlternatives: the provisioner key, its password, the
// chain, the roots and the TLS roots each come from one place; Validate
// names the places that conflict or says what is missing, and never quotes
// the key or the password.
func TestConfigValidateAlternatives(t *testing.T) {
	const key, password = `{"kty":"EC","d":"secret-d-value"}`, "secret-password-value"
	valid := stepca.Config{URL: "https://ca.example.test", Provisioner: "p", ProvisionerKey: []byte(key), ProvisionerPassword: []byte(password), ChainPEM: []byte("c"), RootsPEM: []byte("r")}.Default()
	require.NoError(t, valid.Validate(), "everything in memory")
	assert.Equal(t, valid.RootsPEM, valid.TLSRootsPEM, "TLS roots default to the roots in memory")
	tests := []struct {
		name   string
		modify func(c *stepca.Config)
		want   []string
	}{
		{"key in memory and in a file", func(c *stepca.Config) { c.ProvisionerKeyFile = "k" }, []string{"provisionerKeyFile, provisionerKey: only one may be set"}},
		{"no key", func(c *stepca.Config) { c.ProvisionerKey = nil }, []string{"provisionerKeyFile: required (or provisionerKey)"}},
		{"password in memory and in a file", func(c *stepca.Config) { c.ProvisionerPasswordFile = "pw" }, []string{"provisionerPasswordFile, provisionerPassword: only one may be set"}},
		{"chain twice", func(c *stepca.Config) { c.ChainFile = "chain.pem" }, []string{"chainFile, chainPEM: only one may be set"}},
		{"roots twice", func(c *stepca.Config) { c.RootsFile = "roots.pem" }, []string{"rootsFile, rootsPEM: only one may be set"}},
		{"TLS roots twice", func(c *stepca.Config) { c.TLSRootsFile = "tls.pem" }, []string{"tlsRootsFile, tlsRootsPEM: only one may be set"}},
		{"no chain, no roots", func(c *stepca.Config) { c.ChainPEM, c.RootsPEM, c.TLSRootsPEM = nil, nil, nil }, []string{"chainFile: required (or chainPEM)", "rootsFile: required (or rootsPEM)", "tlsRootsFile: required (or tlsRootsPEM)"}},
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
			_, newErr := stepca.New(context.Background(), cfg)
			require.ErrorIs(t, newErr, ca.ErrInvalidSigner)
			for _, secret := range []string{"secret-d-value", password} {
				assert.NotContains(t, err.Error(), secret, "a secret leaked into the error")
				assert.NotContains(t, newErr.Error(), secret, "a secret leaked into the error")
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	err := stepca.Config{URL: "http://ca.example.test", TokenLifetime: time.Hour, Timeout: -1}.Validate()
	require.Error(t, err)
	for _, field := range []string{"url:", "provisioner: required", "provisionerKeyFile: required", "chainFile: required", "rootsFile: required", "tokenLifetime:", "timeout:", "clock: required", "logger: required"} {
		assert.Contains(t, err.Error(), field)
	}
	assert.NoError(t, stepca.Config{URL: "https://ca.example.test:9000", Provisioner: "p", ProvisionerKeyFile: "k", ChainFile: "c", RootsFile: "r"}.Default().Validate())
}

func TestSignHonoursContext(t *testing.T) {
	srv := startServer(t, serverOptions{})
	s := newSigner(t, srv.plainConfig())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	key := catest.NewKey(t, catest.ECDSAP256)
	tmpl := &x509.Certificate{Subject: pkix.Name{Organization: []string{"relaymesh"}}, DNSNames: []string{"a.example.test"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	c, err := s.(ca.RequestSigner).SignRequest(ctx, tmpl, parseCSR(t, catest.NewCSR(t, key, nil)))
	require.ErrorIs(t, err, context.Canceled)
	assert.Nil(t, c)
	_, err = stepca.New(ctx, srv.plainConfig())
	require.ErrorIs(t, err, context.Canceled)
}

// BenchmarkIssueIntermediate is the cost of one mesh intermediate (P-256)
// signed by step-ca over loopback HTTPS, through a ca.Authority.
func BenchmarkIssueIntermediate(b *testing.B) {
	srv := startServer(b, serverOptions{})
	a, err := ca.New(ca.Config{Signer: newSigner(b, srv.plainConfig())})
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

// BenchmarkSign is the cost of one agent certificate signed by step-ca over
// loopback HTTPS, through a ca.Authority, from parallel callers.
func BenchmarkSign(b *testing.B) {
	srv := startServer(b, serverOptions{})
	a, err := ca.New(ca.Config{Signer: newSigner(b, srv.plainConfig())})
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

func forgedKeyFile(t testing.TB, k *jose.JSONWebKey) string {
	t.Helper()
	b, err := json.Marshal(k)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "forged.jwk")
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

func parseCSR(t testing.TB, der []byte) *x509.CertificateRequest {
	t.Helper()
	csr, err := ca.ParseCSR(der)
	require.NoError(t, err)
	return csr
}

// TestRelayIssuerRenewalOnStepCA: the relay CA on step-ca, as --ca-config
// gives it (backend.FileSigner), with the encrypted provisioner key and
// its password in files. step-ca's intermediate is replaced by a new one
// under the same root (here a second step-ca, the file pointing at it);
// the reload issues from the new one, an agent certificate of the old one
// stays accepted until it has expired, and then the old one is dropped.
func TestRelayIssuerRenewalOnStepCA(t *testing.T) {
	first := startServer(t, serverOptions{})
	second := startServer(t, serverOptions{root: first.issuing.Root()})
	file := filepath.Join(t.TempDir(), "ca.yaml")
	write := func(s *server) {
		y := fmt.Sprintf("type: stepca\nstepca:\n  url: %s\n  provisioner: %s\n  provisionerKeyFile: %s\n  provisionerPasswordFile: %s\n  chainFile: %s\n  rootsFile: %s\n",
			s.url, provisionerName, s.encKeyFile, s.passwordFile, s.chainFile, s.rootsFile)
		require.NoError(t, os.WriteFile(file, []byte(y), 0o600))
	}
	write(first)
	_, _, logs := catest.RunFileRenewal(t, file, func(t *testing.T) { write(second) })
	assert.NotContains(t, logs, keyPassword, "the FileSigner's log")
}
