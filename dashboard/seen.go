package dashboard

import (
	"context"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
)

// An idle agent's session writes nothing (a status write per agent every
// few seconds would cost a fleet of 1,000 clusters hundreds of writes a
// second), so the status's lastSeen is the session's last event, not the
// last time the agent was heard. While a session is held, the session is
// the evidence: the replica holding it renews its own Lease every few
// seconds, and the server's keepalive closes a session whose agent stops
// answering (a ping after 30 s of silence, 10 s to answer), so a session
// still held at the replica's last renewal means the agent answered within
// SessionKeepalive of it. See docs/design/2026-12-01-last-seen.md.

// SessionKeepalive bounds how long before a held session's proof (its
// replica's Lease renewal) the agent last answered: the relay's keepalive
// time plus its timeout (server/server.go).
const SessionKeepalive = 40 * time.Second

// Replicas is an optional capability of Agents: when each live server
// replica last renewed its Lease, by replica name. Implementations MUST
// return only replicas whose Lease is current, and MUST be safe for
// concurrent use.
type Replicas interface {
	Replicas(ctx context.Context) (map[string]time.Time, error)
}

// Seen is what can be said of when a cluster's agent was last heard.
type Seen struct {
	// At is when: the holding replica's last Lease renewal while a live
	// replica holds the session, else the status's last event.
	At time.Time
	// HeldBy is the live replica holding the session; empty when none is
	// proven to (disconnected, leader election off, the replica gone, or
	// the Leases unreadable).
	HeldBy string
}

// LastSeen is when st's agent was last heard at now, given the live
// replicas' last Lease renewals (nil: unknown).
func LastSeen(st multiclusterv1alpha1.KubernetesClusterStatus, replicas map[string]time.Time, now time.Time) Seen {
	var s Seen
	if st.LastSeen != nil {
		s.At = st.LastSeen.UTC()
	}
	if !st.Connected || st.Replica == "" {
		return s
	}
	renewed, live := replicas[st.Replica]
	if !live {
		return s
	}
	if renewed.After(now) {
		renewed = now // the replica's clock is ahead of ours
	}
	if renewed.After(s.At) {
		s.At = renewed.UTC()
	}
	s.HeldBy = st.Replica
	return s
}

// SeenAgo says it for people: "now (replica X)" while a replica holds the
// session, else "5m ago" (or never).
func SeenAgo(s Seen, now time.Time) string {
	if s.HeldBy != "" {
		return "now (replica " + s.HeldBy + ")"
	}
	return ago(s.At, now)
}
