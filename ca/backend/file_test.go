package backend_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/backend"
)

const validCFSSLFile = `type: cfssl
cfssl:
  url: https://cfssl.example:8888
  authKeyFile: /etc/relaymesh/cfssl/auth-key
  chainFile: /etc/relaymesh/cfssl/chain.pem
  rootsFile: /etc/relaymesh/cfssl/roots.pem
  timeout: 10s
`

// A CA back-end file is parsed strictly: every malformed, hostile or
// oversized file is refused with the field named, and a secret written
// into the file itself is refused without being echoed.
func TestParseFileRefusesBadFiles(t *testing.T) {
	f, err := backend.ParseFile([]byte(validCFSSLFile))
	require.NoError(t, err)
	cfg := f.Config(time.Now, nil)
	assert.Equal(t, backend.CFSSL, cfg.Type)
	assert.Equal(t, 10*time.Second, cfg.CFSSL.Timeout)
	assert.NoError(t, cfg.Default().Validate(), "a valid file gives a valid Config")

	const secret = "5ecret-77aa31c0ffee"
	for _, tc := range []struct {
		name, file, want string
	}{
		{"empty", "", "empty"},
		{"white space", " \n\t\n", "empty"},
		{"not YAML", "{{{", "invalid CA back-end file"},
		{"a list", "- type: cfssl\n", "invalid CA back-end file"},
		{"no type", "cfssl:\n  url: https://x\n", `type: "" is not one of pkcs11, cfssl, stepca`},
		{"unknown type", "type: vault\n", `type: "vault" is not one of`},
		{"generated has no file", "type: generated\n", "has its own flags"},
		{"secret has no file", "type: secret\n", "has its own flags"},
		{"type without its section", "type: stepca\n", "stepca: required with type stepca"},
		{"section of another type", "type: cfssl\ncfssl:\n  url: https://x\npkcs11:\n  modulePath: /x.so\n", `pkcs11: set, but type is "cfssl"`},
		{"unknown field", "type: cfssl\ncfssl:\n  url: https://x\n  urll: https://y\n", `unknown field "urll"`},
		{"unknown top-level field", "type: cfssl\ncfssl: {}\nextra: 1\n", `unknown field "extra"`},
		{"inline PIN", "type: pkcs11\npkcs11:\n  pin: " + secret + "\n", "pkcs11.pin: a secret is never written in the file; use pkcs11.pinFile or pkcs11.pinEnv"},
		{"inline auth key", "type: cfssl\ncfssl:\n  authKey: " + secret + "\n", "cfssl.authKey: a secret is never written in the file"},
		{"inline provisioner key", "type: stepca\nstepca:\n  provisionerKey: " + secret + "\n", "stepca.provisionerKey: a secret is never written in the file"},
		{"inline provisioner password", "type: stepca\nstepca:\n  provisionerPassword: " + secret + "\n", "stepca.provisionerPassword: a secret is never written in the file"},
		{"two documents", validCFSSLFile + "---\ntype: stepca\nstepca: {}\n", "more than one YAML document"},
		{"a bad duration", "type: cfssl\ncfssl:\n  timeout: soon\n", "invalid CA back-end file"},
		{"a number for a duration", "type: cfssl\ncfssl:\n  timeout: 30\n", "invalid CA back-end file"},
		{"duplicate key", "type: cfssl\ntype: stepca\ncfssl: {}\n", "invalid CA back-end file"},
		{"oversized", "type: cfssl\n# " + strings.Repeat("x", backend.MaxFileBytes) + "\n", "more than 65536"},
		{"anchors", "type: cfssl\ncfssl: &a\n  url: https://x\nstepca: *a\n", "stepca: set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := backend.ParseFile([]byte(tc.file))
			require.Error(t, err)
			assert.True(t, errors.Is(err, backend.ErrFile), "wraps ErrFile: %v", err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), secret, "the secret is not echoed")
		})
	}
}

// A file whose sections are wrong is refused by the back end's own
// Validate, each problem with its field path, before anything is
// contacted.
func TestFileSignerRefusesInvalidSections(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, file, want string }{
		{"cfssl over plain http to a routable host", "type: cfssl\ncfssl:\n  url: http://10.0.0.1:8888\n  authKeyEnv: K\n  chainFile: c\n  rootsFile: r\n", "cfssl.url"},
		{"cfssl without an auth key", "type: cfssl\ncfssl:\n  url: https://x\n  chainFile: c\n  rootsFile: r\n", "cfssl.authKeyFile, authKeyEnv: one is required"},
		{"stepca over http", "type: stepca\nstepca:\n  url: http://127.0.0.1:9000\n  provisioner: p\n  provisionerKeyFile: k\n  chainFile: c\n  rootsFile: r\n", "stepca.url"},
		{"stepca without a provisioner", "type: stepca\nstepca:\n  url: https://x\n  provisionerKeyFile: k\n  chainFile: c\n  rootsFile: r\n", "stepca.provisioner: required"},
		{"pkcs11 without a PIN source", "type: pkcs11\npkcs11:\n  modulePath: /m.so\n  tokenLabel: t\n  keyLabel: k\n  chainFile: c\n  rootsFile: r\n", "pkcs11.pinFile, pinEnv: one is required"},
		{"pkcs11 with a bad key id", "type: pkcs11\npkcs11:\n  modulePath: /m.so\n  tokenLabel: t\n  keyID: xyz\n  pinEnv: P\n  chainFile: c\n  rootsFile: r\n", "pkcs11.keyID"},
		{"stepca with a token lifetime too long", "type: stepca\nstepca:\n  url: https://x\n  provisioner: p\n  provisionerKeyFile: k\n  chainFile: c\n  rootsFile: r\n  tokenLifetime: 1h\n", "stepca.tokenLifetime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			require.NoError(t, os.WriteFile(p, []byte(tc.file), 0o600))
			_, err := backend.NewFileSigner(context.Background(), backend.FileSignerConfig{Path: p, Keep: time.Hour})
			require.Error(t, err)
			assert.True(t, errors.Is(err, ca.ErrInvalidSigner), "wraps ErrInvalidSigner: %v", err)
			assert.Contains(t, err.Error(), p, "names the file")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("no file", func(t *testing.T) {
		_, err := backend.NewFileSigner(context.Background(), backend.FileSignerConfig{Path: filepath.Join(dir, "missing.yaml"), Keep: time.Hour})
		assert.ErrorIs(t, err, backend.ErrFile)
		assert.ErrorIs(t, err, os.ErrNotExist)
	})
	t.Run("no keep", func(t *testing.T) {
		_, err := backend.NewFileSigner(context.Background(), backend.FileSignerConfig{Path: "x"})
		assert.ErrorContains(t, err, "keep: must be positive")
	})
	t.Run("a directory", func(t *testing.T) {
		_, err := backend.NewFileSigner(context.Background(), backend.FileSignerConfig{Path: dir, Keep: time.Hour})
		assert.ErrorIs(t, err, backend.ErrFile)
	})
}

func FuzzParseFile(f *testing.F) {
	f.Add([]byte(validCFSSLFile))
	f.Add([]byte("type: pkcs11\npkcs11:\n  modulePath: /m.so\n  pinEnv: P\n"))
	f.Add([]byte("type: stepca\nstepca:\n  tokenLifetime: 1m\n"))
	f.Add([]byte("---\ntype: cfssl\n---\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := backend.ParseFile(b)
		if err != nil {
			if !errors.Is(err, backend.ErrFile) {
				t.Fatalf("error does not wrap ErrFile: %v", err)
			}
			return
		}
		switch file.Type {
		case backend.PKCS11, backend.CFSSL, backend.StepCA:
		default:
			t.Fatalf("accepted type %q", file.Type)
		}
		cfg := file.Config(time.Now, nil)
		if cfg.Type != file.Type {
			t.Fatalf("Config type %q, file type %q", cfg.Type, file.Type)
		}
	})
}
