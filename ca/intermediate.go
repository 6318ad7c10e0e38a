package ca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"slices"
	"time"
)

// Bounds of IntermediateRequest names. A subject's common name is at most
// 64 bytes (ub-common-name, RFC 5280), and the intermediate's is
// "<mesh> intermediate".
const (
	intermediateCNSuffix = " intermediate"
	// MaxMeshNameLen bounds IntermediateRequest.Mesh.
	MaxMeshNameLen = 64 - len(intermediateCNSuffix)
	// MaxVirtualMeshNameLen bounds IntermediateRequest.VirtualMesh
	// (ub-organization-name, RFC 5280).
	MaxVirtualMeshNameLen = 64
)

// Key policy for intermediates: the key types Istio's plugged-in CA is
// documented and written for (ECDSA and RSA), strong enough for a CA key
// that lives for a year in a workload cluster.
const minIntermediateRSABits = 3072

// intermediateKeyUsage is the key usage of every intermediate: it signs
// certificates (istiod's workload certificates) and may sign CRLs for them
// (Istio's plugged-in CA accepts a ca-crl.pem). It signs nothing else, so
// it gets no digitalSignature.
const intermediateKeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign

// IntermediateRequest is what the server decides about a mesh's
// intermediate CA; nothing of it comes from the certificate request.
type IntermediateRequest struct {
	// VirtualMesh is the subject organization: the VirtualMesh that shares
	// the root. Required: 1 to 64 letters, digits, '-' and '.'.
	VirtualMesh string
	// Mesh names the mesh the intermediate is for; the subject common name
	// is "<Mesh> intermediate". Required: 1 to MaxMeshNameLen letters,
	// digits, '-' and '.'.
	Mesh string
	// TrustDomain is the only trust domain whose identities the
	// intermediate may sign: its name constraints permit URIs of exactly
	// this host (spiffe://<TrustDomain>/...) and no other. Required: a
	// SPIFFE trust domain (CheckTrustDomain).
	TrustDomain string
	// TTL is the intermediate's lifetime; zero means Config.IntermediateTTL.
	// Between 10s and 2 years. It is clamped to the signer's chain.
	TTL time.Duration
}

// subject is the intermediate's subject.
func (r IntermediateRequest) subject() pkix.Name {
	return pkix.Name{Organization: []string{r.VirtualMesh}, CommonName: r.Mesh + intermediateCNSuffix}
}

// validate reports the first problem with r, wrapping ErrIssuance.
func (r IntermediateRequest) validate() error {
	if err := checkName(r.VirtualMesh, MaxVirtualMeshNameLen); err != nil {
		return fmt.Errorf("%w: VirtualMesh name %q: %w", ErrIssuance, text.Truncate(r.VirtualMesh, 80), err)
	}
	if err := checkName(r.Mesh, MaxMeshNameLen); err != nil {
		return fmt.Errorf("%w: mesh name %q: %w (the common name \"<mesh>%s\" is at most 64 bytes, RFC 5280)", ErrIssuance, text.Truncate(r.Mesh, 80), err, intermediateCNSuffix)
	}
	if err := CheckTrustDomain(r.TrustDomain); err != nil {
		return fmt.Errorf("%w: trust domain: %w", ErrIssuance, err)
	}
	if r.TTL != 0 && (r.TTL < minTTL || r.TTL > maxIntermediateTTL) {
		return fmt.Errorf("%w: intermediate TTL %v is outside [%v, %v]", ErrIssuance, r.TTL, minTTL, maxIntermediateTTL)
	}
	return nil
}

// maxTrustDomainLen: SPIFFE bounds a trust domain name to 255 bytes.
const maxTrustDomainLen = 255

// CheckTrustDomain reports why td is not a SPIFFE trust domain name: 1 to
// 255 bytes of lower-case letters, digits, '.', '-' and '_'.
func CheckTrustDomain(td string) error {
	switch {
	case td == "":
		return errors.New("empty (Istio's default trust domain is cluster.local)")
	case len(td) > maxTrustDomainLen:
		return fmt.Errorf("%d bytes long, at most %d", len(td), maxTrustDomainLen)
	}
	for _, c := range []byte(td) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("%q is not a SPIFFE trust domain (lower-case letters, digits, '.', '-' and '_' only)", text.Truncate(td, 80))
		}
	}
	return nil
}

// checkRequestedConstraints refuses a request whose name constraints, if it
// asks for any, are not exactly those of td: a critical extension that
// permits URIs of td only and excludes its subdomains.
func checkRequestedConstraints(csr *x509.CertificateRequest, td string) error {
	i := slices.IndexFunc(csr.Extensions, func(e pkix.Extension) bool { return e.Id.Equal(oidExtensionNameConstraints) })
	if i < 0 {
		return nil
	}
	want := &x509.Certificate{}
	trustDomainConstraints(want, td)
	ext, err := URINameConstraints(want)
	if err != nil {
		return err
	}
	if got := csr.Extensions[i]; !got.Critical || string(got.Value) != string(ext.Value) {
		return fmt.Errorf("%w: name constraints: requests other name constraints than the server issues (URIs of trust domain %q only, critical)", ErrInvalidCSR, text.Truncate(td, 80))
	}
	return nil
}

// NameConstraintsRequest is the extension a mesh's certificate request
// carries to ask for the name constraints of trust domain td (what
// IssueIntermediate sets anyway; a CA that copies extensions from requests
// needs it).
func NameConstraintsRequest(td string) (pkix.Extension, error) {
	if err := CheckTrustDomain(td); err != nil {
		return pkix.Extension{}, fmt.Errorf("trust domain: %w", err)
	}
	want := &x509.Certificate{}
	trustDomainConstraints(want, td)
	ext, err := URINameConstraints(want)
	if err != nil {
		return pkix.Extension{}, err
	}
	return *ext, nil
}

// trustDomainConstraints sets tmpl's name constraints to td: URIs whose host
// is exactly td (RFC 5280: a constraint without a leading period names one
// host; the excluded ".td" also rules out subdomains for verifiers, Go's
// among them, that read the permitted one as a domain). Marked critical, as
// RFC 5280 requires.
func trustDomainConstraints(tmpl *x509.Certificate, td string) {
	tmpl.PermittedURIDomains = []string{td}
	tmpl.ExcludedURIDomains = []string{"." + td}
	tmpl.PermittedDNSDomainsCritical = true
}

// checkName accepts 1 to max letters, digits, '-' and '.', the characters
// of Kubernetes object names.
func checkName(s string, maxLen int) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > maxLen:
		return fmt.Errorf("%d bytes long, at most %d", len(s), maxLen)
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return fmt.Errorf("character %q is not allowed (letters, digits, '-' and '.' only)", c)
		}
	}
	return nil
}

// IssueIntermediate signs a mesh's intermediate CA for Istio's plugged-in
// CA (the cacerts secret) for the public key of csr. The key was generated
// in the workload cluster; only the request travels.
//
// The certificate is built from scratch, never from the request: subject
// O=<VirtualMesh>, CN="<Mesh> intermediate"; basicConstraints CA:true,
// pathLen 0 (istiod may sign workload certificates, never another CA);
// critical name constraints that permit URIs of the mesh's trust domain only
// (spiffe://<TrustDomain>/..., so the mesh cannot sign another mesh's
// identities);
// key usage keyCertSign and cRLSign; no extended key usage (Istio verifies
// its plugged-in certificate for any usage, and workload certificates need
// both serverAuth and clientAuth); no subject alternative name (Istio reads
// none from its CA certificate, and a name on a CA certificate would
// identify nothing). Serial number and validity are chosen as for leaves:
// 128 random bits, from now-Backdate to now+TTL clamped to the signer's
// chain.
//
// The request is checked as ParseIntermediateCSR checks it. Its subject
// must be empty or exactly the subject above, so that a request for
// another mesh or name fails instead of being silently renamed.
//
// The signer's chain must allow one more CA below chain[0]: a CA with
// pathLen 0 (the generated relay CA's issuing CA, for one) cannot issue
// intermediates, and neither can a chain whose root or intermediates limit
// the path to its current length; that fails with ErrInvalidSigner before
// anything is signed.
//
// The signed certificate is validated like a leaf (exactly the template,
// but for what a signer's Leeway allows) and must in addition be a CA with
// pathLen 0 and a subject key identifier, carry only key usage, basic
// constraints and key identifiers, and verify to the roots now.
func (a *Authority) IssueIntermediate(ctx context.Context, csr *x509.CertificateRequest, req IntermediateRequest) (*Issued, error) {
	if csr == nil {
		return nil, fmt.Errorf("%w: no certificate request", ErrInvalidCSR)
	}
	if err := req.validate(); err != nil {
		return nil, err
	}
	if err := checkIntermediateCSR(csr); err != nil {
		return nil, err
	}
	if err := checkRequestedConstraints(csr, req.TrustDomain); err != nil {
		return nil, err
	}
	subject := req.subject()
	if len(csr.Subject.Names) != 0 || len(csr.Subject.ExtraNames) != 0 {
		if got, want := csr.Subject.String(), subject.String(); got != want {
			return nil, fmt.Errorf("%w: requests subject %q; the server issues %q (send an empty subject)", ErrInvalidCSR, text.Truncate(got, 200), want)
		}
	}
	chain, roots := a.cfg.Signer.Chain(), a.cfg.Signer.Roots()
	if len(chain) == 0 || len(roots) == 0 || slices.Contains(chain, nil) || slices.Contains(roots, nil) {
		return nil, fmt.Errorf("%w: the signer has no CA certificate or no roots", ErrInvalidSigner)
	}
	if err := checkCanSignCA(chain, roots, a.cfg.Clock()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSigner, err)
	}
	ttl := req.TTL
	if ttl == 0 {
		ttl = a.cfg.IntermediateTTL
	}
	tmpl := &x509.Certificate{
		Subject:               subject,
		KeyUsage:              intermediateKeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	trustDomainConstraints(tmpl, req.TrustDomain)
	return a.issue(ctx, tmpl, csr.PublicKey, csr, ttl, checkIssuedCA)
}

// ParseIntermediateCSR parses a mesh's certificate request for an
// intermediate CA, PEM or DER, of at most MaxCSRSize bytes, with the
// framing rules of ParseCSR, and checks it:
//
//   - The public key is ECDSA P-256 or P-384, or RSA of 3072 to 8192 bits
//     (ErrKeyPolicy): the types Istio's plugged-in CA is written for, strong
//     enough for a CA. Ed25519 and RSA-2048, which agents may use, are
//     refused here.
//   - The self-signature verifies with a SHA-2 algorithm.
//   - It asks for nothing the intermediate will not be: no subject
//     alternative names, no extended key usage, no other extension. A
//     basicConstraints request must be CA:true with pathLen 0; a keyUsage
//     request may only name keyCertSign and cRLSign. A subjectKeyIdentifier
//     request is allowed (the CA computes its own).
//
// The subject is checked by IssueIntermediate, which knows the subject it
// will issue. Other errors wrap ErrInvalidCSR.
func ParseIntermediateCSR(b []byte) (*x509.CertificateRequest, error) {
	return parseCSR(b, checkIntermediateCSR)
}

// checkIntermediateCSR is ParseIntermediateCSR's checks of a parsed
// request; IssueIntermediate runs it again.
func checkIntermediateCSR(csr *x509.CertificateRequest) error {
	if err := checkIntermediateKey(csr.PublicKey); err != nil {
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
			switch {
			case !bc.IsCA:
				return fmt.Errorf("%w: requests a certificate that is not a CA (basicConstraints CA:false); an intermediate is a CA with pathLen 0", ErrInvalidCSR)
			case bc.MaxPathLen < 0:
				return fmt.Errorf("%w: requests a CA without a path length limit; an intermediate gets pathLen 0", ErrInvalidCSR)
			case bc.MaxPathLen != 0:
				return fmt.Errorf("%w: requests pathLen %d; an intermediate gets pathLen 0 (it may not sign another CA)", ErrInvalidCSR, bc.MaxPathLen)
			}
		case ext.Id.Equal(oidExtensionKeyUsage):
			var bits asn1.BitString
			if rest, err := asn1.Unmarshal(ext.Value, &bits); err != nil || len(rest) != 0 {
				return fmt.Errorf("%w: malformed keyUsage extension request", ErrInvalidCSR)
			}
			// Bit numbers from RFC 5280, section 4.2.1.3: 5 keyCertSign,
			// 6 cRLSign.
			for i := range bits.BitLength {
				if bits.At(i) != 0 && i != 5 && i != 6 {
					return fmt.Errorf("%w: requests %s key usage; an intermediate gets keyCertSign and cRLSign only", ErrInvalidCSR, keyUsageBitName(i))
				}
			}
		case ext.Id.Equal(oidExtensionSubjectKeyID):
			// Harmless, and not copied: the CA computes its own.
		case ext.Id.Equal(oidExtensionNameConstraints):
			// The mesh's trust domain, which a CA that copies extensions
			// from requests (cfssl) needs; IssueIntermediate requires it to
			// be exactly what the server issues.
		case ext.Id.Equal(oidExtensionSubjectAltName):
			return fmt.Errorf("%w: requests subject alternative names; an intermediate has none", ErrInvalidCSR)
		case ext.Id.Equal(oidExtensionExtKeyUsage):
			return fmt.Errorf("%w: requests extended key usages; an intermediate has none", ErrInvalidCSR)
		default:
			return fmt.Errorf("%w: requests extension %v, which an intermediate does not carry", ErrInvalidCSR, ext.Id)
		}
	}
	return nil
}

// keyUsageBitName names a keyUsage bit of RFC 5280, section 4.2.1.3.
func keyUsageBitName(i int) string {
	names := []string{"digitalSignature", "nonRepudiation", "keyEncipherment", "dataEncipherment", "keyAgreement", "keyCertSign", "cRLSign", "encipherOnly", "decipherOnly"}
	if i < len(names) {
		return names[i]
	}
	return fmt.Sprintf("unknown (bit %d)", i)
}

// checkIntermediateKey enforces the intermediate key policy: ECDSA P-256
// or P-384, RSA of minIntermediateRSABits to maxRSABits.
func checkIntermediateKey(pub crypto.PublicKey) error {
	const allowed = "allowed for intermediates: ECDSA P-256, P-384, RSA of 3072 to 8192 bits"
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			name := "unknown"
			if k.Curve != nil {
				name = k.Curve.Params().Name
			}
			return fmt.Errorf("%w: ECDSA curve %s (%s)", ErrKeyPolicy, name, allowed)
		}
	case *rsa.PublicKey:
		if k.N == nil {
			return fmt.Errorf("%w: empty RSA key", ErrKeyPolicy)
		}
		if n := k.N.BitLen(); n < minIntermediateRSABits || n > maxRSABits {
			return fmt.Errorf("%w: RSA key of %d bits (%s)", ErrKeyPolicy, n, allowed)
		}
	case ed25519.PublicKey:
		return fmt.Errorf("%w: Ed25519 keys are not supported for Istio's plugged-in CA (%s)", ErrKeyPolicy, allowed)
	case nil:
		return fmt.Errorf("%w: no public key", ErrKeyPolicy)
	default:
		return fmt.Errorf("%w: %T keys are not allowed (%s)", ErrKeyPolicy, pub, allowed)
	}
	return nil
}

// checkCanSignCA reports why chain[0] cannot issue a CA certificate: a
// path length constraint of a certificate of chain, or of the root chain
// verifies to, that one more CA below chain[0] would break.
func checkCanSignCA(chain, roots []*x509.Certificate, now time.Time) error {
	// chain[i] would be followed by chain[i-1] … chain[0] and the new
	// intermediate: i+1 CA certificates.
	for i, c := range chain {
		if err := pathLenAllows(c, i+1, i == 0); err != nil {
			return err
		}
	}
	paths, err := chain[0].Verify(x509.VerifyOptions{
		Roots:         certPool(roots),
		Intermediates: certPool(chain[1:]),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("%s does not chain to the roots: %w", describe(chain[0]), err)
	}
	var first error
	for _, p := range paths {
		if !hasPrefix(p, chain) {
			continue
		}
		if len(p) == len(chain) {
			return nil // chain[0] is a root itself, checked above
		}
		err := pathLenAllows(p[len(p)-1], len(chain)+1, false)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = fmt.Errorf("the CA certificates are not an ordered chain from %s to a root", describe(chain[0]))
	}
	return first
}

// pathLenAllows reports a CA certificate c whose path length constraint
// forbids below CA certificates after it. issuing says c is chain[0].
func pathLenAllows(c *x509.Certificate, below int, issuing bool) error {
	constrained := c.BasicConstraintsValid && (c.MaxPathLen > 0 || c.MaxPathLen == 0 && c.MaxPathLenZero)
	if !constrained || c.MaxPathLen >= below {
		return nil
	}
	if issuing {
		return fmt.Errorf("the issuing CA %s has pathLen %d: it may not sign another CA, so it cannot issue intermediates (use a CA whose pathLen is at least 1, or unset)", describe(c), c.MaxPathLen)
	}
	return fmt.Errorf("%s has pathLen %d: at most %d CA certificate(s) may follow it, and with an intermediate below the issuing CA there would be %d, so this chain cannot issue intermediates", describe(c), c.MaxPathLen, c.MaxPathLen, below)
}

// allowedCAExtensions are the only extensions an intermediate may carry:
// the ones the template asks for plus key identifiers.
var allowedCAExtensions = []asn1.ObjectIdentifier{
	oidExtensionKeyUsage,
	oidExtensionBasicConstraints,
	oidExtensionSubjectKeyID,
	oidExtensionAuthorityKeyID,
	oidExtensionNameConstraints,
}

// checkNameConstraints requires cert's name constraints to be exactly
// tmpl's: the same permitted and excluded URI domains, critical, and no
// constraint of another name type.
func checkNameConstraints(cert, tmpl *x509.Certificate) []error {
	var errs []error
	if !slices.Equal(cert.PermittedURIDomains, tmpl.PermittedURIDomains) || !slices.Equal(cert.ExcludedURIDomains, tmpl.ExcludedURIDomains) {
		errs = append(errs, fmt.Errorf("name constraints permit URIs of %q and exclude %q, want %q and %q", cert.PermittedURIDomains, cert.ExcludedURIDomains, tmpl.PermittedURIDomains, tmpl.ExcludedURIDomains))
	}
	if cert.PermittedDNSDomainsCritical != tmpl.PermittedDNSDomainsCritical {
		errs = append(errs, fmt.Errorf("name constraints critical is %v, want %v", cert.PermittedDNSDomainsCritical, tmpl.PermittedDNSDomainsCritical))
	}
	if len(cert.PermittedDNSDomains)+len(cert.ExcludedDNSDomains)+len(cert.PermittedIPRanges)+len(cert.ExcludedIPRanges)+
		len(cert.PermittedEmailAddresses)+len(cert.ExcludedEmailAddresses) != 0 {
		errs = append(errs, errors.New("has name constraints on DNS names, IP addresses or email addresses, want URI constraints only"))
	}
	return errs
}

// URINameConstraints is tmpl's name constraints extension, DER-encoded, for
// a remote CA that takes extensions as bytes (cfssl); nil when tmpl has
// none. It supports URI constraints only, the kind IssueIntermediate sets.
func URINameConstraints(tmpl *x509.Certificate) (*pkix.Extension, error) {
	if len(tmpl.PermittedURIDomains)+len(tmpl.ExcludedURIDomains) == 0 {
		return nil, nil
	}
	if len(tmpl.PermittedDNSDomains)+len(tmpl.ExcludedDNSDomains)+len(tmpl.PermittedIPRanges)+len(tmpl.ExcludedIPRanges)+
		len(tmpl.PermittedEmailAddresses)+len(tmpl.ExcludedEmailAddresses) != 0 {
		return nil, errors.New("only URI name constraints can be expressed")
	}
	// RFC 5280, 4.2.1.10: NameConstraints ::= SEQUENCE { permittedSubtrees
	// [0] GeneralSubtrees OPTIONAL, excludedSubtrees [1] ... }, implicitly
	// tagged; GeneralSubtree ::= SEQUENCE { base GeneralName, ... };
	// uniformResourceIdentifier [6] IA5String.
	type subtree struct {
		Base asn1.RawValue
	}
	subtrees := func(domains []string) []subtree {
		var out []subtree
		for _, d := range domains {
			out = append(out, subtree{Base: asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(d)}})
		}
		return out
	}
	value, err := asn1.Marshal(struct {
		Permitted []subtree `asn1:"optional,tag:0"`
		Excluded  []subtree `asn1:"optional,tag:1"`
	}{subtrees(tmpl.PermittedURIDomains), subtrees(tmpl.ExcludedURIDomains)})
	if err != nil {
		return nil, err
	}
	return &pkix.Extension{Id: oidExtensionNameConstraints, Critical: tmpl.PermittedDNSDomainsCritical, Value: value}, nil
}

// checkIssuedCA is checkIssued for an intermediate: cert must be exactly
// what tmpl asked for (but for what leeway lets the CA choose), a CA with
// pathLen 0, no extended key usage, no subject alternative names and no
// extension but key usage, basic constraints and key identifiers, with a
// subject key identifier (and an authority key identifier that names
// chain[0]'s key, when chain[0] has one); the chain's path length
// constraints must allow it, and it must verify to roots at now.
func checkIssuedCA(cert, tmpl *x509.Certificate, pub crypto.PublicKey, chain, roots []*x509.Certificate, now time.Time, leeway Leeway, known verified) error {
	errs := checkCommon(cert, tmpl, pub, chain, leeway, known)
	if !cert.BasicConstraintsValid || !cert.IsCA {
		errs = append(errs, errors.New("is not a CA (basicConstraints CA:true missing)"))
	} else if cert.MaxPathLen != 0 || !cert.MaxPathLenZero {
		got := "unset"
		if cert.MaxPathLen > 0 {
			got = fmt.Sprint(cert.MaxPathLen)
		}
		errs = append(errs, fmt.Errorf("pathLen is %s, want 0", got))
	}
	if len(cert.ExtKeyUsage) != 0 || len(cert.UnknownExtKeyUsage) != 0 {
		errs = append(errs, fmt.Errorf("has extended key usages %v, want none", cert.ExtKeyUsage))
	}
	if len(cert.SubjectKeyId) == 0 {
		errs = append(errs, errors.New("has no subject key identifier (RFC 5280 requires one in CA certificates)"))
	}
	errs = append(errs, checkNameConstraints(cert, tmpl)...)
	if len(chain[0].SubjectKeyId) != 0 && string(cert.AuthorityKeyId) != string(chain[0].SubjectKeyId) {
		errs = append(errs, fmt.Errorf("authority key identifier is %x, want the issuing CA's %x", cert.AuthorityKeyId, chain[0].SubjectKeyId))
	}
	for _, ext := range cert.Extensions {
		switch {
		case ext.Id.Equal(oidExtensionSubjectAltName):
			errs = append(errs, errors.New("has subject alternative names, want none"))
		case !slices.ContainsFunc(allowedCAExtensions, ext.Id.Equal):
			errs = append(errs, fmt.Errorf("unexpected extension %v", ext.Id))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// x509.Verify does not count the certificate it verifies against the
	// path length constraints above it; a leaf below it would be.
	if err := checkCanSignCA(chain, roots, now); err != nil {
		return err
	}
	_, err := cert.Verify(x509.VerifyOptions{
		Roots:         certPool(roots),
		Intermediates: certPool(chain),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("does not verify: %w", err)
	}
	return nil
}
