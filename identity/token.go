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
// id, the cluster it is for, the SHA-256 of its secret, and its expiry.
type TokenRecord struct {
	ID         string
	Cluster    string
	SecretHash [sha256.Size]byte
	ExpiresAt  time.Time
	// Version is the store's concurrency token (a resourceVersion); Consume
	// MUST only succeed for the version that was read.
	Version string
}

// TokenStore keeps token records.
//
// Implementations MUST store only what TokenRecord holds (never a secret),
// MUST make Consume atomic: of any number of concurrent Consume calls for the
// same record exactly one returns nil, and MUST NOT return a record after a
// successful Consume.
type TokenStore interface {
	// Create stores a new record; it MUST fail if the id exists.
	Create(ctx context.Context, rec TokenRecord) error
	// Get returns the record with this id, or an error wrapping ErrTokenNotFound.
	Get(ctx context.Context, id string) (TokenRecord, error)
	// Consume deletes exactly the record version that was read.
	Consume(ctx context.Context, rec TokenRecord) error
	// DeleteCluster removes every record of a cluster (deregistration).
	DeleteCluster(ctx context.Context, cluster string) error
}

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

// Redeem checks token for cluster and consumes it. Any failure is a
// *DenialError (errors.Is ErrBootstrapDenied). A token presented for another
// cluster, or with a wrong secret, is not consumed: the rightful owner can
// still use it.
func (t *Tokens) Redeem(ctx context.Context, cluster, token string) (TokenRecord, error) {
	p, err := ParseToken(token)
	if err != nil {
		return TokenRecord{}, deny(ReasonMalformed, "")
	}
	rec, err := t.store.Get(ctx, p.ID)
	if err != nil {
		if errors.Is(err, ErrTokenNotFound) {
			return TokenRecord{}, deny(ReasonUnknown, p.ID)
		}
		return TokenRecord{}, deny(ReasonStore, p.ID)
	}
	sum := sha256.Sum256(p.secret)
	if subtle.ConstantTimeCompare(sum[:], rec.SecretHash[:]) != 1 {
		return TokenRecord{}, deny(ReasonWrongSecret, p.ID)
	}
	if rec.Cluster != cluster {
		return TokenRecord{}, deny(ReasonWrongCluster, p.ID)
	}
	if !t.now().Before(rec.ExpiresAt) {
		return TokenRecord{}, deny(ReasonExpired, p.ID)
	}
	if err := t.store.Consume(ctx, rec); err != nil {
		return TokenRecord{}, deny(ReasonUsed, p.ID)
	}
	return rec, nil
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
