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
		checkShift(t, f, func(t *testing.T) {
			f.apply(t, subsetsDR+"---"+echoVS(`
  - route:
    - {destination: {host: echo.apps.svc.cluster.local, subset: v1}, weight: 80}
    - {destination: {host: echo.apps.svc.cluster.local, subset: v2}, weight: 20}`))
		})
	})

	t.Run("header match routes to a subset", func(t *testing.T) {
		checkHeaderMatch(t, f, func(t *testing.T) {
			f.apply(t, subsetsDR+"---"+echoVS(`
  - match: [{headers: {x-canary: {exact: "yes"}}}]
    route: [{destination: {host: echo.apps.svc.cluster.local, subset: v2}}]
  - route: [{destination: {host: echo.apps.svc.cluster.local, subset: v1}}]`))
		})
	})

	t.Run("fault injection aborts 30%", func(t *testing.T) {
		checkAbort(t, f, func(t *testing.T) {
			f.apply(t, echoVS(`
  - fault: {abort: {httpStatus: 503, percentage: {value: 30}}}
    route: [{destination: {host: echo.apps.svc.cluster.local}}]`))
		})
	})

	t.Run("request timeout", func(t *testing.T) {
		checkTimeout(t, f, func(t *testing.T) {
			f.apply(t, echoVS(`
  - timeout: 250ms
    route: [{destination: {host: echo.apps.svc.cluster.local}}]`))
		})
	})

	t.Run("mTLS: STRICT needs ISTIO_MUTUAL, and the server sees the client's identity", func(t *testing.T) {
		o := run(t, f.toEcho, 50, dataplane.CallOptions{})
		require.Equal(t, 50, o.Peer(""), "before: plaintext, the server sees no identity")
		f.apply(t, strictPeerAuthentication)
		// The server now requires TLS; a client that has not been told to
		// use it fails. New connections show it: dial again.
		plain, err := f.sleep.Dial("echo", ns, echoPort)
		require.NoError(t, err)
		f.settle(t, plain, "STRICT refuses plaintext", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == 0 })
		o = run(t, plain, 100, dataplane.CallOptions{})
		assert.Equal(t, 100, o.Code(codes.Unavailable), "plaintext to a STRICT server fails")

		f.apply(t, istioMutualDR)
		// Cleanups run last first, and each waits for the baseline: the
		// DestinationRule's would wait while STRICT still holds, which
		// only the plaintext connections opened before it pass; one
		// dropped meanwhile reconnects in plaintext and is refused (seen
		// once under make test's load: 30 s of calls to v1 alone). So
		// STRICT goes first, and the DestinationRule's wait finds no
		// policy left.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			assert.NoError(t, f.c.Delete(ctx, strictPeerAuthentication))
		})
		f.settle(t, plain, "mTLS to both versions", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
			return o.Code(codes.OK) == o.Total() && bothVersions(o)
		})
		o = run(t, plain, batch/4, dataplane.CallOptions{})
		assert.Equal(t, batch/4, o.Peer(f.sleep.SPIFFEID()), "every call arrived over mTLS with sleep's certificate")
		assert.Positive(t, o.Version("v1"))
		assert.Positive(t, o.Version("v2"))
	})

	t.Run("AuthorizationPolicy: the allowed service account gets OK, another PermissionDenied", func(t *testing.T) {
		checkAccess(t, f, func(t *testing.T) { f.apply(t, strictPeerAuthentication+"---\n"+istioMutualDR) }, func(t *testing.T) {
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
		})
	})

	t.Run("certificate files are reloaded: a foreign root fails new handshakes, a re-issued certificate mends them", func(t *testing.T) {
		f.apply(t, strictPeerAuthentication+"---\n"+istioMutualDR)
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

// strictPeerAuthentication makes the apps namespace's servers require
// mTLS.
const strictPeerAuthentication = `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: apps}
spec: {mtls: {mode: STRICT}}
`

// istioMutualDR makes every client use mTLS to echo.
const istioMutualDR = `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: apps}
spec:
  host: echo.apps.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
`

// echoVS is the VirtualService "echo" with the given http routes.
func echoVS(http string) string {
	return `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: apps}
spec:
  hosts: [echo.apps.svc.cluster.local]
  http:` + http + "\n"
}
