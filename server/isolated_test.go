package server_test

import (
	"context"
	"testing"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A replica cut off from the management apiserver cannot learn of
// deregistrations, so it fails closed: every session ends at once with
// Unavailable (agents then try another replica), renewals, new sessions
// and bootstraps are refused; once it is back, agents are served again.
func TestIsolatedReplicaEndsSessionsAndRefusesCalls(t *testing.T) {
	f := servertest.New(t, servertest.Options{DataPath: true})
	c1 := f.Bootstrap("cluster-1")
	s1 := openSession(t, f, c1)
	token := f.Mint("cluster-2", time.Hour)
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := s1.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	start := time.Now()
	f.Srv.SetIsolated(true)
	select {
	case err := <-ended:
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Less(t, time.Since(start), time.Second)
	case <-time.After(2 * time.Second):
		t.Fatal("a session of an isolated replica still open after 2s")
	}
	require.Eventually(t, func() bool { return f.Metric(server.MetricConnectedAgents) == 0 }, 2*time.Second, 10*time.Millisecond)

	csr, _ := servertest.CSRPEM(t)
	_, err := relaypb.NewIdentityClient(f.Dial(f.MTLS(c1.TLS))).Renew(context.Background(), &relaypb.RenewRequest{Csr: csr})
	assert.Equal(t, codes.Unavailable, status.Code(err), "renewal refused while isolated")
	stream, err := relaypb.NewRelayClient(f.Dial(f.MTLS(c1.TLS))).Connect(context.Background())
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err), "a new session refused while isolated")
	pull, err := relaypb.NewDiscoveryClient(f.Dial(f.MTLS(c1.TLS))).Pull(context.Background())
	require.NoError(t, err)
	_, err = pull.Recv() // a stream reports its refusal on the first receive
	assert.Equal(t, codes.Unavailable, status.Code(err), "outputs refused while isolated")
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-2", Token: token, Csr: csr})
	assert.Equal(t, codes.Unavailable, status.Code(err), "bootstrap refused while isolated (the token is not spent)")

	f.Srv.SetIsolated(false)
	_, err = relaypb.NewIdentityClient(f.Dial(f.MTLS(c1.TLS))).Renew(context.Background(), &relaypb.RenewRequest{Csr: csr})
	assert.NoError(t, err, "served again once back")
	_, err = f.BootstrapClient().Bootstrap(context.Background(), &relaypb.BootstrapRequest{Cluster: "cluster-2", Token: token, Csr: csr})
	assert.NoError(t, err, "the token refused while isolated still works")
	openSession(t, f, c1)
}
