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
	switch {
	case c.CA.Secret != "":
		return "--ca-secret"
	case c.CA.ConfigFile != "":
		return "--ca-config"
	}
	return "--ca-cert"
}

// reloadingSigner is a relay CA on an enterprise back end
// (backend.FileSigner): every replica re-reads its --ca-config and picks
// up a new issuing CA, keeping the replaced one accepted.
type reloadingSigner interface {
	Reload(ctx context.Context) (bool, error)
	Generation() int
	AcceptedIssuers() []*x509.Certificate
	Chain() []*x509.Certificate
	Type() backend.Type
}

// newSigner builds the relay CA's signer and the authority that issues
// with it. A provided CA's roots are published in relay-root-tls-secret
// (ca.crt only) for registration to copy to workload clusters.
func (p *process) newSigner(ctx context.Context) error {
	signer, generated, err := p.buildSigner(ctx)
	switch {
	case err != nil && generated:
		return err
	case err != nil:
		return fmt.Errorf("%s: provided relay CA: %w", p.cfg.caFlag(), err)
	case !generated:
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

// buildSigner builds the relay CA's signer through the one back-end list:
// an enterprise back end from --ca-config (backend.NewFileSigner, which
// calls backend.New), else signerBackend.
func (p *process) buildSigner(ctx context.Context) (ca.Signer, bool, error) {
	if p.cfg.CA.ConfigFile != "" {
		s, err := backend.NewFileSigner(ctx, backend.FileSignerConfig{
			Path:   p.cfg.CA.ConfigFile,
			Keep:   p.cfg.CA.issuerKeep(p.cfg.AgentCertTTL),
			Logger: p.log,
		})
		if err == nil {
			p.log.Info("relay CA on an enterprise back end", "backend", s.(reloadingSigner).Type(), "config", p.cfg.CA.ConfigFile,
				"issuer", s.Chain()[0].Subject.String(), "not_after", s.Chain()[0].NotAfter)
		}
		return s, false, err
	}
	b := p.cfg.signerBackend(p.kube.Typed, time.Now)
	s, err := backend.New(ctx, b)
	return s, b.Type == backend.Generated, err
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
