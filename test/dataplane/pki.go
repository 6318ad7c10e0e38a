package dataplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/istiod"
)

// Root is a shared mesh root made the way Relaymesh makes a VirtualMesh's
// generated root (ca.GenerateMeshRoot), and signs each mesh's intermediate
// the way the server does (ca.Authority.IssueIntermediate): the cacerts a
// cluster's istiod loads.
type Root struct {
	virtualMesh string
	root        *ca.MeshRoot
	authority   *ca.Authority
}

// NewRoot generates a root for the named VirtualMesh.
func NewRoot(virtualMesh string) (*Root, error) {
	r, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: virtualMesh, TTL: 24 * time.Hour})
	if err != nil {
		return nil, err
	}
	signer, err := r.Signer(time.Now())
	if err != nil {
		return nil, err
	}
	a, err := ca.New(ca.Config{Signer: signer, IntermediateTTL: 12 * time.Hour})
	if err != nil {
		return nil, err
	}
	return &Root{virtualMesh: virtualMesh, root: r, authority: a}, nil
}

// Cert is the root certificate.
func (r *Root) Cert() *x509.Certificate { return r.root.Cert }

// PEM is the root certificate, PEM-encoded.
func (r *Root) PEM() []byte { return ca.CertsPEM(r.root.Cert) }

// CACerts issues an intermediate for mesh, name-constrained to the mesh's
// trust domain (its key generated here, as an agent generates it in its
// cluster), and returns the four files of Istio's `cacerts` Secret.
func (r *Root) CACerts(ctx context.Context, mesh, trustDomain string) (map[string][]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, err
	}
	csr, err := ca.ParseIntermediateCSR(der)
	if err != nil {
		return nil, err
	}
	iss, err := r.authority.IssueIntermediate(ctx, csr, ca.IntermediateRequest{VirtualMesh: r.virtualMesh, Mesh: mesh, TrustDomain: trustDomain})
	if err != nil {
		return nil, fmt.Errorf("intermediate for %s: %w", mesh, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		istiod.CACertFile:    ca.CertsPEM(iss.Certificate),
		istiod.CAKeyFile:     pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		istiod.CertChainFile: ca.CertsPEM(append([]*x509.Certificate{iss.Certificate}, iss.Chain...)...),
		istiod.RootCertFile:  ca.CertsPEM(iss.Roots...),
	}, nil
}
