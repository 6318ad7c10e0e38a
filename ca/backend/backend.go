// Package backend builds a ca.Signer from configuration — the relay CA's
// (server/app, from the server's flags) and a VirtualMesh root's (trust,
// from the VirtualMesh's rootCA.pkcs11 or rootCA.external): one Config
// with a Type and a section per back end, validated in one place, and one
// constructor that switches over an explicit list of back ends (no
// registry, no init-time registration). It is the one list of back ends.
//
//   - generated: a root and an issuing CA that Relaymesh creates and keeps
//     in management-cluster Secrets (ca.LoadOrCreateRelayCA).
//   - secret: a provided CA, certificate chain, key and roots from PEM
//     files or from a Kubernetes TLS Secret (ca.ParseSignerPEM).
//   - pkcs11: a provided CA whose key lives in an HSM (package ca/hsm).
//   - cfssl: a remote cfssl (package ca/cfsslca).
//   - stepca: a remote step-ca (package ca/stepca).
package backend

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/cfsslca"
	"github.com/relaymesh/relaymesh/ca/hsm"
	"github.com/relaymesh/relaymesh/ca/stepca"
)

// Type names a signer back end.
type Type string

// The back ends.
const (
	Generated Type = "generated"
	Secret    Type = "secret"
	PKCS11    Type = "pkcs11"
	CFSSL     Type = "cfssl"
	StepCA    Type = "stepca"
)

// Types lists every back end.
var Types = []Type{Generated, Secret, PKCS11, CFSSL, StepCA}

// Config selects and configures one back end. Only the section of Type may
// be set.
type Config struct {
	// Type is the back end. Required.
	Type      Type
	Generated GeneratedConfig
	Secret    SecretConfig
	PKCS11    hsm.Config
	CFSSL     cfsslca.Config
	StepCA    stepca.Config
}

// GeneratedConfig configures the generated relay CA.
type GeneratedConfig struct {
	// Client and Namespace locate the management cluster Secrets that
	// hold the CA. Required.
	Client    kubernetes.Interface
	Namespace string
	// CA shapes a CA generated now; an existing one is used as it is.
	CA ca.GenerateConfig
}

// SecretConfig configures a provided CA held in memory: either the three
// PEM files, or a Kubernetes TLS Secret (tls.crt, tls.key, ca.crt).
type SecretConfig struct {
	// CertFile (the issuing CA certificate, then intermediates), KeyFile
	// (its unencrypted private key) and RootsFile.
	CertFile, KeyFile, RootsFile string
	// Name of the Secret in Namespace, read with Client.
	Name      string
	Namespace string
	Client    kubernetes.Interface
	// Clock returns the current time; default time.Now.
	Clock func() time.Time
}

// Default returns c with the defaults of its Type's section applied.
func (c Config) Default() Config {
	switch c.Type {
	case Secret:
		if c.Secret.Clock == nil {
			c.Secret.Clock = time.Now
		}
	case PKCS11:
		c.PKCS11 = c.PKCS11.Default()
	case CFSSL:
		c.CFSSL = c.CFSSL.Default()
	case StepCA:
		c.StepCA = c.StepCA.Default()
	}
	return c
}

// Validate reports every problem with c, each prefixed with its field path
// (such as "pkcs11.modulePath: required"). It reads no files and makes no
// requests; call Default first.
func (c Config) Validate() error {
	if !slices.Contains(Types, c.Type) {
		names := make([]string, len(Types))
		for i, t := range Types {
			names[i] = string(t)
		}
		return fmt.Errorf("type: %q is not one of %s", c.Type, strings.Join(names, ", "))
	}
	var errs []error
	sections := []struct {
		t       Type
		field   string
		section any
	}{
		{Generated, "generated", c.Generated}, {Secret, "secret", c.Secret},
		{PKCS11, "pkcs11", c.PKCS11}, {CFSSL, "cfssl", c.CFSSL}, {StepCA, "stepca", c.StepCA},
	}
	for _, s := range sections {
		if s.t != c.Type && !reflect.ValueOf(s.section).IsZero() {
			errs = append(errs, fmt.Errorf("%s: set, but type is %s", s.field, c.Type))
		}
	}
	switch c.Type {
	case Generated:
		if c.Generated.Client == nil {
			errs = append(errs, errors.New("generated.client: required"))
		}
		if c.Generated.Namespace == "" {
			errs = append(errs, errors.New("generated.namespace: required"))
		}
		errs = append(errs, prefixed("generated.ca", c.Generated.CA.Default().Validate())...)
	case Secret:
		errs = append(errs, c.Secret.validate()...)
	case PKCS11:
		errs = append(errs, prefixed("pkcs11", c.PKCS11.Validate())...)
	case CFSSL:
		errs = append(errs, prefixed("cfssl", c.CFSSL.Validate())...)
	case StepCA:
		errs = append(errs, prefixed("stepca", c.StepCA.Validate())...)
	}
	return errors.Join(errs...)
}

func (s SecretConfig) validate() []error {
	files := s.CertFile != "" || s.KeyFile != "" || s.RootsFile != ""
	secret := s.Name != "" || s.Namespace != "" || s.Client != nil
	var errs []error
	switch {
	case files && secret:
		errs = append(errs, errors.New("secret: certFile/keyFile/rootsFile and name/namespace/client are alternatives"))
	case files:
		for field, v := range map[string]string{"secret.certFile": s.CertFile, "secret.keyFile": s.KeyFile, "secret.rootsFile": s.RootsFile} {
			if v == "" {
				errs = append(errs, fmt.Errorf("%s: required with the other files", field))
			}
		}
	case secret:
		if s.Name == "" {
			errs = append(errs, errors.New("secret.name: required"))
		}
		if s.Namespace == "" {
			errs = append(errs, errors.New("secret.namespace: required"))
		}
		if s.Client == nil {
			errs = append(errs, errors.New("secret.client: required"))
		}
	default:
		errs = append(errs, errors.New("secret: certFile, keyFile and rootsFile, or name, namespace and client, are required"))
	}
	if s.Clock == nil {
		errs = append(errs, errors.New("secret.clock: required"))
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errs
}

// prefixed puts "prefix." before every error of a joined error.
func prefixed(prefix string, err error) []error {
	if err == nil {
		return nil
	}
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, len(list))
	for i, e := range list {
		out[i] = fmt.Errorf("%s.%w", prefix, e)
	}
	return out
}

// New applies cfg.Default, validates cfg and builds the back end's Signer.
// Errors of an invalid config wrap ca.ErrInvalidSigner. Signers that hold
// resources (pkcs11) implement io.Closer.
func New(ctx context.Context, cfg Config) (ca.Signer, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: CA back end: invalid config: %w", ca.ErrInvalidSigner, err)
	}
	switch cfg.Type {
	case Generated:
		return ca.LoadOrCreateRelayCA(ctx, cfg.Generated.Client, cfg.Generated.Namespace, cfg.Generated.CA)
	case Secret:
		s := cfg.Secret
		if s.CertFile != "" {
			return ca.LoadSignerFiles(s.CertFile, s.KeyFile, s.RootsFile, s.Clock())
		}
		sec, err := s.Client.CoreV1().Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("%w: secret %s/%s: %w", ca.ErrInvalidSigner, s.Namespace, s.Name, err)
		}
		signer, err := ca.ParseSignerPEM(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey], sec.Data["ca.crt"], s.Clock())
		if err != nil {
			return nil, fmt.Errorf("secret %s/%s: %w", s.Namespace, s.Name, err)
		}
		return signer, nil
	case PKCS11:
		return hsm.New(ctx, cfg.PKCS11)
	case CFSSL:
		return cfsslca.New(ctx, cfg.CFSSL)
	case StepCA:
		return stepca.New(ctx, cfg.StepCA)
	}
	return nil, fmt.Errorf("%w: CA back end: unknown type %q", ca.ErrInvalidSigner, cfg.Type)
}
