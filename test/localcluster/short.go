package localcluster

import (
	"os"
	"testing"
)

// SkipIfShort skips t under -short, the pure tier (make test-unit), which
// runs no local cluster and no other process. Every helper that starts one
// (local clusters, redis-server, istiod, istioctl, third-party CAs, the
// relaymesh binary) calls it first, so a test that needs one is skipped
// there and only there; `make test` runs without -short, and skips nothing.
//
// Under CI (the CI variable .ci/run sets) -short is a failure, not a skip:
// a test skipped in CI proves nothing, so CI cannot pass by skipping.
func SkipIfShort(t testing.TB) {
	t.Helper()
	if !testing.Short() {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("-short under CI: this test starts a local cluster or another process, and CI must run it (make test, no -short)")
	}
	t.Skip("-short: starts a local cluster or another process (make test runs it)")
}
