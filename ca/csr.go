package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"runtime"
	"sync"
	"weak"

	"github.com/relaymesh/relaymesh/internal/text"
)

// MaxCSRSize bounds the size of a certificate request, PEM or DER.
const MaxCSRSize = 16 << 10

// Key policy for certificates this package issues.
const (
	minRSABits = 2048
	maxRSABits = 8192
)

var (
	oidExtensionKeyUsage         = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtensionSubjectAltName   = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidExtensionBasicConstraints = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidExtensionSubjectKeyID     = asn1.ObjectIdentifier{2, 5, 29, 14}
	oidExtensionAuthorityKeyID   = asn1.ObjectIdentifier{2, 5, 29, 35}
	oidExtensionExtKeyUsage      = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidExtensionNameConstraints  = asn1.ObjectIdentifier{2, 5, 29, 30}
)

// csrSignatureAlgorithms are the self-signature algorithms accepted as proof
// of possession. SHA-1 and MD5 based ones are not.
var csrSignatureAlgorithms = map[x509.SignatureAlgorithm]bool{
	x509.SHA256WithRSA:    true,
	x509.SHA384WithRSA:    true,
	x509.SHA512WithRSA:    true,
	x509.SHA256WithRSAPSS: true,
	x509.SHA384WithRSAPSS: true,
	x509.SHA512WithRSAPSS: true,
	x509.ECDSAWithSHA256:  true,
	x509.ECDSAWithSHA384:  true,
	x509.ECDSAWithSHA512:  true,
	x509.PureEd25519:      true,
}

// ParseCSR parses a certificate request, PEM ("CERTIFICATE REQUEST") or DER,
// of at most MaxCSRSize bytes, and checks it:
//
//   - PEM input is exactly one block with no headers, with nothing but
//     white space around it; DER input has no trailing data.
//   - The public key is allowed: ECDSA P-256 or P-384, Ed25519, or RSA of
//     2048 to 8192 bits (ErrKeyPolicy).
//   - The self-signature verifies with a SHA-2 or Ed25519 algorithm (proof
//     of possession of the private key).
//   - Its extension requests do not ask for a CA (basicConstraints CA:true)
//     or for keyCertSign or cRLSign key usage; such a request is refused,
//     not silently downgraded. Malformed requests of those extensions are
//     refused too.
//
// Requested subject alternative names are allowed but never copied into a
// certificate; the caller can read them (DNSNames, IPAddresses, URIs,
// EmailAddresses) to log that they were ignored. Other errors wrap
// ErrInvalidCSR.
func ParseCSR(b []byte) (*x509.CertificateRequest, error) {
	return parseCSR(b, checkCSR)
}

// parseCSR frames, parses and checks a PEM or DER certificate request of at
// most MaxCSRSize bytes.
func parseCSR(b []byte, check func(*x509.CertificateRequest) error) (*x509.CertificateRequest, error) {
	switch {
	case len(b) == 0:
		return nil, fmt.Errorf("%w: empty", ErrInvalidCSR)
	case len(b) > MaxCSRSize:
		return nil, fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidCSR, len(b), MaxCSRSize)
	}
	der, err := csrDER(b)
	if err != nil {
		return nil, err
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidCSR, err)
	}
	if err := check(csr); err != nil {
		return nil, err
	}
	return csr, nil
}

// csrDER returns the DER bytes of a PEM or DER certificate request.
func csrDER(b []byte) ([]byte, error) {
	trimmed := bytes.TrimSpace(b)
	if !bytes.HasPrefix(trimmed, []byte("-----BEGIN ")) {
		return b, nil // DER; x509 rejects trailing data
	}
	// pem.Decode skips text and malformed blocks until it finds a good
	// one, so a second BEGIN anywhere means the input is not one block.
	if n := bytes.Count(trimmed, []byte("-----BEGIN")); n != 1 {
		return nil, fmt.Errorf("%w: %d PEM blocks, want exactly one", ErrInvalidCSR, n)
	}
	block, rest := pem.Decode(trimmed)
	switch {
	case block == nil:
		return nil, fmt.Errorf("%w: malformed PEM", ErrInvalidCSR)
	case block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST":
		return nil, fmt.Errorf("%w: PEM block is %q, want CERTIFICATE REQUEST", ErrInvalidCSR, text.Truncate(block.Type, 40))
	case len(block.Headers) != 0:
		return nil, fmt.Errorf("%w: PEM headers are not allowed", ErrInvalidCSR)
	case len(rest) != 0:
		return nil, fmt.Errorf("%w: %d bytes of data after the PEM block", ErrInvalidCSR, len(rest))
	}
	return block.Bytes, nil
}

// checkPossession checks the request's self-signature: an allowed
// algorithm, and a signature by the key it asks a certificate for.
func checkPossession(csr *x509.CertificateRequest) error {
	if !csrSignatureAlgorithms[csr.SignatureAlgorithm] {
		return fmt.Errorf("%w: signature algorithm %v is not allowed", ErrInvalidCSR, csr.SignatureAlgorithm)
	}
	key, memo := possessionKey(csr)
	if memo && possessionSeen(csr, key) {
		return nil
	}
	if err := csr.CheckSignature(); err != nil {
		return fmt.Errorf("%w: bad self-signature (no proof of possession): %w", ErrInvalidCSR, err)
	}
	if memo {
		possessionVerified(csr, key)
	}
	return nil
}

// possessionKey digests exactly what CheckSignature reads — the signed
// bytes, the signature, its algorithm and the public key as it is now —
// so a request object whose self-signature verified once (ParseCSR, then
// IssueAgent) is not verified again, and one changed since, even its
// parsed PublicKey alone, is. ok is false when the key cannot be encoded.
func possessionKey(csr *x509.CertificateRequest) (key [sha256.Size]byte, ok bool) {
	spki, err := x509.MarshalPKIXPublicKey(csr.PublicKey)
	if err != nil {
		return key, false
	}
	h := sha256.New()
	for _, part := range [][]byte{csr.RawTBSCertificateRequest, csr.Signature, spki} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	fmt.Fprintf(h, "%d", csr.SignatureAlgorithm)
	h.Sum(key[:0])
	return key, true
}

// possessions remembers, for each parsed request still in memory, the
// digest (possessionKey) of the self-signature that verified on it. It is
// per request object, not per request bytes: the same request sent again
// is parsed into a new object and verified again; only the second check of
// one request (ParseCSR, then IssueAgent) is saved. An entry goes when its
// request is collected.
var possessions sync.Map // weak.Pointer[x509.CertificateRequest] -> [sha256.Size]byte

func possessionSeen(csr *x509.CertificateRequest, key [sha256.Size]byte) bool {
	v, ok := possessions.Load(weak.Make(csr))
	return ok && v.([sha256.Size]byte) == key
}

func possessionVerified(csr *x509.CertificateRequest, key [sha256.Size]byte) {
	wp := weak.Make(csr)
	if _, loaded := possessions.Swap(wp, key); !loaded {
		runtime.AddCleanup(csr, func(wp weak.Pointer[x509.CertificateRequest]) { possessions.Delete(wp) }, wp)
	}
}

// checkCSR enforces key policy, proof of possession and the extension
// request rules on a parsed request. IssueAgent runs it again so that a
// request that did not come through ParseCSR gets the same checks.
func checkCSR(csr *x509.CertificateRequest) error {
	if err := checkPublicKey(csr.PublicKey); err != nil {
		return err
	}
	if err := checkPossession(csr); err != nil {
		return err
	}
	for _, ext := range csr.Extensions {
		switch {
		case ext.Id.Equal(oidExtensionBasicConstraints):
			var bc struct {
				IsCA       bool `asn1:"optional"`
				MaxPathLen int  `asn1:"optional,default:-1"`
			}
			if rest, err := asn1.Unmarshal(ext.Value, &bc); err != nil || len(rest) != 0 {
				return fmt.Errorf("%w: malformed basicConstraints extension request", ErrInvalidCSR)
			}
			if bc.IsCA {
				return fmt.Errorf("%w: requests a CA certificate (basicConstraints CA:true)", ErrInvalidCSR)
			}
		case ext.Id.Equal(oidExtensionKeyUsage):
			var bits asn1.BitString
			if rest, err := asn1.Unmarshal(ext.Value, &bits); err != nil || len(rest) != 0 {
				return fmt.Errorf("%w: malformed keyUsage extension request", ErrInvalidCSR)
			}
			// Bit numbers from RFC 5280, section 4.2.1.3.
			if bits.At(5) != 0 {
				return fmt.Errorf("%w: requests keyCertSign key usage", ErrInvalidCSR)
			}
			if bits.At(6) != 0 {
				return fmt.Errorf("%w: requests cRLSign key usage", ErrInvalidCSR)
			}
		}
	}
	return nil
}

// checkPublicKey enforces key policy: ECDSA P-256 or P-384, Ed25519, RSA of
// minRSABits to maxRSABits.
func checkPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			name := "unknown"
			if k.Curve != nil {
				name = k.Curve.Params().Name
			}
			return fmt.Errorf("%w: ECDSA curve %s (allowed: P-256, P-384)", ErrKeyPolicy, name)
		}
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return fmt.Errorf("%w: Ed25519 key of %d bytes", ErrKeyPolicy, len(k))
		}
	case *rsa.PublicKey:
		if k.N == nil {
			return fmt.Errorf("%w: empty RSA key", ErrKeyPolicy)
		}
		if n := k.N.BitLen(); n < minRSABits || n > maxRSABits {
			return fmt.Errorf("%w: RSA key of %d bits (allowed: %d to %d)", ErrKeyPolicy, n, minRSABits, maxRSABits)
		}
	case nil:
		return fmt.Errorf("%w: no public key", ErrKeyPolicy)
	default:
		return fmt.Errorf("%w: %T keys are not allowed (allowed: ECDSA P-256/P-384, Ed25519, RSA)", ErrKeyPolicy, pub)
	}
	return nil
}
