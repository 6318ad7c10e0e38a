package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// eventually polls cond every 100ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
	}
	t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
}

// TestFleet runs five simulated agents against a real server on a real
// management cluster and checks what the harness measures against what the
// server and the API server say: every agent bootstraps once with its
// token, holds a session from its own address, its snapshot becomes
// discovered objects, a policy edit reaches it and is acknowledged, status
// names its certificate, Renew gives it a new one, a dropped connection
// resumes at the acknowledged version, deregistration stops it, and the
// server's audit log verifies without a token in any log.
func TestFleet(t *testing.T) {
	ctx := context.Background()
	env := startEnv(t)
	srv, err := env.StartServer(ctx, "server", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	members, err := env.Mgmt.Register(ctx, fleet.ClusterNames("e2e", 5), time.Hour, 5)
	require.NoError(t, err)
	roots, err := env.Mgmt.RelayRoots(ctx)
	require.NoError(t, err)

	// Track which agents received the policy's 7s timeout, and when.
	var mu sync.Mutex
	got7s := map[string]time.Time{}
	spec := fleet.SnapshotSpec{Services: 2, PodsPerService: 3}
	f, err := fleet.NewFleet(fleet.FleetConfig{
		Servers: []string{srv.Addr}, Roots: roots, Members: members,
		Snapshot: func(c string) *relaypb.Snapshot { return spec.Snapshot(c) },
		Agent: fleet.AgentConfig{PingInterval: time.Second, Hooks: fleet.Hooks{Output: func(a *fleet.Agent, o fleet.Output) {
			for _, obj := range o.Set.GetObjects() {
				if strings.Contains(string(obj.GetManifest()), `"timeout":"7s"`) {
					mu.Lock()
					if _, ok := got7s[a.Cluster()]; !ok {
						got7s[a.Cluster()] = o.At
					}
					mu.Unlock()
				}
			}
		}}},
	})
	require.NoError(t, err)
	start := f.Start(ctx)
	t.Cleanup(f.Stop)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	require.NoError(t, f.Wait(wctx, "connected", fleet.Connected))

	for _, st := range f.States() {
		tl := st.Timeline
		assert.Equal(t, 1, st.BootstrapAttempts, "%s bootstrapped once", st.Cluster)
		assert.False(t, tl.Started.Before(start), st.Cluster)
		assert.True(t, tl.Started.Before(tl.Certified) && tl.Certified.Before(tl.Session), "%s: token → certified → session in order: %+v", st.Cluster, tl)
		assert.NotEmpty(t, st.Serial)
		assert.Equal(t, srv.Addr, st.Server)
	}
	// The server saw each agent from its own source address.
	opened, err := fleet.ReadLog(srv.LogPath(), time.Time{}, func(l fleet.LogLine) bool { return l.Msg == "agent session opened" })
	require.NoError(t, err)
	peers := map[string]string{}
	for _, l := range opened {
		host, _, _ := strings.Cut(fmt.Sprint(l.Attrs["peer"]), ":")
		peers[fmt.Sprint(l.Attrs["cluster"])] = host
	}
	for i, m := range members {
		assert.Equal(t, fleet.SourceAddr(i).String(), peers[m.Cluster], "peer address of %s", m.Cluster)
	}

	// Each snapshot (1 mesh, 2 Deployments, 2 Services) is mirrored.
	clusters := map[string]bool{}
	for _, m := range members {
		clusters[m.Cluster] = true
	}
	eventually(t, 30*time.Second, "25 discovered objects", func() (bool, string) {
		n, err := env.Mgmt.DiscoveredObjects(ctx, clusters)
		return err == nil && n == 25, fmt.Sprint(n, err)
	})

	// A policy without selectors reaches every agent, which acks it.
	require.NoError(t, env.Mgmt.SetRequestTimeout(ctx, "fleet-timeout", "5s"))
	require.NoError(t, f.Wait(wctx, "synced", fleet.Synced))
	edit := time.Now()
	require.NoError(t, env.Mgmt.SetRequestTimeout(ctx, "fleet-timeout", "7s"))
	eventually(t, 30*time.Second, "the 7s timeout at every agent", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(got7s) == len(members), fmt.Sprint(len(got7s))
	})
	mu.Lock()
	for c, at := range got7s {
		assert.True(t, at.After(edit), "%s got the edit after it was made", c)
	}
	mu.Unlock()
	for _, st := range f.States() {
		require.NotEmpty(t, st.Outputs)
		last := st.Outputs[len(st.Outputs)-1]
		assert.Equal(t, last.Version, st.Acked, "%s acked what it received", st.Cluster)
		assert.Positive(t, last.Objects)
		assert.Zero(t, st.Regressions)
	}

	// Status names each agent's certificate and says it is connected.
	eventually(t, 30*time.Second, "every KubernetesCluster connected with the agent's serial", func() (bool, string) {
		statuses, err := env.Mgmt.ClusterStatuses(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, st := range f.States() {
			if s := statuses[st.Cluster]; !s.Connected || s.Serial != st.Serial {
				return false, fmt.Sprintf("%s: %+v, agent serial %s", st.Cluster, s, st.Serial)
			}
		}
		return true, ""
	})

	// Renew over the open session gives a new certificate, which new
	// connections then use.
	a0 := f.Agents()[0]
	before := a0.State().Serial
	require.NoError(t, a0.Renew(ctx))
	after := a0.State().Serial
	assert.NotEqual(t, before, after)
	resp, err := a0.RenewCSR(ctx, []byte("not a CSR"))
	assert.Nil(t, resp)
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "the server refuses a malformed CSR: %v", err)

	// A dropped connection comes back and resumes at the acked version:
	// the server sends it again, never an older one.
	a1 := f.Agents()[1]
	acked := a1.State().Acked
	require.Positive(t, a1.Drop())
	eventually(t, 30*time.Second, "the second session of "+a1.Cluster(), func() (bool, string) {
		st := a1.State()
		if !st.Connected || st.Sessions < 2 || len(st.Outputs) == 0 {
			return false, fmt.Sprintf("%+v", st.Timeline)
		}
		last := st.Outputs[len(st.Outputs)-1]
		return last.Version >= acked && st.Acked == last.Version, fmt.Sprint(last, acked)
	})
	assert.Zero(t, a1.State().Regressions)
	assert.Positive(t, a1.State().Reconnects)

	// Deregistration ends the cluster's session; the agent is refused.
	a4 := f.Agent(members[4].Cluster)
	require.NoError(t, env.Mgmt.Deregister(ctx, []string{members[4].Cluster}, 1))
	eventually(t, 10*time.Second, "the deregistered agent refused", func() (bool, string) {
		st := a4.State()
		return st.Refused != nil && st.Done, fmt.Sprint(st.Refused)
	})
	assert.Equal(t, codes.PermissionDenied, status.Code(a4.State().Refused))

	// The audit chain holds, and no token or key is in any log.
	f.Stop()
	records, err := srv.VerifyAudit()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, records, uint64(5+5+1), "token mints, uses and issuances are audited")
	leaks, err := srv.FindSecrets(members)
	require.NoError(t, err)
	assert.Empty(t, leaks)
}
