package trust

import (
	"fmt"
	"strings"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// advanceInput is what advance observed of one VirtualMesh's rotation: the
// meshes whose agents have not acked the current step, how many meshes
// there are, whether the VirtualMesh verifies manually and the continue
// annotation it carries.
type advanceInput struct {
	key     string   // namespace/name, for the commands the message names
	pending []string // sorted
	members int
	manual  bool
	cont    string // the relaymesh.io/rotation-continue annotation
	now     time.Time
	// federation: why AddingNewRoot waits for SPIFFE federation peers
	// (Controller.federationWait); empty: it does not.
	federation string
	// ambient: why AddingNewRoot may not issue from the new root
	// (AmbientRefusal); empty: no member runs ambient.
	ambient string
}

// nextRotation decides, from the recorded rotation and what advance
// observed, the rotation to record next and whether it moved to another
// step or phase. It is pure: rot is not changed, and nothing is read or
// written.
//
// A step is left only once every mesh acked it. A step whose next issues
// from a root peers may not hold (waitsForFederation) is left only once
// that root was published at the SPIFFE bundle endpoint long enough for
// federated peers to trust it (in.federation says why not yet).
// With Manual verification
// it is left only after `relaymesh ca rotate continue` for exactly that
// step, forward and back alike: a rollback from PropagatingNewIntermediate
// or DeletingOldRoot is a rotation in reverse (both roots in every bundle,
// then intermediates of the old root, then the old root alone), and a
// bundle that loses the new root before every workload holds a certificate
// of the old intermediate breaks handshakes. Step 0 of a rollback is not
// held: it changes nothing more in the meshes, RolledBack only records it.
func nextRotation(rot *networkingv1alpha1.RotationStatus, in advanceInput) (*networkingv1alpha1.RotationStatus, bool) {
	r := rot.DeepCopy()
	if len(in.pending) > 0 {
		r.PendingMeshes = in.pending[:min(len(in.pending), 256)]
		r.AwaitingContinue = false
		r.Message = phaseMessage(StrategyOf(rot), rot.Phase, rot.Step) + fmt.Sprintf("; waiting for %d of %d meshes to ack it: %s",
			len(in.pending), in.members, strings.Join(in.pending[:min(len(in.pending), 5)], ", "))
		return r, false
	}
	rollingBack := r.Phase == networkingv1alpha1.PhaseRollingBack
	if in.federation != "" && waitsForFederation(r) {
		r.PendingMeshes, r.AwaitingContinue = nil, false
		r.Message = phaseMessage(StrategyOf(rot), r.Phase, r.Step) + "; " + in.federation
		return r, false
	}
	if in.ambient != "" && r.Phase == networkingv1alpha1.PhaseAddingNewRoot {
		// Never forward onto the new root while a member runs ambient; a
		// rollback stays possible.
		r.PendingMeshes, r.AwaitingContinue = nil, false
		r.Message = phaseMessage(StrategyOf(rot), r.Phase, r.Step) + "; held: " + in.ambient + "; or `relaymesh ca rotate rollback " + in.key + "`"
		return r, false
	}
	if in.manual && !(rollingBack && r.Step == 0) && in.cont != ContinueValue(rot) {
		r.PendingMeshes, r.AwaitingContinue = nil, true
		if rollingBack {
			r.Message = phaseMessage(StrategyOf(rot), r.Phase, r.Step) + "; every mesh acked it. Verify that every istiod and workload runs on it, then run `relaymesh ca rotate continue " + in.key + "` to take the next step back"
		} else {
			r.Message = phaseMessage(StrategyOf(rot), r.Phase, r.Step) + "; every mesh acked it. Verify, then run `relaymesh ca rotate continue " + in.key + "` (or `rollback`)"
		}
		return r, false
	}
	now := metav1.NewTime(in.now)
	r.PendingMeshes, r.AwaitingContinue, r.LastTransitionTime = nil, false, &now
	switch {
	case rollingBack && r.Step == 0:
		r.Phase = networkingv1alpha1.PhaseRolledBack
		r.Message = "rolled back: every mesh holds the old root only again. spec.mtls.shared.rootCA still names the new root; it is rotated to again after `relaymesh ca rotate start`, or when the spec names another root"
	case rollingBack:
		r.Step--
		r.Message = phaseMessage(StrategyOf(rot), r.Phase, r.Step)
	case r.Step >= 3:
		r.Phase = networkingv1alpha1.PhaseFinished
		r.Message = "finished: every mesh holds the new root only, and intermediates from it"
	default:
		r.Step++
		r.Phase = phaseOf(r.Step)
		r.Message = phaseMessage(StrategyOf(rot), r.Phase, r.Step)
	}
	return r, true
}

// waitsForFederation reports whether leaving rot's step issues from a
// root federated peers may not hold yet: AddingNewRoot → the new root;
// RollingBack step 2 (a rollback from DeletingOldRoot, where peers dropped
// the old root) → the old root. Every other step issues from a root the
// bundles carried all along, or removes one.
func waitsForFederation(rot *networkingv1alpha1.RotationStatus) bool {
	return rot.Phase == networkingv1alpha1.PhaseAddingNewRoot || rot.Phase == networkingv1alpha1.PhaseRollingBack && rot.Step == 2
}

// ContinueValue is the relaymesh.io/rotation-continue annotation that lets
// rot leave the step it waits in: "<phase>/<new root fingerprint>", and for
// RollingBack, whose steps share one phase, "RollingBack/<step>/<new root
// fingerprint>", so a continue for one step back never lets the next one
// pass too.
func ContinueValue(rot *networkingv1alpha1.RotationStatus) string {
	if rot.Phase == networkingv1alpha1.PhaseRollingBack {
		return fmt.Sprintf("%s/%d/%s", rot.Phase, rot.Step, rot.NewRootFingerprint)
	}
	return string(rot.Phase) + "/" + rot.NewRootFingerprint
}
