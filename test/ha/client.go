package ha

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
)

// Client is one gRPC connection to a replica's relay port, the way an agent
// makes it: TLS 1.3, the server verified against the relay roots under
// ServerName, from a chosen source address of the root namespace. The
// connection is open (handshaken) when Dial returns, so a call made later
// starts at once: two clients can present a token at the same instant.
type Client struct {
	conn *grpc.ClientConn
}

// ClientConfig says how to reach a replica.
type ClientConfig struct {
	// Addr is the replica's relay host:port. Required.
	Addr string
	// ServerName the server certificate must carry; default the host of Addr.
	ServerName string
	// Roots are the relay roots (PEM). Required.
	Roots []byte
	// Source is the local address to dial from; zero: the kernel's choice.
	Source netip.Addr
	// Certificate is a client certificate chain and key (PEM), for mTLS
	// calls (Renew); empty for Bootstrap.
	CertPEM, KeyPEM []byte
}

// Dial connects and waits until the connection is ready.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(cfg.Roots) {
		return nil, errors.New("ha client: no relay root in the PEM")
	}
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("ha client: %w", err)
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: cfg.ServerName}
	if tlsCfg.ServerName == "" {
		tlsCfg.ServerName = host
	}
	if len(cfg.CertPEM) > 0 {
		pair, err := tls.X509KeyPair(cfg.CertPEM, cfg.KeyPEM)
		if err != nil {
			return nil, fmt.Errorf("ha client: client certificate: %w", err)
		}
		tlsCfg.Certificates = []tls.Certificate{pair}
	}
	dialer := &net.Dialer{}
	if cfg.Source.IsValid() {
		dialer.LocalAddr = &net.TCPAddr{IP: cfg.Source.AsSlice()}
	}
	conn, err := grpc.NewClient("passthrough:///"+cfg.Addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		return nil, err
	}
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return &Client{conn: conn}, nil
		}
		if s == connectivity.TransientFailure {
			conn.Close()
			return nil, fmt.Errorf("ha client: connection to %s failed", cfg.Addr)
		}
		if !conn.WaitForStateChange(ctx, s) {
			conn.Close()
			return nil, fmt.Errorf("ha client: connection to %s not ready: %w", cfg.Addr, ctx.Err())
		}
	}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Bootstrap presents token for cluster with a CSR for a fresh key.
func (c *Client) Bootstrap(ctx context.Context, cluster, token string) (*relaypb.CertificateResponse, error) {
	csr, err := NewCSR()
	if err != nil {
		return nil, err
	}
	return c.BootstrapCSR(ctx, cluster, token, csr)
}

// BootstrapCSR presents token for cluster with the PEM CSR given (the same
// key again: a retry).
func (c *Client) BootstrapCSR(ctx context.Context, cluster, token string, csr []byte) (*relaypb.CertificateResponse, error) {
	return relaypb.NewIdentityClient(c.conn).Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: cluster, Token: token, Csr: csr, AgentVersion: "test/ha"})
}

// Renew asks for a certificate for a fresh key over mTLS.
func (c *Client) Renew(ctx context.Context) (*relaypb.CertificateResponse, error) {
	csr, err := NewCSR()
	if err != nil {
		return nil, err
	}
	return relaypb.NewIdentityClient(c.conn).Renew(ctx, &relaypb.RenewRequest{Csr: csr})
}

// NewCSR returns a PEM certificate request for a fresh ECDSA P-256 key
// (the key is dropped: the tests need the certificate, not to use it).
func NewCSR() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// Leaf parses the first certificate of a PEM chain.
func Leaf(chainPEM []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(chainPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no certificate in the chain")
	}
	return x509.ParseCertificate(block.Bytes)
}
