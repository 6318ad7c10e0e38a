package server_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// With several replicas a replica writes only the clusters it owns: one
// whose agent moved to another replica (released) is neither written from
// its stale snapshot nor deleted at its resync.
func TestMirrorWritesOnlyOwnedClusters(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	_, _, client := localcluster.Management(t, ns)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	count := func() int {
		l, err := client.Resource(discoveryv1alpha1.Destinations).Namespace(ns).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		return len(l.Items)
	}

	// Replica a holds c1's session; replica b held it before and kept a
	// stale snapshot with fewer Services.
	va, vb := server.NewView(), server.NewView()
	var bOwns atomic.Bool
	a := server.NewMirrorWithConfig(client, ns, va, log, server.MirrorConfig{Resync: 200 * time.Millisecond, Owns: va.Has})
	b := server.NewMirrorWithConfig(client, ns, vb, log, server.MirrorConfig{Resync: 200 * time.Millisecond, Owns: func(c string) bool { return bOwns.Load() && vb.Has(c) }})
	go a.Run(ctx)
	go b.Run(ctx)
	vb.Accept("c1", fleet.SnapshotSpec{Services: 2}.Snapshot("c1"), time.Now())
	time.Sleep(time.Second)
	assert.Zero(t, count(), "b does not own c1: nothing written")
	va.Accept("c1", fleet.SnapshotSpec{Services: 5}.Snapshot("c1"), time.Now())
	require.Eventually(t, func() bool { return count() == 5 }, 10*time.Second, 50*time.Millisecond)

	// b's session ends and it releases the snapshot: even owning "what it
	// has", it has nothing, and its resyncs neither write nor delete.
	vb.Release("c1")
	bOwns.Store(true)
	time.Sleep(time.Second)
	assert.Equal(t, 5, count(), "a released cluster is neither rewritten nor deleted by its former replica")
	assert.False(t, vb.Has("c1"))
}
