package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/identity"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestBootstrapIssuesServerChosenIdentity(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	key := catest.NewKey(t, catest.ECDSAP256)
	u, _ := url.Parse("spiffe://relaymesh.test/cluster/cluster-2/agent")
	// The CSR asks for names of its own, including another cluster's identity.
	csr := catest.NewCSRPEM(t, key, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "admin"},
		DNSNames: []string{"relaymesh-server"}, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)},
		URIs: []*url.URL{u}, EmailAddresses: []string{"root@example.com"},
	})
	resp, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: f.Mint("cluster-1", time.Hour), Csr: csr})
	require.NoError(t, err)
	c := f.Cred(resp, catest.KeyPEM(t, key))
	assert.Equal(t, "spiffe://relaymesh.test/cluster/cluster-1/agent", resp.GetSpiffeId())
	require.Len(t, c.Leaf.URIs, 1)
	assert.Equal(t, resp.GetSpiffeId(), c.Leaf.URIs[0].String())
	assert.Empty(t, c.Leaf.DNSNames, "CSR SANs are never copied")
	assert.Empty(t, c.Leaf.IPAddresses)
	assert.Empty(t, c.Leaf.EmailAddresses)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, c.Leaf.ExtKeyUsage)
	assert.False(t, c.Leaf.IsCA)
	assert.GreaterOrEqual(t, c.Leaf.SerialNumber.BitLen(), 100, "random serial of ~128 bits")
	assert.Equal(t, 0, f.Store.Unspent(), "the token was consumed")
	assert.Equal(t, float64(1), f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success"))
	assert.Contains(t, f.Logs.String(), "ignoring names requested in CSR")
}

func TestBootstrapRefusals(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	ctx := context.Background()
	good, _ := servertest.CSRPEM(t)
	rsaKey := catest.NewKey(t, catest.RSA1024)
	used := f.Mint("cluster-1", time.Hour)
	_, err := f.BootstrapClient().Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: used, Csr: good})
	require.NoError(t, err)
	expired := f.Mint("cluster-1", time.Hour)
	// Expire it by rewinding the record: the store holds expiry only.
	p, err := identity.ParseToken(expired)
	require.NoError(t, err)
	rec, err := f.Store.Get(ctx, p.ID)
	require.NoError(t, err)
	require.NoError(t, f.Store.Consume(ctx, rec))
	rec.ExpiresAt = time.Now().Add(-time.Second)
	require.NoError(t, f.Store.Create(ctx, rec))

	badSig := catest.CSRPEM(catest.TamperSignature(catest.NewCSR(t, catest.NewKey(t, catest.ECDSAP256), &x509.CertificateRequest{})))
	caCSR := catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{catest.BasicConstraintsExtension(t, true)}})
	weak := catest.NewCSRPEM(t, rsaKey, &x509.CertificateRequest{})

	tests := []struct {
		name    string
		req     func() *relaypb.BootstrapRequest
		code    codes.Code
		msg     string
		reason  string
		keepTok bool // the presented token must still be redeemable afterwards
	}{
		{"reused token", func() *relaypb.BootstrapRequest {
			// Another key than the one that spent it (that one may retry:
			// TestBootstrapRetryBySpendingKey).
			other, _ := servertest.CSRPEM(t)
			return &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: used, Csr: other}
		}, codes.PermissionDenied, "bootstrap denied", identity.ReasonUsed, false},
		{"expired token", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: expired, Csr: good}
		}, codes.PermissionDenied, "bootstrap denied", identity.ReasonExpired, false},
		{"token for another cluster", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "cluster-2", Token: f.Mint("cluster-1", time.Hour), Csr: good}
		}, codes.PermissionDenied, "bootstrap denied", identity.ReasonWrongCluster, true},
		{"garbage token", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: "hunter2", Csr: good}
		}, codes.PermissionDenied, "bootstrap denied", identity.ReasonMalformed, false},
		{"unregistered cluster", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "cluster-9", Token: f.Mint("cluster-9", time.Hour), Csr: good}
		}, codes.PermissionDenied, "bootstrap denied", "unregistered", true},
		{"bad cluster name", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "../cluster-1", Token: f.Mint("cluster-1", time.Hour), Csr: good}
		}, codes.InvalidArgument, "not a DNS label", "bad_cluster_name", true},
		{"CSR with a bad signature", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: f.Mint("cluster-1", time.Hour), Csr: badSig}
		}, codes.InvalidArgument, "signature", "bad_csr", true},
		{"CSR asking for CA:true", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: f.Mint("cluster-1", time.Hour), Csr: caCSR}
		}, codes.InvalidArgument, "CA", "bad_csr", true},
		{"RSA-1024 key", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: f.Mint("cluster-1", time.Hour), Csr: weak}
		}, codes.InvalidArgument, "RSA", "bad_csr", true},
		{"garbage PEM", func() *relaypb.BootstrapRequest {
			return &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: f.Mint("cluster-1", time.Hour), Csr: []byte("-----BEGIN CERTIFICATE REQUEST-----\nnot base64\n-----END CERTIFICATE REQUEST-----\n")}
		}, codes.InvalidArgument, "", "bad_csr", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req()
			before := f.Store.Unspent()
			issued := f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success")
			reasonBefore := f.Metric(server.MetricBootstrapFailures, "reason", tt.reason)
			_, err := f.BootstrapClient().Bootstrap(ctx, req)
			require.Error(t, err)
			assert.Equal(t, tt.code, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), tt.msg)
			if len(req.Token) > 17 {
				assert.NotContains(t, err.Error(), req.Token[17:], "the error must not echo the token")
			}
			assert.Equal(t, before, f.Store.Unspent(), "no token was consumed")
			assert.Equal(t, issued, f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success"), "nothing was issued")
			assert.Equal(t, reasonBefore+1, f.Metric(server.MetricBootstrapFailures, "reason", tt.reason))
			if tt.keepTok && req.Cluster != "../cluster-1" {
				cluster := req.Cluster
				if tt.reason == identity.ReasonWrongCluster {
					cluster = "cluster-1"
				}
				if cluster == "cluster-9" {
					f.Registry.Set(server.Registration{Name: "cluster-9", UID: "9"})
					defer f.Registry.Remove("cluster-9")
				}
				_, err := f.BootstrapClient().Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: cluster, Token: req.Token, Csr: good})
				assert.NoError(t, err, "the rightful owner can still use the token")
			}
		})
	}
}

// TestMalformedTokenReadsNothing: a token that cannot be one is refused
// before the registration is read, so unauthenticated callers naming
// unknown clusters cannot make the server query the apiserver.
func TestMalformedTokenReadsNothing(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	var fetches atomic.Int32
	f.Registry.SetFetch(func(context.Context, string) (server.Registration, bool, error) {
		fetches.Add(1)
		return server.Registration{}, false, nil
	})
	csr, _ := servertest.CSRPEM(t)
	for _, token := range []string{"", "hunter2", strings.Repeat("a", 16) + "." + strings.Repeat("b", 42), strings.Repeat("x", 4096)} {
		_, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-unknown", Token: token, Csr: csr})
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%.20q", token)
	}
	assert.Zero(t, fetches.Load(), "no registration read for a malformed token")
	assert.Equal(t, float64(4), f.Metric(server.MetricBootstrapFailures, "reason", identity.ReasonMalformed))
	// A well-formed token for a cluster the watch has not shown is read.
	_, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-unknown", Token: f.Mint("cluster-unknown", time.Hour), Csr: csr})
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Equal(t, int32(1), fetches.Load(), "a well-formed token's cluster is looked up")
}

func TestSharedTokenMode(t *testing.T) {
	shared := strings.Repeat("s", 48)
	f := servertest.New(t, servertest.Options{Shared: shared})
	assert.Contains(t, f.Logs.String(), "shared bootstrap token mode is ON", "the weaker mode is logged")
	csr, _ := servertest.CSRPEM(t)
	_, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: shared, Csr: csr})
	require.NoError(t, err)
	issued := f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success")
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: strings.Repeat("s", 47) + "t", Csr: csr})
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "wrong shared token")
	assert.Equal(t, issued, f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success"), "nothing issued")
	assert.Equal(t, float64(1), f.Metric(server.MetricBootstrapFailures, "reason", identity.ReasonWrongSecret))
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-9", Token: shared, Csr: csr})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "the shared token admits only registered clusters")

	off := servertest.New(t, servertest.Options{})
	_, err = off.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: shared, Csr: csr})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "shared mode is off by default")
}

func TestBootstrapRace(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	for range 10 {
		tok := f.Mint("cluster-1", time.Hour)
		var wins atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				csr, _ := servertest.CSRPEM(t)
				client := f.BootstrapClient()
				<-start
				if _, err := client.Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr}); err == nil {
					wins.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, int32(1), wins.Load(), "exactly one of two racing bootstraps wins")
	}
}

func TestOversizedRequest(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	_, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: f.Mint("cluster-1", time.Hour), Csr: bytes.Repeat([]byte("A"), 1<<20)})
	require.Error(t, err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Equal(t, 1, f.Store.Unspent(), "token untouched")
}

func TestBootstrapFailuresAreRateLimited(t *testing.T) {
	f := servertest.New(t, servertest.Options{FailureBurst: 5})
	csr, _ := servertest.CSRPEM(t)
	var codesSeen []codes.Code
	for range 8 {
		_, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: "guess", Csr: csr})
		codesSeen = append(codesSeen, status.Code(err))
	}
	assert.Equal(t, codes.PermissionDenied, codesSeen[0])
	assert.Equal(t, codes.ResourceExhausted, codesSeen[len(codesSeen)-1], "after the burst, a guessing peer is refused outright: %v", codesSeen)
	// Even a valid token waits while the peer is blocked.
	_, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: f.Mint("cluster-1", time.Hour), Csr: csr})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, 1, f.Store.Unspent(), "a blocked attempt consumes nothing")
	assert.Positive(t, f.Metric(server.MetricBootstrapFailures, "reason", "rate_limited"))
}

func TestAuthenticatedCalls(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	ctx := context.Background()
	c1 := f.Bootstrap("cluster-1")

	t.Run("renew over mTLS keeps the identity", func(t *testing.T) {
		csr, keyPEM := servertest.CSRPEM(t)
		resp, err := relaypb.NewIdentityClient(f.Dial(f.MTLS(c1.TLS))).Renew(ctx, &relaypb.RenewRequest{Csr: csr})
		require.NoError(t, err)
		n := f.Cred(resp, keyPEM)
		assert.Equal(t, c1.Leaf.URIs[0].String(), n.Leaf.URIs[0].String())
		assert.NotEqual(t, c1.Leaf.SerialNumber, n.Leaf.SerialNumber)
	})

	t.Run("renew without a client certificate", func(t *testing.T) {
		csr, _ := servertest.CSRPEM(t)
		_, err := relaypb.NewIdentityClient(f.Dial(f.ServerOnly())).Renew(ctx, &relaypb.RenewRequest{Csr: csr})
		assert.Equal(t, codes.Unauthenticated, status.Code(err))
	})

	t.Run("session without a client certificate", func(t *testing.T) {
		stream, err := relaypb.NewRelayClient(f.Dial(f.ServerOnly())).Connect(ctx)
		require.NoError(t, err)
		_, err = stream.Recv()
		assert.Equal(t, codes.Unauthenticated, status.Code(err))
	})

	t.Run("client certificate from a foreign CA", func(t *testing.T) {
		foreignRoot := catest.NewRoot(t, catest.CAOptions{})
		foreignSigner, err := ca.NewKeySigner([]*x509.Certificate{foreignRoot.Cert}, foreignRoot.Key, []*x509.Certificate{foreignRoot.Cert}, time.Now())
		require.NoError(t, err)
		foreign, err := ca.New(ca.Config{Signer: foreignSigner})
		require.NoError(t, err)
		key := catest.NewKey(t, catest.ECDSAP256)
		csr, err := ca.ParseCSR(catest.NewCSRPEM(t, key, &x509.CertificateRequest{}))
		require.NoError(t, err)
		iss, err := foreign.IssueAgent(ctx, csr, spiffeid.RequireFromString("spiffe://relaymesh.test/cluster/cluster-1/agent"))
		require.NoError(t, err)
		pair, err := tls.X509KeyPair(iss.ChainPEM(), catest.KeyPEM(t, key))
		require.NoError(t, err)
		csr2, _ := servertest.CSRPEM(t)
		_, err = relaypb.NewIdentityClient(f.Dial(f.MTLS(pair))).Renew(ctx, &relaypb.RenewRequest{Csr: csr2})
		require.Error(t, err, "a certificate with the right SPIFFE ID from another CA is refused")
		assert.Contains(t, []codes.Code{codes.Unavailable, codes.Unauthenticated}, status.Code(err), "%v", err)
	})

	t.Run("renew with a bad CSR", func(t *testing.T) {
		_, err := relaypb.NewIdentityClient(f.Dial(f.MTLS(c1.TLS))).Renew(ctx, &relaypb.RenewRequest{Csr: []byte("garbage")})
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
	})
}

// openSession opens a relay session and returns it after Welcome.
func openSession(t *testing.T, f *servertest.Server, cred servertest.AgentCred) relaypb.Relay_ConnectClient {
	t.Helper()
	stream, err := relaypb.NewRelayClient(f.Dial(f.MTLS(cred.TLS))).Connect(context.Background())
	require.NoError(t, err)
	require.NoError(t, stream.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Hello{Hello: &relaypb.Hello{AgentVersion: "test"}}}))
	msg, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, msg.GetWelcome())
	return stream
}

func TestDeregistrationEndsSessionsAndRefusesCertificate(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	c1, c2 := f.Bootstrap("cluster-1"), f.Bootstrap("cluster-2")
	s1, s2 := openSession(t, f, c1), openSession(t, f, c2)
	require.Equal(t, float64(2), f.Metric(server.MetricConnectedAgents))

	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := s2.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	start := time.Now()
	f.Registry.Remove("cluster-2")
	select {
	case err := <-ended:
		took := time.Since(start)
		assert.Less(t, took, time.Second, "the session must close within 1 s")
		assert.Equal(t, codes.PermissionDenied, status.Code(err))
		assert.Contains(t, err.Error(), "cluster deregistered")
		t.Logf("session of a deregistered cluster closed after %s", took)
	case <-time.After(2 * time.Second):
		t.Fatal("session of a deregistered cluster still open after 2s")
	}

	csr, _ := servertest.CSRPEM(t)
	_, err := relaypb.NewIdentityClient(f.Dial(f.MTLS(c2.TLS))).Renew(context.Background(), &relaypb.RenewRequest{Csr: csr})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "renewal of a deregistered cluster is refused: %v", err)
	stream, err := relaypb.NewRelayClient(f.Dial(f.MTLS(c2.TLS))).Connect(context.Background())
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "a new session is refused too")

	// cluster-1 is untouched.
	require.NoError(t, s1.Send(&relaypb.AgentMessage{Msg: &relaypb.AgentMessage_Ping{Ping: &relaypb.Ping{Nonce: 7}}}))
	pong, err := s1.Recv()
	require.NoError(t, err)
	assert.Equal(t, int64(7), pong.GetPong().GetNonce())

	// Registering the name again (a new UID, at once: no clock involved)
	// does not revive the old certificate.
	f.Registry.Set(server.Registration{Name: "cluster-2", UID: "new-uid"})
	_, err = relaypb.NewIdentityClient(f.Dial(f.MTLS(c2.TLS))).Renew(context.Background(), &relaypb.RenewRequest{Csr: csr})
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.Contains(t, err.Error(), "earlier registration")

	b, err := os.ReadFile(f.AuditPath)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"type":"cluster.revoke"`)
	assert.Contains(t, string(b), `"type":"cert.deny"`)
}

func TestAuditTrail(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	c := f.Bootstrap("cluster-1")
	csr, _ := servertest.CSRPEM(t)
	_, err := relaypb.NewIdentityClient(f.Dial(f.MTLS(c.TLS))).Renew(context.Background(), &relaypb.RenewRequest{Csr: csr})
	require.NoError(t, err)
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: f.Mint("cluster-2", time.Hour), Csr: csr})
	require.Error(t, err)
	b, err := os.ReadFile(f.AuditPath)
	require.NoError(t, err)
	sum, err := audit.Verify(bytes.NewReader(b))
	require.NoError(t, err)
	assert.Equal(t, uint64(4), sum.Records, string(b))
	for _, want := range []string{`"type":"token.use"`, `"type":"cert.issue"`, `"type":"cert.renew"`, `"type":"token.failure"`, `"reason":"wrong_cluster"`, fmt.Sprintf(`"serial":"%x"`, c.Leaf.SerialNumber)} {
		assert.Contains(t, string(b), want)
	}
}

// A certificate from another intermediate under the relay root, with the
// right SPIFFE ID and even the right registration, is not an agent
// certificate: only the relay's issuing CA issues those.
func TestSiblingIssuerIsRefused(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	root := &catest.CA{Cert: f.RelayCA.Root, Key: f.RelayCA.RootKey}
	sibling := root.NewIntermediate(t, catest.CAOptions{Name: "other team's CA", PathLenZero: true})
	other, err := ca.New(ca.Config{Signer: sibling.Signer(t, time.Now())})
	require.NoError(t, err)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := ca.ParseCSR(catest.NewCSRPEM(t, key, &x509.CertificateRequest{}))
	require.NoError(t, err)
	iss, err := other.IssueAgentFor(context.Background(), csr, spiffeid.RequireFromString("spiffe://relaymesh.test/cluster/cluster-1/agent"), "cluster-1-uid")
	require.NoError(t, err)
	pair, err := tls.X509KeyPair(iss.ChainPEM(), catest.KeyPEM(t, key))
	require.NoError(t, err)
	csr2, _ := servertest.CSRPEM(t)
	_, err = relaypb.NewIdentityClient(f.Dial(f.MTLS(pair))).Renew(context.Background(), &relaypb.RenewRequest{Csr: csr2})
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	assert.Equal(t, float64(1), f.Metric(server.MetricRefusedCalls, "reason", "foreign_issuer"))
}

// A session that never says Hello still ends when its cluster is revoked.
func TestRevocationBeforeHello(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	c := f.Bootstrap("cluster-1")
	stream, err := relaypb.NewRelayClient(f.Dial(f.MTLS(c.TLS))).Connect(context.Background())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.Srv.Sessions("cluster-1") == 1 }, 5*time.Second, 10*time.Millisecond)
	ended := make(chan error, 1)
	go func() { _, err := stream.Recv(); ended <- err }()
	f.Registry.Remove("cluster-1")
	select {
	case err := <-ended:
		assert.Equal(t, codes.PermissionDenied, status.Code(err))
	case <-time.After(time.Second):
		t.Fatal("a session without Hello survived revocation")
	}
	assert.Equal(t, 0, f.Srv.Sessions("cluster-1"))
}

// Calls without a certificate are throttled per peer and never reach the
// audit log, so nobody can fill it by knocking.
func TestUnauthenticatedCallsAreThrottledAndNotAudited(t *testing.T) {
	f := servertest.New(t, servertest.Options{FailureBurst: 5})
	client := relaypb.NewIdentityClient(f.Dial(f.ServerOnly()))
	codesSeen := map[codes.Code]int{}
	for range 50 {
		_, err := client.Renew(context.Background(), &relaypb.RenewRequest{})
		codesSeen[status.Code(err)]++
	}
	// An unauthenticated connection carries a few streams only: the client
	// reconnects (Unavailable) after every PreAuthStreams calls, and after
	// three such cuts its address's connections are refused.
	assert.Equal(t, 5, codesSeen[codes.Unauthenticated], "%v", codesSeen)
	assert.Positive(t, codesSeen[codes.ResourceExhausted], "%v", codesSeen)
	assert.Equal(t, 50, codesSeen[codes.Unauthenticated]+codesSeen[codes.ResourceExhausted]+codesSeen[codes.Unavailable], "%v", codesSeen)
	assert.Equal(t, float64(5), f.Metric(server.MetricRefusedCalls, "reason", "no_certificate"))
	b, err := os.ReadFile(f.AuditPath)
	require.NoError(t, err)
	assert.Empty(t, string(b), "knocking without a certificate writes no audit record")
}
