package backend

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaymesh/relaymesh/ca"
)

// Bounds of FileSigner.
const (
	// maxReplaced bounds the replaced issuing CAs a FileSigner keeps
	// accepting: a reload that would need more is refused (and changes
	// nothing) rather than drop one early.
	maxReplaced = 8
	// maxListed bounds previousIssuersFile.
	maxListed = 4
	// closeDelay is how long a replaced back end stays open for the
	// signatures in flight on it.
	closeDelay = 30 * time.Second
)

// FileSignerConfig configures NewFileSigner.
type FileSignerConfig struct {
	// Path of the CA back-end file (File). Required.
	Path string
	// Keep is how long an issuing CA replaced at a reload stays accepted
	// after the switch (never past its own NotAfter): at least the agent
	// certificate lifetime plus the time every replica takes to notice
	// the change. Required.
	Keep time.Duration
	// Clock returns the current time; default time.Now.
	Clock func() time.Time
	// Logger; default: discarded.
	Logger *slog.Logger
}

// FileSigner is the relay CA on an enterprise back end (pkcs11, cfssl,
// stepca) configured by a File, which it reads again at each Reload: when
// the back end's issuing CA changed (a new chain, or a new key on the
// token), it signs with the new one and still accepts agent certificates
// of the replaced one for Keep after the switch, never past its NotAfter
// (ca.IssuerSet), and those of previousIssuersFile until their NotAfter.
// The roots, the type and the Leeway may not change (a root change is a
// root rotation). It is safe for concurrent use.
//
// NewFileSigner returns it as a ca.RequestSigner for the back ends that
// need the request (cfssl, stepca).
type FileSigner struct {
	cfg    FileSignerConfig
	typ    Type
	roots  []*x509.Certificate
	leeway ca.Leeway
	mu     sync.Mutex // serializes Reload
	cur    atomic.Pointer[fileState]
}

type fileState struct {
	signer      ca.Signer
	fingerprint []byte
	replaced    []replacedIssuer
	listed      []*x509.Certificate
	generation  int
}

type replacedIssuer struct {
	cert  *x509.Certificate
	until time.Time
}

// requestFileSigner is a FileSigner of a back end that signs requests.
type requestFileSigner struct{ *FileSigner }

// SignRequest signs with the current back end.
func (s requestFileSigner) SignRequest(ctx context.Context, tmpl *x509.Certificate, req *x509.CertificateRequest) (*x509.Certificate, error) {
	rs, ok := s.cur.Load().signer.(ca.RequestSigner)
	if !ok {
		return nil, fmt.Errorf("%w: the %s back end does not sign requests", ca.ErrIssuance, s.typ)
	}
	return rs.SignRequest(ctx, tmpl, req)
}

// NewFileSigner reads the file at cfg.Path, builds its back end with New
// and returns it as a FileSigner (a ca.RequestSigner for cfssl and
// stepca). Errors name the file and the field.
func NewFileSigner(ctx context.Context, cfg FileSignerConfig) (ca.Signer, error) {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Path == "" {
		return nil, fmt.Errorf("%w: path: required", ErrFile)
	}
	if cfg.Keep <= 0 {
		return nil, fmt.Errorf("%w: keep: must be positive", ErrFile)
	}
	f, fp, err := LoadFile(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	st, err := buildState(ctx, cfg, f, fp)
	if err != nil {
		return nil, err
	}
	s := &FileSigner{cfg: cfg, typ: f.Type, roots: st.signer.Roots(), leeway: ca.SignerLeeway(st.signer)}
	st.generation = 1
	s.cur.Store(st)
	if _, ok := st.signer.(ca.RequestSigner); ok {
		return requestFileSigner{s}, nil
	}
	return s, nil
}

// buildState builds the back end of f and reads its previous issuers.
func buildState(ctx context.Context, cfg FileSignerConfig, f File, fp []byte) (*fileState, error) {
	signer, err := New(ctx, f.Config(cfg.Clock, cfg.Logger))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	st := &fileState{signer: signer, fingerprint: fp}
	if f.PreviousIssuersFile != "" {
		b, err := readBounded(f.PreviousIssuersFile, 16<<10)
		if err == nil {
			st.listed, err = checkPrevious(b, signer.Chain(), signer.Roots())
		}
		if err != nil {
			closeSigner(signer, cfg.Logger)
			return nil, fmt.Errorf("%s: %w: previousIssuersFile %s: %w", cfg.Path, ErrFile, f.PreviousIssuersFile, err)
		}
	}
	return st, nil
}

// checkPrevious parses previous issuing CAs: at most 4, each a CA
// certificate that may sign certificates, signed by one of roots or of the
// chain's intermediates, not the current issuing CA, none twice. Expired
// ones are parsed too (AcceptedIssuers leaves them out).
func checkPrevious(b []byte, chain, roots []*x509.Certificate) ([]*x509.Certificate, error) {
	certs, _, err := ca.ReadCertificatesFrom("relay CA", "previous issuers", "", b)
	if err != nil {
		return nil, err
	}
	if len(certs) > maxListed {
		return nil, fmt.Errorf("%d certificates, more than %d", len(certs), maxListed)
	}
	parents := append(slices.Clone(roots), chain[1:]...)
	for i, c := range certs {
		name := fmt.Sprintf("certificate %d (%s)", i+1, c.Subject)
		switch {
		case !c.BasicConstraintsValid || !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0:
			return nil, fmt.Errorf("%s is not a CA that signs certificates", name)
		case c.Equal(chain[0]):
			return nil, fmt.Errorf("%s is the current issuing CA", name)
		case slices.ContainsFunc(certs[:i], c.Equal):
			return nil, fmt.Errorf("%s is listed twice", name)
		case !slices.ContainsFunc(parents, func(p *x509.Certificate) bool { return c.CheckSignatureFrom(p) == nil }):
			return nil, fmt.Errorf("%s is not signed by the relay CA's roots or intermediates", name)
		}
	}
	return certs, nil
}

// Reload reads the file again and, if it or a file it names changed,
// builds the back end anew. A new issuing CA becomes current; the replaced
// one stays accepted for Keep. On any error nothing changes: the signer
// keeps signing and accepting as before. It reports whether the current
// issuing CA changed.
func (s *FileSigner) Reload(ctx context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cur.Load()
	now := s.cfg.Clock()
	f, fp, err := LoadFile(s.cfg.Path)
	if err != nil {
		return false, fmt.Errorf("%s: %w", s.cfg.Path, err)
	}
	if string(fp) == string(old.fingerprint) {
		return false, nil
	}
	if f.Type != s.typ {
		return false, fmt.Errorf("%s: %w: type changed from %s to %s: restart the server to change the back end", s.cfg.Path, ErrFile, s.typ, f.Type)
	}
	st, err := buildState(ctx, s.cfg, f, fp)
	if err != nil {
		return false, err
	}
	refuse := func(format string, args ...any) (bool, error) {
		closeSigner(st.signer, s.cfg.Logger)
		return false, fmt.Errorf("%s: %w: "+format, append([]any{s.cfg.Path, ErrFile}, args...)...)
	}
	if !slices.EqualFunc(st.signer.Roots(), s.roots, (*x509.Certificate).Equal) {
		return refuse("the roots changed: agents pin the relay root, so a new root is a root rotation, not a reload")
	}
	if ca.SignerLeeway(st.signer) != s.leeway {
		return refuse("the back end's leeway changed: restart the server")
	}
	cur, next := old.signer.Chain()[0], st.signer.Chain()[0]
	changed := !cur.Equal(next)
	st.generation = old.generation
	for _, r := range old.replaced {
		if now.Before(r.until) && !r.cert.Equal(next) {
			st.replaced = append(st.replaced, r)
		}
	}
	if changed {
		until := now.Add(s.cfg.Keep)
		if cur.NotAfter.Before(until) {
			until = cur.NotAfter
		}
		st.replaced = append([]replacedIssuer{{cert: cur, until: until}}, st.replaced...)
		if len(st.replaced) > maxReplaced {
			return refuse("%d replaced issuing CAs would still be accepted, more than %d: replace the issuing CA less often", len(st.replaced), maxReplaced)
		}
		st.generation++
	}
	s.cur.Store(st)
	// Signatures in flight on the old back end finish before it closes.
	time.AfterFunc(closeDelay, func() { closeSigner(old.signer, s.cfg.Logger) })
	return changed, nil
}

// Sign signs with the current back end.
func (s *FileSigner) Sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	return s.cur.Load().signer.Sign(ctx, tmpl, pub)
}

// Chain is the current issuing CA and its intermediates.
func (s *FileSigner) Chain() []*x509.Certificate { return s.cur.Load().signer.Chain() }

// Roots are the relay roots; they never change.
func (s *FileSigner) Roots() []*x509.Certificate { return slices.Clone(s.roots) }

// Leeway is the back end's; it never changes.
func (s *FileSigner) Leeway() ca.Leeway { return s.leeway }

// Type is the back end.
func (s *FileSigner) Type() Type { return s.typ }

// Generation is 1 for the issuing CA the signer started with, one more at
// each change.
func (s *FileSigner) Generation() int { return s.cur.Load().generation }

// AcceptedIssuers is the current issuing CA, then the replaced ones within
// Keep of their switch and before their NotAfter, then those of
// previousIssuersFile before their NotAfter.
func (s *FileSigner) AcceptedIssuers() []*x509.Certificate {
	st := s.cur.Load()
	now := s.cfg.Clock()
	out := []*x509.Certificate{st.signer.Chain()[0]}
	for _, r := range st.replaced {
		if now.Before(r.until) && now.Before(r.cert.NotAfter) {
			out = append(out, r.cert)
		}
	}
	for _, c := range st.listed {
		if now.Before(c.NotAfter) && !slices.ContainsFunc(out, c.Equal) {
			out = append(out, c)
		}
	}
	return out
}

// Close closes the current back end (the PKCS#11 sessions).
func (s *FileSigner) Close() error {
	if c, ok := s.cur.Load().signer.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func closeSigner(signer ca.Signer, log *slog.Logger) {
	if c, ok := signer.(io.Closer); ok {
		if err := c.Close(); err != nil {
			log.Warn("closing a replaced CA back end failed", "component", "ca/backend", "error", err)
		}
	}
}

var (
	_ ca.IssuerSet     = (*FileSigner)(nil)
	_ ca.LeewaySigner  = (*FileSigner)(nil)
	_ ca.RequestSigner = requestFileSigner{}
	_ io.Closer        = (*FileSigner)(nil)
)
