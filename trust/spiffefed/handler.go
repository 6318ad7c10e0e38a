package spiffefed

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// PathPrefix is where bundles are served: PathPrefix + <trust domain>, e.g.
// https://bundles.example.com:8443/bundles/prod.example.com.
const PathPrefix = "/bundles/"

// maxPath bounds the request path: the prefix and the longest trust domain.
const maxPath = len(PathPrefix) + maxTrustDomainLen

// Refresh hints: the default, and the bounds a server accepts.
const (
	DefaultRefreshHint = 5 * time.Minute
	MinRefreshHint     = 10 * time.Second
	MaxRefreshHint     = 24 * time.Hour
)

// Errors of ParsePath.
var (
	ErrPathTooLong = errors.New("the path is too long")
	ErrNotBundle   = errors.New("not a bundle path: want " + PathPrefix + "<trust domain>")
)

// ParsePath returns the trust domain a request path asks for.
func ParsePath(path string) (string, error) {
	if len(path) > maxPath {
		return "", ErrPathTooLong
	}
	name, ok := strings.CutPrefix(path, PathPrefix)
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", ErrNotBundle
	}
	if _, err := ParseTrustDomain(name); err != nil {
		return "", err
	}
	return name, nil
}

// Snapshot is the rendered documents of one State: what every request is
// served from until the next.
type Snapshot struct {
	docs    map[string][]byte
	seqs    map[string]uint64
	entries map[string]Entry
	// loaded: made by NewSnapshot of a State (the zero Snapshot a server
	// serves before it loaded the stored one is not).
	loaded bool
}

// NewSnapshot renders s's bundles with refresh hint hint.
func NewSnapshot(s State, hint time.Duration) (*Snapshot, error) {
	snap := &Snapshot{docs: map[string][]byte{}, seqs: map[string]uint64{}, entries: map[string]Entry{}, loaded: true}
	for td, e := range s.Bundles {
		doc, err := Document(td, e, hint)
		if err != nil {
			return nil, err
		}
		snap.docs[td], snap.seqs[td], snap.entries[td] = doc, e.Sequence, e
	}
	return snap, nil
}

// RootPublished reports since when root has been published in the bundle
// of every one of trustDomains: the latest of their publish times. An
// error says why not: the snapshot is not a loaded state, or a trust
// domain is not published, does not carry root yet, or has no publish
// time yet.
func (s *Snapshot) RootPublished(trustDomains []string, root *x509.Certificate) (time.Time, error) {
	if s == nil || !s.loaded {
		return time.Time{}, errors.New("the bundle endpoint has not loaded the published bundles yet")
	}
	if len(trustDomains) == 0 {
		return time.Time{}, errors.New("no trust domain to publish")
	}
	var since time.Time
	var missing []string
	for _, td := range trustDomains {
		e, ok := s.entries[td]
		switch {
		case !ok:
			missing = append(missing, td+" (not published: see the server's log)")
		case !e.Holds(root):
			missing = append(missing, td+" (not yet)")
		case e.Published.IsZero():
			missing = append(missing, td+" (no publish time yet)")
		case e.Published.After(since):
			since = e.Published
		}
	}
	if len(missing) > 0 {
		return time.Time{}, fmt.Errorf("%d of %d trust domains lack it: %s", len(missing), len(trustDomains), strings.Join(missing[:min(len(missing), 5)], ", "))
	}
	return since, nil
}

// Bundle returns the document published for trust domain td.
func (s *Snapshot) Bundle(td string) ([]byte, bool) {
	if s == nil {
		return nil, false
	}
	doc, ok := s.docs[td]
	return doc, ok
}

// PublishedAt returns when each published trust domain's roots were first
// published (zero: not recorded).
func (s *Snapshot) PublishedAt() map[string]time.Time {
	out := map[string]time.Time{}
	if s != nil {
		for td, e := range s.entries {
			out[td] = e.Published
		}
	}
	return out
}

// Sequences returns each published trust domain's sequence.
func (s *Snapshot) Sequences() map[string]uint64 {
	out := map[string]uint64{}
	if s != nil {
		for td, n := range s.seqs {
			out[td] = n
		}
	}
	return out
}

// Document is the SPIFFE bundle of trust domain td: a JWK Set whose keys
// are e's roots (x5c, use "x509-svid"), with e's sequence and hint.
func Document(td string, e Entry, hint time.Duration) ([]byte, error) {
	name, err := ParseTrustDomain(td)
	if err != nil {
		return nil, err
	}
	if len(e.Roots) == 0 {
		return nil, fmt.Errorf("spiffefed: trust domain %s has no roots", td)
	}
	b := spiffebundle.FromX509Authorities(name, e.Roots)
	b.SetSequenceNumber(e.Sequence)
	b.SetRefreshHint(hint)
	return b.Marshal()
}

// Handler serves the bundles of the Snapshot current returns: GET
// PathPrefix + <trust domain>, no client authentication. Every other
// method gets 405, a path that is not a bundle path or too long 404 or
// 414, a trust domain with no bundle the same 404 as a name that is not
// one: it learns nothing of what is not published.
func Handler(current func() *Snapshot) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		td, err := ParsePath(r.URL.Path)
		switch {
		case errors.Is(err, ErrPathTooLong):
			http.Error(w, "the path is too long", http.StatusRequestURITooLong)
			return
		case err != nil:
			http.Error(w, "no SPIFFE bundle here: bundles are served at "+PathPrefix+"<trust domain>", http.StatusNotFound)
			return
		}
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		doc, ok := current().Bundle(td)
		if !ok {
			http.Error(w, "no SPIFFE bundle here: bundles are served at "+PathPrefix+"<trust domain>", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(doc)
	})
}

// Server returns an http.Server for h with the endpoint's limits (header
// size and timeouts: a request is a path, nothing more).
func Server(h http.Handler, tlsConfig *tls.Config) *http.Server {
	return &http.Server{Handler: http.MaxBytesHandler(h, 1<<10), TLSConfig: tlsConfig, MaxHeaderBytes: 8 << 10,
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute}
}

// WebTLS is the https_web profile: served with get's certificate (a
// provided one, or one from the relay CA), TLS 1.2 or later, no client
// certificate asked.
func WebTLS(get func() (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}, ClientAuth: tls.NoClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() }}
}

// SPIFFETLS is the https_spiffe profile: served with the X509-SVID svid
// gives (of the endpoint's SPIFFE ID, under a root published for its trust
// domain), no client certificate asked.
func SPIFFETLS(svid x509svid.Source) *tls.Config {
	c := tlsconfig.TLSServerConfig(svid)
	c.MinVersion = tls.VersionTLS12
	c.ClientAuth = tls.NoClientCert
	return c
}
