// Package catest builds throwaway PKIs for tests: keys of every type,
// certificate requests (well-formed and hostile), root and intermediate CAs
// (including expired, non-CA and multi-level ones), the conformance suite
// every ca.Signer back end must pass (RunSignerConformance), and the means
// to run the real third-party CAs and the SoftHSM2 token that back ends are
// tested against (Binary, StartServer, StartProcess, FreeAddr, SoftHSM).
//
// It is test support only: import it from _test.go files, never from
// production code. Everything is generated at run time relative to the
// current time or to times the test gives, so no fixture can expire.
package catest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.step.sm/crypto/jose"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"

	"github.com/relaymesh/relaymesh/ca"
)

// KeyType names a key algorithm and size.
type KeyType string

// Key types. The ones in AllowedKeyTypes pass ca's key policy; the others
// exist to test that it refuses them.
const (
	ECDSAP256 KeyType = "ecdsa-p256"
	ECDSAP384 KeyType = "ecdsa-p384"
	Ed25519   KeyType = "ed25519"
	RSA2048   KeyType = "rsa-2048"
	RSA3072   KeyType = "rsa-3072"

	ECDSAP224 KeyType = "ecdsa-p224" // refused: curve too weak
	ECDSAP521 KeyType = "ecdsa-p521" // refused: not in the policy
	RSA1024   KeyType = "rsa-1024"   // refused: too short
)

// AllowedKeyTypes are the key types ca's key policy accepts.
var AllowedKeyTypes = []KeyType{ECDSAP256, ECDSAP384, Ed25519, RSA2048, RSA3072}

// RefusedKeyTypes are key types ca's key policy refuses.
var RefusedKeyTypes = []KeyType{ECDSAP224, ECDSAP521, RSA1024}

// IntermediateKeyTypes are the key types ca's intermediate key policy
// accepts (what Istio's plugged-in CA can sign with); the other allowed
// types, Ed25519 and RSA-2048, are refused for intermediates.
var IntermediateKeyTypes = []KeyType{ECDSAP256, ECDSAP384, RSA3072}

// rsaKeys caches RSA keys by size: generating them is slow, and tests do not
// need fresh ones.
var rsaKeys sync.Map // int → *rsa.PrivateKey

// NewKey returns a key of type kt. ECDSA and Ed25519 keys are fresh; RSA
// keys are generated once per size and process.
func NewKey(t testing.TB, kt KeyType) crypto.Signer {
	t.Helper()
	var (
		k   crypto.Signer
		err error
	)
	switch kt {
	case ECDSAP256:
		k, err = keyutil.GenerateSigner("EC", "P-256", 0)
	case ECDSAP384:
		k, err = keyutil.GenerateSigner("EC", "P-384", 0)
	case ECDSAP521:
		k, err = keyutil.GenerateSigner("EC", "P-521", 0)
	case ECDSAP224:
		k, err = ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	case Ed25519:
		k, err = keyutil.GenerateSigner("OKP", "Ed25519", 0)
	case RSA1024:
		k, err = rsaKey(1024)
	case RSA2048:
		k, err = rsaKey(2048)
	case RSA3072:
		k, err = rsaKey(3072)
	default:
		t.Fatalf("catest: unknown key type %q", kt)
	}
	if err != nil {
		t.Fatalf("catest: generate %s key: %v", kt, err)
	}
	return k
}

func rsaKey(bits int) (crypto.Signer, error) {
	if k, ok := rsaKeys.Load(bits); ok {
		if k, ok := k.(*rsa.PrivateKey); ok {
			return k, nil
		}
	}
	// keyutil refuses keys below 2048 bits, so use crypto/rsa directly.
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		return nil, err
	}
	if prev, loaded := rsaKeys.LoadOrStore(bits, k); loaded {
		if prev, ok := prev.(*rsa.PrivateKey); ok {
			return prev, nil
		}
	}
	return k, nil
}

// NewCSR returns a DER certificate request signed by key. tmpl may be nil;
// its SANs and ExtraExtensions are requested as given, which is how tests
// ask for things an agent may not have.
func NewCSR(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	if tmpl == nil {
		tmpl = &x509.CertificateRequest{}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatalf("catest: create CSR: %v", err)
	}
	return der
}

// NewCSRPEM is NewCSR, PEM-encoded.
func NewCSRPEM(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	return CSRPEM(NewCSR(t, key, tmpl))
}

// CSRPEM encodes a DER certificate request as PEM.
func CSRPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// TamperSignature returns a copy of a DER CSR or certificate with the last
// byte, which is part of the signature, changed.
func TamperSignature(der []byte) []byte {
	out := slices.Clone(der)
	out[len(out)-1] ^= 0x01
	return out
}

// BasicConstraintsExtension is a basicConstraints extension with the given
// CA flag, for CSR extension requests.
func BasicConstraintsExtension(t testing.TB, isCA bool) pkix.Extension {
	t.Helper()
	v, err := asn1.Marshal(struct {
		IsCA bool `asn1:"optional"`
	}{isCA})
	if err != nil {
		t.Fatalf("catest: marshal basicConstraints: %v", err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: v}
}

// BasicConstraintsPathLenExtension is a basicConstraints extension with
// the given CA flag and path length constraint (negative: none), for CSR
// extension requests.
func BasicConstraintsPathLenExtension(t testing.TB, isCA bool, pathLen int) pkix.Extension {
	t.Helper()
	v, err := asn1.Marshal(struct {
		IsCA       bool `asn1:"optional"`
		MaxPathLen int  `asn1:"optional,default:-1"`
	}{isCA, pathLen})
	if err != nil {
		t.Fatalf("catest: marshal basicConstraints: %v", err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: v}
}

// KeyUsageExtension is a keyUsage extension with the given usages, for CSR
// extension requests.
func KeyUsageExtension(t testing.TB, ku x509.KeyUsage) pkix.Extension {
	t.Helper()
	var bits []byte
	n := 0
	for i := range 9 {
		if ku&(1<<i) != 0 {
			for len(bits) <= i/8 {
				bits = append(bits, 0)
			}
			bits[i/8] |= 0x80 >> (i % 8)
			n = i + 1
		}
	}
	v, err := asn1.Marshal(asn1.BitString{Bytes: bits, BitLength: n})
	if err != nil {
		t.Fatalf("catest: marshal keyUsage: %v", err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 15}, Critical: true, Value: v}
}

// CA is a test certificate authority: a certificate, its key and the CA
// that issued it (nil for a root).
type CA struct {
	Cert   *x509.Certificate
	Key    crypto.Signer
	Parent *CA
}

// CAOptions shape a test CA. The zero value is a valid ECDSA P-256 CA,
// valid from an hour ago for a year (an intermediate: not beyond its
// parent).
type CAOptions struct {
	// Name is the subject common name; default "catest CA <n>".
	Name string
	// KeyType of the CA key; default ECDSAP256.
	KeyType KeyType
	// NotBefore and NotAfter default to an hour ago and a year from now,
	// NotAfter capped at the parent's.
	NotBefore, NotAfter time.Time
	// NotCA issues a certificate without basicConstraints CA:true.
	NotCA bool
	// NoCertSign leaves keyCertSign out of the key usage.
	NoCertSign bool
	// MaxPathLen sets a path length constraint; negative means none. The
	// zero value means none too; use PathLenZero for pathLen 0.
	MaxPathLen  int
	PathLenZero bool
	// PermittedURIDomains, if set, name-constrains the CA's URI names.
	PermittedURIDomains []string
}

var caCount atomic.Int64

// NewRoot returns a self-signed root CA.
func NewRoot(t testing.TB, opts CAOptions) *CA {
	t.Helper()
	return newCA(t, nil, opts)
}

// NewIntermediate returns a CA issued by c.
func (c *CA) NewIntermediate(t testing.TB, opts CAOptions) *CA {
	t.Helper()
	return newCA(t, c, opts)
}

func newCA(t testing.TB, parent *CA, opts CAOptions) *CA {
	t.Helper()
	if opts.KeyType == "" {
		opts.KeyType = ECDSAP256
	}
	if opts.Name == "" {
		opts.Name = "catest CA " + big.NewInt(caCount.Add(1)).String()
	}
	now := time.Now()
	if opts.NotBefore.IsZero() {
		opts.NotBefore = now.Add(-time.Hour)
	}
	if opts.NotAfter.IsZero() {
		opts.NotAfter = now.Add(365 * 24 * time.Hour)
		if parent != nil && parent.Cert.NotAfter.Before(opts.NotAfter) {
			opts.NotAfter = parent.Cert.NotAfter
		}
	}
	key := NewKey(t, opts.KeyType)
	ku := x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	if opts.NoCertSign {
		ku = x509.KeyUsageDigitalSignature
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(t),
		Subject:               pkix.Name{Organization: []string{"catest"}, CommonName: opts.Name},
		NotBefore:             opts.NotBefore,
		NotAfter:              opts.NotAfter,
		KeyUsage:              ku,
		BasicConstraintsValid: true,
		IsCA:                  !opts.NotCA,
		MaxPathLen:            opts.MaxPathLen,
		MaxPathLenZero:        opts.PathLenZero,
		PermittedURIDomains:   opts.PermittedURIDomains,
	}
	if tmpl.MaxPathLen == 0 && !opts.PathLenZero {
		tmpl.MaxPathLen = -1
	}
	if opts.NotCA {
		tmpl.MaxPathLen, tmpl.MaxPathLenZero = -1, false
	}
	parentCert, parentKey := tmpl, key
	if parent != nil {
		parentCert, parentKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, key.Public(), parentKey)
	if err != nil {
		t.Fatalf("catest: create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("catest: parse CA certificate: %v", err)
	}
	return &CA{Cert: cert, Key: key, Parent: parent}
}

// Root returns the root above c (c itself for a root).
func (c *CA) Root() *CA {
	for c.Parent != nil {
		c = c.Parent
	}
	return c
}

// Chain is what ca.NewKeySigner takes as chain: c followed by its
// intermediates, not the root; a root alone is its own chain.
func (c *CA) Chain() []*x509.Certificate {
	if c.Parent == nil {
		return []*x509.Certificate{c.Cert}
	}
	var chain []*x509.Certificate
	for x := c; x.Parent != nil; x = x.Parent {
		chain = append(chain, x.Cert)
	}
	return chain
}

// Roots is []*x509.Certificate{c.Root().Cert}.
func (c *CA) Roots() []*x509.Certificate { return []*x509.Certificate{c.Root().Cert} }

// Signer returns ca.NewKeySigner for c at now, failing the test if it is
// refused.
func (c *CA) Signer(t testing.TB, now time.Time) ca.Signer {
	t.Helper()
	s, err := ca.NewKeySigner(c.Chain(), c.Key, c.Roots(), now)
	if err != nil {
		t.Fatalf("catest: NewKeySigner: %v", err)
	}
	return s
}

// ChainPEM, KeyPEM and RootsPEM are the three inputs of ca.ParseSignerPEM.
func (c *CA) ChainPEM() []byte { return CertsPEM(c.Chain()...) }

// KeyPEM is c's key as PKCS#8 PEM.
func (c *CA) KeyPEM(t testing.TB) []byte {
	t.Helper()
	return KeyPEM(t, c.Key)
}

// RootsPEM is c's root as PEM.
func (c *CA) RootsPEM() []byte { return CertsPEM(c.Roots()...) }

// CertsPEM encodes certificates as PEM.
func CertsPEM(certs ...*x509.Certificate) []byte { return ca.CertsPEM(certs...) }

// KeyPEM encodes a private key as PKCS#8 PEM.
func KeyPEM(t testing.TB, key crypto.Signer) []byte {
	t.Helper()
	b, err := pemutil.Serialize(key, pemutil.WithPKCS8(true))
	if err != nil {
		t.Fatalf("catest: encode key: %v", err)
	}
	return pem.EncodeToMemory(b)
}

// JWKPrivateD is the private scalar ("d") of an EC JSON web key as its JSON
// spells it, for tests that check it leaks nowhere.
func JWKPrivateD(t testing.TB, k *jose.JSONWebKey) string {
	t.Helper()
	b, err := json.Marshal(k)
	if err != nil {
		t.Fatalf("catest: encode JWK: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("catest: decode JWK: %v", err)
	}
	d, ok := m["d"].(string)
	if !ok {
		t.Fatalf("catest: the JWK has no private d")
	}
	return d
}

func randomSerial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		t.Fatalf("catest: serial: %v", err)
	}
	return n.Add(n, big.NewInt(1))
}
