package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cluster of 100,000 pods and 10,000 Services — five times what one
// message could carry — reaches a real server's view, first and after a
// change, and the server keeps no memory for it in transit afterwards.
func TestLargeSnapshot(t *testing.T) {
	env := startEnv(t)
	r, err := fleet.LargeSnapshot(context.Background(), fleet.LargeSnapshotConfig{Options: fleet.Options{Env: env, Logf: t.Logf}, Pushes: 1})
	require.NoError(t, err)
	assert.Equal(t, 100000, r.Pods)
	assert.Equal(t, 10000, r.Services)
	assert.Greater(t, r.Bytes, 16<<20)
	assert.Len(t, r.Changed, 1)
	assert.Zero(t, r.ReservedAfter, "nothing stays reserved")
	assert.Empty(t, r.Refused, "nothing refused")
	t.Logf("%d bytes: first %s, changed %s; server CPU %s, RSS %d MiB before, peak %d MiB, after %d MiB",
		r.Bytes, r.First.Round(time.Millisecond), r.Changed[0].Round(time.Millisecond), r.ServerCPU.Round(time.Millisecond), r.RSSBefore>>20, r.RSSPeak>>20, r.RSSAfter>>20)
}

// BenchmarkFleetLargeSnapshot: a 100,000-pod, 10,000-Service snapshot from
// the agent's session into a real server's view, first and after changes.
func BenchmarkFleetLargeSnapshot(b *testing.B) {
	env := startEnv(b)
	var r *fleet.LargeSnapshotResult
	for b.Loop() {
		var err error
		r, err = fleet.LargeSnapshot(context.Background(), fleet.LargeSnapshotConfig{Options: options(b, env)})
		require.NoError(b, err)
	}
	require.Empty(b, r.Refused)
	var changed time.Duration
	for _, d := range r.Changed {
		changed = max(changed, d)
	}
	b.ReportMetric(r.First.Seconds(), "s-first")
	b.ReportMetric(changed.Seconds(), "s-changed-max")
	b.ReportMetric(r.ServerCPU.Seconds()/float64(1+len(r.Changed)), "server-cpu-s/push")
	b.ReportMetric(float64(r.RSSPeak-r.RSSBefore)/(1<<20), "MiB-rss-growth")
	b.ReportMetric(float64(r.Bytes), "snapshot-bytes")
	report(b, r)
}
