package identity

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/relaymesh/relaymesh/ca"
)

// RootsSaver is an AgentSecrets that can replace the pinned relay roots
// (relay-root-tls-secret ca.crt): a relay root rotation needs it.
type RootsSaver interface {
	// SaveRoots stores rootsPEM as the roots to pin. It MUST store all of
	// it or nothing.
	SaveRoots(ctx context.Context, rootsPEM []byte) error
}

// ErrBundleRefused marks a trust bundle the agent refused; it changed
// nothing.
var ErrBundleRefused = errors.New("trust bundle refused")

// staleSessionError is a bundle refused because it does not verify the
// server certificate of the session it came over. In a relay root rotation
// that is the last bundle (the new root alone) reaching a session opened
// before the servers switched to the new root: a new session, verified by
// the roots pinned now, may verify it. NeedsNewSession tells the agent so
// (agent.Session asks for it without importing this package).
type staleSessionError struct{ error }

func (e staleSessionError) Unwrap() error { return e.error }

// NeedsNewSession reports that the refused bundle may verify a new session.
func (staleSessionError) NeedsNewSession() bool { return true }

// VerifyTrustBundle checks a trust bundle that came over a session with a
// server whose certificate chain (leaf first, as the TLS handshake saw it)
// is serverChain: it must parse (ca.ParseTrustBundle), carry fingerprint,
// and still verify that server for serverName at now, so a bundle never
// takes away the root the agent reached this server with. It returns the
// roots.
func VerifyTrustBundle(rootsPEM []byte, fingerprint string, serverChain []*x509.Certificate, serverName string, now time.Time) ([]*x509.Certificate, error) {
	roots, err := ca.ParseTrustBundle(rootsPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBundleRefused, err)
	}
	if got := ca.TrustBundleFingerprint(roots); got != fingerprint {
		return nil, fmt.Errorf("%w: its roots do not have the fingerprint it carries", ErrBundleRefused)
	}
	if len(serverChain) == 0 {
		return nil, fmt.Errorf("%w: the session's server certificate is unknown", ErrBundleRefused)
	}
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range serverChain[1:] {
		inter.AddCert(c)
	}
	if _, err := serverChain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: serverName, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, staleSessionError{fmt.Errorf("%w: it does not verify the server this session is with (%w)", ErrBundleRefused, err)}
	}
	return roots, nil
}

// ApplyTrustBundle stores a trust bundle the server sent over the session
// whose server certificate chain is serverChain, after VerifyTrustBundle:
// into relay-root-tls-secret (the AgentSecrets must be a RootsSaver), then
// as the pool new connections pin. On any error nothing changes.
func (m *Manager) ApplyTrustBundle(ctx context.Context, rootsPEM []byte, fingerprint string, serverChain []*x509.Certificate) error {
	roots, err := VerifyTrustBundle(rootsPEM, fingerprint, serverChain, m.cfg.ServerName, m.cfg.Clock())
	if err != nil {
		return err
	}
	saver, ok := m.cfg.Secrets.(RootsSaver)
	if !ok {
		return fmt.Errorf("%w: this agent's secrets cannot store relay roots", ErrBundleRefused)
	}
	// A bundle the agent pins already is not written again: a server may
	// send it at every session.
	if stored, err := m.cfg.Secrets.Roots(ctx); err != nil || !samePinned(stored, fingerprint) {
		if err := saver.SaveRoots(ctx, ca.CertsPEM(roots...)); err != nil {
			return fmt.Errorf("store the relay roots: %w", err)
		}
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	m.mu.Lock()
	m.roots, m.rootsPEM = pool, ca.CertsPEM(roots...)
	m.mu.Unlock()
	m.log.Info("pinning a new relay trust bundle", "fingerprint", fingerprint, "roots", len(roots))
	return nil
}

// samePinned reports whether stored holds exactly the roots of the bundle
// with fingerprint.
func samePinned(stored []byte, fingerprint string) bool {
	roots, err := ca.ParseTrustBundle(stored)
	return err == nil && ca.TrustBundleFingerprint(roots) == fingerprint
}

// PinnedRootsFingerprint is ca.TrustBundleFingerprint of the relay roots
// the manager pins now ("" before it has loaded any), which the agent's
// Hello reports: a server outside a rotation sends its roots to an agent
// that pins others.
func (m *Manager) PinnedRootsFingerprint() string {
	m.mu.RLock()
	pem := m.rootsPEM
	m.mu.RUnlock()
	roots, err := ca.ParseTrustBundle(pem)
	if err != nil || len(roots) == 0 {
		return ""
	}
	return ca.TrustBundleFingerprint(roots)
}
