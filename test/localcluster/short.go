package localcluster

import "testing"

// SkipIfShort skips t under -short, the pure tier (make test-unit), which
// runs no local cluster and no other process. Every helper that starts one
// (local clusters, redis-server, istiod, istioctl, third-party CAs, the
// relaymesh binary) calls it first, so a test that needs one is skipped
// there and only there; `make test` runs without -short, and skips nothing.
func SkipIfShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts a local cluster or another process (make test runs it)")
	}
}
