package server_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/identity"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An agent whose Bootstrap call gives up after the server spent its token
// (a busy server, a lost answer) gets its certificate by calling again with
// the same key; any other key, or another cluster, is refused as for any
// spent token, and the token is spent exactly once.
func TestBootstrapRetryBySpendingKey(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	slow := make(chan struct{})
	f.Store.AfterSpend = func() { <-slow }
	tok := f.Mint("cluster-1", time.Hour)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr := catest.NewCSRPEM(t, key, nil)

	// The caller gives up after the store consumed the token, before the
	// server answers.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	_, err := f.BootstrapClient().Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	cancel()
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	close(slow) // the server goes on: the token is spent, a certificate issued
	require.Eventually(t, func() bool {
		return f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success") == 1
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 0, f.Store.Unspent(), "the token is spent")

	// Another key with the same token: refused, nothing issued.
	other := catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), nil)
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: other})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	// The same key for another cluster's name: refused.
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-2", Token: tok, Csr: csr})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	// The same key again: the certificate issued for it, not a second one.
	resp, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	require.NoError(t, err)
	c := f.Cred(resp, catest.KeyPEM(t, key))
	assert.Equal(t, "spiffe://relaymesh.test/cluster/cluster-1/agent", c.Leaf.URIs[0].String())
	again, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	require.NoError(t, err)
	assert.Equal(t, resp.GetCertificateChain(), again.GetCertificateChain())
	assert.Equal(t, float64(1), f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success"), "one certificate for one token")
	assert.Equal(t, float64(2), f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "retried"))

	// The audit log shows the token spent once, and each retry.
	b, err := os.ReadFile(f.AuditPath)
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(string(b), "retry by the key that spent it"))

	// A deregistered cluster's spent token is not retryable.
	f.Registry.Remove("cluster-1")
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
}

// Replicas share the token store: a retry by the spending key that reaches
// another replica (the first one is busy, or its answer was lost) gets a
// certificate there; any other key is refused there too.
func TestBootstrapRetryOnAnotherReplica(t *testing.T) {
	a := servertest.New(t, servertest.Options{})
	slow := make(chan struct{})
	var first atomic.Bool
	a.Store.AfterSpend = func() { // only the first spend waits
		if first.CompareAndSwap(false, true) {
			<-slow
		}
	}
	b := servertest.New(t, servertest.Options{Store: a.Store})
	released := false
	defer func() {
		if !released {
			close(slow)
		}
	}()
	tok := a.Mint("cluster-1", time.Hour)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr := catest.NewCSRPEM(t, key, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	_, err := a.BootstrapClient().Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	cancel()
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)

	other := catest.NewCSRPEM(t, catest.NewKey(t, catest.ECDSAP256), nil)
	_, err = b.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: other})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "another key on the other replica: %v", err)

	resp, err := b.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	require.NoError(t, err, "the spending key on the other replica")
	c := b.Cred(resp, catest.KeyPEM(t, key))
	assert.Equal(t, "spiffe://relaymesh.test/cluster/cluster-1/agent", c.Leaf.URIs[0].String())
	assert.Equal(t, float64(1), b.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success"))
	logged, err := os.ReadFile(b.AuditPath)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(logged), "retry by the key that spent it"))
	assert.Contains(t, string(logged), `"spent_at"`)
	assert.NotContains(t, string(logged), tok[17:], "no token secret in the audit log")

	close(slow) // the first replica finishes too: one token, two certificates for one key
	released = true
	require.Eventually(t, func() bool {
		return a.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success") == 1
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 0, a.Store.Unspent())
}

// A retry by the same key that reaches the spending replica while the
// spend is still on its way to the store is asked to come back, not
// issued a second certificate; once the first call is done it gets that
// call's certificate.
func TestRetryDuringTheSpendWaits(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	slow := make(chan struct{})
	var first atomic.Bool
	f.Store.AfterSpend = func() {
		if first.CompareAndSwap(false, true) {
			<-slow
		}
	}
	tok := f.Mint("cluster-1", time.Hour)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr := catest.NewCSRPEM(t, key, nil)
	req := &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr}
	done := make(chan *relaypb.CertificateResponse)
	go func() {
		resp, err := f.BootstrapClient().Bootstrap(context.Background(), req)
		assert.NoError(t, err)
		done <- resp
	}()
	require.Eventually(t, first.Load, 10*time.Second, 5*time.Millisecond, "the first call is in the spend")
	_, err := f.BootstrapClient().Bootstrap(context.Background(), req)
	require.Equal(t, codes.Unavailable, status.Code(err), "the same key during the spend: %v", err)
	close(slow)
	resp := <-done
	again, err := f.BootstrapClient().Bootstrap(context.Background(), req)
	require.NoError(t, err)
	assert.Equal(t, resp.GetCertificateChain(), again.GetCertificateChain())
	assert.Equal(t, float64(1), f.Metric(server.MetricIssued, "operation", "bootstrap", "result", "success"), "one certificate")
}

// A replica that answered a retry remembers it only until the spend's
// window ends, not for a window of its own: past it, the same key is
// refused there too; and a revoked token is not issued again by a replica
// that has nothing issued for it.
func TestRetryWindowRunsFromTheSpend(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	a := servertest.New(t, servertest.Options{Clock: clock})
	b := servertest.New(t, servertest.Options{Clock: clock, Store: a.Store})
	tok := a.Mint("cluster-1", time.Hour)
	key := catest.NewKey(t, catest.ECDSAP256)
	csr := catest.NewCSRPEM(t, key, nil)
	bootstrap := func(f *servertest.Server) error {
		_, err := f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
		return err
	}
	require.NoError(t, bootstrap(a), "spent at a")
	advance(identity.RetryWindow - time.Minute)
	require.NoError(t, bootstrap(b), "retried at b, a minute before the window ends")
	require.NoError(t, bootstrap(b), "and again, answered from b's memory")
	assert.Equal(t, float64(1), b.Metric(server.MetricIssued, "operation", "bootstrap", "result", "retried"))
	advance(time.Minute)
	for name, f := range map[string]*servertest.Server{"a": a, "b": b} {
		require.Equal(t, codes.PermissionDenied, status.Code(bootstrap(f)), "%s, the window over", name)
	}

	// Revoked: a replica with nothing issued for it refuses the retry.
	tok = a.Mint("cluster-1", time.Hour)
	require.NoError(t, bootstrap(a))
	p, err := identity.ParseToken(tok)
	require.NoError(t, err)
	rec, err := a.Store.GetLatest(context.Background(), p.ID)
	require.NoError(t, err)
	require.NoError(t, a.Store.Consume(context.Background(), rec))
	require.Equal(t, codes.PermissionDenied, status.Code(bootstrap(b)), "b, the token revoked")
}

// A call with too little time left is asked to come back, and its token is
// not spent: the retry succeeds.
func TestBootstrapWithoutTimeLeftKeepsTheToken(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	tok := f.Mint("cluster-1", time.Hour)
	csr, _ := servertest.CSRPEM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := f.BootstrapClient().Bootstrap(ctx, &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	cancel()
	require.Error(t, err)
	assert.Contains(t, []codes.Code{codes.Unavailable, codes.DeadlineExceeded}, status.Code(err), "%v", err)
	assert.Equal(t, 1, f.Store.Unspent(), "the token is not spent")
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	require.NoError(t, err)
	assert.Equal(t, 0, f.Store.Unspent())
}
