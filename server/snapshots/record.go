package snapshots

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/protobuf/proto"
)

// Record is one cluster's latest accepted snapshot as the store keeps it.
type Record struct {
	// Cluster is the registered cluster the snapshot came from.
	Cluster string
	// Sequence orders the records of a cluster, whichever replica wrote
	// them: every later record has a greater one (Put assigns it). It is
	// authenticated with the record, so a replica refuses an older record
	// written back to the store (a replay). Records of the first format
	// (before sequences) read as 0, the oldest.
	Sequence uint64
	// Snapshot is what its agent pushed and a replica accepted (validated).
	Snapshot *relaypb.Snapshot
	// Replica is the server replica that accepted it, AcceptedAt when (that
	// replica's clock; informational, not an order).
	Replica    string
	AcceptedAt time.Time
}

// MinKeyBytes is the shortest record key accepted.
const MinKeyBytes = 32

// Formats: the magic that starts a record, and the label of its MAC,
// which separates this MAC's inputs from any other use of the key. Records
// are written in the second, which carries the sequence; the first is
// still read (as sequence 0), so replicas of the previous release and of
// this one share a store during a rolling upgrade.
var (
	recordMagic   = []byte("RMS2")
	recordMagicV1 = []byte("RMS1")
)

const (
	macLabel   = "relaymesh snapshot record v2\x00"
	macLabelV1 = "relaymesh snapshot record v1\x00"
)

// markBytes is how much of a record its mark is: the magic and the MAC.
const markBytes = 4 + sha256.Size

// Errors a record can fail with. ErrRecord wraps every reason a stored
// record is refused; none of them carries the key or the record's bytes.
var (
	ErrRecord   = errors.New("snapshot record refused")
	ErrNotFound = errors.New("no snapshot stored for this cluster")
	// ErrReplayed: the record verifies, but a newer one of its cluster was
	// seen (read or written) by this replica: it was written back.
	ErrReplayed = fmt.Errorf("%w: older than a record of its cluster this replica has seen (written back to the store: a replay)", ErrRecord)
)

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRecord, fmt.Sprintf(format, args...))
}

// seal encodes r and authenticates it with key: magic, MAC, body. The MAC
// covers the sequence, so an older record cannot pass for a newer one;
// the cluster, so a record cannot be moved to another cluster's key; and
// the snapshot's every byte, so the store cannot change a workload.
func seal(key []byte, r Record) ([]byte, error) {
	if len(r.Cluster) > 0xffff || len(r.Replica) > 0xffff {
		return nil, errors.New("cluster or replica name too long")
	}
	snap, err := proto.MarshalOptions{Deterministic: true}.Marshal(r.Snapshot)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	body := make([]byte, 0, 8+8+2+len(r.Cluster)+2+len(r.Replica)+len(snap))
	body = binary.BigEndian.AppendUint64(body, r.Sequence)
	body = binary.BigEndian.AppendUint64(body, uint64(r.AcceptedAt.UnixNano()))
	body = binary.BigEndian.AppendUint16(body, uint16(len(r.Cluster)))
	body = append(body, r.Cluster...)
	body = binary.BigEndian.AppendUint16(body, uint16(len(r.Replica)))
	body = append(body, r.Replica...)
	body = append(body, snap...)
	out := make([]byte, 0, len(recordMagic)+sha256.Size+len(body))
	out = append(out, recordMagic...)
	out = append(out, mac(key, macLabel, body)...)
	return append(out, body...), nil
}

// mark is what identifies a sealed record without reading it: its magic
// and MAC (the store's Stamp reads the same of a stored one).
func mark(rec []byte) string { return hex.EncodeToString(rec[:min(len(rec), markBytes)]) }

func mac(key []byte, label string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(body)
	return m.Sum(nil)
}

// open checks and decodes a record stored under cluster's key: its size,
// its format, its MAC (constant time), that it names that cluster, and
// that the snapshot passes the relay's own validation. A record that fails
// any of these is refused whole.
func open(key, b []byte, cluster string, maxBytes int, limits relay.SnapshotLimits) (*Record, error) {
	if len(b) > maxBytes {
		return nil, refused("%d bytes, more than the %d allowed", len(b), maxBytes)
	}
	head := len(recordMagic) + sha256.Size
	if len(b) < head {
		return nil, refused("not a snapshot record of this format")
	}
	label, fixed := "", 0
	switch string(b[:len(recordMagic)]) {
	case string(recordMagic):
		label, fixed = macLabel, 8+8+2+2
	case string(recordMagicV1):
		label, fixed = macLabelV1, 8+2+2
	}
	if label == "" || len(b) < head+fixed {
		return nil, refused("not a snapshot record of this format")
	}
	sum, body := b[len(recordMagic):head], b[head:]
	if !hmac.Equal(sum, mac(key, label, body)) {
		return nil, refused("its MAC does not verify: written without the replicas' key, or changed in the store")
	}
	var seq uint64
	if label == macLabel {
		seq, body = binary.BigEndian.Uint64(body), body[8:]
	}
	at := time.Unix(0, int64(binary.BigEndian.Uint64(body)))
	rest := body[8:]
	name, rest, err := lengthPrefixed(rest)
	if err != nil {
		return nil, err
	}
	replica, rest, err := lengthPrefixed(rest)
	if err != nil {
		return nil, err
	}
	if name != cluster {
		return nil, refused("it is cluster %q's, stored under %q", name, cluster)
	}
	snap := &relaypb.Snapshot{}
	if err := proto.Unmarshal(rest, snap); err != nil {
		return nil, refused("snapshot: %v", err)
	}
	if err := relay.ValidateAssembled(cluster, snap, limits, snap.GetHash()); err != nil {
		return nil, refused("snapshot: %v", err)
	}
	return &Record{Cluster: name, Sequence: seq, Snapshot: snap, Replica: replica, AcceptedAt: at}, nil
}

func lengthPrefixed(b []byte) (string, []byte, error) {
	if len(b) < 2 {
		return "", nil, refused("truncated")
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return "", nil, refused("truncated")
	}
	return string(b[2 : 2+n]), b[2+n:], nil
}
