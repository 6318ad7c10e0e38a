package fleet

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/relaymesh/relaymesh/ca"
)

// HandshakeLimit is what this machine's own TLS handshakes and signing
// allow a bootstrap storm: the rate at which one process, as server and
// agents at once over loopback, does an agent's cryptographic work and
// nothing else — the agent's P-256 key and CSR; a TLS 1.3 handshake that
// authenticates the server; the CSR's proof of possession checked and a
// certificate signed with a P-256 issuer; then the mutual TLS handshake
// of the agent's first session with that certificate. No gRPC, no
// apiserver, no token, no audit, and a bare x509.CreateCertificate
// where the server builds its template and checks what it signed: a
// storm's rate as a fraction of this is how close the server comes to the
// crypto the storm cannot avoid.
type HandshakeLimit struct {
	Agents, Concurrency int
	Wall                time.Duration
	// PerSecond is Agents / Wall; CPUPerAgent the process's CPU time
	// (user + system) over the run per agent: the agent's side and the
	// server's together, as a storm's CPU with its agents counted.
	PerSecond   float64
	CPUPerAgent time.Duration
}

// maxLimitFrame bounds what the limit's server and agents read (a CSR, a
// certificate).
const maxLimitFrame = 4 << 10

// Each connection to the limit's server first says what it is.
const (
	limitBootstrap = 'b'
	limitSession   = 's'
)

// MeasureHandshakeLimit runs agents agents' cryptographic work, concurrency
// at a time, in this process (HandshakeLimit). Every certificate is
// checked: an agent whose certificate does not carry its key, or whose
// mutual handshake the server does not accept, fails the measurement.
func MeasureHandshakeLimit(ctx context.Context, agents, concurrency int) (HandshakeLimit, error) {
	if agents < 1 || concurrency < 1 {
		return HandshakeLimit{}, errors.New("handshake limit: agents and concurrency must be at least 1")
	}
	srv, err := startLimitServer()
	if err != nil {
		return HandshakeLimit{}, err
	}
	var next atomic.Int64
	errs := make(chan error, concurrency)
	before, err := selfCPU()
	if err != nil {
		srv.stop()
		return HandshakeLimit{}, err
	}
	start := time.Now()
	var workers sync.WaitGroup
	for range concurrency {
		workers.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(agents) || ctx.Err() != nil {
					return
				}
				if err := limitAgent(ctx, SourceAddr(int(i)), srv.addr, srv.roots, srv.rc.Issuer); err != nil {
					errs <- fmt.Errorf("agent %d: %w", i, err)
					next.Store(int64(agents))
					return
				}
			}
		})
	}
	workers.Wait()
	wall := time.Since(start)
	after, cpuErr := selfCPU()
	serverErr := srv.stop()
	close(errs)
	if err := <-errs; err != nil {
		return HandshakeLimit{}, err
	}
	if serverErr != nil {
		return HandshakeLimit{}, fmt.Errorf("handshake limit: server: %w", serverErr)
	}
	if err := errors.Join(ctx.Err(), cpuErr); err != nil {
		return HandshakeLimit{}, err
	}
	return HandshakeLimit{Agents: agents, Concurrency: concurrency, Wall: wall, PerSecond: float64(agents) / wall.Seconds(),
		CPUPerAgent: (after - before) / time.Duration(agents)}, nil
}

// limitServer is the server side of the handshake limit, on a loopback
// port, with a relay CA of its own.
type limitServer struct {
	addr  string
	rc    *ca.RelayCA
	roots *x509.CertPool
	lis   net.Listener
	// accepting is closed when the accept loop returned; conns counts
	// the connections being served; failed holds the first error of one.
	accepting chan struct{}
	conns     sync.WaitGroup
	failed    atomic.Pointer[error]
}

func startLimitServer() (*limitServer, error) {
	rc, err := ca.GenerateRelayCA(ca.GenerateConfig{Org: "fleet handshake limit"})
	if err != nil {
		return nil, err
	}
	serving, err := limitServingCert(rc)
	if err != nil {
		return nil, err
	}
	s := &limitServer{rc: rc, roots: x509.NewCertPool(), accepting: make(chan struct{})}
	s.roots.AddCert(rc.Root)
	if s.lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	s.addr = s.lis.Addr().String()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{serving}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: s.roots}
	go func() {
		defer close(s.accepting)
		for {
			c, err := s.lis.Accept()
			if err != nil {
				return
			}
			s.conns.Go(func() {
				if err := serveLimit(tls.Server(c, cfg), rc); err != nil {
					s.failed.CompareAndSwap(nil, &err)
				}
			})
		}
	}()
	return s, nil
}

// stop closes the listener, waits for the connections being served and
// returns the first error of one.
func (s *limitServer) stop() error {
	s.lis.Close()
	<-s.accepting // no connection is added to conns after this
	s.conns.Wait()
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// limitServingCert is a serving certificate for 127.0.0.1 from rc's
// issuer, as the relay server's.
func limitServingCert(rc *ca.RelayCA) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleet handshake limit"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, rc.Issuer, &key.PublicKey, rc.IssuerKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, rc.Issuer.Raw}, PrivateKey: key}, nil
}

// serveLimit answers one connection, which says first what it is: a
// session, whose client certificate the handshake verified against the
// root, is answered "ok"; a bootstrap sends a length-prefixed CSR and gets
// its certificate.
func serveLimit(c *tls.Conn, rc *ca.RelayCA) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := c.Handshake(); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	intent := make([]byte, 1)
	if _, err := io.ReadFull(c, intent); err != nil {
		return fmt.Errorf("read what the connection is: %w", err)
	}
	switch intent[0] {
	case limitSession:
		if len(c.ConnectionState().PeerCertificates) == 0 {
			return errors.New("a session without a client certificate")
		}
		_, err := c.Write([]byte("ok"))
		return err
	case limitBootstrap:
	default:
		return fmt.Errorf("unknown connection kind %q", intent[0])
	}
	der, err := readFrame(c)
	if err != nil {
		return fmt.Errorf("read CSR: %w", err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return fmt.Errorf("parse CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return fmt.Errorf("CSR proof of possession: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return err
	}
	now := time.Now()
	id := &url.URL{Scheme: "spiffe", Host: "fleet.limit", Path: "/cluster/limit/agent"}
	tmpl := &x509.Certificate{SerialNumber: serial, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), URIs: []*url.URL{id},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	cert, err := x509.CreateCertificate(rand.Reader, tmpl, rc.Issuer, csr.PublicKey, rc.IssuerKey)
	if err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	return writeFrame(c, cert)
}

// limitAgent is one agent's work, from source: key and CSR, a bootstrap
// over server-authenticated TLS, then a session's mutual TLS handshake.
func limitAgent(ctx context.Context, source netip.Addr, addr string, roots *x509.CertPool, issuer *x509.Certificate) error {
	key, csrPEM, err := NewCSR()
	if err != nil {
		return err
	}
	block, _ := pem.Decode(csrPEM)
	if block == nil {
		return errors.New("CSR: no PEM block")
	}
	// Each agent from its own address, as the storm's: 20,000 loopback
	// connections from one address would run short of ephemeral ports.
	d := tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: source.AsSlice()}},
		Config: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "localhost"}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte{limitBootstrap}); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if err := writeFrame(c, block.Bytes); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	der, err := readFrame(c)
	if err != nil {
		return fmt.Errorf("read certificate: %w", err)
	}
	c.Close()
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		return errors.New("the certificate does not carry the agent's key")
	}
	d.Config = &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "localhost",
		Certificates: []tls.Certificate{{Certificate: [][]byte{der, issuer.Raw}, PrivateKey: key, Leaf: leaf}}}
	s, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := s.Write([]byte{limitSession}); err != nil {
		return fmt.Errorf("session: %w", err)
	}
	answer := make([]byte, 2)
	if _, err := io.ReadFull(s, answer); err != nil {
		return fmt.Errorf("session: the server did not accept the certificate: %w", err)
	}
	if !bytes.Equal(answer, []byte("ok")) {
		return fmt.Errorf("session: the server answered %q", answer)
	}
	return nil
}

func writeFrame(w io.Writer, b []byte) error {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	_, err := w.Write(append(n[:], b...))
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size == 0 || size > maxLimitFrame {
		return nil, fmt.Errorf("frame of %d bytes (at most %d)", size, maxLimitFrame)
	}
	b := make([]byte, size)
	_, err := io.ReadFull(r, b)
	return b, err
}

// selfCPU is this process's CPU time so far, user and system, from
// getrusage: finer than ReadProc's clock ticks (10 ms), which a run of a
// few hundred milliseconds would round away.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
