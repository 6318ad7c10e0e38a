package identity

import (
	"context"
	"errors"
	"fmt"

	"github.com/relaymesh/relaymesh/internal/kubeutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Secret names and keys in the workload cluster (DESIGN.md).
const (
	RootSecret   = "relay-root-tls-secret"       // ca.crt: the relay root(s) to pin
	TokenSecret  = "relay-identity-token-secret" // token: the bootstrap token
	ClientSecret = "relay-client-tls-secret"     // tls.crt, tls.key, ca.crt
	KeyCACert    = "ca.crt"
	KeyToken     = "token"
)

var (
	// ErrNoCredential means the agent holds no client certificate yet.
	ErrNoCredential = errors.New("no client certificate stored")
	// ErrNoToken means there is no bootstrap token to use.
	ErrNoToken = errors.New("no bootstrap token")
	// ErrNoRoots means the relay root to pin is missing.
	ErrNoRoots = errors.New("no relay root CA")
)

// AgentSecrets is where an agent keeps its relay credentials.
type AgentSecrets interface {
	// Roots returns the PEM relay roots the agent pins; ErrNoRoots if absent.
	Roots(ctx context.Context) ([]byte, error)
	// Token returns the bootstrap token; ErrNoToken if absent.
	Token(ctx context.Context) (string, error)
	// DeleteToken removes the token after a successful bootstrap.
	DeleteToken(ctx context.Context) error
	// LoadCredential returns the stored credential; ErrNoCredential if absent.
	LoadCredential(ctx context.Context) (certPEM, keyPEM []byte, err error)
	// SaveCredential stores the credential (certificate chain and key PEM, roots PEM).
	SaveCredential(ctx context.Context, certPEM, keyPEM, rootsPEM []byte) error
}

// KubeAgentSecrets keeps the agent's credentials in Secrets of its own
// cluster, in the agent's namespace.
type KubeAgentSecrets struct {
	client    kubernetes.Interface
	namespace string
}

// NewKubeAgentSecrets returns secrets in namespace.
func NewKubeAgentSecrets(client kubernetes.Interface, namespace string) (*KubeAgentSecrets, error) {
	if client == nil || namespace == "" {
		return nil, errors.New("agent secrets: client and namespace are required")
	}
	return &KubeAgentSecrets{client: client, namespace: namespace}, nil
}

func (k *KubeAgentSecrets) get(ctx context.Context, name string) (*corev1.Secret, error) {
	return k.client.CoreV1().Secrets(k.namespace).Get(ctx, name, metav1.GetOptions{})
}

// Roots implements AgentSecrets.
func (k *KubeAgentSecrets) Roots(ctx context.Context) ([]byte, error) {
	s, err := k.get(ctx, RootSecret)
	if apierrors.IsNotFound(err) || (err == nil && len(s.Data[KeyCACert]) == 0) {
		return nil, fmt.Errorf("%w: secret %s/%s key %s", ErrNoRoots, k.namespace, RootSecret, KeyCACert)
	}
	if err != nil {
		return nil, err
	}
	if err := k.notTheServers(s); err != nil {
		return nil, err
	}
	return s.Data[KeyCACert], nil
}

// ErrServerNamespace means the agent runs in the relay server's namespace.
var ErrServerNamespace = errors.New("the agent's namespace is the relay server's")

// notTheServers refuses the relay server's own root Secret (it holds the
// root key): an agent run in the server's namespace (the management cluster
// as its own workload cluster, with --namespace set to the server's) would
// rewrite its ca.crt under the server's key. Nothing is written then.
func (k *KubeAgentSecrets) notTheServers(s *corev1.Secret) error {
	if _, ok := s.Data[corev1.TLSPrivateKeyKey]; ok {
		return fmt.Errorf("%w: secret %s/%s holds the relay root key; run the agent in a namespace of its own (--namespace relaymesh-agent, registered with --remote-namespace relaymesh-agent)",
			ErrServerNamespace, k.namespace, RootSecret)
	}
	return nil
}

// Token implements AgentSecrets.
func (k *KubeAgentSecrets) Token(ctx context.Context) (string, error) {
	s, err := k.get(ctx, TokenSecret)
	if apierrors.IsNotFound(err) || (err == nil && len(s.Data[KeyToken]) == 0) {
		return "", fmt.Errorf("%w: secret %s/%s key %s", ErrNoToken, k.namespace, TokenSecret, KeyToken)
	}
	if err != nil {
		return "", err
	}
	return string(s.Data[KeyToken]), nil
}

// DeleteToken implements AgentSecrets.
func (k *KubeAgentSecrets) DeleteToken(ctx context.Context) error {
	err := k.client.CoreV1().Secrets(k.namespace).Delete(ctx, TokenSecret, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// LoadCredential implements AgentSecrets.
func (k *KubeAgentSecrets) LoadCredential(ctx context.Context) ([]byte, []byte, error) {
	s, err := k.get(ctx, ClientSecret)
	if apierrors.IsNotFound(err) {
		return nil, nil, ErrNoCredential
	}
	if err != nil {
		return nil, nil, err
	}
	if len(s.Data[corev1.TLSCertKey]) == 0 || len(s.Data[corev1.TLSPrivateKeyKey]) == 0 {
		return nil, nil, fmt.Errorf("%w: secret %s/%s lacks tls.crt or tls.key", ErrNoCredential, k.namespace, ClientSecret)
	}
	return s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], nil
}

// SaveCredential implements AgentSecrets.
func (k *KubeAgentSecrets) SaveCredential(ctx context.Context, certPEM, keyPEM, rootsPEM []byte) error {
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      ClientSecret,
			Namespace: k.namespace,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "relaymesh"},
		},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM, KeyCACert: rootsPEM},
	}
	return kubeutil.UpsertSecret(ctx, k.client, want)
}

// SaveRoots implements RootsSaver: it replaces ca.crt of RootSecret,
// keeping the Secret's other keys, labels and annotations.
func (k *KubeAgentSecrets) SaveRoots(ctx context.Context, rootsPEM []byte) error {
	secrets := k.client.CoreV1().Secrets(k.namespace)
	s, err := secrets.Get(ctx, RootSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: RootSecret, Namespace: k.namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}},
			Data:       map[string][]byte{KeyCACert: rootsPEM},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if err := k.notTheServers(s); err != nil {
		return err
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[KeyCACert] = rootsPEM
	_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	return err
}
