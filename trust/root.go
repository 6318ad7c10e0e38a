package trust

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	defaultIntermediateTTL = 8760 * time.Hour // 1 year
	// rootLabel marks the Secrets of generated VirtualMesh roots.
	rootLabel = "relaymesh.io/virtualmesh-root"
)

// root is a VirtualMesh's shared root and what signs with it.
type root struct {
	authority   *ca.Authority
	signer      ca.Signer
	bundle      []byte // PEM of the roots
	fingerprint string // of the root the chain verifies to
	ttl         time.Duration
	org         string // the intermediates' subject organization: the VirtualMesh's name
}

func (r *root) chain() []*x509.Certificate {
	// The issuing chain up to, not including, the root: a generated or
	// provided root that signs directly contributes nothing.
	chain := r.signer.Chain()
	roots := r.signer.Roots()
	if len(chain) > 0 && len(roots) > 0 && chain[len(chain)-1].Equal(roots[0]) {
		chain = chain[:len(chain)-1]
	}
	return chain
}

// root returns the VirtualMesh's root, generating it on first use when the
// VirtualMesh asks for a generated one.
func (c *Controller) root(ctx context.Context, vm *networkingv1alpha1.VirtualMesh) (*root, error) {
	rc := vm.Spec.MTLS.Shared.RootCA
	opts := vm.Spec.MTLS.Shared.IntermediateOptions
	var signer ca.Signer
	var err error
	switch {
	case rc.Generated != nil:
		signer, err = c.generatedRoot(ctx, vm, rc.Generated)
	case rc.Secret != nil:
		ns := cmp.Or(rc.Secret.Namespace, c.cfg.Namespace)
		if ns != c.cfg.Namespace {
			// The server can read Secrets everywhere; a VirtualMesh must
			// not be a way to make it sign with a key from another
			// namespace.
			return nil, fmt.Errorf("spec.mtls.shared.rootCA.secret must be in the server's namespace %s, not %s", c.cfg.Namespace, ns)
		}
		s, gerr := c.cfg.Kube.CoreV1().Secrets(ns).Get(ctx, rc.Secret.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, fmt.Errorf("root secret %s/%s: %w", ns, rc.Secret.Name, gerr)
		}
		roots := s.Data["ca.crt"]
		if len(roots) == 0 {
			roots = s.Data[corev1.TLSCertKey] // a self-signed root
		}
		signer, err = ca.ParseSignerPEM(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], roots, c.cfg.Clock())
	case rc.PKCS11 != nil:
		signer, _, err = c.pkcs11Signer(ctx, rc.PKCS11)
	case rc.External != nil:
		signer, _, err = c.externalSigner(ctx, rc.External)
	default:
		return nil, errors.New("spec.mtls.shared.rootCA: one of generated, secret, external or pkcs11 is required")
	}
	if err != nil {
		return nil, err
	}
	a, err := ca.New(ca.Config{Signer: signer, Clock: c.cfg.Clock})
	if err != nil {
		return nil, err
	}
	roots := signer.Roots()
	r := &root{authority: a, signer: signer, bundle: ca.CertsPEM(roots...), fingerprint: Fingerprint(verifyingRoot(signer)),
		ttl: defaultIntermediateTTL, org: vm.Name}
	if opts != nil {
		if opts.TTL != nil && opts.TTL.Duration > 0 {
			r.ttl = opts.TTL.Duration
		}
	}
	return r, nil
}

// verifyingRoot is the root the signer's chain verifies to.
func verifyingRoot(s ca.Signer) *x509.Certificate {
	chain, roots := s.Chain(), s.Roots()
	last := chain[len(chain)-1]
	for _, r := range roots {
		if last.Equal(r) || last.CheckSignatureFrom(r) == nil {
			return r
		}
	}
	return roots[0]
}

// generatedRoot loads the VirtualMesh's generated root from its Secret, or
// creates both. The Secret is created once (create fails if it exists), so
// two servers never end up with different roots.
func (c *Controller) generatedRoot(ctx context.Context, vm *networkingv1alpha1.VirtualMesh, opts *networkingv1alpha1.CertOptions) (ca.Signer, error) {
	name := rootSecretName(vm)
	secrets := c.cfg.Kube.CoreV1().Secrets(c.cfg.Namespace)
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		certPEM, keyPEM, gerr := generateRoot(vm, opts, c.cfg.Clock())
		if gerr != nil {
			return nil, gerr
		}
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.cfg.Namespace,
			Labels: map[string]string{rootLabel: "true"}, Annotations: map[string]string{"relaymesh.io/virtualmesh": vm.Namespace + "/" + vm.Name}},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
		if _, err = secrets.Create(ctx, s, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			s, err = secrets.Get(ctx, name, metav1.GetOptions{})
		} else if err == nil {
			c.log.Info("generated the root of a VirtualMesh", "virtual_mesh", vm.Namespace+"/"+vm.Name, "secret", name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("root secret %s/%s: %w", c.cfg.Namespace, name, err)
	}
	return ca.ParseSignerPEM(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], s.Data[corev1.TLSCertKey], c.cfg.Clock())
}

// rootSecretName names a VirtualMesh's generated root Secret.
func rootSecretName(vm *networkingv1alpha1.VirtualMesh) string {
	sum := sha256.Sum256([]byte(vm.Namespace + "/" + vm.Name))
	return "relaymesh-root-" + hex.EncodeToString(sum[:6])
}

// generateRoot makes the VirtualMesh's root (ca.GenerateMeshRoot: ECDSA
// P-256, path length 1) and encodes it for its Secret.
func generateRoot(vm *networkingv1alpha1.VirtualMesh, opts *networkingv1alpha1.CertOptions, now time.Time) (certPEM, keyPEM []byte, err error) {
	cfg := ca.MeshRootConfig{VirtualMesh: vm.Name, Clock: func() time.Time { return now }}
	if opts != nil {
		if opts.TTL != nil {
			cfg.TTL = opts.TTL.Duration
		}
		if alg := opts.KeyAlgorithm; alg != "" && alg != networkingv1alpha1.KeyECDSAP256 {
			return nil, nil, fmt.Errorf("generated roots are ECDSA P-256; keyAlgorithm %s is not supported for them (provide the root in a Secret instead)", alg)
		}
	}
	root, err := ca.GenerateMeshRoot(cfg)
	if err != nil {
		return nil, nil, err
	}
	block, err := pemutil.Serialize(root.Key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw}), pem.EncodeToMemory(block), nil
}

// issue signs mesh's intermediate for csr.
func (r *root) issue(ctx context.Context, csr *x509.CertificateRequest, mesh string) (*x509.Certificate, error) {
	iss, err := r.authority.IssueIntermediate(ctx, csr, ca.IntermediateRequest{VirtualMesh: r.org, Mesh: mesh, TTL: r.ttl})
	if err != nil {
		return nil, err
	}
	return iss.Certificate, nil
}
