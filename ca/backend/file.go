package backend

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/relaymesh/relaymesh/ca/cfsslca"
	"github.com/relaymesh/relaymesh/ca/hsm"
	"github.com/relaymesh/relaymesh/ca/stepca"
)

// MaxFileBytes bounds a CA back-end file (--ca-config).
const MaxFileBytes = 64 << 10

// File is the relay CA's back end as an operator writes it in the YAML or
// JSON file of the server's --ca-config: the type and its section. Only
// the enterprise back ends that keep the CA key outside Relaymesh are
// here (pkcs11, cfssl, stepca); the generated and provided CAs have their
// own flags. A secret (PIN, auth key, provisioner key and password) is
// never in the file itself, only the file or environment variable that
// holds it, so the file can live in a ConfigMap.
type File struct {
	Type   Type        `json:"type"`
	PKCS11 *FilePKCS11 `json:"pkcs11,omitempty"`
	CFSSL  *FileCFSSL  `json:"cfssl,omitempty"`
	StepCA *FileStepCA `json:"stepca,omitempty"`
	// PreviousIssuersFile optionally holds PEM issuing CAs this one
	// replaced whose agent certificates are still accepted until their
	// NotAfter (see Reloading): what an operator lists when replacing the
	// chain across a restart of every replica.
	PreviousIssuersFile string `json:"previousIssuersFile,omitempty"`
}

// FilePKCS11 is the pkcs11 section of a File (hsm.Config).
type FilePKCS11 struct {
	ModulePath string `json:"modulePath"`
	TokenLabel string `json:"tokenLabel"`
	KeyLabel   string `json:"keyLabel,omitempty"`
	KeyID      string `json:"keyID,omitempty"`
	PINFile    string `json:"pinFile,omitempty"`
	PINEnv     string `json:"pinEnv,omitempty"`
	ChainFile  string `json:"chainFile"`
	RootsFile  string `json:"rootsFile"`
	// PIN is refused: only its file or environment variable.
	PIN *string `json:"pin,omitempty"`
}

// FileCFSSL is the cfssl section of a File (cfsslca.Config).
type FileCFSSL struct {
	URL               string           `json:"url"`
	AuthKeyFile       string           `json:"authKeyFile,omitempty"`
	AuthKeyEnv        string           `json:"authKeyEnv,omitempty"`
	Profiles          cfsslca.Profiles `json:"profiles,omitempty"`
	ChainFile         string           `json:"chainFile"`
	RootsFile         string           `json:"rootsFile"`
	TLSRootsFile      string           `json:"tlsRootsFile,omitempty"`
	AllowInsecureHTTP bool             `json:"allowInsecureHTTP,omitempty"`
	Timeout           Duration         `json:"timeout,omitempty"`
	ValidityLeeway    Duration         `json:"validityLeeway,omitempty"`
	// AuthKey is refused: only its file or environment variable.
	AuthKey *string `json:"authKey,omitempty"`
}

// FileStepCA is the stepca section of a File (stepca.Config).
type FileStepCA struct {
	URL                     string   `json:"url"`
	Provisioner             string   `json:"provisioner"`
	ProvisionerKeyFile      string   `json:"provisionerKeyFile"`
	ProvisionerPasswordFile string   `json:"provisionerPasswordFile,omitempty"`
	ChainFile               string   `json:"chainFile"`
	RootsFile               string   `json:"rootsFile"`
	TLSRootsFile            string   `json:"tlsRootsFile,omitempty"`
	TokenLifetime           Duration `json:"tokenLifetime,omitempty"`
	Timeout                 Duration `json:"timeout,omitempty"`
	// ProvisionerKey and ProvisionerPassword are refused: only their files.
	ProvisionerKey      *string `json:"provisionerKey,omitempty"`
	ProvisionerPassword *string `json:"provisionerPassword,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("30s").
type Duration time.Duration

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("not a duration string: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Duration(d).String() + `"`), nil
}

// ErrFile marks a CA back-end file that cannot be used.
var ErrFile = errors.New("invalid CA back-end file")

// ParseFile parses a CA back-end file strictly: unknown fields, a second
// document, a type other than pkcs11, cfssl or stepca, a section of
// another type, and any secret written into the file itself are refused,
// with the field named. The sections are validated by Config.Validate.
func ParseFile(b []byte) (File, error) {
	var f File
	if len(b) > MaxFileBytes {
		return f, fmt.Errorf("%w: %d bytes, more than %d", ErrFile, len(b), MaxFileBytes)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return f, fmt.Errorf("%w: empty", ErrFile)
	}
	if documents(b) > 1 {
		return f, fmt.Errorf("%w: more than one YAML document", ErrFile)
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return File{}, fmt.Errorf("%w: %w", ErrFile, err)
	}
	var errs []error
	inline := func(field string, set bool, instead string) {
		if set {
			errs = append(errs, fmt.Errorf("%s: a secret is never written in the file; use %s", field, instead))
		}
	}
	sections := map[Type]bool{PKCS11: f.PKCS11 != nil, CFSSL: f.CFSSL != nil, StepCA: f.StepCA != nil}
	switch f.Type {
	case PKCS11, CFSSL, StepCA:
		if !sections[f.Type] {
			errs = append(errs, fmt.Errorf("%s: required with type %s", f.Type, f.Type))
		}
	case Generated, Secret:
		errs = append(errs, fmt.Errorf("type: %q has its own flags (no flag for the generated CA; --ca-cert/--ca-key/--ca-roots or --ca-secret for a provided one)", f.Type))
	default:
		errs = append(errs, fmt.Errorf("type: %q is not one of pkcs11, cfssl, stepca", f.Type))
	}
	for _, t := range []Type{PKCS11, CFSSL, StepCA} {
		if sections[t] && t != f.Type {
			errs = append(errs, fmt.Errorf("%s: set, but type is %q", t, f.Type))
		}
	}
	if f.PKCS11 != nil {
		inline("pkcs11.pin", f.PKCS11.PIN != nil, "pkcs11.pinFile or pkcs11.pinEnv")
	}
	if f.CFSSL != nil {
		inline("cfssl.authKey", f.CFSSL.AuthKey != nil, "cfssl.authKeyFile or cfssl.authKeyEnv")
	}
	if f.StepCA != nil {
		inline("stepca.provisionerKey", f.StepCA.ProvisionerKey != nil, "stepca.provisionerKeyFile")
		inline("stepca.provisionerPassword", f.StepCA.ProvisionerPassword != nil, "stepca.provisionerPasswordFile")
	}
	if err := errors.Join(errs...); err != nil {
		return File{}, fmt.Errorf("%w: %w", ErrFile, err)
	}
	return f, nil
}

// Config is the back-end Config of f, with clock and logger. Call
// Config.Validate (or New) on it for the sections' own checks.
func (f File) Config(clock func() time.Time, logger *slog.Logger) Config {
	c := Config{Type: f.Type}
	switch {
	case f.Type == PKCS11 && f.PKCS11 != nil:
		p := f.PKCS11
		c.PKCS11 = hsm.Config{ModulePath: p.ModulePath, TokenLabel: p.TokenLabel, KeyLabel: p.KeyLabel, KeyID: p.KeyID,
			PINFile: p.PINFile, PINEnv: p.PINEnv, ChainFile: p.ChainFile, RootsFile: p.RootsFile, Clock: clock, Logger: logger}
	case f.Type == CFSSL && f.CFSSL != nil:
		p := f.CFSSL
		c.CFSSL = cfsslca.Config{URL: p.URL, AuthKeyFile: p.AuthKeyFile, AuthKeyEnv: p.AuthKeyEnv, Profiles: p.Profiles,
			ChainFile: p.ChainFile, RootsFile: p.RootsFile, TLSRootsFile: p.TLSRootsFile, AllowInsecureHTTP: p.AllowInsecureHTTP,
			Timeout: time.Duration(p.Timeout), ValidityLeeway: time.Duration(p.ValidityLeeway), Clock: clock, Logger: logger}
	case f.Type == StepCA && f.StepCA != nil:
		p := f.StepCA
		c.StepCA = stepca.Config{URL: p.URL, Provisioner: p.Provisioner, ProvisionerKeyFile: p.ProvisionerKeyFile,
			ProvisionerPasswordFile: p.ProvisionerPasswordFile, ChainFile: p.ChainFile, RootsFile: p.RootsFile,
			TLSRootsFile: p.TLSRootsFile, TokenLifetime: time.Duration(p.TokenLifetime), Timeout: time.Duration(p.Timeout),
			Clock: clock, Logger: logger}
	}
	return c
}

// Files are the files f names whose change changes the back end: the
// chain, the roots and the previous issuers (the secrets are read at
// every rebuild and not watched).
func (f File) Files() []string {
	var out []string
	switch {
	case f.PKCS11 != nil:
		out = append(out, f.PKCS11.ChainFile, f.PKCS11.RootsFile)
	case f.CFSSL != nil:
		out = append(out, f.CFSSL.ChainFile, f.CFSSL.RootsFile, f.CFSSL.TLSRootsFile)
	case f.StepCA != nil:
		out = append(out, f.StepCA.ChainFile, f.StepCA.RootsFile, f.StepCA.TLSRootsFile)
	}
	return append(out, f.PreviousIssuersFile)
}

// LoadFile reads and parses the CA back-end file at path and returns it
// with a fingerprint of its content and of every file it names (Files):
// a changed fingerprint means the back end must be built again.
func LoadFile(path string) (File, []byte, error) {
	b, err := readBounded(path, MaxFileBytes)
	if err != nil {
		return File{}, nil, fmt.Errorf("%w: %w", ErrFile, err)
	}
	f, err := ParseFile(b)
	if err != nil {
		return File{}, nil, err
	}
	h := sha256.New()
	h.Write(b)
	for _, name := range f.Files() {
		if name == "" {
			continue
		}
		// A missing or unreadable file is reported when the back end is
		// built; here it only changes the fingerprint.
		c, err := readBounded(name, 1<<20)
		fmt.Fprintf(h, "\x00%s\x00%t\x00", name, err == nil)
		h.Write(c)
	}
	return f, h.Sum(nil), nil
}

// readBounded reads at most limit bytes of path; a longer file is an
// error.
func readBounded(path string, limit int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = fh.Close() }()
	b, err := io.ReadAll(io.LimitReader(fh, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than %d bytes", path, limit)
	}
	return b, nil
}

// documents counts the YAML documents of b: a "---" line after content
// starts another.
func documents(b []byte) int {
	n, content := 1, false
	for _, line := range bytes.Split(b, []byte("\n")) {
		t := bytes.TrimSpace(line)
		switch {
		case bytes.HasPrefix(t, []byte("---")) && content:
			n++
			content = false
		case len(t) > 0 && !bytes.HasPrefix(t, []byte("---")) && t[0] != '#':
			content = true
		}
	}
	return n
}
