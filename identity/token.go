package identity

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"
)

// Token shape: "<id>.<secret>" where id is 16 lowercase hex characters (8
// random bytes, not secret, used to find the stored hash) and secret is 43
// base64url characters (32 random bytes, 256 bits).
const (
	tokenIDBytes     = 8
	tokenSecretBytes = 32
	tokenIDLen       = 2 * tokenIDBytes
	tokenSecretLen   = 43 // base64.RawURLEncoding of 32 bytes
	// TokenLen is the exact length of a token string.
	TokenLen = tokenIDLen + 1 + tokenSecretLen

	// DefaultTokenTTL is how long a minted token stays valid.
	DefaultTokenTTL = time.Hour
	// MaxTokenTTL bounds --ttl: a bootstrap token is for the next deploy, not for good.
	MaxTokenTTL = 7 * 24 * time.Hour
)

// ErrBootstrapDenied is the one error a caller of Redeem sees, whatever went
// wrong: unknown, used, expired, malformed or wrong-cluster tokens are
// indistinguishable to the peer. The reason is in DenialError for logs.
var ErrBootstrapDenied = errors.New("bootstrap denied")

// Denial reasons, for logs and the bootstrap failure metric. They never
// contain any part of a token.
const (
	ReasonMalformed    = "malformed"
	ReasonUnknown      = "unknown"
	ReasonWrongSecret  = "wrong_secret"
	ReasonWrongCluster = "wrong_cluster"
	ReasonExpired      = "expired"
	ReasonUsed         = "already_used"
	ReasonStore        = "store_error"
)

// DenialError says why a token was refused. It matches ErrBootstrapDenied
// with errors.Is; its message holds the reason but never the token.
type DenialError struct {
	Reason  string
	TokenID string // the public half, or "" if the token was malformed
}

func (e *DenialError) Error() string {
	if e.TokenID == "" {
		return "bootstrap denied: " + e.Reason
	}
	return fmt.Sprintf("bootstrap denied: %s (token id %s)", e.Reason, e.TokenID)
}

// Is makes errors.Is(err, ErrBootstrapDenied) true.
func (e *DenialError) Is(target error) bool { return target == ErrBootstrapDenied }

func deny(reason, id string) error { return &DenialError{Reason: reason, TokenID: id} }

// ParsedToken is a syntactically valid token split into its halves.
type ParsedToken struct {
	ID     string
	secret []byte
}

// ParseToken checks a token's exact shape. It never echoes the input in its
// error, since a malformed token may still be a secret.
func ParseToken(s string) (ParsedToken, error) {
	if len(s) != TokenLen || s[tokenIDLen] != '.' {
		return ParsedToken{}, errors.New("token is malformed: want <16 hex>.<43 base64url>")
	}
	id := s[:tokenIDLen]
	if _, err := hex.DecodeString(id); err != nil || id != lowerHex(id) {
		return ParsedToken{}, errors.New("token is malformed: id is not lowercase hex")
	}
	secret, err := base64.RawURLEncoding.Strict().DecodeString(s[tokenIDLen+1:])
	if err != nil || len(secret) != tokenSecretBytes {
		return ParsedToken{}, errors.New("token is malformed: secret is not 32 bytes of base64url")
	}
	return ParsedToken{ID: id, secret: secret}, nil
}

// SecretDigest is the SHA-256 of the token's secret: what a record keeps,
// and what a server may keep to recognise the same token again.
func (p ParsedToken) SecretDigest() [sha256.Size]byte { return sha256.Sum256(p.secret) }

func lowerHex(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'F' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}

// TokenRecord is what the management cluster keeps of a token: its public
// id, the cluster it is for, the SHA-256 of its secret, its expiry, and
// once redeemed who spent it.
type TokenRecord struct {
	ID         string
	Cluster    string
	SecretHash [sha256.Size]byte
	ExpiresAt  time.Time
	// Spent is set once the token was redeemed: it stays in the store for
	// RetryWindow, so that a retry by the same key reaches any replica.
	Spent *Spend
	// Version is the store's concurrency token (a resourceVersion); Spend
	// MUST only succeed for the version that was read.
	Version string
}

// Spend is who redeemed a token: the SHA-256 of the SubjectPublicKeyInfo
// of the CSR it came with, the registration (the KubernetesCluster's UID)
// it was redeemed for, and when. None of it is secret.
type Spend struct {
	Key          [sha256.Size]byte
	Registration string
	At           time.Time
}

// RetryWindow is how long a spent token stays redeemable by the key that
// spent it, on any replica: the call that spent it can fail after it is
// spent (the agent's deadline passed while the server was busy, the
// connection dropped before the answer), and its retry may reach another
// replica. Only the holder of the key can sign a CSR for it.
const RetryWindow = 15 * time.Minute

// maxSpendSkew is how far in the future a spend's time may be (the clocks
// of two replicas) before the record is treated as malformed, so a spend
// from the future cannot keep a token retryable past its window.
const maxSpendSkew = time.Minute

// retryableBy says whether by may redeem this spent token again at now.
func (sp *Spend) retryableBy(by Redeemer, now time.Time) bool {
	sameKey := subtle.ConstantTimeCompare(sp.Key[:], by.Key[:]) == 1
	return sameKey && sp.Registration == by.Registration &&
		now.Before(sp.At.Add(RetryWindow)) && !sp.At.After(now.Add(maxSpendSkew))
}

// Collectable says whether a spent token's record may go: its retry
// window is over, or its time is so far ahead that no retry is allowed.
func (sp *Spend) Collectable(now time.Time) bool {
	return !now.Before(sp.At.Add(RetryWindow)) || sp.At.After(now.Add(maxSpendSkew))
}

// ExpiredRetention is how long the record of a token that expired unspent
// stays: an agent presenting it meanwhile is refused as "expired" (which
// says: mint a new one), not as "unknown". Then the record goes, so
// tokens minted and never used (a registration abandoned, a token
// re-minted) do not pile up in the management cluster and in every
// replica's watch of them.
const ExpiredRetention = 24 * time.Hour

// Collectable says whether the record may go at now: a spent token's once
// its retry window is over (Spend.Collectable), an unspent one's
// ExpiredRetention after it expired.
func (r TokenRecord) Collectable(now time.Time) bool {
	if r.Spent != nil {
		return r.Spent.Collectable(now)
	}
	return !r.ExpiresAt.IsZero() && !now.Before(r.ExpiresAt.Add(ExpiredRetention))
}

// MaxRegistrationLen bounds a spend's registration (a UID is 36 bytes).
const MaxRegistrationLen = 128

// Validate refuses a spend no store may keep: one without a registration,
// or with an oversized one.
func (sp Spend) Validate() error {
	if sp.Registration == "" || len(sp.Registration) > MaxRegistrationLen {
		return fmt.Errorf("token spend: registration must be 1 to %d bytes", MaxRegistrationLen)
	}
	return nil
}

// TokenStore keeps token records.
//
// Implementations MUST store only what TokenRecord holds (never a secret)
// and MUST make Spend atomic: of any number of concurrent Spend calls for
// the same record version exactly one returns nil.
type TokenStore interface {
	// Create stores a new record; it MUST fail if the id exists.
	Create(ctx context.Context, rec TokenRecord) error
	// Get returns the record with this id, or an error wrapping
	// ErrTokenNotFound. It may read a cache that lags the store.
	Get(ctx context.Context, id string) (TokenRecord, error)
	// GetLatest is Get from the store itself, never from a cache.
	GetLatest(ctx context.Context, id string) (TokenRecord, error)
	// Spend marks exactly the record version that was read as spent by sp.
	// It fails wrapping ErrTokenChanged if the record changed since it was
	// read, and ErrTokenNotFound if it is gone.
	Spend(ctx context.Context, rec TokenRecord, sp Spend) error
	// Consume deletes the record that was read, spent or not (revocation,
	// and collection after the retry window).
	Consume(ctx context.Context, rec TokenRecord) error
	// DeleteCluster removes every record of a cluster (deregistration).
	DeleteCluster(ctx context.Context, cluster string) error
}

// ErrTokenChanged is returned by TokenStore.Spend when the record is no
// longer the version that was read.
var ErrTokenChanged = errors.New("token record changed since it was read")

// ErrTokenNotFound is returned by TokenStore.Get for an unknown id.
var ErrTokenNotFound = errors.New("token not found")

// Tokens mints and redeems bootstrap tokens.
type Tokens struct {
	store TokenStore
	now   func() time.Time
	rand  io.Reader
}

// TokensConfig configures Tokens.
type TokensConfig struct {
	Store TokenStore
	Clock func() time.Time // default time.Now
	Rand  io.Reader        // default crypto/rand.Reader
}

// NewTokens returns a token service over store.
func NewTokens(cfg TokensConfig) (*Tokens, error) {
	if cfg.Store == nil {
		return nil, errors.New("tokens: store is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	return &Tokens{store: cfg.Store, now: cfg.Clock, rand: cfg.Rand}, nil
}

// Mint creates a single-use token for cluster valid for ttl and returns it.
// The caller shows it once; only its hash is stored.
func (t *Tokens) Mint(ctx context.Context, cluster string, ttl time.Duration) (token string, rec TokenRecord, err error) {
	if err := ValidateClusterName(cluster); err != nil {
		return "", TokenRecord{}, err
	}
	if ttl <= 0 || ttl > MaxTokenTTL {
		return "", TokenRecord{}, fmt.Errorf("token ttl %s out of range (0, %s]", ttl, MaxTokenTTL)
	}
	buf := make([]byte, tokenIDBytes+tokenSecretBytes)
	if _, err := io.ReadFull(t.rand, buf); err != nil {
		return "", TokenRecord{}, fmt.Errorf("token randomness: %w", err)
	}
	id := hex.EncodeToString(buf[:tokenIDBytes])
	secret := buf[tokenIDBytes:]
	rec = TokenRecord{ID: id, Cluster: cluster, SecretHash: sha256.Sum256(secret), ExpiresAt: t.now().Add(ttl).UTC().Truncate(time.Second)}
	if err := t.store.Create(ctx, rec); err != nil {
		return "", TokenRecord{}, fmt.Errorf("store token %s: %w", id, err)
	}
	return id + "." + base64.RawURLEncoding.EncodeToString(secret), rec, nil
}

// Redeemer is who redeems a token: the SHA-256 of the SubjectPublicKeyInfo
// of the CSR it comes with, and the registration (the KubernetesCluster's
// UID) of the cluster it is for.
type Redeemer struct {
	Key          [sha256.Size]byte
	Registration string
}

// Redemption is a redeemed token: its record (Spent set) and whether this
// was a retry by the key that had spent it.
type Redemption struct {
	Record TokenRecord
	Retry  bool
}

// spendAttempts bounds how often Redeem re-reads a record that changed
// under it (an annotation written between its read and its spend).
const spendAttempts = 3

// Redeem checks token for cluster and spends it for by. Any failure is a
// *DenialError (errors.Is ErrBootstrapDenied). A token presented for
// another cluster, or with a wrong secret, is not spent: the rightful owner
// can still use it. A token spent earlier by the same key for the same
// registration, within RetryWindow, is redeemed again as a retry (the
// store, not this process, remembers it: any replica answers); any other
// redemption of a spent token is refused.
func (t *Tokens) Redeem(ctx context.Context, cluster, token string, by Redeemer) (Redemption, error) {
	p, err := ParseToken(token)
	if err != nil {
		return Redemption{}, deny(ReasonMalformed, "")
	}
	get, latest := t.store.Get, false
	for range spendAttempts {
		rec, err := get(ctx, p.ID)
		if err != nil {
			if errors.Is(err, ErrTokenNotFound) {
				return Redemption{}, deny(ReasonUnknown, p.ID)
			}
			return Redemption{}, deny(ReasonStore, p.ID)
		}
		sum := sha256.Sum256(p.secret)
		if subtle.ConstantTimeCompare(sum[:], rec.SecretHash[:]) != 1 {
			return Redemption{}, deny(ReasonWrongSecret, p.ID)
		}
		if rec.Cluster != cluster {
			return Redemption{}, deny(ReasonWrongCluster, p.ID)
		}
		now := t.now()
		if rec.Spent != nil {
			if !rec.Spent.retryableBy(by, now) {
				return Redemption{}, deny(ReasonUsed, p.ID)
			}
			if latest {
				return Redemption{Record: rec, Retry: true}, nil
			}
			// A cache may still show a record revoked or collected since:
			// a retry issues only on the store's own word.
			get, latest = t.store.GetLatest, true
			continue
		}
		if !now.Before(rec.ExpiresAt) {
			return Redemption{}, deny(ReasonExpired, p.ID)
		}
		sp := Spend{Key: by.Key, Registration: by.Registration, At: now.UTC().Truncate(time.Second)}
		err = t.store.Spend(ctx, rec, sp)
		switch {
		case err == nil:
			rec.Spent = &sp
			return Redemption{Record: rec}, nil
		case errors.Is(err, ErrTokenNotFound):
			return Redemption{}, deny(ReasonUsed, p.ID) // revoked or collected since it was read
		case !errors.Is(err, ErrTokenChanged):
			return Redemption{}, deny(ReasonStore, p.ID)
		}
		// Spent by a racing call, or only annotated: read it from the
		// store and decide again.
		get, latest = t.store.GetLatest, true
	}
	return Redemption{}, deny(ReasonStore, p.ID)
}

// SharedToken is the seed product's compatibility mode: one token shared by
// every agent (`relay-identity-token-secret`, key `token`) that must equal
// the management cluster's copy. It is weaker than per-cluster tokens: it is
// not single-use, not bound to a cluster, and one leak admits any registered
// cluster name. It is off unless the server is started with
// --allow-shared-token, which logs a warning.
type SharedToken struct{ hash [sha256.Size]byte }

// MinSharedTokenLen is the shortest shared token accepted (256 bits as hex
// or base64 is longer than this; the bound refuses trivial passwords).
const MinSharedTokenLen = 32

// NewSharedToken keeps only the hash of the shared token.
func NewSharedToken(token string) (*SharedToken, error) {
	if len(token) < MinSharedTokenLen {
		return nil, fmt.Errorf("shared token is %d bytes, at least %d required", len(token), MinSharedTokenLen)
	}
	return &SharedToken{hash: sha256.Sum256([]byte(token))}, nil
}

// Check compares in constant time.
func (s *SharedToken) Check(token string) error {
	sum := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(sum[:], s.hash[:]) != 1 {
		return deny(ReasonWrongSecret, "shared")
	}
	return nil
}
