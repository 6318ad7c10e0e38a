package ca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"io"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/keyutil"
)

// Defaults and bounds of Config, in one place.
const (
	defaultAgentTTL  = 24 * time.Hour
	defaultServerTTL = 30 * 24 * time.Hour
	defaultBackdate  = time.Minute

	// defaultIntermediateTTL: a mesh's intermediate is renewed at about
	// 2/3 of its life, so a year means a new key about every eight months.
	defaultIntermediateTTL = 365 * 24 * time.Hour

	minTTL       = 10 * time.Second
	maxAgentTTL  = 30 * 24 * time.Hour
	maxServerTTL = 365 * 24 * time.Hour
	maxBackdate  = 10 * time.Minute
	// maxIntermediateTTL bounds how long a stolen cacerts key (which sits
	// in a workload cluster) can sign workload certificates that every
	// mesh of its VirtualMesh trusts: there is no revocation.
	maxIntermediateTTL = 2 * 365 * 24 * time.Hour
)

// subjectOrg is the subject organization of every leaf certificate.
const subjectOrg = "relaymesh"

// serialBits is the entropy of a serial number. Serials are 2^serialBits
// plus a random number below it: positive, never zero, always
// serialBits+1 bits long (17 octets in DER).
const serialBits = 128

// Config configures an Authority.
type Config struct {
	// Signer signs certificates. Required.
	Signer Signer
	// Clock returns the current time; default time.Now.
	Clock func() time.Time
	// Rand is the source of serial numbers; default crypto/rand.Reader.
	// It must be safe for concurrent use if the Authority is.
	Rand io.Reader
	// AgentTTL is the lifetime of agent client certificates; default 24h,
	// between 10s (for tests) and 30 days.
	AgentTTL time.Duration
	// ServerTTL is the lifetime of the relay server certificate; default 30
	// days, between 10s and 1 year.
	ServerTTL time.Duration
	// IntermediateTTL is the lifetime of a mesh's intermediate CA
	// (IssueIntermediate) when the request names none; default 1 year,
	// between 10s and 2 years.
	IntermediateTTL time.Duration
	// Backdate moves NotBefore into the past to tolerate clock skew; default
	// 1m, at most 10m.
	Backdate time.Duration
}

// Default returns c with every zero field set to its default.
func (c Config) Default() Config {
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	if c.AgentTTL == 0 {
		c.AgentTTL = defaultAgentTTL
	}
	if c.ServerTTL == 0 {
		c.ServerTTL = defaultServerTTL
	}
	if c.IntermediateTTL == 0 {
		c.IntermediateTTL = defaultIntermediateTTL
	}
	if c.Backdate == 0 {
		c.Backdate = defaultBackdate
	}
	return c
}

// Validate reports every problem with c, each prefixed with its field path.
// It does not apply defaults; call Default first.
func (c Config) Validate() error {
	var errs []error
	if c.Signer == nil {
		errs = append(errs, errors.New("signer: required"))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("clock: required"))
	}
	if c.Rand == nil {
		errs = append(errs, errors.New("rand: required"))
	}
	if c.AgentTTL < minTTL || c.AgentTTL > maxAgentTTL {
		errs = append(errs, fmt.Errorf("agentTTL: %v is outside [%v, %v]", c.AgentTTL, minTTL, maxAgentTTL))
	}
	if c.ServerTTL < minTTL || c.ServerTTL > maxServerTTL {
		errs = append(errs, fmt.Errorf("serverTTL: %v is outside [%v, %v]", c.ServerTTL, minTTL, maxServerTTL))
	}
	if c.IntermediateTTL < minTTL || c.IntermediateTTL > maxIntermediateTTL {
		errs = append(errs, fmt.Errorf("intermediateTTL: %v is outside [%v, %v]", c.IntermediateTTL, minTTL, maxIntermediateTTL))
	}
	if c.Backdate < 0 || c.Backdate > maxBackdate {
		errs = append(errs, fmt.Errorf("backdate: %v is outside [0s, %v]", c.Backdate, maxBackdate))
	}
	return errors.Join(errs...)
}

// Authority issues relay certificates from a Signer: it builds every
// template from scratch, has the signer sign it and validates the result
// before returning it. It is safe for concurrent use.
type Authority struct {
	cfg    Config
	leeway Leeway
	chains chainCache
}

// New returns an Authority. It applies cfg.Default, validates the config,
// checks that the signer's chain verifies to its roots now and that its
// Leeway, if it has one, is within bounds.
func New(cfg Config) (*Authority, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ca: invalid config: %w", err)
	}
	chain, roots := cfg.Signer.Chain(), cfg.Signer.Roots()
	if len(chain) == 0 || len(roots) == 0 || slices.Contains(chain, nil) || slices.Contains(roots, nil) {
		return nil, fmt.Errorf("%w: the signer has no CA certificate or no roots", ErrInvalidSigner)
	}
	now := cfg.Clock()
	for _, c := range chain {
		if err := checkValidAt(c, now); err != nil {
			return nil, err
		}
	}
	if err := verifyCAChain(chain, roots, now); err != nil {
		return nil, err
	}
	leeway := SignerLeeway(cfg.Signer)
	if err := checkLeeway(leeway); err != nil {
		return nil, err
	}
	return &Authority{cfg: cfg, leeway: leeway}, nil
}

// Roots are the trust anchors of the certificates this Authority issues.
func (a *Authority) Roots() []*x509.Certificate { return a.cfg.Signer.Roots() }

// Chain is the issuing CA certificate followed by its intermediates: a
// relay server accepts only client certificates whose issuer is Chain()[0].
func (a *Authority) Chain() []*x509.Certificate { return a.cfg.Signer.Chain() }

// AcceptedIssuers are the issuing CAs whose agent certificates a relay
// server accepts: Chain()[0], then, for a signer that keeps previous
// issuing CAs (IssuerSet), those it still accepts.
func (a *Authority) AcceptedIssuers() []*x509.Certificate {
	if set, ok := a.cfg.Signer.(IssuerSet); ok {
		return set.AcceptedIssuers()
	}
	return a.cfg.Signer.Chain()[:1]
}

// AgentTTL is the lifetime of agent certificates (before clamping to the
// issuing CA's NotAfter).
func (a *Authority) AgentTTL() time.Duration { return a.cfg.AgentTTL }

// Issued is a certificate with the chain and roots it verifies with.
type Issued struct {
	// Certificate is the issued certificate: a leaf, or a mesh's
	// intermediate CA (IssueIntermediate).
	Certificate *x509.Certificate
	// Chain is the issuing CA certificate and its intermediates (Signer.Chain).
	Chain []*x509.Certificate
	// Roots are the trust anchors the leaf verifies to.
	Roots []*x509.Certificate
}

// ChainPEM returns Certificate followed by Chain, PEM-encoded: the content
// of a tls.crt (or, for an intermediate, of Istio's cert-chain.pem without
// the root).
func (i *Issued) ChainPEM() []byte {
	return CertsPEM(append([]*x509.Certificate{i.Certificate}, i.Chain...)...)
}

// RootsPEM returns Roots, PEM-encoded: the content of a ca.crt.
func (i *Issued) RootsPEM() []byte { return CertsPEM(i.Roots...) }

// IssueAgent issues an agent's client certificate for the public key of
// csr, with id as its only identity.
//
// The CSR is checked again as ParseCSR checks it. Nothing but its public key
// is used: the certificate has subject O=relaymesh, exactly one URI SAN
// (id), no other SANs, digitalSignature as its only key usage (a TLS client
// signs; RFC 5280 allows nothing else with clientAuth, whatever the key
// type), clientAuth as its only extended key usage, and is not a CA. It
// is valid from now-Backdate (not before the issuing CA) to
// now+AgentTTL, clamped to the earliest NotAfter in the signer's chain. Its
// serial number is 128 random bits. The signed certificate is validated
// against all of that, and must verify to the roots for clientAuth now. (A
// signer with a Leeway may choose serial and validity within its bounds.)
func (a *Authority) IssueAgent(ctx context.Context, csr *x509.CertificateRequest, id spiffeid.ID) (*Issued, error) {
	return a.IssueAgentFor(ctx, csr, id, "")
}

// MaxRegistrationLen bounds the registration id carried in an agent
// certificate.
const MaxRegistrationLen = 64

// IssueAgentFor is IssueAgent for one registration of the cluster: the
// certificate's subject also carries OU=<registration> (a KubernetesCluster
// UID), so a relay server can refuse certificates of an earlier
// registration of the same cluster name without comparing clocks. An empty
// registration leaves the OU out.
func (a *Authority) IssueAgentFor(ctx context.Context, csr *x509.CertificateRequest, id spiffeid.ID, registration string) (*Issued, error) {
	if len(registration) > MaxRegistrationLen || strings.TrimFunc(registration, isRegistrationRune) != "" {
		return nil, fmt.Errorf("%w: registration id must be at most %d of [a-zA-Z0-9-]", ErrIssuance, MaxRegistrationLen)
	}
	if csr == nil {
		return nil, fmt.Errorf("%w: no certificate request", ErrInvalidCSR)
	}
	if err := checkCSR(csr); err != nil {
		return nil, err
	}
	if id.IsZero() {
		return nil, fmt.Errorf("%w: no SPIFFE ID", ErrIssuance)
	}
	subject := pkix.Name{Organization: []string{subjectOrg}}
	if registration != "" {
		subject.OrganizationalUnit = []string{registration}
	}
	tmpl := &x509.Certificate{
		Subject:               subject,
		URIs:                  []*url.URL{id.URL()},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	return a.issue(ctx, tmpl, csr.PublicKey, csr, a.cfg.AgentTTL, checkIssued)
}

// IssueServer issues the relay server's TLS certificate for pub, valid for
// dnsNames and ips (at least one name or address in all). It is like an
// agent certificate except for its SANs, serverAuth as its only extended
// key usage, keyEncipherment besides digitalSignature for RSA keys (RSA
// key exchange in TLS 1.2), and ServerTTL. DNS names must be plain host names (letters,
// digits and hyphens in dot-separated labels, no wildcards); IP addresses
// must not be unspecified; neither may repeat.
//
// A signer whose CA needs proof of possession (a RequestSigner) cannot sign
// a bare public key: use IssueServerRequest; this fails with
// ErrNeedsRequest.
func (a *Authority) IssueServer(ctx context.Context, pub crypto.PublicKey, dnsNames []string, ips []net.IP) (*Issued, error) {
	if err := checkPublicKey(pub); err != nil {
		return nil, err
	}
	tmpl, err := serverTemplate(pub, dnsNames, ips)
	if err != nil {
		return nil, err
	}
	return a.issue(ctx, tmpl, pub, nil, a.cfg.ServerTTL, checkIssued)
}

// IssueServerRequest is IssueServer for the public key of csr, which is
// checked as IssueAgent checks it; nothing else of the request is used.
// It works with every signer, including those whose CA needs proof of
// possession.
func (a *Authority) IssueServerRequest(ctx context.Context, csr *x509.CertificateRequest, dnsNames []string, ips []net.IP) (*Issued, error) {
	if csr == nil {
		return nil, fmt.Errorf("%w: no certificate request", ErrInvalidCSR)
	}
	if err := checkCSR(csr); err != nil {
		return nil, err
	}
	tmpl, err := serverTemplate(csr.PublicKey, dnsNames, ips)
	if err != nil {
		return nil, err
	}
	return a.issue(ctx, tmpl, csr.PublicKey, csr, a.cfg.ServerTTL, checkIssued)
}

// serverTemplate is the template of a server certificate for pub, or the
// reason dnsNames and ips cannot be in one.
func serverTemplate(pub crypto.PublicKey, dnsNames []string, ips []net.IP) (*x509.Certificate, error) {
	if len(dnsNames) == 0 && len(ips) == 0 {
		return nil, fmt.Errorf("%w: a server certificate needs at least one DNS name or IP address", ErrIssuance)
	}
	seen := map[string]bool{}
	for _, n := range dnsNames {
		if err := checkDNSName(n); err != nil {
			return nil, fmt.Errorf("%w: DNS name %q: %w", ErrIssuance, text.Truncate(n, 260), err)
		}
		l := strings.ToLower(n)
		if seen[l] {
			return nil, fmt.Errorf("%w: DNS name %q is listed twice", ErrIssuance, n)
		}
		seen[l] = true
	}
	var addrs []net.IP
	for _, ip := range ips {
		norm := ip.To4()
		if norm == nil {
			norm = ip.To16()
		}
		switch {
		case norm == nil:
			return nil, fmt.Errorf("%w: invalid IP address %v", ErrIssuance, []byte(ip))
		case norm.IsUnspecified():
			return nil, fmt.Errorf("%w: IP address %v is unspecified", ErrIssuance, ip)
		case slices.ContainsFunc(addrs, norm.Equal):
			return nil, fmt.Errorf("%w: IP address %v is listed twice", ErrIssuance, ip)
		}
		addrs = append(addrs, norm)
	}
	return &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{subjectOrg}},
		DNSNames:              slices.Clone(dnsNames),
		IPAddresses:           addrs,
		KeyUsage:              serverKeyUsage(pub),
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}, nil
}

// checkFunc validates a signed certificate against its template:
// checkIssued for leaves, checkIssuedCA for intermediates.
type checkFunc func(cert, tmpl *x509.Certificate, pub crypto.PublicKey, chain, roots []*x509.Certificate, now time.Time, leeway Leeway, known verified) error

// verified is what the check of a signed certificate need not repeat.
type verified struct {
	// signature: the signer verified the certificate's signature against
	// chain[0]'s key (a key signer: x509.CreateCertificate checks the
	// signature it made, and NewKeySigner checked the key is chain[0]'s).
	signature bool
	// chains remembers which signing chains verified to their roots, so a
	// leaf below a chain without name or policy constraints needs no
	// chain building of its own.
	chains *chainCache
}

// issue completes tmpl (serial, validity), signs it and validates the
// result with check. csr, if not nil, is the checked request pub comes
// from: a RequestSigner gets it as proof of possession, and cannot sign
// without it.
func (a *Authority) issue(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey, csr *x509.CertificateRequest, ttl time.Duration, check checkFunc) (*Issued, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrIssuance, err)
	}
	rs, needsRequest := a.cfg.Signer.(RequestSigner)
	if needsRequest && csr == nil {
		return nil, fmt.Errorf("%w: %w: issue from a certificate request", ErrIssuance, ErrNeedsRequest)
	}
	chain, roots := a.cfg.Signer.Chain(), a.cfg.Signer.Roots()
	if len(chain) == 0 || len(roots) == 0 || slices.Contains(chain, nil) || slices.Contains(roots, nil) {
		return nil, fmt.Errorf("%w: the signer has no CA certificate or no roots", ErrIssuance)
	}
	now := a.cfg.Clock()
	serial, err := randomSerial(a.cfg.Rand)
	if err != nil {
		return nil, fmt.Errorf("%w: serial number: %w", ErrIssuance, err)
	}
	notBefore := now.Add(-a.cfg.Backdate)
	if notBefore.Before(chain[0].NotBefore) {
		notBefore = chain[0].NotBefore
	}
	notAfter := now.Add(ttl)
	for _, c := range chain {
		if c.NotAfter.Before(notAfter) {
			notAfter = c.NotAfter
		}
	}
	// Certificates carry whole seconds; truncating here lets the result be
	// compared with the template exactly.
	tmpl.SerialNumber = serial
	tmpl.NotBefore = notBefore.Truncate(time.Second).UTC()
	tmpl.NotAfter = notAfter.Truncate(time.Second).UTC()
	if !tmpl.NotAfter.After(now) {
		return nil, fmt.Errorf("%w: the issuing CA expired at %s", ErrIssuance, tmpl.NotAfter.Format(time.RFC3339))
	}
	var cert *x509.Certificate
	if needsRequest {
		cert, err = rs.SignRequest(ctx, tmpl, csr)
	} else {
		cert, err = a.cfg.Signer.Sign(ctx, tmpl, pub)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: sign: %w", ErrIssuance, err)
	}
	if cert == nil {
		return nil, fmt.Errorf("%w: the signer returned no certificate", ErrIssuance)
	}
	known := verified{chains: &a.chains}
	if vs, ok := a.cfg.Signer.(verifyingSigner); ok {
		known.signature = vs.verifiesSignature()
	}
	if err := check(cert, tmpl, pub, chain, roots, now, a.leeway, known); err != nil {
		return nil, fmt.Errorf("%w: the signed certificate was rejected: %w", ErrIssuance, err)
	}
	return &Issued{Certificate: cert, Chain: chain, Roots: roots}, nil
}

// allowedLeafExtensions are the only extensions a leaf may carry: the ones
// the template asks for plus key identifiers.
var allowedLeafExtensions = []asn1.ObjectIdentifier{
	oidExtensionKeyUsage,
	oidExtensionExtKeyUsage,
	oidExtensionBasicConstraints,
	oidExtensionSubjectAltName,
	oidExtensionSubjectKeyID,
	oidExtensionAuthorityKeyID,
}

// checkIssued fails unless cert is exactly what tmpl asked for (but for
// what leeway lets the CA choose), for pub, issued by chain[0], and
// verifies to roots at now for its extended key usage.
func checkIssued(cert, tmpl *x509.Certificate, pub crypto.PublicKey, chain, roots []*x509.Certificate, now time.Time, leeway Leeway, known verified) error {
	errs := checkCommon(cert, tmpl, pub, chain, leeway, known)
	mismatch := func(field string, got, want any) {
		errs = append(errs, fmt.Errorf("%s is %v, want %v", field, got, want))
	}
	if !cert.BasicConstraintsValid || cert.IsCA {
		errs = append(errs, errors.New("is a CA or lacks basic constraints"))
	}
	if !slices.Equal(cert.ExtKeyUsage, tmpl.ExtKeyUsage) || len(cert.UnknownExtKeyUsage) != 0 {
		mismatch("extended key usage", cert.ExtKeyUsage, tmpl.ExtKeyUsage)
	}
	if !slices.Equal(cert.DNSNames, tmpl.DNSNames) {
		mismatch("DNS names", cert.DNSNames, tmpl.DNSNames)
	}
	if !slices.EqualFunc(cert.IPAddresses, tmpl.IPAddresses, net.IP.Equal) {
		mismatch("IP addresses", cert.IPAddresses, tmpl.IPAddresses)
	}
	if !slices.EqualFunc(cert.URIs, tmpl.URIs, func(a, b *url.URL) bool { return a.String() == b.String() }) {
		mismatch("URIs", cert.URIs, tmpl.URIs)
	}
	if len(cert.EmailAddresses) != 0 {
		mismatch("email addresses", cert.EmailAddresses, "none")
	}
	wantSANs := len(tmpl.DNSNames) + len(tmpl.IPAddresses) + len(tmpl.URIs)
	for _, ext := range cert.Extensions {
		switch {
		case !slices.ContainsFunc(allowedLeafExtensions, ext.Id.Equal):
			errs = append(errs, fmt.Errorf("unexpected extension %v", ext.Id))
		case ext.Id.Equal(oidExtensionSubjectAltName):
			// x509 silently skips SAN types it does not know (otherName,
			// directoryName, ...); count the raw entries.
			if n, err := countGeneralNames(ext.Value); err != nil || n != wantSANs {
				errs = append(errs, fmt.Errorf("subject alternative names: %d entries, want %d", n, wantSANs))
			}
		}
	}
	if len(cert.UnhandledCriticalExtensions) > 0 {
		errs = append(errs, fmt.Errorf("unhandled critical extensions %v", cert.UnhandledCriticalExtensions))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Everything x509.Verify would check of the leaf itself is checked
	// above; what remains is the chain. Below a chain that verified to
	// its roots for these key usages, whose certificates are all valid
	// now, and that constrains neither names nor policies, the leaf —
	// signed by chain[0] — verifies too: no need to build the chain again.
	if known.chains != nil && known.chains.verifies(chain, roots, tmpl.ExtKeyUsage, now) &&
		!now.Before(cert.NotBefore) && !now.After(cert.NotAfter) {
		return nil
	}
	_, err := cert.Verify(x509.VerifyOptions{
		Roots:         certPool(roots),
		Intermediates: certPool(chain),
		CurrentTime:   now,
		KeyUsages:     tmpl.ExtKeyUsage,
	})
	if err != nil {
		return fmt.Errorf("does not verify: %w", err)
	}
	return nil
}

// checkCommon checks what every issued certificate must be, leaf or CA:
// version 3, the serial number (see checkSerial), pub, tmpl's subject and
// key usage, chain[0] as issuer and signer, and the validity (see
// checkValidity).
func checkCommon(cert, tmpl *x509.Certificate, pub crypto.PublicKey, chain []*x509.Certificate, leeway Leeway, known verified) []error {
	var errs []error
	mismatch := func(field string, got, want any) {
		errs = append(errs, fmt.Errorf("%s is %v, want %v", field, got, want))
	}
	if cert.Version != 3 {
		mismatch("version", cert.Version, 3)
	}
	errs = append(errs, checkSerial(cert.SerialNumber, tmpl.SerialNumber, leeway)...)
	if !keyutil.Equal(pub, cert.PublicKey) {
		errs = append(errs, errors.New("public key differs from the requested one"))
	}
	if got, want := cert.Subject.String(), tmpl.Subject.String(); got != want {
		mismatch("subject", got, want)
	}
	if string(cert.RawIssuer) != string(chain[0].RawSubject) {
		mismatch("issuer", cert.Issuer, chain[0].Subject)
	}
	errs = append(errs, checkValidity(cert, tmpl, chain, leeway.Validity)...)
	if cert.KeyUsage != tmpl.KeyUsage {
		mismatch("key usage", cert.KeyUsage, tmpl.KeyUsage)
	}
	if !known.signature {
		if err := cert.CheckSignatureFrom(chain[0]); err != nil {
			errs = append(errs, fmt.Errorf("not signed by the issuing CA: %w", err))
		}
	}
	return errs
}

// checkSerial checks the serial number: tmpl's, or with leeway.Serial one
// the CA picked that is positive, at least MinRemoteSerialBits long and at
// most 20 octets.
func checkSerial(got, want *big.Int, leeway Leeway) []error {
	switch {
	case got == nil:
		return []error{errors.New("no serial number")}
	case !leeway.Serial && got.Cmp(want) != 0:
		return []error{fmt.Errorf("serial number is %v, want %v", got, want)}
	case got.Sign() <= 0:
		return []error{fmt.Errorf("serial number %v is not positive", got)}
	case !leeway.Serial && got.BitLen() < serialBits:
		return []error{fmt.Errorf("serial number is %d bits long, want %d", got.BitLen(), serialBits+1)}
	case leeway.Serial && got.BitLen() < MinRemoteSerialBits:
		return []error{fmt.Errorf("serial number chosen by the CA is %d bits long, want at least %d (sequential or short serials are refused)", got.BitLen(), MinRemoteSerialBits)}
	case leeway.Serial && got.BitLen() > maxRemoteSerialBits:
		return []error{fmt.Errorf("serial number chosen by the CA is %d bits long, more than 20 octets", got.BitLen())}
	}
	return nil
}

// checkValidity checks NotBefore and NotAfter: exactly tmpl's or, with a
// leeway, each within leeway of tmpl's, yet never outside the validity of
// the issuing chain (tmpl's NotAfter is already clamped to it).
func checkValidity(cert, tmpl *x509.Certificate, chain []*x509.Certificate, leeway time.Duration) []error {
	var errs []error
	if leeway == 0 {
		if !cert.NotBefore.Equal(tmpl.NotBefore) {
			errs = append(errs, fmt.Errorf("notBefore is %v, want %v", cert.NotBefore, tmpl.NotBefore))
		}
		if !cert.NotAfter.Equal(tmpl.NotAfter) {
			errs = append(errs, fmt.Errorf("notAfter is %v, want %v", cert.NotAfter, tmpl.NotAfter))
		}
		return errs
	}
	if d := cert.NotBefore.Sub(tmpl.NotBefore); d < -leeway || d > leeway {
		errs = append(errs, fmt.Errorf("notBefore is %v, more than %v from the requested %v (do the CA's clock and ours agree?)", cert.NotBefore, leeway, tmpl.NotBefore))
	}
	if d := cert.NotAfter.Sub(tmpl.NotAfter); d < -leeway || d > leeway {
		errs = append(errs, fmt.Errorf("notAfter is %v, more than %v from the requested %v (does the CA's profile issue for the configured lifetime?)", cert.NotAfter, leeway, tmpl.NotAfter))
	}
	if cert.NotBefore.Before(chain[0].NotBefore) {
		errs = append(errs, fmt.Errorf("notBefore %v is before the issuing CA's %v", cert.NotBefore, chain[0].NotBefore))
	}
	for _, c := range chain {
		if cert.NotAfter.After(c.NotAfter) {
			errs = append(errs, fmt.Errorf("notAfter %v outlives %s, which ends %v", cert.NotAfter, describe(c), c.NotAfter))
		}
	}
	return errs
}

// countGeneralNames counts the entries of a SubjectAltName extension value.
func countGeneralNames(der []byte) (int, error) {
	var names []asn1.RawValue
	rest, err := asn1.Unmarshal(der, &names)
	if err != nil {
		return 0, err
	}
	if len(rest) != 0 {
		return 0, errors.New("trailing data")
	}
	return len(names), nil
}

// serverKeyUsage is digitalSignature, plus keyEncipherment for RSA keys
// (RSA key exchange in TLS 1.2, which RFC 5280 allows with serverAuth).
func serverKeyUsage(pub crypto.PublicKey) x509.KeyUsage {
	ku := x509.KeyUsageDigitalSignature
	if _, ok := pub.(*rsa.PublicKey); ok {
		ku |= x509.KeyUsageKeyEncipherment
	}
	return ku
}

// randomSerial returns 2^serialBits plus serialBits random bits from r.
func randomSerial(r io.Reader) (*big.Int, error) {
	b := make([]byte, serialBits/8)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	n := new(big.Int).SetBytes(b)
	return n.SetBit(n, serialBits, 1), nil
}

// checkDNSName accepts a host name of dot-separated labels of letters,
// digits and hyphens (not at either end of a label), at most 63 bytes per
// label and 253 in all. No wildcards, no trailing dot.
func checkDNSName(name string) error {
	if name == "" {
		return errors.New("empty")
	}
	if len(name) > 253 {
		return fmt.Errorf("%d bytes long, at most 253", len(name))
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("labels must be 1 to 63 bytes long")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("labels must not start or end with '-'")
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("character %q is not allowed (letters, digits, '-' and '.' only)", c)
			}
		}
	}
	return nil
}

func isRegistrationRune(r rune) bool {
	return r == '-' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
}
