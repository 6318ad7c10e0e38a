package discovery_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/discovery"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestConfigValidate(t *testing.T) {
	cs := fake.NewClientset()
	tests := []struct {
		name string
		cfg  discovery.Config
		errs []string // substrings, all reported at once
	}{
		{name: "valid", cfg: discovery.Config{Client: cs, Cluster: "cluster-1"}},
		{name: "valid with every field", cfg: discovery.Config{Client: cs, Cluster: "c", Resync: time.Hour, Debounce: time.Second, Logger: nil}},
		{name: "empty", cfg: discovery.Config{}, errs: []string{"client: required", "cluster: required"}},
		{name: "cluster not a DNS label", cfg: discovery.Config{Client: cs, Cluster: "Cluster_1"}, errs: []string{`cluster: "Cluster_1" is not a DNS label`}},
		{name: "negative durations", cfg: discovery.Config{Client: cs, Cluster: "c", Resync: -1, Debounce: -1}, errs: []string{"resync: must not be negative", "debounce: -1ns is outside"}},
		{name: "debounce too long", cfg: discovery.Config{Client: cs, Cluster: "c", Debounce: 2 * time.Minute}, errs: []string{"debounce: 2m0s is outside [0s, 1m0s]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			_, newErr := discovery.New(tt.cfg)
			if len(tt.errs) == 0 {
				assert.NoError(t, err)
				assert.NoError(t, newErr)
				return
			}
			require.Error(t, err)
			require.Error(t, newErr)
			for _, e := range tt.errs {
				assert.ErrorContains(t, err, e)
				assert.ErrorContains(t, newErr, e)
			}
		})
	}
}

// fakeRun starts a Discoverer on a fake clientset and waits until its
// caches have synced and all seven watches are open (the fake drops events
// sent before a watch starts).
func fakeRun(t *testing.T, debounce time.Duration, objs ...runtime.Object) (*fake.Clientset, *discovery.Discoverer, func() error) {
	t.Helper()
	cs := fake.NewClientset(objs...)
	watches := make(chan struct{}, 64)
	cs.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		watches <- struct{}{}
		return false, nil, nil // the default reactor serves it
	})
	d, err := discovery.New(discovery.Config{Client: cs, Cluster: cluster, Debounce: debounce})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			return fmt.Errorf("Run did not return")
		}
	})
	t.Cleanup(func() { _ = stop() })
	select {
	case <-d.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("caches did not sync")
	}
	for range 7 {
		select {
		case <-watches:
		case <-time.After(10 * time.Second):
			t.Fatal("watches did not start")
		}
	}
	return cs, d, stop
}

// waitChange waits for a value on Changes and returns how long it took.
func waitChange(t *testing.T, d *discovery.Discoverer, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-d.Changes():
		return time.Since(start)
	case <-time.After(timeout):
		t.Fatalf("no change within %v", timeout)
		return 0
	}
}

// noChange asserts that Changes stays quiet for a while.
func noChange(t *testing.T, d *discovery.Discoverer, quiet time.Duration) {
	t.Helper()
	select {
	case <-d.Changes():
		t.Fatal("unexpected change")
	case <-time.After(quiet):
	}
}

// TestDiscovererLifecycle: Snapshot before sync fails; after sync it holds
// the cluster; Run runs once; Changes honours the debounce, coalesces a
// burst, ignores unrelated ConfigMaps; cancelling ends Run with nil.
func TestDiscovererLifecycle(t *testing.T) {
	in := bookinfo()
	var objs []runtime.Object
	for _, o := range in.Namespaces {
		objs = append(objs, o)
	}
	for _, o := range in.Deployments {
		objs = append(objs, o)
	}
	reviews := service("bookinfo", "reviews", l("app", "reviews"))
	objs = append(objs, reviews)

	cs := fake.NewClientset()
	d, err := discovery.New(discovery.Config{Client: cs, Cluster: cluster})
	require.NoError(t, err)
	_, err = d.Snapshot()
	assert.ErrorIs(t, err, discovery.ErrNotSynced, "before Run")

	const debounce = 150 * time.Millisecond
	cs, d, stop := fakeRun(t, debounce, objs...)
	s, err := d.Snapshot()
	require.NoError(t, err)
	in.Services = []*corev1.Service{reviews}
	assertProto(t, discovery.Build(cluster, in), s, "the snapshot of the caches is Build of the objects")
	assert.ErrorIs(t, d.Run(context.Background()), discovery.ErrAlreadyRunning)

	ctx := context.Background()
	waitChange(t, d, 5*time.Second) // the initial list
	drainChanges(d, 2*debounce)     // handlers may still be delivering it

	t.Run("one event: one value, after the debounce", func(t *testing.T) {
		// Timed from before the event exists: the debounce starts when the
		// handler sees it, which on a loaded machine can be before Create
		// returns here (timed from after, 139 ms of a 150 ms debounce
		// once failed a 140 ms floor).
		sent := time.Now()
		_, err := cs.CoreV1().Services("bookinfo").Create(ctx, service("bookinfo", "reviews-v1", l("app", "reviews", "version", "v1")), metav1.CreateOptions{})
		require.NoError(t, err)
		waitChange(t, d, 5*time.Second)
		assert.GreaterOrEqual(t, time.Since(sent), debounce, "not before the debounce")
		s, err := d.Snapshot()
		require.NoError(t, err)
		assert.Len(t, s.Destinations, 2)
		noChange(t, d, 2*debounce)
	})

	t.Run("a burst coalesces", func(t *testing.T) {
		const burst = 40
		start := time.Now()
		for i := range burst {
			_, err := cs.CoreV1().Pods("bookinfo").Create(ctx, pod("bookinfo", fmt.Sprintf("p-%d", i), fmt.Sprintf("10.0.0.%d", i), l("app", "reviews", "version", "v1")), metav1.CreateOptions{})
			require.NoError(t, err)
		}
		took := time.Since(start)
		values := 0
		for quiet := false; !quiet; {
			select {
			case <-d.Changes():
				values++
			case <-time.After(3 * debounce):
				quiet = true
			}
		}
		limit := 2 + int(took/debounce)
		t.Logf("%d events in %v gave %d values (at most %d allowed)", burst, took.Round(time.Millisecond), values, limit)
		assert.GreaterOrEqual(t, values, 1)
		assert.LessOrEqual(t, values, limit)
		s, err := d.Snapshot()
		require.NoError(t, err)
		assert.Len(t, s.Destinations[0].Endpoints, burst, "no event lost")
	})

	t.Run("unrelated ConfigMaps are not changes; mesh configs are", func(t *testing.T) {
		_, err := cs.CoreV1().ConfigMaps("bookinfo").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "bookinfo", Name: "leader-election"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		noChange(t, d, 3*debounce)
		_, err = cs.CoreV1().ConfigMaps("istio-system").Create(ctx, configMap("istio-system", "istio", "trustDomain: new.local"), metav1.CreateOptions{})
		require.NoError(t, err)
		waitChange(t, d, 5*time.Second)
		s, err := d.Snapshot()
		require.NoError(t, err)
		assert.Equal(t, "new.local", s.Meshes[0].TrustDomain)
	})

	t.Run("deletes are changes", func(t *testing.T) {
		require.NoError(t, cs.CoreV1().Services("bookinfo").Delete(ctx, "reviews-v1", metav1.DeleteOptions{}))
		waitChange(t, d, 5*time.Second)
		s, err := d.Snapshot()
		require.NoError(t, err)
		assert.Len(t, s.Destinations, 1)
	})

	assert.NoError(t, stop(), "cancelling ends Run with nil")
}

// TestRunSyncFails: a context that ends before the caches sync makes Run
// fail with ErrNotSynced, and Synced stays open.
func TestRunSyncFails(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("the API server is away")
	})
	d, err := discovery.New(discovery.Config{Client: cs, Cluster: cluster})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = d.Run(ctx)
	assert.ErrorIs(t, err, discovery.ErrNotSynced)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	select {
	case <-d.Synced():
		t.Fatal("Synced closed")
	default:
	}
	_, err = d.Snapshot()
	assert.ErrorIs(t, err, discovery.ErrNotSynced)
}
