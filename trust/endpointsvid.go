package trust

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// EndpointMesh is the mesh name an endpoint SVID's intermediate is issued
// for (its subject: "relaymesh-bundle-endpoint intermediate"); no mesh of
// a cluster is named so, since discovered Mesh names carry their cluster.
const EndpointMesh = "relaymesh-bundle-endpoint"

// ErrNoIssuer: no VirtualMesh issues for the trust domain now.
var ErrNoIssuer = errors.New("no VirtualMesh with a usable root issues for this trust domain now")

// EndpointIssuer is the fingerprint of the root that intermediates for
// trust domain td are issued from now (the rotation's current step), or
// an error: no VirtualMesh issues for td, or two with different roots do.
func (c *Controller) EndpointIssuer(td string) (string, error) {
	mt, err := c.issuerFor(td)
	if err != nil {
		return "", err
	}
	return mt.root.fingerprint, nil
}

func (c *Controller) issuerFor(td string) (*meshTrust, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var found *meshTrust
	for _, mt := range c.state {
		if mt.req.GetTrustDomain() != td || mt.root == nil {
			continue
		}
		if found != nil && (found.vm != mt.vm || found.root.fingerprint != mt.root.fingerprint) {
			return nil, fmt.Errorf("trust domain %s is named by meshes of VirtualMeshes %s and %s with different roots", td, found.vm, mt.vm)
		}
		found = mt
	}
	if found == nil {
		return nil, fmt.Errorf("trust domain %s: %w", td, ErrNoIssuer)
	}
	return found, nil
}

// EndpointSVID issues the X509-SVID the SPIFFE bundle endpoint serves
// with the https_spiffe profile: an intermediate for EndpointMesh,
// name-constrained to id's trust domain (pathLen 0), from the root the
// VirtualMesh of that trust domain issues from now, and a leaf for id
// (serverAuth, at most ttl and within the intermediate) signed by it.
// Both keys are generated here and never leave memory. It returns the
// issuing root's fingerprint: the caller issues anew when EndpointIssuer
// changes (a rotation moved).
func (c *Controller) EndpointSVID(ctx context.Context, id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, string, error) {
	td := id.TrustDomain().Name()
	mt, err := c.issuerFor(td)
	if err != nil {
		return nil, "", err
	}
	interKey, csrPEM, err := newKey("ECDSAP256", td)
	if err != nil {
		return nil, "", err
	}
	csr, err := ca.ParseIntermediateCSR(csrPEM)
	if err != nil {
		return nil, "", err
	}
	inter, err := mt.root.issue(ctx, csr, ca.IntermediateRequest{VirtualMesh: mt.vmName, Mesh: EndpointMesh, TrustDomain: td, TTL: max(2*ttl, time.Hour)})
	if err != nil {
		return nil, "", fmt.Errorf("the bundle endpoint's intermediate: %w", err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, "", err
	}
	now := c.cfg.Clock()
	notAfter := now.Add(ttl)
	if inter.NotAfter.Before(notAfter) {
		notAfter = inter.NotAfter
	}
	tmpl := &x509.Certificate{SerialNumber: serial, NotBefore: now.Add(-time.Minute), NotAfter: notAfter,
		URIs: []*url.URL{id.URL()}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, inter, leafKey.Public(), interKey)
	if err != nil {
		return nil, "", fmt.Errorf("the bundle endpoint's SVID: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, "", err
	}
	certs := append([]*x509.Certificate{leaf, inter}, mt.root.chain()...)
	svid := &x509svid.SVID{ID: id, Certificates: certs, PrivateKey: leafKey}
	// Checked as a peer will: against the root it was issued from.
	if _, _, err := x509svid.Verify(certs, x509bundle.FromX509Authorities(id.TrustDomain(), []*x509.Certificate{mt.root.cert})); err != nil {
		return nil, "", fmt.Errorf("the bundle endpoint's SVID does not verify: %w", err)
	}
	if err := c.cfg.Audit.Record(audit.Event{Type: audit.CertIssue, Result: audit.ResultSuccess, Serial: inter.SerialNumber.Text(16),
		Details: map[string]string{"kind": "intermediate", "mesh": EndpointMesh, "virtualMesh": mt.vm, "spiffeId": id.String(),
			"notAfter": inter.NotAfter.UTC().Format(time.RFC3339)}}); err != nil {
		return nil, "", fmt.Errorf("the bundle endpoint's SVID is not used: its issuance could not be audited: %w", err)
	}
	return svid, mt.root.fingerprint, nil
}
