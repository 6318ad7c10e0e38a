package dataplane_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/test/dataplane"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// Numbers of the traffic checks.
const (
	batch     = 2000 // RPCs per measured split
	tolerance = 5.0  // percentage points
	probe     = 200  // RPCs per settling probe
	settle    = 30 * time.Second
)

// fixture is cluster-1 with an istiod, two versions of the echo server and
// two clients with different service accounts, and cluster-2 with its own
// istiod and a third version of echo. Both meshes' intermediates come
// from one root, and Pod IPs are unique across the clusters (one flat
// pod network).
type fixture struct {
	env             *dataplane.Env
	c               *dataplane.Cluster
	envTook         time.Duration
	workloadsTook   time.Duration
	v1, v2          *dataplane.Workload
	c2              *dataplane.Cluster  // cluster-2
	v3              *dataplane.Workload // echo in cluster-2
	sleep2          *dataplane.Workload // a client in cluster-2
	ping1, ping2    *dataplane.Workload // the ping servers of cluster-1 and cluster-2
	sleep, other    *dataplane.Workload
	toEcho, fromOth *dataplane.Client
}

const (
	ns       = "apps"
	echoPort = 7070
)

// shared is the one fixture of the package's traffic tests: starting
// clusters and istiod once keeps `go test ./test/dataplane/...` short.
var shared struct {
	once sync.Once
	f    *fixture
	err  error
	dir  string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := stopRelaymesh(); err != nil {
		fmt.Fprintln(os.Stderr, "stop relaymesh:", err)
		code = 1
	}
	if shared.f != nil {
		if err := shared.f.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop the data plane:", err)
			code = 1
		}
	}
	switch {
	case shared.dir == "":
	case code != 0:
		// istiod, relaymesh and workload files stay for a post-mortem.
		fmt.Fprintln(os.Stderr, "the data plane's files (istiod logs, certificates) are kept in", shared.dir)
	default:
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// sharedFixture starts the fixture on first use; a test that uses it shows
// istiod's log when it fails.
func sharedFixture(t *testing.T) *fixture {
	t.Helper()
	localcluster.SkipIfShort(t)
	shared.once.Do(func() { shared.f, shared.err = startFixture() })
	require.NoError(t, shared.err)
	f := shared.f
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod log (last lines):\n%s", f.c.Istiod().LogTail(40))
		}
	})
	t.Logf("fixture: cluster and istiod ready after %s; cluster-1's workloads registered, certified and serving %s later", f.envTook, f.workloadsTook)
	f.baseline(t)
	return f
}

// workloadConfigs are the fixture's workloads: two versions of the echo
// server (service account echo) and two clients, sleep and other. Every
// echo server listens on echoPort of its own address, as Pods of a
// Deployment do.
var workloadConfigs = []dataplane.WorkloadConfig{
	{Name: "echo-v1", Namespace: ns, ServiceAccount: "echo", Labels: map[string]string{"app": "echo", "version": "v1"}, Serve: true, Port: echoPort},
	{Name: "echo-v2", Namespace: ns, ServiceAccount: "echo", Labels: map[string]string{"app": "echo", "version": "v2"}, Serve: true, Port: echoPort},
	{Name: "sleep", Namespace: ns, ServiceAccount: "sleep", Labels: map[string]string{"app": "sleep"}},
	{Name: "other", Namespace: ns, ServiceAccount: "other", Labels: map[string]string{"app": "other"}},
}

// cluster2Configs are cluster-2's workloads: a third version of echo, and a
// client.
var cluster2Configs = []dataplane.WorkloadConfig{
	{Name: "echo-v3", Namespace: ns, ServiceAccount: "echo", Labels: map[string]string{"app": "echo", "version": "v3"}, Serve: true, Port: echoPort},
	{Name: "sleep", Namespace: ns, ServiceAccount: "sleep", Labels: map[string]string{"app": "sleep"}},
}

// pingConfig is the ping server of a cluster: it ends every connection
// after pingConnectionAge, so clients handshake again every second or so
// (the root rotation test calls it under load).
func pingConfig(cluster string) dataplane.WorkloadConfig {
	return dataplane.WorkloadConfig{Name: "ping-" + strings.TrimPrefix(cluster, "cluster-"), Namespace: ns, ServiceAccount: "ping",
		Labels: map[string]string{"app": "ping"}, Serve: true, Port: echoPort, MaxConnectionAge: pingConnectionAge}
}

const pingConnectionAge = time.Second

// pingService is the ping Service of both clusters.
var pingService = dataplane.ServiceConfig{Name: "ping", Namespace: ns, Selector: map[string]string{"app": "ping"}, Port: echoPort, TargetPort: echoPort}

// echoService is the echo Service of both clusters.
var echoService = dataplane.ServiceConfig{Name: "echo", Namespace: ns, Selector: map[string]string{"app": "echo"}, Port: echoPort, TargetPort: echoPort}

func startFixture() (_ *fixture, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if shared.dir, err = os.MkdirTemp("", "dataplane-"); err != nil {
		return nil, err
	}
	start := time.Now()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	env, err := dataplane.StartEnv(ctx, dataplane.EnvConfig{Dir: shared.dir, Clusters: []string{"cluster-1", "cluster-2"}, Others: []string{"mgmt"}, Log: log})
	if err != nil {
		return nil, err
	}
	f := &fixture{env: env, c: env.Cluster("cluster-1"), envTook: time.Since(start).Round(time.Millisecond)}
	defer func() {
		if err != nil {
			err = errors.Join(err, env.Stop())
		}
	}()
	c := f.c
	if err := c.Namespace(ctx, ns, map[string]string{"istio-injection": "enabled"}); err != nil {
		return nil, err
	}
	if err := c.Service(ctx, echoService); err != nil {
		return nil, err
	}
	start = time.Now()
	ws := make([]*dataplane.Workload, len(workloadConfigs))
	for i, cfg := range workloadConfigs {
		if ws[i], err = c.StartWorkload(ctx, cfg); err != nil {
			return nil, err
		}
	}
	f.workloadsTook = time.Since(start).Round(time.Millisecond)
	f.v1, f.v2, f.sleep, f.other = ws[0], ws[1], ws[2], ws[3]
	// cluster-2 runs a third version of echo, for the cross-cluster checks.
	f.c2 = env.Cluster("cluster-2")
	if err := f.c2.Namespace(ctx, ns, map[string]string{"istio-injection": "enabled"}); err != nil {
		return nil, err
	}
	if err := f.c2.Service(ctx, echoService); err != nil {
		return nil, err
	}
	if f.v3, err = f.c2.StartWorkload(ctx, cluster2Configs[0]); err != nil {
		return nil, err
	}
	if f.sleep2, err = f.c2.StartWorkload(ctx, cluster2Configs[1]); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		c *dataplane.Cluster
		w **dataplane.Workload
	}{{c, &f.ping1}, {f.c2, &f.ping2}} {
		if err := p.c.Service(ctx, pingService); err != nil {
			return nil, err
		}
		if *p.w, err = p.c.StartWorkload(ctx, pingConfig(p.c.Name())); err != nil {
			return nil, err
		}
	}
	if f.toEcho, err = f.sleep.Dial("echo", ns, echoPort); err != nil {
		return nil, err
	}
	if f.fromOth, err = f.other.Dial("echo", ns, echoPort); err != nil {
		return nil, err
	}
	return f, nil
}

// settle runs probes until ok holds of one, so that a measurement starts
// after istiod's push took effect; it fails the test after `settle`.
func (f *fixture) settle(t *testing.T, c *dataplane.Client, what string, opts dataplane.CallOptions, ok func(*dataplane.Outcomes) bool) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	start := time.Now()
	var last *dataplane.Outcomes
	for ctx.Err() == nil {
		o, err := c.Run(ctx, probe, opts)
		require.NoError(t, err)
		if ok(o) {
			took := time.Since(start)
			t.Logf("settled: %s after %s", what, took.Round(time.Millisecond))
			return took
		}
		last = o
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s; last probe: %v", what, settle, last)
	return 0
}

// apply writes Istio objects into cluster-1 for the rest of the (sub)test;
// at its end they are deleted and the next check waits for the baseline
// again.
func (f *fixture) apply(t *testing.T, manifest string) { f.applyTo(t, f.c, manifest) }

// applyTo is apply for any of the fixture's clusters.
func (f *fixture) applyTo(t *testing.T, c *dataplane.Cluster, manifest string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.Apply(ctx, manifest))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, c.Delete(ctx, manifest))
		f.baseline(t)
	})
}

// baseline waits until no policy is in effect (both versions answer: the
// client has the listener, route, cluster and both endpoints): round robin over both
// versions, every call OK. (Connections established over mTLS stay mTLS
// after the PeerAuthentication and DestinationRule are gone: neither the
// gRPC client nor the server tears down a working connection when the
// TLS configuration changes, so the peer is not part of the baseline.)
func (f *fixture) baseline(t *testing.T) {
	t.Helper()
	f.settle(t, f.toEcho, "the baseline (no policy)", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		v1 := o.Percent(o.Version("v1"))
		return o.Failed() == 0 && v1 > 35 && v1 < 65
	})
}

func run(t *testing.T, c *dataplane.Client, n int, opts dataplane.CallOptions) *dataplane.Outcomes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o, err := c.Run(ctx, n, opts)
	require.NoError(t, err)
	require.Equal(t, n, o.Total())
	t.Logf("%s", o)
	return o
}

// bothVersions: cluster-1's two echo servers both answered.
func bothVersions(o *dataplane.Outcomes) bool { return o.Version("v1") > 0 && o.Version("v2") > 0 }

// within asserts got is within tolerance points of want.
func within(t *testing.T, want, got float64, what string) {
	t.Helper()
	assert.InDelta(t, want, got, tolerance, "%s: %.1f%%, want %.0f%% ± %.0f", what, got, want, tolerance)
}
