package identity

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Kubernetes representation of a token record: one Secret per token in the
// server's namespace, holding only the hash.
// TokenSecretType marks bootstrap-token secrets.
const TokenSecretType corev1.SecretType = "relaymesh.io/bootstrap-token"

const (
	tokenSecretPrefix = "relaymesh-bootstrap-token-"
	labelToken        = "relaymesh.io/bootstrap-token"
	labelCluster      = "relaymesh.io/cluster"
	keyCluster        = "cluster"
	keySecretHash     = "secret-sha256"
	keyExpiresAt      = "expires-at"
)

// MintedByAnnotation on a token record names the user the management
// apiserver authenticated as the minter (the minting client asks it with a
// SelfSubjectReview). The server chart's admission policy refuses a record
// whose annotation is not its creator's user name, so the token.mint audit
// record's subject is the apiserver's word, not the client's.
const MintedByAnnotation = "relaymesh.io/minted-by"

// KubeTokenStore keeps token records as Secrets in the management cluster.
// Consume is a delete with UID and resourceVersion preconditions, so of two
// racing redemptions exactly one deletes the Secret.
type KubeTokenStore struct {
	client    kubernetes.Interface
	namespace string
	// MintedBy, if set, is written into the records it creates
	// (MintedByAnnotation).
	MintedBy string
	// cache, once WatchCache synced, serves Get without an API call.
	cache corelisters.SecretNamespaceLister
}

// NewKubeTokenStore returns a store in namespace.
func NewKubeTokenStore(client kubernetes.Interface, namespace string) (*KubeTokenStore, error) {
	if client == nil || namespace == "" {
		return nil, errors.New("kube token store: client and namespace are required")
	}
	return &KubeTokenStore{client: client, namespace: namespace}, nil
}

func secretName(id string) string { return tokenSecretPrefix + id }

// TokenSecretName is the Secret that holds the record of token id in the
// management cluster.
func TokenSecretName(id string) string { return secretName(id) }

// Create implements TokenStore.
func (s *KubeTokenStore) Create(ctx context.Context, rec TokenRecord) error {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      secretName(rec.ID),
			Namespace: s.namespace,
			Labels: map[string]string{
				labelToken:                     "true",
				labelCluster:                   rec.Cluster,
				"app.kubernetes.io/managed-by": "relaymesh",
			},
		},
		Type: TokenSecretType,
		Data: map[string][]byte{
			keyCluster:    []byte(rec.Cluster),
			keySecretHash: []byte(hex.EncodeToString(rec.SecretHash[:])),
			keyExpiresAt:  []byte(rec.ExpiresAt.UTC().Format(time.RFC3339)),
		},
	}
	if s.MintedBy != "" {
		sec.Annotations = map[string]string{MintedByAnnotation: s.MintedBy}
	}
	_, err := s.client.CoreV1().Secrets(s.namespace).Create(ctx, sec, metav1.CreateOptions{})
	return err
}

// WatchCache makes Get read token records from a watch of the token
// Secrets, so redeeming a token costs one API call (the conditional delete
// of Consume) instead of two; a record the watch has not seen yet (minted a
// moment ago) is read from the API. It returns once the watch has synced,
// and watches until ctx ends. Single use does not depend on the cache:
// Consume is still a delete with the record's UID as precondition, so of
// racing redemptions — on this server or another replica — exactly one wins,
// and a record the cache still shows after it was consumed fails there.
func (s *KubeTokenStore) WatchCache(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, 10*time.Minute,
		informers.WithNamespace(s.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = labelToken + "=true" }))
	secrets := factory.Core().V1().Secrets()
	inf := secrets.Informer()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("token watch did not sync: %w", ctx.Err())
	}
	s.cache = secrets.Lister().Secrets(s.namespace)
	return nil
}

// Get implements TokenStore.
func (s *KubeTokenStore) Get(ctx context.Context, id string) (TokenRecord, error) {
	var sec *corev1.Secret
	var err error
	if s.cache != nil {
		sec, err = s.cache.Get(secretName(id))
	}
	if s.cache == nil || err != nil {
		sec, err = s.client.CoreV1().Secrets(s.namespace).Get(ctx, secretName(id), metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return TokenRecord{}, ErrTokenNotFound
	}
	if err != nil {
		return TokenRecord{}, err
	}
	if sec.Type != TokenSecretType {
		return TokenRecord{}, fmt.Errorf("secret %s is not a bootstrap token", sec.Name)
	}
	rec := TokenRecord{ID: id, Cluster: string(sec.Data[keyCluster]), Version: string(sec.UID) + "/" + sec.ResourceVersion}
	h, err := hex.DecodeString(string(sec.Data[keySecretHash]))
	if err != nil || len(h) != len(rec.SecretHash) {
		return TokenRecord{}, fmt.Errorf("secret %s: malformed %s", sec.Name, keySecretHash)
	}
	copy(rec.SecretHash[:], h)
	rec.ExpiresAt, err = time.Parse(time.RFC3339, string(sec.Data[keyExpiresAt]))
	if err != nil {
		return TokenRecord{}, fmt.Errorf("secret %s: malformed %s", sec.Name, keyExpiresAt)
	}
	return rec, nil
}

// Consume implements TokenStore: delete the record that was read, and only
// it (UID precondition). A delete is atomic, so of racing consumers exactly
// one succeeds; the others get NotFound. The resourceVersion is not a
// precondition: metadata-only updates (such as the audit annotation) must
// not make a valid redemption fail.
func (s *KubeTokenStore) Consume(ctx context.Context, rec TokenRecord) error {
	uid, _, ok := strings.Cut(rec.Version, "/")
	if !ok || uid == "" {
		return errors.New("token record has no version")
	}
	return s.client.CoreV1().Secrets(s.namespace).Delete(ctx, secretName(rec.ID), metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: new(types.UID(uid))},
	})
}

// DeleteCluster implements TokenStore.
func (s *KubeTokenStore) DeleteCluster(ctx context.Context, cluster string) error {
	sel := labels.SelectorFromSet(labels.Set{labelToken: "true", labelCluster: cluster}).String()
	return s.client.CoreV1().Secrets(s.namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
}
