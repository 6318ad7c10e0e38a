package istiod

import (
	"context"
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
	if len(req.Metadata) > 0 {
		return IssuedFiles{}, errors.New("istiod CA: IssueFiles sends no request metadata; use CreateCertificate")
	}
	conn, err := grpc.NewClient(d.addrs.SecureGRPC, grpc.WithTransportCredentials(credentials.NewTLS(d.tlsConfig())))
	if err != nil {
		return IssuedFiles{}, fmt.Errorf("istiod CA: %w", err)
	}
	defer conn.Close()
	md := metadata.Pairs("ClusterID", d.cfg.ClusterID)
	if req.Token != "" {
		md.Append("authorization", "Bearer "+req.Token)
	}
	resp, err := securityapi.NewIstioCertificateServiceClient(conn).CreateCertificate(metadata.NewOutgoingContext(ctx, md),
		&securityapi.IstioCertificateRequest{Csr: string(req.CSR), ValidityDuration: int64(req.TTL.Seconds())})
	if err != nil {
		return IssuedFiles{}, fmt.Errorf("istiod CA: %w", err)
	}
	elems := resp.GetCertChain()
	if len(elems) < 2 {
		return IssuedFiles{}, fmt.Errorf("istiod CA: answer has %d elements, want a chain and a root bundle", len(elems))
	}
	for i, e := range elems {
		if _, err := parseCerts([]byte(e)); err != nil {
			return IssuedFiles{}, fmt.Errorf("istiod CA: answer element %d: %w", i, err)
		}
	}
	var chain strings.Builder
	for _, e := range elems[:len(elems)-1] {
		chain.WriteString(strings.TrimSpace(e))
		chain.WriteString("\n")
	}
	return IssuedFiles{CertChain: []byte(chain.String()), Roots: []byte(strings.TrimSpace(elems[len(elems)-1]) + "\n")}, nil
}
