package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"go.step.sm/crypto/keyutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Secrets of the generated relay CA in the management cluster.
const (
	// RootSecretName holds the relay root: ca.crt (certificate) and tls.key
	// (its key). Only ca.crt ever leaves the management cluster.
	RootSecretName = "relay-root-tls-secret"
	// SigningSecretName holds the issuing CA: tls.crt (certificate), tls.key
	// (its key) and ca.crt (the root certificate).
	SigningSecretName = "relay-tls-signing-secret"
)

// Secret data keys and labels.
const (
	keyCACert  = "ca.crt"
	keyTLSCert = "tls.crt"
	keyTLSKey  = "tls.key"

	managedByLabel = "app.kubernetes.io/managed-by"
	managedByValue = "relaymesh"
)

// A replica that creates the relay CA writes the root secret, then the
// signing secret. Another replica that sees only the root waits this long
// for the second secret before it makes the issuing CA itself from the
// stored root.
const (
	settleTimeout  = 10 * time.Second
	settleInterval = 100 * time.Millisecond
)

// LoadOrCreateRelayCA returns a Signer for the generated relay CA kept in
// namespace (RootSecretName and SigningSecretName): a *RelayIssuers, which
// also accepts the previous issuing CAs a renewal keeps (RenewRelayIssuer)
// and reloads them (Reload).
//
//   - Both secrets exist: it loads them, and fails with ErrInvalidSigner
//     if their data is malformed, a key does not match its certificate,
//     the two secrets name different roots, or the CA is not valid now.
//   - Neither exists: it generates a CA (cfg) and creates the root secret,
//     then the signing secret, both labelled
//     app.kubernetes.io/managed-by=relaymesh. Creation never overwrites: if
//     another replica created a secret first, it uses that replica's.
//   - Only the root exists (a replica creating the CA right now, or one
//     that stopped between the two writes): after waiting briefly for the
//     signing secret, it checks the stored root and its key, makes a new
//     issuing CA signed by it, and creates the signing secret. The root
//     secret is never changed.
//   - Only the signing secret exists (after waiting as briefly): the
//     root's key is gone, so it fails with ErrInvalidSigner and changes
//     nothing.
func LoadOrCreateRelayCA(ctx context.Context, client kubernetes.Interface, namespace string, cfg GenerateConfig) (Signer, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ca: invalid generate config: %w", err)
	}
	if client == nil || namespace == "" {
		return nil, errors.New("ca: a Kubernetes client and a namespace are required")
	}
	secrets := client.CoreV1().Secrets(namespace)
	root, signing, err := getRelaySecrets(ctx, secrets)
	if err != nil {
		return nil, err
	}
	if (root == nil) != (signing == nil) {
		if root, signing, err = waitForRelaySecrets(ctx, secrets); err != nil {
			return nil, err
		}
	}
	if root == nil && signing == nil {
		_, err = createRelayCA(ctx, secrets, namespace, cfg)
	} else {
		_, err = loadOrCompleteRelayCA(ctx, secrets, namespace, root, signing, cfg)
	}
	if err != nil {
		return nil, err
	}
	// Both secrets exist now: load them with the previous issuing CAs a
	// renewal keeps (RelayIssuers).
	if root, signing, err = getRelaySecrets(ctx, secrets); err != nil {
		return nil, err
	}
	if root == nil || signing == nil {
		return nil, halfPresent(namespace, root, signing)
	}
	return newRelayIssuers(client, namespace, root, signing, cfg.Clock)
}

// loadOrCompleteRelayCA loads a CA whose secrets both exist, completes one
// whose root secret alone exists, and refuses one without a root secret.
func loadOrCompleteRelayCA(ctx context.Context, secrets typedcorev1.SecretInterface, namespace string, root, signing *corev1.Secret, cfg GenerateConfig) (Signer, error) {
	switch {
	case root != nil && signing != nil:
		return loadRelayCA(root, signing, cfg.Clock())
	case root != nil:
		return completeRelayCA(ctx, secrets, namespace, root, cfg)
	}
	return nil, halfPresent(namespace, root, signing)
}

// completeRelayCA makes an issuing CA from the root stored in root and
// creates the signing secret. If another replica creates it first, that
// replica's issuing CA is used.
func completeRelayCA(ctx context.Context, secrets typedcorev1.SecretInterface, namespace string, root *corev1.Secret, cfg GenerateConfig) (Signer, error) {
	bad := func(key string, err error) error {
		return fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, namespace, RootSecretName, key, err)
	}
	rootCert, err := singleCertPEM(root.Data[keyCACert])
	if err != nil {
		return nil, bad(keyCACert, err)
	}
	rootKey, err := parseKeyPEM(root.Data[keyTLSKey])
	if err != nil {
		return nil, bad(keyTLSKey, err)
	}
	if !keyutil.Equal(rootCert.PublicKey, rootKey.Public()) {
		return nil, fmt.Errorf("%w: secret %s/%s: the root key does not belong to %s", ErrInvalidSigner, namespace, RootSecretName, describe(rootCert))
	}
	issuer, issuerKey, err := newRelayIssuer(cfg, rootCert, rootKey)
	if err != nil {
		return nil, err
	}
	r := &RelayCA{Root: rootCert, RootKey: rootKey, Issuer: issuer, IssuerKey: issuerKey}
	// The stored root is checked like a loaded CA before anything is written.
	if err := r.check(cfg.Clock()); err != nil {
		return nil, fmt.Errorf("relay CA in secret %s/%s: %w", namespace, RootSecretName, err)
	}
	_, signingSecret, err := r.secrets(namespace)
	if err != nil {
		return nil, err
	}
	created, err := secrets.Create(ctx, signingSecret, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		root, signing, err := getRelaySecrets(ctx, secrets)
		if err != nil {
			return nil, err
		}
		if root == nil || signing == nil {
			return nil, halfPresent(namespace, root, signing)
		}
		return loadRelayCA(root, signing, cfg.Clock())
	case err != nil:
		return nil, fmt.Errorf("create secret %s/%s: %w", namespace, SigningSecretName, err)
	}
	return loadRelayCA(root, created, cfg.Clock())
}

// RelayRootsPEM returns the relay root certificates, the ca.crt of
// RootSecretName re-encoded as PEM certificates only: what registration
// copies to workload clusters. The root key is never returned.
func RelayRootsPEM(ctx context.Context, client kubernetes.Interface, namespace string) ([]byte, error) {
	if client == nil || namespace == "" {
		return nil, errors.New("ca: a Kubernetes client and a namespace are required")
	}
	s, err := client.CoreV1().Secrets(namespace).Get(ctx, RootSecretName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get secret %s/%s: %w", namespace, RootSecretName, err)
	}
	certs, err := parseCertsPEM(s.Data[keyCACert])
	if err != nil {
		return nil, fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, namespace, RootSecretName, keyCACert, err)
	}
	for _, c := range certs {
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, fmt.Errorf("%w: secret %s/%s %s: %s is not a CA certificate", ErrInvalidSigner, namespace, RootSecretName, keyCACert, describe(c))
		}
	}
	return CertsPEM(certs...), nil
}

// getRelaySecrets reads both secrets; a missing one is nil. The signing
// secret is read first: it is created after the root, so a replica that
// creates both between the two reads cannot make the CA look half present
// (a root read as missing, then a signing secret read as there).
func getRelaySecrets(ctx context.Context, secrets typedcorev1.SecretInterface) (root, signing *corev1.Secret, err error) {
	if signing, err = getSecret(ctx, secrets, SigningSecretName); err != nil {
		return nil, nil, err
	}
	if root, err = getSecret(ctx, secrets, RootSecretName); err != nil {
		return nil, nil, err
	}
	return root, signing, nil
}

func getSecret(ctx context.Context, secrets typedcorev1.SecretInterface, name string) (*corev1.Secret, error) {
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get secret %s: %w", name, err)
	}
	return s, nil
}

// waitForRelaySecrets re-reads both secrets until both exist or
// settleTimeout passes, and returns what it read last.
func waitForRelaySecrets(ctx context.Context, secrets typedcorev1.SecretInterface) (root, signing *corev1.Secret, err error) {
	deadline := time.Now().Add(settleTimeout)
	for {
		root, signing, err = getRelaySecrets(ctx, secrets)
		if err != nil || (root != nil && signing != nil) || time.Now().After(deadline) {
			return root, signing, err
		}
		t := time.NewTimer(settleInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		case <-t.C:
		}
	}
}

// halfPresent reports that only one of the two secrets exists.
func halfPresent(namespace string, root, _ *corev1.Secret) error {
	have, missing := RootSecretName, SigningSecretName
	if root == nil {
		have, missing = SigningSecretName, RootSecretName
	}
	return fmt.Errorf("%w: relay CA is half present: secret %s/%s exists but %s does not; restore %s, or delete %s to generate a new relay CA (agents then need new certificates)",
		ErrInvalidSigner, namespace, have, missing, missing, have)
}

// createRelayCA generates a relay CA and creates its secrets, root first.
func createRelayCA(ctx context.Context, secrets typedcorev1.SecretInterface, namespace string, cfg GenerateConfig) (Signer, error) {
	r, err := GenerateRelayCA(cfg)
	if err != nil {
		return nil, err
	}
	rootSecret, signingSecret, err := r.secrets(namespace)
	if err != nil {
		return nil, err
	}
	created, err := secrets.Create(ctx, rootSecret, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Another replica won the race: use its CA.
		root, signing, err := waitForRelaySecrets(ctx, secrets)
		if err != nil {
			return nil, err
		}
		return loadOrCompleteRelayCA(ctx, secrets, namespace, root, signing, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("create secret %s/%s: %w", namespace, RootSecretName, err)
	}
	_, err = secrets.Create(ctx, signingSecret, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Nobody should create the signing secret without the root. Use
		// what is there only if it belongs to our root; otherwise fail.
		root, signing, gerr := getRelaySecrets(ctx, secrets)
		if gerr != nil {
			return nil, gerr
		}
		if root == nil || signing == nil {
			return nil, halfPresent(namespace, root, signing)
		}
		return loadRelayCA(root, signing, cfg.Clock())
	}
	if err != nil && !refused(err) {
		// The write may have landed (a timeout, a server error): keep the
		// root secret. A retry loads the CA, or completes it from the root.
		return nil, fmt.Errorf("create secret %s/%s: %w", namespace, SigningSecretName, err)
	}
	if err != nil {
		// The apiserver refused the signing secret, so it does not exist.
		// Undo our root secret (and only ours), so that the namespace is
		// as it was.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		derr := secrets.Delete(dctx, RootSecretName, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &created.UID},
		})
		if derr != nil && !apierrors.IsNotFound(derr) {
			derr = fmt.Errorf("roll back secret %s/%s: %w", namespace, RootSecretName, derr)
		} else {
			derr = nil
		}
		return nil, errors.Join(fmt.Errorf("create secret %s/%s: %w", namespace, SigningSecretName, err), derr)
	}
	return r.Signer(cfg.Clock())
}

// refused reports whether the apiserver answered err with a definite refusal
// (the object was not written), as opposed to a timeout or a server error.
func refused(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsUnauthorized(err) || apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsMethodNotSupported(err)
}

// loadRelayCA parses and checks the two secrets and returns their signer.
func loadRelayCA(root, signing *corev1.Secret, now time.Time) (Signer, error) {
	r, err := relayCAFromSecrets(root, signing)
	if err != nil {
		return nil, err
	}
	if err := r.check(now); err != nil {
		return nil, fmt.Errorf("relay CA in secrets %s/%s and %s: %w", root.Namespace, RootSecretName, SigningSecretName, err)
	}
	return r.Signer(now)
}

func relayCAFromSecrets(root, signing *corev1.Secret) (*RelayCA, error) {
	var r RelayCA
	var err error
	bad := func(s *corev1.Secret, key string, err error) error {
		return fmt.Errorf("%w: secret %s/%s %s: %w", ErrInvalidSigner, s.Namespace, s.Name, key, err)
	}
	if r.Root, err = singleCertPEM(root.Data[keyCACert]); err != nil {
		return nil, bad(root, keyCACert, err)
	}
	if r.RootKey, err = parseKeyPEM(root.Data[keyTLSKey]); err != nil {
		return nil, bad(root, keyTLSKey, err)
	}
	if r.Issuer, err = singleCertPEM(signing.Data[keyTLSCert]); err != nil {
		return nil, bad(signing, keyTLSCert, err)
	}
	if r.IssuerKey, err = parseKeyPEM(signing.Data[keyTLSKey]); err != nil {
		return nil, bad(signing, keyTLSKey, err)
	}
	signingRoot, err := singleCertPEM(signing.Data[keyCACert])
	if err != nil {
		return nil, bad(signing, keyCACert, err)
	}
	if !signingRoot.Equal(r.Root) {
		return nil, bad(signing, keyCACert, fmt.Errorf("differs from %s %s", RootSecretName, keyCACert))
	}
	return &r, nil
}

func singleCertPEM(b []byte) (*x509.Certificate, error) {
	certs, err := parseCertsPEM(b)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("%d certificates, want 1", len(certs))
	}
	return certs[0], nil
}

// secrets returns the two secrets that store r.
func (r *RelayCA) secrets(namespace string) (root, signing *corev1.Secret, err error) {
	rootKey, err := encodeKeyPEM(r.RootKey)
	if err != nil {
		return nil, nil, fmt.Errorf("root key: %w", err)
	}
	issuerKey, err := encodeKeyPEM(r.IssuerKey)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing CA key: %w", err)
	}
	rootPEM := CertsPEM(r.Root)
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Name:      name,
			Namespace: namespace,
			Labels:    map[string]string{managedByLabel: managedByValue},
		}
	}
	root = &corev1.Secret{
		ObjectMeta: meta(RootSecretName),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{keyCACert: rootPEM, keyTLSKey: rootKey},
	}
	signing = &corev1.Secret{
		ObjectMeta: meta(SigningSecretName),
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			keyTLSCert: CertsPEM(r.Issuer),
			keyTLSKey:  issuerKey,
			keyCACert:  rootPEM,
		},
	}
	return root, signing, nil
}
