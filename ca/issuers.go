package ca

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Renewal of the generated relay issuing CA (design note
// docs/design/2026-12-02-relay-issuer-renewal.md).
//
// SigningSecretName keeps its layout: tls.crt, tls.key and ca.crt are the
// current issuing CA, so a replica that knows nothing of renewal loads the
// current one. Renewal adds:
//
//   - previous.crt: the issuing CAs this one replaced (certificates only,
//     never their keys), still accepted for agent certificates they signed;
//   - annotation relaymesh.io/issuer-switched-at: when the current one
//     replaced the last (RFC 3339);
//   - annotation relaymesh.io/issuer-generation: 1 for the first issuing
//     CA, one more at each renewal.
const (
	keyPreviousCerts       = "previous.crt"
	annotationSwitchedAt   = "relaymesh.io/issuer-switched-at"
	annotationGeneration   = "relaymesh.io/issuer-generation"
	maxPreviousIssuers     = 4
	maxPreviousIssuersSize = 16 << 10
	// DefaultIssuerRenewAt is the fraction of its life at which an issuing
	// CA is replaced.
	DefaultIssuerRenewAt = 2.0 / 3
)

// IssuerSet is a Signer that accepts agent certificates from more than its
// current issuing CA. AcceptedIssuers MUST return Chain()[0] first, then
// only CA certificates that verify to Roots(); a relay server refuses
// agent certificates whose issuer is not among them.
type IssuerSet interface {
	AcceptedIssuers() []*x509.Certificate
}

// RelayIssuers is the generated relay CA as the replicas use it: it signs
// with the current issuing CA, accepts the previous ones, and Reload picks
// up a renewal another replica published. It is safe for concurrent use.
type RelayIssuers struct {
	client    kubernetes.Interface
	namespace string
	clock     func() time.Time
	cur       atomic.Pointer[issuerState]
}

type issuerState struct {
	signer     Signer
	previous   []*x509.Certificate
	generation int
	switchedAt time.Time
	// rotation is what a relay root rotation in progress changes (nil:
	// none; see rootload.go).
	rotation *rotationView
}

// Sign signs with the current issuing CA.
func (r *RelayIssuers) Sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	return r.cur.Load().issuing().Sign(ctx, tmpl, pub)
}

// Chain is the current issuing CA.
func (r *RelayIssuers) Chain() []*x509.Certificate { return r.cur.Load().issuing().Chain() }

// Roots is the relay root, or during a root rotation the roots agent
// certificates may chain to.
func (r *RelayIssuers) Roots() []*x509.Certificate {
	st := r.cur.Load()
	if st.rotation != nil {
		return st.rotation.roots
	}
	return st.signer.Roots()
}

// AcceptedIssuers is the current issuing CA, then the previous ones still
// valid now.
func (r *RelayIssuers) AcceptedIssuers() []*x509.Certificate {
	st := r.cur.Load()
	now := r.clock()
	out := make([]*x509.Certificate, 1, 2+len(st.previous))
	out[0] = st.issuing().Chain()[0]
	if st.rotation != nil {
		out = append(out, st.rotation.otherIssuers...)
		if !st.rotation.currentRootAccepted {
			return out
		}
	}
	for _, p := range st.previous {
		if now.Before(p.NotAfter) {
			out = append(out, p)
		}
	}
	return out
}

// Generation is 1 for the first issuing CA, one more at each renewal.
func (r *RelayIssuers) Generation() int { return r.cur.Load().generation }

// verifiesSignature is the key signer's: Sign checks its own signature.
func (r *RelayIssuers) verifiesSignature() bool { return true }

// Reload re-reads the secrets and, if they hold a valid relay CA, makes it
// current. On any error nothing changes. It reports whether the current
// issuing CA changed.
func (r *RelayIssuers) Reload(ctx context.Context) (bool, error) {
	root, signing, err := getRelaySecrets(ctx, r.client.CoreV1().Secrets(r.namespace))
	if err != nil {
		return false, err
	}
	if root == nil || signing == nil {
		return false, halfPresent(r.namespace, root, signing)
	}
	st, err := loadIssuerState(root, signing, r.clock())
	if err != nil {
		return false, err
	}
	old := r.cur.Swap(st)
	return !old.issuing().Chain()[0].Equal(st.issuing().Chain()[0]), nil
}

// loadIssuerState parses and checks both secrets, previous issuers and
// annotations included: everything must verify to the root, or nothing
// is used.
func loadIssuerState(root, signing *corev1.Secret, now time.Time) (*issuerState, error) {
	st, _, err := loadRelayCAState(root, signing, now)
	return st, err
}

// loadRelayCAState is loadIssuerState that also returns the parsed relay
// CA, root key included, for a renewal to sign with; the state a replica
// keeps never holds the root key.
func loadRelayCAState(root, signing *corev1.Secret, now time.Time) (*issuerState, *RelayCA, error) {
	r, err := relayCAFromSecrets(root, signing)
	if err != nil {
		return nil, nil, err
	}
	if err := r.check(now); err != nil {
		return nil, nil, fmt.Errorf("relay CA in secrets %s/%s and %s: %w", root.Namespace, RootSecretName, SigningSecretName, err)
	}
	signer, err := r.Signer(now)
	if err != nil {
		return nil, nil, err
	}
	st := &issuerState{signer: signer, generation: 1}
	if st.rotation, err = loadRotationView(root, r, signer, now); err != nil {
		return nil, nil, err
	}
	bad := func(what string, err error) error {
		return fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, signing.Namespace, signing.Name, what, err)
	}
	if st.previous, err = ParsePreviousIssuers(signing.Data[keyPreviousCerts], r.Root, r.Issuer); err != nil {
		return nil, nil, bad(keyPreviousCerts, err)
	}
	if v, ok := signing.Annotations[annotationGeneration]; ok {
		g, err := strconv.Atoi(v)
		if err != nil || g < 1 || g > 1<<20 {
			return nil, nil, bad("annotation "+annotationGeneration, errors.New("not a generation number"))
		}
		st.generation = g
	}
	if v, ok := signing.Annotations[annotationSwitchedAt]; ok {
		if st.switchedAt, err = time.Parse(time.RFC3339, v); err != nil {
			return nil, nil, bad("annotation "+annotationSwitchedAt, errors.New("not an RFC 3339 time"))
		}
	}
	return st, r, nil
}

// ParsePreviousIssuers parses the previous issuing CAs of a relay CA
// (previous.crt): at most 4 certificates in 16 KiB of PEM, each an
// issuing CA (CA, pathLen 0, certSign) signed by root, distinct, and not
// current. Expired ones are parsed too: AcceptedIssuers leaves them out.
// Empty input is no previous issuer.
func ParsePreviousIssuers(b []byte, root, current *x509.Certificate) ([]*x509.Certificate, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) > maxPreviousIssuersSize {
		return nil, fmt.Errorf("%d bytes, more than %d", len(b), maxPreviousIssuersSize)
	}
	certs, err := parseCertsPEM(b)
	if err != nil {
		return nil, err
	}
	if len(certs) > maxPreviousIssuers {
		return nil, fmt.Errorf("%d certificates, more than %d", len(certs), maxPreviousIssuers)
	}
	for i, c := range certs {
		switch {
		case !c.BasicConstraintsValid || !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0 || c.MaxPathLen != 0 || !c.MaxPathLenZero:
			return nil, fmt.Errorf("%s is not an issuing CA (CA, pathLen 0, certSign)", describe(c))
		case current != nil && c.Equal(current):
			return nil, fmt.Errorf("%s is the current issuing CA", describe(c))
		case slices.ContainsFunc(certs[:i], c.Equal):
			return nil, fmt.Errorf("%s is listed twice", describe(c))
		}
		if err := c.CheckSignatureFrom(root); err != nil {
			return nil, fmt.Errorf("%s is not signed by the relay root: %w", describe(c), err)
		}
	}
	return certs, nil
}

// newRelayIssuers loads the CA in the two secrets as a RelayIssuers.
func newRelayIssuers(client kubernetes.Interface, namespace string, root, signing *corev1.Secret, clock func() time.Time) (*RelayIssuers, error) {
	st, err := loadIssuerState(root, signing, clock())
	if err != nil {
		return nil, err
	}
	r := &RelayIssuers{client: client, namespace: namespace, clock: clock}
	r.cur.Store(st)
	return r, nil
}

// RenewConfig configures RenewRelayIssuer.
type RenewConfig struct {
	// CA shapes the next issuing CA (IssuerTTL, Org, Clock, Rand).
	CA GenerateConfig
	// RenewAt is the fraction of its life after which the issuing CA is
	// replaced; default 2/3, in [0.1, 0.9].
	RenewAt float64
	// Keep is how long a replaced issuing CA stays accepted after the
	// switch (never past its own NotAfter): at least the agent
	// certificate lifetime plus the time replicas take to notice the new
	// issuing CA. Required.
	Keep time.Duration
}

// Default returns c with every zero field set to its default.
func (c RenewConfig) Default() RenewConfig {
	c.CA = c.CA.Default()
	if c.RenewAt == 0 {
		c.RenewAt = DefaultIssuerRenewAt
	}
	return c
}

// Validate reports every problem with c, each with its field path.
func (c RenewConfig) Validate() error {
	var errs []error
	if err := c.CA.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("ca: %w", err))
	}
	if c.RenewAt < 0.1 || c.RenewAt > 0.9 {
		errs = append(errs, fmt.Errorf("renewAt: %v is outside [0.1, 0.9]", c.RenewAt))
	}
	if c.Keep <= 0 {
		errs = append(errs, errors.New("keep: must be positive"))
	}
	return errors.Join(errs...)
}

// RenewalTime is when an issuing CA valid from notBefore to notAfter is
// replaced: at renewAt of its life.
func RenewalTime(notBefore, notAfter time.Time, renewAt float64) time.Time {
	return notBefore.Add(time.Duration(float64(notAfter.Sub(notBefore)) * renewAt))
}

// NextRelayIssuer signs a new issuing CA (cfg: IssuerTTL, never past the
// root) with r's root and returns the relay CA with it; r is unchanged.
func NextRelayIssuer(cfg GenerateConfig, r *RelayCA) (*RelayCA, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ca: invalid generate config: %w", err)
	}
	if r == nil || r.Root == nil || r.RootKey == nil {
		return nil, fmt.Errorf("%w: incomplete relay CA", ErrInvalidSigner)
	}
	issuer, key, err := newRelayIssuer(cfg, r.Root, r.RootKey)
	if err != nil {
		return nil, err
	}
	next := &RelayCA{Root: r.Root, RootKey: r.RootKey, Issuer: issuer, IssuerKey: key}
	if err := next.check(cfg.Clock()); err != nil {
		return nil, err
	}
	return next, nil
}

// IssuerRenewalTime is when the generated issuing CA c is replaced: at
// renewAt of its life counted from when it was made. A generated CA's
// NotBefore is backdated (by 10 minutes, so that leaves issued at once can
// be backdated fully), which is not part of its life: counted from
// NotBefore, a CA of a few minutes would be due as soon as it is made.
func IssuerRenewalTime(c *x509.Certificate, renewAt float64) time.Time {
	made := c.NotBefore.Add(caBackdate)
	if !made.Before(c.NotAfter) {
		made = c.NotBefore
	}
	return RenewalTime(made, c.NotAfter, renewAt)
}

// Renewal is what RenewRelayIssuer did.
type Renewal struct {
	// Renewed: a new issuing CA is current; Dropped: previous issuing CAs
	// no longer accepted.
	Renewed bool
	Dropped []*x509.Certificate
	// Current is the current issuing CA afterwards, Generation its number.
	Current    *x509.Certificate
	Generation int
}

// RenewRelayIssuer is one renewal step of the generated relay CA in
// namespace, run by one replica at a time (the Lease holder). Past
// RenewAt of its life (IssuerRenewalTime), it signs a new issuing CA with the root and makes
// it current, keeping the old one in previous.crt; it drops previous
// issuing CAs Keep after the switch or at their NotAfter, whichever is
// first. The signing secret is updated with its resourceVersion as a
// precondition, so a concurrent writer makes it fail and change nothing.
// A relay CA that does not load (see LoadOrCreateRelayCA) is left as it is.
func RenewRelayIssuer(ctx context.Context, client kubernetes.Interface, namespace string, cfg RenewConfig) (Renewal, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return Renewal{}, fmt.Errorf("ca: invalid renew config: %w", err)
	}
	secrets := client.CoreV1().Secrets(namespace)
	root, signing, err := getRelaySecrets(ctx, secrets)
	if err != nil {
		return Renewal{}, err
	}
	if root == nil || signing == nil {
		return Renewal{}, halfPresent(namespace, root, signing)
	}
	now := cfg.CA.Clock()
	st, rc, err := loadRelayCAState(root, signing, now)
	if err != nil {
		return Renewal{}, err
	}
	cur := rc.Issuer
	next := Renewal{Current: cur, Generation: st.generation}
	keepUntil := st.switchedAt.Add(cfg.Keep)
	var kept []*x509.Certificate
	for _, p := range st.previous {
		if now.Before(p.NotAfter) && now.Before(keepUntil) {
			kept = append(kept, p)
		} else {
			next.Dropped = append(next.Dropped, p)
		}
	}
	out := signing.DeepCopy()
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	if !now.Before(IssuerRenewalTime(cur, cfg.RenewAt)) {
		if len(kept) >= maxPreviousIssuers {
			// Dropping one early could strand its agents: wait.
			return Renewal{}, fmt.Errorf("%w: renewal postponed: %d previous issuing CAs are still accepted, at most %d; renew less often (a larger renew-at or issuing CA lifetime)",
				ErrIssuance, len(kept), maxPreviousIssuers)
		}
		fresh, err := NextRelayIssuer(cfg.CA, rc)
		if err != nil {
			return Renewal{}, err
		}
		issuer := fresh.Issuer
		_, s, err := fresh.secrets(namespace)
		if err != nil {
			return Renewal{}, err
		}
		kept = append([]*x509.Certificate{cur}, kept...)
		out.Data = s.Data
		next.Renewed, next.Current, next.Generation = true, issuer, st.generation+1
		out.Annotations[annotationSwitchedAt] = now.UTC().Format(time.RFC3339)
		out.Annotations[annotationGeneration] = strconv.Itoa(next.Generation)
	}
	if !next.Renewed && len(next.Dropped) == 0 {
		return next, nil
	}
	if len(kept) > 0 {
		out.Data[keyPreviousCerts] = CertsPEM(kept...)
	} else {
		delete(out.Data, keyPreviousCerts)
	}
	// What is written must load: checked before the write.
	if _, err := loadIssuerState(root, out, now); err != nil {
		return Renewal{}, err
	}
	if _, err := secrets.Update(ctx, out, metav1.UpdateOptions{}); err != nil {
		return Renewal{}, fmt.Errorf("update secret %s/%s: %w", namespace, SigningSecretName, err)
	}
	return next, nil
}
