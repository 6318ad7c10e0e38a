package trust_test

import (
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bundlePublisher is what the server's SPIFFE bundle endpoint does with
// the trust requests the controller published (server/app
// bundleendpoint.go), at the instants the test chooses: spiffefed.Next
// over every cluster's requests, served as a Snapshot.
type bundlePublisher struct {
	mu    sync.Mutex
	state spiffefed.State
	snap  *spiffefed.Snapshot
}

func (b *bundlePublisher) publish(t *testing.T, w *rotationWorld, now time.Time) spiffefed.Report {
	t.Helper()
	var members []spiffefed.Member
	for _, set := range w.outputs.All() {
		for _, req := range set.GetTrust() {
			m := spiffefed.Member{VirtualMesh: req.GetVirtualMesh(), TrustDomain: req.GetTrustDomain()}
			if !req.GetHold() {
				roots, err := spiffefed.ParseRoots(req.GetRootBundle())
				require.NoError(t, err)
				m.Roots = roots
			}
			members = append(members, m)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	next, rep := spiffefed.Next(b.state, members, now)
	snap, err := spiffefed.NewSnapshot(next, time.Minute)
	require.NoError(t, err)
	b.state, b.snap = next, snap
	return rep
}

func (b *bundlePublisher) rootPublished(vm string, root *x509.Certificate) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.snap.RootPublished(vm, root)
}

// With the SPIFFE bundle endpoint served, a rotation whose every mesh
// acked AddingNewRoot still waits: until the endpoint publishes the new
// root for every trust domain of the VirtualMesh, then for
// FederationWait (three refresh hints and the peers' poll period), and
// only then issues from the new root — with no other event than the wait's
// end. Federated peers thus trust the new root before any SVID chains to
// it (SPIFFE Federation spec: 3–5 refresh hints).
func TestRotationWaitsForFederationPeers(t *testing.T) {
	const wait = 3 * time.Second
	w := setupRotationWorld(t, 2, "{generated: {}}", false)
	pub := &bundlePublisher{}
	w.start(func(c *trust.Config) { c.FederationWait, c.RootPublished = wait, pub.rootPublished })
	w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	require.Eventually(t, func() bool { return len(pub.publish(t, w, time.Now()).Changed) == 2 }, 10*time.Second, 50*time.Millisecond,
		"the old root is published for c1.local and c2.local")

	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	adding := func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == networkingv1alpha1.PhaseAddingNewRoot && len(r.PendingMeshes) == 0
	}
	unpublished := func(r *networkingv1alpha1.RotationStatus) bool {
		return adding(r) && strings.Contains(r.Message, "every mesh acked it; waiting for the SPIFFE bundle endpoint to publish the new root for every trust domain")
	}
	w.waitFor("AddingNewRoot acked", unpublished)
	// Every agent acks, again and again: not published, so no move.
	w.stillThere("acked, the new root not yet published", w.clusters, unpublished)

	published := time.Now()
	rep := pub.publish(t, w, published)
	require.ElementsMatch(t, []string{"c1.local", "c2.local"}, rep.Changed, "old + new published")
	w.ctl.Kick()
	vm := w.stillThere("published, within the wait", w.clusters, adding)
	assert.Contains(t, vm.Status.Rotation.Message, "the new root has been published at the SPIFFE bundle endpoint since")
	assert.Contains(t, vm.Status.Rotation.Message, "(3s: three refresh hints and the federated peers' poll period)")

	// The wait's end alone moves it: nothing syncs, publishes or kicks.
	var moved *networkingv1alpha1.RotationStatus
	require.Eventually(t, func() bool {
		moved = w.vm().Status.Rotation
		return moved != nil && moved.Phase == networkingv1alpha1.PhasePropagatingNewIntermediate
	}, 15*time.Second, 50*time.Millisecond, "PropagatingNewIntermediate once the wait ended")
	require.NotNil(t, moved.LastTransitionTime)
	assert.False(t, moved.LastTransitionTime.Time.Before(published.Truncate(time.Second).Add(wait)),
		"nothing issued from the new root before %v after it was published: moved at %v, published %v", wait, moved.LastTransitionTime.Time, published)
	w.waitFor("Finished", phaseIs(networkingv1alpha1.PhaseFinished, false))
}
