package lease_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/lease"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// cutTransport fails every request while cut: the replica is cut off from
// the apiserver (the real one keeps running for the others).
type cutTransport struct {
	next http.RoundTripper
	cut  *atomic.Bool
}

func (c cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("cut off from the apiserver (test)")
	}
	return c.next.RoundTrip(r)
}

type replica struct {
	name    string
	e       *lease.Elector
	cut     atomic.Bool
	running atomic.Int32 // tasks running now
	terms   atomic.Int32
	cancel  context.CancelFunc
	done    chan struct{}
}

func startReplica(t *testing.T, cfg *rest.Config, name string, overlap *atomic.Int32) *replica {
	t.Helper()
	r := &replica{name: name, done: make(chan struct{})}
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return cutTransport{next: rt, cut: &r.cut} }
	cfg.Timeout = 2 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	r.e, err = lease.New(lease.Config{Client: cs, Namespace: "relaymesh", Name: "relaymesh-server", Identity: name,
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond})
	require.NoError(t, err)
	r.e.Add(lease.Task{Name: "once", Run: func(ctx context.Context) {
		r.terms.Add(1)
		r.running.Add(1)
		if overlap.Add(1) > 1 {
			t.Errorf("%s: two replicas ran once-only work at the same time", name)
		}
		<-ctx.Done()
		overlap.Add(-1)
		r.running.Add(-1)
	}})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.e.Run(ctx); close(r.done) }()
	return r
}

func (r *replica) stop() { r.cancel(); <-r.done }

func leaders(rs []*replica) []string {
	var out []string
	for _, r := range rs {
		if r.running.Load() > 0 {
			out = append(out, r.name)
		}
	}
	return out
}

// Exactly one of three replicas runs the once-only work; it moves when the
// leader shuts down (at once: the Lease is released after the work
// stopped) and when the leader is cut off from the apiserver (after the
// lease duration; the cut-off replica stops its work first), and never
// runs on two replicas at once.
func TestOneLeaderAndFailover(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, cs, _ := localcluster.Management(t, "relaymesh")

	var overlap atomic.Int32
	rs := []*replica{startReplica(t, mgmt.RESTConfig(), "a", &overlap), startReplica(t, mgmt.RESTConfig(), "b", &overlap), startReplica(t, mgmt.RESTConfig(), "c", &overlap)}
	t.Cleanup(func() {
		for _, r := range rs {
			r.stop()
		}
	})
	one := func(msg string) *replica {
		t.Helper()
		var got []string
		require.Eventually(t, func() bool { got = leaders(rs); return len(got) == 1 }, 15*time.Second, 50*time.Millisecond, "%s: leaders %v", msg, got)
		for _, r := range rs {
			if r.name == got[0] {
				require.True(t, r.e.Leading())
				return r
			}
		}
		panic("unreachable")
	}
	first := one("at start")
	lease, err := cs.CoordinationV1().Leases("relaymesh").Get(ctx, "relaymesh-server", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, first.name, *lease.Spec.HolderIdentity)

	// A graceful stop hands over at once, not after the lease duration.
	start := time.Now()
	first.stop()
	rest := []*replica{}
	for _, r := range rs {
		if r != first {
			rest = append(rest, r)
		}
	}
	rs = append(rest, first) // first is stopped: never leads again
	second := one("after the leader stopped")
	handover := time.Since(start)
	t.Logf("graceful handover took %s", handover)
	assert.Less(t, handover, 4*time.Second, "a released Lease is taken within the retry period, not the lease duration")

	// Cut off from the apiserver: the leader stops its work within the renew
	// deadline; the other replica leads after the lease duration.
	start = time.Now()
	second.cut.Store(true)
	require.Eventually(t, func() bool { return second.running.Load() == 0 }, 6*time.Second, 50*time.Millisecond, "a replica that cannot renew stops its once-only work")
	stopped := time.Since(start)
	third := one("after the leader was cut off")
	took := time.Since(start)
	assert.NotEqual(t, second.name, third.name)
	t.Logf("cut-off leader stopped its work after %s; %s led after %s", stopped, third.name, took)
	assert.False(t, second.e.Leading())

	// Restored, it stands by: the leader keeps leading.
	second.cut.Store(false)
	time.Sleep(2 * time.Second)
	assert.Equal(t, []string{third.name}, leaders(rs))
	assert.Equal(t, int32(0), overlap.Load()-1, "exactly one task running")
}

func TestConfigRefusesBadTimings(t *testing.T) {
	cs := kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://127.0.0.1:1"})
	for name, cfg := range map[string]lease.Config{
		"no identity":           {Client: cs, Namespace: "n", Name: "l"},
		"no lease name":         {Client: cs, Namespace: "n", Identity: "a"},
		"renew over lease":      {Client: cs, Namespace: "n", Name: "l", Identity: "a", LeaseDuration: time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond},
		"retry over renew":      {Client: cs, Namespace: "n", Name: "l", Identity: "a", LeaseDuration: 10 * time.Second, RenewDeadline: time.Second, RetryPeriod: 2 * time.Second},
		"negative retry period": {Client: cs, Namespace: "n", Name: "l", Identity: "a", RetryPeriod: -time.Second},
	} {
		_, err := lease.New(cfg)
		assert.Error(t, err, name)
	}
	_, err := lease.New(lease.Config{Client: cs, Namespace: "n", Name: "l", Identity: "a"})
	assert.NoError(t, err)
}

// A leader that abstains (cut off from the snapshot store) gives the Lease
// up at once and does not campaign while it abstains; the others lead.
// When it stops abstaining it campaigns again, and stands by while another
// leads.
func TestAbstainingLeaderStepsDown(t *testing.T) {
	mgmt, _, _ := localcluster.Management(t, "relaymesh")
	var overlap atomic.Int32
	rs := []*replica{startReplica(t, mgmt.RESTConfig(), "a", &overlap), startReplica(t, mgmt.RESTConfig(), "b", &overlap)}
	t.Cleanup(func() {
		for _, r := range rs {
			r.stop()
		}
	})
	var got []string
	require.Eventually(t, func() bool { got = leaders(rs); return len(got) == 1 }, 15*time.Second, 50*time.Millisecond)
	first, other := rs[0], rs[1]
	if got[0] == "b" {
		first, other = rs[1], rs[0]
	}
	start := time.Now()
	first.e.Abstain(true)
	require.Eventually(t, func() bool { return other.running.Load() == 1 }, 4*time.Second, 20*time.Millisecond, "the other replica leads within the retry period, not the lease duration")
	t.Logf("abstaining leader handed over in %s", time.Since(start).Round(time.Millisecond))
	assert.False(t, first.e.Leading())
	assert.Equal(t, int32(0), first.running.Load())

	// The only one left: an abstaining replica still does not lead.
	other.stop()
	rs = []*replica{first}
	time.Sleep(3 * time.Second)
	assert.Empty(t, leaders(rs), "an abstaining replica never takes the Lease")
	first.e.Abstain(false)
	require.Eventually(t, func() bool { return first.running.Load() == 1 }, 10*time.Second, 20*time.Millisecond, "it campaigns again")
	assert.Equal(t, int32(2), first.terms.Load())
}

// oneTermReplica runs RunOneTerm the way the agent does: its task counts
// the replicas working at once, and it records when RunOneTerm returned
// and whether its task was still running then.
type oneTermReplica struct {
	*replica
	result       chan error
	runningAtEnd atomic.Int32
}

func startOneTermReplica(t *testing.T, cfg *rest.Config, name string, overlap *atomic.Int32) *oneTermReplica {
	t.Helper()
	r := &oneTermReplica{replica: &replica{name: name, done: make(chan struct{})}, result: make(chan error, 1)}
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return cutTransport{next: rt, cut: &r.cut} }
	cfg.Timeout = 2 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	r.e, err = lease.New(lease.Config{Client: cs, Namespace: "relaymesh", Name: "relaymesh-agent", Identity: name,
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond, StopWait: 10 * time.Second})
	require.NoError(t, err)
	r.e.Add(lease.Task{Name: "apply", Run: func(ctx context.Context) {
		r.terms.Add(1)
		r.running.Add(1)
		if overlap.Add(1) > 1 {
			t.Errorf("%s: two replicas applied at the same time", name)
		}
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond) // stopping takes a while
		overlap.Add(-1)
		r.running.Add(-1)
	}})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		err := r.e.RunOneTerm(ctx)
		r.runningAtEnd.Store(r.running.Load())
		r.result <- err
		close(r.done)
	}()
	return r
}

// RunOneTerm (the agent's election) leads for one term only: a leader cut
// off from the apiserver stops its work and only then returns ErrLost (the
// agent exits, and its supervisor restarts it as a standby); it never
// campaigns again in-process. A leader that shuts down stops its work
// before it releases the Lease, returns nil, and the standby takes over at
// once. Two replicas never work at the same time.
func TestOneTermEndsWhenTheLeaseIsLostAndNeverOverlaps(t *testing.T) {
	mgmt, _, _ := localcluster.Management(t, "relaymesh")
	var overlap atomic.Int32
	a, b := startOneTermReplica(t, mgmt.RESTConfig(), "a", &overlap), startOneTermReplica(t, mgmt.RESTConfig(), "b", &overlap)
	t.Cleanup(func() { a.stop(); b.stop() })
	working := func() []string { return leaders([]*replica{a.replica, b.replica}) }
	var got []string
	require.Eventually(t, func() bool { got = working(); return len(got) == 1 }, 15*time.Second, 50*time.Millisecond)
	first, standby := a, b
	if got[0] == "b" {
		first, standby = b, a
	}

	// Cut off: the term ends, the work stops, then RunOneTerm returns
	// ErrLost; the standby leads after the lease duration.
	first.cut.Store(true)
	var err error
	select {
	case err = <-first.result:
	case <-time.After(20 * time.Second):
		t.Fatal("RunOneTerm did not return after the Lease was lost")
	}
	require.ErrorIs(t, err, lease.ErrLost)
	assert.Equal(t, int32(0), first.runningAtEnd.Load(), "the work stopped before RunOneTerm returned")
	require.Eventually(t, func() bool { return standby.running.Load() == 1 }, 15*time.Second, 50*time.Millisecond, "the standby leads")
	first.cut.Store(false)
	time.Sleep(2 * time.Second)
	assert.Equal(t, int32(1), first.terms.Load(), "a replica that lost its term never campaigns again in-process")
	assert.Equal(t, []string{standby.name}, working())

	// Shutdown: the work stops before the Lease is released.
	start := time.Now()
	standby.cancel()
	select {
	case err = <-standby.result:
	case <-time.After(20 * time.Second):
		t.Fatal("RunOneTerm did not return after ctx was done")
	}
	require.NoError(t, err, "a shutdown is no lost Lease")
	assert.Equal(t, int32(0), standby.runningAtEnd.Load(), "the work stopped before RunOneTerm returned")
	t.Logf("shutdown returned after %s", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, int32(0), overlap.Load())
}
