package trust_test

import (
	"context"
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
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

// The bundle endpoint's https_spiffe X509-SVID is issued from the root
// its trust domain's VirtualMesh issues from now, through an intermediate
// name-constrained to that trust domain, and EndpointIssuer follows the
// rotation: the old root until PropagatingNewIntermediate, the new one
// from then on. A trust domain no VirtualMesh issues for gets none.
func TestTheBundleEndpointsSVIDFollowsTheIssuingRoot(t *testing.T) {
	w := newRotationWorldOf(t, 2, "{generated: {}}", true)
	vm := w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	old := vm.Status.SharedTrust.RootFingerprint
	id := spiffeid.RequireFromString("spiffe://c1.local/relaymesh/bundle-endpoint")
	check := func(wantIssuer string) {
		t.Helper()
		fp, err := w.ctl.EndpointIssuer("c1.local")
		require.NoError(t, err)
		assert.Equal(t, wantIssuer, fp)
		svid, issuer, err := w.ctl.EndpointSVID(context.Background(), id, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, wantIssuer, issuer)
		require.Len(t, svid.Certificates, 2, "leaf and intermediate (a generated root signs directly)")
		leaf, inter := svid.Certificates[0], svid.Certificates[1]
		assert.Equal(t, id, svid.ID)
		assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, leaf.ExtKeyUsage)
		assert.LessOrEqual(t, leaf.NotAfter.Sub(leaf.NotBefore), time.Hour+time.Minute)
		assert.True(t, inter.IsCA && inter.MaxPathLenZero)
		assert.Equal(t, []string{"c1.local"}, inter.PermittedURIDomains, "name-constrained to its trust domain")
		var root *x509.Certificate
		for _, ca := range w.meshCAs()["c1"].Roots {
			if trust.Fingerprint(ca) == wantIssuer {
				root = ca
			}
		}
		require.NotNil(t, root, "the issuer is a root the meshes hold")
		_, _, err = x509svid.Verify(svid.Certificates, x509bundle.FromX509Authorities(id.TrustDomain(), []*x509.Certificate{root}))
		require.NoError(t, err, "verifies against the issuing root")
	}
	check(old)

	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	vm = w.waitFor("AddingNewRoot acked", phaseIs(networkingv1alpha1.PhaseAddingNewRoot, true))
	check(old)
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, trust.ContinueValue(vm.Status.Rotation))
	vm = w.waitFor("PropagatingNewIntermediate acked", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))
	check(vm.Status.Rotation.NewRootFingerprint)

	_, err := w.ctl.EndpointIssuer("nowhere.local")
	require.ErrorIs(t, err, trust.ErrNoIssuer)
	_, _, err = w.ctl.EndpointSVID(context.Background(), spiffeid.RequireFromString("spiffe://nowhere.local/x"), time.Hour)
	require.ErrorIs(t, err, trust.ErrNoIssuer)
}
