//go:build cgo

package hsm_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/kms/apiv1"
	kmspkcs11 "go.step.sm/crypto/kms/pkcs11"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/ca/hsm"
)

// The test token. The PIN is long and distinctive so that a search for it
// in errors and logs cannot miss a leak.
const (
	tokenLabel = "relaymesh-test"
	userPIN    = "pin-4b1f9e07c2d8-relaymesh"
	soPIN      = "so-pin-8d7e61a0"
)

// tokenDir holds the test token's configuration and objects; TestMain
// removes it.
var tokenDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "relaymesh-softhsm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tokenDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// token returns the SoftHSM2 module path, creating the token on first use.
// A missing SoftHSM2 fails the test.
func token(t testing.TB) string {
	t.Helper()
	return catest.SoftHSM(t, tokenDir, tokenLabel, userPIN, soPIN)
}

var keyCount atomic.Int64

// tokenCA is a CA whose P-256 key was generated inside the token.
type tokenCA struct {
	label, id            string
	chainFile, rootsFile string
}

// newCA generates a key pair on the token, with a fresh label and id, and
// writes its CA certificate: an intermediate of an in-memory root, or
// (selfSigned) a root the token signs itself. The PKCS#11 session used for
// that is closed before newCA returns, so that nothing else is logged in
// when a test opens the token.
func newCA(t testing.TB, selfSigned bool) tokenCA {
	t.Helper()
	var root *catest.CA
	if !selfSigned {
		root = catest.NewRoot(t, catest.CAOptions{})
	}
	return newCAUnder(t, root)
}

// newCAUnder is newCA signed by root, or self-signed if root is nil.
func newCAUnder(t testing.TB, root *catest.CA) tokenCA {
	t.Helper()
	selfSigned := root == nil
	module := token(t)
	k, err := kmspkcs11.New(context.Background(), apiv1.Options{
		Type: apiv1.PKCS11,
		URI:  fmt.Sprintf("pkcs11:module-path=%s;token=%s", module, tokenLabel),
		Pin:  userPIN,
	})
	require.NoError(t, err)
	defer func() { require.NoError(t, k.Close()) }()
	n := keyCount.Add(1)
	label := fmt.Sprintf("relaymesh-ca-%d", n)
	id := make([]byte, 8)
	_, err = rand.Read(id)
	require.NoError(t, err)
	name := fmt.Sprintf("pkcs11:id=%s;object=%s", hex.EncodeToString(id), label)
	resp, err := k.CreateKey(&apiv1.CreateKeyRequest{Name: name, SignatureAlgorithm: apiv1.ECDSAWithSHA256})
	require.NoError(t, err)
	key, err := k.CreateSigner(&resp.CreateSignerRequest)
	require.NoError(t, err)

	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{Organization: []string{"relaymesh test"}, CommonName: "HSM CA " + label},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	var chain, roots []*x509.Certificate
	if selfSigned {
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, resp.PublicKey, key)
		require.NoError(t, err)
		c, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		chain, roots = []*x509.Certificate{c}, []*x509.Certificate{c}
	} else {
		// pathLen 1: room for one level of mesh intermediates.
		tmpl.MaxPathLen = 1
		der, err := x509.CreateCertificate(rand.Reader, tmpl, root.Cert, resp.PublicKey, root.Key)
		require.NoError(t, err)
		c, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		chain, roots = []*x509.Certificate{c}, root.Roots()
	}
	dir := t.TempDir()
	out := tokenCA{label: label, id: hex.EncodeToString(id), chainFile: filepath.Join(dir, "chain.pem"), rootsFile: filepath.Join(dir, "roots.pem")}
	require.NoError(t, os.WriteFile(out.chainFile, catest.CertsPEM(chain...), 0o600))
	require.NoError(t, os.WriteFile(out.rootsFile, catest.CertsPEM(roots...), 0o600))
	return out
}

// config is a working Config for c, the PIN in a file.
func config(t testing.TB, c tokenCA) hsm.Config {
	t.Helper()
	pinFile := filepath.Join(t.TempDir(), "pin")
	require.NoError(t, os.WriteFile(pinFile, []byte(userPIN+"\n"), 0o600))
	return hsm.Config{
		ModulePath: token(t),
		TokenLabel: tokenLabel,
		KeyLabel:   c.label,
		KeyID:      c.id,
		PINFile:    pinFile,
		ChainFile:  c.chainFile,
		RootsFile:  c.rootsFile,
	}
}

// inMemory is cfg with the PIN, chain and roots in memory instead of in
// files, the way a caller holding a Kubernetes Secret passes them.
func inMemory(t testing.TB, cfg hsm.Config) hsm.Config {
	t.Helper()
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return b
	}
	cfg.PIN, cfg.ChainPEM, cfg.RootsPEM = []byte(userPIN+"\n"), read(cfg.ChainFile), read(cfg.RootsFile)
	cfg.PINFile, cfg.ChainFile, cfg.RootsFile = "", "", ""
	return cfg
}

func newSigner(t testing.TB, cfg hsm.Config) ca.Signer {
	t.Helper()
	s, err := hsm.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.(io.Closer).Close()) })
	return s
}

func TestSignerConformance(t *testing.T) {
	t.Run("intermediate whose key is on the token", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			return newSigner(t, config(t, newCA(t, false)))
		})
	})
	t.Run("PIN, chain and roots in memory", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			return newSigner(t, inMemory(t, config(t, newCA(t, false))))
		})
	})
	t.Run("self-signed root on the token, key by label only, PIN from the environment", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			cfg := config(t, newCA(t, true))
			cfg.KeyID, cfg.PINFile, cfg.PINEnv = "", "", "RELAYMESH_TEST_HSM_PIN"
			t.Setenv("RELAYMESH_TEST_HSM_PIN", userPIN)
			return newSigner(t, cfg)
		})
	})
}

// TestNewRejects: every way the configuration can be wrong fails at start
// with a message that says which, and never contains the PIN. Nothing
// else may have the token open meanwhile: PKCS#11 keeps a login per
// process, so a second login is not checked against the PIN while another
// session of the same module is logged in.
func TestNewRejects(t *testing.T) {
	good := config(t, newCA(t, false))
	other := newCA(t, false)
	dir := t.TempDir()
	wrongPIN := filepath.Join(dir, "wrong-pin")
	require.NoError(t, os.WriteFile(wrongPIN, []byte("wrong-"+userPIN), 0o600))
	emptyPIN := filepath.Join(dir, "empty-pin")
	require.NoError(t, os.WriteFile(emptyPIN, []byte("\n"), 0o600))

	tests := []struct {
		name   string
		modify func(c *hsm.Config)
		want   []string
	}{
		{"wrong PIN", func(c *hsm.Config) { c.PINFile = wrongPIN }, []string{"wrong PIN", tokenLabel}},
		{"empty PIN", func(c *hsm.Config) { c.PINFile = emptyPIN }, []string{"PIN", "is empty", emptyPIN}},
		{"PIN file missing", func(c *hsm.Config) { c.PINFile = filepath.Join(dir, "nope") }, []string{"PIN file", "no such file"}},
		{"PIN variable unset", func(c *hsm.Config) { c.PINFile, c.PINEnv = "", "RELAYMESH_TEST_UNSET_PIN" }, []string{"RELAYMESH_TEST_UNSET_PIN", "not set"}},
		{"missing key", func(c *hsm.Config) { c.KeyLabel, c.KeyID = "no-such-key", "" }, []string{"no key", `"no-such-key"`}},
		{"label and id of different keys", func(c *hsm.Config) { c.KeyID = other.id }, []string{"no key"}},
		{"certificate of another key", func(c *hsm.Config) { c.ChainFile = other.chainFile }, []string{"does not belong"}},
		{"missing module", func(c *hsm.Config) { c.ModulePath = filepath.Join(dir, "libnothing.so") }, []string{"module", "libnothing.so", "no such file"}},
		{"module is not a PKCS#11 library", func(c *hsm.Config) { c.ModulePath = wrongPIN }, []string{"module could not be loaded"}},
		{"missing token", func(c *hsm.Config) { c.TokenLabel = "no-such-token" }, []string{"no token", `"no-such-token"`}},
		{"missing chain file", func(c *hsm.Config) { c.ChainFile = filepath.Join(dir, "nope.pem") }, []string{"chainFile"}},
		{"wrong PIN in memory", func(c *hsm.Config) { c.PINFile, c.PIN = "", []byte("wrong-"+userPIN) }, []string{"wrong PIN", tokenLabel}},
		{"empty PIN in memory", func(c *hsm.Config) { c.PINFile, c.PIN = "", []byte(" \n") }, []string{"PIN", "is empty", "field pin"}},
		{"chain in memory is no PEM", func(c *hsm.Config) { c.ChainFile, c.ChainPEM = "", []byte("garbage") }, []string{"chainPEM"}},
		{"certificate in memory of another key", func(c *hsm.Config) { *c = inMemory(t, *c); c.ChainPEM = inMemory(t, config(t, other)).ChainPEM }, []string{"does not belong"}},
		{"PIN in memory and in a file", func(c *hsm.Config) { c.PIN = []byte(userPIN) }, []string{"pinFile, pin: only one may be set"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("RELAYMESH_TEST_HSM_PIN", userPIN) // a PIN in the environment must not leak either
			var logs bytes.Buffer
			cfg := good
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			tt.modify(&cfg)
			s, err := hsm.New(context.Background(), cfg)
			if s != nil {
				_ = s.(io.Closer).Close()
			}
			require.Error(t, err)
			t.Logf("error: %v", err)
			assert.Nil(t, s)
			assert.ErrorIs(t, err, ca.ErrInvalidSigner)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), userPIN, "the PIN leaked into the error")
			assert.NotContains(t, err.Error(), "wrong-"+userPIN, "the (wrong) PIN leaked into the error")
			assert.NotContains(t, logs.String(), userPIN, "the PIN leaked into the log")
		})
	}

	t.Run("the right configuration works after all that, and logs no PIN", func(t *testing.T) {
		var logs bytes.Buffer
		cfg := good
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		s := newSigner(t, cfg)
		require.NotEmpty(t, s.Chain())
		assert.Contains(t, logs.String(), tokenLabel)
		assert.NotContains(t, logs.String(), userPIN)
	})
}

func TestConfigValidate(t *testing.T) {
	err := hsm.Config{KeyID: "xyz", PINFile: "a", PINEnv: "B"}.Validate()
	require.Error(t, err)
	for _, field := range []string{"modulePath: required", "tokenLabel: required", "chainFile: required", "rootsFile: required", "keyID:", "pinFile, pinEnv: only one", "clock: required", "logger: required"} {
		assert.Contains(t, err.Error(), field)
	}
	err = hsm.Config{}.Default().Validate()
	assert.ErrorContains(t, err, "keyLabel, keyID: at least one is required")
	assert.ErrorContains(t, err, "pinFile, pinEnv: one is required")
}

// TestConfigValidateAlternatives: the PIN, the chain and the roots each
// come from exactly one place; Validate names the places that conflict or
// says what is missing, and never quotes the PIN.
func TestConfigValidateAlternatives(t *testing.T) {
	valid := hsm.Config{ModulePath: "/m.so", TokenLabel: "t", KeyLabel: "k", PIN: []byte(userPIN), ChainPEM: []byte("c"), RootsPEM: []byte("r")}.Default()
	require.NoError(t, valid.Validate(), "everything in memory")
	tests := []struct {
		name   string
		modify func(c *hsm.Config)
		want   []string
	}{
		{"PIN in memory and in a file", func(c *hsm.Config) { c.PINFile = "pin" }, []string{"pinFile, pin: only one may be set"}},
		{"PIN in memory and in the environment", func(c *hsm.Config) { c.PINEnv = "PIN" }, []string{"pinEnv, pin: only one may be set"}},
		{"PIN from all three", func(c *hsm.Config) { c.PINFile, c.PINEnv = "pin", "PIN" }, []string{"pinFile, pinEnv, pin: only one may be set"}},
		{"no PIN", func(c *hsm.Config) { c.PIN = nil }, []string{"pinFile, pinEnv: one is required (or pin)"}},
		{"empty PIN is no PIN", func(c *hsm.Config) { c.PIN = []byte{} }, []string{"pinFile, pinEnv: one is required (or pin)"}},
		{"chain twice", func(c *hsm.Config) { c.ChainFile = "chain.pem" }, []string{"chainFile, chainPEM: only one may be set"}},
		{"roots twice", func(c *hsm.Config) { c.RootsFile = "roots.pem" }, []string{"rootsFile, rootsPEM: only one may be set"}},
		{"no chain, no roots", func(c *hsm.Config) { c.ChainPEM, c.RootsPEM = nil, nil }, []string{"chainFile: required (or chainPEM)", "rootsFile: required (or rootsPEM)"}},
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
			assert.NotContains(t, err.Error(), userPIN, "the PIN leaked into the error")
			_, err = hsm.New(context.Background(), cfg)
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.NotContains(t, err.Error(), userPIN, "the PIN leaked into the error")
		})
	}
}

func TestNewHonoursContext(t *testing.T) {
	cfg := config(t, newCA(t, false))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := hsm.New(ctx, cfg)
	require.ErrorIs(t, err, context.Canceled)
	assert.Nil(t, s)
}

func TestCloseStopsSigning(t *testing.T) {
	s, err := hsm.New(context.Background(), config(t, newCA(t, false)))
	require.NoError(t, err)
	require.NoError(t, s.(io.Closer).Close())
	require.NoError(t, s.(io.Closer).Close(), "Close is idempotent")
	key := catest.NewKey(t, catest.ECDSAP256)
	now := time.Now()
	c, err := s.Sign(context.Background(), &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: now, NotAfter: now.Add(time.Hour)}, key.Public())
	assert.Error(t, err)
	assert.Nil(t, c)
}

// BenchmarkIssueIntermediate is the cost of one mesh intermediate (P-256)
// signed on the token (SoftHSM2, P-256), through a ca.Authority.
func BenchmarkIssueIntermediate(b *testing.B) {
	s := newSigner(b, config(b, newCA(b, false)))
	a, err := ca.New(ca.Config{Signer: s})
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

// BenchmarkSign is the cost of one agent certificate signed on the token
// (SoftHSM2, P-256), through a ca.Authority, from parallel callers.
func BenchmarkSign(b *testing.B) {
	s := newSigner(b, config(b, newCA(b, false)))
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(b, err)
	csr, err := ca.ParseCSR(catest.NewCSR(b, catest.NewKey(b, catest.ECDSAP256), nil))
	require.NoError(b, err)
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

// TestRelayIssuerRenewalOnPKCS11: the relay CA on a PKCS#11 token
// (SoftHSM2), as --ca-config gives it (backend.FileSigner), the PIN in a
// file. The issuing CA is replaced the way an HSM operator does it: a new
// key pair generated on the token, certified by the same root, and the
// file's keyLabel and chainFile pointed at it. The reload issues from the
// new key, an agent certificate of the old one stays accepted until it has
// expired, and then the old one is dropped; the PIN is in no log line.
func TestRelayIssuerRenewalOnPKCS11(t *testing.T) {
	root := catest.NewRoot(t, catest.CAOptions{})
	first, second := newCAUnder(t, root), newCAUnder(t, root)
	pinFile := filepath.Join(t.TempDir(), "pin")
	require.NoError(t, os.WriteFile(pinFile, []byte(userPIN+"\n"), 0o600))
	file := filepath.Join(t.TempDir(), "ca.yaml")
	write := func(c tokenCA) {
		y := fmt.Sprintf("type: pkcs11\npkcs11:\n  modulePath: %s\n  tokenLabel: %s\n  keyLabel: %s\n  pinFile: %s\n  chainFile: %s\n  rootsFile: %s\n",
			token(t), tokenLabel, c.label, pinFile, c.chainFile, c.rootsFile)
		require.NoError(t, os.WriteFile(file, []byte(y), 0o600))
	}
	write(first)
	_, _, logs := catest.RunFileRenewal(t, file, func(t *testing.T) { write(second) })
	assert.NotContains(t, logs, userPIN, "the FileSigner's log")
}
