package trust

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	defaultIntermediateTTL = 8760 * time.Hour // 1 year
	// rootLabel marks the Secrets of generated VirtualMesh roots, and
	// rootAnnotation names the VirtualMesh each belongs to.
	rootLabel      = "relaymesh.io/virtualmesh-root"
	rootAnnotation = "relaymesh.io/virtualmesh"
	// rootCacheTTL is how long a loaded root is used before it is loaded
	// again: credentials in its Secrets may change, and a root changed in
	// place must be noticed.
	rootCacheTTL = time.Minute
)

// root is a shared root and what signs with it.
type root struct {
	authority   *ca.Authority
	signer      ca.Signer
	cert        *x509.Certificate   // the root the chain verifies to
	roots       []*x509.Certificate // every root the signer names
	fingerprint string              // of cert
}

func (r *root) chain() []*x509.Certificate {
	// The issuing chain up to, not including, the root: a generated or
	// provided root that signs directly contributes nothing.
	chain := r.signer.Chain()
	if len(chain) > 0 && chain[len(chain)-1].Equal(r.cert) {
		chain = chain[:len(chain)-1]
	}
	return chain
}

// issue signs mesh's intermediate for csr.
func (r *root) issue(ctx context.Context, csr *x509.CertificateRequest, req ca.IntermediateRequest) (*x509.Certificate, error) {
	iss, err := r.authority.IssueIntermediate(ctx, csr, req)
	if err != nil {
		return nil, err
	}
	return iss.Certificate, nil
}

// specSource is where spec.mtls.shared.rootCA says vm's root lives.
func specSource(vm *networkingv1alpha1.VirtualMesh) networkingv1alpha1.RootSource {
	src := networkingv1alpha1.RootSource{RootCA: *vm.Spec.MTLS.Shared.RootCA.DeepCopy()}
	if src.Generated != nil {
		src.GeneratedSecret = rootSecretName(vm)
	}
	return src
}

// sameSource reports whether a and b name the same root: a generated one
// by its Secret (its options only shape a root made anew), any other by its
// whole configuration.
func sameSource(a, b networkingv1alpha1.RootSource) bool {
	if a.Generated != nil || b.Generated != nil {
		return a.Generated != nil && b.Generated != nil && a.GeneratedSecret == b.GeneratedSecret
	}
	return equality.Semantic.DeepEqual(a.RootCA, b.RootCA)
}

// describe names a root source for status messages and logs.
func describe(src networkingv1alpha1.RootSource) string {
	switch {
	case src.Generated != nil:
		return "generated root in Secret " + src.GeneratedSecret
	case src.Secret != nil:
		return "root in Secret " + src.Secret.Name
	case src.PKCS11 != nil:
		return "HSM key " + src.PKCS11.KeyLabel + " on token " + src.PKCS11.TokenLabel
	case src.External != nil:
		return src.External.Provider + " at " + src.External.URL
	}
	return "no root"
}

type cachedRoot struct {
	r  *root
	at time.Time
}

// load returns the root at src for vm, from the cache while it is fresh. A
// generated root is created only if create is set: a root a rotation
// started from or to must exist, never be made anew.
func (c *Controller) load(ctx context.Context, vm *networkingv1alpha1.VirtualMesh, src networkingv1alpha1.RootSource, create bool) (*root, error) {
	b, err := json.Marshal(src)
	if err != nil {
		return nil, err
	}
	key := vm.Namespace + "/" + vm.Name + "\x00" + string(b)
	now := c.cfg.Clock()
	c.mu.Lock()
	cached, ok := c.cache[key]
	c.used[key] = true
	c.mu.Unlock()
	if ok && now.Sub(cached.at) < rootCacheTTL && now.Sub(cached.at) >= 0 {
		return cached.r, nil
	}
	r, err := c.open(ctx, vm, src, create)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.cache[key] = cachedRoot{r: r, at: now}
	c.mu.Unlock()
	if ok {
		closeLater(cached.r)
	}
	return r, nil
}

// dropUnused closes the cached roots no reconcile asked for since the last
// call.
func (c *Controller) dropUnused() {
	c.mu.Lock()
	var drop []*root
	for key, e := range c.cache {
		if !c.used[key] {
			drop = append(drop, e.r)
			delete(c.cache, key)
		}
	}
	c.used = map[string]bool{}
	c.mu.Unlock()
	for _, r := range drop {
		closeLater(r)
	}
}

// closeLater closes a signer that holds resources (an HSM session) once
// signings that may still use it are over.
func closeLater(r *root) {
	if cl, ok := r.signer.(io.Closer); ok {
		time.AfterFunc(time.Minute, func() { _ = cl.Close() })
	}
}

// open builds the root at src.
func (c *Controller) open(ctx context.Context, vm *networkingv1alpha1.VirtualMesh, src networkingv1alpha1.RootSource, create bool) (*root, error) {
	var signer ca.Signer
	var err error
	switch {
	case src.Generated != nil:
		signer, err = c.generatedRoot(ctx, vm, src, create)
	case src.Secret != nil:
		signer, err = c.secretRoot(ctx, vm.Namespace+"/"+vm.Name, src)
	case src.PKCS11 != nil:
		signer, _, err = c.pkcs11Signer(ctx, vm.Namespace+"/"+vm.Name, src.PKCS11)
	case src.External != nil:
		signer, _, err = c.externalSigner(ctx, vm.Namespace+"/"+vm.Name, src.External)
	default:
		return nil, errors.New("spec.mtls.shared.rootCA: one of generated, secret, external or pkcs11 is required")
	}
	if err != nil {
		return nil, err
	}
	a, err := ca.New(ca.Config{Signer: signer, Clock: c.cfg.Clock})
	if err != nil {
		if cl, ok := signer.(io.Closer); ok {
			_ = cl.Close()
		}
		return nil, err
	}
	cert := verifyingRoot(signer)
	return &root{authority: a, signer: signer, cert: cert, roots: signer.Roots(), fingerprint: Fingerprint(cert)}, nil
}

// secretRoot reads a provided root (or intermediate of a longer chain) from
// a Secret of the server's namespace.
func (c *Controller) secretRoot(ctx context.Context, vm string, src networkingv1alpha1.RootSource) (ca.Signer, error) {
	s, err := c.secret(ctx, vm, "spec.mtls.shared.rootCA.secret", *src.Secret, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	if err != nil {
		return nil, err
	}
	roots := s.Data["ca.crt"]
	if len(roots) == 0 {
		roots = s.Data[corev1.TLSCertKey] // a self-signed root
	}
	return ca.ParseSignerPEM(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], roots, c.cfg.Clock())
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

// generatedRoot loads a generated root from its Secret, or, if create is
// set, creates both. The Secret is created once (create fails if it
// exists), so two servers never end up with different roots. A Secret that
// is not the VirtualMesh's generated root is refused.
func (c *Controller) generatedRoot(ctx context.Context, vm *networkingv1alpha1.VirtualMesh, src networkingv1alpha1.RootSource, create bool) (ca.Signer, error) {
	name, owner := src.GeneratedSecret, vm.Namespace+"/"+vm.Name
	secrets := c.cfg.Kube.CoreV1().Secrets(c.cfg.Namespace)
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && create {
		certPEM, keyPEM, gerr := generateRoot(vm, src.Generated, c.cfg.Clock())
		if gerr != nil {
			return nil, gerr
		}
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.cfg.Namespace,
			Labels: map[string]string{rootLabel: "true"}, Annotations: map[string]string{rootAnnotation: owner}},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
		if _, err = secrets.Create(ctx, s, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			s, err = secrets.Get(ctx, name, metav1.GetOptions{})
		} else if err == nil {
			c.log.Info("generated the root of a VirtualMesh", "virtual_mesh", owner, "secret", name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("root secret %s/%s: %w", c.cfg.Namespace, name, err)
	}
	if s.Labels[rootLabel] != "true" || s.Annotations[rootAnnotation] != owner {
		return nil, fmt.Errorf("secret %s/%s is not the generated root of VirtualMesh %s (label %s, annotation %s)", c.cfg.Namespace, name, owner, rootLabel, rootAnnotation)
	}
	return ca.ParseSignerPEM(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], s.Data[corev1.TLSCertKey], c.cfg.Clock())
}

// deleteGeneratedRoot deletes a generated root no rotation can return to,
// so its key is gone from the management cluster.
func (c *Controller) deleteGeneratedRoot(ctx context.Context, vm *networkingv1alpha1.VirtualMesh, src networkingv1alpha1.RootSource) {
	if src.Generated == nil || src.GeneratedSecret == "" {
		return
	}
	secrets := c.cfg.Kube.CoreV1().Secrets(c.cfg.Namespace)
	s, err := secrets.Get(ctx, src.GeneratedSecret, metav1.GetOptions{})
	if err != nil || s.Labels[rootLabel] != "true" || s.Annotations[rootAnnotation] != vm.Namespace+"/"+vm.Name {
		return
	}
	uid := s.UID
	if err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		c.log.Warn("the replaced generated root was not deleted", "virtual_mesh", vm.Namespace+"/"+vm.Name, "secret", s.Name, "error", err)
		return
	}
	c.log.Info("deleted the replaced generated root", "virtual_mesh", vm.Namespace+"/"+vm.Name, "secret", s.Name)
}

// rootSecretName names the Secret of a VirtualMesh's generated root. A new
// relaymesh.io/root-generation annotation or key algorithm names a new
// Secret, so a new root: that is how a generated root is rotated.
func rootSecretName(vm *networkingv1alpha1.VirtualMesh) string {
	id := vm.Namespace + "/" + vm.Name
	gen := vm.Annotations[networkingv1alpha1.AnnotationRootGeneration]
	var alg networkingv1alpha1.KeyAlgorithm
	if g := vm.Spec.MTLS.Shared.RootCA.Generated; g != nil && g.KeyAlgorithm != networkingv1alpha1.KeyECDSAP256 {
		alg = g.KeyAlgorithm
	}
	if gen != "" || alg != "" {
		id += "\x00" + gen + "\x00" + string(alg)
	}
	sum := sha256.Sum256([]byte(id))
	return "relaymesh-root-" + hex.EncodeToString(sum[:6])
}

// generateRoot makes a VirtualMesh's root (ca.GenerateMeshRoot: path length
// 1, ECDSA P-256 unless keyAlgorithm says otherwise; RSA-2048 is refused)
// and encodes it for its Secret.
func generateRoot(vm *networkingv1alpha1.VirtualMesh, opts *networkingv1alpha1.CertOptions, now time.Time) (certPEM, keyPEM []byte, err error) {
	cfg := ca.MeshRootConfig{VirtualMesh: vm.Name, Clock: func() time.Time { return now }}
	if opts != nil {
		if opts.TTL != nil {
			cfg.TTL = opts.TTL.Duration
		}
		cfg.KeyAlgorithm = ca.KeyAlgorithm(opts.KeyAlgorithm)
	}
	r, err := ca.GenerateMeshRoot(cfg)
	if err != nil {
		return nil, nil, err
	}
	block, err := pemutil.Serialize(r.Key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Cert.Raw}), pem.EncodeToMemory(block), nil
}
