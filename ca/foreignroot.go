package ca

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"
)

// A foreign root (a SPIRE server's, another Relaymesh's) reaches a mesh's
// trust only as a cross-certificate: the foreign root's subject and key,
// signed by the VirtualMesh root, name-constrained to the foreign trust
// domain. Istio merges every root it is given into one flat bundle and
// binds none to a trust domain, so a foreign root delivered as it is could
// vouch for the mesh's own identities; under the cross-certificate a leaf
// the foreign key signed verifies for URIs of its own trust domain only.
//
// The chain a verifier builds is leaf → cross-certificate → VirtualMesh
// root, or ends at the cross-certificate where the verifier takes any
// certificate of its trust store as an anchor (Go's, which enforces an
// anchor's name constraints too). The cross-certificate is one more CA
// below the VirtualMesh root (pathLen 1), so a foreign CA that signs its
// SVIDs directly (SPIRE's default) fits; a foreign chain with
// intermediates of its own does only for verifiers that stop at the
// cross-certificate.

// CrossCertifyForeignRoot signs, with s, a certificate of foreign's subject
// and key whose name constraints permit URIs of exactly td (the SPIFFE
// trust domain foreign's bundle was published for), valid no longer than
// foreign and s's issuing CA, which must be one of s's roots (so the
// meshes that trust that root find the certificate's issuer among their
// roots). s must sign bare public keys: a CA that insists on a certificate
// request signed by the subject key (cfssl, step-ca) cannot certify a key
// whose owner is elsewhere, and the error wraps ErrNeedsRequest.
func CrossCertifyForeignRoot(ctx context.Context, s Signer, foreign *x509.Certificate, td string, now time.Time) (*x509.Certificate, error) {
	if err := CheckTrustDomain(td); err != nil {
		return nil, fmt.Errorf("trust domain: %w", err)
	}
	if foreign == nil || !foreign.BasicConstraintsValid || !foreign.IsCA {
		return nil, errors.New("the foreign certificate is not a CA")
	}
	if !bytes.Equal(foreign.RawIssuer, foreign.RawSubject) || foreign.CheckSignatureFrom(foreign) != nil {
		return nil, errors.New("the foreign certificate is not a self-signed root")
	}
	if _, ok := s.(RequestSigner); ok {
		return nil, fmt.Errorf("%w: the VirtualMesh root's CA signs only certificate requests, and a foreign root's key is not ours to sign one with; "+
			"trusting foreign trust domains needs a root Relaymesh signs with itself (a Secret or a PKCS#11 key)", ErrNeedsRequest)
	}
	chain := s.Chain()
	if len(chain) == 0 {
		return nil, errors.New("the VirtualMesh root's signer has no issuing CA")
	}
	issuer := chain[0]
	if !slices.ContainsFunc(s.Roots(), issuer.Equal) {
		return nil, errors.New("the VirtualMesh root signs through an intermediate CA; a cross-certificate must be issued by the root itself, which the meshes hold")
	}
	notBefore, notAfter := crossValidity(foreign, issuer, now)
	if now.Before(foreign.NotBefore) {
		return nil, fmt.Errorf("the foreign root is not valid before %s", foreign.NotBefore.UTC().Format(time.RFC3339))
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("the foreign root (valid until %s) or the VirtualMesh root (until %s) has expired", foreign.NotAfter.UTC().Format(time.RFC3339), issuer.NotAfter.UTC().Format(time.RFC3339))
	}
	serial, err := randomSerial(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cross-certificate serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		RawSubject:            foreign.RawSubject,
		Subject:               foreign.Subject,
		SubjectKeyId:          foreign.SubjectKeyId,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            foreign.MaxPathLen,
		MaxPathLenZero:        foreign.MaxPathLenZero,
	}
	if tmpl.MaxPathLen < 0 || (tmpl.MaxPathLen == 0 && !tmpl.MaxPathLenZero) {
		tmpl.MaxPathLen, tmpl.MaxPathLenZero = -1, false
	}
	trustDomainConstraints(tmpl, td)
	c, err := s.Sign(ctx, tmpl, foreign.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("cross-certify the foreign root: %w", err)
	}
	if err := CheckForeignCrossCertificate(c, foreign, issuer, td, now); err != nil {
		return nil, fmt.Errorf("cross-certificate of the foreign root: %w", err)
	}
	return c, nil
}

// CheckForeignCrossCertificate checks that c is a cross-certificate of
// foreign issued by issuer and constrained to td, as
// CrossCertifyForeignRoot makes them, and valid at now: what a replica
// checks before it hands one, read from a status, to the meshes.
func CheckForeignCrossCertificate(c, foreign, issuer *x509.Certificate, td string, now time.Time) error {
	var errs []error
	if !bytes.Equal(c.RawSubject, foreign.RawSubject) {
		errs = append(errs, errors.New("its subject is not the foreign root's, byte for byte"))
	}
	if !bytes.Equal(c.RawSubjectPublicKeyInfo, foreign.RawSubjectPublicKeyInfo) {
		errs = append(errs, errors.New("its key is not the foreign root's"))
	}
	if err := c.CheckSignatureFrom(issuer); err != nil {
		errs = append(errs, fmt.Errorf("not signed by the VirtualMesh root: %w", err))
	}
	if !c.BasicConstraintsValid || !c.IsCA {
		errs = append(errs, errors.New("is not a CA"))
	}
	if !slices.Equal(c.PermittedURIDomains, []string{td}) || !slices.Equal(c.ExcludedURIDomains, []string{"." + td}) || !c.PermittedDNSDomainsCritical {
		errs = append(errs, fmt.Errorf("its name constraints (permitted URIs %q, excluded %q) do not confine it to trust domain %s", c.PermittedURIDomains, c.ExcludedURIDomains, td))
	}
	if len(c.DNSNames)+len(c.URIs)+len(c.IPAddresses)+len(c.EmailAddresses) > 0 || len(c.ExtKeyUsage)+len(c.UnknownExtKeyUsage) > 0 {
		errs = append(errs, errors.New("carries subject alternative names or extended key usages"))
	}
	if now.Before(c.NotBefore) || !now.Before(c.NotAfter) {
		errs = append(errs, fmt.Errorf("not valid now (%s to %s)", c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339)))
	}
	if c.NotAfter.After(foreign.NotAfter) || c.NotAfter.After(issuer.NotAfter) {
		errs = append(errs, errors.New("outlives the foreign root or the VirtualMesh root"))
	}
	return errors.Join(errs...)
}
