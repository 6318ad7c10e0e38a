package fleet

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The storm waits for the server, the apiserver and etcd to go quiet
// before it measures: a process busy on a core is not quiet (and the wait
// ends, saying so, at its bound); one that pauses between bursts is quiet
// only once a pause outlasts quietFor; an idle one is quiet at once. The
// harness itself (pid 0) is never counted.
func TestSettleWaitsForTheFleetsProcessesToGoQuiet(t *testing.T) {
	ctx := context.Background()
	busy := exec.Command("sh", "-c", "while :; do :; done")
	require.NoError(t, busy.Start())
	defer func() { _ = busy.Process.Kill(); _ = busy.Wait() }()

	waited, quiet, err := settle(ctx, map[string]int{"server": busy.Process.Pid}, 200*time.Millisecond, 600*time.Millisecond, time.Second)
	require.NoError(t, err)
	assert.False(t, quiet, "a process using a core is not quiet")
	assert.GreaterOrEqual(t, waited, time.Second, "the wait ends at its bound")

	var spin atomic.Bool
	spin.Store(true)
	go func() {
		for spin.Load() {
		}
	}()
	defer spin.Store(false)
	require.NoError(t, busy.Process.Kill())
	_ = busy.Wait()
	sleeper := exec.Command("sleep", "30")
	require.NoError(t, sleeper.Start())
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	waited, quiet, err = settle(ctx, map[string]int{"server": sleeper.Process.Pid, "harness": 0}, 200*time.Millisecond, 600*time.Millisecond, 5*time.Second)
	require.NoError(t, err)
	assert.True(t, quiet, "an idle process is quiet, however busy the harness is")
	assert.Less(t, waited, 2*time.Second)

	// This process (by its pid, so it is counted) busy for 0.7 s and
	// idle for 0.5 s, three times, then idle: the pauses are shorter than
	// quietFor, so the quiet begins after the last burst.
	spin.Store(false)
	go func() {
		for range 3 {
			for end := time.Now().Add(700 * time.Millisecond); time.Now().Before(end); {
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	waited, quiet, err = settle(ctx, map[string]int{"server": os.Getpid()}, 200*time.Millisecond, 800*time.Millisecond, 20*time.Second)
	require.NoError(t, err)
	assert.True(t, quiet)
	assert.GreaterOrEqual(t, waited, 2900*time.Millisecond, "not quiet before the last burst ended")
}

// After a storm its work is done when the apiserver sees no more writes
// but the periodic ones: the replicas' Lease renewals and the apiserver's
// own endpoints are not the storm's; reads never count.
func TestStormWritesCountOnlyTheStormsWrites(t *testing.T) {
	counts := map[string]float64{
		"POST meshes": 3, "PATCH kubernetesclusters/status": 2, "APPLY kubernetesclusters/status": 1, "PUT configmaps": 4,
		"DELETE secrets": 1, "PUT leases": 50, "POST endpoints": 7, "GET kubernetesclusters": 900, "WATCH meshes": 2, "LIST secrets": 1,
	}
	assert.Equal(t, 11.0, stormWrites(counts))
	counts["PUT leases"]++
	counts["GET meshes"]++
	assert.Equal(t, 11.0, stormWrites(counts), "a Lease renewal and a read are not the storm's")
	counts["PATCH secrets"]++
	assert.Equal(t, 12.0, stormWrites(counts))
}

// writesSettle ends at the last write it saw: the counts of that reading
// are what it returns, busy runs once per reading with new writes (never
// for the first, which is where it starts from), writes that never stop
// end the wait at its bound, and a failed reading is an error.
func TestWritesSettleEndsAtTheLastWrite(t *testing.T) {
	ctx := context.Background()
	reader := func(writes []float64) func(context.Context) (map[string]float64, error) {
		i := 0
		return func(context.Context) (map[string]float64, error) {
			w := writes[min(i, len(writes)-1)]
			i++
			return map[string]float64{"POST meshes": w, "PUT leases": float64(i)}, nil
		}
	}

	busy := 0
	count := func() error { busy++; return nil }
	after, quiet, counts, err := writesSettle(ctx, reader([]float64{5}), 10*time.Millisecond, 100*time.Millisecond, 5*time.Second, count)
	require.NoError(t, err)
	assert.True(t, quiet)
	assert.Zero(t, after, "no write after the first reading")
	assert.Zero(t, busy)
	assert.Equal(t, 5.0, counts["POST meshes"])

	busy = 0
	after, quiet, counts, err = writesSettle(ctx, reader([]float64{5, 6, 7, 9}), 10*time.Millisecond, 100*time.Millisecond, 5*time.Second, count)
	require.NoError(t, err)
	assert.True(t, quiet)
	assert.Positive(t, after)
	assert.Equal(t, 3, busy, "once per reading with new writes; Lease renewals are not writes")
	assert.Equal(t, 9.0, counts["POST meshes"])
	assert.Equal(t, 4.0, counts["PUT leases"], "the counts of the reading that saw the last write")

	endless := make([]float64, 1000)
	for i := range endless {
		endless[i] = float64(i)
	}
	after, quiet, _, err = writesSettle(ctx, reader(endless), 10*time.Millisecond, 100*time.Millisecond, 300*time.Millisecond, nil)
	require.NoError(t, err)
	assert.False(t, quiet, "writes that never stop")
	assert.GreaterOrEqual(t, after, 300*time.Millisecond)

	_, _, _, err = writesSettle(ctx, func(context.Context) (map[string]float64, error) { return nil, errors.New("apiserver away") },
		10*time.Millisecond, 100*time.Millisecond, time.Second, nil)
	require.ErrorContains(t, err, "apiserver away")
}

// The gate's refusals come out by reason, other series and zero counts left
// out.
func TestRefusedByReason(t *testing.T) {
	m := ParseMetrics(`relaymesh_relay_connections_refused_total{reason="preauth_limit"} 12
relaymesh_relay_connections_refused_total{reason="handshake"} 3
relaymesh_relay_connections_refused_total{reason="abuse"} 0
relaymesh_relay_open_connections{state="preauth"} 7
`)
	assert.Equal(t, map[string]float64{"preauth_limit": 12, "handshake": 3}, refusedByReason(m))
}
