package ca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// A cross-issued issuing CA lets an agent that pins only the other root
// verify the server while a relay root rotation is in Switching: issuance
// (the serving certificate included) has moved to one root, and an agent
// that was offline through AddingNewRoot never received it. The serving
// chain then carries, after the issuing CA, the same CA (subject, key, key
// identifier, constraints) signed by the other root: leaf → issuing CA
// (cross-issued) → other root is one intermediate, within the roots'
// pathLen 1. Cross-signing the new root itself would make two
// intermediates below the other root, which its pathLen 1 refuses.
//
// The Lease holder writes it into the relay root Secret with the state
// that needs it (StepRootRotation) and removes it with the state that does
// not, so every replica serves the same certificate; replicas check it
// against the roots before serving it (loadRotationView).

// keyCrossIssuer holds the cross-issued issuing CA in the relay root
// Secret while the rotation is in a phase with RootEffect.CrossSign.
const keyCrossIssuer = "cross-issuer.crt"

// crossIssue signs, with parent's key, a certificate of issuing's subject,
// key and CA constraints, valid no longer than either.
func crossIssue(rnd io.Reader, issuing, parent *x509.Certificate, parentKey crypto.Signer, now time.Time) (*x509.Certificate, error) {
	if hasNameConstraints(issuing) {
		return nil, errors.New("cross-issue the issuing CA: it carries name constraints")
	}
	serial, err := randomSerial(rnd)
	if err != nil {
		return nil, fmt.Errorf("cross-issued CA serial number: %w", err)
	}
	notBefore, notAfter := crossValidity(issuing, parent, now)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               issuing.Subject,
		SubjectKeyId:          issuing.SubjectKeyId,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              issuing.KeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	c, err := createCert(rnd, tmpl, parent, issuing.PublicKey, parentKey)
	if err != nil {
		return nil, fmt.Errorf("cross-issue the issuing CA: %w", err)
	}
	if err := checkCrossIssued(c, issuing, parent, now); err != nil {
		return nil, fmt.Errorf("cross-issued CA: %w", err)
	}
	return c, nil
}

// crossValidity is the validity of a certificate of subject's key that
// parent signs at now: backdated like every CA certificate, never before
// subject's, never after either's.
func crossValidity(subject, parent *x509.Certificate, now time.Time) (notBefore, notAfter time.Time) {
	notAfter = subject.NotAfter
	if parent.NotAfter.Before(notAfter) {
		notAfter = parent.NotAfter
	}
	notBefore = now.Add(-caBackdate).Truncate(time.Second).UTC()
	if notBefore.Before(subject.NotBefore) {
		notBefore = subject.NotBefore
	}
	return notBefore, notAfter
}

// hasNameConstraints reports whether c constrains names. Relay issuing
// CAs do not; one that did is not cross-issued, as a copy of its
// constraints could be read differently from the original's.
func hasNameConstraints(c *x509.Certificate) bool {
	return len(c.PermittedDNSDomains)+len(c.ExcludedDNSDomains)+len(c.PermittedIPRanges)+len(c.ExcludedIPRanges)+
		len(c.PermittedEmailAddresses)+len(c.ExcludedEmailAddresses)+len(c.PermittedURIDomains)+len(c.ExcludedURIDomains) > 0
}

// checkCrossIssued reports why c is not issuing cross-issued by parent,
// valid at now.
func checkCrossIssued(c, issuing, parent *x509.Certificate, now time.Time) error {
	switch {
	case !c.BasicConstraintsValid || !c.IsCA || c.MaxPathLen != 0 || c.KeyUsage&x509.KeyUsageCertSign == 0:
		return errors.New("not a pathLen 0 CA that may sign certificates")
	case !bytes.Equal(c.RawSubject, issuing.RawSubject) || !bytes.Equal(c.SubjectKeyId, issuing.SubjectKeyId):
		return fmt.Errorf("its subject or key identifier is not the issuing CA's (%s)", issuing.Subject)
	case !bytes.Equal(c.RawSubjectPublicKeyInfo, issuing.RawSubjectPublicKeyInfo):
		return errors.New("its key is not the issuing CA's")
	case hasNameConstraints(c) || hasNameConstraints(issuing):
		return errors.New("a relay issuing CA carries no name constraints")
	case now.Before(c.NotBefore) || !now.Before(c.NotAfter):
		return fmt.Errorf("not valid now (valid %s to %s)", c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
	}
	if err := c.CheckSignatureFrom(parent); err != nil {
		return fmt.Errorf("not signed by the other root: %w", err)
	}
	return nil
}

// followCrossIssuer makes the cross-issued CA of root (the relay root
// Secret about to be written with st) what st needs: the issuing CA of
// st's IssueFrom root cross-issued by the other root in a phase with
// CrossSign, nothing otherwise. An existing one that already fits is kept.
// When issuance is on the current root (Switching after a rollback), its
// issuing CA is read from the signing Secret.
func followCrossIssuer(ctx context.Context, secrets typedcorev1.SecretInterface, root *corev1.Secret, st RootRotationState, cfg GenerateConfig, now time.Time) error {
	eff := st.Effective()
	if !eff.CrossSign {
		delete(root.Data, keyCrossIssuer)
		return nil
	}
	cur, err := singleCertPEM(root.Data[keyCACert])
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrRootRotationState, keyCACert, err)
	}
	staged, err := stagedRoot(root, now)
	if err != nil {
		return err
	}
	if staged == nil {
		return fmt.Errorf("%w: phase %s without a staged root", ErrRootRotationState, st.Phase)
	}
	var issuing, parent *x509.Certificate
	var parentKey crypto.Signer
	switch eff.IssueFrom {
	case RootFingerprint(staged.Root):
		issuing, parent = staged.Issuer, cur
		if parentKey, err = parseKeyPEM(root.Data[keyTLSKey]); err != nil {
			return fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, root.Namespace, root.Name, keyTLSKey, err)
		}
	case RootFingerprint(cur):
		signing, err := getSecret(ctx, secrets, SigningSecretName)
		if err != nil {
			return err
		}
		if signing == nil {
			return fmt.Errorf("%w: secret %s/%s not found", ErrInvalidSigner, root.Namespace, SigningSecretName)
		}
		if issuing, err = singleCertPEM(signing.Data[keyTLSCert]); err != nil {
			return fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, signing.Namespace, signing.Name, keyTLSCert, err)
		}
		if issuing.CheckSignatureFrom(cur) != nil {
			return fmt.Errorf("%w: the issuing CA in %s is not under the root in %s", ErrInvalidSigner, SigningSecretName, RootSecretName)
		}
		parent, parentKey = staged.Root, staged.RootKey
	default:
		return fmt.Errorf("%w: phase %s issues from a root that is neither %s nor %s", ErrRootRotationState, st.Phase, keyCACert, keyNextRoot)
	}
	if have, err := singleCertPEM(root.Data[keyCrossIssuer]); err == nil && checkCrossIssued(have, issuing, parent, now) == nil {
		return nil
	}
	c, err := crossIssue(cfg.Rand, issuing, parent, parentKey, now)
	if err != nil {
		return err
	}
	root.Data[keyCrossIssuer] = CertsPEM(c)
	return nil
}
