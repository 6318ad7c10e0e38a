package dialer_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/dialer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestParse(t *testing.T) {
	got, err := dialer.Parse("10.0.0.1:9900, relay.example.com:443,[fd00::1]:9900")
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.1:9900", "relay.example.com:443", "[fd00::1]:9900"}, got)
	for _, bad := range []string{"", ",", "host", "host:", ":9900", "a:1,a:1", "a:0", "a:65536", "a:http", "a:1,,b:2",
		strings.Repeat("a:1,", 20000), strings.Repeat("x", 17<<10)} {
		_, err := dialer.Parse(bad)
		assert.Error(t, err, "%.40q", bad)
	}
	var many []string
	for i := range dialer.MaxAddresses + 1 {
		many = append(many, net.JoinHostPort("10.0.0.1", strconv.Itoa(1000+i)))
	}
	_, err = dialer.Parse(strings.Join(many, ","))
	assert.ErrorContains(t, err, "at most")
	_, err = dialer.Parse(strings.Join(many[:dialer.MaxAddresses], ","))
	assert.NoError(t, err)
}

func TestServerName(t *testing.T) {
	n, err := dialer.ServerName([]string{"relay.example.com:443"})
	require.NoError(t, err)
	assert.Equal(t, "relay.example.com", n)
	_, err = dialer.ServerName([]string{"a:1", "b:2"})
	assert.ErrorContains(t, err, "--server-name")
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"a:1", "a:1,b:2", "[::1]:1", ",", "a:1,a:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := dialer.Parse(s)
		if err != nil {
			return
		}
		if len(got) == 0 || len(got) > dialer.MaxAddresses {
			t.Fatalf("accepted %d addresses", len(got))
		}
		seen := map[string]bool{}
		for _, a := range got {
			host, _, err := net.SplitHostPort(a)
			if err != nil || host == "" || seen[a] {
				t.Fatalf("accepted %q", a)
			}
			seen[a] = true
		}
	})
}

// serverTLS is a certificate for relay.test signed by a CA of its own.
func serverTLS(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "relay.test"}, DNSNames: []string{"relay.test"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS13}, pool
}

// A server that serves answers; one that is down (refuses) and one that
// accepts and never answers the handshake (a hung replica, packets
// swallowed behind a proxy) fail a call within the connect timeout, so the
// caller moves to the next replica; a certificate for another name is
// refused.
func TestOneAttemptEndsWithinTheConnectTimeout(t *testing.T) {
	cfg, pool := serverTLS(t)
	serving, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(serving) }()
	t.Cleanup(srv.Stop)

	down, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	downAddr := down.Addr().String()
	require.NoError(t, down.Close())

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()

	check := func(addr, name string) (time.Duration, error) {
		conn, err := dialer.Dial(addr, &tls.Config{ServerName: name, RootCAs: pool, MinVersion: tls.VersionTLS13})
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*dialer.ConnectTimeout)
		defer cancel()
		start := time.Now()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			assert.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
		}
		return time.Since(start), err
	}
	_, err = check(serving.Addr().String(), "relay.test")
	require.NoError(t, err)
	took, err := check(downAddr, "relay.test")
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Less(t, took, dialer.ConnectTimeout, "a refusal is not waited out")
	took, err = check(silent.Addr().String(), "relay.test")
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.GreaterOrEqual(t, took, dialer.ConnectTimeout-100*time.Millisecond, "a silent server gets the connect timeout")
	assert.Less(t, took, 2*dialer.ConnectTimeout, "and no more")
	_, err = check(serving.Addr().String(), "other.test")
	assert.Error(t, err, "a certificate for another name")

	_, err = dialer.Dial("", &tls.Config{})
	assert.Error(t, err)
}
