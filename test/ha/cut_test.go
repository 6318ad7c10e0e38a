package ha_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/ha"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCutOffFromAPIServer proves the harness's cut: a replica cut off from
// the apiserver can no longer open a connection to it, cannot see a cluster
// registered meanwhile (a bootstrap through it fails and does not burn the
// token, which another replica then accepts), while agents still reach it;
// after the restore it reaches the apiserver again and sees the cluster.
func TestCutOffFromAPIServer(t *testing.T) {
	ctx := context.Background()
	env := ha.Setup(t, bin, ha.Config{Replicas: 2})
	env.Start(t)
	store := env.Net.StoreAddr()
	for i := range env.Replicas {
		require.NoError(t, env.Net.Probe(i, store, 2*time.Second), "replica %d reaches the apiserver before the cut", i)
	}
	roots := env.Roots(t)

	require.NoError(t, env.Net.CutAPIServer(0))
	assert.True(t, env.Net.IsCut(0))
	require.Error(t, env.Net.Probe(0, store, time.Second), "the cut replica opened a connection to the apiserver")
	require.NoError(t, env.Net.Probe(1, store, 2*time.Second), "the other replica is not cut")
	code, err := e2e.GetJSON("https://"+env.Replicas[0].OpsAddr+"/healthz", nil)
	require.NoError(t, err, "the cut replica is still reachable by agents")
	assert.Equal(t, 200, code)
	// What a Service would see: readiness fails once the replica has been
	// cut off for a lease duration (TestFailover's CutFromAPIServer checks
	// the 503); a moment after the cut it may still answer 200.
	code, err = e2e.GetJSON("https://"+env.Replicas[0].OpsAddr+"/readyz", nil)
	require.NoError(t, err)
	t.Logf("the cut replica's /readyz answers %d a moment after the cut", code)

	// A cluster registered during the cut: replica 0 cannot know it.
	env.RegisterOnly(t, "late-1", 1)
	token := env.MintToken(t, "late-1")
	bootstrap := func(replica int, timeout time.Duration) (string, error) {
		src, err := env.Net.ClientAddr()
		require.NoError(t, err)
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, err := ha.Dial(dctx, ha.ClientConfig{Addr: env.Replicas[replica].RelayAddr, Roots: roots, Source: src})
		require.NoError(t, err)
		defer c.Close()
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		resp, err := c.Bootstrap(cctx, "late-1", token)
		if err != nil {
			return "", err
		}
		return resp.GetSpiffeId(), nil
	}
	start := time.Now()
	_, err = bootstrap(0, 5*time.Second)
	require.Error(t, err, "the cut replica issued a certificate for a cluster it cannot know")
	assert.Contains(t, []codes.Code{codes.PermissionDenied, codes.DeadlineExceeded}, status.Code(err), "%v", err)
	t.Logf("bootstrap through the cut replica: %s after %s", status.Code(err), time.Since(start).Round(time.Millisecond))
	id, err := bootstrap(1, 10*time.Second)
	require.NoError(t, err, "the token was burnt by the cut replica, or the other replica refused it")
	assert.Equal(t, "spiffe://relaymesh.local/cluster/late-1/agent", id)

	require.NoError(t, env.Net.RestoreAPIServer(0))
	assert.False(t, env.Net.IsCut(0))
	require.NoError(t, env.Net.Probe(0, store, 2*time.Second), "the restored replica reaches the apiserver")
	token = env.MintToken(t, "late-1")
	start = time.Now()
	e2e.Eventually(t, 60*time.Second, "the restored replica to accept late-1", func() (bool, string) {
		_, err := bootstrap(0, 10*time.Second)
		return err == nil, status.Code(err).String()
	})
	t.Logf("the restored replica accepted late-1 %s after the restore", time.Since(start).Round(time.Millisecond))

	// Only the network's own addresses can be probed.
	require.Error(t, env.Net.Probe(0, netip.MustParseAddrPort("192.0.2.1:443"), time.Second))
}
