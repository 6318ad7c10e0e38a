package server

import (
	"strings"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/relay"
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

// Accept stores a validated snapshot. Its endpoints with equal labels are
// made to share one map (relay.ShareLabels; a chunked push's already do):
// s is read only from here on.
func (v *View) Accept(cluster string, s *relaypb.Snapshot, at time.Time) {
	relay.ShareLabels(s)
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

// Snapshot returns the last accepted snapshot of cluster, or nil.
func (v *View) Snapshot(cluster string) *relaypb.Snapshot {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if c := v.clusters[cluster]; c != nil {
		return c.Snapshot
	}
	return nil
}

// Get returns a copy of what the view holds of cluster.
func (v *View) Get(cluster string) (ClusterView, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if c := v.clusters[cluster]; c != nil {
		return *c, true
	}
	return ClusterView{}, false
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
