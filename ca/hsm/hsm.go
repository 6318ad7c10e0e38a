// Package hsm is the pkcs11 signer back end: the relay CA key lives in a
// hardware security module (or any PKCS#11 token, such as SoftHSM) and
// never leaves it. The CA certificate, its intermediates and the roots are
// ordinary PEM, in files or in memory; every signature is made by the
// token.
//
// It uses the PKCS#11 key manager of go.step.sm/crypto/kms (which needs
// cgo: a binary built with CGO_ENABLED=0, such as the static image, has
// this package, and New refuses every token with ErrNoCgo) and wraps the token's key in ca.NewKeySigner, so an HSM-backed CA
// issues exactly like an in-memory one: same template, same checks, and no
// Leeway.
//
// The user PIN comes from a file or an environment variable named in the
// Config, or from the Config itself (PIN, for a caller that read it from a
// Kubernetes Secret). It is used to log in to the token and then forgotten
// by this package; it never appears in an error or a log line (errors from
// the PKCS#11 stack are scrubbed of it as well).
package hsm

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.step.sm/crypto/kms/apiv1"
	kmspkcs11 "go.step.sm/crypto/kms/pkcs11"
	"go.step.sm/crypto/kms/uri"

	"github.com/relaymesh/relaymesh/ca"
)

// scheme is the URI scheme of PKCS#11 keys in go.step.sm/crypto/kms.
const scheme = "pkcs11"

// ErrNoCgo is why New refuses every token in a binary built without cgo.
var ErrNoCgo = errors.New("this relaymesh binary was built without cgo (CGO_ENABLED=0, like the static image), and PKCS#11 needs cgo: run a cgo build of relaymesh for an HSM-backed CA")

// Config configures the pkcs11 back end.
type Config struct {
	// ModulePath is the token's PKCS#11 module, a shared library such as
	// /usr/lib/softhsm/libsofthsm2.so. Required: there is no default
	// module.
	ModulePath string
	// TokenLabel names the token that holds the CA key. Required.
	TokenLabel string
	// KeyLabel (CKA_LABEL) and KeyID (CKA_ID, in hex) name the CA's key
	// pair on the token. At least one is required; with both, the key must
	// match both.
	KeyLabel string
	KeyID    string
	// PINFile is a file holding the token's user PIN (trailing white space
	// ignored); PINEnv is the name of an environment variable holding it;
	// PIN is the PIN itself (trailing white space ignored). Exactly one is
	// required. The PIN is never logged or put in an error.
	PINFile string
	PINEnv  string
	PIN     []byte
	// ChainFile holds the PEM CA certificate of the token's key, then any
	// intermediates above it in order; ChainPEM is the same PEM in memory.
	// Exactly one is required.
	ChainFile string
	ChainPEM  []byte
	// RootsFile holds the PEM roots the chain verifies to; RootsPEM is the
	// same PEM in memory. Exactly one is required.
	RootsFile string
	RootsPEM  []byte
	// Clock returns the current time; default time.Now.
	Clock func() time.Time
	// Logger receives start-up and shutdown messages; default: discarded.
	Logger *slog.Logger
}

// Default returns c with every zero field that has a default set.
func (c Config) Default() Config {
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c, each prefixed with its field path.
// It reads no files; call Default first.
func (c Config) Validate() error {
	var errs []error
	required := func(field, v string) {
		if strings.TrimSpace(v) == "" {
			errs = append(errs, fmt.Errorf("%s: required", field))
		}
	}
	required("modulePath", c.ModulePath)
	required("tokenLabel", c.TokenLabel)
	if c.KeyLabel == "" && c.KeyID == "" {
		errs = append(errs, errors.New("keyLabel, keyID: at least one is required"))
	}
	if c.KeyID != "" {
		if _, err := hex.DecodeString(c.KeyID); err != nil {
			errs = append(errs, fmt.Errorf("keyID: %q is not an even number of hex digits", c.KeyID))
		}
	}
	for _, err := range []error{
		ca.ExactlyOne("pinFile, pinEnv: one is required (or pin)", ca.Alternative{Field: "pinFile", Set: c.PINFile != ""}, ca.Alternative{Field: "pinEnv", Set: c.PINEnv != ""}, ca.Alternative{Field: "pin", Set: len(c.PIN) != 0}),
		ca.ExactlyOne("chainFile: required (or chainPEM)", ca.Alternative{Field: "chainFile", Set: c.ChainFile != ""}, ca.Alternative{Field: "chainPEM", Set: len(c.ChainPEM) != 0}),
		ca.ExactlyOne("rootsFile: required (or rootsPEM)", ca.Alternative{Field: "rootsFile", Set: c.RootsFile != ""}, ca.Alternative{Field: "rootsPEM", Set: len(c.RootsPEM) != 0}),
	} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("clock: required"))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("logger: required"))
	}
	return errors.Join(errs...)
}

// signer is a ca.Signer whose key lives on a PKCS#11 token.
type signer struct {
	ca.Signer
	kms   *kmspkcs11.PKCS11
	close sync.Once
	err   error
}

// New logs in to the token, finds the CA key and checks it against the CA
// certificate. It applies cfg.Default and validates cfg. Errors wrap
// ca.ErrInvalidSigner and name what is wrong (module, token, PIN, key,
// certificate) without the PIN.
//
// The returned Signer holds a PKCS#11 session pool and implements
// io.Closer; close it when done. Sign is safe for concurrent use. A
// signature, once started on the token, is not interrupted by its context.
func New(ctx context.Context, cfg Config) (ca.Signer, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: pkcs11: invalid config: %w", ca.ErrInvalidSigner, err)
	}
	if !cgoBuild {
		return nil, fmt.Errorf("%w: pkcs11: %w", ca.ErrInvalidSigner, ErrNoCgo)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	chain, _, err := ca.ReadCertificatesFrom("pkcs11", "chain", cfg.ChainFile, cfg.ChainPEM)
	if err != nil {
		return nil, err
	}
	roots, _, err := ca.ReadCertificatesFrom("pkcs11", "roots", cfg.RootsFile, cfg.RootsPEM)
	if err != nil {
		return nil, err
	}
	pin, err := readPIN(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(cfg.ModulePath); err != nil {
		return nil, fmt.Errorf("%w: pkcs11: module %s: %w", ca.ErrInvalidSigner, cfg.ModulePath, err)
	}
	k, err := kmspkcs11.New(ctx, apiv1.Options{
		Type: apiv1.PKCS11,
		URI: uri.New(scheme, url.Values{
			"module-path": {cfg.ModulePath},
			"token":       {cfg.TokenLabel},
		}).String(),
		Pin: pin,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: pkcs11: open token %q with module %s: %w", ca.ErrInvalidSigner, cfg.TokenLabel, cfg.ModulePath, explain(err, pin))
	}
	s, err := newSigner(ctx, cfg, k, chain, roots, pin)
	if err != nil {
		if cerr := k.Close(); cerr != nil {
			cfg.Logger.Warn("closing the PKCS#11 token failed", "component", "ca/hsm", "token", cfg.TokenLabel, "error", explain(cerr, pin))
		}
		return nil, err
	}
	cfg.Logger.Info("CA key on PKCS#11 token", "component", "ca/hsm", "token", cfg.TokenLabel, "key", keyName(cfg), "issuer", chain[0].Subject.String())
	return s, nil
}

func newSigner(ctx context.Context, cfg Config, k *kmspkcs11.PKCS11, chain, roots []*x509.Certificate, pin string) (*signer, error) {
	key, err := k.CreateSigner(&apiv1.CreateSignerRequest{SigningKey: keyURI(cfg)})
	if err != nil {
		var nf apiv1.NotFoundError
		if errors.As(err, &nf) || strings.Contains(err.Error(), "not found") {
			return nil, fmt.Errorf("%w: pkcs11: no key %s on token %q", ca.ErrInvalidSigner, keyName(cfg), cfg.TokenLabel)
		}
		return nil, fmt.Errorf("%w: pkcs11: key %s on token %q: %w", ca.ErrInvalidSigner, keyName(cfg), cfg.TokenLabel, explain(err, pin))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ks, err := ca.NewKeySigner(chain, key, roots, cfg.Clock())
	if err != nil {
		return nil, fmt.Errorf("pkcs11: key %s on token %q: %w", keyName(cfg), cfg.TokenLabel, err)
	}
	return &signer{Signer: ks, kms: k}, nil
}

// Close ends the PKCS#11 sessions. Signing after Close fails.
func (s *signer) Close() error {
	s.close.Do(func() { s.err = s.kms.Close() })
	return s.err
}

var _ io.Closer = (*signer)(nil)

// keyURI names the key for the KMS: id (hex) and/or object (label).
func keyURI(cfg Config) string {
	v := url.Values{}
	if cfg.KeyID != "" {
		v.Set("id", strings.ToLower(cfg.KeyID))
	}
	if cfg.KeyLabel != "" {
		v.Set("object", cfg.KeyLabel)
	}
	return uri.New(scheme, v).String()
}

// keyName describes the key in messages.
func keyName(cfg Config) string {
	var parts []string
	if cfg.KeyLabel != "" {
		parts = append(parts, fmt.Sprintf("label %q", cfg.KeyLabel))
	}
	if cfg.KeyID != "" {
		parts = append(parts, "id "+strings.ToLower(cfg.KeyID))
	}
	return "with " + strings.Join(parts, " and ")
}

// readPIN reads the PIN from the file or environment variable cfg names, or
// takes cfg.PIN. Errors name the source, never the content.
func readPIN(cfg Config) (string, error) {
	var pin string
	switch {
	case len(cfg.PIN) != 0:
		pin = strings.TrimRight(string(cfg.PIN), " \t\r\n")
	case cfg.PINFile != "":
		b, err := os.ReadFile(cfg.PINFile)
		if err != nil {
			return "", fmt.Errorf("%w: pkcs11: PIN file: %w", ca.ErrInvalidSigner, err)
		}
		pin = strings.TrimRight(string(b), " \t\r\n")
	default:
		v, ok := os.LookupEnv(cfg.PINEnv)
		if !ok {
			return "", fmt.Errorf("%w: pkcs11: PIN environment variable %s is not set", ca.ErrInvalidSigner, cfg.PINEnv)
		}
		pin = strings.TrimRight(v, " \t\r\n")
	}
	if pin == "" {
		return "", fmt.Errorf("%w: pkcs11: the PIN (from %s) is empty", ca.ErrInvalidSigner, pinSource(cfg))
	}
	return pin, nil
}

func pinSource(cfg Config) string {
	switch {
	case len(cfg.PIN) != 0:
		return "field pin"
	case cfg.PINFile != "":
		return "file " + cfg.PINFile
	}
	return "environment variable " + cfg.PINEnv
}

// explain turns an error of the PKCS#11 stack into one that says what went
// wrong, and guarantees the PIN is not in it: a message that contains it is
// replaced, not wrapped.
func explain(err error, pin string) error {
	if msg, ok := loginError(err); ok {
		return errors.New(msg)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "could not find PKCS#11 token"):
		return errors.New("no token with this label (is the token initialized, and does the module's configuration, such as SOFTHSM2_CONF, point at it?)")
	case strings.Contains(msg, "failed to open module"):
		return errors.New("the module could not be loaded (not a PKCS#11 library, or a dependency is missing)")
	case strings.Contains(msg, "compiled without cgo"):
		return errors.New("this binary was built without cgo, which PKCS#11 needs")
	}
	if pin != "" && strings.Contains(msg, pin) {
		return errors.New(scrub(msg, pin))
	}
	return err
}

// scrub removes the PIN from a message.
func scrub(msg, pin string) string {
	if pin == "" {
		return msg
	}
	return strings.ReplaceAll(msg, pin, "[PIN]")
}
