package ca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"
)

// Signer signs certificates with a CA key it never exposes.
//
// Every implementation MUST pass catest.RunSignerConformance. The contract:
//
//   - Sign MUST issue exactly tmpl for pub: the same serial number, subject,
//     subject alternative names, validity, key usage, extended key usage and
//     basic constraints, with Chain()[0] as issuer and signed by its key. It
//     MAY add authority and subject key identifiers. It MUST NOT add, drop or
//     change anything else; the Authority rejects a certificate that differs.
//     The only exception is a Signer that implements LeewaySigner: its CA
//     MAY choose what its Leeway names (the serial number; the validity
//     within bounds), and nothing else.
//   - Templates may be CA certificates (Authority.IssueIntermediate: CA:true,
//     pathLen 0, keyCertSign and cRLSign, no SANs, no extended key usage).
//     A Signer whose chain leaves room for one more CA level MUST sign them
//     like any other template (a remote CA needs a profile or provisioner
//     template for them); the Authority never asks one whose chain does
//     not.
//   - Sign MUST NOT modify tmpl, and MUST be safe for concurrent use.
//   - Sign MUST return an error and no certificate when ctx is done or when
//     it cannot sign.
//   - A Signer whose CA insists on proof of possession (every remote CA)
//     MUST implement RequestSigner, and its Sign MUST fail with an error
//     wrapping ErrNeedsRequest rather than sign without it.
//   - Chain MUST NOT be empty. Chain()[0] is the issuing CA certificate and
//     each following certificate issued the one before it, up to but not
//     including a root (a self-signed CA that signs directly is both
//     Chain()[0] and its own root).
//   - Roots MUST NOT be empty, and Chain MUST verify to one of them.
//   - Chain and Roots MUST return new slices the caller may modify; nobody
//     may modify the certificates they point to.
//   - A Signer MUST NOT reveal its private key, or any credential it uses to
//     reach its CA (PIN, password, authentication key), in any result,
//     error or log.
type Signer interface {
	// Sign creates a certificate from tmpl for pub, signed by the CA key,
	// and returns the parsed certificate.
	Sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error)
	// Chain is the signing CA certificate followed by any intermediates up
	// to, not including, the root.
	Chain() []*x509.Certificate
	// Roots are the trust anchors clients should pin.
	Roots() []*x509.Certificate
}

// RequestSigner is an optional interface of a Signer whose certificate
// authority wants proof that the subject holds its private key: a
// certificate request signed with it. Remote CAs (cfssl, step-ca) refuse to
// sign a bare public key. The Authority calls SignRequest instead of Sign
// whenever it issues from a certificate request, and refuses to issue for a
// bare public key (ErrNeedsRequest).
type RequestSigner interface {
	// SignRequest is Sign for csr.PublicKey. csr has passed the Authority's
	// checks (key policy, signature) and serves as proof of possession
	// only: SignRequest MUST keep the Signer contract for tmpl, so nothing
	// of csr but its public key may reach the certificate.
	SignRequest(ctx context.Context, tmpl *x509.Certificate, csr *x509.CertificateRequest) (*x509.Certificate, error)
}

// Bounds of a Leeway, checked by New.
const (
	// MinRemoteSerialBits is the shortest serial number the Authority
	// accepts from a CA that picks its own (Leeway.Serial). It rules out
	// sequential and short serials; it cannot measure entropy. step-ca
	// draws serials uniformly below 2^128, which are shorter than 96 bits
	// once in 2^32 issuances (that issuance fails closed); cfssl draws 159
	// random bits.
	MinRemoteSerialBits = 96
	// maxRemoteSerialBits: RFC 5280 allows at most 20 octets, and a
	// positive INTEGER of 20 octets has at most 159 significant bits.
	maxRemoteSerialBits = 159
	// MaxValidityLeeway bounds Leeway.Validity: as much as the Authority
	// may backdate itself.
	MaxValidityLeeway = maxBackdate
)

// Leeway is what a Signer's certificate authority decides itself instead of
// copying it from the template. The zero Leeway allows nothing: the
// certificate must be exactly the template.
//
// A Leeway only ever relaxes these two fields, and only within bounds.
// Subject, subject alternative names, key usage, extended key usage, basic
// constraints, public key, issuer and the set of extensions (only the
// template's plus key identifiers) must still match exactly.
type Leeway struct {
	// Serial: the CA picks the serial number. The Authority then requires a
	// positive serial of MinRemoteSerialBits to 159 bits (at most 20
	// octets) instead of the template's.
	Serial bool
	// Validity: the CA sets NotBefore and NotAfter from its own clock and
	// profile. Each may differ from the template's by up to Validity
	// either way (rounding, backdating and clock skew of the CA), but
	// NotBefore never precedes the issuing CA's and NotAfter never
	// outlives any certificate of the chain. Zero means exact; at most
	// MaxValidityLeeway.
	Validity time.Duration
}

// LeewaySigner is an optional interface of a Signer whose certificate
// authority decides some fields itself (a remote CA that picks its own
// serial numbers or validity). The Authority validates every certificate
// from it with Leeway, and New refuses a Leeway beyond its bounds.
type LeewaySigner interface {
	// Leeway MUST return the same value for the life of the Signer.
	Leeway() Leeway
}

// checkLeeway reports a Leeway beyond its bounds.
func checkLeeway(l Leeway) error {
	if l.Validity < 0 || l.Validity > MaxValidityLeeway {
		return fmt.Errorf("%w: validity leeway %v is outside [0s, %v]", ErrInvalidSigner, l.Validity, MaxValidityLeeway)
	}
	return nil
}

// SignerLeeway returns the Leeway of s: none unless s implements
// LeewaySigner.
func SignerLeeway(s Signer) Leeway {
	if l, ok := s.(LeewaySigner); ok {
		return l.Leeway()
	}
	return Leeway{}
}

// keySigner signs with a private key held in memory.
type keySigner struct {
	chain []*x509.Certificate
	roots []*x509.Certificate
	key   crypto.Signer
}

// NewKeySigner returns a Signer for a CA whose key is held in memory, the
// "provided" back end: an enterprise hands over its issuing CA certificate
// (chain[0]), any intermediates above it (chain[1:], in order), the CA key and
// the roots it chains to.
//
// It fails closed with ErrInvalidSigner unless, at now: chain[0] is a CA
// (basicConstraints CA:true, keyCertSign key usage); key is the private key
// of chain[0]; every certificate in chain and roots is within its validity
// period; and chain is, in order, a path that verifies to one of roots.
// Whether chain[0] lives long enough for the certificates it will issue is
// the Authority's concern: it clamps every certificate to the chain's
// NotAfter.
func NewKeySigner(chain []*x509.Certificate, key crypto.Signer, roots []*x509.Certificate, now time.Time) (Signer, error) {
	if len(chain) == 0 {
		return nil, fmt.Errorf("%w: no CA certificate", ErrInvalidSigner)
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("%w: no root certificate", ErrInvalidSigner)
	}
	if key == nil {
		return nil, fmt.Errorf("%w: no CA key", ErrInvalidSigner)
	}
	if slices.Contains(chain, nil) || slices.Contains(roots, nil) {
		return nil, fmt.Errorf("%w: nil certificate", ErrInvalidSigner)
	}
	if err := checkIssuer(chain[0]); err != nil {
		return nil, err
	}
	if !keyutil.Equal(chain[0].PublicKey, key.Public()) {
		return nil, fmt.Errorf("%w: the CA key does not belong to %s", ErrInvalidSigner, describe(chain[0]))
	}
	if err := VerifyChain(chain, roots, now); err != nil {
		return nil, err
	}
	return &keySigner{chain: slices.Clone(chain), roots: slices.Clone(roots), key: key}, nil
}

// Sign implements Signer.
func (s *keySigner) Sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tmpl == nil || pub == nil {
		return nil, errors.New("nil template or public key")
	}
	// The random source only matters for signature schemes that use one;
	// the serial number is already in tmpl.
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.chain[0], pub, s.key)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse signed certificate: %w", err)
	}
	return cert, nil
}

// verifiesSignature implements verifyingSigner: x509.CreateCertificate
// verifies the signature it made with the key's public half, which
// NewKeySigner checked is chain[0]'s.
func (s *keySigner) verifiesSignature() bool { return true }

// verifyingSigner is a Signer (of this package only) that verifies the
// signature of each certificate it returns against chain[0]'s key.
type verifyingSigner interface{ verifiesSignature() bool }

// Chain implements Signer.
func (s *keySigner) Chain() []*x509.Certificate { return slices.Clone(s.chain) }

// Roots implements Signer.
func (s *keySigner) Roots() []*x509.Certificate { return slices.Clone(s.roots) }

// ParseSignerPEM builds a key signer (see NewKeySigner) from PEM data: certPEM
// holds the issuing CA certificate first, then its intermediates in order;
// keyPEM holds the CA's unencrypted private key (PKCS#8, PKCS#1 or SEC 1);
// rootsPEM holds the roots. These are the tls.crt, tls.key and ca.crt of a
// Kubernetes TLS secret.
func ParseSignerPEM(certPEM, keyPEM, rootsPEM []byte, now time.Time) (Signer, error) {
	chain, err := parseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: CA certificates: %w", ErrInvalidSigner, err)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: CA key: %w", ErrInvalidSigner, err)
	}
	roots, err := parseCertsPEM(rootsPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: roots: %w", ErrInvalidSigner, err)
	}
	return NewKeySigner(chain, key, roots, now)
}

// LoadSignerFiles reads the three PEM files ParseSignerPEM takes.
func LoadSignerFiles(certPath, keyPath, rootsPath string, now time.Time) (Signer, error) {
	var data [3][]byte
	for i, p := range []string{certPath, keyPath, rootsPath} {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidSigner, err)
		}
		data[i] = b
	}
	s, err := ParseSignerPEM(data[0], data[1], data[2], now)
	if err != nil {
		return nil, fmt.Errorf("%w (files %s, %s, %s)", err, certPath, keyPath, rootsPath)
	}
	return s, nil
}

// VerifyChain checks what every signer back end needs of its certificates
// at now: chain[0] is a CA (basicConstraints CA:true, keyCertSign key
// usage); every certificate in chain and roots is within its validity
// period; and chain is, in order, a path that verifies to one of roots.
// Errors wrap ErrInvalidSigner.
func VerifyChain(chain, roots []*x509.Certificate, now time.Time) error {
	if len(chain) == 0 {
		return fmt.Errorf("%w: no CA certificate", ErrInvalidSigner)
	}
	if len(roots) == 0 {
		return fmt.Errorf("%w: no root certificate", ErrInvalidSigner)
	}
	if slices.Contains(chain, nil) || slices.Contains(roots, nil) {
		return fmt.Errorf("%w: nil certificate", ErrInvalidSigner)
	}
	if err := checkIssuer(chain[0]); err != nil {
		return err
	}
	for _, c := range slices.Concat(chain, roots) {
		if err := checkValidAt(c, now); err != nil {
			return err
		}
	}
	return verifyCAChain(chain, roots, now)
}

// checkIssuer reports an issuing certificate that is not a CA that may
// sign certificates.
func checkIssuer(issuer *x509.Certificate) error {
	name := describe(issuer)
	if !issuer.BasicConstraintsValid || !issuer.IsCA {
		return fmt.Errorf("%w: %s is not a CA certificate (basicConstraints CA:true missing)", ErrInvalidSigner, name)
	}
	if issuer.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("%w: %s may not sign certificates (keyCertSign key usage missing)", ErrInvalidSigner, name)
	}
	return nil
}

// ReadCertificates reads a PEM file of one or more certificates, such as a
// CA chain or a set of roots.
func ReadCertificates(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return certs, nil
}

// ReadCertificatesFrom reads the certificates of a back end's field pair
// name ("chain" for chainFile/chainPEM, "roots", "tlsRoots") from file if
// it is set, else parses them from data. It returns the field it used;
// errors wrap ErrInvalidSigner and name the component and the field.
func ReadCertificatesFrom(component, name, file string, data []byte) ([]*x509.Certificate, string, error) {
	field, certs, err := name+"File", []*x509.Certificate(nil), error(nil)
	if file != "" {
		certs, err = ReadCertificates(file)
	} else {
		field = name + "PEM"
		certs, err = parseCertsPEM(data)
	}
	if err != nil {
		return nil, field, fmt.Errorf("%w: %s: %s: %w", ErrInvalidSigner, component, field, err)
	}
	return certs, field, nil
}

// checkValidAt reports a CA or root certificate that is not valid at now.
func checkValidAt(c *x509.Certificate, now time.Time) error {
	switch {
	case now.Before(c.NotBefore):
		return fmt.Errorf("%w: %s is not valid before %s", ErrInvalidSigner, describe(c), c.NotBefore.UTC().Format(time.RFC3339))
	case now.After(c.NotAfter):
		return fmt.Errorf("%w: %s expired at %s", ErrInvalidSigner, describe(c), c.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// verifyCAChain checks that chain, in the given order, is the start of a
// path from chain[0] to one of roots. A bundle of loosely related
// certificates that merely contains a path is not accepted: Chain is sent
// to clients as is.
func verifyCAChain(chain, roots []*x509.Certificate, now time.Time) error {
	opts := x509.VerifyOptions{
		Roots:         certPool(roots),
		Intermediates: certPool(chain[1:]),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}
	paths, err := chain[0].Verify(opts)
	if err != nil {
		return fmt.Errorf("%w: %s does not chain to the roots: %w", ErrInvalidSigner, describe(chain[0]), err)
	}
	for _, p := range paths {
		if hasPrefix(p, chain) {
			return nil
		}
	}
	return fmt.Errorf("%w: the CA certificates are not an ordered chain from %s to a root", ErrInvalidSigner, describe(chain[0]))
}

// hasPrefix reports whether path starts with the certificates of prefix.
func hasPrefix(path, prefix []*x509.Certificate) bool {
	if len(prefix) > len(path) {
		return false
	}
	for i, c := range prefix {
		if !c.Equal(path[i]) {
			return false
		}
	}
	return true
}

func certPool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// describe names a certificate in error messages.
func describe(c *x509.Certificate) string {
	return fmt.Sprintf("certificate %q (serial %x)", c.Subject.String(), c.SerialNumber)
}

// parseCertsPEM parses one or more CERTIFICATE blocks.
func parseCertsPEM(b []byte) ([]*x509.Certificate, error) {
	if len(b) == 0 {
		return nil, errors.New("empty")
	}
	certs, err := pemutil.ParseCertificateBundle(b)
	if err != nil {
		return nil, err
	}
	return certs, nil
}

// parseKeyPEM parses one unencrypted PEM private key. Encrypted keys are
// refused rather than prompted for.
func parseKeyPEM(b []byte) (crypto.Signer, error) {
	if len(b) == 0 {
		return nil, errors.New("empty")
	}
	k, err := pemutil.ParseKey(b, pemutil.WithPasswordPrompt("", func(string) ([]byte, error) {
		return nil, errors.New("encrypted keys are not supported")
	}))
	if err != nil {
		return nil, err
	}
	switch k := k.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case *rsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	default:
		return nil, fmt.Errorf("no ECDSA, RSA or Ed25519 private key (found %T)", k)
	}
}
