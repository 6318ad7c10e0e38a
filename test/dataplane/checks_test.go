package dataplane_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/relaymesh/relaymesh/test/dataplane"
)

// The checks TestTraffic (Istio objects written by hand) and
// TestTrafficFromRelaymeshPolicies (objects Relaymesh writes) share. Each
// starts from the baseline, calls configure to write its configuration for
// the rest of the subtest, waits until the traffic shows it, and asserts on
// a fresh batch of counted RPCs.

// checkShift: 80/20 between the subsets v1 and v2.
func checkShift(t *testing.T, f *fixture, configure func(*testing.T)) {
	start := time.Now()
	configure(t)
	f.settle(t, f.toEcho, "the split", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		return o.Failed() == 0 && o.Percent(o.Version("v2")) < 35
	})
	t.Logf("configuration to traffic: %s", time.Since(start).Round(time.Millisecond))
	o := run(t, f.toEcho, batch, dataplane.CallOptions{})
	require.Zero(t, o.Failed())
	within(t, 80, o.Percent(o.Version("v1")), "v1")
	within(t, 20, o.Percent(o.Version("v2")), "v2")
}

// checkHeaderMatch: `x-canary: yes` goes to v2, anything else to v1.
func checkHeaderMatch(t *testing.T, f *fixture, configure func(*testing.T)) {
	configure(t)
	canary := dataplane.CallOptions{Headers: map[string]string{"x-canary": "yes"}}
	f.settle(t, f.toEcho, "header route", canary, func(o *dataplane.Outcomes) bool { return o.Version("v2") == o.Total() })
	f.settle(t, f.toEcho, "default route", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Version("v1") == o.Total() })
	o := run(t, f.toEcho, batch/4, canary)
	assert.Equal(t, batch/4, o.Version("v2"), "x-canary: yes goes to v2 only")
	o = run(t, f.toEcho, batch/4, dataplane.CallOptions{Headers: map[string]string{"x-canary": "no"}})
	assert.Equal(t, batch/4, o.Version("v1"), "another value goes to v1 only")
	o = run(t, f.toEcho, batch/4, dataplane.CallOptions{})
	assert.Equal(t, batch/4, o.Version("v1"), "no header goes to v1 only")
}

// checkAbort: 30% of calls aborted with HTTP 503, which is gRPC
// UNAVAILABLE (the HTTP-to-gRPC status mapping).
func checkAbort(t *testing.T, f *fixture, configure func(*testing.T)) {
	configure(t)
	f.settle(t, f.toEcho, "aborts", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Failed() > 0 })
	o := run(t, f.toEcho, batch, dataplane.CallOptions{})
	within(t, 30, o.Percent(o.Code(codes.Unavailable)), "aborted (UNAVAILABLE)")
	assert.Equal(t, batch, o.Code(codes.OK)+o.Code(codes.Unavailable), "only OK and the injected UNAVAILABLE")
}

// checkTimeout: a 250ms request timeout ends calls the server answers
// after 1s; without it they succeed.
func checkTimeout(t *testing.T, f *fixture, configure func(*testing.T)) {
	slow := dataplane.CallOptions{Request: dataplane.Request{Delay: time.Second}, Concurrency: 20}
	o := run(t, f.toEcho, 20, slow)
	require.Equal(t, 20, o.Code(codes.OK), "no timeout: slow calls succeed")
	configure(t)
	f.settle(t, f.toEcho, "timeouts", dataplane.CallOptions{Request: dataplane.Request{Delay: time.Second}, Concurrency: 50}, func(o *dataplane.Outcomes) bool {
		return o.Code(codes.DeadlineExceeded) == o.Total()
	})
	start := time.Now()
	o = run(t, f.toEcho, 40, slow)
	assert.Equal(t, 40, o.Code(codes.DeadlineExceeded), "a 1s answer exceeds the 250ms timeout")
	assert.Less(t, time.Since(start), 2*time.Second, "calls ended at the timeout, not at the answer")
	o = run(t, f.toEcho, batch/4, dataplane.CallOptions{})
	assert.Equal(t, batch/4, o.Code(codes.OK), "fast calls are unaffected")
}

// checkAccess: with mTLS configured (mtls), other gets through; with the
// access policy (allow) written, only sleep does, and other is denied by
// the servers' RBAC.
func checkAccess(t *testing.T, f *fixture, mtls, allow func(*testing.T)) {
	mtls(t)
	other, err := f.other.Dial("echo", ns, echoPort)
	require.NoError(t, err)
	defer other.Close()
	f.settle(t, other, "mTLS from other", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		return o.Peer(f.other.SPIFFEID()) == o.Total() && bothVersions(o)
	})
	o := run(t, other, batch/4, dataplane.CallOptions{})
	require.Equal(t, batch/4, o.Peer(f.other.SPIFFEID()), "no access policy: other gets through, over mTLS")

	allow(t)
	f.settle(t, other, "the policy denies other", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		return o.Code(codes.PermissionDenied) == o.Total()
	})
	o = run(t, other, batch/2, dataplane.CallOptions{})
	assert.Equal(t, batch/2, o.Code(codes.PermissionDenied), "other is denied by the servers' RBAC")
	sleep, err := f.sleep.Dial("echo", ns, echoPort)
	require.NoError(t, err)
	defer sleep.Close()
	f.settle(t, sleep, "mTLS from sleep", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		return o.Peer(f.sleep.SPIFFEID()) == o.Total() && bothVersions(o)
	})
	o = run(t, sleep, batch/2, dataplane.CallOptions{})
	assert.Equal(t, batch/2, o.Peer(f.sleep.SPIFFEID()), "sleep, the allowed identity, gets OK over mTLS")
}
