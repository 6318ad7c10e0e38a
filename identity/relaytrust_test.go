package identity_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/relaymesh/relaymesh/internal/backoff"
	"github.com/relaymesh/relaymesh/internal/relaytrust"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	serverReason = "the relay server's certificate does not chain to the pinned relay root; the relay root was probably rotated while this agent was offline: run `relaymesh cluster re-bootstrap cluster-1`"
	clientReason = "the relay server refused this agent's certificate as from an issuer it does not trust (expired, or under a relay root that was rotated while this agent was offline): run `relaymesh cluster re-bootstrap cluster-1`"
)

// leaf is a certificate for localhost (server) or a client, issued by ca.
func leaf(t *testing.T, issuer *catest.CA, eku x509.ExtKeyUsage, notAfter time.Time) tls.Certificate {
	t.Helper()
	key := catest.NewKey(t, catest.ECDSAP256)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "leaf"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer.Cert, key.Public(), issuer.Key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func rootPool(c *catest.CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.Cert)
	return p
}

// handshake runs a real TLS 1.3 connection and returns the client's error:
// from its handshake, or from its first read (in TLS 1.3 the server's
// verdict on the client certificate arrives after the client's handshake).
func handshake(t *testing.T, serverCfg, clientCfg *tls.Config) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverCfg)
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if err := c.(*tls.Conn).Handshake(); err == nil {
			_, _ = c.Write([]byte("ok"))
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), clientCfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(c, make([]byte, 2))
	return err
}

// TestRelayTrustReasonFromRealHandshakes: the reason comes from the errors
// crypto/tls really returns — the agent's own verification of a server
// under a root it does not pin, and the server's alert for a client
// certificate under a root it does not hold or expired — and from nothing
// else.
func TestRelayTrustReasonFromRealHandshakes(t *testing.T) {
	pinned := catest.NewRoot(t, catest.CAOptions{Name: "pinned relay root"})
	rotated := catest.NewRoot(t, catest.CAOptions{Name: "new relay root"})
	later := time.Now().Add(time.Hour)
	serverUnder := func(root *catest.CA) *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{leaf(t, root, x509.ExtKeyUsageServerAuth, later)},
			ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: rootPool(root)}
	}
	client := func(pins *catest.CA, cert *tls.Certificate) *tls.Config {
		c := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: rootPool(pins), ServerName: "localhost"}
		if cert != nil {
			// As the agent does (Manager.ClientTLS): its one certificate,
			// whatever CAs the server says it accepts.
			c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		return c
	}
	underPinned := leaf(t, pinned, x509.ExtKeyUsageClientAuth, later)
	underRotated := leaf(t, rotated, x509.ExtKeyUsageClientAuth, later)
	expired := leaf(t, rotated, x509.ExtKeyUsageClientAuth, time.Now().Add(-time.Hour))
	for _, tc := range []struct {
		name           string
		server, client *tls.Config
		want           string
	}{
		{"server under a root the agent does not pin", serverUnder(rotated), client(pinned, nil), serverReason},
		{"server under a root the agent does not pin, with a client certificate", serverUnder(rotated), client(pinned, &underPinned), serverReason},
		{"client certificate under a root the server no longer holds", serverUnder(rotated), client(rotated, &underPinned), clientReason},
		{"expired client certificate", serverUnder(rotated), client(rotated, &expired), clientReason},
		{"everything trusted", serverUnder(rotated), client(rotated, &underRotated), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := handshake(t, tc.server, tc.client)
			if tc.want == "" {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
			assert.Equal(t, tc.want, relaytrust.Reason("cluster-1", err), "%v", err)
		})
	}
}

// TestRelayTrustReasonOnlyForBrokenTrust: gRPC keeps a transport error's
// text only; that text is recognized, and no other failure (a refused
// token, a deregistered cluster, a server down, a timeout) reads as broken
// relay trust.
func TestRelayTrustReasonOnlyForBrokenTrust(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"gRPC: server not under the pinned root", status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`), serverReason},
		{"gRPC wrapped by the manager", fmt.Errorf("bootstrap: %w", status.Error(codes.Unavailable, "x509: certificate signed by unknown authority (possibly because of \"x509: ECDSA verification failure\")")), serverReason},
		{"gRPC: client certificate refused, unknown CA", status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: remote error: tls: unknown certificate authority"`), clientReason},
		{"gRPC: client certificate refused, expired", status.Error(codes.Unavailable, "remote error: tls: expired certificate"), clientReason},
		{"typed", x509.UnknownAuthorityError{}, serverReason},
		{"nil", nil, ""},
		{"token refused", status.Error(codes.PermissionDenied, "bootstrap token rejected"), ""},
		{"deregistered", status.Error(codes.Unauthenticated, "cluster not registered"), ""},
		{"server down", status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:9900: connect: connection refused\""), ""},
		{"timeout", context.DeadlineExceeded, ""},
		{"server certificate for another name", errors.New("tls: failed to verify certificate: x509: certificate is valid for other.example, not relay.example.com"), ""},
		{"other remote alert", errors.New("remote error: tls: handshake failure"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, relaytrust.Reason("cluster-1", tc.err))
		})
	}
}

// TestAgentReportsBrokenRelayTrust: a credential manager and a relay
// session against a real in-process server whose relay root is not the
// one the agent pins (as after a root rotation the agent slept through)
// say why in their status, with the recovery.
func TestAgentReportsBrokenRelayTrust(t *testing.T) {
	srv := servertest.New(t, servertest.Options{})
	foreign := catest.NewRoot(t, catest.CAOptions{Name: "the relay root before the rotation"})

	t.Run("bootstrap", func(t *testing.T) {
		secrets := identitytest.NewMemAgentSecrets(foreign.RootsPEM(), srv.Mint("cluster-1", time.Hour))
		m, _ := startManager(t, srv, secrets, "cluster-1")
		waitFor(t, 10*time.Second, "the reason in the credential status", func() bool {
			st := m.Status()
			return !st.Ready && len(st.LastError) > len(serverReason) && st.LastError[:len(serverReason)] == serverReason &&
				st.Message == "no usable client certificate: "+st.LastError
		})
		assert.True(t, secrets.HasToken(), "a server the agent cannot verify never sees the token")
	})

	// Offline past its certificate's life, the agent has no certificate and
	// its token was spent: it names the recovery of both cases.
	t.Run("expired and no token", func(t *testing.T) {
		m, _ := startManager(t, srv, identitytest.NewMemAgentSecrets(srv.RootsPEM, ""), "cluster-1")
		waitFor(t, 10*time.Second, "an error in the credential status", func() bool { return m.Status().LastError != "" })
		st := m.Status()
		assert.Contains(t, st.Message, "no bootstrap token")
		assert.Contains(t, st.Message, "re-register the cluster (relaymesh cluster register)")
		assert.Contains(t, st.Message, "`relaymesh cluster re-bootstrap cluster-1`")
	})

	t.Run("session", func(t *testing.T) {
		s, err := agent.NewSession(agent.SessionConfig{ServerAddress: srv.Addr, Cluster: "cluster-1",
			TLS: func() (*tls.Config, error) {
				return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: rootPool(foreign), ServerName: "localhost"}, nil
			},
			Retry: backoff.Policy{Min: 50 * time.Millisecond, Max: 100 * time.Millisecond}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = s.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		waitFor(t, 10*time.Second, "the reason in the session state", func() bool {
			st := s.State()
			return !st.Connected && st.RelayTrust == serverReason && len(st.LastError) > len(serverReason) && st.LastError[:len(serverReason)] == serverReason
		})
	})

	t.Run("session with a certificate under another root", func(t *testing.T) {
		cert := leaf(t, foreign, x509.ExtKeyUsageClientAuth, time.Now().Add(time.Hour))
		s, err := agent.NewSession(agent.SessionConfig{ServerAddress: srv.Addr, Cluster: "cluster-1",
			TLS: func() (*tls.Config, error) {
				return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: srv.Roots, ServerName: "localhost",
					GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}, nil
			},
			Retry: backoff.Policy{Min: 50 * time.Millisecond, Max: 100 * time.Millisecond}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = s.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		waitFor(t, 10*time.Second, "the reason in the session state", func() bool {
			st := s.State()
			return !st.Connected && st.RelayTrust == clientReason && len(st.LastError) > len(clientReason) && st.LastError[:len(clientReason)] == clientReason
		})
	})
}
