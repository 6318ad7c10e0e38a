package server

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/protobuf/proto"
)

// View is the server's picture of every cluster: the last accepted snapshot
// of each, when it arrived, and the last output version each agent acked.
// It lives in memory; after a restart the agents rebuild it within seconds
// (they push on every reconnect).
type View struct {
	mu           sync.RWMutex
	clusters     map[string]*ClusterView
	listeners    []func(cluster string)
	ackListeners []func(cluster string)
}

// ClusterView is what the server knows of one cluster.
type ClusterView struct {
	Snapshot   *relaypb.Snapshot       `json:"snapshot,omitempty"`
	AcceptedAt time.Time               `json:"acceptedAt,omitzero"`
	LastError  string                  `json:"lastError,omitempty"`
	Ack        *relaypb.PullAck        `json:"ack,omitempty"`
	AckedAt    time.Time               `json:"ackedAt,omitzero"`
	Conflicts  []*relaypb.ObjectResult `json:"conflicts,omitempty"`
	// PackedBytes is the size the snapshot is held in when the view holds
	// it packed (Pack); Clusters returns it decoded all the same.
	PackedBytes int `json:"packedBytes,omitempty"`

	// packed, when set, holds Snapshot instead (which is then nil): the
	// snapshot's protobuf encoding, compressed (Pack). hash is the held
	// snapshot's, packed or not.
	packed []byte
	hash   string
}

// PackAbove is the encoded size above which Pack compresses a snapshot
// the mirror has written: 1 MiB is about 7,000 endpoints. A cluster's
// Workloads and Destinations are also cached, typed, from the management
// cluster, so a large snapshot held decoded in the view was its second
// copy in the server's memory (a 100,000-pod cluster's: 40 MB live;
// docs/design/2026-11-25-large-snapshots.md). Smaller snapshots stay
// decoded: packing them saves little and costs every read.
const PackAbove = 1 << 20

// NewView returns an empty view.
func NewView() *View { return &View{clusters: map[string]*ClusterView{}} }

// OnSnapshot registers f to be called (on the caller's goroutine, without
// locks held) with the cluster whose snapshot changed or was removed.
func (v *View) OnSnapshot(f func(cluster string)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.listeners = append(v.listeners, f)
}

func (v *View) entry(cluster string) *ClusterView {
	c := v.clusters[cluster]
	if c == nil {
		c = &ClusterView{}
		v.clusters[cluster] = c
	}
	return c
}

// Accept stores a validated snapshot. Its endpoints with equal labels are
// made to share one map (relay.ShareLabels; a chunked push's already do):
// s is read only from here on.
func (v *View) Accept(cluster string, s *relaypb.Snapshot, at time.Time) {
	relay.ShareLabels(s)
	v.mu.Lock()
	c := v.entry(cluster)
	changed := (c.Snapshot == nil && c.packed == nil) || c.hash != s.GetHash()
	if changed {
		c.Snapshot, c.packed, c.hash = s, nil, s.GetHash()
	} // else the same snapshot again (an agent that reconnected): the one held stays, packed or about to be
	c.AcceptedAt, c.LastError = at, ""
	listeners := v.listeners
	v.mu.Unlock()
	if changed {
		for _, f := range listeners {
			f(cluster)
		}
	}
}

// Refused records why the latest snapshot of cluster was refused; the last
// accepted one stays.
func (v *View) Refused(cluster, reason string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.entry(cluster).LastError = reason
}

// OnAck registers f to be called (on the caller's goroutine, without locks
// held) with the cluster whose agent acked an output set.
func (v *View) OnAck(f func(cluster string)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ackListeners = append(v.ackListeners, f)
}

// Bounds of what the view keeps of an ack: an agent decides what it acks,
// so a compromised one could otherwise make the server hold (and serve
// from /debug) megabytes per cluster.
const (
	// maxKeptFailures: conflict and error results kept per cluster.
	maxKeptFailures = 1000
	// maxKeptTrustResults: results for mesh CA Secrets kept per cluster.
	maxKeptTrustResults = 1000
	// maxResultError and maxResultField bound each kept string.
	maxResultError = 256
	maxResultField = 253
)

// Acked records an agent's ack. It keeps what the server reads: the
// version, the failed objects (for statuses) and the results for Secrets
// (the mesh CAs of shared trust), each bounded.
func (v *View) Acked(cluster string, ack *relaypb.PullAck, at time.Time) {
	kept := &relaypb.PullAck{Version: ack.GetVersion()}
	var failures []*relaypb.ObjectResult
	trust := 0
	for _, r := range ack.GetResults() {
		failed := r.GetOutcome() == "conflict" || r.GetOutcome() == "error"
		switch {
		case failed && len(failures) < maxKeptFailures:
			r = boundedResult(r)
			failures = append(failures, r)
			kept.Results = append(kept.Results, r)
		case !failed && r.GetKind() == "Secret" && trust < maxKeptTrustResults:
			trust++
			kept.Results = append(kept.Results, boundedResult(r))
		}
	}
	v.mu.Lock()
	c := v.entry(cluster)
	c.Ack, c.AckedAt, c.Conflicts = kept, at, failures
	listeners := v.ackListeners
	v.mu.Unlock()
	for _, f := range listeners {
		f(cluster)
	}
}

// boundedResult is r with every string cut to its bound.
func boundedResult(r *relaypb.ObjectResult) *relaypb.ObjectResult {
	return &relaypb.ObjectResult{ApiVersion: text.Truncate(r.GetApiVersion(), maxResultField), Kind: text.Truncate(r.GetKind(), maxResultField),
		Namespace: text.Truncate(r.GetNamespace(), maxResultField), Name: text.Truncate(r.GetName(), maxResultField),
		Outcome: text.Truncate(r.GetOutcome(), 16), Error: text.Truncate(r.GetError(), maxResultError), CrossIssuer: boundedFingerprint(r.GetCrossIssuer())}
}

// boundedFingerprint is fp when it is a hex SHA-256 fingerprint, else
// empty: an agent chooses its acks, and a root it names that way can only
// be one the server asked for.
func boundedFingerprint(fp string) string {
	if len(fp) != 64 || strings.Trim(fp, "0123456789abcdef") != "" {
		return ""
	}
	return fp
}

// Ack returns what the view kept of the last ack of cluster's agent (the
// version, failures and Secret results), or nil.
func (v *View) Ack(cluster string) *relaypb.PullAck {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if c := v.clusters[cluster]; c != nil {
		return c.Ack
	}
	return nil
}

// Remove forgets a cluster (deregistered).
func (v *View) Remove(cluster string) {
	v.mu.Lock()
	_, had := v.clusters[cluster]
	delete(v.clusters, cluster)
	listeners := v.listeners
	v.mu.Unlock()
	if had {
		for _, f := range listeners {
			f(cluster)
		}
	}
}

// Has reports whether the view holds cluster (a snapshot, an error or an
// ack of it).
func (v *View) Has(cluster string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	_, ok := v.clusters[cluster]
	return ok
}

// Release forgets cluster without telling anyone: its agent's session
// moved to another replica, which now owns its objects; this replica must
// neither write its stale snapshot nor delete the objects.
func (v *View) Release(cluster string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.clusters, cluster)
}

// Snapshot returns the last accepted snapshot of cluster, or nil (none,
// or a packed one that could not be decoded: Load says why). It decodes
// a packed snapshot on every call, so callers that only ask whether there
// is one, or which, use HasSnapshot and SnapshotHash.
func (v *View) Snapshot(cluster string) *relaypb.Snapshot {
	s, _ := v.Load(cluster)
	return s
}

// Load returns the last accepted snapshot of cluster, or nil if there is
// none. A packed snapshot is decoded, a new copy for each call; an error
// means it could not be, and the caller must not take that for no
// snapshot (the mirror would delete the cluster's objects).
func (v *View) Load(cluster string) (*relaypb.Snapshot, error) {
	v.mu.RLock()
	var s *relaypb.Snapshot
	var packed []byte
	if c := v.clusters[cluster]; c != nil {
		s, packed = c.Snapshot, c.packed
	}
	v.mu.RUnlock()
	if packed == nil {
		return s, nil
	}
	return unpack(packed)
}

// HasSnapshot reports whether the view holds a snapshot of cluster,
// without decoding a packed one.
func (v *View) HasSnapshot(cluster string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	c := v.clusters[cluster]
	return c != nil && (c.Snapshot != nil || c.packed != nil)
}

// SnapshotHash returns the hash of cluster's snapshot and whether the
// view holds one, without decoding a packed one.
func (v *View) SnapshotHash(cluster string) (string, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	c := v.clusters[cluster]
	if c == nil || (c.Snapshot == nil && c.packed == nil) {
		return "", false
	}
	return c.hash, true
}

// Pack compresses cluster's snapshot if it is still s and its encoding is
// larger than PackAbove; Snapshot, Load and Clusters decode it again
// when asked. The mirror calls it once it has written s: what the server
// reads of a large cluster from then on, until its next snapshot, is the
// typed cache of its discovered objects, and a resync or a repair decodes
// the snapshot once. It reports whether it packed.
func (v *View) Pack(cluster string, s *relaypb.Snapshot) bool {
	if s == nil {
		return false
	}
	v.mu.RLock()
	c := v.clusters[cluster]
	held := c != nil && c.Snapshot == s
	v.mu.RUnlock()
	if !held || proto.Size(s) <= PackAbove {
		return false
	}
	// Encoding and compressing take a 100,000-pod snapshot about half a
	// second (BenchmarkPackLargeSnapshot): done outside the lock, swapped
	// in only if no other snapshot came since.
	packed, err := pack(s)
	if err != nil {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if c := v.clusters[cluster]; c != nil && c.Snapshot == s {
		c.Snapshot, c.packed = nil, packed
		return true
	}
	return false
}

// pack encodes s and compresses it.
func pack(s *relaypb.Snapshot) ([]byte, error) {
	b, err := proto.Marshal(s)
	if err != nil {
		return nil, err
	}
	// The encoding's size first, so unpack reads it into one buffer.
	buf := bytes.NewBuffer(binary.AppendUvarint(nil, uint64(len(b))))
	w, err := flate.NewWriter(buf, flate.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return bytes.Clone(buf.Bytes()), nil
}

// unpack decodes what pack encoded; the endpoints' equal labels share one
// map again, as an accepted snapshot's do.
func unpack(packed []byte) (*relaypb.Snapshot, error) {
	size, n := binary.Uvarint(packed)
	if n <= 0 || size > 1<<32 { // its own encoding: the bound is a sanity check
		return nil, errors.New("the view's packed snapshot cannot be read: bad size")
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(flate.NewReader(bytes.NewReader(packed[n:])), b); err != nil {
		return nil, fmt.Errorf("the view's packed snapshot cannot be read: %w", err)
	}
	s := &relaypb.Snapshot{}
	if err := proto.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("the view's packed snapshot cannot be decoded: %w", err)
	}
	relay.ShareLabels(s)
	return s, nil
}

// Clusters returns a copy of the view, for the debug endpoint, packed
// snapshots decoded (nil if that failed). States and Names do not decode.
func (v *View) Clusters() map[string]ClusterView {
	v.mu.RLock()
	out := make(map[string]ClusterView, len(v.clusters))
	for k, c := range v.clusters {
		out[k] = *c
	}
	v.mu.RUnlock()
	for k, c := range out {
		if c.packed != nil {
			out[k] = unpacked(c)
		}
	}
	return out
}

// States returns a copy of the view without the snapshots (the
// dashboard's agents: when each snapshot came, errors, acks); State that
// of one cluster.
func (v *View) States() map[string]ClusterView {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make(map[string]ClusterView, len(v.clusters))
	for k, c := range v.clusters {
		out[k] = c.state()
	}
	return out
}

// State: see States.
func (v *View) State(cluster string) (ClusterView, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if c := v.clusters[cluster]; c != nil {
		return c.state(), true
	}
	return ClusterView{}, false
}

func (c *ClusterView) state() ClusterView {
	cv := *c
	cv.Snapshot, cv.packed, cv.PackedBytes = nil, nil, len(c.packed)
	return cv
}

// Names lists the clusters the view holds (a snapshot, an error or an
// ack of each).
func (v *View) Names() []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]string, 0, len(v.clusters))
	for k := range v.clusters {
		out = append(out, k)
	}
	return out
}

func unpacked(c ClusterView) ClusterView {
	if c.packed != nil {
		c.Snapshot, _ = unpack(c.packed)
		c.PackedBytes, c.packed = len(c.packed), nil
	}
	return c
}
