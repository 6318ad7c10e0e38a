package snapshots

import (
	"bytes"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/protobuf/proto"
)

// FuzzOpen feeds arbitrary bytes to the record parser, as a store anyone
// could write to would: it never panics, refuses everything but records
// sealed with the key for that cluster, and what it accepts seals back to
// a record it accepts again with the same content.
func FuzzOpen(f *testing.F) {
	key := bytes.Repeat([]byte{3}, 32)
	snap := &relaypb.Snapshot{Cluster: "east", Workloads: []*relaypb.Workload{{Name: "a", Namespace: "b", Cluster: "east", Kind: "Deployment", MeshName: "istiod", MeshNamespace: "istio-system"}}}
	snap.Hash = discovery.Hash(snap)
	good, err := seal(key, Record{Cluster: "east", Snapshot: snap, Replica: "r", AcceptedAt: time.Unix(1, 0)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte("RMS1"))
	f.Add([]byte{})
	other, _ := seal(bytes.Repeat([]byte{4}, 32), Record{Cluster: "east", Snapshot: snap})
	f.Add(other)
	limits := relay.SnapshotLimits{}.WithDefaults()
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := open(key, b, "east", 1<<20, limits)
		if err != nil {
			return
		}
		if r.Cluster != "east" {
			t.Fatalf("accepted a record of cluster %q under east", r.Cluster)
		}
		again, err := seal(key, *r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := open(key, again, "east", 1<<20, limits)
		if err != nil {
			t.Fatalf("a resealed record was refused: %v", err)
		}
		if !proto.Equal(r.Snapshot, r2.Snapshot) {
			t.Fatal("resealing changed the snapshot")
		}
	})
}
