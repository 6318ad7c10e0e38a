package app

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// One apiserver for the package's tests that need one.
func workloadCluster(t *testing.T) (*kubeclient.Clients, kubernetes.Interface) {
	t.Helper()
	c, cs, dyn := localcluster.Management(t, "relaymesh")
	return &kubeclient.Clients{Config: c.RESTConfig(), Typed: cs, Dynamic: dyn}, cs
}

// The ConfigMap registration wrote fills what no flag set, and never
// overrides a flag; without either, Run refuses with ErrUnconfigured
// before it listens or writes anything. Two replicas of the agent under
// leader election: one holds the Lease, the other stands by; a shutdown
// releases the Lease after the work stopped, so the standby leads at once
// (well within the lease duration), and Run returns nil.
func TestAgentAppResolvesItsConfigAndHandsTheLeaseOver(t *testing.T) {
	kube, cs := workloadCluster(t)
	ctx := context.Background()

	cfg := Default()
	cfg.HealthListen, cfg.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	var logs syncbuf.Buffer
	err := Run(ctx, cfg, Env{Kube: kube, Stderr: &logs, Version: "test"})
	require.ErrorIs(t, err, ErrUnconfigured, "no flag and no ConfigMap")

	_, err = cs.CoreV1().ConfigMaps("relaymesh").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName},
		Data: map[string]string{"cluster": "from-configmap", "serverAddress": "127.0.0.1:1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	got, err := cfg.resolve(ctx, cs)
	require.NoError(t, err)
	assert.Equal(t, "from-configmap", got.Cluster)
	assert.Equal(t, "127.0.0.1:1", got.ServerAddress)
	flagged := cfg
	flagged.Cluster = "from-flag"
	got, err = flagged.resolve(ctx, cs)
	require.NoError(t, err)
	assert.Equal(t, "from-flag", got.Cluster, "a flag wins over the ConfigMap")
	assert.Equal(t, "127.0.0.1:1", got.ServerAddress)

	// Two replicas. No relay server answers: the leader's work waits for
	// its credential, which is enough to hold the Lease.
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 6*time.Second, 4*time.Second, 500*time.Millisecond
	type replica struct {
		cancel context.CancelFunc
		done   chan error
	}
	start := func(id string) replica {
		c := cfg
		c.Identity = id
		rctx, cancel := context.WithCancel(ctx)
		r := replica{cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- Run(rctx, c, Env{Kube: kube, Stderr: &logs, Version: "test"}) }()
		return r
	}
	holder := func() string {
		l, err := cs.CoordinationV1().Leases("relaymesh").Get(ctx, cfg.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	a := start("agent-a")
	t.Cleanup(a.cancel)
	require.Eventually(t, func() bool { return holder() == "agent-a" }, 20*time.Second, 50*time.Millisecond, "the first replica leads")
	b := start("agent-b")
	t.Cleanup(b.cancel)
	time.Sleep(2 * time.Second)
	assert.Equal(t, "agent-a", holder(), "the second replica stands by")

	handover := time.Now()
	a.cancel()
	select {
	case err := <-a.done:
		require.NoError(t, err, "a shutdown is no error")
	case <-time.After(40 * time.Second):
		t.Fatal("Run did not return after ctx was done")
	}
	require.Eventually(t, func() bool { return holder() == "agent-b" }, 20*time.Second, 50*time.Millisecond, "the standby leads")
	took := time.Since(handover)
	t.Logf("standby led %s after the leader began shutting down", took.Round(time.Millisecond))
	assert.Less(t, took, cfg.LeaseDuration, "the released Lease is taken at once, not after it expires")
	assert.Contains(t, logs.String(), "leading: this replica talks to the server and applies")

	b.cancel()
	select {
	case err := <-b.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("the second replica: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("Run did not return after ctx was done")
	}
}

// The Lease is renewed through a client of its own: with the agent's
// workload-cluster client throttled to 2 requests a second and 40
// requests always waiting in it (each waits about 20 s), the leader
// still renews its Lease every retry period and keeps leading, where a
// renewal queued behind them would wait out its 4 s deadline and end the
// term (Run returning lease.ErrLost).
func TestTheLeaseIsRenewedBesideAFloodedClient(t *testing.T) {
	full, cs := workloadCluster(t)
	ctx := context.Background()
	_, err := cs.CoreV1().ConfigMaps("relaymesh").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName},
		Data: map[string]string{"cluster": "flooded", "serverAddress": "127.0.0.1:1"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	slow := rest.CopyConfig(full.Config)
	slow.QPS, slow.Burst = 2, 2
	typed, err := kubernetes.NewForConfig(slow)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(slow)
	require.NoError(t, err)
	kube := &kubeclient.Clients{Config: slow, Typed: typed, Dynamic: dyn}

	cfg := Default()
	cfg.HealthListen, cfg.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 6*time.Second, 4*time.Second, 500*time.Millisecond
	cfg.Identity = "agent-flooded"
	var logs syncbuf.Buffer
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Env{Kube: kube, Stderr: &logs, Version: "test"}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(40 * time.Second):
			t.Error("Run did not return after ctx was done")
		}
	})
	renewed := func() (string, time.Time) {
		l, err := cs.CoordinationV1().Leases("relaymesh").Get(ctx, cfg.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil {
			return "", time.Time{}
		}
		return *l.Spec.HolderIdentity, l.Spec.RenewTime.Time
	}
	require.Eventually(t, func() bool { h, _ := renewed(); return h == "agent-flooded" }, 20*time.Second, 50*time.Millisecond, "the agent leads")

	floodCtx, stopFlood := context.WithCancel(ctx)
	var flood sync.WaitGroup
	for range 40 {
		flood.Go(func() {
			for floodCtx.Err() == nil {
				_, _ = typed.CoreV1().ConfigMaps("relaymesh").Get(floodCtx, ConfigMapName, metav1.GetOptions{})
			}
		})
	}
	defer func() { stopFlood(); flood.Wait() }()
	time.Sleep(2 * time.Second)
	probe := time.Now()
	_, err = typed.CoreV1().ConfigMaps("relaymesh").Get(ctx, ConfigMapName, metav1.GetOptions{})
	require.NoError(t, err)
	queued := time.Since(probe)
	require.Greater(t, queued, cfg.RenewDeadline, "the flood queues the agent's client beyond the renew deadline")

	// Two lease durations of flood: the renewals go on, the term does not end.
	_, last := renewed()
	for end := time.Now().Add(2 * cfg.LeaseDuration); time.Now().Before(end); time.Sleep(cfg.RetryPeriod) {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("Run returned during the flood: %v", err)
		default:
		}
		h, at := renewed()
		if h == "" {
			continue // this read failed: the next one tells
		}
		require.Equal(t, "agent-flooded", h, "the agent keeps the Lease")
		require.Less(t, time.Since(at), cfg.RenewDeadline, "the Lease was renewed %s ago, with the agent's client %s deep", time.Since(at).Round(time.Millisecond), queued.Round(time.Millisecond))
		last = at
	}
	t.Logf("renewed %s before the flood ended, the agent's client queued %s", time.Since(last).Round(time.Millisecond), queued.Round(time.Millisecond))
}
