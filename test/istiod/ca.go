package istiod

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// WorkloadCSR is what istio-agent sends: a fresh P-256 key and a CSR
// naming the workload's SPIFFE ID.
func WorkloadCSR(spiffeID string) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	u, err := url.Parse(spiffeID)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		return nil, nil, err
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// TokenAudience is the audience istiod's CA requires of service-account
// tokens (its TOKEN_AUDIENCES default); istio-agent requests tokens for it.
const TokenAudience = "istio-ca"

// tokenLifetime is what ServiceAccountToken asks for: the API server's
// minimum.
const tokenLifetime = 10 * time.Minute

// Metadata keys of IstioCertificateRequest that istiod reads.
const (
	// ImpersonatedIdentityKey asks for a certificate for another identity;
	// istiod allows it only for node accounts in CA_TRUSTED_NODE_ACCOUNTS.
	ImpersonatedIdentityKey = "ImpersonatedIdentity"
)

// CertificateRequest is one IstioCertificateService/CreateCertificate call.
type CertificateRequest struct {
	// Token is the caller's Kubernetes service-account token, sent as
	// "authorization: Bearer <token>"; istiod checks it with TokenReview and
	// derives the certificate's identity from it. Empty sends none.
	Token string
	// CSR is the PEM certificate request. istiod uses its public key and
	// ignores the identity it names.
	CSR []byte
	// TTL is the requested lifetime; 0 takes istiod's default (24h).
	TTL time.Duration
	// Metadata are extra request metadata fields (ImpersonatedIdentityKey).
	Metadata map[string]string
}

// CreateCertificate sends the request to istiod's CA over its secure gRPC
// port, verifying istiod's certificate against the plugged root for
// ServerName, and returns the certificates istiod answered with, in its
// order: the signed leaf first, then its cert-chain.pem, then its root
// bundle last. The call carries the "ClusterID" header istio-agent sends.
func (d *Istiod) CreateCertificate(ctx context.Context, req CertificateRequest) ([]*x509.Certificate, error) {
	conn, err := grpc.NewClient(d.addrs.SecureGRPC, grpc.WithTransportCredentials(credentials.NewTLS(d.tlsConfig())))
	if err != nil {
		return nil, fmt.Errorf("istiod CA: %w", err)
	}
	defer conn.Close()

	md := metadata.Pairs("ClusterID", d.cfg.ClusterID)
	if req.Token != "" {
		md.Append("authorization", "Bearer "+req.Token)
	}
	ctx = metadata.NewOutgoingContext(ctx, md)
	in := &securityapi.IstioCertificateRequest{
		Csr:              string(req.CSR),
		ValidityDuration: int64(req.TTL / time.Second),
	}
	if len(req.Metadata) > 0 {
		fields := map[string]any{}
		for k, v := range req.Metadata {
			fields[k] = v
		}
		if in.Metadata, err = structpb.NewStruct(fields); err != nil {
			return nil, fmt.Errorf("istiod CA: metadata: %w", err)
		}
	}
	resp, err := securityapi.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("istiod CA: %w", err)
	}
	var chain []*x509.Certificate
	for i, s := range resp.GetCertChain() {
		certs, err := parseCerts([]byte(s))
		if err != nil {
			return nil, fmt.Errorf("istiod CA: response element %d: %w", i, err)
		}
		chain = append(chain, certs...)
	}
	if len(chain) == 0 {
		return nil, errors.New("istiod CA: empty certificate chain")
	}
	return chain, nil
}

// WorkloadCertificate asks istiod for a workload certificate the way
// istio-agent does: the pod's service-account token and a CSR, default
// lifetime. It returns the leaf first, then the rest of what istiod sent.
func (d *Istiod) WorkloadCertificate(ctx context.Context, token string, csrPEM []byte) ([]*x509.Certificate, error) {
	return d.CreateCertificate(ctx, CertificateRequest{Token: token, CSR: csrPEM})
}

func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("unexpected PEM block %q", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// ServiceAccountToken creates the service account in namespace if it does
// not exist and returns a short-lived token for it from the TokenRequest
// API, bound to audience (TokenAudience for istiod). The namespace must
// exist.
func ServiceAccountToken(ctx context.Context, cs kubernetes.Interface, namespace, serviceAccount, audience string) (string, error) {
	if audience == "" {
		return "", errors.New("service account token: audience is required")
	}
	sas := cs.CoreV1().ServiceAccounts(namespace)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount, Namespace: namespace}}
	if _, err := sas.Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create service account %s/%s: %w", namespace, serviceAccount, err)
	}
	seconds := int64(tokenLifetime / time.Second)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         []string{audience},
		ExpirationSeconds: &seconds,
	}}
	got, err := sas.CreateToken(ctx, serviceAccount, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for service account %s/%s: %w", namespace, serviceAccount, err)
	}
	if got.Status.Token == "" {
		return "", fmt.Errorf("token for service account %s/%s: empty token", namespace, serviceAccount)
	}
	return got.Status.Token, nil
}
