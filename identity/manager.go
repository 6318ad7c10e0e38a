package identity

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/internal/dialer"
	"github.com/relaymesh/relaymesh/internal/relaytrust"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"
	"go.step.sm/crypto/x509util"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RenewalTime is when to renew a certificate: at 2/3 of its lifetime, moved
// earlier by up to a tenth of the lifetime (jitter in [0,1)) so a fleet of
// agents does not renew in lockstep.
func RenewalTime(notBefore, notAfter time.Time, jitter float64) time.Time {
	life := notAfter.Sub(notBefore)
	if life <= 0 {
		return notBefore
	}
	jitter = min(max(jitter, 0), 1)
	at := notBefore.Add(life * 2 / 3)
	return at.Add(-time.Duration(jitter * float64(life) / 10))
}

// ManagerConfig configures an agent's credential Manager.
type ManagerConfig struct {
	// Cluster is the agent's cluster name.
	Cluster string
	// ServerAddress is the relay server, host:port, or a comma-separated
	// list of the replicas' addresses: each Bootstrap or Renew call dials
	// one replica (see FirstReplica), and after a failed call, or an answer
	// the agent refuses, the next call dials the next replica.
	ServerAddress string
	// ServerName is the name the server's certificate must carry; default
	// the host of ServerAddress; required with several addresses.
	ServerName string
	// Secrets is where credentials live.
	Secrets AgentSecrets
	// Version is reported to the server at bootstrap.
	Version string
	// Logger for operational logs; never given a secret.
	Logger *slog.Logger
	// Clock, default time.Now; Jitter, default math/rand/v2.Float64.
	Clock  func() time.Time
	Jitter func() float64
	// Retry bounds the backoff between failed attempts; default 1s..1m.
	Retry backoff.Policy
	// CallTimeout bounds one Bootstrap or Renew call; default 15s.
	CallTimeout time.Duration
	// FirstReplica is the index of the address the first call dials,
	// given how many there are; default random, so agents spread over the
	// replicas.
	FirstReplica func(n int) int
}

// Status is what the agent's health endpoint reports about its credential.
type Status struct {
	Ready     bool      `json:"ready"`
	Message   string    `json:"message"`
	SPIFFEID  string    `json:"spiffeID,omitempty"`
	Serial    string    `json:"serial,omitempty"`
	NotAfter  time.Time `json:"notAfter,omitzero"`
	RenewAt   time.Time `json:"renewAt,omitzero"`
	Renewals  int       `json:"renewals"`
	LastError string    `json:"lastError,omitempty"`
}

// Manager obtains, stores and renews the agent's client certificate. New
// connections made with ClientTLS use the newest certificate; open ones keep
// the certificate they were made with, so renewal drops no stream.
type Manager struct {
	cfg   ManagerConfig
	addrs []string // the parsed ServerAddress
	// next is the index in addrs of the replica the next call dials; only
	// the Run goroutine uses it.
	next int
	log  *slog.Logger

	mu    sync.RWMutex
	cert  *tls.Certificate
	roots *x509.CertPool
	// rootsPEM are roots as pinned (relay-root-tls-secret): what a stored
	// credential records beside the certificate, never the server's word.
	rootsPEM []byte
	status   Status
	ready    chan struct{}
	readyMu  sync.Once
	// refused is the serial of a certificate the server refused; it is not
	// loaded again from the store.
	refused string
	// pending is a credential issued but not yet stored (the store failed);
	// it is in use and retried until stored.
	pending *storedCredential
	kick    chan struct{}
	// bootstrapKey and bootstrapCSR are kept across Bootstrap attempts
	// until one succeeds: a server that spent the token on an attempt whose
	// answer never arrived gives the certificate to the same key again.
	// Only the Run goroutine uses them.
	bootstrapKey crypto.Signer
	bootstrapCSR []byte
}

type storedCredential struct{ cert, key, roots []byte }

// NewManager validates cfg and returns a Manager; call Run.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	var errs []error
	if err := ValidateClusterName(cfg.Cluster); err != nil {
		errs = append(errs, fmt.Errorf("cluster: %w", err))
	}
	addrs, err := dialer.Parse(cfg.ServerAddress)
	if err != nil {
		errs = append(errs, fmt.Errorf("serverAddress: %w", err))
	} else if cfg.ServerName == "" {
		if cfg.ServerName, err = dialer.ServerName(addrs); err != nil {
			errs = append(errs, fmt.Errorf("serverName: %w", err))
		}
	}
	if cfg.Secrets == nil {
		errs = append(errs, errors.New("secrets: required"))
	}
	next := 0
	if len(addrs) > 0 {
		if cfg.FirstReplica != nil {
			next = cfg.FirstReplica(len(addrs))
		} else {
			next = rand.IntN(len(addrs))
		}
		if next < 0 || next >= len(addrs) {
			errs = append(errs, fmt.Errorf("firstReplica: %d is not one of %d addresses", next, len(addrs)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("credential manager config: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Jitter == nil {
		cfg.Jitter = rand.Float64
	}
	if cfg.Retry.Min == 0 {
		cfg.Retry = backoff.Policy{Min: time.Second, Max: time.Minute}
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 15 * time.Second
	}
	return &Manager{
		cfg:    cfg,
		addrs:  addrs,
		next:   next,
		log:    cfg.Logger.With("component", "agent-credentials", "cluster", cfg.Cluster),
		ready:  make(chan struct{}),
		status: Status{Message: "starting"},
		kick:   make(chan struct{}, 1),
	}, nil
}

// Ready is closed once the agent holds a usable certificate.
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// Status returns the current credential status.
func (m *Manager) Status() Status {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.status
}

// ClientTLS returns a TLS config for mTLS connections to the server: it pins
// the relay roots and presents the newest certificate at every handshake.
func (m *Manager) ClientTLS() (*tls.Config, error) {
	m.mu.RLock()
	roots := m.roots
	m.mu.RUnlock()
	if roots == nil {
		return nil, errors.New("no credential yet")
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    roots,
		ServerName: m.cfg.ServerName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			m.mu.RLock()
			defer m.mu.RUnlock()
			if m.cert == nil {
				return nil, errors.New("no client certificate")
			}
			return m.cert, nil
		},
	}, nil
}

// Run keeps a valid certificate until ctx ends: load, or bootstrap, then
// renew at RenewalTime, retrying with backoff. It never falls back to an
// unauthenticated or unverified connection.
func (m *Manager) Run(ctx context.Context) error {
	attempt := 0
	for {
		err := m.step(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			attempt = 0
			continue
		}
		m.setError(err)
		delay := m.cfg.Retry.Delay(attempt)
		attempt++
		if reason := relaytrust.Reason(m.cfg.Cluster, err); reason != "" {
			m.log.Error("relay trust broken; retrying cannot fix it", "reason", reason, "error", err, "retry_in", delay.Round(time.Millisecond))
		} else {
			m.log.Warn("credential step failed; retrying", "error", err, "retry_in", delay.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// Refused tells the manager the server refused its current certificate
// (its cluster was deregistered or registered again). The manager drops it
// and bootstraps again if a new token is there, or says that it needs one.
func (m *Manager) Refused(err error) {
	m.mu.Lock()
	if m.cert != nil {
		m.refused = fmt.Sprintf("%x", m.cert.Leaf.SerialNumber)
		m.cert = nil
		m.status.Ready = false
		m.status.Message = "the server refused the client certificate: " + err.Error()
		m.log.Warn("server refused the client certificate; will bootstrap again with a new token", "error", err)
	}
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// step does one unit of work: store a pending credential, obtain one if
// there is none, otherwise wait for its renewal time and renew.
func (m *Manager) step(ctx context.Context) error {
	m.mu.RLock()
	cert, pending := m.cert, m.pending
	m.mu.RUnlock()
	if pending != nil {
		if err := m.cfg.Secrets.SaveCredential(ctx, pending.cert, pending.key, pending.roots); err != nil {
			return fmt.Errorf("store client certificate (in use, not yet stored): %w", err)
		}
		m.mu.Lock()
		m.pending = nil
		m.mu.Unlock()
	}
	now := m.cfg.Clock()
	if cert == nil || !now.Before(cert.Leaf.NotAfter) {
		if cert != nil {
			m.log.Warn("client certificate expired; bootstrapping again", "not_after", cert.Leaf.NotAfter)
			m.mu.Lock()
			m.cert = nil
			m.status.Ready = false
			m.mu.Unlock()
		}
		return m.obtain(ctx)
	}
	renewAt := m.Status().RenewAt
	if wait := renewAt.Sub(now); wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.kick:
			return nil // Refused: the next step obtains a new certificate
		case <-time.After(wait):
		}
	}
	return m.renew(ctx)
}

// obtain loads the stored credential if it is valid, else bootstraps.
func (m *Manager) obtain(ctx context.Context) error {
	rootsPEM, err := m.cfg.Secrets.Roots(ctx)
	if err != nil {
		return fmt.Errorf("cannot verify the relay server: %w", err)
	}
	roots, err := parseRoots(rootsPEM)
	if err != nil {
		return fmt.Errorf("relay root CA: %w", err)
	}
	m.mu.Lock()
	m.roots, m.rootsPEM = roots, rootsPEM
	m.mu.Unlock()

	certPEM, keyPEM, err := m.cfg.Secrets.LoadCredential(ctx)
	switch {
	case err == nil:
		cert, verr := m.verify(certPEM, keyPEM, roots)
		m.mu.RLock()
		refused := m.refused
		m.mu.RUnlock()
		if verr == nil && fmt.Sprintf("%x", cert.Leaf.SerialNumber) == refused {
			verr = errors.New("the server refused it")
		}
		if verr == nil {
			m.install(cert, "loaded stored client certificate", false)
			return nil
		}
		m.log.Warn("stored client certificate is not usable; bootstrapping", "reason", verr)
	case errors.Is(err, ErrNoCredential):
	default:
		return fmt.Errorf("read stored client certificate: %w", err)
	}
	return m.bootstrap(ctx, roots, rootsPEM)
}

// bootstrap trades the bootstrap token and a fresh CSR for a certificate
// over server-authenticated TLS.
func (m *Manager) bootstrap(ctx context.Context, roots *x509.CertPool, rootsPEM []byte) error {
	token, err := m.cfg.Secrets.Token(ctx)
	if err != nil {
		if errors.Is(err, ErrNoToken) {
			return fmt.Errorf("no valid client certificate and %w; if the cluster was deregistered, re-register the cluster (relaymesh cluster register), else write a new token and the current relay roots with `%s`", err, relaytrust.RebootstrapCommand(m.cfg.Cluster))
		}
		return err
	}
	if m.bootstrapKey == nil {
		if m.bootstrapKey, m.bootstrapCSR, err = newKeyAndCSR(); err != nil {
			return err
		}
	}
	key, csr := m.bootstrapKey, m.bootstrapCSR
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: m.cfg.ServerName}
	resp, err := m.call(ctx, tlsCfg, func(ctx context.Context, c relaypb.IdentityClient) (*relaypb.CertificateResponse, error) {
		return c.Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: m.cfg.Cluster, Token: token, Csr: csr, AgentVersion: m.cfg.Version})
	})
	if err != nil {
		if status.Code(err) == codes.PermissionDenied {
			return fmt.Errorf("bootstrap token rejected by the server (unknown, already used, expired, or for another cluster; or the cluster is not registered): %w", err)
		}
		return fmt.Errorf("bootstrap: %w", err)
	}
	cert, err := m.accept(ctx, resp, key, roots, rootsPEM)
	if err != nil {
		m.moveOn()
		return err
	}
	m.bootstrapKey, m.bootstrapCSR = nil, nil
	if err := m.cfg.Secrets.DeleteToken(ctx); err != nil {
		m.log.Warn("could not delete the used bootstrap token", "error", err)
	}
	m.install(cert, "bootstrapped", false)
	return nil
}

// renew trades a fresh CSR for a new certificate over mTLS.
func (m *Manager) renew(ctx context.Context) error {
	tlsCfg, err := m.ClientTLS()
	if err != nil {
		return err
	}
	key, csr, err := newKeyAndCSR()
	if err != nil {
		return err
	}
	resp, err := m.call(ctx, tlsCfg, func(ctx context.Context, c relaypb.IdentityClient) (*relaypb.CertificateResponse, error) {
		return c.Renew(ctx, &relaypb.RenewRequest{Csr: csr})
	})
	if err != nil {
		if c := status.Code(err); c == codes.PermissionDenied || c == codes.Unauthenticated {
			m.Refused(err)
			return fmt.Errorf("renewal refused by the server (cluster deregistered or registered again): %w", err)
		}
		return fmt.Errorf("renew: %w", err)
	}
	m.mu.RLock()
	roots, rootsPEM := m.roots, m.rootsPEM
	m.mu.RUnlock()
	// The answer's trust_bundle is not stored: roots change only through
	// a bundle verified against the session's server (ApplyTrustBundle).
	cert, err := m.accept(ctx, resp, key, roots, rootsPEM)
	if err != nil {
		m.moveOn()
		return err
	}
	m.install(cert, "renewed", true)
	return nil
}

// call makes one Bootstrap or Renew call to one replica, m.addrs[m.next]
// (one replica per dial: see package dialer); when it fails, the next call
// goes to the next replica. A replica that refuses or stays silent fails
// the call within dialer.ConnectTimeout.
func (m *Manager) call(ctx context.Context, tlsCfg *tls.Config, f func(context.Context, relaypb.IdentityClient) (*relaypb.CertificateResponse, error)) (*relaypb.CertificateResponse, error) {
	conn, err := dialer.Dial(m.addrs[m.next], tlsCfg)
	if err != nil {
		m.moveOn()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
	defer cancel()
	resp, err := f(ctx, relaypb.NewIdentityClient(conn))
	if err != nil {
		m.moveOn()
	}
	return resp, err
}

// moveOn points the next call at the next replica: the last one failed
// the call or answered with what the agent refused (a replica that lags a
// root rotation), and trying it again first would only fail again.
func (m *Manager) moveOn() { m.next = (m.next + 1) % len(m.addrs) }

// accept checks the server's answer against the key we hold and the roots
// we pin, then stores it with those roots (rootsPEM).
func (m *Manager) accept(ctx context.Context, resp *relaypb.CertificateResponse, key crypto.Signer, roots *x509.CertPool, rootsPEM []byte) (*tls.Certificate, error) {
	keyBlock, err := pemutil.Serialize(key)
	if err != nil {
		return nil, err
	}
	keyPEM := pem.EncodeToMemory(keyBlock)
	cert, err := m.verify(resp.GetCertificateChain(), keyPEM, roots)
	if err != nil {
		return nil, fmt.Errorf("server answered with an unusable certificate: %w", err)
	}
	if err := m.cfg.Secrets.SaveCredential(ctx, resp.GetCertificateChain(), keyPEM, rootsPEM); err != nil {
		// The certificate is good and its token is spent: use it now and
		// keep trying to store it rather than lose it.
		m.log.Error("could not store the client certificate; using it and retrying", "error", err)
		m.mu.Lock()
		m.pending = &storedCredential{cert: resp.GetCertificateChain(), key: keyPEM, roots: rootsPEM}
		m.mu.Unlock()
	}
	return cert, nil
}

// verify parses a credential and checks that it is a current client
// certificate for this cluster that chains to the pinned roots.
func (m *Manager) verify(certPEM, keyPEM []byte, roots *x509.CertPool) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate and key do not form a pair: %w", err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		return nil, errors.New("no leaf certificate")
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: m.cfg.Clock(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("does not chain to the pinned relay root: %w", err)
	}
	if len(leaf.URIs) != 1 {
		return nil, errors.New("certificate does not carry exactly one SPIFFE ID")
	}
	id, err := spiffeid.FromURI(leaf.URIs[0])
	if err != nil {
		return nil, err
	}
	if got, err := ClusterFromID(id.TrustDomain(), id); err != nil || got != m.cfg.Cluster {
		return nil, fmt.Errorf("certificate names %s, not this cluster's agent", id)
	}
	return &pair, nil
}

func (m *Manager) install(cert *tls.Certificate, how string, renewal bool) {
	leaf := cert.Leaf
	renewAt := RenewalTime(leaf.NotBefore, leaf.NotAfter, m.cfg.Jitter())
	m.mu.Lock()
	m.cert = cert
	m.status.Ready = true
	m.status.Message = "client certificate " + how
	m.status.SPIFFEID = leaf.URIs[0].String()
	m.status.Serial = fmt.Sprintf("%x", leaf.SerialNumber)
	m.status.NotAfter = leaf.NotAfter
	m.status.RenewAt = renewAt
	m.status.LastError = ""
	if renewal {
		m.status.Renewals++
	}
	m.mu.Unlock()
	m.readyMu.Do(func() { close(m.ready) })
	m.log.Info("client certificate "+how, "spiffe_id", leaf.URIs[0].String(), "serial", fmt.Sprintf("%x", leaf.SerialNumber), "not_after", leaf.NotAfter, "renew_at", renewAt)
}

// setError records why the last step failed; a broken relay trust
// (relaytrust.Reason) leads with its reason and recovery.
func (m *Manager) setError(err error) {
	msg := err.Error()
	if reason := relaytrust.Reason(m.cfg.Cluster, err); reason != "" {
		msg = reason + " (" + msg + ")"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.status.LastError = msg
	if m.cert == nil {
		m.status.Ready = false
		m.status.Message = "no usable client certificate: " + msg
	}
}

// newKeyAndCSR makes a fresh P-256 key and a CSR that names nothing: the
// server decides the identity.
func newKeyAndCSR() (crypto.Signer, []byte, error) {
	k, err := keyutil.GenerateKey("EC", "P-256", 0)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("generated key is not a signer")
	}
	csr, err := x509util.CreateCertificateRequest("", nil, signer)
	if err != nil {
		return nil, nil, fmt.Errorf("create CSR: %w", err)
	}
	return signer, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr.Raw}), nil
}

func parseRoots(b []byte) (*x509.CertPool, error) {
	certs, err := pemutil.ParseCertificateBundle(bytes.TrimSpace(b))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		if !c.IsCA {
			return nil, fmt.Errorf("root %q is not a CA", c.Subject.CommonName)
		}
		pool.AddCert(c)
	}
	return pool, nil
}
