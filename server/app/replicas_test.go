package app

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A backlog of coordination writes (head and ack-ledger shards, many
// batches in a storm) holds neither Lease: both are renewed through a
// client of their own while the coordination client's limiter is queued
// seconds deep. Through one shared client the renewals waited in that
// queue past the renew deadline: the leader lost its Lease, and the
// heartbeat counted the replica cut off, which ends every session it holds.
func TestLeaseRenewalsDoNotQueueBehindCoordinationWrites(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, admin, _ := localcluster.Management(t, ns)
	cfg := Default()
	cfg.Namespace, cfg.ReplicaName = ns, "replica-a"
	p := &process{cfg: cfg, kube: &kubeclient.Clients{Config: mgmt.RESTConfig()}, log: slog.New(slog.DiscardHandler), reg: prometheus.NewRegistry()}
	require.NoError(t, p.newReplicas(ctx))
	require.True(t, p.reps.several)
	runDone := make(chan struct{})
	go func() { defer close(runDone); p.reps.run(ctx) }()
	var cut atomic.Int32
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		leader.Heartbeat(ctx, p.heartbeatConfig(func(isolated bool) {
			if isolated {
				cut.Add(1)
			}
		}))
	}()
	require.Eventually(t, p.reps.leading, 20*time.Second, 50*time.Millisecond, "the only replica never took the Lease")
	renewed := func(name string) time.Time {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		require.NotNil(t, l.Spec.RenewTime, "Lease %s", name)
		return l.Spec.RenewTime.Time
	}
	require.Eventually(t, func() bool {
		_, err := admin.CoordinationV1().Leases(ns).Get(ctx, leader.ReplicaLeaseName("replica-a"), metav1.GetOptions{})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "the replica's own Lease was never written")

	// Far more coordination requests than its limiter lets through (50/s):
	// with 500 waiting at any time, each request through it waits about
	// 10 s in its queue, twice the leader's renew deadline.
	var flood sync.WaitGroup
	floodCtx, stopFlood := context.WithCancel(ctx)
	var sent atomic.Int64
	for range 500 {
		flood.Go(func() {
			for floodCtx.Err() == nil {
				_, err := p.reps.coord.CoreV1().ConfigMaps(ns).Get(floodCtx, "relaymesh-none", metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					sent.Add(1) // the apiserver answered
				}
			}
		})
	}
	start := time.Now()
	leaderBefore, ownBefore := renewed(leader.ServerLease), renewed(leader.ReplicaLeaseName("replica-a"))
	lost := false
	for time.Since(start) < 3*cfg.LeaseDuration {
		if !p.reps.leading() {
			lost = true
		}
		time.Sleep(50 * time.Millisecond)
	}
	leaderAfter, ownAfter := renewed(leader.ServerLease), renewed(leader.ReplicaLeaseName("replica-a"))
	stopFlood()
	flood.Wait()
	// The coordination client was kept at its limit for the whole window
	// (about 50 answers a second), its queue never empty.
	assert.Less(t, float64(sent.Load()), 60*3*cfg.LeaseDuration.Seconds()+200, "coordination requests got through faster than their limiter allows")
	assert.Greater(t, sent.Load(), int64(40*3*cfg.LeaseDuration.Seconds()), "the flood did not keep the coordination limiter busy")
	assert.False(t, lost, "the replica lost the Lease while coordination writes were queued")
	assert.Zero(t, cut.Load(), "the heartbeat counted the replica cut off while coordination writes were queued")
	assert.True(t, leaderAfter.After(leaderBefore), "leader Lease not renewed during the flood (renewed %s, then %s)", leaderBefore, leaderAfter)
	assert.True(t, ownAfter.After(ownBefore), "replica Lease not renewed during the flood (renewed %s, then %s)", ownBefore, ownAfter)
	cancel()
	<-hbDone
	<-runDone
}
