package server_test

import (
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/server"
)

// large100k is the snapshot of a realistic cluster of 100,000 pods,
// 10,000 Services and 10,000 Deployments (relaytest.Rich of 500
// namespaces), built once.
var large100k = sync.OnceValue(func() *relaypb.Snapshot { return relaytest.Rich{Namespaces: 500}.Snapshot("cluster-1") })

// BenchmarkSnapshotIngestion100k: what a snapshot pushed whole costs the
// server at 100,000 pods and 10,000 Services — ValidateSnapshot (with the
// re-encoding for its hash) and View.Accept — and the same checks as a
// chunked push runs them (the hash of the received bytes in place of the
// re-encoding).
func BenchmarkSnapshotIngestion100k(b *testing.B) {
	s := large100k()
	view := server.NewView()
	b.Run("whole", func(b *testing.B) {
		for b.Loop() {
			if err := relay.ValidateSnapshot("cluster-1", s, relay.SnapshotLimits{MaxBytes: 64 << 20}); err != nil {
				b.Fatal(err)
			}
			view.Accept("cluster-1", s, time.Now())
		}
	})
	b.Run("chunked", func(b *testing.B) {
		for b.Loop() {
			if err := relay.ValidateAssembled("cluster-1", s, relay.SnapshotLimits{}, s.GetHash()); err != nil {
				b.Fatal(err)
			}
			view.Accept("cluster-1", s, time.Now())
		}
	})
}
