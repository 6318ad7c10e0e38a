package dataplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/relaymesh/relaymesh/test/dataplane"
)

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
	f := sharedFixture(t)

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
		f.settle(t, plain, "mTLS to both versions", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
			return o.Code(codes.OK) == o.Total() && bothVersions(o)
		})
		o = run(t, plain, batch/4, dataplane.CallOptions{})
		assert.Equal(t, batch/4, o.Peer(f.sleep.SPIFFEID()), "every call arrived over mTLS with sleep's certificate")
		assert.Positive(t, o.Version("v1"))
		assert.Positive(t, o.Version("v2"))
	})

	t.Run("AuthorizationPolicy: the allowed service account gets OK, another PermissionDenied", func(t *testing.T) {
		f.apply(t, strictMTLS)
		f.settle(t, f.fromOth, "mTLS from other", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
			return o.Peer(f.other.SPIFFEID()) == o.Total() && bothVersions(o)
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
			return o.Peer(f.sleep.SPIFFEID()) == o.Total() && bothVersions(o)
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
