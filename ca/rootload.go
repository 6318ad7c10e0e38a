package ca

import (
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// rotationView is what a relay root rotation in progress means for a
// replica (RootRotationState.Effective): the roots agent certificates may
// chain to, the issuing CA to sign with, and the other accepted issuing CA.
type rotationView struct {
	roots []*x509.Certificate
	// issue signs agent and serving certificates.
	issue Signer
	// otherIssuers are the accepted issuing CAs under the other root.
	otherIssuers []*x509.Certificate
	// currentRootAccepted: the root in ca.crt is still accepted (then so
	// are the previous issuing CAs under it).
	currentRootAccepted bool
	// state is the rotation state loaded.
	state RootRotationState
	// crossIssued is the issuing CA cross-issued by the other root, served
	// after the issuing CA (crossissue.go); nil when the phase needs none
	// or the Secret holds none.
	crossIssued *x509.Certificate
}

// CrossIssued is what the serving chain carries after the issuing CA
// during a relay root rotation: the issuing CA cross-issued by the other
// root, so that an agent pinning only that root verifies the server.
// Empty outside the phases that need it.
func (r *RelayIssuers) CrossIssued() []*x509.Certificate {
	v := r.cur.Load().rotation
	if v == nil || v.crossIssued == nil {
		return nil
	}
	return []*x509.Certificate{v.crossIssued}
}

// LoadedRootRotation is the relay root rotation state this replica loaded
// last, and false outside a rotation (Idle, or no rotation state).
func (r *RelayIssuers) LoadedRootRotation() (RootRotationState, bool) {
	v := r.cur.Load().rotation
	if v == nil {
		return RootRotationState{}, false
	}
	return v.state, true
}

// issuing is the signer that issues now.
func (st *issuerState) issuing() Signer {
	if st.rotation != nil {
		return st.rotation.issue
	}
	return st.signer
}

// loadRotationView reads the rotation state of the relay root Secret:
// nil outside a rotation. A state that does not decode, or whose staged
// root does not load or is not the rotation's other root, is an error, and
// the caller loads nothing. The operator's request annotation is not read
// here: a typo in it never stops a replica from loading its CA.
func loadRotationView(root *corev1.Secret, rc *RelayCA, current Signer, now time.Time) (*rotationView, error) {
	if _, ok := root.Annotations[annotationRootPhase]; !ok {
		return nil, nil
	}
	withoutRequest := root.DeepCopy()
	delete(withoutRequest.Annotations, AnnotationRootRequest)
	st, _, err := DecodeRootRotation(withoutRequest)
	if err != nil || st.Phase == RootIdle {
		return nil, err
	}
	staged, err := stagedRoot(root, now)
	if err != nil {
		return nil, err
	}
	curFP := RootFingerprint(rc.Root)
	other := st.New
	if other == curFP {
		other = st.Old
	}
	if staged == nil || RootFingerprint(staged.Root) != other {
		return nil, fmt.Errorf("%w: secret %s/%s: phase %s without its staged root", ErrRootRotationState, root.Namespace, root.Name, st.Phase)
	}
	stagedSigner, err := staged.Signer(now)
	if err != nil {
		return nil, err
	}
	eff := st.Effective()
	v := &rotationView{issue: current, currentRootAccepted: slices.Contains(eff.Accepted, curFP), state: st}
	if eff.IssueFrom == other {
		v.issue = stagedSigner
	}
	for _, fp := range eff.Accepted {
		switch fp {
		case curFP:
			v.roots = append(v.roots, rc.Root)
		case other:
			v.roots = append(v.roots, staged.Root)
		}
	}
	if eff.CrossSign && len(root.Data[keyCrossIssuer]) > 0 {
		parent := staged.Root
		if eff.IssueFrom == other {
			parent = rc.Root
		}
		c, err := singleCertPEM(root.Data[keyCrossIssuer])
		if err == nil {
			err = checkCrossIssued(c, v.issue.Chain()[0], parent, now)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: secret %s/%s %s: %w", ErrRootRotationState, root.Namespace, root.Name, keyCrossIssuer, err)
		}
		v.crossIssued = c
	}
	accepted := func(c *x509.Certificate) bool {
		return slices.ContainsFunc(v.roots, func(r *x509.Certificate) bool { return c.CheckSignatureFrom(r) == nil })
	}
	for _, s := range []Signer{current, stagedSigner} {
		if issuer := s.Chain()[0]; s != v.issue && accepted(issuer) {
			v.otherIssuers = append(v.otherIssuers, issuer)
		}
	}
	// The staged root's issuing CAs that a renewal replaced, while the
	// staged root is accepted and they are valid.
	prev, err := stagedPrevious(root, staged, now)
	if err != nil {
		return nil, err
	}
	for _, c := range prev {
		if accepted(c) {
			v.otherIssuers = append(v.otherIssuers, c)
		}
	}
	return v, nil
}
