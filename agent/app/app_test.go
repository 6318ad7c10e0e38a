package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
