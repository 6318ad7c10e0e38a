package snapshots

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"google.golang.org/protobuf/proto"
)

// FuzzOpen feeds arbitrary bytes to the record parser, as a store anyone
// could write to would: it never panics, refuses everything but records
// sealed with the key for that cluster (in either format), and what it
// accepts seals back to a record it accepts again with the same content
// and sequence.
func FuzzOpen(f *testing.F) {
	key := bytes.Repeat([]byte{3}, 32)
	snap := &relaypb.Snapshot{Cluster: "east", Workloads: []*relaypb.Workload{{Name: "a", Namespace: "b", Cluster: "east", Kind: "Deployment", MeshName: "istiod", MeshNamespace: "istio-system"}}}
	snap.Hash = snapshothash.Of(snap)
	good, err := seal(key, Record{Cluster: "east", Sequence: 42, Snapshot: snap, Replica: "r", AcceptedAt: time.Unix(1, 0)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte("RMS1"))
	f.Add([]byte("RMS2"))
	f.Add([]byte{})
	other, _ := seal(bytes.Repeat([]byte{4}, 32), Record{Cluster: "east", Snapshot: snap})
	f.Add(other)
	v1, err := SealV1(key, Record{Cluster: "east", Snapshot: snap, Replica: "r", AcceptedAt: time.Unix(1, 0)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(v1)
	// A v2 body under the v1 magic, and the other way round.
	f.Add(append([]byte("RMS1"), good[4:]...))
	f.Add(append([]byte("RMS2"), v1[4:]...))
	limits := relay.SnapshotLimits{}.WithDefaults()
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := open(key, b, "east", 1<<20, limits)
		if err != nil {
			return
		}
		if r.Cluster != "east" {
			t.Fatalf("accepted a record of cluster %q under east", r.Cluster)
		}
		if strings.HasPrefix(string(b), "RMS1") && r.Sequence != 0 {
			t.Fatalf("a record of the first format read with sequence %d", r.Sequence)
		}
		again, err := seal(key, *r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := open(key, again, "east", 1<<20, limits)
		if err != nil {
			t.Fatalf("a resealed record was refused: %v", err)
		}
		if !proto.Equal(r.Snapshot, r2.Snapshot) || r2.Sequence != r.Sequence {
			t.Fatal("resealing changed the snapshot or the sequence")
		}
		if sequenceOf(again) != r.Sequence {
			t.Fatal("the sequence is not where the format puts it")
		}
	})
}

// FuzzAnnouncement feeds arbitrary messages to the announcement parser, as
// anyone who can publish on the store's channel could: it never panics,
// accepts only a put or a delete of a name that could be a registered
// cluster's (so none reaches another key), and what it accepts it writes
// back as the same message.
func FuzzAnnouncement(f *testing.F) {
	for _, seed := range []string{"put 1700000000000000 0123abcd east", "del east", "", "put", "put 1 h", "put 1 h East", "put 1 h east extra",
		"del ../x", "del east west", "drop east", "put  h east", "put 1  east", "del ", "put 1 h\x00 east", strings.Repeat("x", 1<<10)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		a, err := parseAnnouncement(payload)
		if err != nil {
			return
		}
		if a.op != "put" && a.op != "del" {
			t.Fatalf("accepted op %q", a.op)
		}
		if checkCluster(a.cluster) != nil {
			t.Fatalf("accepted cluster %q", a.cluster)
		}
		if a.String() != payload {
			t.Fatalf("%q reads back as %q", payload, a.String())
		}
		if len(payload) > maxAnnouncementBytes {
			t.Fatalf("accepted %d bytes", len(payload))
		}
	})
}
