package server

import (
	"encoding/hex"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TrustBundleSource is the relay trust bundle sessions deliver during a
// relay root rotation (docs/design/2026-12-02-relay-root-rotation.md),
// and where their acknowledgements go.
type TrustBundleSource interface {
	// Current is the bundle every agent must pin now, or nil outside a
	// rotation. It MUST be cheap: every session asks at every ping. The
	// returned message MUST NOT be changed afterwards.
	Current() *relaypb.TrustBundle
	// Serving is the bundle of the roots the replica serves under outside
	// a rotation (revision 0), sent to an agent whose Hello reported other
	// pinned roots; nil when there is none to send. It MUST be cheap.
	Serving() *relaypb.TrustBundle
	// Acknowledged records what cluster's agent answered: canAcknowledge
	// false (an agent whose Hello did not say trust_bundles, reported once
	// per session with ack nil) is never an acknowledgement; ack.Error
	// set is a refusal. It MUST NOT block.
	Acknowledged(cluster string, canAcknowledge bool, ack *relaypb.TrustBundleAck)
}

// Bounds of an acknowledgement: a fingerprint is hex SHA-256, the reason
// of a refusal at most 512 bytes (the agent truncates it).
const (
	fingerprintLen = 64
	maxAckErrorLen = 512
)

// bundleDelivery is one session's side of trust bundle delivery.
type bundleDelivery struct {
	src     TrustBundleSource
	cluster string
	can     bool
	pinned  string // fingerprint of the roots the agent pinned at Hello; "" once compared, or unknown
	sent    string // fingerprint last sent
}

// newBundleDelivery starts a session's delivery from its Hello; a malformed
// pinned-roots fingerprint ends the session.
func (s *Server) newBundleDelivery(cluster string, hello *relaypb.Hello) (*bundleDelivery, error) {
	pinned := hello.GetPinnedRootsFingerprint()
	if pinned != "" && !isFingerprint(pinned) {
		return nil, status.Error(codes.InvalidArgument, "malformed pinned_roots_fingerprint in Hello: want 64 hex digits")
	}
	d := &bundleDelivery{src: s.cfg.TrustBundles, cluster: cluster, can: hello.GetTrustBundles(), pinned: pinned}
	if d.src != nil && !d.can {
		d.src.Acknowledged(cluster, false, nil)
	}
	return d, nil
}

func isFingerprint(fp string) bool {
	_, err := hex.DecodeString(fp)
	return err == nil && len(fp) == fingerprintLen
}

// offer sends the current bundle if it changed since the last one this
// session sent; an agent that cannot acknowledge gets none. Outside a
// rotation an agent whose Hello reported other roots than the replica
// serves under gets those: it was away when the rotation delivered its
// last bundle, and would pin the retired root until the next rotation.
// That comparison is made once per session, at its first offer outside a
// rotation, not at every ping: a later rotation reaches the session
// through Current.
func (d *bundleDelivery) offer(send func(*relaypb.TrustBundle) error) error {
	if d.src == nil || !d.can {
		return nil
	}
	b := d.src.Current()
	if b == nil && d.pinned != "" {
		if sv := d.src.Serving(); sv != nil && sv.GetFingerprint() != d.pinned {
			b = sv
		}
		d.pinned = ""
	}
	if b == nil || b.GetFingerprint() == d.sent {
		return nil
	}
	if err := send(proto.CloneOf(b)); err != nil {
		return err
	}
	d.sent = b.GetFingerprint()
	return nil
}

// acknowledged checks an acknowledgement's shape and hands it on; a
// malformed one ends the session.
func (d *bundleDelivery) acknowledged(ack *relaypb.TrustBundleAck) error {
	fp := ack.GetFingerprint()
	if !isFingerprint(fp) || len(ack.GetError()) > maxAckErrorLen {
		return status.Error(codes.InvalidArgument, "malformed trust bundle acknowledgement")
	}
	if d.src == nil || fp != d.sent {
		// Not an answer to the bundle this session sent (none, or an
		// older one): recording it would let an agent make its replica
		// write its KubernetesCluster at will.
		return nil
	}
	d.src.Acknowledged(d.cluster, d.can, ack)
	return nil
}
