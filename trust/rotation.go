package trust

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/internal/text"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"go.step.sm/crypto/pemutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A MultiRoot rotation moves every mesh of a VirtualMesh through four steps,
// each only once every mesh's agent acked the one before:
//
//	step 0: root-cert.pem = old;       intermediates from old  (before; after a rollback)
//	step 1: root-cert.pem = old + new; intermediates from old  (AddingNewRoot)
//	step 2: root-cert.pem = old + new; intermediates from new  (PropagatingNewIntermediate)
//	step 3: root-cert.pem = new;       intermediates from new  (DeletingOldRoot, then Finished)
//
// A CrossSigned rotation keeps one root in every root-cert.pem, for data
// planes that trust a single root (ztunnel: the last certificate of the
// chain istiod's CA returns), and signs each intermediate twice while the
// roots change places:
//
//	step 0: root-cert.pem = old; intermediate from old
//	step 1: root-cert.pem = old; intermediate from old, and the same intermediate from new
//	step 2: root-cert.pem = new; intermediate from new, and the same intermediate from old
//	step 3: root-cert.pem = new; intermediate from new
//
// cert-chain.pem carries both signatures in steps 1 and 2, and with it
// every certificate the mesh's istiod issues: a workload that trusts only
// the old root verifies it through one, a workload that trusts only the new
// root through the other (one CA below either root, within its path
// length). The same key signs leaves in both, so the leaf names one issuer.
//
// Neighbouring steps trust each other's certificates, so no handshake
// between meshes fails while agents apply a step at different times. A
// rollback walks the steps back down, a rotation in reverse: from step 3
// the old root comes back into every bundle first (step 2), then
// intermediates from the old root (step 1), and the new root leaves the
// bundles last (step 0). Like the forward steps, each step back is left
// only once every mesh acked it and, with Manual verification, once
// `relaymesh ca rotate continue` confirmed that every istiod and workload
// runs on it (nextRotation decides; advance observes and records). The
// state lives in the VirtualMesh's status (written before the next step is
// published), so a restarted server resumes it, holds included.

// vmState is what the controller holds of one VirtualMesh's trust; the
// status mirrors it.
type vmState struct {
	inForce  *networkingv1alpha1.RootSource
	fp       string // the in-force root's fingerprint
	subject  string
	notAfter time.Time
	message  string // why the meshes' CAs are held
	rotation *networkingv1alpha1.RotationStatus
	// federation: the cross-certificates of foreign roots (foreign.go).
	federation []networkingv1alpha1.FederatedTrustStatus
}

func (s *vmState) clone() *vmState {
	n := *s
	n.inForce = s.inForce.DeepCopy()
	n.rotation = s.rotation.DeepCopy()
	n.federation = nil
	for _, e := range s.federation {
		n.federation = append(n.federation, *e.DeepCopy())
	}
	return &n
}

// active reports whether rot is a rotation still moving.
func active(rot *networkingv1alpha1.RotationStatus) bool {
	return rot != nil && Rotating(rot.Phase)
}

// Rotating reports whether phase is one of a rotation still moving.
func Rotating(phase networkingv1alpha1.RotationPhase) bool {
	switch phase {
	case networkingv1alpha1.PhaseAddingNewRoot, networkingv1alpha1.PhasePropagatingNewIntermediate,
		networkingv1alpha1.PhaseDeletingOldRoot, networkingv1alpha1.PhaseRollingBack:
		return true
	}
	return false
}

// vmPlan is what one VirtualMesh asks of its meshes now.
type vmPlan struct {
	key    string
	vm     *networkingv1alpha1.VirtualMesh
	signer *root  // issues intermediates; nil when held or unavailable
	bundle []byte // root-cert.pem
	issuer string
	hold   bool // keep the meshes' CAs as they are
	// ambient are the member meshes with an ambient data plane: a
	// MultiRoot rotation never starts, nor issues from its new root, while
	// there are any (AmbientRefusal).
	ambient []string
	// cross signs every intermediate a second time (a CrossSigned
	// rotation's steps 1 and 2; nil when it cannot be loaded, and then
	// signer is nil too); crossIssuer is its root's fingerprint and
	// crossRoot that root's PEM. Empty: one signature.
	cross       *root
	crossIssuer string
	crossRoot   []byte
}

// StrategyOf is the strategy rot follows: the one it recorded, else
// MultiRoot (rotations recorded before strategies were).
func StrategyOf(rot *networkingv1alpha1.RotationStatus) networkingv1alpha1.RotationStrategy {
	if rot == nil || rot.Strategy == "" {
		return networkingv1alpha1.RotationMultiRoot
	}
	return rot.Strategy
}

// specStrategy is the strategy vm's spec asks for, MultiRoot by default.
func specStrategy(vm *networkingv1alpha1.VirtualMesh) networkingv1alpha1.RotationStrategy {
	if vm.Spec.MTLS == nil || vm.Spec.MTLS.RotationStrategy == "" {
		return networkingv1alpha1.RotationMultiRoot
	}
	return vm.Spec.MTLS.RotationStrategy
}

// AmbientMembers are the names of the meshes whose data plane is ambient,
// wholly or partly (a ztunnel runs, or workloads run in ambient mode).
func AmbientMembers(members []*discoveryv1alpha1.Mesh) []string {
	var out []string
	for _, m := range members {
		ist := m.Spec.Istio
		if ist == nil {
			continue
		}
		if (ist.Ambient != nil && ist.Ambient.Ztunnel) || slices.Contains(ist.DataPlaneModes, discoveryv1alpha1.DataPlaneAmbient) {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// AmbientRefusal says why a MultiRoot rotation may not issue from a new
// root while meshes run ambient. ztunnel trusts exactly one root, the last
// certificate of the chain istiod's CA returns (Istio issues 47427 and
// 61719): once one mesh's intermediate is under the new root, its
// workloads and the ztunnels still under the old root fail each other's
// handshakes (BadSignature) until every certificate is re-issued.
func AmbientRefusal(meshes []string) string {
	return fmt.Sprintf("MultiRoot is refused while meshes run ambient (%s): ztunnel trusts only the root at the end of its own chain, so "+
		"intermediates under two roots break traffic between them until every certificate is re-issued; "+
		"set rotationStrategy CrossSigned (one root in every bundle, intermediates signed by both while they change places), "+
		"or rotate once no member runs ambient, or with rotationStrategy None in a maintenance window (every mesh switches at once)",
		strings.Join(meshes, ", "))
}

// stateOf returns the state of vm, from memory, else from its status (a
// restarted server), else empty (a new VirtualMesh).
func (c *Controller) stateOf(key string, vm *networkingv1alpha1.VirtualMesh) *vmState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.vmst[key]; st != nil {
		return st
	}
	return c.adoptLocked(key, vm)
}

// plan decides what vm's meshes must hold now, starting a rotation when the
// spec names another root than the one in force. A replica that does not
// lead decides nothing new: it plans what the status records.
func (c *Controller) plan(ctx context.Context, vm *networkingv1alpha1.VirtualMesh, leading bool, ambient []string) *vmPlan {
	key := vm.Namespace + "/" + vm.Name
	vm = c.follow(ctx, key, vm, leading)
	p := &vmPlan{key: key, vm: vm, ambient: ambient}
	st := c.stateOf(key, vm)
	if active(st.rotation) {
		c.planRotation(ctx, p, st)
		return p
	}
	spec := specSource(vm)
	if st.inForce == nil {
		return c.planFirst(ctx, p, spec, leading)
	}
	in, err := c.load(ctx, vm, *st.inForce, false)
	if err == nil && in.fingerprint != st.fp {
		err = fmt.Errorf("it changed in place (fingerprint %s…, was %s…): put a new root in a new place and point spec.mtls.shared.rootCA at it, so it is rotated to", ShortFingerprint(in.fingerprint), ShortFingerprint(st.fp))
	}
	if err != nil {
		c.hold(ctx, p, fmt.Sprintf("the root in force (%s) cannot be used: %v", describe(*st.inForce), err))
		return p
	}
	if sameSource(spec, *st.inForce) {
		c.persist(ctx, key, func(n *vmState) {
			n.message = ""
			if rot := n.rotation; rot != nil && rot.Phase == networkingv1alpha1.PhaseFailed {
				n.rotation = nil
			}
		})
		p.steady(in)
		return p
	}
	if rot := st.rotation; rot != nil && rot.Phase == networkingv1alpha1.PhaseRolledBack && rot.To != nil && sameSource(spec, *rot.To) &&
		vm.Annotations[networkingv1alpha1.AnnotationRotationRetry] != rot.NewRootFingerprint {
		// Rolled back from the root the spec names: stay, without even
		// loading it (a load that fails must not turn this into a Failed
		// that a later good load would take as a new rotation).
		c.persist(ctx, key, func(n *vmState) { n.message = "" })
		p.steady(in)
		return p
	}
	if !leading {
		// Another root, or a failed one, or a rotation the leader has not
		// recorded yet: the root in force stays until the status says
		// otherwise (and a new generated root is the leader's to make).
		p.steady(in)
		return p
	}
	next, err := c.load(ctx, vm, spec, true)
	if err != nil {
		c.log.Error("the root spec.mtls.shared.rootCA names cannot be used; the root in force stays", "virtual_mesh", key, "error", err)
		c.persist(ctx, key, func(n *vmState) {
			n.message = ""
			n.rotation = &networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhaseFailed, OldRootFingerprint: n.fp,
				Message: text.Truncate("not rotating: the root spec.mtls.shared.rootCA names cannot be used ("+err.Error()+"); the root in force stays", 1024)}
		})
		p.steady(in)
		return p
	}
	switch rot := st.rotation; {
	case next.fingerprint == st.fp:
		// The same root, found in another place.
		c.persist(ctx, key, func(n *vmState) { n.setInForce(spec, next) })
		p.steady(next)
	case rot != nil && rot.Phase == networkingv1alpha1.PhaseRolledBack && rot.NewRootFingerprint == next.fingerprint &&
		vm.Annotations[networkingv1alpha1.AnnotationRotationRetry] != next.fingerprint:
		p.steady(in) // stays rolled back until the spec names another root, or a retry is asked
	case specStrategy(vm) == networkingv1alpha1.RotationNone:
		now := metav1.NewTime(c.cfg.Clock())
		if c.persist(ctx, key, func(n *vmState) {
			n.rotation = &networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhaseFinished, Step: 3, LastTransitionTime: &now,
				OldRootFingerprint: n.fp, NewRootFingerprint: next.fingerprint, From: n.inForce.DeepCopy(), To: spec.DeepCopy(),
				Message: "rotationStrategy None: the new root replaced the old at once; connections between meshes fail until every mesh holds it"}
			n.setInForce(spec, next)
		}) {
			c.log.Warn("root replaced at once (rotationStrategy None)", "virtual_mesh", key, "old", ShortFingerprint(st.fp), "new", ShortFingerprint(next.fingerprint))
			c.deleteGeneratedRoot(ctx, vm, *st.inForce)
			p.steady(next)
		} else {
			p.steady(in)
		}
	case len(ambient) > 0 && specStrategy(vm) == networkingv1alpha1.RotationMultiRoot:
		// Not started: the root in force stays, the status says why, and
		// the rotation starts once no member runs ambient.
		msg := text.Truncate("not rotating: "+AmbientRefusal(ambient)+"; the root in force stays", 1024)
		if rot := st.rotation; rot != nil && rot.Phase == networkingv1alpha1.PhaseFailed && rot.Message == msg && rot.NewRootFingerprint == next.fingerprint {
			p.steady(in) // refused already, for the same reason
			return p
		}
		if c.persist(ctx, key, func(n *vmState) {
			n.message = ""
			n.rotation = &networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhaseFailed, OldRootFingerprint: n.fp,
				NewRootFingerprint: next.fingerprint, Message: msg}
		}) {
			c.log.Warn("root rotation refused: meshes run ambient", "virtual_mesh", key, "meshes", ambient)
		}
		p.steady(in)
	default:
		// Steering annotations left from an earlier rotation to the same
		// root would continue or roll back this one at once.
		if err := c.clearSteering(ctx, vm, next.fingerprint); err != nil {
			c.log.Warn("not starting the rotation yet: its old steering annotations could not be removed", "virtual_mesh", key, "error", err)
			p.steady(in)
			return p
		}
		now := metav1.NewTime(c.cfg.Clock())
		if !c.persist(ctx, key, func(n *vmState) {
			n.rotation = &networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhaseAddingNewRoot, Step: 1, LastTransitionTime: &now,
				OldRootFingerprint: n.fp, NewRootFingerprint: next.fingerprint, From: n.inForce.DeepCopy(), To: spec.DeepCopy(),
				OldRoots: string(pemRoots(in.roots)), NewRoots: string(pemRoots(next.roots)), Strategy: specStrategy(vm),
				Message: phaseMessage(specStrategy(vm), networkingv1alpha1.PhaseAddingNewRoot, 1)}
		}) {
			p.steady(in)
			return p
		}
		c.log.Info("root rotation started", "virtual_mesh", key, "strategy", specStrategy(vm), "old", ShortFingerprint(st.fp), "new", ShortFingerprint(next.fingerprint))
		c.planRotation(ctx, p, c.stateOf(key, vm))
	}
	return p
}

func (s *vmState) setInForce(src networkingv1alpha1.RootSource, r *root) {
	s.inForce, s.fp, s.subject, s.notAfter, s.message = src.DeepCopy(), r.fingerprint, r.cert.Subject.String(), r.cert.NotAfter, ""
}

// setInForceRecorded makes the root of a finished rotation the root in
// force; its subject and expiry are known only if it could be loaded.
func (s *vmState) setInForceRecorded(src networkingv1alpha1.RootSource, fp string, r *root) {
	if r != nil && r.fingerprint == fp {
		s.setInForce(src, r)
		return
	}
	s.inForce, s.fp, s.subject, s.notAfter = src.DeepCopy(), fp, "", time.Time{}
}

func (p *vmPlan) steady(r *root) {
	p.signer, p.bundle, p.issuer = r, pemRoots(r.roots), r.fingerprint
}

// hold keeps the meshes' CAs as they are, and says why in the status.
func (c *Controller) hold(ctx context.Context, p *vmPlan, why string) {
	c.log.Error("holding the meshes' CAs as they are", "virtual_mesh", p.key, "reason", why)
	p.hold = true
	c.persist(ctx, p.key, func(n *vmState) { n.message = text.Truncate(why, 1024) })
}

// planFirst makes the spec's root the root in force of a VirtualMesh the
// controller has no record of (new, or its status lost). Nothing is
// published before it is recorded, and a status that shows intermediates
// from another root holds the meshes instead of switching them at once.
func (c *Controller) planFirst(ctx context.Context, p *vmPlan, spec networkingv1alpha1.RootSource, leading bool) *vmPlan {
	var issued []networkingv1alpha1.MeshCAStatus
	if prev := p.vm.Status.SharedTrust; prev != nil {
		issued = prev.Meshes
	}
	if !leading {
		// Nothing recorded: the leader makes (or loads) the root and
		// records it; until then nothing is asked, as on the leader before
		// its record.
		p.hold = len(issued) > 0
		return p
	}
	r, err := c.load(ctx, p.vm, spec, true)
	if err != nil {
		if len(issued) > 0 {
			c.hold(ctx, p, fmt.Sprintf("the root spec.mtls.shared.rootCA names (%s) cannot be used: %v", describe(spec), err))
			return p
		}
		c.log.Error("VirtualMesh root unavailable; nothing is asked of its meshes", "virtual_mesh", p.key, "error", err)
		return p
	}
	for _, m := range issued {
		if m.Issuer != "" && m.Issuer != r.fingerprint {
			c.hold(ctx, p, fmt.Sprintf("status.sharedTrust.root is missing and mesh %s holds an intermediate from root %s…, not from the root the spec names (%s…): "+
				"restore the status, or point the spec at that root and rotate from there", m.Mesh, ShortFingerprint(m.Issuer), ShortFingerprint(r.fingerprint)))
			return p
		}
	}
	if !c.persist(ctx, p.key, func(n *vmState) { n.setInForce(spec, r) }) {
		if len(issued) > 0 {
			p.hold = true
		}
		return p
	}
	p.steady(r)
	return p
}

// planRotation publishes the current step of an active rotation, after
// turning it into a rollback if one was asked for. The bundles come from
// the roots recorded in the status, so a root that cannot be loaded only
// stops what needs its key: issuing intermediates from it.
func (c *Controller) planRotation(ctx context.Context, p *vmPlan, st *vmState) {
	rot := st.rotation
	if rot.From == nil || rot.To == nil || rot.Step < 0 || rot.Step > 3 {
		c.hold(ctx, p, "rotation paused: status.rotation is incomplete (from, to and a step 0–3 are required); restore it, or roll back by hand")
		return
	}
	fromRoots, err := recordedRoots(rot.OldRoots, rot.OldRootFingerprint)
	if err != nil {
		c.hold(ctx, p, "rotation paused: status.rotation.oldRoots: "+err.Error())
		return
	}
	toRoots, err := recordedRoots(rot.NewRoots, rot.NewRootFingerprint)
	if err != nil {
		c.hold(ctx, p, "rotation paused: status.rotation.newRoots: "+err.Error())
		return
	}
	if rot.Phase != networkingv1alpha1.PhaseRollingBack && c.rollbackAsked(p.vm, rot) {
		now := metav1.NewTime(c.cfg.Clock())
		step := max(rot.Step-1, 0)
		if c.persist(ctx, p.key, func(n *vmState) {
			n.rotation.Phase, n.rotation.Step, n.rotation.AwaitingContinue, n.rotation.LastTransitionTime = networkingv1alpha1.PhaseRollingBack, step, false, &now
			n.rotation.Message = phaseMessage(StrategyOf(n.rotation), networkingv1alpha1.PhaseRollingBack, step)
		}) {
			c.log.Warn("root rotation rolling back", "virtual_mesh", p.key, "to_step", step)
		}
		rot = c.stateOf(p.key, p.vm).rotation
	}
	// Only the root the step issues from must be loaded.
	src, fp, what := rot.From, rot.OldRootFingerprint, "old"
	if rot.Step >= 2 {
		src, fp, what = rot.To, rot.NewRootFingerprint, "new"
	}
	signer, err := c.load(ctx, p.vm, *src, false)
	if err == nil && signer.fingerprint != fp {
		err = errors.New("it changed in place during the rotation (its fingerprint is not the one the rotation started with)")
	}
	message := ""
	if err != nil {
		signer = nil
		message = fmt.Sprintf("the %s root (%s) cannot be used: %v; meshes that already hold this step ack it, no intermediate is issued until it can be used", what, describe(*src), err)
		c.log.Error("rotation step published without a signer", "virtual_mesh", p.key, "step", rot.Step, "error", err)
	}
	crossSigned := StrategyOf(rot) == networkingv1alpha1.RotationCrossSigned
	if crossSigned && (rot.Step == 1 || rot.Step == 2) {
		// The other root signs every intermediate too. The request names
		// it from the status, so a mesh that holds this step acks it even
		// when that root cannot be loaded; nothing is issued then (one
		// signature would leave the peers that trust only it).
		src, fp, what, roots := rot.To, rot.NewRootFingerprint, "new", toRoots
		if rot.Step == 2 {
			src, fp, what, roots = rot.From, rot.OldRootFingerprint, "old", fromRoots
		}
		p.crossIssuer = fp
		p.crossRoot = ca.CertsPEM(roots[slices.IndexFunc(roots, func(r *x509.Certificate) bool { return Fingerprint(r) == fp })])
		cross, err := c.load(ctx, p.vm, *src, false)
		if err == nil && cross.fingerprint != fp {
			err = errors.New("it changed in place during the rotation (its fingerprint is not the one the rotation started with)")
		}
		switch {
		case err != nil:
			signer = nil
			message = strings.TrimPrefix(message+"; ", "; ") + fmt.Sprintf("the %s root (%s), which signs every intermediate too in this step, cannot be used: %v; "+
				"meshes that already hold this step ack it, no intermediate is issued until it can be used", what, describe(*src), err)
			c.log.Error("rotation step published without its second signer", "virtual_mesh", p.key, "step", rot.Step, "error", err)
		case signer != nil:
			p.cross = cross
		}
	}
	c.persist(ctx, p.key, func(n *vmState) { n.message = text.Truncate(message, 1024) })
	switch {
	case crossSigned && rot.Step <= 1, rot.Step == 0:
		p.bundle = pemRoots(fromRoots)
	case crossSigned, rot.Step == 3:
		p.bundle = pemRoots(toRoots)
	default:
		p.bundle = pemRoots(fromRoots, toRoots)
	}
	p.signer, p.issuer = signer, fp
}

// recordedRoots parses a root bundle recorded in status.rotation, which
// must carry the root of fingerprint fp.
func recordedRoots(bundle, fp string) ([]*x509.Certificate, error) {
	roots, err := pemutil.ParseCertificateBundle([]byte(bundle))
	if err != nil {
		return nil, errors.New("not PEM certificates")
	}
	if !slices.ContainsFunc(roots, func(r *x509.Certificate) bool { return Fingerprint(r) == fp }) {
		return nil, fmt.Errorf("does not carry the root %s…", ShortFingerprint(fp))
	}
	return roots, nil
}

// clearSteering removes the continue, rollback and retry annotations of vm
// that name the root fp.
func (c *Controller) clearSteering(ctx context.Context, vm *networkingv1alpha1.VirtualMesh, fp string) error {
	stale := map[string]any{}
	for _, a := range []string{networkingv1alpha1.AnnotationRotationContinue, networkingv1alpha1.AnnotationRotationRollback, networkingv1alpha1.AnnotationRotationRetry} {
		if v, ok := vm.Annotations[a]; ok && (v == fp || strings.HasSuffix(v, "/"+fp)) {
			stale[a] = nil
		}
	}
	if len(stale) == 0 {
		return nil
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": vm.ResourceVersion, "annotations": stale}})
	if err != nil {
		return err
	}
	res, err := c.cfg.Dynamic.Resource(networkingv1alpha1.VirtualMeshes).Namespace(vm.Namespace).
		Patch(ctx, vm.Name, types.MergePatchType, body, metav1.PatchOptions{})
	if err != nil {
		return err
	}
	// The patch changed no status: if the status it returns records the
	// state this replica holds, the state is current as of the patch
	// (else the next status write is refused and the state read afresh).
	c.resumeAfter(vm.Namespace+"/"+vm.Name, res)
	// This reconcile goes on with vm: it must not see them either. A
	// copy of the map: vm may share it with a cache (listTyped).
	vm.Annotations = maps.Clone(vm.Annotations)
	for a := range stale {
		delete(vm.Annotations, a)
	}
	return nil
}

// rollbackAsked: `relaymesh ca rotate rollback`, or a spec that names the
// old root again.
func (c *Controller) rollbackAsked(vm *networkingv1alpha1.VirtualMesh, rot *networkingv1alpha1.RotationStatus) bool {
	return vm.Annotations[networkingv1alpha1.AnnotationRotationRollback] == rot.NewRootFingerprint || sameSource(specSource(vm), *rot.From)
}

// advance observes an active rotation's acks and records what nextRotation
// decides of them: on once every member mesh's agent acked the current
// step (and, with Manual verification, once continue was asked for that
// step, forward or back). It reports whether the rotation moved.
func (c *Controller) advance(ctx context.Context, p *vmPlan, members []*meshTrust) bool {
	st := c.stateOf(p.key, p.vm)
	rot := st.rotation
	if p.hold || !active(rot) || p.bundle == nil || !c.leading() {
		return false
	}
	if rot.Phase != networkingv1alpha1.PhaseRollingBack && c.rollbackAsked(p.vm, rot) {
		return false // the rollback was not recorded yet: never move forward instead
	}
	var pending []string
	for _, mt := range members {
		if !c.acked(mt.cluster, mt.req.GetNamespace(), mt.req.GetCrossIssuer()) {
			pending = append(pending, mt.req.GetMesh())
		}
	}
	slices.Sort(pending)
	in := advanceInput{key: p.key, pending: pending, members: len(members), now: c.cfg.Clock(),
		manual: p.vm.Spec.MTLS.RotationVerification == networkingv1alpha1.VerificationManual,
		cont:   p.vm.Annotations[networkingv1alpha1.AnnotationRotationContinue]}
	if len(pending) == 0 && waitsForFederation(rot) {
		in.federation = c.federationWait(rot, members, in.now)
	}
	if len(p.ambient) > 0 && StrategyOf(rot) == networkingv1alpha1.RotationMultiRoot {
		in.ambient = AmbientRefusal(p.ambient)
	}
	moved := false
	recorded := c.persist(ctx, p.key, func(n *vmState) {
		if !active(n.rotation) || n.rotation.Phase != rot.Phase || n.rotation.Step != rot.Step {
			return // moved meanwhile: decided on what was observed of another step
		}
		n.rotation, moved = nextRotation(n.rotation, in)
		if moved && n.rotation.Phase == networkingv1alpha1.PhaseFinished {
			n.setInForceRecorded(*n.rotation.To, n.rotation.NewRootFingerprint, p.signer)
		}
	})
	moved = moved && recorded
	if moved {
		after := c.stateOf(p.key, p.vm).rotation
		c.log.Info("root rotation moved on", "virtual_mesh", p.key, "phase", after.Phase, "step", after.Step)
		if after.Phase == networkingv1alpha1.PhaseFinished {
			c.deleteGeneratedRoot(ctx, p.vm, *after.From)
		}
	}
	return moved
}

// federationWait is why the rotation of p may not leave its step yet for
// SPIFFE federation (empty: it may). It asks only of a step whose next one
// issues from a root peers may not hold: AddingNewRoot (the new root) and
// RollingBack step 2, a rollback from DeletingOldRoot (the old root, which
// peers dropped at step 3). That root must have been published for every
// trust domain of the VirtualMesh's meshes, since the step began, for
// FederationWait. It asks for a reconcile when the wait ends.
func (c *Controller) federationWait(rot *networkingv1alpha1.RotationStatus, members []*meshTrust, now time.Time) string {
	wait := c.cfg.FederationWait
	if wait <= 0 || c.cfg.RootPublished == nil {
		return ""
	}
	which, bundle, fp := "new", rot.NewRoots, rot.NewRootFingerprint
	if rot.Phase == networkingv1alpha1.PhaseRollingBack {
		which, bundle, fp = "old", rot.OldRoots, rot.OldRootFingerprint
	}
	roots, err := recordedRoots(bundle, fp)
	if err != nil {
		return fmt.Sprintf("every mesh acked it; not moving on: the %s root of status.rotation %v", which, err) // never move on what cannot be checked
	}
	root := roots[slices.IndexFunc(roots, func(r *x509.Certificate) bool { return Fingerprint(r) == fp })]
	var tds []string
	for _, mt := range members {
		if td := mt.req.GetTrustDomain(); td != "" && !slices.Contains(tds, td) {
			tds = append(tds, td)
		}
	}
	slices.Sort(tds)
	since, err := c.cfg.RootPublished(tds, root)
	if err != nil {
		return fmt.Sprintf("every mesh acked it; waiting for the SPIFFE bundle endpoint to publish the %s root: %v", which, err)
	}
	// Never from before the step began: the root (re)appears in the
	// bundles with it, whatever a stored time says.
	if rot.LastTransitionTime != nil && since.Before(rot.LastTransitionTime.Time) {
		since = rot.LastTransitionTime.Time
	}
	until := since.Add(wait)
	if !now.Before(until) {
		return ""
	}
	c.kickAt(until, until.Sub(now))
	return fmt.Sprintf("every mesh acked it; the %s root has been published at the SPIFFE bundle endpoint since %s; "+
		"nothing is issued from it before %s (%v: three refresh hints and the federated peers' poll period) so that every peer trusts it first",
		which, since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339), wait)
}

// kickAt asks for a reconcile at t, in d. One timer, for the earliest
// instant asked: the reconcile it causes asks again for any later one.
func (c *Controller) kickAt(t time.Time, d time.Duration) {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	if c.kickTimer != nil && !t.Before(c.kickWhen) {
		return
	}
	if c.kickTimer != nil {
		c.kickTimer.Stop()
	}
	c.kickWhen = t
	c.kickTimer = time.AfterFunc(d+10*time.Millisecond, func() {
		c.kickMu.Lock()
		c.kickTimer = nil
		c.kickMu.Unlock()
		c.Kick()
	})
}

// acked reports whether cluster's agent acked the cluster's current trust
// requests and holds the cacerts of namespace as asked: with the second
// signature of root cross, when a CrossSigned step asks for one (an agent
// that does not report one, of an earlier release, holds the step).
func (c *Controller) acked(cluster, namespace, cross string) bool {
	if c.cfg.Acks == nil {
		return false
	}
	ack := c.cfg.Acks.Ack(cluster)
	if ack == nil || ack.GetVersion() < c.cfg.Outputs.TrustVersion(cluster) {
		return false
	}
	for _, r := range ack.GetResults() {
		if r.GetKind() == "Secret" && r.GetNamespace() == namespace && r.GetName() == SecretName {
			return (r.GetOutcome() == "applied" || r.GetOutcome() == "unchanged") && r.GetCrossIssuer() == cross
		}
	}
	return false
}

func phaseOf(step int32) networkingv1alpha1.RotationPhase {
	switch step {
	case 1:
		return networkingv1alpha1.PhaseAddingNewRoot
	case 2:
		return networkingv1alpha1.PhasePropagatingNewIntermediate
	default:
		return networkingv1alpha1.PhaseDeletingOldRoot
	}
}

func phaseMessage(strategy networkingv1alpha1.RotationStrategy, phase networkingv1alpha1.RotationPhase, step int32) string {
	held := [...]string{
		"every mesh's root-cert.pem carries the old root only, intermediates from it",
		"every mesh's root-cert.pem carries the old and the new root, intermediates still from the old",
		"every mesh's root-cert.pem carries both roots, intermediates from the new",
		"every mesh's root-cert.pem carries the new root only, intermediates from it",
	}
	if strategy == networkingv1alpha1.RotationCrossSigned {
		held = [...]string{
			"every mesh's root-cert.pem carries the old root only, intermediates from it",
			"every mesh's root-cert.pem carries the old root only, intermediates signed by the old root and by the new",
			"every mesh's root-cert.pem carries the new root only, intermediates signed by the new root and by the old",
			"every mesh's root-cert.pem carries the new root only, intermediates from it",
		}
	}
	return fmt.Sprintf("%s (step %d): %s", phase, step, held[min(max(step, 0), 3)])
}

// persist applies change to a copy of key's state, writes the status it
// makes, and keeps the copy only if the write succeeded: a step is never
// published before it is recorded. It reports whether the state is
// recorded.
func (c *Controller) persist(ctx context.Context, key string, change func(*vmState)) bool {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if !c.leading() {
		return false // a follower records nothing, so moves nothing
	}
	c.mu.Lock()
	cur := c.vmst[key]
	if cur == nil {
		c.mu.Unlock()
		return false
	}
	next := cur.clone()
	change(next)
	body, err := c.statusBody(key, next)
	c.mu.Unlock()
	if err != nil {
		return false
	}
	if err := c.patchStatus(ctx, key, body); err != nil {
		if !errors.Is(err, errStale) && !errors.Is(err, errNotLeading) {
			c.log.Warn("could not write the VirtualMesh's trust status; not moving on", "virtual_mesh", key, "error", err)
		}
		return false
	}
	c.mu.Lock()
	c.vmst[key] = next
	c.mu.Unlock()
	return true
}

// pemRoots is the root bundle of the given roots, each once, in order.
func pemRoots(sets ...[]*x509.Certificate) []byte {
	var out []*x509.Certificate
	for _, set := range sets {
		for _, r := range set {
			if !slices.ContainsFunc(out, func(o *x509.Certificate) bool { return o.Equal(r) }) {
				out = append(out, r)
			}
		}
	}
	return ca.CertsPEM(out...)
}

// ShortFingerprint is the first 16 hex digits of a fingerprint, for people.
func ShortFingerprint(fp string) string {
	if len(fp) > 16 {
		return fp[:16]
	}
	return fp
}
