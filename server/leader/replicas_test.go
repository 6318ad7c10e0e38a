package leader_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// A replica's Lease lives while it runs and is deleted as it stops, so a
// rollout (new pod names each time) leaves none behind; a replica that
// crashed leaves its Lease, which the leader deletes once it has been
// expired for GoneAfter — unless the replica renewed it meanwhile.
func TestReplicaLeasesDoNotPileUp(t *testing.T) {
	const ns = "relaymesh"
	mgmt, _, _ := localcluster.Management(t, ns)
	cs, err := kubernetes.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	leases := cs.CoordinationV1().Leases(ns)

	hctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		leader.Heartbeat(hctx, leader.HeartbeatConfig{Client: cs, Namespace: ns, Replica: "pod-a", Period: time.Second, Logger: log})
		close(done)
	}()
	require.Eventually(t, func() bool {
		alive, err := leader.Alive(ctx, cs, ns)
		return err == nil && alive["pod-a"]
	}, 10*time.Second, 50*time.Millisecond, "a running replica is alive")
	stop()
	<-done
	_, err = leases.Get(ctx, leader.ReplicaLeaseName("pod-a"), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "a stopped replica deleted its Lease: %v", err)

	// Crashed replicas: one expired long ago, one expired a moment ago,
	// one alive; and a Lease of the same label not written by Heartbeat.
	now := time.Now()
	lease := func(name string, renewed time.Time, complete bool) {
		secs := int32(15)
		holder := name
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leader.ReplicaLeaseName(name), Labels: map[string]string{leader.ReplicaLabel: "true"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
		if complete {
			l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &secs, &metav1.MicroTime{Time: renewed}
		}
		_, err := leases.Create(ctx, l, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	lease("crashed-long-ago", now.Add(-leader.GoneAfter-time.Minute), true)
	lease("crashed-just-now", now.Add(-time.Minute), true)
	lease("alive", now, true)
	lease("hand-made", time.Time{}, false)

	gone, err := leader.CollectGone(ctx, cs, ns, now)
	require.NoError(t, err)
	assert.Equal(t, []string{leader.ReplicaLeaseName("crashed-long-ago")}, gone)
	list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: leader.ReplicaLabel + "=true"})
	require.NoError(t, err)
	var left []string
	for _, l := range list.Items {
		left = append(left, l.Name)
	}
	assert.ElementsMatch(t, []string{leader.ReplicaLeaseName("crashed-just-now"), leader.ReplicaLeaseName("alive"), leader.ReplicaLeaseName("hand-made")}, left)

	// Collected later, after it came back and renewed: kept.
	lease("came-back", now.Add(-leader.GoneAfter-time.Minute), true)
	go leader.Heartbeat(t.Context(), leader.HeartbeatConfig{Client: cs, Namespace: ns, Replica: "came-back", Period: time.Second, Logger: log})
	require.Eventually(t, func() bool {
		alive, err := leader.Alive(ctx, cs, ns)
		return err == nil && alive["came-back"]
	}, 10*time.Second, 50*time.Millisecond)
	gone, err = leader.CollectGone(ctx, cs, ns, time.Now())
	require.NoError(t, err)
	assert.NotContains(t, gone, leader.ReplicaLeaseName("came-back"), "a renewed Lease is kept")
}

// A renewal that hangs (an apiserver too loaded to answer) does not let
// the Lease lapse: the failed attempt is tried again at once rather than a
// period later, so the leader never counts a live replica gone, and with
// it sweeps the sessions it holds.
func TestAHungRenewalDoesNotLetTheLeaseLapse(t *testing.T) {
	const ns = "relaymesh"
	mgmt, _, _ := localcluster.Management(t, ns)
	cfg := mgmt.RESTConfig()
	var gets atomic.Int32
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/leases/"+leader.ReplicaLeaseName("slow")) && gets.Add(1) == 3 {
				<-r.Context().Done() // the second renewal hangs until it times out
				return nil, r.Context().Err()
			}
			return rt.RoundTrip(r)
		})
	}
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	const period = time.Second
	go leader.Heartbeat(t.Context(), leader.HeartbeatConfig{Client: cs, Namespace: ns, Replica: "slow", Period: period,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})

	// Every renewal the Lease records, until the one after the hang.
	admin, err := kubernetes.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	var renewed []time.Time
	var duration time.Duration
	require.Eventually(t, func() bool {
		l, err := admin.CoordinationV1().Leases(ns).Get(t.Context(), leader.ReplicaLeaseName("slow"), metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return false
		}
		duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		if n := len(renewed); n == 0 || !renewed[n-1].Equal(l.Spec.RenewTime.Time) {
			renewed = append(renewed, l.Spec.RenewTime.Time)
		}
		return gets.Load() > 4
	}, 20*time.Second, 10*time.Millisecond, "renewals go on after the hung one")
	require.GreaterOrEqual(t, len(renewed), 3)
	for i := 1; i < len(renewed); i++ {
		gap := renewed[i].Sub(renewed[i-1])
		assert.Less(t, gap, duration-period/2, "renewal %d came %s after the one before; the Lease lasts %s", i, gap, duration)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
