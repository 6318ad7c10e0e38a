package dataplane_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/relaymesh/relaymesh/test/dataplane"
)

// Numbers of the traffic checks.
const (
	batch     = 2000 // RPCs per measured split
	tolerance = 5.0  // percentage points
	probe     = 200  // RPCs per settling probe
	settle    = 30 * time.Second
)

// fixture is one cluster with an istiod, two versions of the echo server
// and two clients with different service accounts.
type fixture struct {
	env             *dataplane.Env
	c               *dataplane.Cluster
	td              string
	v1, v2          *dataplane.Workload
	sleep, other    *dataplane.Workload
	toEcho, fromOth *dataplane.Client
}

const (
	ns       = "apps"
	echoPort = 7070
)

func startFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	env, err := dataplane.StartEnv(ctx, dataplane.EnvConfig{Dir: t.TempDir(), Clusters: []string{"cluster-1"}, Others: []string{"mgmt"}, Log: log})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	c := env.Cluster("cluster-1")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod log (last lines):\n%s", c.Istiod().LogTail(40))
		}
	})
	t.Logf("cluster and istiod ready after %s", time.Since(start).Round(time.Millisecond))

	require.NoError(t, c.Namespace(ctx, ns, map[string]string{"istio-injection": "enabled"}))
	require.NoError(t, c.Service(ctx, dataplane.ServiceConfig{Name: "echo", Namespace: ns, Selector: map[string]string{"app": "echo"}, Port: echoPort}))
	f := &fixture{env: env, c: c, td: c.Istiod().TrustDomain()}
	start = time.Now()
	for _, w := range []struct {
		into *(*dataplane.Workload)
		cfg  dataplane.WorkloadConfig
	}{
		{&f.v1, dataplane.WorkloadConfig{Name: "echo-v1", Namespace: ns, ServiceAccount: "echo", Labels: map[string]string{"app": "echo", "version": "v1"}, Serve: true}},
		{&f.v2, dataplane.WorkloadConfig{Name: "echo-v2", Namespace: ns, ServiceAccount: "echo", Labels: map[string]string{"app": "echo", "version": "v2"}, Serve: true}},
		{&f.sleep, dataplane.WorkloadConfig{Name: "sleep", Namespace: ns, ServiceAccount: "sleep", Labels: map[string]string{"app": "sleep"}}},
		{&f.other, dataplane.WorkloadConfig{Name: "other", Namespace: ns, ServiceAccount: "other", Labels: map[string]string{"app": "other"}}},
	} {
		*w.into, err = c.StartWorkload(ctx, w.cfg)
		require.NoError(t, err, w.cfg.Name)
	}
	t.Logf("4 workloads registered, certified and serving after %s", time.Since(start).Round(time.Millisecond))
	f.toEcho, err = f.sleep.Dial("echo", ns, echoPort)
	require.NoError(t, err)
	f.fromOth, err = f.other.Dial("echo", ns, echoPort)
	require.NoError(t, err)
	// Both versions answer before anything is measured: the client has
	// the listener, route, cluster and both endpoints.
	f.baseline(t)
	return f
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
			return time.Since(start)
		}
		last = o
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s; last probe: %v", what, settle, last)
	return 0
}

// apply writes Istio objects for the rest of the (sub)test; at its end they
// are deleted and the next check waits for the baseline again.
func (f *fixture) apply(t *testing.T, manifest string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, f.c.Apply(ctx, manifest))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, f.c.Delete(ctx, manifest))
		f.baseline(t)
	})
}

// baseline waits until no policy is in effect: round robin over both
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

// within asserts got is within tolerance points of want.
func within(t *testing.T, want, got float64, what string) {
	t.Helper()
	assert.InDelta(t, want, got, tolerance, "%s: %.1f%%, want %.0f%% ± %.0f", what, got, want, tolerance)
}

const subsetsDR = `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: apps}
spec:
  host: echo.apps.svc.cluster.local
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
`

// TestTraffic proves Istio routing, faults, timeouts, mTLS and RBAC with
// counted RPCs between proxyless gRPC workloads of one cluster, configured
// by a real istiod from Istio objects written to the cluster.
func TestTraffic(t *testing.T) {
	f := startFixture(t)

	t.Run("no policy: no 80/20 split", func(t *testing.T) {
		o := run(t, f.toEcho, batch, dataplane.CallOptions{})
		require.Zero(t, o.Failed())
		// Round robin over the two endpoints: far from 80/20.
		assert.Greater(t, o.Percent(o.Version("v2")), 20+3*tolerance, "without a VirtualService v2 gets its round-robin share")
		assert.Less(t, o.Percent(o.Version("v1")), 80-3*tolerance)
	})

	t.Run("traffic shift 80/20 between subsets", func(t *testing.T) {
		f.apply(t, subsetsDR+`---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: apps}
spec:
  hosts: [echo.apps.svc.cluster.local]
  http:
  - route:
    - {destination: {host: echo.apps.svc.cluster.local, subset: v1}, weight: 80}
    - {destination: {host: echo.apps.svc.cluster.local, subset: v2}, weight: 20}
`)
		took := f.settle(t, f.toEcho, "the split", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
			return o.Failed() == 0 && o.Percent(o.Version("v2")) < 35
		})
		t.Logf("the split took effect %s after the VirtualService was written", took.Round(time.Millisecond))
		o := run(t, f.toEcho, batch, dataplane.CallOptions{})
		require.Zero(t, o.Failed())
		within(t, 80, o.Percent(o.Version("v1")), "v1")
		within(t, 20, o.Percent(o.Version("v2")), "v2")
	})

	t.Run("header match routes to a subset", func(t *testing.T) {
		f.apply(t, subsetsDR+`---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: apps}
spec:
  hosts: [echo.apps.svc.cluster.local]
  http:
  - match: [{headers: {x-canary: {exact: "yes"}}}]
    route: [{destination: {host: echo.apps.svc.cluster.local, subset: v2}}]
  - route: [{destination: {host: echo.apps.svc.cluster.local, subset: v1}}]
`)
		canary := dataplane.CallOptions{Headers: map[string]string{"x-canary": "yes"}}
		f.settle(t, f.toEcho, "header route", canary, func(o *dataplane.Outcomes) bool { return o.Version("v2") == o.Total() })
		f.settle(t, f.toEcho, "default route", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Version("v1") == o.Total() })
		o := run(t, f.toEcho, batch/4, canary)
		assert.Equal(t, batch/4, o.Version("v2"), "x-canary: yes goes to v2 only")
		o = run(t, f.toEcho, batch/4, dataplane.CallOptions{Headers: map[string]string{"x-canary": "no"}})
		assert.Equal(t, batch/4, o.Version("v1"), "another value goes to v1 only")
		o = run(t, f.toEcho, batch/4, dataplane.CallOptions{})
		assert.Equal(t, batch/4, o.Version("v1"), "no header goes to v1 only")
	})

	t.Run("fault injection aborts 30%", func(t *testing.T) {
		f.apply(t, `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: apps}
spec:
  hosts: [echo.apps.svc.cluster.local]
  http:
  - fault: {abort: {httpStatus: 503, percentage: {value: 30}}}
    route: [{destination: {host: echo.apps.svc.cluster.local}}]
`)
		f.settle(t, f.toEcho, "aborts", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Failed() > 0 })
		o := run(t, f.toEcho, batch, dataplane.CallOptions{})
		// HTTP 503 is gRPC UNAVAILABLE (the HTTP-to-gRPC status mapping).
		within(t, 30, o.Percent(o.Code(codes.Unavailable)), "aborted (UNAVAILABLE)")
		assert.Equal(t, batch, o.Code(codes.OK)+o.Code(codes.Unavailable), "only OK and the injected UNAVAILABLE")
	})

	t.Run("request timeout", func(t *testing.T) {
		slow := dataplane.CallOptions{Request: dataplane.Request{Delay: time.Second}, Concurrency: 20}
		// Without a route timeout, a slow answer is still an answer.
		o := run(t, f.toEcho, 20, slow)
		require.Equal(t, 20, o.Code(codes.OK), "no timeout: slow calls succeed")
		f.apply(t, `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: apps}
spec:
  hosts: [echo.apps.svc.cluster.local]
  http:
  - timeout: 250ms
    route: [{destination: {host: echo.apps.svc.cluster.local}}]
`)
		f.settle(t, f.toEcho, "timeouts", dataplane.CallOptions{Request: dataplane.Request{Delay: time.Second}, Concurrency: 50}, func(o *dataplane.Outcomes) bool {
			return o.Code(codes.DeadlineExceeded) == o.Total()
		})
		start := time.Now()
		o = run(t, f.toEcho, 40, slow)
		assert.Equal(t, 40, o.Code(codes.DeadlineExceeded), "a 1s answer exceeds the route's 250ms")
		assert.Less(t, time.Since(start), 2*time.Second, "calls ended at the route timeout, not the answer")
		o = run(t, f.toEcho, batch/4, dataplane.CallOptions{})
		assert.Equal(t, batch/4, o.Code(codes.OK), "fast calls are unaffected")
	})

	t.Run("mTLS: STRICT needs ISTIO_MUTUAL, and the server sees the client's identity", func(t *testing.T) {
		o := run(t, f.toEcho, 50, dataplane.CallOptions{})
		require.Equal(t, 50, o.Peer(""), "before: plaintext, the server sees no identity")
		f.apply(t, `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: apps}
spec: {mtls: {mode: STRICT}}
`)
		// The server now requires TLS; a client that has not been told to
		// use it fails. New connections show it: dial again.
		plain, err := f.sleep.Dial("echo", ns, echoPort)
		require.NoError(t, err)
		f.settle(t, plain, "STRICT refuses plaintext", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == 0 })
		o = run(t, plain, 100, dataplane.CallOptions{})
		assert.Equal(t, 100, o.Code(codes.Unavailable), "plaintext to a STRICT server fails")

		f.apply(t, `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: apps}
spec:
  host: echo.apps.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
`)
		f.settle(t, plain, "mTLS", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == o.Total() })
		o = run(t, plain, batch/4, dataplane.CallOptions{})
		assert.Equal(t, batch/4, o.Peer(f.sleep.SPIFFEID()), "every call arrived over mTLS with sleep's certificate")
		assert.Positive(t, o.Version("v1"))
		assert.Positive(t, o.Version("v2"))
	})

	t.Run("AuthorizationPolicy: the allowed service account gets OK, another PermissionDenied", func(t *testing.T) {
		f.apply(t, strictMTLS)
		f.settle(t, f.fromOth, "mTLS from other", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
			return o.Peer(f.other.SPIFFEID()) == o.Total()
		})
		// Without a policy, both callers get through.
		o := run(t, f.fromOth, batch/4, dataplane.CallOptions{})
		require.Equal(t, batch/4, o.Code(codes.OK), "no AuthorizationPolicy: other is allowed")

		f.apply(t, `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: echo, namespace: apps}
spec:
  selector: {matchLabels: {app: echo}}
  rules:
  - from: [{source: {principals: [`+strings.TrimPrefix(f.sleep.SPIFFEID(), "spiffe://")+`]}}]
    to: [{operation: {paths: ["`+dataplane.EchoMethod+`"]}}]
`)
		f.settle(t, f.fromOth, "the policy denies other", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
			return o.Code(codes.PermissionDenied) == o.Total()
		})
		o = run(t, f.fromOth, batch/2, dataplane.CallOptions{})
		assert.Equal(t, batch/2, o.Code(codes.PermissionDenied), "other is denied by the servers' RBAC")
		assert.Zero(t, o.Code(codes.OK))
		o = run(t, f.toEcho, batch/2, dataplane.CallOptions{})
		assert.Equal(t, batch/2, o.Peer(f.sleep.SPIFFEID()), "sleep, the allowed principal, gets OK over mTLS")
		assert.Positive(t, o.Version("v1"))
		assert.Positive(t, o.Version("v2"))
	})

	t.Run("certificate files are reloaded: a foreign root fails new handshakes, a re-issued certificate mends them", func(t *testing.T) {
		f.apply(t, strictMTLS)
		f.settle(t, f.toEcho, "mTLS", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
			return o.Peer(f.sleep.SPIFFEID()) == o.Total()
		})
		foreign, err := dataplane.NewRoot("foreign")
		require.NoError(t, err)
		require.NoError(t, f.sleep.WriteRoots(foreign.PEM()))
		t.Cleanup(func() { assert.NoError(t, f.sleep.RenewCertificate(context.Background())) })
		// gRPC's file watcher rereads the files every second; a new
		// connection then verifies the servers against the foreign root.
		fresh := func() *dataplane.Outcomes {
			c, err := f.sleep.Dial("echo", ns, echoPort)
			require.NoError(t, err)
			defer c.Close()
			return run(t, c, 50, dataplane.CallOptions{})
		}
		start := time.Now()
		var o *dataplane.Outcomes
		for o = fresh(); o.Code(codes.OK) > 0 && time.Since(start) < settle; o = fresh() {
			time.Sleep(250 * time.Millisecond)
		}
		assert.Equal(t, 50, o.Code(codes.Unavailable), "a server certificate from another root is refused")
		t.Logf("the foreign root took effect for new connections after %s", time.Since(start).Round(time.Millisecond))
		// Established connections keep their handshake: a root rotation
		// does not cut traffic that is already flowing.
		o = run(t, f.toEcho, 100, dataplane.CallOptions{})
		assert.Equal(t, 100, o.Code(codes.OK), "established connections are not torn down")

		require.NoError(t, f.sleep.RenewCertificate(context.Background()))
		start = time.Now()
		for o = fresh(); o.Code(codes.OK) < 50 && time.Since(start) < settle; o = fresh() {
			time.Sleep(250 * time.Millisecond)
		}
		assert.Equal(t, 50, o.Peer(f.sleep.SPIFFEID()), "the re-issued files from istiod work again")
	})
}

// strictMTLS makes the echo servers require mTLS and every client use it.
const strictMTLS = `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: apps}
spec: {mtls: {mode: STRICT}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: apps}
spec:
  host: echo.apps.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
`
