package server_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca/catest"
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
	f.Store.AfterConsume = func() { <-slow }
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
	assert.Equal(t, 0, f.Store.Len(), "the token is spent")

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
	assert.Equal(t, 1, f.Store.Len(), "the token is not spent")
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-1", Token: tok, Csr: csr})
	require.NoError(t, err)
	assert.Equal(t, 0, f.Store.Len())
}
