package server

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"sort"
	"sync"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server/heads"
	"google.golang.org/protobuf/proto"
)

// Outputs holds each cluster's desired output set and wakes the cluster's
// Pull streams when it changes. Versions increase across server restarts
// (they start from the start time in nanoseconds), so an agent never sees a
// version go backwards.
type Outputs struct {
	pubMu   sync.Mutex // serializes SetFrom, so unions are published in order
	mu      sync.Mutex
	sources map[string]map[string][]*relaypb.OutputObject // source -> cluster -> objects
	trust   map[string][]*relaypb.TrustRequest            // cluster -> mesh CAs
	sets    map[string]*relaypb.OutputSet
	hashes  map[string]string
	// trustSince is the version in which each cluster's current trust
	// requests were first published, and trustHash their digest.
	trustSince map[string]uint64
	trustHash  map[string]string
	next       uint64
	subs       map[string]map[chan struct{}]struct{}
	ready      chan struct{}
	readyMu    sync.Once
	// heads, when set, are the leader's decisions: a set is served only
	// when its digest is the cluster's head's, with the head's version.
	heads     func(cluster string) (heads.Head, bool)
	published []func(cluster string)
	// batching counts the Batch calls running; meanwhile the clusters to
	// tell the OnPublish listeners of wait in pending.
	batching int
	pending  []string
}

// NewOutputs returns an empty store; call MarkReady once every source has
// published its first state, so no agent prunes on a half-known set.
func NewOutputs(now time.Time) *Outputs {
	return &Outputs{
		sources: map[string]map[string][]*relaypb.OutputObject{}, trust: map[string][]*relaypb.TrustRequest{},
		sets: map[string]*relaypb.OutputSet{}, hashes: map[string]string{},
		trustSince: map[string]uint64{}, trustHash: map[string]string{},
		next: uint64(now.UnixNano()), subs: map[string]map[chan struct{}]struct{}{},
		ready: make(chan struct{}),
	}
}

// MarkReady releases Pull streams.
func (o *Outputs) MarkReady() { o.readyMu.Do(func() { close(o.ready) }) }

// Ready is closed once outputs are complete.
func (o *Outputs) Ready() <-chan struct{} { return o.ready }

// Set replaces cluster's objects from the default source.
func (o *Outputs) Set(cluster string, objects []*relaypb.OutputObject) {
	o.SetFrom("default", cluster, objects)
}

// SetFrom replaces what one source (translation, pass-through) contributes
// to cluster's set; the set is the union of every source's objects. Objects
// are sorted by manifest, so the same content gives the same set; a new
// version is made only when the content changed.
func (o *Outputs) SetFrom(source, cluster string, objects []*relaypb.OutputObject) {
	o.pubMu.Lock()
	defer o.pubMu.Unlock()
	o.mu.Lock()
	if o.sources[source] == nil {
		o.sources[source] = map[string][]*relaypb.OutputObject{}
	}
	o.sources[source][cluster] = append([]*relaypb.OutputObject(nil), objects...)
	o.mu.Unlock()
	o.publish(cluster)
}

// SetTrust replaces the mesh CAs cluster's agent must keep (shared trust);
// like objects, a new version is made only when they changed. Unchanged
// requests cost one digest of them, not of the cluster's whole set: the
// trust controller calls this for every cluster after every ack.
func (o *Outputs) SetTrust(cluster string, reqs []*relaypb.TrustRequest) {
	o.pubMu.Lock()
	defer o.pubMu.Unlock()
	sorted := append([]*relaypb.TrustRequest(nil), reqs...)
	sort.Slice(sorted, func(i, j int) bool {
		return sorted[i].GetNamespace()+"/"+sorted[i].GetMesh() < sorted[j].GetNamespace()+"/"+sorted[j].GetMesh()
	})
	sum := hex.EncodeToString(digest(sha256.New(), sorted))
	o.mu.Lock()
	if o.trustHash[cluster] == sum && o.trustSince[cluster] != 0 && o.sets[cluster] != nil {
		o.mu.Unlock()
		return
	}
	o.trust[cluster] = sorted
	o.mu.Unlock()
	o.publish(cluster)
	o.mu.Lock()
	o.trustHash[cluster], o.trustSince[cluster] = sum, o.sets[cluster].GetVersion()
	o.mu.Unlock()
}

// digest writes the deterministic encoding of each message to h and
// returns its sum.
func digest[M proto.Message](h hash.Hash, msgs []M) []byte {
	for _, m := range msgs {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		h.Write(b)
	}
	return h.Sum(nil)
}

// TrustVersion returns the version in which cluster's current trust
// requests were first published (0 if none were): an agent that acked it,
// or a later one, holds them.
func (o *Outputs) TrustVersion(cluster string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.trustSince[cluster]
}

// publish makes cluster's set from every source's objects and its trust
// requests. Callers hold pubMu.
func (o *Outputs) publish(cluster string) {
	o.mu.Lock()
	var sorted []*relaypb.OutputObject
	for _, bySource := range o.sources {
		sorted = append(sorted, bySource[cluster]...)
	}
	trust := o.trust[cluster]
	o.mu.Unlock()
	sort.Slice(sorted, func(i, j int) bool { return string(sorted[i].GetManifest()) < string(sorted[j].GetManifest()) })
	h := sha256.New()
	digest(h, sorted)
	h.Write([]byte{0})
	sum := hex.EncodeToString(digest(h, trust))
	o.mu.Lock()
	if o.hashes[cluster] == sum && o.sets[cluster] != nil {
		o.mu.Unlock()
		return
	}
	o.next++
	o.sets[cluster] = &relaypb.OutputSet{Version: o.next, Objects: sorted, Trust: trust}
	o.hashes[cluster] = sum
	headOf := o.heads
	published := o.tellLocked(cluster)
	o.mu.Unlock()
	// With heads, Get serves the new set only once the head names it: the
	// streams are woken now only if it already does (a replica that was
	// behind its leader), otherwise by HeadChanged. Waking a fleet's
	// streams here would only have each find nothing to send, on CPU the
	// translation and the head writes need.
	if headOf == nil {
		o.wake(cluster)
	} else if h, ok := headOf(cluster); ok && h.Digest == sum {
		o.wake(cluster)
	}
	for _, f := range published {
		f(cluster)
	}
}

// Resume makes sure cluster's next set goes out with a version above held,
// the version its agent says it applied (from this replica or another): if
// the current set's version is below it, the same set is published again
// with a higher version (an equal one is the set the agent holds). A held version no replica can have made
// (heads.Plausible) is refused, as it would exhaust the counter, and
// changes nothing.
func (o *Outputs) Resume(cluster string, held uint64, now time.Time) error {
	if !heads.Plausible(held, now) {
		return fmt.Errorf("resume version %d is ahead of every replica's", held)
	}
	o.pubMu.Lock()
	defer o.pubMu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.heads != nil {
		return nil // versions are the leader's heads: the same on every replica
	}
	if o.next < held {
		o.next = held
	}
	// The same version is the set this agent already holds (versions are
	// this replica's start time in nanoseconds plus its changes, so another
	// replica's equal version is not a concern): nothing to send again.
	if cur := o.sets[cluster]; cur != nil && cur.GetVersion() < held {
		o.next++
		o.restampLocked(cluster, o.next)
		o.wakeLocked(cluster)
	}
	return nil
}

// restampLocked gives cluster's current set version v. An agent holds its
// trust requests only once it acked v, so a rotation waits for that ack.
// Callers hold mu.
func (o *Outputs) restampLocked(cluster string, v uint64) {
	cur := o.sets[cluster]
	o.sets[cluster] = &relaypb.OutputSet{Version: v, Objects: cur.GetObjects(), Trust: cur.GetTrust()}
	if o.trustSince[cluster] != 0 {
		o.trustSince[cluster] = v
	}
}

// wakeLocked tells cluster's Pull streams that its set may have changed;
// a stream already woken is not woken twice. Callers hold mu.
func (o *Outputs) wakeLocked(cluster string) {
	for ch := range o.subs[cluster] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Get returns cluster's current set, or nil if none was published yet. An
// agent prunes what a set lacks, so "nothing known" must never be sent as an
// empty set. With heads, it returns the set only when its digest is the
// head's, stamped with the head's version: nil while this replica is behind
// or ahead of the leader.
func (o *Outputs) Get(cluster string) *relaypb.OutputSet {
	o.mu.Lock()
	set, sum, headOf := o.sets[cluster], o.hashes[cluster], o.heads
	o.mu.Unlock()
	if set == nil || headOf == nil {
		return set
	}
	h, ok := headOf(cluster)
	if !ok || h.Digest != sum {
		return nil
	}
	if h.Version == set.GetVersion() {
		return set
	}
	return &relaypb.OutputSet{Version: h.Version, Objects: set.GetObjects(), Trust: set.GetTrust()}
}

// UseHeads makes Get serve only what the leader decided (package heads);
// call before MarkReady.
func (o *Outputs) UseHeads(head func(cluster string) (heads.Head, bool)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.heads = head
}

// HeadChanged wakes cluster's Pull streams: its head moved.
func (o *Outputs) HeadChanged(cluster string) { o.wake(cluster) }

func (o *Outputs) wake(cluster string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.wakeLocked(cluster)
}

// tellLocked returns the OnPublish listeners to call now with cluster, or
// none if a Batch is running (cluster is then told at its end). Callers
// hold mu.
func (o *Outputs) tellLocked(cluster string) []func(string) {
	if o.batching > 0 {
		o.pending = append(o.pending, cluster)
		return nil
	}
	return o.published
}

// Batch runs f, which publishes many clusters' sets, and tells the
// OnPublish listeners about them when f returns, in one burst: the
// leader's head writer then writes the translation's heads in one round of
// shard writes instead of in several as the sets come.
func (o *Outputs) Batch(f func()) {
	o.mu.Lock()
	o.batching++
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.batching--
		var pending []string
		if o.batching == 0 {
			pending, o.pending = o.pending, nil
		}
		published := o.published
		o.mu.Unlock()
		for _, c := range pending {
			for _, f := range published {
				f(c)
			}
		}
	}()
	f()
}

// OnPublish registers f, called (without locks held) with each cluster
// whose set changed or was removed: the leader writes its head.
func (o *Outputs) OnPublish(f func(cluster string)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.published = append(o.published, f)
}

// Local returns the version and digest of cluster's own set, as this
// replica computed it (ok false: none).
func (o *Outputs) Local(cluster string) (heads.Head, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	set := o.sets[cluster]
	if set == nil {
		return heads.Head{}, false
	}
	return heads.Head{Version: set.GetVersion(), Digest: o.hashes[cluster]}, true
}

// Clusters returns the clusters with a set.
func (o *Outputs) Clusters() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.sets))
	for c := range o.sets {
		out = append(out, c)
	}
	return out
}

// Adopt starts a term as leader: every version this replica makes from now
// on is above every stored head; a set whose content is its cluster's head
// takes the head's version (no new head, and a rotation waiting for acks
// of it is not set back), and any other set gets a new version above its
// head, to be written as the new head.
func (o *Outputs) Adopt(stored map[string]heads.Head) {
	o.pubMu.Lock()
	defer o.pubMu.Unlock()
	o.mu.Lock()
	for _, h := range stored {
		o.next = max(o.next, h.Version)
	}
	for cluster, set := range o.sets {
		h, ok := stored[cluster]
		switch {
		case ok && h.Digest == o.hashes[cluster]:
			o.restampLocked(cluster, h.Version)
		case ok && set.GetVersion() <= h.Version:
			o.next++
			o.restampLocked(cluster, o.next)
		}
	}
	o.mu.Unlock()
}

// Version returns the version of cluster's current set, 0 if none.
func (o *Outputs) Version(cluster string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.sets[cluster].GetVersion()
}

// Remove forgets a cluster.
func (o *Outputs) Remove(cluster string) {
	o.mu.Lock()
	published := o.tellLocked(cluster)
	defer func() {
		for _, f := range published {
			f(cluster)
		}
	}()
	defer o.mu.Unlock()
	for _, bySource := range o.sources {
		delete(bySource, cluster)
	}
	delete(o.trust, cluster)
	delete(o.sets, cluster)
	delete(o.hashes, cluster)
	delete(o.trustSince, cluster)
	delete(o.trustHash, cluster)
}

// Subscribe returns a channel that receives a value after every change of
// cluster's set; call cancel when done.
func (o *Outputs) Subscribe(cluster string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	o.mu.Lock()
	if o.subs[cluster] == nil {
		o.subs[cluster] = map[chan struct{}]struct{}{}
	}
	o.subs[cluster][ch] = struct{}{}
	o.mu.Unlock()
	return ch, func() {
		o.mu.Lock()
		delete(o.subs[cluster], ch)
		o.mu.Unlock()
	}
}

// All returns every cluster's set, for the debug endpoint.
func (o *Outputs) All() map[string]*relaypb.OutputSet {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]*relaypb.OutputSet, len(o.sets))
	for k, v := range o.sets {
		out[k] = v
	}
	return out
}
