package spiffefed

// The importing side: fetching a foreign trust domain's bundle from its
// bundle endpoint and deciding whether to accept it
// (docs/design/2026-12-03-spiffe-import.md). go-spiffe's
// federation.FetchBundle is not used: it follows redirects, ignores the
// status code and reads a body without bound. Fetch builds its own
// request and Accept is the pure decision, so every refusal is testable
// without a server.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
)

// Defaults of the importer, in one place.
const (
	// DefaultMaxBody bounds a fetched bundle document: a bundle of
	// MaxRoots roots is under 8 KiB.
	DefaultMaxBody int64 = 64 << 10
	// DefaultFetchTimeout bounds one fetch: connect, TLS, headers and the
	// whole body.
	DefaultFetchTimeout = 10 * time.Second
	// MinRefresh and MaxRefresh bound NextRefresh, whatever the peer's
	// refresh hint says.
	MinRefresh = 30 * time.Second
	MaxRefresh = time.Hour
	// DefaultRefresh is NextRefresh of a bundle without a refresh hint.
	DefaultRefresh = 5 * time.Minute
)

// Profile of a bundle endpoint (SPIFFE Federation spec §5).
type Profile string

// The two bundle endpoint profiles.
const (
	// ProfileWeb: the endpoint is authenticated with Web PKI (a
	// certificate for the URL's host under Peer.WebRoots or the system
	// roots).
	ProfileWeb Profile = "https_web"
	// ProfileSPIFFE: the endpoint is authenticated with its X509-SVID
	// (Peer.EndpointID) under the bundle last accepted for the peer.
	ProfileSPIFFE Profile = "https_spiffe"
)

// Peer is a foreign bundle endpoint.
type Peer struct {
	// TrustDomain is the peer's; the fetched document is parsed as its
	// bundle.
	TrustDomain spiffeid.TrustDomain
	// URL of the bundle endpoint; https:// only.
	URL string
	// Profile says how the endpoint is authenticated.
	Profile Profile
	// EndpointID is, for ProfileSPIFFE, the SPIFFE ID the endpoint's
	// X509-SVID MUST carry; it MUST be in TrustDomain. Unused for
	// ProfileWeb.
	EndpointID spiffeid.ID
	// WebRoots are, for ProfileWeb, the roots the endpoint's certificate
	// is verified with; nil: the system roots. Unused for ProfileSPIFFE.
	WebRoots *x509.CertPool
}

// FetcherOptions are a Fetcher's limits; a zero field takes its default.
type FetcherOptions struct {
	// MaxBody bounds the document read (DefaultMaxBody); a longer body is
	// refused (RefuseTooLarge) after reading at most MaxBody+1 bytes.
	MaxBody int64
	// Timeout bounds one Fetch from connecting to the body's last byte
	// (DefaultFetchTimeout); a slow body is cut by it.
	Timeout time.Duration
}

// Fetcher fetches foreign bundles: over HTTPS only (TLS 1.2 or later),
// never following a redirect, never sending a client certificate, never
// through a proxy, status 200 only, Content-Type ignored, the body
// bounded in size and time. The zero Fetcher uses the defaults; a Fetcher
// is safe for concurrent use.
type Fetcher struct {
	maxBody int64
	timeout time.Duration
}

// NewFetcher is a Fetcher with o's limits.
func NewFetcher(o FetcherOptions) *Fetcher {
	return &Fetcher{maxBody: o.MaxBody, timeout: o.Timeout}
}

func (f *Fetcher) limits() (maxBody int64, timeout time.Duration) {
	maxBody, timeout = f.maxBody, f.timeout
	if maxBody <= 0 {
		maxBody = DefaultMaxBody
	}
	if timeout <= 0 {
		timeout = DefaultFetchTimeout
	}
	return maxBody, timeout
}

// RefuseReason is why a bundle was refused: a small fixed set, usable as
// a metric label.
type RefuseReason string

// The reasons of a Refused.
const (
	// RefuseInvalidPeer: the Peer (or last) given to Fetch cannot be used;
	// nothing was fetched.
	RefuseInvalidPeer RefuseReason = "invalid_peer"
	// RefuseFetch: transport, TLS (including a wrong endpoint identity),
	// timeout or a redirect.
	RefuseFetch RefuseReason = "fetch"
	// RefuseStatus: a status other than 200.
	RefuseStatus RefuseReason = "status"
	// RefuseTooLarge: a body longer than the Fetcher's MaxBody.
	RefuseTooLarge RefuseReason = "too_large"
	// RefuseMalformed: not a JWK Set, or not a SPIFFE bundle.
	RefuseMalformed RefuseReason = "malformed"
	// RefuseTrustDomain: a root that names another trust domain (a
	// spiffe:// URI SAN). A document carries no trust domain itself, so a
	// root without such a SAN cannot be told apart.
	RefuseTrustDomain RefuseReason = "trust_domain"
	// RefuseSequence: a spiffe_sequence lower than the last accepted, or
	// equal to it with other roots, or absent after one was given.
	RefuseSequence RefuseReason = "sequence"
	// RefuseNotRoot: an x509-svid authority that is not a self-signed CA.
	RefuseNotRoot RefuseReason = "not_root"
	// RefuseTooManyRoots: more than MaxRoots x509-svid authorities.
	RefuseTooManyRoots RefuseReason = "too_many_roots"
	// RefuseEmpty: no x509-svid authority (none at all, or JWT ones only).
	RefuseEmpty RefuseReason = "empty"
)

// Refused is every error Fetch and Accept return. Err never carries more
// of the peer's bytes than a short, quoted, printable prefix.
type Refused struct {
	TrustDomain spiffeid.TrustDomain
	Reason      RefuseReason
	Err         error
}

// Error names the trust domain, the reason and the detail, the detail cut
// to maxDetail printable ASCII bytes: a transport error may quote what
// the peer sent (a TLS error, the names of its certificate).
func (r *Refused) Error() string {
	detail := "<nil>"
	if r.Err != nil {
		detail = sanitize([]byte(r.Err.Error()), maxDetail)
	}
	return fmt.Sprintf("spiffefed: the bundle of trust domain %q was refused (%s): %s", r.TrustDomain.Name(), r.Reason, detail)
}

// maxDetail bounds the detail of Refused.Error.
const maxDetail = 320

// Unwrap is the detail.
func (r *Refused) Unwrap() error { return r.Err }

func refuse(td spiffeid.TrustDomain, reason RefuseReason, format string, args ...any) *Refused {
	return &Refused{TrustDomain: td, Reason: reason, Err: fmt.Errorf(format, args...)}
}

// MaxBundlePEM bounds an accepted bundle's roots encoded as PEM: what the
// FederatedTrustDomain's status.bundlePEM can hold.
const MaxBundlePEM = 64 << 10

// PEM is roots, sorted and without duplicates, as PEM certificates.
func PEM(roots []*x509.Certificate) []byte {
	var out []byte
	for _, r := range SortedRoots(roots) {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Raw})...)
	}
	return out
}

func pemLen(roots []*x509.Certificate) int { return len(PEM(roots)) }

// errRedirect is what CheckRedirect returns: a bundle endpoint answers at
// its URL or not at all.
var errRedirect = errors.New("redirect refused")

// Fetch GETs p's bundle and returns it only if Accept(p.TrustDomain,
// last, body) accepts it; else a nil bundle and a *Refused.
//
// last is the bundle last accepted for p (the bootstrap bundle first).
// For ProfileSPIFFE it is required: the endpoint's X509-SVID is verified
// against last's X.509 authorities and MUST carry p.EndpointID, which is
// how the peer's own root rotation is followed (Federation spec §5.2).
// For ProfileWeb it may be nil.
func (f *Fetcher) Fetch(ctx context.Context, p Peer, last *spiffebundle.Bundle) (*spiffebundle.Bundle, error) {
	td := p.TrustDomain
	tlsCfg, err := clientTLS(p, last)
	if err != nil {
		return nil, &Refused{TrustDomain: td, Reason: RefuseInvalidPeer, Err: err}
	}
	maxBody, timeout := f.limits()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            (&net.Dialer{Timeout: timeout}).DialContext,
		TLSClientConfig:        tlsCfg,
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		DisableKeepAlives:      true,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 16 << 10,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport:     tr,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirect },
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
	if err != nil {
		return nil, &Refused{TrustDomain: td, Reason: RefuseInvalidPeer, Err: err}
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, errRedirect) {
			// resp is the redirect, its body already closed.
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			return nil, refuse(td, RefuseFetch, "%w: the endpoint answered status %d", errRedirect, status)
		}
		return nil, &Refused{TrustDomain: td, Reason: RefuseFetch, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, prefixLen))
		return nil, refuse(td, RefuseStatus, "status %d, body starting %q", resp.StatusCode, printable(head))
	}
	if resp.ContentLength > maxBody {
		return nil, refuse(td, RefuseTooLarge, "Content-Length %d, more than %d bytes", resp.ContentLength, maxBody)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, &Refused{TrustDomain: td, Reason: RefuseFetch, Err: fmt.Errorf("reading the body: %w", err)}
	}
	if ctx.Err() != nil {
		// The deadline may end a body as if it were complete: refused
		// whole, never read as the document.
		return nil, refuse(td, RefuseFetch, "the body was cut by the %v timeout", timeout)
	}
	if int64(len(body)) > maxBody {
		return nil, refuse(td, RefuseTooLarge, "a body of more than %d bytes", maxBody)
	}
	return Accept(td, last, body)
}

// clientTLS is the TLS client configuration for p's profile, or why p
// cannot be fetched.
func clientTLS(p Peer, last *spiffebundle.Bundle) (*tls.Config, error) {
	if p.TrustDomain.IsZero() {
		return nil, errors.New("no trust domain")
	}
	u, err := url.Parse(p.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return nil, errors.New("the URL is not https://host[:port]/path")
	}
	if last != nil && last.TrustDomain() != p.TrustDomain {
		return nil, fmt.Errorf("the last bundle is of trust domain %q", last.TrustDomain().Name())
	}
	var cfg *tls.Config
	switch p.Profile {
	case ProfileWeb:
		cfg = &tls.Config{RootCAs: p.WebRoots}
	case ProfileSPIFFE:
		switch {
		case p.EndpointID.IsZero():
			return nil, errors.New("https_spiffe without an endpoint SPIFFE ID")
		case !p.EndpointID.MemberOf(p.TrustDomain):
			return nil, fmt.Errorf("endpoint SPIFFE ID %s is not in the trust domain", p.EndpointID)
		case last == nil || len(last.X509Authorities()) == 0:
			return nil, errors.New("https_spiffe without a last (bootstrap) bundle of X.509 authorities")
		}
		cfg = tlsconfig.TLSClientConfig(last, tlsconfig.AuthorizeID(p.EndpointID))
	default:
		return nil, fmt.Errorf("unknown profile %q", printable([]byte(p.Profile)))
	}
	cfg.MinVersion = tls.VersionTLS12
	cfg.Certificates = nil
	// Asked for a client certificate, answer with none.
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	return cfg, nil
}

// Accept parses body as the bundle of td and returns it if it may replace
// last (nil: nothing accepted before, any sequence is accepted); else a
// nil bundle and a *Refused. It accepts a document of 1 to MaxRoots
// x509-svid authorities, each a self-signed CA naming no other trust
// domain, whose spiffe_sequence is not lower than last's (equal only with
// the same roots). JWT-SVID authorities are kept; keys of other uses are
// ignored, as the SPIFFE bundle format says.
func Accept(td spiffeid.TrustDomain, last *spiffebundle.Bundle, body []byte) (*spiffebundle.Bundle, error) {
	if td.IsZero() {
		return nil, refuse(td, RefuseInvalidPeer, "no trust domain")
	}
	if last != nil && last.TrustDomain() != td {
		return nil, refuse(td, RefuseInvalidPeer, "the last bundle is of trust domain %q", last.TrustDomain().Name())
	}
	// A first look, before go-jose parses any certificate: is it a JWK
	// Set, and how many X.509 authorities does it claim?
	var doc struct {
		Keys []struct {
			Use string `json:"use"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return nil, refuse(td, RefuseMalformed, "not JSON (at byte %d), starting %q", syntax.Offset, printable(body))
		}
		return nil, refuse(td, RefuseMalformed, "not a JWK Set, starting %q", printable(body))
	}
	x509Keys := 0
	for _, k := range doc.Keys {
		if k.Use == "x509-svid" {
			x509Keys++
		}
	}
	switch {
	case x509Keys == 0:
		return nil, refuse(td, RefuseEmpty, "no x509-svid authority among %d keys", len(doc.Keys))
	case x509Keys > MaxRoots:
		return nil, refuse(td, RefuseTooManyRoots, "%d x509-svid authorities, more than %d", x509Keys, MaxRoots)
	}
	b, err := spiffebundle.Parse(td, body)
	if err != nil {
		return nil, refuse(td, RefuseMalformed, "%s", clip(err.Error()))
	}
	roots := b.X509Authorities()
	if len(roots) == 0 { // cannot happen after the count above; fail closed
		return nil, refuse(td, RefuseEmpty, "no x509-svid authority")
	}
	for _, r := range roots {
		if other, ok := namesOtherTrustDomain(r, td); ok {
			return nil, refuse(td, RefuseTrustDomain, "root %q names trust domain %q", clip(r.Subject.String()), clip(other))
		}
		if err := selfSignedCA(r); err != nil {
			return nil, refuse(td, RefuseNotRoot, "authority %q: %v", clip(r.Subject.String()), err)
		}
	}
	if seq, ok := b.SequenceNumber(); ok && seq > math.MaxInt64 {
		// Kubernetes stores integers as int64: a sequence above it could
		// never be recorded, so never compared against.
		return nil, refuse(td, RefuseSequence, "sequence %d is above %d", seq, int64(math.MaxInt64))
	}
	if n := pemLen(roots); n > MaxBundlePEM {
		return nil, refuse(td, RefuseTooLarge, "%d bytes of roots as PEM, more than %d", n, MaxBundlePEM)
	}
	if err := followsSequence(b, last); err != nil {
		return nil, &Refused{TrustDomain: td, Reason: RefuseSequence, Err: err}
	}
	return b, nil
}

// namesOtherTrustDomain reports the trust domain of a spiffe:// URI SAN
// of root other than td (a SPIRE root names its own). A URI SAN that is
// spiffe:// but not a SPIFFE ID counts as another.
func namesOtherTrustDomain(root *x509.Certificate, td spiffeid.TrustDomain) (string, bool) {
	for _, u := range root.URIs {
		if !strings.EqualFold(u.Scheme, "spiffe") {
			continue
		}
		id, err := spiffeid.FromURI(u)
		if err != nil {
			return u.Host, true
		}
		if id.TrustDomain() != td {
			return id.TrustDomain().Name(), true
		}
	}
	return "", false
}

// selfSignedCA is why c is not a root: not a CA, or not signed by its
// own key under its own name.
func selfSignedCA(c *x509.Certificate) error {
	if !c.BasicConstraintsValid || !c.IsCA {
		return errors.New("not a CA certificate")
	}
	if !bytes.Equal(c.RawIssuer, c.RawSubject) {
		return errors.New("not self-issued (its issuer is not its subject)")
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		return errors.New("not self-signed (its signature does not verify with its own key)")
	}
	return nil
}

// followsSequence is why b may not replace last.
func followsSequence(b, last *spiffebundle.Bundle) error {
	if last == nil {
		return nil
	}
	lastSeq, lastHas := last.SequenceNumber()
	if !lastHas {
		return nil // a bootstrap bundle: nothing to order by
	}
	seq, has := b.SequenceNumber()
	switch {
	case !has:
		return fmt.Errorf("no spiffe_sequence, the last accepted had %d", lastSeq)
	case seq < lastSeq:
		return fmt.Errorf("sequence %d is lower than %d, the last accepted", seq, lastSeq)
	case seq == lastSeq && !SameRoots(b.X509Authorities(), last.X509Authorities()):
		return fmt.Errorf("sequence %d is the last accepted's, with other roots", seq)
	}
	return nil
}

// NextRefresh is when to fetch again after b: its refresh hint clamped to
// [MinRefresh, MaxRefresh], DefaultRefresh without one.
func NextRefresh(b *spiffebundle.Bundle) time.Duration {
	if b == nil {
		return DefaultRefresh
	}
	hint, ok := b.RefreshHint()
	if !ok {
		return DefaultRefresh
	}
	return ClampRefresh(hint)
}

// ClampRefresh is a refresh hint clamped to [MinRefresh, MaxRefresh]: how
// long the importer waits after accepting a bundle with that hint.
func ClampRefresh(hint time.Duration) time.Duration {
	return min(max(hint, MinRefresh), MaxRefresh)
}

// prefixLen is how many of the peer's bytes an error may quote.
const prefixLen = 64

// printable is at most prefixLen bytes of b, for quoting in an error.
func printable(b []byte) string { return sanitize(b, prefixLen) }

// clip bounds a parser's message, which may quote the peer's bytes.
func clip(s string) string { return sanitize([]byte(s), 160) }

// sanitize is at most n bytes of b, each byte that is not printable ASCII
// replaced by '.', and "..." when cut.
func sanitize(b []byte, n int) string {
	cut := len(b) > n
	if cut {
		b = b[:n]
	}
	out := make([]byte, len(b), len(b)+3)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '.'
		}
		out[i] = c
	}
	if cut {
		out = append(out, "..."...)
	}
	return string(out)
}
