package identity

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeinformers"
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
	// A spent record (TokenRecord.Spent), kept for RetryWindow. Its hash
	// moves from secret-sha256 to spent-secret-sha256: a server of an
	// earlier release, which knows no spend, reads a spent record as
	// malformed and refuses the token (a rolling upgrade or a rollback
	// must not make a spent token fresh again).
	keySpentSecretHash   = "spent-secret-sha256"
	keySpentKey          = "spent-key-sha256"
	keySpentRegistration = "spent-registration"
	keySpentAt           = "spent-at"
)

// MintedByAnnotation on a token record names the user the management
// apiserver authenticated as the minter (the minting client asks it with a
// SelfSubjectReview). The server chart's admission policy refuses a record
// whose annotation is not its creator's user name, so the token.mint audit
// record's subject is the apiserver's word, not the client's.
const MintedByAnnotation = "relaymesh.io/minted-by"

// KubeTokenStore keeps token records as Secrets in the management cluster.
// Spend is a patch with the resourceVersion that was read as precondition,
// so of racing redemptions — on one server or several — exactly one marks
// the Secret spent; the others read it again and find it spent. A spent
// record stays until Collect deletes it after RetryWindow; a record that
// expired unspent, ExpiredRetention after its expiry.
type KubeTokenStore struct {
	client    kubernetes.Interface
	namespace string
	// MintedBy, if set, is written into the records it creates
	// (MintedByAnnotation).
	MintedBy string
	// cache, once WatchCache synced, serves Get without an API call;
	// records is the informer behind it.
	cache   corelisters.SecretNamespaceLister
	records cache.SharedIndexInformer
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
// Secrets, so redeeming a token costs one API call (the conditional patch
// of Spend) instead of two; a record the watch has not seen yet (minted a
// moment ago) is read from the API. It returns once the watch has synced,
// and watches until ctx ends. Single use does not depend on the cache:
// Spend's precondition is the resourceVersion that was read, so a record
// the cache shows unspent after it was spent fails there, and Redeem reads
// it from the API (GetLatest) and finds it spent.
func (s *KubeTokenStore) WatchCache(ctx context.Context) error {
	// Cached without managedFields, which nothing here reads (a third of
	// a record's memory; issue 31).
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, 10*time.Minute,
		informers.WithNamespace(s.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = labelToken + "=true" }),
		informers.WithTransform(kubeinformers.StripManagedFields))
	secrets := factory.Core().V1().Secrets()
	inf := secrets.Informer()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("token watch did not sync: %w", ctx.Err())
	}
	s.cache = secrets.Lister().Secrets(s.namespace)
	s.records = inf
	return nil
}

// Records is the watch of the token records WatchCache started (nil
// before): AuditTokenMints reads the same one, so the process caches
// each record once.
func (s *KubeTokenStore) Records() cache.SharedIndexInformer { return s.records }

// Get implements TokenStore: from the watch cache once WatchCache synced,
// from the API for a record the cache does not hold.
func (s *KubeTokenStore) Get(ctx context.Context, id string) (TokenRecord, error) {
	if s.cache != nil {
		if sec, err := s.cache.Get(secretName(id)); err == nil {
			return recordOf(sec, id)
		}
	}
	return s.GetLatest(ctx, id)
}

// GetLatest implements TokenStore.
func (s *KubeTokenStore) GetLatest(ctx context.Context, id string) (TokenRecord, error) {
	sec, err := s.client.CoreV1().Secrets(s.namespace).Get(ctx, secretName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return TokenRecord{}, ErrTokenNotFound
	}
	if err != nil {
		return TokenRecord{}, err
	}
	return recordOf(sec, id)
}

// recordOf reads a token record from its Secret; anything malformed is an
// error, never a record (a spend that cannot be read is not a fresh token).
func recordOf(sec *corev1.Secret, id string) (TokenRecord, error) {
	if sec.Type != TokenSecretType {
		return TokenRecord{}, fmt.Errorf("secret %s is not a bootstrap token", sec.Name)
	}
	rec := TokenRecord{ID: id, Cluster: string(sec.Data[keyCluster]), Version: string(sec.UID) + "/" + sec.ResourceVersion}
	var err error
	rec.ExpiresAt, err = time.Parse(time.RFC3339, string(sec.Data[keyExpiresAt]))
	if err != nil {
		return TokenRecord{}, fmt.Errorf("secret %s: malformed %s", sec.Name, keyExpiresAt)
	}
	_, hasHash := sec.Data[keySecretHash]
	_, hasSpentHash := sec.Data[keySpentSecretHash]
	_, hasKey := sec.Data[keySpentKey]
	_, hasReg := sec.Data[keySpentRegistration]
	_, hasAt := sec.Data[keySpentAt]
	if !hasSpentHash && !hasKey && !hasReg && !hasAt {
		if !decodeDigest(sec.Data[keySecretHash], &rec.SecretHash) {
			return TokenRecord{}, fmt.Errorf("secret %s: malformed %s", sec.Name, keySecretHash)
		}
		return rec, nil
	}
	// Spent: the hash is under spent-secret-sha256 only.
	if hasHash || !decodeDigest(sec.Data[keySpentSecretHash], &rec.SecretHash) {
		return TokenRecord{}, fmt.Errorf("secret %s: malformed %s", sec.Name, keySpentSecretHash)
	}
	sp := &Spend{Registration: string(sec.Data[keySpentRegistration])}
	if !decodeDigest(sec.Data[keySpentKey], &sp.Key) {
		return TokenRecord{}, fmt.Errorf("secret %s: malformed %s", sec.Name, keySpentKey)
	}
	if sp.At, err = time.Parse(time.RFC3339, string(sec.Data[keySpentAt])); err != nil {
		return TokenRecord{}, fmt.Errorf("secret %s: malformed %s", sec.Name, keySpentAt)
	}
	if sp.Validate() != nil {
		return TokenRecord{}, fmt.Errorf("secret %s: malformed %s", sec.Name, keySpentRegistration)
	}
	rec.Spent = sp
	return rec, nil
}

// decodeDigest reads a lowercase-hex SHA-256 into d.
func decodeDigest(b []byte, d *[sha256.Size]byte) bool {
	if len(b) != hex.EncodedLen(len(d)) || string(b) != lowerHex(string(b)) {
		return false
	}
	_, err := hex.Decode(d[:], b)
	return err == nil
}

// Spend implements TokenStore: a merge patch that adds the spend and moves
// the hash to spent-secret-sha256, with the resourceVersion that was read
// as its precondition (the apiserver refuses it with a conflict if the
// Secret changed since). The resourceVersion of a Secret created again
// under the same name differs too.
func (s *KubeTokenStore) Spend(ctx context.Context, rec TokenRecord, sp Spend) error {
	_, rv, ok := strings.Cut(rec.Version, "/")
	if !ok || rv == "" {
		return errors.New("token record has no version")
	}
	if err := sp.Validate(); err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": rv},
		"data": map[string]any{
			keySecretHash:        nil, // removed: see keySpentSecretHash
			keySpentSecretHash:   []byte(hex.EncodeToString(rec.SecretHash[:])),
			keySpentKey:          []byte(hex.EncodeToString(sp.Key[:])),
			keySpentRegistration: []byte(sp.Registration),
			keySpentAt:           []byte(sp.At.UTC().Format(time.RFC3339)),
		},
	})
	if err != nil {
		return err
	}
	_, err = s.client.CoreV1().Secrets(s.namespace).Patch(ctx, secretName(rec.ID), types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return ErrTokenNotFound
	case apierrors.IsConflict(err):
		return ErrTokenChanged
	}
	return err
}

// Consume implements TokenStore: delete the record that was read, and only
// it (UID precondition). The resourceVersion is not a precondition: the
// record may have been annotated or spent since, and revoking or collecting
// it must still delete it.
func (s *KubeTokenStore) Consume(ctx context.Context, rec TokenRecord) error {
	uid, _, ok := strings.Cut(rec.Version, "/")
	if !ok || uid == "" {
		return errors.New("token record has no version")
	}
	return s.client.CoreV1().Secrets(s.namespace).Delete(ctx, secretName(rec.ID), metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: new(types.UID(uid))},
	})
}

// Collect deletes the records that may go (TokenRecord.Collectable): of
// tokens spent more than RetryWindow before now, and of tokens that expired
// unspent more than ExpiredRetention before now. It returns how many it
// deleted. A record it cannot read is left (and named in the error). It
// reads the watch cache when there is one.
func (s *KubeTokenStore) Collect(ctx context.Context, now time.Time) (int, error) {
	var secs []*corev1.Secret
	if s.cache != nil {
		var err error
		if secs, err = s.cache.List(labels.SelectorFromSet(labels.Set{labelToken: "true"})); err != nil {
			return 0, err
		}
	} else {
		list, err := s.client.CoreV1().Secrets(s.namespace).List(ctx, metav1.ListOptions{LabelSelector: labelToken + "=true"})
		if err != nil {
			return 0, err
		}
		for i := range list.Items {
			secs = append(secs, &list.Items[i])
		}
	}
	n := 0
	var errs []error
	for _, sec := range secs {
		id, ok := strings.CutPrefix(sec.Name, tokenSecretPrefix)
		if !ok || sec.Type != TokenSecretType {
			continue
		}
		rec, err := recordOf(sec, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !rec.Collectable(now) {
			continue
		}
		switch err := s.Consume(ctx, rec); {
		case err == nil:
			n++
		case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err):
			errs = append(errs, fmt.Errorf("delete token record %s: %w", sec.Name, err))
		}
	}
	return n, errors.Join(errs...)
}

// DeleteCluster implements TokenStore.
func (s *KubeTokenStore) DeleteCluster(ctx context.Context, cluster string) error {
	sel := labels.SelectorFromSet(labels.Set{labelToken: "true", labelCluster: cluster}).String()
	return s.client.CoreV1().Secrets(s.namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
}
