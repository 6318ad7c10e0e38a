package fleet

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The limit's server does the checks it is measured for: a session's
// certificate must chain to its root, a session must present one, and a
// bootstrap's CSR must be signed by the key it names. Each refusal fails
// the measurement (stop reports it), so a limit is never measured on work
// that was skipped.
func TestTheLimitServerRefusesWhatTheRelayServerRefuses(t *testing.T) {
	dial := func(t *testing.T, s *limitServer, cert *tls.Certificate) *tls.Conn {
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: s.roots, ServerName: "localhost"}
		if cert != nil {
			// Sent whatever CAs the server names (Go's client would keep
			// back a certificate of another CA): the server's verification
			// is what is tested.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		c, err := tls.Dial("tcp", s.addr, cfg)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		return c
	}
	refused := func(t *testing.T, s *limitServer, c *tls.Conn, want string) {
		got, _ := io.ReadAll(c) // the server ends the connection without an answer
		c.Close()
		assert.NotEqual(t, "ok", string(got))
		err := s.stop()
		require.Error(t, err)
		assert.Contains(t, err.Error(), want)
	}

	t.Run("a certificate from another CA", func(t *testing.T) {
		s, err := startLimitServer()
		require.NoError(t, err)
		other, err := ca.GenerateRelayCA(ca.GenerateConfig{Org: "another"})
		require.NoError(t, err)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			URIs: []*url.URL{{Scheme: "spiffe", Host: "fleet.limit", Path: "/cluster/limit/agent"}}, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, other.Issuer, &key.PublicKey, other.IssuerKey)
		require.NoError(t, err)
		c := dial(t, s, &tls.Certificate{Certificate: [][]byte{der, other.Issuer.Raw}, PrivateKey: key})
		_, _ = c.Write([]byte{limitSession})
		refused(t, s, c, "handshake")
	})
	t.Run("a session without a certificate", func(t *testing.T) {
		s, err := startLimitServer()
		require.NoError(t, err)
		c := dial(t, s, nil)
		_, err = c.Write([]byte{limitSession})
		require.NoError(t, err)
		refused(t, s, c, "a session without a client certificate")
	})
	t.Run("a CSR whose signature is broken", func(t *testing.T) {
		s, err := startLimitServer()
		require.NoError(t, err)
		_, csrPEM, err := NewCSR()
		require.NoError(t, err)
		block, _ := pem.Decode(csrPEM)
		require.NotNil(t, block)
		der := append([]byte(nil), block.Bytes...)
		der[len(der)-3] ^= 0x55 // inside the signature's last integer
		c := dial(t, s, nil)
		_, err = c.Write([]byte{limitBootstrap})
		require.NoError(t, err)
		require.NoError(t, writeFrame(c, der))
		refused(t, s, c, "CSR")
	})
	t.Run("an oversized frame", func(t *testing.T) {
		s, err := startLimitServer()
		require.NoError(t, err)
		c := dial(t, s, nil)
		_, err = c.Write([]byte{limitBootstrap})
		require.NoError(t, err)
		_ = writeFrame(c, make([]byte, maxLimitFrame+1)) // the server may close before it is all read
		refused(t, s, c, "frame of")
	})
	t.Run("an agent's work, accepted", func(t *testing.T) {
		s, err := startLimitServer()
		require.NoError(t, err)
		require.NoError(t, limitAgent(t.Context(), SourceAddr(1), s.addr, s.roots, s.rc.Issuer))
		require.NoError(t, s.stop())
	})
}
