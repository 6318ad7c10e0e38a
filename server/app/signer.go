package app

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/backend"
	"github.com/relaymesh/relaymesh/internal/kubeutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// signerBackend is the relay CA's back end in the one back-end list
// (ca/backend): the provided CA's files or Secret, else the generated CA.
func (c Config) signerBackend(client kubernetes.Interface, clock func() time.Time) backend.Config {
	switch {
	case c.CA.CertFile != "":
		return backend.Config{Type: backend.Secret, Secret: backend.SecretConfig{CertFile: c.CA.CertFile, KeyFile: c.CA.KeyFile, RootsFile: c.CA.RootsFile, Clock: clock}}
	case c.CA.Secret != "":
		return backend.Config{Type: backend.Secret, Secret: backend.SecretConfig{Name: c.CA.Secret, Namespace: c.Namespace, Client: client, Clock: clock}}
	}
	return backend.Config{Type: backend.Generated, Generated: backend.GeneratedConfig{Client: client, Namespace: c.Namespace,
		CA: ca.GenerateConfig{IssuerTTL: c.CA.IssuerTTL, Clock: clock}}}
}

// caFlag names the flag of a provided CA in errors.
func (c Config) caFlag() string {
	if c.CA.Secret != "" {
		return "--ca-secret"
	}
	return "--ca-cert"
}

// newSigner builds the relay CA's signer and the authority that issues
// with it. A provided CA's roots are published in relay-root-tls-secret
// (ca.crt only) for registration to copy to workload clusters.
func (p *process) newSigner(ctx context.Context) error {
	b := p.cfg.signerBackend(p.kube.Typed, time.Now)
	signer, err := backend.New(ctx, b)
	switch {
	case err != nil && b.Type == backend.Generated:
		return err
	case err != nil:
		return fmt.Errorf("%s: provided relay CA: %w", p.cfg.caFlag(), err)
	case b.Type != backend.Generated:
		if err := publishRoots(ctx, p.kube.Typed, p.cfg.Namespace, signer.Roots()); err != nil {
			return err
		}
	}
	p.signer = signer
	if p.authority, err = ca.New(ca.Config{Signer: signer, AgentTTL: p.cfg.AgentCertTTL}); err != nil {
		return err
	}
	return p.watchRelayIssuer(ctx)
}

// publishRoots writes the provided CA's roots into relay-root-tls-secret. It
// refuses to overwrite a generated relay CA (a secret that holds a key).
func publishRoots(ctx context.Context, kube kubernetes.Interface, namespace string, roots []*x509.Certificate) error {
	cur, err := kube.CoreV1().Secrets(namespace).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	if err == nil && len(cur.Data[corev1.TLSPrivateKeyKey]) > 0 {
		return fmt.Errorf("%s/%s holds a generated relay CA; delete it and %s to switch to a provided CA (agents must then be registered again)", namespace, ca.RootSecretName, ca.SigningSecretName)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return kubeutil.UpsertSecret(ctx, kube, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: ca.RootSecretName, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"ca.crt": ca.CertsPEM(roots...)},
	})
}
