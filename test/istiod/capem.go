package istiod

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	securityapi "istio.io/api/security/v1alpha1"
)

// IssuedFiles is istiod's answer to a workload CSR as istio-agent stores it
// for a proxyless gRPC workload: the certificate chain file and the root
// bundle file.
type IssuedFiles struct {
	// CertChain is the signed leaf followed by the chain istiod sent with
	// it (its cert-chain.pem): every element of the answer but the last.
	CertChain []byte
	// Roots is the last element of the answer: the root bundle the mesh
	// trusts (istiod's root-cert.pem, all roots during a rotation).
	Roots []byte
}

// IssueFiles asks istiod's CA for a workload certificate like
// CreateCertificate does (the token's identity, the CSR's key, istiod
// verified against the plugged root) and returns the answer split the way
// istio-agent splits it: every element but the last is the certificate
// chain, the last is the root bundle. Each element is checked to be PEM
// certificates.
func (d *Istiod) IssueFiles(ctx context.Context, req CertificateRequest) (IssuedFiles, error) {
	elems, err := d.answer(ctx, req)
	if err != nil {
		return IssuedFiles{}, err
	}
	var chain strings.Builder
	for _, e := range elems[:len(elems)-1] {
		chain.WriteString(strings.TrimSpace(e))
		chain.WriteString("\n")
	}
	return IssuedFiles{CertChain: []byte(chain.String()), Roots: []byte(strings.TrimSpace(elems[len(elems)-1]) + "\n")}, nil
}

// answer sends req without metadata and returns the elements of istiod's
// answer, each checked to be PEM certificates: at least a leaf and a root
// bundle.
func (d *Istiod) answer(ctx context.Context, req CertificateRequest) ([]string, error) {
	if len(req.Metadata) > 0 {
		return nil, errors.New("istiod CA: this call sends no request metadata; use CreateCertificate")
	}
	conn, err := grpc.NewClient(d.addrs.SecureGRPC, grpc.WithTransportCredentials(credentials.NewTLS(d.tlsConfig())))
	if err != nil {
		return nil, fmt.Errorf("istiod CA: %w", err)
	}
	defer conn.Close()
	md := metadata.Pairs("ClusterID", d.cfg.ClusterID)
	if req.Token != "" {
		md.Append("authorization", "Bearer "+req.Token)
	}
	resp, err := securityapi.NewIstioCertificateServiceClient(conn).CreateCertificate(metadata.NewOutgoingContext(ctx, md),
		&securityapi.IstioCertificateRequest{Csr: string(req.CSR), ValidityDuration: int64(req.TTL.Seconds())})
	if err != nil {
		return nil, fmt.Errorf("istiod CA: %w", err)
	}
	elems := resp.GetCertChain()
	if len(elems) < 2 {
		return nil, fmt.Errorf("istiod CA: answer has %d elements, want a chain and a root bundle", len(elems))
	}
	for i, e := range elems {
		if _, err := parseCerts([]byte(e)); err != nil {
			return nil, fmt.Errorf("istiod CA: answer element %d: %w", i, err)
		}
	}
	return elems, nil
}

// ZtunnelCertificate is istiod's answer to a certificate request as
// ztunnel reads it (WorkloadCertificate::new, istio/ztunnel
// src/tls/certificate.rs): the first element is the leaf; each middle
// element is one certificate, the first of its PEM (istiod sends one
// certificate per element); the last element is every root the workload
// trusts. ztunnel presents the leaf and the middle certificates, and
// verifies its peers' against those roots.
type ZtunnelCertificate struct {
	Leaf  *x509.Certificate
	Chain []*x509.Certificate
	Roots []*x509.Certificate
}

// ZtunnelCertificate asks istiod's CA for a certificate like IssueFiles
// does and reads the answer the way ztunnel does.
func (d *Istiod) ZtunnelCertificate(ctx context.Context, req CertificateRequest) (ZtunnelCertificate, error) {
	elems, err := d.answer(ctx, req)
	if err != nil {
		return ZtunnelCertificate{}, err
	}
	var z ZtunnelCertificate
	for i, e := range elems {
		certs, _ := parseCerts([]byte(e)) // checked by answer
		switch i {
		case 0:
			z.Leaf = certs[0]
		case len(elems) - 1:
			z.Roots = certs
		default:
			z.Chain = append(z.Chain, certs[0])
		}
	}
	return z, nil
}

// VerifiedBy checks that a peer holding roots accepts z: z's leaf,
// presented with z's chain, verifies to one of roots (rustls, like Go,
// builds the path from the certificates presented).
func (z ZtunnelCertificate) VerifiedBy(roots []*x509.Certificate) error {
	rootPool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		rootPool.AddCert(r)
	}
	for _, c := range z.Chain {
		inter.AddCert(c)
	}
	_, err := z.Leaf.Verify(x509.VerifyOptions{Roots: rootPool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
