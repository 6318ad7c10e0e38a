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
	"go.step.sm/crypto/pemutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	rep, err := b.tryPublish(w, now)
	require.NoError(t, err)
	return rep
}

func (b *bundlePublisher) tryPublish(w *rotationWorld, now time.Time) (spiffefed.Report, error) {
	var members []spiffefed.Member
	for _, set := range w.outputs.All() {
		for _, req := range set.GetTrust() {
			m := spiffefed.Member{VirtualMesh: req.GetVirtualMesh(), TrustDomain: req.GetTrustDomain()}
			if !req.GetHold() {
				roots, err := spiffefed.ParseRoots(req.GetRootBundle())
				if err != nil {
					return spiffefed.Report{}, err
				}
				m.Roots = roots
			}
			members = append(members, m)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	next, rep := spiffefed.Next(b.state, members, now)
	snap, err := spiffefed.NewSnapshot(next, time.Minute)
	if err != nil {
		return rep, err
	}
	b.state, b.snap = next, snap
	return rep, nil
}

// run publishes every 50ms until ctx ends and kicks the controller after
// a change, as the server's writer and informer do.
func (b *bundlePublisher) run(ctx context.Context, w *rotationWorld) {
	for ctx.Err() == nil {
		if rep, err := b.tryPublish(w, time.Now()); err == nil && !rep.Empty() {
			w.ctl.Kick()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *bundlePublisher) published(td string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state.Bundles[td].Published
}

func (b *bundlePublisher) rootPublished(trustDomains []string, root *x509.Certificate) (time.Time, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.snap.RootPublished(trustDomains, root)
}

// With the SPIFFE bundle endpoint served, a rotation whose every mesh
// acked AddingNewRoot still waits: until the endpoint publishes the new
// root for every trust domain of the VirtualMesh, then for
// FederationWait (three refresh hints and the peers' poll period), and
// only then issues from the new root — with no other event than the wait's
// end. Federated peers thus trust the new root before any SVID chains to
// it (SPIFFE Federation spec: 3–5 refresh hints).
func TestRotationWaitsForFederationPeers(t *testing.T) {
	const wait = 5 * time.Second
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
		return adding(r) && strings.Contains(r.Message, "every mesh acked it; waiting for the SPIFFE bundle endpoint to publish the new root: 2 of 2 trust domains lack it: c1.local (not yet), c2.local (not yet)")
	}
	w.waitFor("AddingNewRoot acked", unpublished)
	// Every agent acks, again and again: not published, so no move.
	w.stillThere("acked, the new root not yet published", w.clusters, unpublished)

	published := time.Now()
	rep := pub.publish(t, w, published)
	require.ElementsMatch(t, []string{"c1.local", "c2.local"}, rep.Changed, "old + new published")
	w.ctl.Kick()
	w.waitFor("published, within the wait", func(r *networkingv1alpha1.RotationStatus) bool {
		return adding(r) && strings.Contains(r.Message, "the new root has been published at the SPIFFE bundle endpoint since") &&
			strings.Contains(r.Message, "(5s: three refresh hints and the federated peers' poll period)")
	})

	// The wait's end alone moves it: nothing syncs, publishes or kicks.
	var moved *networkingv1alpha1.RotationStatus
	require.Eventually(t, func() bool {
		moved = w.vm().Status.Rotation
		return moved != nil && moved.Phase == networkingv1alpha1.PhasePropagatingNewIntermediate
	}, 15*time.Second, 50*time.Millisecond, "PropagatingNewIntermediate once the wait ended")
	require.NotNil(t, moved.LastTransitionTime)
	assert.False(t, moved.LastTransitionTime.Time.Before(published.Add(wait).Truncate(time.Second)),
		"nothing issued from the new root before %v after it was published: moved at %v, published %v", wait, moved.LastTransitionTime.Time, published)
	w.waitFor("Finished", phaseIs(networkingv1alpha1.PhaseFinished, false))
}

// A rollback from DeletingOldRoot, where peers fetched bundles of the new
// root only, puts the old root back (RollingBack step 2) and must not
// issue from it (step 1) before peers fetched it again: even with the
// continue for step 2 given at once, step 1 comes no sooner than
// FederationWait after the old root was published again. (A rollback from
// an earlier step issues from a root the bundles carried all along: no
// wait.)
func TestRollbackWaitsForPeersAgain(t *testing.T) {
	const wait = 4 * time.Second
	w := setupRotationWorld(t, 2, "{generated: {}}", true)
	pub := &bundlePublisher{}
	w.start(func(c *trust.Config) { c.FederationWait, c.RootPublished = wait, pub.rootPublished })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go pub.run(ctx, w)
	w.waitFor("steady", func(r *networkingv1alpha1.RotationStatus) bool { return r == nil })
	w.annotate(networkingv1alpha1.AnnotationRootGeneration, "2")
	vm := w.waitFor("AddingNewRoot, after the wait", phaseIs(networkingv1alpha1.PhaseAddingNewRoot, true))
	nu := vm.Status.Rotation.NewRootFingerprint
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "AddingNewRoot/"+nu)
	w.waitFor("PropagatingNewIntermediate", phaseIs(networkingv1alpha1.PhasePropagatingNewIntermediate, true))
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "PropagatingNewIntermediate/"+nu)
	w.waitFor("DeletingOldRoot", phaseIs(networkingv1alpha1.PhaseDeletingOldRoot, true))
	require.Eventually(t, func() bool {
		_, err := pub.rootPublished([]string{"c1.local", "c2.local"}, recordedRoot(t, w.vm().Status.Rotation, true))
		return err != nil
	}, 10*time.Second, 20*time.Millisecond, "peers are served the new root only")

	// Back: the spec names the old root again; step 2's continue at once.
	w.annotate(networkingv1alpha1.AnnotationRotationContinue, "RollingBack/2/"+nu)
	body := []byte(`{"metadata":{"annotations":{"` + networkingv1alpha1.AnnotationRootGeneration + `":null}}}`)
	_, err := w.dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace(w.ns).Patch(w.ctx, "shared", types.MergePatchType, body, metav1.PatchOptions{})
	require.NoError(t, err)
	w.waitFor("RollingBack step 2 waits for the old root's peers", func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == networkingv1alpha1.PhaseRollingBack && r.Step == 2 && strings.Contains(r.Message, "the old root has been published at the SPIFFE bundle endpoint since")
	})
	republished := pub.published("c1.local")
	require.False(t, republished.IsZero())
	vm = w.waitFor("RollingBack step 1", func(r *networkingv1alpha1.RotationStatus) bool {
		return r != nil && r.Phase == networkingv1alpha1.PhaseRollingBack && r.Step == 1
	})
	assert.False(t, vm.Status.Rotation.LastTransitionTime.Time.Before(republished.Add(wait).Truncate(time.Second)),
		"nothing issued from the old root again before %v after it was published again (%v): moved at %v", wait, republished, vm.Status.Rotation.LastTransitionTime.Time)
}

// recordedRoot is the old or the new root a rotation status records.
func recordedRoot(t *testing.T, rot *networkingv1alpha1.RotationStatus, old bool) *x509.Certificate {
	t.Helper()
	bundle, fp := rot.NewRoots, rot.NewRootFingerprint
	if old {
		bundle, fp = rot.OldRoots, rot.OldRootFingerprint
	}
	roots, err := pemutil.ParseCertificateBundle([]byte(bundle))
	require.NoError(t, err)
	for _, r := range roots {
		if trust.Fingerprint(r) == fp {
			return r
		}
	}
	t.Fatalf("no root %s in the status", fp)
	return nil
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
