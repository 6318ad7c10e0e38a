package ca

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Where a relay root rotation keeps its state: annotations on
// RootSecretName, and the staged new root (with an issuing CA under it)
// in the same Secret's data, so that one Update writes a phase together
// with its material (docs/design/2026-12-02-relay-root-rotation.md).
const (
	annotationRootPhase      = "relaymesh.io/root-rotation-phase"
	annotationRootOld        = "relaymesh.io/root-rotation-old"
	annotationRootNew        = "relaymesh.io/root-rotation-new"
	annotationRootSince      = "relaymesh.io/root-rotation-since"
	annotationRootRevision   = "relaymesh.io/root-rotation-revision"
	annotationRootRolledBack = "relaymesh.io/root-rotation-rolled-back"
	annotationRootGrace      = "relaymesh.io/root-rotation-grace"
	// AnnotationRootRequest is the operator's request (RootRequest) that
	// relaymesh ca relay rotate writes and the rotation consumes.
	AnnotationRootRequest = "relaymesh.io/root-rotation-request"

	keyNextRoot      = "next.crt"
	keyNextRootKey   = "next.key"
	keyNextIssuer    = "next-issuer.crt"
	keyNextIssuerKey = "next-issuer.key"
	// keyNextPrevious holds the staged root's issuing CAs that a renewal
	// replaced while they may have issued (RootActRenewStagedIssuer): at
	// most maxPreviousIssuers, accepted while the staged root is.
	keyNextPrevious = "next-previous.crt"
)

// stagedKeys is every key of the staged root's material.
var stagedKeys = []string{keyNextRoot, keyNextRootKey, keyNextIssuer, keyNextIssuerKey, keyNextPrevious}

// DecodeRootRotation reads the rotation state and the pending request of
// the relay root Secret. A Secret without rotation annotations is Idle on
// its root at revision 0. Annotations that do not parse, or that name a
// current root other than the Secret's, are an error wrapping
// ErrRootRotationState.
func DecodeRootRotation(root *corev1.Secret) (RootRotationState, RootRequest, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: secret %s/%s: %s", ErrRootRotationState, root.Namespace, root.Name, fmt.Sprintf(format, a...))
	}
	cert, err := singleCertPEM(root.Data[keyCACert])
	if err != nil {
		return RootRotationState{}, "", bad("%s: %v", keyCACert, err)
	}
	ann := root.Annotations
	req := RootRequest(ann[AnnotationRootRequest])
	switch req {
	case RootRequestNone, RootRequestStart, RootRequestRollback:
	default:
		return RootRotationState{}, "", bad("annotation %s is not start or rollback", AnnotationRootRequest)
	}
	st := RootRotationState{Phase: RootIdle, Old: RootFingerprint(cert)}
	phase, ok := ann[annotationRootPhase]
	if !ok {
		return st, req, nil
	}
	st.Phase, st.Old, st.New = RootPhase(phase), ann[annotationRootOld], ann[annotationRootNew]
	if st.Revision, err = strconv.Atoi(ann[annotationRootRevision]); err != nil || st.Revision > 1<<30 {
		return RootRotationState{}, "", bad("annotation %s is not a revision", annotationRootRevision)
	}
	if v := ann[annotationRootSince]; v != "" {
		if st.Since, err = time.Parse(time.RFC3339, v); err != nil {
			return RootRotationState{}, "", bad("annotation %s is not an RFC 3339 time", annotationRootSince)
		}
	}
	st.RolledBack = ann[annotationRootRolledBack] == "true"
	// The grace only informs check and status: one that does not parse,
	// or is not in (0, maxRecordedGrace], is unknown rather than an error
	// that would stop replicas loading the rotation.
	if g, err := time.ParseDuration(ann[annotationRootGrace]); err == nil && g > 0 && g <= maxRecordedGrace {
		st.Grace = g
	}
	if err := st.Validate(); err != nil {
		return RootRotationState{}, "", fmt.Errorf("secret %s/%s: %w", root.Namespace, root.Name, err)
	}
	// ca.crt holds the root that was first, until it leaves.
	first := st.Old
	if st.RolledBack && st.Phase != RootIdle {
		first = st.New
	}
	if first != RootFingerprint(cert) {
		return RootRotationState{}, "", bad("the rotation names a root other than %s", keyCACert)
	}
	return st, req, nil
}

// encodeRootRotation writes st into s's annotations.
func encodeRootRotation(st RootRotationState, s *corev1.Secret) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[annotationRootPhase] = string(st.Phase)
	s.Annotations[annotationRootOld] = st.Old
	s.Annotations[annotationRootNew] = st.New
	s.Annotations[annotationRootSince] = st.Since.UTC().Format(time.RFC3339)
	s.Annotations[annotationRootRevision] = strconv.Itoa(st.Revision)
	s.Annotations[annotationRootRolledBack] = strconv.FormatBool(st.RolledBack)
	if st.Grace > 0 {
		s.Annotations[annotationRootGrace] = st.Grace.String()
	} else {
		delete(s.Annotations, annotationRootGrace)
	}
}

// maxRecordedGrace bounds the grace a rotation state may record: ten
// years, past any root's life.
const maxRecordedGrace = 10 * 365 * 24 * time.Hour

// stagedRoot is the staged new root of s, or nil. A staged root that does
// not load (malformed, key not matching, not a root, its issuing CA not
// under it or not valid now) is an error.
func stagedRoot(s *corev1.Secret, now time.Time) (*RelayCA, error) {
	return loadStagedRoot(s, now, false)
}

// stagedRootToStep is stagedRoot for the rotation step, which also loads a
// staged root whose issuing CA has expired (it is then past due, and
// renewed): replicas refuse to load such a state, and a step that refused
// it too could never repair it.
func stagedRootToStep(s *corev1.Secret, now time.Time) (*RelayCA, error) {
	return loadStagedRoot(s, now, true)
}

func loadStagedRoot(s *corev1.Secret, now time.Time, expiredIssuer bool) (*RelayCA, error) {
	if len(s.Data[keyNextRoot]) == 0 {
		return nil, nil
	}
	var r RelayCA
	var err error
	bad := func(key string, err error) error {
		return fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, s.Namespace, s.Name, key, err)
	}
	if r.Root, err = singleCertPEM(s.Data[keyNextRoot]); err != nil {
		return nil, bad(keyNextRoot, err)
	}
	if r.RootKey, err = parseKeyPEM(s.Data[keyNextRootKey]); err != nil {
		return nil, bad(keyNextRootKey, err)
	}
	if r.Issuer, err = singleCertPEM(s.Data[keyNextIssuer]); err != nil {
		return nil, bad(keyNextIssuer, err)
	}
	if r.IssuerKey, err = parseKeyPEM(s.Data[keyNextIssuerKey]); err != nil {
		return nil, bad(keyNextIssuerKey, err)
	}
	at := now
	if expiredIssuer && !now.Before(r.Issuer.NotAfter) {
		at = r.Issuer.NotAfter.Add(-time.Second)
	}
	if err := r.check(at); err != nil {
		return nil, bad(keyNextRoot, err)
	}
	return &r, nil
}

// RootStepConfig configures StepRootRotation.
type RootStepConfig struct {
	// CA shapes a new root (RootTTL, IssuerTTL, Org, Clock, Rand): the
	// same GenerateConfig as the first.
	CA GenerateConfig
	// Rotation decides.
	Rotation RootRotationConfig
	// IssuerRenewAt is the fraction of the staged issuing CA's life after
	// which it is renewed (IssuerRenewalTime); default
	// DefaultIssuerRenewAt, in [0.1, 0.9] like the current one's.
	IssuerRenewAt float64
}

// RootObserver gathers what the Lease holder knows beyond the Secret: the
// agents and the lowest revision a live replica loaded.
type RootObserver func(ctx context.Context, st RootRotationState) (agents []AgentRootObservation, loadedRevision int, err error)

// StepRootRotation is one step of the relay root rotation in namespace,
// run by one replica at a time (the Lease holder): it reads the relay
// root Secret, decides with NextRootRotation and writes the decided state
// with its actions' material in one Update carrying the Secret's
// resourceVersion, so a concurrent writer makes it fail and change
// nothing, and a replica killed at any point leaves either the old or the
// new state. A Secret that does not decode is left as it is.
//
// When RootActDeleteOld made the staged root the root, the next step
// first switches the signing secret to the staged issuing CA
// (finishPromotion). Not yet: replicas that load the state, accept both
// roots and switch issuance in Switching (see the design note).
func StepRootRotation(ctx context.Context, client kubernetes.Interface, namespace string, cfg RootStepConfig, observe RootObserver) (RootDecision, error) {
	cfg.CA = cfg.CA.Default()
	if err := cfg.CA.Validate(); err != nil {
		return RootDecision{}, fmt.Errorf("ca: invalid generate config: %w", err)
	}
	if cfg.IssuerRenewAt == 0 {
		cfg.IssuerRenewAt = DefaultIssuerRenewAt
	}
	if cfg.IssuerRenewAt < 0.1 || cfg.IssuerRenewAt > 0.9 {
		return RootDecision{}, fmt.Errorf("ca: invalid root step config: issuerRenewAt: %v is outside [0.1, 0.9]", cfg.IssuerRenewAt)
	}
	secrets := client.CoreV1().Secrets(namespace)
	root, err := getSecret(ctx, secrets, RootSecretName)
	if err != nil {
		return RootDecision{}, err
	}
	if root == nil {
		return RootDecision{}, fmt.Errorf("%w: secret %s/%s not found", ErrInvalidSigner, namespace, RootSecretName)
	}
	st, req, err := DecodeRootRotation(root)
	if err != nil {
		return RootDecision{}, err
	}
	now := cfg.CA.Clock()
	if root, err = finishPromotion(ctx, client, namespace, root, now); err != nil {
		return RootDecision{}, err
	}
	cur, err := singleCertPEM(root.Data[keyCACert])
	if err != nil {
		return RootDecision{}, err
	}
	obs := RootObservations{Request: req, RootNotBefore: cur.NotBefore, RootNotAfter: cur.NotAfter}
	staged, err := stagedRootToStep(root, now)
	if err != nil {
		return RootDecision{}, err
	}
	if staged != nil {
		obs.Staged = RootFingerprint(staged.Root)
		obs.StagedIssuerDue = !now.Before(IssuerRenewalTime(staged.Issuer, cfg.IssuerRenewAt))
		kept, err := stagedPrevious(root, staged, now)
		if err != nil {
			return RootDecision{}, err
		}
		obs.StagedIssuersKept = len(kept)
	}
	if st.Phase != RootIdle && (obs.Staged == "" || (obs.Staged != st.Old && obs.Staged != st.New)) {
		return RootDecision{}, fmt.Errorf("%w: phase %s but the staged root is missing or not one of the rotation's roots", ErrRootRotationState, st.Phase)
	}
	if observe != nil {
		if obs.Agents, obs.LoadedRevision, err = observe(ctx, st); err != nil {
			return RootDecision{}, fmt.Errorf("observe the relay root rotation: %w", err)
		}
	}
	d, err := NextRootRotation(cfg.Rotation, st, obs, now)
	if err != nil {
		return RootDecision{}, err
	}
	if !d.Moved(st) && len(d.Actions) == 0 {
		return d, nil
	}
	out := root.DeepCopy()
	for _, a := range d.Actions {
		if err := applyRootAction(a, cfg.CA, out, &d.State); err != nil {
			return RootDecision{}, err
		}
	}
	if err := followCrossIssuer(ctx, secrets, out, d.State, cfg.CA, now); err != nil {
		return RootDecision{}, err
	}
	encodeRootRotation(d.State, out)
	// What is written must decode: checked before the write.
	if _, _, err := DecodeRootRotation(out); err != nil {
		return RootDecision{}, err
	}
	if staged, err := stagedRoot(out, now); err != nil {
		return RootDecision{}, err
	} else if _, err := stagedPrevious(out, staged, now); err != nil {
		return RootDecision{}, err
	}
	written, err := secrets.Update(ctx, out, metav1.UpdateOptions{})
	if err != nil {
		return RootDecision{}, fmt.Errorf("update secret %s/%s: %w", namespace, RootSecretName, err)
	}
	if _, err := finishPromotion(ctx, client, namespace, written, now); err != nil {
		return d, err
	}
	return d, nil
}

// finishPromotion completes RootActDeleteOld when it made the staged root
// the root: the signing secret is switched to the staged issuing CA (its
// previous issuing CAs, under the old root, are gone with it), then the
// staged issuing CA leaves the root Secret. Each write is checked and
// idempotent, so a replica killed between them leaves work the next step
// finishes. It returns the root Secret as it is afterwards.
func finishPromotion(ctx context.Context, client kubernetes.Interface, namespace string, root *corev1.Secret, now time.Time) (*corev1.Secret, error) {
	if len(root.Data[keyNextRoot]) > 0 || len(root.Data[keyNextIssuer]) == 0 {
		return root, nil
	}
	secrets := client.CoreV1().Secrets(namespace)
	signing, err := getSecret(ctx, secrets, SigningSecretName)
	if err != nil {
		return nil, err
	}
	if signing == nil {
		return nil, fmt.Errorf("%w: secret %s/%s not found", ErrInvalidSigner, namespace, SigningSecretName)
	}
	if !bytes.Equal(signing.Data[keyCACert], root.Data[keyCACert]) {
		out := signing.DeepCopy()
		gen := 1
		if st, err := strconv.Atoi(signing.Annotations[annotationGeneration]); err == nil {
			gen = st + 1
		}
		out.Data = map[string][]byte{keyTLSCert: root.Data[keyNextIssuer], keyTLSKey: root.Data[keyNextIssuerKey], keyCACert: root.Data[keyCACert]}
		// The staged issuing CAs a renewal replaced are under the new
		// root too: previous issuing CAs from now on.
		if prev := root.Data[keyNextPrevious]; len(prev) > 0 {
			out.Data[keyPreviousCerts] = prev
		}
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[annotationGeneration] = strconv.Itoa(gen)
		out.Annotations[annotationSwitchedAt] = now.UTC().Format(time.RFC3339)
		if _, err := loadIssuerState(root, out, now); err != nil {
			return nil, err
		}
		if _, err := secrets.Update(ctx, out, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("update secret %s/%s: %w", namespace, SigningSecretName, err)
		}
	}
	out := root.DeepCopy()
	delete(out.Data, keyNextIssuer)
	delete(out.Data, keyNextIssuerKey)
	delete(out.Data, keyNextPrevious)
	updated, err := secrets.Update(ctx, out, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update secret %s/%s: %w", namespace, RootSecretName, err)
	}
	return updated, nil
}

// applyRootAction makes a's change to the relay root Secret s.
func applyRootAction(a RootAction, cfg GenerateConfig, s *corev1.Secret, st *RootRotationState) error {
	switch a {
	case RootActClearRequest:
		delete(s.Annotations, AnnotationRootRequest)
	case RootActStage:
		fresh, err := GenerateRelayCA(cfg)
		if err != nil {
			return err
		}
		rootKey, err := encodeKeyPEM(fresh.RootKey)
		if err != nil {
			return err
		}
		issuerKey, err := encodeKeyPEM(fresh.IssuerKey)
		if err != nil {
			return err
		}
		s.Data[keyNextRoot], s.Data[keyNextRootKey] = CertsPEM(fresh.Root), rootKey
		s.Data[keyNextIssuer], s.Data[keyNextIssuerKey] = CertsPEM(fresh.Issuer), issuerKey
		delete(s.Data, keyNextPrevious)
	case RootActDiscard:
		for _, k := range stagedKeys {
			delete(s.Data, k)
		}
	case RootActRenewStagedIssuer:
		return renewStagedIssuer(cfg, s, *st)
	case RootActDeleteOld:
		// st.Old is the root kept: ca.crt (after a rollback) or the staged
		// one, which then becomes the root; its issuing CA stays staged
		// until the signing secret is switched to it.
		cur, err := singleCertPEM(s.Data[keyCACert])
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRootRotationState, keyCACert, err)
		}
		next, err := singleCertPEM(s.Data[keyNextRoot])
		switch {
		case RootFingerprint(cur) == st.Old:
			for _, k := range stagedKeys {
				delete(s.Data, k)
			}
		case err == nil && RootFingerprint(next) == st.Old:
			s.Data[keyCACert], s.Data[keyTLSKey] = s.Data[keyNextRoot], s.Data[keyNextRootKey]
			delete(s.Data, keyNextRoot)
			delete(s.Data, keyNextRootKey)
		default:
			return fmt.Errorf("%w: the root to keep is neither %s nor %s", ErrRootRotationState, keyCACert, keyNextRoot)
		}
	default:
		return fmt.Errorf("%w: unknown action %q", ErrRootRotationState, a)
	}
	return nil
}

// renewStagedIssuer signs a new issuing CA under the staged root of s. The
// one it replaces is kept (accepted) unless it cannot have issued yet (st,
// the decided state, is AddingNewRoot towards the staged root); kept ones
// past their NotAfter are dropped.
func renewStagedIssuer(cfg GenerateConfig, s *corev1.Secret, st RootRotationState) error {
	now := cfg.Clock()
	staged, err := stagedRootToStep(s, now)
	if err != nil {
		return err
	}
	if staged == nil {
		return fmt.Errorf("%w: no staged root to renew the issuing CA of", ErrRootRotationState)
	}
	prev, err := stagedPrevious(s, staged, now)
	if err != nil {
		return err
	}
	fresh, err := NextRelayIssuer(cfg, staged)
	if err != nil {
		return err
	}
	key, err := encodeKeyPEM(fresh.IssuerKey)
	if err != nil {
		return err
	}
	var kept []*x509.Certificate
	if st.Phase != RootAddingNew || st.New != RootFingerprint(staged.Root) {
		kept = append(kept, staged.Issuer)
	}
	kept = append(kept, prev...)
	s.Data[keyNextIssuer], s.Data[keyNextIssuerKey] = CertsPEM(fresh.Issuer), key
	delete(s.Data, keyNextPrevious)
	if len(kept) > 0 {
		s.Data[keyNextPrevious] = CertsPEM(kept...)
	}
	return nil
}

// stagedPrevious parses the staged root's replaced issuing CAs
// (keyNextPrevious) of s, checked like previous issuing CAs (expired ones
// too), and returns those still valid at now; none when nothing is
// staged. Between RootActDeleteOld and finishPromotion they
// wait beside the staged issuing CA for the signing secret, which checks
// them when they get there.
func stagedPrevious(s *corev1.Secret, staged *RelayCA, now time.Time) ([]*x509.Certificate, error) {
	if staged == nil {
		if len(s.Data[keyNextPrevious]) > 0 && len(s.Data[keyNextIssuer]) == 0 {
			return nil, fmt.Errorf("%w: secret %s/%s %s without a staged root", ErrInvalidSigner, s.Namespace, s.Name, keyNextPrevious)
		}
		return nil, nil
	}
	prev, err := ParsePreviousIssuers(s.Data[keyNextPrevious], staged.Root, staged.Issuer)
	if err != nil {
		return nil, fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, s.Namespace, s.Name, keyNextPrevious, err)
	}
	return slices.DeleteFunc(prev, func(c *x509.Certificate) bool { return !now.Before(c.NotAfter) }), nil
}

// RequestRootRotation records an operator's request (start or rollback)
// on the relay root Secret for the rotation task to act on; it refuses a
// request while another is pending.
func RequestRootRotation(ctx context.Context, client kubernetes.Interface, namespace string, req RootRequest) error {
	if req != RootRequestStart && req != RootRequestRollback {
		return fmt.Errorf("ca: unknown root rotation request %q", req)
	}
	secrets := client.CoreV1().Secrets(namespace)
	root, err := getSecret(ctx, secrets, RootSecretName)
	if err != nil {
		return err
	}
	if root == nil {
		return fmt.Errorf("%w: secret %s/%s not found", ErrInvalidSigner, namespace, RootSecretName)
	}
	if _, pending, err := DecodeRootRotation(root); err != nil {
		return err
	} else if pending != RootRequestNone {
		return errors.New("a root rotation request (" + string(pending) + ") is already pending")
	}
	out := root.DeepCopy()
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[AnnotationRootRequest] = string(req)
	_, err = secrets.Update(ctx, out, metav1.UpdateOptions{})
	return err
}

// RootRotationRoots are the relay root Secret's roots: the one in ca.crt
// and the staged one (nil when none). Only certificates are read, never a
// key, so status tools need nothing else of the Secret.
func RootRotationRoots(root *corev1.Secret) (current, staged *x509.Certificate, err error) {
	if current, err = singleCertPEM(root.Data[keyCACert]); err != nil {
		return nil, nil, fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, root.Namespace, root.Name, keyCACert, err)
	}
	if len(root.Data[keyNextRoot]) == 0 {
		return current, nil, nil
	}
	if staged, err = singleCertPEM(root.Data[keyNextRoot]); err != nil {
		return nil, nil, fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, root.Namespace, root.Name, keyNextRoot, err)
	}
	return current, staged, nil
}
