package trust

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/backend"
	"github.com/relaymesh/relaymesh/ca/cfsslca"
	"github.com/relaymesh/relaymesh/ca/hsm"
	"github.com/relaymesh/relaymesh/ca/stepca"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Field paths of the VirtualMesh spec, for messages.
const (
	pkcs11Field   = "spec.mtls.shared.rootCA.pkcs11"
	externalField = "spec.mtls.shared.rootCA.external"
)

// Keys of the Secrets a rootCA.pkcs11 names (besides tls.crt);
// pkcs11Signer documents them.
const (
	keyPIN    = "pin"
	keyCACert = "ca.crt"
)

// External CA providers (rootCA.external.provider).
const (
	providerCFSSL  = string(backend.CFSSL)
	providerStepCA = string(backend.StepCA)
)

// Keys of the Secret a rootCA.external.configRef names; externalSigner
// documents them.
const (
	keyChain               = "chain.pem"
	keyRoots               = "roots.pem"
	keyTLSRoots            = "tlsRoots.pem"
	keyAuthKey             = "authKey"
	keyProfile             = "profile"
	keyProvisioner         = "provisioner"
	keyProvisionerKey      = "provisionerKey"
	keyProvisionerPassword = "provisionerPassword"
)

// defaultCFSSLProfile is the cfssl profile for mesh intermediates when the
// configRef Secret names none.
const defaultCFSSLProfile = "relaymesh-intermediate"

// pkcs11Signer opens the root of a rootCA.pkcs11. The string is a version
// of what it read (the Secrets' resourceVersions): a changed version means
// the signer must be opened anew. The signer holds PKCS#11 sessions and
// implements io.Closer.
//
// The module must be one the server allows (Config.PKCS11Modules, the
// --pkcs11-module flag), compared as a clean absolute path. Both Secrets
// must be in the server's namespace. Their keys:
//   - pinSecretRef, pin (required): the token's user PIN (trailing white
//     space ignored).
//   - certificateSecretRef, tls.crt (required): the PEM CA certificate of
//     the key on the token, then any intermediates above it in order.
//   - certificateSecretRef, ca.crt (optional): the PEM roots tls.crt
//     verifies to. Without it, tls.crt must be a single self-signed root.
//
// The key must belong to the first certificate of tls.crt, which must be
// a CA valid now. No error contains the PIN.
func (c *Controller) pkcs11Signer(ctx context.Context, vm string, p *networkingv1alpha1.PKCS11CA) (ca.Signer, string, error) {
	module, err := c.pkcs11Module(p.ModulePath)
	if err != nil {
		return nil, "", err
	}
	pinSecret, err := c.secret(ctx, vm, pkcs11Field+".pinSecretRef", p.PINSecretRef, keyPIN)
	if err != nil {
		return nil, "", err
	}
	certSecret, err := c.secret(ctx, vm, pkcs11Field+".certificateSecretRef", p.CertificateSecretRef, corev1.TLSCertKey)
	if err != nil {
		return nil, "", err
	}
	chain := certSecret.Data[corev1.TLSCertKey]
	roots := certSecret.Data[keyCACert]
	if len(roots) == 0 {
		if err := selfSignedRoot(chain); err != nil {
			return nil, "", fmt.Errorf("%s.certificateSecretRef: secret %s/%s has no key %s, so its %s must be a single self-signed root: %w",
				pkcs11Field, certSecret.Namespace, certSecret.Name, keyCACert, corev1.TLSCertKey, err)
		}
		roots = chain
	}
	s, err := backend.New(ctx, backend.Config{Type: backend.PKCS11, PKCS11: hsm.Config{
		ModulePath: module,
		TokenLabel: p.TokenLabel,
		KeyLabel:   p.KeyLabel,
		PIN:        pinSecret.Data[keyPIN],
		ChainPEM:   chain,
		RootsPEM:   roots,
		Clock:      c.cfg.Clock,
		Logger:     c.cfg.Logger,
	}})
	if err != nil {
		return nil, "", fmt.Errorf("%s (PIN from secret %s/%s, certificates from secret %s/%s): %w",
			pkcs11Field, pinSecret.Namespace, pinSecret.Name, certSecret.Namespace, certSecret.Name, err)
	}
	return s, version(pinSecret, certSecret), nil
}

// pkcs11Module returns the module path, cleaned, if the server allows it:
// a VirtualMesh must not make the server load an arbitrary library.
func (c *Controller) pkcs11Module(path string) (string, error) {
	field := pkcs11Field + ".modulePath"
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%s %q must be an absolute path", field, path)
	}
	clean := filepath.Clean(path)
	for _, m := range c.cfg.PKCS11Modules {
		if filepath.IsAbs(m) && filepath.Clean(m) == clean {
			return clean, nil
		}
	}
	if len(c.cfg.PKCS11Modules) == 0 {
		return "", fmt.Errorf("%s %q: the server allows no PKCS#11 module; start it with --pkcs11-module %s to allow this one", field, path, clean)
	}
	return "", fmt.Errorf("%s %q is not a PKCS#11 module the server allows (its --pkcs11-module flags: %s)", field, path, strings.Join(c.cfg.PKCS11Modules, ", "))
}

// selfSignedRoot reports PEM that is not exactly one certificate signed by
// its own key.
func selfSignedRoot(certPEM []byte) error {
	certs, err := pemutil.ParseCertificateBundle(certPEM)
	switch {
	case err != nil:
		return err
	case len(certs) != 1:
		return fmt.Errorf("it holds %d certificates", len(certs))
	}
	c := certs[0]
	if !bytes.Equal(c.RawIssuer, c.RawSubject) || c.CheckSignature(c.SignatureAlgorithm, c.RawTBSCertificate, c.Signature) != nil {
		return fmt.Errorf("certificate %q is issued by %q", c.Subject, c.Issuer)
	}
	return nil
}

// externalSigner connects to the CA service of a rootCA.external at its
// url, with the credentials and certificates of its configRef Secret,
// which must be in the server's namespace. The string is the Secret's
// resourceVersion: a changed version means the signer must be opened
// anew. No error contains a credential.
//
// The keys of the configRef Secret, for every provider:
//   - chain.pem (required): the PEM certificate the CA service signs with,
//     then any intermediates above it in order.
//   - roots.pem (required): the PEM roots the chain verifies to: the roots
//     the VirtualMesh's meshes trust.
//   - tlsRoots.pem (optional): the PEM roots the service's HTTPS
//     certificate must chain to; default roots.pem. No other root is
//     trusted.
//
// For provider cfssl (package ca/cfsslca):
//   - authKey (required): the hex HMAC key of the profiles' auth_key.
//   - profile (optional): the signing profile for mesh intermediates;
//     default relaymesh-intermediate. The server must also have the
//     relaymesh-client, relaymesh-server and relaymesh-server-rsa profiles
//     (cfsslca.Profiles): the back end checks every profile at start.
//
// For provider stepca (package ca/stepca):
//   - provisioner (required): the name of the JWK provisioner.
//   - provisionerKey (required): its private key: a JWK, an encrypted JWK
//     (the provisioner's encryptedKey in ca.json) or a PEM key.
//   - provisionerPassword (optional): the password of an encrypted key.
//
// White space around authKey, profile and provisioner, and trailing white
// space of provisionerPassword, is ignored.
func (c *Controller) externalSigner(ctx context.Context, vm string, e *networkingv1alpha1.ExternalCA) (ca.Signer, string, error) {
	var required []string
	switch e.Provider {
	case providerCFSSL:
		required = []string{keyAuthKey, keyChain, keyRoots}
	case providerStepCA:
		required = []string{keyProvisioner, keyProvisionerKey, keyChain, keyRoots}
	default:
		return nil, "", fmt.Errorf("%s.provider %q is not one of %s, %s", externalField, e.Provider, providerCFSSL, providerStepCA)
	}
	sec, err := c.secret(ctx, vm, externalField+".configRef", e.ConfigRef, required...)
	if err != nil {
		return nil, "", err
	}
	d := sec.Data
	// The provider names are ca/backend's types; the one back-end list
	// builds the signer.
	cfg := backend.Config{Type: backend.Type(e.Provider)}
	switch cfg.Type {
	case backend.CFSSL:
		cfg.CFSSL = cfsslca.Config{
			URL:         e.URL,
			AuthKey:     d[keyAuthKey],
			Profiles:    cfsslca.Profiles{Intermediate: cmp.Or(strings.TrimSpace(string(d[keyProfile])), defaultCFSSLProfile)},
			ChainPEM:    d[keyChain],
			RootsPEM:    d[keyRoots],
			TLSRootsPEM: d[keyTLSRoots],
			Clock:       c.cfg.Clock,
			Logger:      c.cfg.Logger,
		}
	case backend.StepCA:
		cfg.StepCA = stepca.Config{
			URL:                 e.URL,
			Provisioner:         strings.TrimSpace(string(d[keyProvisioner])),
			ProvisionerKey:      d[keyProvisionerKey],
			ProvisionerPassword: d[keyProvisionerPassword],
			ChainPEM:            d[keyChain],
			RootsPEM:            d[keyRoots],
			TLSRootsPEM:         d[keyTLSRoots],
			Clock:               c.cfg.Clock,
			Logger:              c.cfg.Logger,
		}
	}
	s, err := backend.New(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("%s (%s at %s, configuration from secret %s/%s): %w", externalField, e.Provider, e.URL, sec.Namespace, sec.Name, err)
	}
	return s, version(sec), nil
}

// secret reads the Secret ref names at field (its path in the spec) and
// checks that it has every key of required, non-empty. It must be in the
// server's namespace (empty means that one): the server can read Secrets
// everywhere, and a VirtualMesh must not be a way to make it use
// credentials or keys of another namespace.
func (c *Controller) secret(ctx context.Context, vm, field string, ref common.ObjectRef, required ...string) (*corev1.Secret, error) {
	ns := cmp.Or(ref.Namespace, c.cfg.Namespace)
	if ns != c.cfg.Namespace {
		return nil, fmt.Errorf("%s must be in the server's namespace %s, not %s", field, c.cfg.Namespace, ns)
	}
	reserved := fmt.Errorf("%s: secret %s/%s holds a key Relaymesh keeps for itself (the relay CA, or another VirtualMesh's generated root); a VirtualMesh cannot use it", field, ns, ref.Name)
	if slices.Contains(append([]string{ca.RootSecretName, ca.SigningSecretName}, c.cfg.ReservedSecrets...), ref.Name) {
		return nil, reserved
	}
	s, err := c.cfg.Kube.CoreV1().Secrets(ns).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: secret %s/%s: %w", field, ns, ref.Name, err)
	}
	if s.Labels[rootLabel] != "" {
		return nil, reserved
	}
	if !offered(s, vm) {
		return nil, fmt.Errorf("%s: secret %s/%s is not offered to VirtualMesh %s: list it in the Secret's annotation %s (comma-separated namespace/name, or \"*\")",
			field, ns, ref.Name, vm, networkingv1alpha1.AnnotationVirtualMeshes)
	}
	var missing []string
	for _, k := range required {
		if len(s.Data[k]) == 0 {
			missing = append(missing, fmt.Sprintf("%q", k))
		}
	}
	if len(missing) != 0 {
		return nil, fmt.Errorf("%s: secret %s/%s has no (or an empty) key %s", field, ns, ref.Name, strings.Join(missing, ", "))
	}
	return s, nil
}

// offered reports whether Secret s lists VirtualMesh vm (namespace/name),
// or "*", in its relaymesh.io/virtualmeshes annotation: the owner of a root
// or of CA credentials decides which VirtualMeshes may use them, not the
// VirtualMeshes' authors.
func offered(s *corev1.Secret, vm string) bool {
	for _, v := range strings.Split(s.Annotations[networkingv1alpha1.AnnotationVirtualMeshes], ",") {
		if v = strings.TrimSpace(v); v == "*" || v == vm {
			return true
		}
	}
	return false
}

// version joins the resourceVersions of the Secrets a signer was opened
// from.
func version(secrets ...*corev1.Secret) string {
	v := make([]string, len(secrets))
	for i, s := range secrets {
		v[i] = s.ResourceVersion
	}
	return strings.Join(v, ",")
}
