package server

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"
)

// ServerIssuer issues the relay server's own certificate, from a
// certificate request so that every relay CA back end can sign it (cfssl
// and step-ca need proof of possession).
type ServerIssuer interface {
	IssueServerRequest(ctx context.Context, csr *x509.CertificateRequest, dnsNames []string, ips []net.IP) (*ca.Issued, error)
}

// ServingCert keeps the relay server's TLS certificate fresh: a new key and
// certificate at start, renewed at about 2/3 of its life. Every replica has
// its own. Store, if set, receives each new certificate (for the
// relay-server-tls-secret); with several replicas only the Lease holder's
// (SetStore's when), so the Secret has one writer, and Publish writes the
// current one when a replica starts leading.
type ServingCert struct {
	issuer   ServerIssuer
	dnsNames []string
	ips      []net.IP
	log      *slog.Logger

	mu    sync.RWMutex
	store func(ctx context.Context, certPEM, keyPEM []byte) error
	when  func() bool // gates store at renewals; nil: always
	cert  *tls.Certificate
	pem   [2][]byte // chain and key of cert, for store
}

// NewServingCert issues the first certificate.
func NewServingCert(ctx context.Context, issuer ServerIssuer, dnsNames []string, ips []net.IP, store func(ctx context.Context, certPEM, keyPEM []byte) error, log *slog.Logger) (*ServingCert, error) {
	if len(dnsNames) == 0 && len(ips) == 0 {
		return nil, errors.New("serving certificate: at least one DNS name or IP is required")
	}
	s := &ServingCert{issuer: issuer, dnsNames: dnsNames, ips: ips, store: store, log: log.With("part", "serving-cert")}
	if err := s.renew(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Certificate returns the current certificate.
func (s *ServingCert) Certificate() (*tls.Certificate, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cert, nil
}

// Run renews the certificate until ctx ends.
func (s *ServingCert) Run(ctx context.Context) {
	for {
		s.mu.RLock()
		leaf := s.cert.Leaf
		s.mu.RUnlock()
		at := identity.RenewalTime(leaf.NotBefore, leaf.NotAfter, 0)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		if err := s.renew(ctx); err != nil {
			s.log.Error("serving certificate renewal failed; retrying in 1m", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Minute):
			}
		}
	}
}

// Renew issues a new certificate now: when the issuing CA changed (a
// relay root rotation switching issuance), so that the served chain
// follows it at once instead of at the next scheduled renewal.
func (s *ServingCert) Renew(ctx context.Context) error { return s.renew(ctx) }

func (s *ServingCert) renew(ctx context.Context) error {
	k, err := keyutil.GenerateKey("EC", "P-256", 0)
	if err != nil {
		return err
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return errors.New("generated key is not a signer")
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return err
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return err
	}
	issued, err := s.issuer.IssueServerRequest(ctx, csr, s.dnsNames, s.ips)
	if err != nil {
		return fmt.Errorf("issue serving certificate: %w", err)
	}
	block, err := pemutil.Serialize(key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(block)
	pair, err := tls.X509KeyPair(issued.ChainPEM(), keyPEM)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cert = &pair
	s.pem = [2][]byte{issued.ChainPEM(), keyPEM}
	s.mu.Unlock()
	s.log.Info("serving certificate issued", "dns_names", s.dnsNames, "ips", fmt.Sprint(s.ips), "not_after", pair.Leaf.NotAfter)
	s.mu.RLock()
	when := s.when
	s.mu.RUnlock()
	if when == nil || when() {
		if err := s.Publish(ctx); err != nil {
			s.log.Warn("could not store serving certificate secret", "error", err)
		}
	}
	return nil
}

// SetStore replaces the store of new certificates, called at renewals
// only while when says so (nil: always).
func (s *ServingCert) SetStore(store func(ctx context.Context, certPEM, keyPEM []byte) error, when func() bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store, s.when = store, when
}

// Publish hands the current certificate to the store (nothing without
// one).
func (s *ServingCert) Publish(ctx context.Context) error {
	s.mu.RLock()
	store, chain, key := s.store, s.pem[0], s.pem[1]
	s.mu.RUnlock()
	if store == nil {
		return nil
	}
	return store(ctx, chain, key)
}
