package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/dynamic"
)

// statusPatches is a client of the management cluster that records when
// it sent each status PATCH: since the last take.
type statusPatches struct {
	mu sync.Mutex
	at []time.Time
}

func recordStatusPatches(t *testing.T, mgmt *localcluster.Cluster) (dynamic.Interface, *statusPatches) {
	t.Helper()
	p := &statusPatches{}
	cfg := mgmt.RESTConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") {
				p.mu.Lock()
				p.at = append(p.at, time.Now())
				p.mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	}
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	return client, p
}

// take returns the times recorded since the last take, in order.
func (p *statusPatches) take() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := p.at
	p.at = nil
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	return at
}

// Issue 31: a fleet quiet for longer than a heartbeat whose agents all ack
// the same edit (an ack that only moves the version on) writes those acks
// once they settled, each cluster in its own slot, spread over half a
// heartbeat — not all at once, which at 1,000 clusters was 1,000 status
// writes landing on the next edit — once per cluster, within a heartbeat.
func TestAQuietFleetsAcksAreWrittenInTheirSlots(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, _, admin := localcluster.Management(t, "relaymesh")
	client, patches := recordStatusPatches(t, mgmt)

	const clusters, heartbeat = 60, 2 * time.Second
	v := func(n uint64) string { return strconv.FormatUint(1_700_000_000_000_000_000+n, 10) }
	ack := func(n uint64) *relaypb.PullAck { return &relaypb.PullAck{Version: 1_700_000_000_000_000_000 + n} }
	k := server.NewKubeStatus(client, "relaymesh", slog.New(slog.NewTextHandler(io.Discard, nil)),
		server.StatusConfig{Coalesce: 10 * time.Millisecond, Heartbeat: heartbeat, Resync: time.Hour})
	go k.Run(ctx)
	names := make([]string, clusters)
	for i := range names {
		names[i] = fmt.Sprintf("quiet-%02d", i)
		registerCluster(t, admin, names[i])
		k.SessionChanged(names[i], true)
		k.Acked(names[i], ack(1))
	}
	allShow := func(version string) func() bool {
		return func() bool {
			for _, n := range names {
				if st, _ := clusterStatus(t, admin, n); appliedVersion(st) != version {
					return false
				}
			}
			return true
		}
	}
	require.Eventually(t, allShow(v(1)), 20*time.Second, 50*time.Millisecond, "the first acks are written at once")
	patches.take()
	for _, n := range names {
		k.Acked(n, ack(1)) // the same again: an event that moves lastSeen alone, written with the heartbeat
	}
	time.Sleep(2*heartbeat + 500*time.Millisecond) // then quiet for longer than a heartbeat
	// (Not every one: lastSeen is kept to the second, and a repeat in the
	// second of the first ack's write changes nothing.)
	assert.LessOrEqual(t, len(patches.take()), clusters, "the lastSeen of the repeated acks, at most once per cluster")

	edit := time.Now()
	for _, n := range names {
		k.Acked(n, ack(2))
	}
	require.Eventually(t, allShow(v(2)), 10*time.Second, 200*time.Millisecond, "the version-only acks are written")
	time.Sleep(heartbeat) // any write that was still to come
	at := patches.take()
	require.Len(t, at, clusters, "one status write per cluster")
	t.Logf("%d version-only acks after %s quiet: written %s to %s after the acks", clusters, heartbeat,
		at[0].Sub(edit).Round(time.Millisecond), at[len(at)-1].Sub(edit).Round(time.Millisecond))
	// The acks settle for half a heartbeat, then each cluster writes in its
	// slot of the next half: evenly, a fair share in each quarter.
	assert.GreaterOrEqual(t, at[0].Sub(edit), heartbeat/2-100*time.Millisecond, "not before the acks settled")
	assert.Less(t, at[len(at)-1].Sub(edit), heartbeat+2*time.Second, "each within a heartbeat of its ack")
	assert.GreaterOrEqual(t, at[len(at)-1].Sub(at[0]), heartbeat/4, "spread over the slots of half a heartbeat")
	firstHalf := 0
	for _, a := range at {
		if a.Sub(edit) < heartbeat*3/4 {
			firstHalf++
		}
	}
	assert.Greater(t, firstHalf, clusters/10, "the first half of the slots has its share")
	assert.Less(t, firstHalf, clusters*9/10, "the second half of the slots has its share")
}

// Issue 31: while a cluster's agent keeps acking versions (policy edits in
// quick succession), those acks are not a status write per heartbeat: the
// status is written once they settle, and at least every MaxLagHeartbeats
// heartbeats while they keep coming.
func TestASeriesOfAcksIsWrittenOnceItSettles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, _, admin := localcluster.Management(t, "relaymesh")
	client, patches := recordStatusPatches(t, mgmt)
	// Acks every 100 ms: settled only after a stall of 650 ms or more.
	const heartbeat = 1500 * time.Millisecond
	maxLag := server.MaxLagHeartbeats * heartbeat
	k := server.NewKubeStatus(client, "relaymesh", slog.New(slog.NewTextHandler(io.Discard, nil)),
		server.StatusConfig{Coalesce: 10 * time.Millisecond, Heartbeat: heartbeat, Resync: time.Hour})
	go k.Run(ctx)
	registerCluster(t, admin, "busy")
	version := uint64(1_700_000_000_000_000_000)
	k.SessionChanged("busy", true)
	k.Acked("busy", &relaypb.PullAck{Version: version})
	require.Eventually(t, func() bool {
		st, _ := clusterStatus(t, admin, "busy")
		return appliedVersion(st) == strconv.FormatUint(version, 10)
	}, 10*time.Second, 20*time.Millisecond, "the first ack is written at once")
	time.Sleep(2 * heartbeat)
	patches.take()

	start := time.Now()
	for time.Since(start) < maxLag+2*heartbeat {
		version++
		k.Acked("busy", &relaypb.PullAck{Version: version})
		time.Sleep(100 * time.Millisecond)
	}
	stop := time.Now()
	last := strconv.FormatUint(version, 10)
	require.Eventually(t, func() bool {
		st, _ := clusterStatus(t, admin, "busy")
		return appliedVersion(st) == last
	}, 10*time.Second, 20*time.Millisecond, "the last version is written once the acks settle")
	time.Sleep(heartbeat)
	at := patches.take()
	var since []time.Duration
	for _, a := range at {
		since = append(since, a.Sub(start).Round(time.Millisecond))
	}
	t.Logf("acks every 100 ms for %s (heartbeat %s): status written %v after the first", stop.Sub(start).Round(time.Millisecond), heartbeat, since)
	require.Len(t, at, 2, "one write when the series reached the longest lag, one when it settled")
	assert.GreaterOrEqual(t, at[0].Sub(start), maxLag-time.Second, "nothing written while the acks kept coming, until the longest lag")
	assert.Less(t, at[0].Sub(start), maxLag+3*heartbeat, "written by the longest lag")
	assert.GreaterOrEqual(t, at[1].Sub(stop), heartbeat/2-200*time.Millisecond, "the last written once the acks settled")
	assert.Less(t, at[1].Sub(stop), 3*heartbeat, "and soon after")
}
