package fleet

import (
	"context"
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
