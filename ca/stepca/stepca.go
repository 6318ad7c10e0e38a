// Package stepca is the step-ca signer back end: certificates are signed by
// a remote step-ca (smallstep certificates) through its sign API
// (POST /1.0/sign), authorized by a one-time token of a JWK provisioner, so
// the CA key stays with step-ca.
//
// step-ca needs proof of possession (a certificate request signed by the
// subject key), so the Signer is a ca.RequestSigner. Everything else the
// certificate must carry travels in the token, which the provisioner key
// signs: the subject alternative names in its "sans" claim, and the
// subject, key usage, extended key usage and basic constraints in a
// "relaymesh" claim that the provisioner's X.509 template
// (ProvisionerTemplate) copies into the certificate. The validity is
// requested exactly (notBefore/notAfter), and step-ca honours it within the
// provisioner's claims. step-ca picks the serial number itself (uniformly
// below 2^128), so the Signer declares ca.Leeway{Serial: true} and nothing
// more.
//
// Requests go over HTTPS only, to a server whose certificate must chain to
// the configured roots (step-ca serves a certificate from its own CA).
// Tokens live one minute by default and carry a random id that step-ca
// accepts once.
//
// Mesh intermediates (CA certificates with pathLen 0 and no SANs) use the
// same provisioner and template: their token names no SANs and has the
// intermediate's common name as its subject, which step-ca then also
// accepts as the request's common name. The provisioner's
// maxTLSCertDuration must cover the intermediate's lifetime (8760h for the
// default year; step-ca tolerates its own backdate, 1m, on top, which
// covers the Authority's default backdate). step-ca
// does not check its own CA's path length constraint before it signs a
// CA; the Authority does (IssueIntermediate).
//
// The provisioner must disable smallstep's own certificate extension
// ("disableSmallstepExtensions": true in its claims), allow the
// Authority's lifetimes (minTLSCertDuration at most the shortest,
// maxTLSCertDuration at least the longest plus the Authority's backdate),
// and use ProvisionerTemplate. step-ca also refuses a certificate request
// that names a common name or SANs other than the token's (agents send
// none), where the Authority would only ignore them.
package stepca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"go.step.sm/crypto/jose"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/x509util"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/internal/remote"
)

// ProvisionerTemplate is the X.509 template the JWK provisioner must use:
// it takes the subject alternative names from the token's "sans" claim and
// everything else from its "relaymesh" claim, both signed by the
// provisioner key. Put it in the provisioner's options.x509.template.
//
// One provisioner serves leaves and mesh intermediates: the template
// branches on the claim's basicConstraints. A CA certificate gets no SANs
// at all, because step-ca puts the token's subject into .SANs when the
// token names none, and an intermediate has none.
const ProvisionerTemplate = `{
	"subject": {{ toJson .Token.relaymesh.subject }},
{{- if not .Token.relaymesh.basicConstraints.isCA }}
	"sans": {{ toJson .SANs }},
{{- end }}
	"keyUsage": {{ toJson .Token.relaymesh.keyUsage }},
	"extKeyUsage": {{ toJson .Token.relaymesh.extKeyUsage }},
{{- if .Token.relaymesh.nameConstraints }}
	"nameConstraints": {{ toJson .Token.relaymesh.nameConstraints }},
{{- end }}
	"basicConstraints": {{ toJson .Token.relaymesh.basicConstraints }}
}`

// Defaults and bounds of Config.
const (
	defaultTokenLifetime = time.Minute
	maxTokenLifetime     = 5 * time.Minute
	defaultTimeout       = 30 * time.Second
	maxResponseBytes     = 1 << 20
)

// ErrAuth: step-ca refused the provisioner token.
var ErrAuth = errors.New("step-ca refused the provisioner token")

// errTransport marks a request that got no answer from the server.
var errTransport = errors.New("step-ca: no answer from the server")

// Config configures the step-ca back end.
type Config struct {
	// URL of step-ca, such as https://ca.example:9000. Required; https
	// only.
	URL string
	// Provisioner is the name of the JWK provisioner. Required.
	Provisioner string
	// ProvisionerKeyFile holds the provisioner's private key: a JWK, a JWE
	// encrypted one (the provisioner's encryptedKey in ca.json, saved to a
	// file) or a PEM key; ProvisionerKey is the same key in memory. Exactly
	// one is required. Never logged or put in an error.
	ProvisionerKeyFile string
	ProvisionerKey     []byte
	// ProvisionerPasswordFile holds the password of an encrypted key;
	// ProvisionerPassword is the password itself. At most one may be set;
	// trailing white space is ignored. Never logged or put in an error.
	ProvisionerPasswordFile string
	ProvisionerPassword     []byte
	// ChainFile holds the PEM certificate step-ca signs with (its
	// intermediate), then any intermediates above it in order; ChainPEM is
	// the same PEM in memory. Exactly one is required.
	ChainFile string
	ChainPEM  []byte
	// RootsFile holds the PEM roots the chain verifies to; RootsPEM is the
	// same PEM in memory. Exactly one is required.
	RootsFile string
	RootsPEM  []byte
	// TLSRootsFile holds the PEM roots step-ca's HTTPS certificate must
	// chain to; TLSRootsPEM is the same PEM in memory. Default (neither
	// set): the roots, RootsFile or RootsPEM (step-ca serves a certificate
	// of its own CA). No other root is trusted.
	TLSRootsFile string
	TLSRootsPEM  []byte
	// TokenLifetime is how long a one-time token is valid; default 1m, at
	// most 5m.
	TokenLifetime time.Duration
	// Timeout bounds each request to step-ca; default 30s.
	Timeout time.Duration
	// Clock returns the current time, for tokens; default time.Now.
	Clock func() time.Time
	// Logger receives start-up messages; default: discarded.
	Logger *slog.Logger
}

// Default returns c with every zero field that has a default set.
func (c Config) Default() Config {
	if c.TLSRootsFile == "" && len(c.TLSRootsPEM) == 0 {
		if c.RootsFile != "" {
			c.TLSRootsFile = c.RootsFile
		} else {
			c.TLSRootsPEM = c.RootsPEM
		}
	}
	if c.TokenLifetime == 0 {
		c.TokenLifetime = defaultTokenLifetime
	}
	if c.Timeout == 0 {
		c.Timeout = defaultTimeout
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c, each prefixed with its field path.
// It reads no files and makes no requests; call Default first.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("url: required"))
	} else if _, err := parseURL(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("url: %w", err))
	}
	if c.Provisioner == "" {
		errs = append(errs, errors.New("provisioner: required"))
	}
	for _, err := range []error{
		ca.ExactlyOne("provisionerKeyFile: required (or provisionerKey)", ca.Alternative{Field: "provisionerKeyFile", Set: c.ProvisionerKeyFile != ""}, ca.Alternative{Field: "provisionerKey", Set: len(c.ProvisionerKey) != 0}),
		ca.ExactlyOne("", ca.Alternative{Field: "provisionerPasswordFile", Set: c.ProvisionerPasswordFile != ""}, ca.Alternative{Field: "provisionerPassword", Set: len(c.ProvisionerPassword) != 0}),
		ca.ExactlyOne("chainFile: required (or chainPEM)", ca.Alternative{Field: "chainFile", Set: c.ChainFile != ""}, ca.Alternative{Field: "chainPEM", Set: len(c.ChainPEM) != 0}),
		ca.ExactlyOne("rootsFile: required (or rootsPEM)", ca.Alternative{Field: "rootsFile", Set: c.RootsFile != ""}, ca.Alternative{Field: "rootsPEM", Set: len(c.RootsPEM) != 0}),
		ca.ExactlyOne("tlsRootsFile: required (or tlsRootsPEM)", ca.Alternative{Field: "tlsRootsFile", Set: c.TLSRootsFile != ""}, ca.Alternative{Field: "tlsRootsPEM", Set: len(c.TLSRootsPEM) != 0}),
	} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.TokenLifetime <= 0 || c.TokenLifetime > maxTokenLifetime {
		errs = append(errs, fmt.Errorf("tokenLifetime: %v is outside (0s, %v]", c.TokenLifetime, maxTokenLifetime))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout: %v is not positive", c.Timeout))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("clock: required"))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("logger: required"))
	}
	return errors.Join(errs...)
}

func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	switch {
	case u.Scheme != "https":
		return nil, fmt.Errorf("%q: scheme must be https", raw)
	case u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("%q: want https://host[:port][/path] and nothing else", raw)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	return u, nil
}

// signer signs through step-ca.
type signer struct {
	base        *url.URL
	client      *http.Client
	provisioner string
	key         *jose.JSONWebKey
	jws         jose.Signer
	lifetime    time.Duration
	clock       func() time.Time
	chain       []*x509.Certificate
	roots       []*x509.Certificate
	// keyField, chainField and rootsField name where the provisioner key,
	// chain and roots came from, for messages.
	keyField, chainField, rootsField string
}

// New checks cfg, reads the certificates and the provisioner key, and asks
// step-ca (within ctx) whether it signs with the chain's first certificate,
// trusts one of the roots, and has the provisioner with this key. It signs
// nothing. Errors wrap ca.ErrInvalidSigner and never contain the key or its
// password.
//
// The returned Signer is a ca.RequestSigner and a ca.LeewaySigner, safe
// for concurrent use.
func New(ctx context.Context, cfg Config) (ca.Signer, error) {
	cfg = cfg.Default()
	s, err := newSigner(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.probe(ctx); err != nil {
		s.client.CloseIdleConnections()
		return nil, err
	}
	cfg.Logger.Info("step-ca signer ready", "component", "ca/stepca", "url", s.base.String(), "provisioner", s.provisioner, "keyID", s.key.KeyID, "issuer", s.chain[0].Subject.String())
	return s, nil
}

// newSigner is New without asking step-ca anything.
func newSigner(cfg Config) (*signer, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: step-ca: invalid config: %w", ca.ErrInvalidSigner, err)
	}
	base, err := parseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: step-ca: url: %w", ca.ErrInvalidSigner, err)
	}
	chain, chainField, err := ca.ReadCertificatesFrom("step-ca", "chain", cfg.ChainFile, cfg.ChainPEM)
	if err != nil {
		return nil, err
	}
	roots, rootsField, err := ca.ReadCertificatesFrom("step-ca", "roots", cfg.RootsFile, cfg.RootsPEM)
	if err != nil {
		return nil, err
	}
	if err := ca.VerifyChain(chain, roots, cfg.Clock()); err != nil {
		return nil, fmt.Errorf("step-ca: %w", err)
	}
	tlsRoots, _, err := ca.ReadCertificatesFrom("step-ca", "tlsRoots", cfg.TLSRootsFile, cfg.TLSRootsPEM)
	if err != nil {
		return nil, err
	}
	key, keyField, err := readKey(cfg)
	if err != nil {
		return nil, err
	}
	jws, err := jose.NewSigner(
		jose.SigningKey{Algorithm: jose.SignatureAlgorithm(key.Algorithm), Key: key.Key},
		new(jose.SignerOptions).WithType("JWT").WithHeader("kid", key.KeyID),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: step-ca: provisioner key (%s): cannot sign tokens", ca.ErrInvalidSigner, key.Algorithm)
	}
	return &signer{
		base:        base,
		client:      remote.NewClient(tlsRoots, cfg.Timeout),
		provisioner: cfg.Provisioner,
		key:         key,
		jws:         jws,
		lifetime:    cfg.TokenLifetime,
		clock:       cfg.Clock,
		chain:       chain,
		roots:       roots,
		keyField:    keyField,
		chainField:  chainField,
		rootsField:  rootsField,
	}, nil
}

// errNoPassword: the provisioner key is encrypted, and no password is set.
var errNoPassword = errors.New("the key is encrypted and no provisionerPasswordFile or provisionerPassword is set")

// readKey reads the provisioner's private key from its file, or parses
// cfg.ProvisionerKey, decrypting it with the password (file) if it is
// encrypted. It never prompts. It returns the field the key came from;
// errors name the source, never the content.
func readKey(cfg Config) (*jose.JSONWebKey, string, error) {
	opts := []jose.Option{jose.WithPasswordPrompter("", func(string) ([]byte, error) {
		return nil, errNoPassword
	})}
	passwordField := "provisionerPasswordFile"
	switch {
	case len(cfg.ProvisionerPassword) != 0:
		passwordField = "provisionerPassword"
		opts = append(opts, jose.WithPassword(bytes.TrimRightFunc(cfg.ProvisionerPassword, unicode.IsSpace)))
	case cfg.ProvisionerPasswordFile != "":
		opts = append(opts, jose.WithPasswordFile(cfg.ProvisionerPasswordFile))
	}
	var (
		key    *jose.JSONWebKey
		err    error
		field  = "provisionerKey"
		source = "provisioner key (provisionerKey)"
	)
	if cfg.ProvisionerKeyFile != "" {
		field, source = "provisionerKeyFile", "provisioner key "+cfg.ProvisionerKeyFile
		key, err = jose.ReadKey(cfg.ProvisionerKeyFile, opts...)
	} else {
		key, err = jose.ParseKey(cfg.ProvisionerKey, opts...)
	}
	if err != nil {
		return nil, field, fmt.Errorf("%w: step-ca: %s: %s", ca.ErrInvalidSigner, source, keyError(err, passwordField))
	}
	if key.IsPublic() || jose.IsSymmetric(key) {
		return nil, field, fmt.Errorf("%w: step-ca: %s is not a private key", ca.ErrInvalidSigner, source)
	}
	if key.KeyID == "" {
		if key.KeyID, err = jose.Thumbprint(key); err != nil {
			return nil, field, fmt.Errorf("%w: step-ca: %s: no key id and no thumbprint", ca.ErrInvalidSigner, source)
		}
	}
	return key, field, nil
}

// keyError explains a key-reading error without quoting the key, the
// password or the file; passwordField names where the password came from.
func keyError(err error, passwordField string) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "invalid password"):
		return "wrong password (" + passwordField + ")"
	case strings.Contains(msg, errNoPassword.Error()):
		return errNoPassword.Error()
	case strings.Contains(msg, "no such file"), strings.Contains(msg, "permission denied"):
		return "cannot read the file (or the password file)"
	}
	return "not a JWK, an encrypted JWK or a PEM private key"
}

// profileClaim is the "relaymesh" token claim ProvisionerTemplate reads:
// the fields of the certificate other than SANs, validity, key and serial.
type profileClaim struct {
	Subject          x509util.Subject          `json:"subject"`
	KeyUsage         x509util.KeyUsage         `json:"keyUsage"`
	ExtKeyUsage      x509util.ExtKeyUsage      `json:"extKeyUsage"`
	BasicConstraints x509util.BasicConstraints `json:"basicConstraints"`
	// NameConstraints of a mesh intermediate: its trust domain.
	NameConstraints *x509util.NameConstraints `json:"nameConstraints,omitempty"`
}

// tokenClaims are the claims of a one-time sign token.
type tokenClaims struct {
	jose.Claims
	SANs      []string     `json:"sans"`
	Relaymesh profileClaim `json:"relaymesh"`
}

// token mints a one-time token for tmpl.
func (s *signer) token(tmpl *x509.Certificate) (string, error) {
	sans := slices.Clone(tmpl.DNSNames)
	for _, ip := range tmpl.IPAddresses {
		sans = append(sans, ip.String())
	}
	for _, u := range tmpl.URIs {
		sans = append(sans, u.String())
	}
	if len(tmpl.EmailAddresses) != 0 {
		return "", errors.New("step-ca: email SANs are not supported")
	}
	// The token's subject: the first SAN of a leaf, the common name of a
	// CA (ProvisionerTemplate gives a CA no SANs).
	var sub string
	switch {
	case tmpl.IsCA && len(sans) != 0:
		return "", errors.New("step-ca: CA certificates with SANs are not supported")
	case tmpl.IsCA && tmpl.Subject.CommonName == "":
		return "", errors.New("step-ca: a CA certificate without a common name cannot be requested")
	case tmpl.IsCA:
		sub = tmpl.Subject.CommonName
	case len(sans) == 0:
		return "", errors.New("step-ca: a certificate without SANs cannot be requested")
	default:
		sub = sans[0]
	}
	subject, err := subjectOf(tmpl.Subject)
	if err != nil {
		return "", err
	}
	bc := x509util.BasicConstraints{IsCA: tmpl.IsCA, MaxPathLen: -1}
	if tmpl.IsCA && (tmpl.MaxPathLen > 0 || tmpl.MaxPathLenZero) {
		bc.MaxPathLen = tmpl.MaxPathLen
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return "", fmt.Errorf("step-ca: token id: %w", err)
	}
	now := s.clock()
	claims := tokenClaims{
		Claims: jose.Claims{
			ID:        hex.EncodeToString(id),
			Issuer:    s.provisioner,
			Subject:   sub,
			Audience:  jose.Audience{s.base.JoinPath("1.0", "sign").String()},
			IssuedAt:  jose.NewNumericDate(now),
			NotBefore: jose.NewNumericDate(now),
			Expiry:    jose.NewNumericDate(now.Add(s.lifetime)),
		},
		SANs: sans,
		Relaymesh: profileClaim{
			Subject:          subject,
			KeyUsage:         x509util.KeyUsage(tmpl.KeyUsage),
			ExtKeyUsage:      x509util.ExtKeyUsage(tmpl.ExtKeyUsage),
			BasicConstraints: bc,
		},
	}
	if len(tmpl.PermittedURIDomains)+len(tmpl.ExcludedURIDomains) != 0 {
		claims.Relaymesh.NameConstraints = &x509util.NameConstraints{Critical: tmpl.PermittedDNSDomainsCritical,
			PermittedURIDomains: tmpl.PermittedURIDomains, ExcludedURIDomains: tmpl.ExcludedURIDomains}
	}
	tok, err := jose.Signed(s.jws).Claims(claims).CompactSerialize()
	if err != nil {
		return "", errors.New("step-ca: signing the token failed")
	}
	return tok, nil
}

// subjectOf expresses a subject for the template; names that do not
// survive the round trip are refused rather than dropped.
func subjectOf(n pkix.Name) (x509util.Subject, error) {
	if len(n.ExtraNames) != 0 {
		return x509util.Subject{}, errors.New("step-ca: subjects with extra attributes are not supported")
	}
	return x509util.Subject{
		Country:            n.Country,
		Organization:       n.Organization,
		OrganizationalUnit: n.OrganizationalUnit,
		Locality:           n.Locality,
		Province:           n.Province,
		StreetAddress:      n.StreetAddress,
		PostalCode:         n.PostalCode,
		SerialNumber:       n.SerialNumber,
		CommonName:         n.CommonName,
	}, nil
}

// signRequest is the body of POST /1.0/sign.
type signRequest struct {
	CSR       string `json:"csr"`
	OTT       string `json:"ott"`
	NotBefore string `json:"notBefore"`
	NotAfter  string `json:"notAfter"`
}

// Sign implements ca.Signer. step-ca wants proof of possession: Sign
// fails with ca.ErrNeedsRequest; the Authority calls SignRequest.
func (s *signer) Sign(ctx context.Context, _ *x509.Certificate, _ crypto.PublicKey) (*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("step-ca: %w", ca.ErrNeedsRequest)
}

// SignRequest implements ca.RequestSigner: it asks step-ca to sign req's
// key for tmpl, with a fresh one-time token.
func (s *signer) SignRequest(ctx context.Context, tmpl *x509.Certificate, req *x509.CertificateRequest) (*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tmpl == nil || req == nil {
		return nil, errors.New("step-ca: nil template or certificate request")
	}
	tok, err := s.token(tmpl)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(signRequest{
		CSR:       string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.Raw})),
		OTT:       tok,
		NotBefore: tmpl.NotBefore.UTC().Format(time.RFC3339),
		NotAfter:  tmpl.NotAfter.UTC().Format(time.RFC3339),
	})
	if err != nil {
		return nil, fmt.Errorf("step-ca: %w", err)
	}
	var resp struct {
		Certificate string `json:"crt"`
	}
	if err := s.call(ctx, http.MethodPost, "1.0/sign", body, func(b []byte) error { return json.Unmarshal(b, &resp) }); err != nil {
		return nil, err
	}
	cert, err := parseCertificates(resp.Certificate)
	if err != nil || len(cert) != 1 {
		return nil, fmt.Errorf("step-ca: sign: the response holds no single certificate")
	}
	return cert[0], nil
}

// probe checks step-ca before the first issuance.
func (s *signer) probe(ctx context.Context) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: step-ca: %s", ca.ErrInvalidSigner, fmt.Sprintf(format, args...))
	}
	var intermediates, roots []*x509.Certificate
	if err := s.call(ctx, http.MethodGet, "1.0/intermediates.pem", nil, func(b []byte) (err error) {
		intermediates, err = parseCertificates(string(b))
		return err
	}); err != nil {
		return fmt.Errorf("%w: %w", ca.ErrInvalidSigner, err)
	}
	if len(intermediates) == 0 || !intermediates[0].Equal(s.chain[0]) {
		return fail("the server does not sign with the first certificate of %s %q (serial %x)", s.chainField, s.chain[0].Subject, s.chain[0].SerialNumber)
	}
	if err := s.call(ctx, http.MethodGet, "1.0/roots.pem", nil, func(b []byte) (err error) {
		roots, err = parseCertificates(string(b))
		return err
	}); err != nil {
		return fmt.Errorf("%w: %w", ca.ErrInvalidSigner, err)
	}
	if !slices.ContainsFunc(s.roots, func(r *x509.Certificate) bool { return slices.ContainsFunc(roots, r.Equal) }) {
		return fail("none of the server's roots is in %s", s.rootsField)
	}
	return s.checkProvisioner(ctx)
}

// checkProvisioner finds the JWK provisioner and compares its key with
// ours.
func (s *signer) checkProvisioner(ctx context.Context) error {
	type provisioner struct {
		Type string          `json:"type"`
		Name string          `json:"name"`
		Key  json.RawMessage `json:"key"`
	}
	cursor := ""
	for range 100 {
		path := "1.0/provisioners?limit=100"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		var page struct {
			Provisioners []provisioner `json:"provisioners"`
			NextCursor   string        `json:"nextCursor"`
		}
		if err := s.call(ctx, http.MethodGet, path, nil, func(b []byte) error { return json.Unmarshal(b, &page) }); err != nil {
			return fmt.Errorf("%w: %w", ca.ErrInvalidSigner, err)
		}
		for _, p := range page.Provisioners {
			if p.Name != s.provisioner || p.Type != "JWK" {
				continue
			}
			var pub jose.JSONWebKey
			if err := json.Unmarshal(p.Key, &pub); err != nil {
				return fmt.Errorf("%w: step-ca: provisioner %q: unreadable key: %w", ca.ErrInvalidSigner, p.Name, err)
			}
			if pub.KeyID != s.key.KeyID {
				continue
			}
			if !keyutil.Equal(pub.Key, s.key.Public().Key) {
				return fmt.Errorf("%w: step-ca: provisioner %q with key id %s has another public key than %s", ca.ErrInvalidSigner, p.Name, pub.KeyID, s.keyField)
			}
			return nil
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	return fmt.Errorf("%w: step-ca: no JWK provisioner %q with key id %s (the key in %s)", ca.ErrInvalidSigner, s.provisioner, s.key.KeyID, s.keyField)
}

// call sends a request and hands a 2xx response body to decode. step-ca
// answers errors with {"status": ..., "message": ...}; 401 is ErrAuth.
func (s *signer) call(ctx context.Context, method, path string, body []byte, decode func([]byte) error) error {
	ref, err := url.Parse(path)
	if err != nil {
		return fmt.Errorf("step-ca: %w", err)
	}
	u := s.base.JoinPath(ref.Path)
	u.RawQuery = ref.RawQuery
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return fmt.Errorf("step-ca: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", errTransport, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("step-ca: %s: reading the response: %w", ref.Path, err)
	}
	if len(raw) > maxResponseBytes {
		return fmt.Errorf("step-ca: %s: response larger than %d bytes", ref.Path, maxResponseBytes)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var e struct {
			Message string `json:"message"`
		}
		msg := strings.TrimSpace(string(raw))
		if json.Unmarshal(raw, &e) == nil && e.Message != "" {
			msg = e.Message
		}
		if resp.StatusCode == http.StatusUnauthorized {
			return fmt.Errorf("%w (wrong provisioner key, key id or name, or a reused or expired token): %s", ErrAuth, text.Truncate(msg, 300))
		}
		return fmt.Errorf("step-ca: %s: HTTP %d: %s", ref.Path, resp.StatusCode, text.Truncate(msg, 300))
	}
	if err := decode(raw); err != nil {
		return fmt.Errorf("step-ca: %s: unexpected response: %w", ref.Path, err)
	}
	return nil
}

// Chain implements ca.Signer.
func (s *signer) Chain() []*x509.Certificate { return slices.Clone(s.chain) }

// Roots implements ca.Signer.
func (s *signer) Roots() []*x509.Certificate { return slices.Clone(s.roots) }

// Leeway implements ca.LeewaySigner: step-ca picks the serial number.
func (s *signer) Leeway() ca.Leeway { return ca.Leeway{Serial: true} }

var (
	_ ca.RequestSigner = (*signer)(nil)
	_ ca.LeewaySigner  = (*signer)(nil)
)

func parseCertificates(s string) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := []byte(s)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("unexpected PEM block %q", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("trailing data after the certificates")
	}
	return out, nil
}
