package trust

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
)

// Every phase of a rotation and of its rollback, decided without an
// apiserver: a step is left only once every mesh acked it and, with Manual
// verification, once a continue named exactly that step — forward and back
// alike. The decision reads only the recorded status and the annotations,
// so a restarted server (which reads both back) decides the same.
func TestEveryStepBackWaitsForAcksAndItsOwnContinue(t *testing.T) {
	const fp = "f00d"
	now := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	rot := func(phase networkingv1alpha1.RotationPhase, step int32, awaiting bool) *networkingv1alpha1.RotationStatus {
		return &networkingv1alpha1.RotationStatus{Phase: phase, Step: step, AwaitingContinue: awaiting, NewRootFingerprint: fp,
			PendingMeshes: []string{"stale"}}
	}
	const (
		adding      = networkingv1alpha1.PhaseAddingNewRoot
		propagating = networkingv1alpha1.PhasePropagatingNewIntermediate
		deleting    = networkingv1alpha1.PhaseDeletingOldRoot
		finished    = networkingv1alpha1.PhaseFinished
		back        = networkingv1alpha1.PhaseRollingBack
		rolledBack  = networkingv1alpha1.PhaseRolledBack
	)
	for _, tc := range []struct {
		name      string
		rot       *networkingv1alpha1.RotationStatus
		pending   []string
		manual    bool
		cont      string
		fed       string // why SPIFFE federation peers are waited for
		wantPhase networkingv1alpha1.RotationPhase
		wantStep  int32
		awaiting  bool
		moved     bool
		message   string
	}{
		// Forward.
		{name: "AddingNewRoot waits for every ack", rot: rot(adding, 1, false), pending: []string{"m2"}, manual: true, cont: "AddingNewRoot/" + fp,
			wantPhase: adding, wantStep: 1, message: "waiting for 1 of 2 meshes to ack it: m2"},
		{name: "acked AddingNewRoot moves on without verification", rot: rot(adding, 1, false),
			wantPhase: propagating, wantStep: 2, moved: true},
		{name: "acked AddingNewRoot waits for a continue", rot: rot(adding, 1, false), manual: true,
			wantPhase: adding, wantStep: 1, awaiting: true, message: "`relaymesh ca rotate continue ns/vm` (or `rollback`)"},
		{name: "acked AddingNewRoot waits for federation peers", rot: rot(adding, 1, false), fed: "peers fetch it",
			wantPhase: adding, wantStep: 1, message: "AddingNewRoot (step 1): every mesh's root-cert.pem carries the old and the new root, intermediates still from the old; peers fetch it"},
		{name: "the federation wait comes before a continue", rot: rot(adding, 1, true), manual: true, cont: "AddingNewRoot/" + fp, fed: "peers fetch it",
			wantPhase: adding, wantStep: 1, message: "peers fetch it"},
		{name: "an ack still missing is said before the federation wait", rot: rot(adding, 1, false), pending: []string{"m2"}, fed: "peers fetch it",
			wantPhase: adding, wantStep: 1, message: "waiting for 1 of 2 meshes to ack it: m2"},
		{name: "PropagatingNewIntermediate never waits for federation peers", rot: rot(propagating, 2, false), fed: "peers fetch it",
			wantPhase: deleting, wantStep: 3, moved: true},
		{name: "step 1 back (the new root leaves) never waits for federation peers", rot: rot(back, 1, false), fed: "peers fetch it",
			wantPhase: back, wantStep: 0, moved: true},
		{name: "step 2 back (a rollback from DeletingOldRoot) waits for peers to hold the old root again", rot: rot(back, 2, true), manual: true, cont: "RollingBack/2/" + fp,
			fed: "peers fetch the old root", wantPhase: back, wantStep: 2, message: "RollingBack (step 2): every mesh's root-cert.pem carries both roots, intermediates from the new; peers fetch the old root"},
		{name: "a continue for another phase does nothing", rot: rot(propagating, 2, true), manual: true, cont: "AddingNewRoot/" + fp,
			wantPhase: propagating, wantStep: 2, awaiting: true},
		{name: "a continue for another root does nothing", rot: rot(propagating, 2, true), manual: true, cont: "PropagatingNewIntermediate/beef",
			wantPhase: propagating, wantStep: 2, awaiting: true},
		{name: "continued PropagatingNewIntermediate deletes the old root", rot: rot(propagating, 2, true), manual: true, cont: "PropagatingNewIntermediate/" + fp,
			wantPhase: deleting, wantStep: 3, moved: true},
		{name: "continued DeletingOldRoot finishes", rot: rot(deleting, 3, true), manual: true, cont: "DeletingOldRoot/" + fp,
			wantPhase: finished, wantStep: 3, moved: true},
		{name: "an ack lost after a restart waits again", rot: rot(deleting, 3, true), pending: []string{"m1"}, manual: true, cont: "DeletingOldRoot/" + fp,
			wantPhase: deleting, wantStep: 3, message: "waiting for 1 of 2 meshes"},

		// Back, from DeletingOldRoot: step 2 (both roots again), then 1
		// (intermediates from the old root), then 0 (the old root only).
		{name: "step 2 back waits for every ack", rot: rot(back, 2, false), pending: []string{"m1", "m2"}, manual: true,
			wantPhase: back, wantStep: 2, message: "waiting for 2 of 2 meshes to ack it: m1, m2"},
		{name: "acked step 2 back holds for a continue", rot: rot(back, 2, false), manual: true,
			wantPhase: back, wantStep: 2, awaiting: true, message: "Verify that every istiod and workload runs on it, then run `relaymesh ca rotate continue ns/vm`"},
		{name: "step 2 back still holds however often agents ack", rot: rot(back, 2, true), manual: true,
			wantPhase: back, wantStep: 2, awaiting: true},
		{name: "a forward continue does not take a step back", rot: rot(back, 2, true), manual: true, cont: "DeletingOldRoot/" + fp,
			wantPhase: back, wantStep: 2, awaiting: true},
		{name: "a continue of the phase without its step does not take a step back", rot: rot(back, 2, true), manual: true, cont: "RollingBack/" + fp,
			wantPhase: back, wantStep: 2, awaiting: true},
		{name: "continued step 2 back issues from the old root", rot: rot(back, 2, true), manual: true, cont: "RollingBack/2/" + fp,
			wantPhase: back, wantStep: 1, moved: true, message: "RollingBack (step 1)"},
		{name: "the continue of step 2 does not pass step 1", rot: rot(back, 1, false), manual: true, cont: "RollingBack/2/" + fp,
			wantPhase: back, wantStep: 1, awaiting: true},
		{name: "continued step 1 back takes the new root out", rot: rot(back, 1, true), manual: true, cont: "RollingBack/1/" + fp,
			wantPhase: back, wantStep: 0, moved: true, message: "RollingBack (step 0)"},
		{name: "step 0 back waits for every ack", rot: rot(back, 0, false), pending: []string{"m2"}, manual: true, cont: "RollingBack/1/" + fp,
			wantPhase: back, wantStep: 0},
		{name: "acked step 0 is rolled back without a continue", rot: rot(back, 0, false), manual: true, cont: "RollingBack/1/" + fp,
			wantPhase: rolledBack, wantStep: 0, moved: true, message: "rolled back"},
		{name: "without verification each acked step back moves on", rot: rot(back, 2, false),
			wantPhase: back, wantStep: 1, moved: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.rot.DeepCopy()
			got, moved := nextRotation(tc.rot, advanceInput{key: "ns/vm", pending: tc.pending, members: 2, manual: tc.manual, cont: tc.cont, now: now, federation: tc.fed})
			assert.Equal(t, before, tc.rot, "the recorded rotation is not changed")
			require.NotNil(t, got)
			assert.Equal(t, tc.moved, moved, "moved")
			assert.Equal(t, tc.wantPhase, got.Phase)
			assert.Equal(t, tc.wantStep, got.Step)
			assert.Equal(t, tc.awaiting, got.AwaitingContinue, "awaitingContinue")
			assert.Equal(t, tc.pending, got.PendingMeshes)
			assert.Equal(t, fp, got.NewRootFingerprint)
			if moved {
				require.NotNil(t, got.LastTransitionTime)
				assert.True(t, got.LastTransitionTime.Time.Equal(now))
			} else {
				assert.Nil(t, got.LastTransitionTime, "a held step keeps its transition time")
			}
			assert.Contains(t, got.Message, tc.message)
		})
	}
}

// At most 256 pending meshes are recorded (the CRD's limit), and the
// message names five.
func TestPendingMeshesAreBounded(t *testing.T) {
	var pending []string
	for i := range 300 {
		pending = append(pending, "mesh-"+strings.Repeat("x", i%3)+string(rune('a'+i%26)))
	}
	got, moved := nextRotation(&networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhaseRollingBack, Step: 1},
		advanceInput{pending: pending, members: 300, manual: true})
	assert.False(t, moved)
	assert.Len(t, got.PendingMeshes, 256)
	assert.Equal(t, 5, strings.Count(got.Message, "mesh-"), got.Message)
}

func TestContinueValueNamesARollbacksStep(t *testing.T) {
	for rot, want := range map[*networkingv1alpha1.RotationStatus]string{
		{Phase: networkingv1alpha1.PhaseAddingNewRoot, Step: 1, NewRootFingerprint: "ab"}:              "AddingNewRoot/ab",
		{Phase: networkingv1alpha1.PhasePropagatingNewIntermediate, Step: 2, NewRootFingerprint: "ab"}: "PropagatingNewIntermediate/ab",
		{Phase: networkingv1alpha1.PhaseRollingBack, Step: 2, NewRootFingerprint: "ab"}:                "RollingBack/2/ab",
		{Phase: networkingv1alpha1.PhaseRollingBack, Step: 1, NewRootFingerprint: "ab"}:                "RollingBack/1/ab",
	} {
		assert.Equal(t, want, ContinueValue(rot))
	}
}
