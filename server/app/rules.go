package app

import (
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
)

// The replica ownership rules: with several replicas, which replica does
// what for a cluster. Each is a named function the assembly uses and a
// table test states.

// clusterPlace is what a replica knows of a cluster when it decides what
// it owns.
type clusterPlace struct {
	// session: the cluster's agent has a session on this replica (its
	// snapshot is in this replica's view).
	session bool
	// relay and kubeconfig: the cluster is registered in that mode.
	relay, kubeconfig bool
	// leading: this replica holds the Lease.
	leading bool
}

// ownsDiscovered says whether this replica writes (or deletes) a cluster's
// discovered objects: the replica holding the cluster's session writes
// them; the leader deletes those of clusters that left. A registered
// cluster without a session here belongs to whichever replica its agent
// talks to.
func ownsDiscovered(c clusterPlace) bool {
	return c.session || (!c.relay && !c.kubeconfig && c.leading)
}

// isRegistered says whether a cluster is registered in either mode.
func isRegistered(c clusterPlace) bool { return c.relay || c.kubeconfig }

// ackSource is where the output controllers read what each cluster's agent
// acknowledged.
type ackSource interface {
	Ack(cluster string) *relaypb.PullAck
	OnAck(func(cluster string))
}

// acksFrom says where acknowledgements are read: with several replicas
// from the ack ledger and the clusters' status (KubeStatus.Ack), where the
// leader sees every cluster's whichever replica its agent talks to; the
// only replica reads its own view.
func acksFrom(several bool, view *server.View, status *server.KubeStatus) ackSource {
	if several {
		return status
	}
	return view
}

// sessionSink is what hears of sessions: with several replicas a replica
// whose agent moved on also forgets the cluster's snapshot (releasingSink),
// so it never writes a stale one over the new holder's.
func sessionSink(several bool, status *server.KubeStatus, view *server.View, mirror *server.Mirror) server.StatusSink {
	if several {
		return releasingSink{KubeStatus: status, view: view, mirror: mirror}
	}
	return status
}

// releasingSink keeps what KubeStatus hears besides sessions: the server
// finds those by type assertion, and a wrapper that hid them would write a
// bootstrapped certificate alone and never record the one a session
// presents.
var (
	_ server.BootstrapSink = releasingSink{}
	_ server.PresentedSink = releasingSink{}
)

// releasingSink forgets a cluster's snapshot when its last session on this
// replica ends: the agent reconnects to some replica, which then owns the
// cluster's discovered objects.
type releasingSink struct {
	*server.KubeStatus
	view   *server.View
	mirror *server.Mirror
}

func (r releasingSink) SessionChanged(cluster string, connected bool) {
	r.KubeStatus.SessionChanged(cluster, connected)
	if !connected {
		r.view.Release(cluster)
		// Whoever owns the cluster's objects now decides again: if the
		// session ended because the cluster was deregistered, the leader
		// deletes them (the release may come before the view's removal,
		// which then has nothing to announce).
		r.mirror.Kick(cluster)
	}
}
