// Package cfsslca is the cfssl signer back end: certificates are signed by
// a remote `cfssl serve` through its authenticated signing endpoint
// (/api/v1/cfssl/authsign, HMAC-SHA-256 with a shared key), so the CA key
// stays with cfssl.
//
// cfssl needs proof of possession (a certificate request signed by the
// subject key), so the Signer is a ca.RequestSigner: the Authority passes
// the agent's checked CSR along, and sends the subject and every SAN in the
// sign request itself. cfssl chooses the serial number (20 random bytes)
// and the validity (its profile's expiry and backdate, from its own clock),
// so the Signer declares a ca.Leeway for exactly those two fields; the
// Authority still requires everything else to be exactly what it asked
// for.
//
// Each kind of certificate has its own cfssl profile (see Profiles); each
// profile must carry the auth key, exactly the usages listed there, the
// Authority's lifetime as expiry, and a CSRWhitelist that copies nothing
// but the public key from the request. The profile for mesh intermediates
// (Profiles.Intermediate, optional) also needs a ca_constraint of is_ca,
// max_path_len 0 and max_path_len_zero. New checks the usages of every
// profile and the issuing certificate with the server before it returns.
//
// The wire types come from cfssl v1.6.5 (auth, api, info, csr). The sign
// request itself is written here: its server-side type is unexported in
// cfssl, and cfssl's signer.SignRequest has fields the API ignores and
// would pull cfssl's certificate linter into the relay binary. cfssl's
// api/client is not used either: it takes no context and opens a new
// connection for every request.
package cfsslca

import (
	"bytes"
	"context"
	"crypto"
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
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cloudflare/cfssl/api"
	"github.com/cloudflare/cfssl/auth"
	"github.com/cloudflare/cfssl/csr"
	"github.com/cloudflare/cfssl/info"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/internal/remote"
)

// Defaults and bounds of Config.
const (
	defaultValidityLeeway = 2 * time.Minute
	defaultTimeout        = 30 * time.Second
	maxResponseBytes      = 1 << 20
)

// ErrAuth: the cfssl server refused the authentication key.
var ErrAuth = errors.New("cfssl refused the authentication key")

// errTransport marks a request that got no answer from the server.
var errTransport = errors.New("cfssl: no answer from the server")

// Profiles name the cfssl signing profile for each kind of certificate the
// Authority issues. Each profile must list exactly these usages, in this
// order:
//
//   - Client: "digital signature", "client auth" (agent certificates, for
//     every key type: RFC 5280 allows no key encipherment with client
//     auth).
//   - Server: "digital signature", "server auth".
//   - ServerRSA: "digital signature", "key encipherment", "server auth".
//   - Intermediate: "cert sign", "crl sign", and a ca_constraint with
//     "is_ca": true, "max_path_len": 0, "max_path_len_zero": true (mesh
//     intermediates, Authority.IssueIntermediate). Optional: empty means
//     this signer issues no intermediates (a relay CA never does). cfssl's
//     info endpoint does not report ca_constraint; the Authority refuses a
//     certificate from a profile without it.
type Profiles struct {
	Client, Server, ServerRSA, Intermediate string
}

// Config configures the cfssl back end.
type Config struct {
	// URL of the cfssl server, such as https://cfssl.example:8888.
	// Required. It must be https unless its host is a loopback address (or
	// "localhost"); AllowInsecureHTTP lifts that.
	URL string
	// AuthKeyFile is a file holding the hex HMAC key of the profiles'
	// auth_key; AuthKeyEnv the name of an environment variable holding it;
	// AuthKey the hex key itself. Exactly one is required. The key is never
	// logged or put in an error.
	AuthKeyFile string
	AuthKeyEnv  string
	AuthKey     []byte
	// Profiles default to relaymesh-client, relaymesh-server and
	// relaymesh-server-rsa; Intermediate has no default (none).
	Profiles Profiles
	// ChainFile holds the PEM certificate cfssl signs with, then any
	// intermediates above it in order; ChainPEM is the same PEM in memory.
	// Exactly one is required.
	ChainFile string
	ChainPEM  []byte
	// RootsFile holds the PEM roots the chain verifies to; RootsPEM is the
	// same PEM in memory. Exactly one is required.
	RootsFile string
	RootsPEM  []byte
	// TLSRootsFile holds the PEM roots the server's HTTPS certificate must
	// chain to; TLSRootsPEM is the same PEM in memory. Default (neither
	// set): the roots, RootsFile or RootsPEM. No other root is trusted.
	TLSRootsFile string
	TLSRootsPEM  []byte
	// AllowInsecureHTTP permits plain http to a host that is not loopback.
	// Anyone on the path then sees every request and can replay it (cfssl
	// authenticates the request, not the channel, and has no nonce). New
	// logs a warning when it is used. For tests and labs only.
	AllowInsecureHTTP bool
	// ValidityLeeway is how far cfssl's NotBefore and NotAfter may be from
	// the Authority's: its rounding to the minute, the difference of its
	// profile's backdate and the Authority's, and clock skew. Default 2m,
	// at most ca.MaxValidityLeeway. Use a profile backdate of 1m (the
	// Authority's default) and an expiry equal to the Authority's TTL.
	ValidityLeeway time.Duration
	// Timeout bounds each request to the server; default 30s.
	Timeout time.Duration
	// Clock returns the current time; default time.Now.
	Clock func() time.Time
	// Logger receives start-up messages; default: discarded.
	Logger *slog.Logger
}

// Default returns c with every zero field that has a default set.
func (c Config) Default() Config {
	if c.Profiles.Client == "" {
		c.Profiles.Client = "relaymesh-client"
	}
	if c.Profiles.Server == "" {
		c.Profiles.Server = "relaymesh-server"
	}
	if c.Profiles.ServerRSA == "" {
		c.Profiles.ServerRSA = "relaymesh-server-rsa"
	}
	if c.TLSRootsFile == "" && len(c.TLSRootsPEM) == 0 {
		if c.RootsFile != "" {
			c.TLSRootsFile = c.RootsFile
		} else {
			c.TLSRootsPEM = c.RootsPEM
		}
	}
	if c.ValidityLeeway == 0 {
		c.ValidityLeeway = defaultValidityLeeway
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
	} else if _, err := parseURL(c.URL, c.AllowInsecureHTTP); err != nil {
		errs = append(errs, fmt.Errorf("url: %w", err))
	}
	for _, err := range []error{
		ca.ExactlyOne("authKeyFile, authKeyEnv: one is required (or authKey)", ca.Alternative{Field: "authKeyFile", Set: c.AuthKeyFile != ""}, ca.Alternative{Field: "authKeyEnv", Set: c.AuthKeyEnv != ""}, ca.Alternative{Field: "authKey", Set: len(c.AuthKey) != 0}),
		ca.ExactlyOne("chainFile: required (or chainPEM)", ca.Alternative{Field: "chainFile", Set: c.ChainFile != ""}, ca.Alternative{Field: "chainPEM", Set: len(c.ChainPEM) != 0}),
		ca.ExactlyOne("rootsFile: required (or rootsPEM)", ca.Alternative{Field: "rootsFile", Set: c.RootsFile != ""}, ca.Alternative{Field: "rootsPEM", Set: len(c.RootsPEM) != 0}),
		ca.ExactlyOne("tlsRootsFile: required (or tlsRootsPEM)", ca.Alternative{Field: "tlsRootsFile", Set: c.TLSRootsFile != ""}, ca.Alternative{Field: "tlsRootsPEM", Set: len(c.TLSRootsPEM) != 0}),
	} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	for field, v := range map[string]string{"profiles.client": c.Profiles.Client, "profiles.server": c.Profiles.Server, "profiles.serverRSA": c.Profiles.ServerRSA} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s: required", field))
		}
	}
	if c.ValidityLeeway <= 0 || c.ValidityLeeway > ca.MaxValidityLeeway {
		errs = append(errs, fmt.Errorf("validityLeeway: %v is outside (0s, %v]", c.ValidityLeeway, ca.MaxValidityLeeway))
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
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// parseURL accepts an http(s) URL without query or fragment; plain http
// only to a loopback host unless allowed.
func parseURL(raw string, allowHTTP bool) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, fmt.Errorf("%q: scheme must be https (or http on loopback)", raw)
	case u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("%q: want scheme://host[:port][/path] and nothing else", raw)
	case u.Scheme == "http" && !allowHTTP && !isLoopback(u.Hostname()):
		return nil, fmt.Errorf("%q: plain http is only allowed to a loopback host; use https (or the allowInsecureHTTP opt-in, for labs)", raw)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	return u, nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// signer signs through a cfssl server.
type signer struct {
	base     *url.URL
	client   *http.Client
	provider auth.Provider
	profiles Profiles
	chain    []*x509.Certificate
	roots    []*x509.Certificate
	leeway   ca.Leeway
	// chainField names where chain came from, for messages.
	chainField string
}

// New checks cfg, reads the certificates and the auth key, and asks the
// server (within ctx) which certificate it signs with, whether every
// profile exists with the usages Profiles lists, and whether it accepts the
// auth key. It signs nothing. Errors wrap ca.ErrInvalidSigner (and
// ErrAuth for a refused key), and never contain the key.
//
// The returned Signer is a ca.RequestSigner and a ca.LeewaySigner, safe
// for concurrent use.
func New(ctx context.Context, cfg Config) (ca.Signer, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: cfssl: invalid config: %w", ca.ErrInvalidSigner, err)
	}
	base, err := parseURL(cfg.URL, cfg.AllowInsecureHTTP)
	if err != nil {
		return nil, fmt.Errorf("%w: cfssl: url: %w", ca.ErrInvalidSigner, err)
	}
	chain, chainField, err := ca.ReadCertificatesFrom("cfssl", "chain", cfg.ChainFile, cfg.ChainPEM)
	if err != nil {
		return nil, err
	}
	roots, _, err := ca.ReadCertificatesFrom("cfssl", "roots", cfg.RootsFile, cfg.RootsPEM)
	if err != nil {
		return nil, err
	}
	if err := ca.VerifyChain(chain, roots, cfg.Clock()); err != nil {
		return nil, fmt.Errorf("cfssl: %w", err)
	}
	tlsRoots, _, err := ca.ReadCertificatesFrom("cfssl", "tlsRoots", cfg.TLSRootsFile, cfg.TLSRootsPEM)
	if err != nil {
		return nil, err
	}
	provider, err := readAuthKey(cfg)
	if err != nil {
		return nil, err
	}
	s := &signer{
		base:       base,
		client:     remote.NewClient(tlsRoots, cfg.Timeout),
		provider:   provider,
		profiles:   cfg.Profiles,
		chain:      chain,
		roots:      roots,
		leeway:     ca.Leeway{Serial: true, Validity: cfg.ValidityLeeway},
		chainField: chainField,
	}
	if err := s.probe(ctx); err != nil {
		s.client.CloseIdleConnections()
		return nil, err
	}
	if base.Scheme == "http" {
		level := slog.LevelInfo
		if !isLoopback(base.Hostname()) {
			level = slog.LevelWarn
		}
		cfg.Logger.Log(ctx, level, "cfssl signer uses plain http: requests can be read and replayed on the path", "component", "ca/cfssl", "url", base.String(), "allowInsecureHTTP", cfg.AllowInsecureHTTP)
	}
	cfg.Logger.Info("cfssl signer ready", "component", "ca/cfssl", "url", base.String(), "issuer", chain[0].Subject.String())
	return s, nil
}

// readAuthKey reads the hex HMAC key, or takes cfg.AuthKey; errors name the
// source, never the content (cfssl's own parser would quote the first bad
// character).
func readAuthKey(cfg Config) (auth.Provider, error) {
	var raw, source string
	switch {
	case len(cfg.AuthKey) != 0:
		raw, source = string(cfg.AuthKey), "field authKey"
	case cfg.AuthKeyFile != "":
		b, err := os.ReadFile(cfg.AuthKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: cfssl: auth key file: %w", ca.ErrInvalidSigner, err)
		}
		raw, source = string(b), "file "+cfg.AuthKeyFile
	default:
		v, ok := os.LookupEnv(cfg.AuthKeyEnv)
		if !ok {
			return nil, fmt.Errorf("%w: cfssl: auth key environment variable %s is not set", ca.ErrInvalidSigner, cfg.AuthKeyEnv)
		}
		raw, source = v, "environment variable "+cfg.AuthKeyEnv
	}
	raw = strings.TrimSpace(raw)
	key, err := hex.DecodeString(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: cfssl: the auth key (from %s) is not hex", ca.ErrInvalidSigner, source)
	case len(key) < 16:
		return nil, fmt.Errorf("%w: cfssl: the auth key (from %s) is %d bytes, want at least 16", ca.ErrInvalidSigner, source, len(key))
	}
	p, err := auth.New(raw, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: cfssl: the auth key (from %s) is not usable", ca.ErrInvalidSigner, source)
	}
	return p, nil
}

// wantUsages are the usages each profile must list.
var wantUsages = map[string][]string{
	"client":       {"digital signature", "client auth"},
	"server":       {"digital signature", "server auth"},
	"serverRSA":    {"digital signature", "key encipherment", "server auth"},
	"intermediate": {"cert sign", "crl sign"},
}

// probe checks the server before the first issuance: the certificate it
// signs with, each profile's usages, and the auth key.
func (s *signer) probe(ctx context.Context) error {
	profiles := []struct{ field, name string }{
		{"client", s.profiles.Client}, {"server", s.profiles.Server}, {"serverRSA", s.profiles.ServerRSA},
	}
	if s.profiles.Intermediate != "" {
		profiles = append(profiles, struct{ field, name string }{"intermediate", s.profiles.Intermediate})
	}
	for _, p := range profiles {
		body, err := json.Marshal(info.Req{Profile: p.name})
		if err != nil {
			return fmt.Errorf("%w: cfssl: %w", ca.ErrInvalidSigner, err)
		}
		var resp info.Resp
		if err := s.call(ctx, "info", body, &resp); err != nil {
			if errors.Is(err, errTransport) || ctx.Err() != nil {
				return fmt.Errorf("%w: %w", ca.ErrInvalidSigner, err)
			}
			return fmt.Errorf("%w: cfssl: profile %q (profiles.%s): %w", ca.ErrInvalidSigner, p.name, p.field, err)
		}
		cert, err := parseCertificatePEM(resp.Certificate)
		if err != nil {
			return fmt.Errorf("%w: cfssl: info: %w", ca.ErrInvalidSigner, err)
		}
		if !cert.Equal(s.chain[0]) {
			return fmt.Errorf("%w: cfssl: the server signs with certificate %q (serial %x), not with the first certificate of %s %q (serial %x)", ca.ErrInvalidSigner, cert.Subject, cert.SerialNumber, s.chainField, s.chain[0].Subject, s.chain[0].SerialNumber)
		}
		if !slices.Equal(resp.Usage, wantUsages[p.field]) {
			return fmt.Errorf("%w: cfssl: profile %q (profiles.%s) has usages %q, want exactly %q (for a profile name it does not know, cfssl describes its default profile)", ca.ErrInvalidSigner, p.name, p.field, resp.Usage, wantUsages[p.field])
		}
	}
	// An authenticated request without a certificate request: cfssl checks
	// the token first, then refuses the empty request. Nothing is signed.
	err := s.authSign(ctx, signRequest{Hosts: []string{}, Profile: s.profiles.Client}, nil)
	switch {
	case err == nil:
		return fmt.Errorf("%w: cfssl: the server signed an empty request", ca.ErrInvalidSigner)
	case errors.Is(err, ErrAuth):
		return fmt.Errorf("%w: %w", ca.ErrInvalidSigner, err)
	case strings.Contains(err.Error(), "certificate_request"):
		return nil
	default:
		return fmt.Errorf("%w: cfssl: authsign: %w", ca.ErrInvalidSigner, err)
	}
}

// Sign implements ca.Signer. cfssl wants proof of possession: Sign fails
// with ca.ErrNeedsRequest; the Authority calls SignRequest.
func (s *signer) Sign(ctx context.Context, _ *x509.Certificate, _ crypto.PublicKey) (*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("cfssl: %w", ca.ErrNeedsRequest)
}

// SignRequest implements ca.RequestSigner: it asks cfssl to sign req's
// key with the profile for tmpl, tmpl's subject and tmpl's SANs.
func (s *signer) SignRequest(ctx context.Context, tmpl *x509.Certificate, req *x509.CertificateRequest) (*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tmpl == nil || req == nil {
		return nil, errors.New("cfssl: nil template or certificate request")
	}
	profile, err := s.profileFor(tmpl)
	if err != nil {
		return nil, err
	}
	subject, err := subjectOf(tmpl)
	if err != nil {
		return nil, err
	}
	if len(tmpl.EmailAddresses) != 0 {
		return nil, errors.New("cfssl: email SANs are not supported")
	}
	if tmpl.IsCA && len(tmpl.DNSNames)+len(tmpl.IPAddresses)+len(tmpl.URIs) != 0 {
		// cfssl drops DNS names and URIs of CA certificates, but not IP
		// addresses; refuse rather than have it half-applied.
		return nil, errors.New("cfssl: CA certificates with SANs are not supported")
	}
	hosts := slices.Clone(tmpl.DNSNames)
	for _, ip := range tmpl.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	for _, u := range tmpl.URIs {
		hosts = append(hosts, u.String())
	}
	sr := signRequest{
		Hosts:   hosts,
		Request: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.Raw})),
		Subject: subject,
		Profile: profile,
	}
	// cfssl's sign API takes no extensions: name constraints (a mesh
	// intermediate's trust domain) come from the certificate request, which
	// the intermediate profile copies (copy_extensions). The Authority has
	// checked that what the request asks for is exactly the template's.
	nc, err := ca.URINameConstraints(tmpl)
	if err != nil {
		return nil, fmt.Errorf("cfssl: %w", err)
	}
	if nc != nil && !slices.ContainsFunc(req.Extensions, func(e pkix.Extension) bool { return e.Id.Equal(nc.Id) }) {
		return nil, errors.New("cfssl: the certificate request does not ask for the intermediate's name constraints, and cfssl can take them only from the request (upgrade the agent)")
	}
	var cert *x509.Certificate
	if err := s.authSign(ctx, sr, &cert); err != nil {
		return nil, err
	}
	if nc != nil && len(cert.PermittedURIDomains) == 0 {
		return nil, fmt.Errorf("cfssl: profile %q did not copy the requested name constraints into the intermediate: set \"copy_extensions\": true and no CSRWhitelist in it (cfssl drops copied extensions under a whitelist; the server still checks every field of the result)", profile)
	}
	return cert, nil
}

// profileFor picks the profile whose usages are tmpl's.
func (s *signer) profileFor(tmpl *x509.Certificate) (string, error) {
	rsaKey := tmpl.KeyUsage&x509.KeyUsageKeyEncipherment != 0
	switch {
	case tmpl.IsCA:
		switch {
		case s.profiles.Intermediate == "":
			return "", errors.New("cfssl: no profile for intermediate CA certificates (set profiles.intermediate)")
		case tmpl.MaxPathLen != 0 || !tmpl.MaxPathLenZero || len(tmpl.ExtKeyUsage) != 0 || tmpl.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign:
			return "", errors.New("cfssl: the intermediate profile issues CA certificates with pathLen 0, cert sign and crl sign only")
		}
		return s.profiles.Intermediate, nil
	case slices.Equal(tmpl.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) && !rsaKey:
		return s.profiles.Client, nil
	case slices.Equal(tmpl.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) && rsaKey:
		return s.profiles.ServerRSA, nil
	case slices.Equal(tmpl.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}):
		return s.profiles.Server, nil
	}
	return "", fmt.Errorf("cfssl: no profile for extended key usage %v with key usage %#x", tmpl.ExtKeyUsage, tmpl.KeyUsage)
}

// subject is the subject of a sign request, as cfssl's API reads it.
type subject struct {
	CN    string     `json:"CN,omitempty"`
	Names []csr.Name `json:"names"`
}

// subjectOf expresses tmpl's subject for cfssl, which knows C, ST, L, O,
// OU and CN; anything else is refused rather than dropped.
func subjectOf(tmpl *x509.Certificate) (*subject, error) {
	n := tmpl.Subject
	if len(n.StreetAddress) != 0 || len(n.PostalCode) != 0 || n.SerialNumber != "" || len(n.ExtraNames) != 0 {
		return nil, errors.New("cfssl: the subject has attributes cfssl cannot set (only C, ST, L, O, OU and CN)")
	}
	out := &subject{CN: n.CommonName, Names: []csr.Name{}}
	count := max(len(n.Country), len(n.Province), len(n.Locality), len(n.Organization), len(n.OrganizationalUnit))
	at := func(s []string, i int) string {
		if i < len(s) {
			return s[i]
		}
		return ""
	}
	for i := range count {
		out.Names = append(out.Names, csr.Name{C: at(n.Country, i), ST: at(n.Province, i), L: at(n.Locality, i), O: at(n.Organization, i), OU: at(n.OrganizationalUnit, i)})
	}
	return out, nil
}

// signRequest is the body of /api/v1/cfssl/authsign's request field.
type signRequest struct {
	Hosts   []string `json:"hosts"`
	Request string   `json:"certificate_request"`
	Subject *subject `json:"subject,omitempty"`
	Profile string   `json:"profile"`
}

// authSign sends req to authsign and parses the certificate into out
// (nil: the caller expects no certificate).
func (s *signer) authSign(ctx context.Context, req signRequest, out **x509.Certificate) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("cfssl: %w", err)
	}
	token, err := s.provider.Token(body)
	if err != nil {
		return errors.New("cfssl: computing the request token failed")
	}
	aReq, err := json.Marshal(auth.AuthenticatedRequest{Timestamp: time.Now().Unix(), Token: token, Request: body})
	if err != nil {
		return fmt.Errorf("cfssl: %w", err)
	}
	var result struct {
		Certificate string `json:"certificate"`
	}
	if err := s.call(ctx, "authsign", aReq, &result); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	cert, err := parseCertificatePEM(result.Certificate)
	if err != nil {
		return fmt.Errorf("cfssl: signed certificate: %w", err)
	}
	*out = cert
	return nil
}

// call POSTs body to endpoint and decodes the result into out. cfssl
// answers every error with a JSON envelope; an invalid token is ErrAuth.
func (s *signer) call(ctx context.Context, endpoint string, body []byte, out any) error {
	u := s.base.JoinPath("api", "v1", "cfssl", endpoint)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("cfssl: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", errTransport, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("cfssl: %s: reading the response: %w", endpoint, err)
	}
	if len(raw) > maxResponseBytes {
		return fmt.Errorf("cfssl: %s: response larger than %d bytes", endpoint, maxResponseBytes)
	}
	var envelope api.Response
	if err := json.Unmarshal(raw, &envelope); err != nil {
		return fmt.Errorf("cfssl: %s: HTTP %d, not a cfssl response: %q", endpoint, resp.StatusCode, text.Truncate(string(raw), 200))
	}
	if !envelope.Success {
		if len(envelope.Errors) == 0 {
			return fmt.Errorf("cfssl: %s: HTTP %d, failed without a message", endpoint, resp.StatusCode)
		}
		e := envelope.Errors[0]
		if e.Message == "invalid token" {
			return fmt.Errorf("%w (wrong auth key, or a profile with another auth_key)", ErrAuth)
		}
		return fmt.Errorf("cfssl: %s: %s (code %d)", endpoint, text.Truncate(e.Message, 300), e.Code)
	}
	result, err := json.Marshal(envelope.Result)
	if err != nil {
		return fmt.Errorf("cfssl: %s: %w", endpoint, err)
	}
	if err := json.Unmarshal(result, out); err != nil {
		return fmt.Errorf("cfssl: %s: unexpected result: %w", endpoint, err)
	}
	return nil
}

// Chain implements ca.Signer.
func (s *signer) Chain() []*x509.Certificate { return slices.Clone(s.chain) }

// Roots implements ca.Signer.
func (s *signer) Roots() []*x509.Certificate { return slices.Clone(s.roots) }

// Leeway implements ca.LeewaySigner: cfssl picks the serial number, and
// the validity from its clock and profile.
func (s *signer) Leeway() ca.Leeway { return s.leeway }

var (
	_ ca.RequestSigner = (*signer)(nil)
	_ ca.LeewaySigner  = (*signer)(nil)
)

func parseCertificatePEM(s string) (*x509.Certificate, error) {
	block, rest := pem.Decode([]byte(s))
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("not exactly one PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}
