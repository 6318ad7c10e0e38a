package relay

import (
	"sync"
	"time"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
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
}

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

// Accept stores a validated snapshot.
func (v *View) Accept(cluster string, s *relaypb.Snapshot, at time.Time) {
	v.mu.Lock()
	c := v.entry(cluster)
	changed := c.Snapshot == nil || c.Snapshot.GetHash() != s.GetHash()
	c.Snapshot, c.AcceptedAt, c.LastError = s, at, ""
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

// Acked records an agent's ack.
func (v *View) Acked(cluster string, ack *relaypb.PullAck, at time.Time) {
	v.mu.Lock()
	c := v.entry(cluster)
	c.Ack, c.AckedAt, c.Conflicts = ack, at, nil
	for _, r := range ack.GetResults() {
		if r.GetOutcome() == "conflict" || r.GetOutcome() == "error" {
			c.Conflicts = append(c.Conflicts, r)
		}
	}
	listeners := v.ackListeners
	v.mu.Unlock()
	for _, f := range listeners {
		f(cluster)
	}
}

// Ack returns the last ack of cluster's agent, or nil.
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

// Snapshot returns the last accepted snapshot of cluster, or nil.
func (v *View) Snapshot(cluster string) *relaypb.Snapshot {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if c := v.clusters[cluster]; c != nil {
		return c.Snapshot
	}
	return nil
}

// Clusters returns a copy of the view, for the debug endpoint.
func (v *View) Clusters() map[string]ClusterView {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make(map[string]ClusterView, len(v.clusters))
	for k, c := range v.clusters {
		out[k] = *c
	}
	return out
}
