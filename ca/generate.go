package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"
)

// Defaults and bounds of GenerateConfig.
const (
	defaultOrg       = "relaymesh"
	defaultRootTTL   = 10 * 365 * 24 * time.Hour
	defaultIssuerTTL = 365 * 24 * time.Hour

	minCATTL   = time.Minute
	maxRootTTL = 30 * 365 * 24 * time.Hour
	maxOrgLen  = 64 // ub-organization-name, RFC 5280

	// caBackdate moves a generated CA's NotBefore into the past. It is at
	// least maxBackdate, so leaves issued right after generation can
	// be backdated fully.
	caBackdate = maxBackdate
)

// GenerateConfig configures GenerateRelayCA.
type GenerateConfig struct {
	// Org is the subject organization of the root and the issuing CA;
	// default "relaymesh", at most 64 bytes.
	Org string
	// RootTTL is the root's lifetime; default 10 years, between 1m and 30
	// years.
	RootTTL time.Duration
	// IssuerTTL is the issuing CA's lifetime; default 1 year, between 1m and
	// RootTTL.
	IssuerTTL time.Duration
	// Clock returns the current time; default time.Now.
	Clock func() time.Time
	// Rand is the source of serial numbers; default crypto/rand.Reader.
	// Keys always come from the operating system's CSPRNG: Go ignores
	// custom readers for key generation.
	Rand io.Reader
}

// Default returns c with every zero field set to its default.
func (c GenerateConfig) Default() GenerateConfig {
	if c.Org == "" {
		c.Org = defaultOrg
	}
	if c.RootTTL == 0 {
		c.RootTTL = defaultRootTTL
	}
	if c.IssuerTTL == 0 {
		c.IssuerTTL = defaultIssuerTTL
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	return c
}

// Validate reports every problem with c, each prefixed with its field path.
// It does not apply defaults; call Default first.
func (c GenerateConfig) Validate() error {
	var errs []error
	if c.Org == "" || len(c.Org) > maxOrgLen {
		errs = append(errs, fmt.Errorf("org: must be 1 to %d bytes long", maxOrgLen))
	}
	if c.RootTTL < minCATTL || c.RootTTL > maxRootTTL {
		errs = append(errs, fmt.Errorf("rootTTL: %v is outside [%v, %v]", c.RootTTL, minCATTL, maxRootTTL))
	}
	if c.IssuerTTL < minCATTL || c.IssuerTTL > c.RootTTL {
		errs = append(errs, fmt.Errorf("issuerTTL: %v is outside [%v, rootTTL %v]", c.IssuerTTL, minCATTL, c.RootTTL))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("clock: required"))
	}
	if c.Rand == nil {
		errs = append(errs, errors.New("rand: required"))
	}
	return errors.Join(errs...)
}

// RelayCA is the generated relay CA: a self-signed root and the issuing
// intermediate it signed, with their keys.
type RelayCA struct {
	Root, Issuer       *x509.Certificate
	RootKey, IssuerKey crypto.Signer
}

// GenerateRelayCA makes a relay CA: a self-signed root (ECDSA P-256,
// pathLen 1, RootTTL) and an issuing intermediate (ECDSA P-256, pathLen 0,
// IssuerTTL, never outliving the root) signed by it. It applies cfg.Default
// and validates cfg first.
func GenerateRelayCA(cfg GenerateConfig) (*RelayCA, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ca: invalid generate config: %w", err)
	}
	now := cfg.Clock()
	rootKey, err := keyutil.GenerateSigner("EC", "P-256", 0)
	if err != nil {
		return nil, fmt.Errorf("generate root key: %w", err)
	}
	notBefore := now.Add(-caBackdate).Truncate(time.Second).UTC()

	rootSerial, err := randomSerial(cfg.Rand)
	if err != nil {
		return nil, fmt.Errorf("root serial number: %w", err)
	}
	rootTmpl := &x509.Certificate{
		SerialNumber:          rootSerial,
		Subject:               pkix.Name{Organization: []string{cfg.Org}, CommonName: "relaymesh relay root CA"},
		NotBefore:             notBefore,
		NotAfter:              now.Add(cfg.RootTTL).Truncate(time.Second).UTC(),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            1,
	}
	root, err := createCert(cfg.Rand, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		return nil, fmt.Errorf("create root certificate: %w", err)
	}

	issuer, issuerKey, err := newRelayIssuer(cfg, root, rootKey)
	if err != nil {
		return nil, err
	}
	r := &RelayCA{Root: root, Issuer: issuer, RootKey: rootKey, IssuerKey: issuerKey}
	// Validate the result like any provided CA.
	if err := r.check(now); err != nil {
		return nil, fmt.Errorf("generated relay CA: %w", err)
	}
	return r, nil
}

// newRelayIssuer makes an issuing intermediate (ECDSA P-256, pathLen 0,
// cfg.IssuerTTL, never outliving root) signed by root's key. cfg must have
// been defaulted.
func newRelayIssuer(cfg GenerateConfig, root *x509.Certificate, rootKey crypto.Signer) (*x509.Certificate, crypto.Signer, error) {
	now := cfg.Clock()
	issuerKey, err := keyutil.GenerateSigner("EC", "P-256", 0)
	if err != nil {
		return nil, nil, fmt.Errorf("generate issuing CA key: %w", err)
	}
	issuerSerial, err := randomSerial(cfg.Rand)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing CA serial number: %w", err)
	}
	issuerNotAfter := now.Add(cfg.IssuerTTL).Truncate(time.Second).UTC()
	if issuerNotAfter.After(root.NotAfter) {
		issuerNotAfter = root.NotAfter
	}
	issuerTmpl := &x509.Certificate{
		SerialNumber:          issuerSerial,
		Subject:               pkix.Name{Organization: []string{cfg.Org}, CommonName: "relaymesh relay issuing CA"},
		NotBefore:             now.Add(-caBackdate).Truncate(time.Second).UTC(),
		NotAfter:              issuerNotAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	issuer, err := createCert(cfg.Rand, issuerTmpl, root, issuerKey.Public(), rootKey)
	if err != nil {
		return nil, nil, fmt.Errorf("create issuing CA certificate: %w", err)
	}
	return issuer, issuerKey, nil
}

// Signer returns a Signer that issues with the issuing CA and pins the
// root, after checking both as NewKeySigner does at now.
func (r *RelayCA) Signer(now time.Time) (Signer, error) {
	if r == nil || r.Issuer == nil || r.Root == nil || r.IssuerKey == nil {
		return nil, fmt.Errorf("%w: incomplete relay CA", ErrInvalidSigner)
	}
	return NewKeySigner([]*x509.Certificate{r.Issuer}, r.IssuerKey, []*x509.Certificate{r.Root}, now)
}

// check validates a generated or loaded relay CA at now: the root is a
// self-signed CA whose key is RootKey, and the issuer is a pathLen 0 CA
// signed by it whose key is IssuerKey.
func (r *RelayCA) check(now time.Time) error {
	if r.Root == nil || r.Issuer == nil || r.RootKey == nil || r.IssuerKey == nil {
		return fmt.Errorf("%w: incomplete relay CA", ErrInvalidSigner)
	}
	if !r.Root.BasicConstraintsValid || !r.Root.IsCA || r.Root.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("%w: root %s is not a CA certificate", ErrInvalidSigner, describe(r.Root))
	}
	if err := r.Root.CheckSignatureFrom(r.Root); err != nil {
		return fmt.Errorf("%w: root %s is not self-signed: %w", ErrInvalidSigner, describe(r.Root), err)
	}
	if !keyutil.Equal(r.Root.PublicKey, r.RootKey.Public()) {
		return fmt.Errorf("%w: the root key does not belong to %s", ErrInvalidSigner, describe(r.Root))
	}
	if r.Issuer.MaxPathLen != 0 || !r.Issuer.MaxPathLenZero {
		return fmt.Errorf("%w: issuing CA %s must have pathLen 0", ErrInvalidSigner, describe(r.Issuer))
	}
	_, err := r.Signer(now)
	return err
}

func createCert(r io.Reader, tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(r, tmpl, parent, pub, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// encodeKeyPEM encodes a private key as PKCS#8 PEM. Only key types this
// package generates or loads are accepted, so that an error can never
// print a key.
func encodeKeyPEM(key crypto.Signer) ([]byte, error) {
	switch key.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey:
	default:
		return nil, fmt.Errorf("cannot encode a %T key", key)
	}
	block, err := pemutil.Serialize(key, pemutil.WithPKCS8(true))
	if err != nil {
		return nil, errors.New("cannot encode the private key")
	}
	return pem.EncodeToMemory(block), nil
}

// Defaults of MeshRootConfig.
const defaultMeshRootCN = "relaymesh mesh root CA"

// KeyAlgorithm names the type and size of a generated key. The names are
// those of the VirtualMesh API's keyAlgorithm.
type KeyAlgorithm string

// Key algorithms of generated mesh roots: at least as strong as ECDSA P-256
// or RSA-3072. RSA-2048, which agents may use, is too weak for a root that
// outlives them by years.
const (
	KeyECDSAP256 KeyAlgorithm = "ECDSAP256"
	KeyECDSAP384 KeyAlgorithm = "ECDSAP384"
	KeyRSA3072   KeyAlgorithm = "RSA3072"
	KeyRSA4096   KeyAlgorithm = "RSA4096"
)

// rootKeyAlgorithms are the KeyAlgorithms GenerateMeshRoot accepts, in
// order of preference.
var rootKeyAlgorithms = []KeyAlgorithm{KeyECDSAP256, KeyECDSAP384, KeyRSA3072, KeyRSA4096}

// generateKey makes a fresh key of alg from the operating system's CSPRNG.
func generateKey(alg KeyAlgorithm) (crypto.Signer, error) {
	switch alg {
	case KeyECDSAP256:
		return keyutil.GenerateSigner("EC", "P-256", 0)
	case KeyECDSAP384:
		return keyutil.GenerateSigner("EC", "P-384", 0)
	case KeyRSA3072:
		return keyutil.GenerateSigner("RSA", "", 3072)
	case KeyRSA4096:
		return keyutil.GenerateSigner("RSA", "", 4096)
	}
	return nil, fmt.Errorf("unknown key algorithm %q", alg)
}

// MeshRootConfig configures GenerateMeshRoot.
type MeshRootConfig struct {
	// VirtualMesh is the subject organization: the VirtualMesh whose meshes
	// share the root. Required: 1 to 64 letters, digits, '-' and '.'.
	VirtualMesh string
	// TTL is the root's lifetime; default 10 years, between 1m and 30
	// years.
	TTL time.Duration
	// KeyAlgorithm of the root's key: KeyECDSAP256 (the default),
	// KeyECDSAP384, KeyRSA3072 or KeyRSA4096. Anything weaker, RSA2048
	// included, is refused.
	KeyAlgorithm KeyAlgorithm
	// Clock returns the current time; default time.Now.
	Clock func() time.Time
	// Rand is the source of the serial number; default crypto/rand.Reader.
	// The key always comes from the operating system's CSPRNG.
	Rand io.Reader
}

// Default returns c with every zero field set to its default.
func (c MeshRootConfig) Default() MeshRootConfig {
	if c.KeyAlgorithm == "" {
		c.KeyAlgorithm = KeyECDSAP256
	}
	if c.TTL == 0 {
		c.TTL = defaultRootTTL
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	return c
}

// Validate reports every problem with c, each prefixed with its field path.
// It does not apply defaults; call Default first.
func (c MeshRootConfig) Validate() error {
	var errs []error
	if err := checkName(c.VirtualMesh, MaxVirtualMeshNameLen); err != nil {
		errs = append(errs, fmt.Errorf("virtualMesh: %w", err))
	}
	if c.TTL < minCATTL || c.TTL > maxRootTTL {
		errs = append(errs, fmt.Errorf("ttl: %v is outside [%v, %v]", c.TTL, minCATTL, maxRootTTL))
	}
	if !slices.Contains(rootKeyAlgorithms, c.KeyAlgorithm) {
		errs = append(errs, fmt.Errorf("keyAlgorithm: %q is not allowed for a root, which must be at least ECDSA P-256 or RSA-3072 (one of %s)", c.KeyAlgorithm, joinAlgorithms(rootKeyAlgorithms)))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("clock: required"))
	}
	if c.Rand == nil {
		errs = append(errs, errors.New("rand: required"))
	}
	return errors.Join(errs...)
}

func joinAlgorithms(algs []KeyAlgorithm) string {
	names := make([]string, len(algs))
	for i, a := range algs {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}

// MeshRoot is a generated root of a VirtualMesh's shared trust, with its
// key: it signs the meshes' intermediates (Authority.IssueIntermediate)
// directly. It is not the relay CA: agent and relay server certificates
// never chain to it, and mesh certificates never chain to the relay root.
type MeshRoot struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// GenerateMeshRoot makes a self-signed root (a key of cfg.KeyAlgorithm,
// ECDSA P-256 by default; keyCertSign and cRLSign; pathLen 1: one level of
// intermediates, each with pathLen 0, then workload certificates) with
// subject O=<VirtualMesh>, CN=relaymesh mesh root CA. It applies
// cfg.Default and validates cfg first. Keeping the root (a management
// cluster Secret, like the relay CA) is the caller's.
func GenerateMeshRoot(cfg MeshRootConfig) (*MeshRoot, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ca: invalid mesh root config: %w", err)
	}
	now := cfg.Clock()
	key, err := generateKey(cfg.KeyAlgorithm)
	if err != nil {
		return nil, fmt.Errorf("generate mesh root key (%s): %w", cfg.KeyAlgorithm, err)
	}
	serial, err := randomSerial(cfg.Rand)
	if err != nil {
		return nil, fmt.Errorf("mesh root serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{cfg.VirtualMesh}, CommonName: defaultMeshRootCN},
		NotBefore:             now.Add(-caBackdate).Truncate(time.Second).UTC(),
		NotAfter:              now.Add(cfg.TTL).Truncate(time.Second).UTC(),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            1,
	}
	cert, err := createCert(cfg.Rand, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create mesh root certificate: %w", err)
	}
	r := &MeshRoot{Cert: cert, Key: key}
	if _, err := r.Signer(now); err != nil {
		return nil, fmt.Errorf("generated mesh root: %w", err)
	}
	return r, nil
}

// Signer returns a Signer that issues with the root itself (its own chain
// and only root), after checking it as NewKeySigner does at now.
func (r *MeshRoot) Signer(now time.Time) (Signer, error) {
	if r == nil || r.Cert == nil || r.Key == nil {
		return nil, fmt.Errorf("%w: incomplete mesh root", ErrInvalidSigner)
	}
	return NewKeySigner([]*x509.Certificate{r.Cert}, r.Key, []*x509.Certificate{r.Cert}, now)
}
