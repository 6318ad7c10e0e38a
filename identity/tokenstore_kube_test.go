package identity_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// TestKubeTokenStore runs the token rules against a real kube-apiserver,
// where single use rests on the spend's resourceVersion precondition.
func TestKubeTokenStore(t *testing.T) {
	ctx := context.Background()
	_, cs, _ := localcluster.Management(t, "relaymesh")
	store, err := identity.NewKubeTokenStore(cs, "relaymesh")
	require.NoError(t, err)
	tokens, c := newTokens(t, store)
	c.t = time.Now()

	t.Run("only the hash is stored", func(t *testing.T) {
		tok, rec, err := tokens.Mint(ctx, "cluster-1", time.Hour)
		require.NoError(t, err)
		sec, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, "relaymesh-bootstrap-token-"+rec.ID, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, identity.TokenSecretType, sec.Type)
		assert.Equal(t, "cluster-1", sec.Labels["relaymesh.io/cluster"])
		assert.NotContains(t, sec.Annotations, identity.MintedByAnnotation, "no minter given, none claimed")
		for k, v := range sec.Data {
			assert.NotContains(t, string(v), tok[17:], "key %s holds the secret", k)
		}
		_, err = tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
		require.NoError(t, err)
		spent, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, sec.Name, metav1.GetOptions{})
		require.NoError(t, err, "a spent token's record stays for the retry window")
		assert.Equal(t, string(sec.Data["secret-sha256"]), string(spent.Data["spent-secret-sha256"]))
		assert.NotContains(t, spent.Data, "secret-sha256",
			"the hash moved: a server of an earlier release, which reads only secret-sha256, refuses a spent token")
		assert.Len(t, spent.Data["spent-key-sha256"], 64)
		assert.Equal(t, "registration-1", string(spent.Data["spent-registration"]))
		for k, v := range spent.Data {
			assert.NotContains(t, string(v), tok[17:], "key %s holds the secret", k)
		}
		_, err = tokens.Redeem(ctx, "cluster-1", tok, redeemer(2))
		assert.ErrorIs(t, err, identity.ErrBootstrapDenied, "reuse by another key is refused")
		r, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
		require.NoError(t, err, "the key that spent it may retry")
		assert.True(t, r.Retry)
	})

	t.Run("the minter is recorded", func(t *testing.T) {
		named, err := identity.NewKubeTokenStore(cs, "relaymesh")
		require.NoError(t, err)
		named.MintedBy = "alice@example.com"
		mint, _ := newTokens(t, named)
		_, rec, err := mint.Mint(ctx, "cluster-1", time.Hour)
		require.NoError(t, err)
		sec, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, "relaymesh-bootstrap-token-"+rec.ID, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "alice@example.com", sec.Annotations[identity.MintedByAnnotation])
	})

	t.Run("racing redemptions: exactly one wins", func(t *testing.T) {
		for range 10 {
			tok, _, err := tokens.Mint(ctx, "cluster-1", time.Hour)
			require.NoError(t, err)
			require.Equal(t, int32(1), raceRedeem(t, tokens, "cluster-1", tok, 8))
		}
	})

	t.Run("racing redemptions by one key: one spend, the others retries", func(t *testing.T) {
		tok, _, err := tokens.Mint(ctx, "cluster-1", time.Hour)
		require.NoError(t, err)
		var spends, retries atomic.Int32
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() {
				r, err := tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
				if !assert.NoError(t, err) {
					return
				}
				if r.Retry {
					retries.Add(1)
				} else {
					spends.Add(1)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int32(1), spends.Load())
		assert.Equal(t, int32(5), retries.Load())
	})

	t.Run("wrong cluster and expired leave the record", func(t *testing.T) {
		tok, rec, err := tokens.Mint(ctx, "cluster-1", time.Hour)
		require.NoError(t, err)
		_, err = tokens.Redeem(ctx, "cluster-2", tok, redeemer(1))
		require.ErrorIs(t, err, identity.ErrBootstrapDenied)
		got, err := store.Get(ctx, rec.ID)
		require.NoError(t, err)
		assert.Nil(t, got.Spent)
		c.advance(2 * time.Hour)
		_, err = tokens.Redeem(ctx, "cluster-1", tok, redeemer(1))
		require.ErrorIs(t, err, identity.ErrBootstrapDenied)
		got, err = store.Get(ctx, rec.ID)
		require.NoError(t, err)
		assert.Nil(t, got.Spent)
		c.t = time.Now()
	})

	t.Run("deregistration deletes a cluster's tokens", func(t *testing.T) {
		_, r1, err := tokens.Mint(ctx, "cluster-3", time.Hour)
		require.NoError(t, err)
		_, r2, err := tokens.Mint(ctx, "cluster-4", time.Hour)
		require.NoError(t, err)
		require.NoError(t, store.DeleteCluster(ctx, "cluster-3"))
		_, err = store.Get(ctx, r1.ID)
		assert.ErrorIs(t, err, identity.ErrTokenNotFound)
		_, err = store.Get(ctx, r2.ID)
		assert.NoError(t, err)
	})

	t.Run("spent records are collected after the retry window", func(t *testing.T) {
		old, oldRec, err := tokens.Mint(ctx, "cluster-5", 3*time.Hour)
		require.NoError(t, err)
		_, err = tokens.Redeem(ctx, "cluster-5", old, redeemer(1))
		require.NoError(t, err)
		c.advance(identity.RetryWindow - time.Second)
		fresh, freshRec, err := tokens.Mint(ctx, "cluster-5", 3*time.Hour)
		require.NoError(t, err)
		_, err = tokens.Redeem(ctx, "cluster-5", fresh, redeemer(1))
		require.NoError(t, err)
		_, unspentRec, err := tokens.Mint(ctx, "cluster-5", 3*time.Hour)
		require.NoError(t, err)
		n, err := store.Collect(ctx, c.now().Add(time.Second))
		require.NoError(t, err)
		assert.GreaterOrEqual(t, n, 1, "this one and those the subtests above spent")
		_, err = store.Get(ctx, oldRec.ID)
		assert.ErrorIs(t, err, identity.ErrTokenNotFound, "spent a window ago")
		_, err = store.Get(ctx, freshRec.ID)
		assert.NoError(t, err, "spent a second ago: still retryable")
		_, err = store.Get(ctx, unspentRec.ID)
		assert.NoError(t, err, "never spent")
		c.t = time.Now()
	})

	t.Run("records that expired unspent are collected after their retention", func(t *testing.T) {
		t.Cleanup(func() { c.t = time.Now() })
		start := c.now()
		old, oldRec, err := tokens.Mint(ctx, "cluster-7", time.Hour)
		require.NoError(t, err)
		_, longRec, err := tokens.Mint(ctx, "cluster-7", 48*time.Hour)
		require.NoError(t, err)
		c.advance(2 * time.Hour)
		recent, recentRec, err := tokens.Mint(ctx, "cluster-7", time.Hour)
		require.NoError(t, err)
		c.advance(time.Hour)
		_, err = tokens.Redeem(ctx, "cluster-7", recent, redeemer(1))
		var denial *identity.DenialError
		require.ErrorAs(t, err, &denial)
		assert.Equal(t, identity.ReasonExpired, denial.Reason, "expired, not yet collected: said so")

		now := start.Add(time.Hour + identity.ExpiredRetention)
		assert.False(t, oldRec.Collectable(now.Add(-time.Second)), "within its retention")
		n, err := store.Collect(ctx, now)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, n, 1)
		_, err = store.Get(ctx, oldRec.ID)
		assert.ErrorIs(t, err, identity.ErrTokenNotFound, "expired a retention ago")
		_, err = store.Get(ctx, recentRec.ID)
		assert.NoError(t, err, "expired two hours later: kept")
		_, err = store.Get(ctx, longRec.ID)
		assert.NoError(t, err, "not expired")
		_, err = tokens.Redeem(ctx, "cluster-7", old, redeemer(1))
		require.ErrorAs(t, err, &denial)
		assert.Equal(t, identity.ReasonUnknown, denial.Reason, "a collected token is one the store does not know")
	})

	t.Run("a malformed or hostile spend is not a fresh token", func(t *testing.T) {
		good := func() map[string][]byte {
			// A well-formed spend (hash moved: "HASH" is the record's),
			// which each case breaks in one way.
			return map[string][]byte{"secret-sha256": nil, "spent-secret-sha256": []byte("HASH"), "spent-key-sha256": []byte(strings.Repeat("ab", 32)),
				"spent-registration": []byte("r"), "spent-at": []byte("2026-12-05T10:00:00Z")}
		}
		with := func(k string, v []byte) map[string][]byte { d := good(); d[k] = v; return d }
		without := func(k string) map[string][]byte { d := good(); delete(d, k); return d }
		for name, data := range map[string]map[string][]byte{
			"key not hex":           with("spent-key-sha256", []byte(strings.Repeat("zz", 32))),
			"key short":             with("spent-key-sha256", []byte("abcd")),
			"key uppercase":         with("spent-key-sha256", []byte(strings.Repeat("AB", 32))),
			"no time":               without("spent-at"),
			"bad time":              with("spent-at", []byte("yesterday")),
			"no registration":       without("spent-registration"),
			"huge registration":     with("spent-registration", []byte(strings.Repeat("r", 4096))),
			"only a registration":   {"secret-sha256": nil, "spent-secret-sha256": []byte("HASH"), "spent-registration": []byte("r")},
			"spend beside the hash": without("secret-sha256"), // the null that removes it is gone: kept
			"spent hash not hex":    with("spent-secret-sha256", []byte(strings.Repeat("zz", 32))),
			"spent hash, no spend":  {"secret-sha256": nil, "spent-secret-sha256": []byte("HASH")},
			"spend, no spent hash":  without("spent-secret-sha256"),
			"no hash at all":        {"secret-sha256": nil},
		} {
			tok, rec, err := tokens.Mint(ctx, "cluster-6", time.Hour)
			require.NoError(t, err)
			if string(data["spent-secret-sha256"]) == "HASH" {
				data["spent-secret-sha256"] = []byte(hex.EncodeToString(rec.SecretHash[:]))
			}
			patchData(t, cs, rec.ID, data)
			_, err = store.Get(ctx, rec.ID)
			require.Error(t, err, name)
			assert.NotContains(t, err.Error(), tok[17:])
			_, err = tokens.Redeem(ctx, "cluster-6", tok, redeemer(1))
			var d *identity.DenialError
			require.ErrorAs(t, err, &d, name)
			assert.Equal(t, identity.ReasonStore, d.Reason, name)
		}
		// A spend dated in the future does not keep the token retryable.
		by := redeemer(1)
		tok, rec, err := tokens.Mint(ctx, "cluster-6", time.Hour)
		require.NoError(t, err)
		patchData(t, cs, rec.ID, map[string][]byte{
			"secret-sha256":       nil,
			"spent-secret-sha256": []byte(hex.EncodeToString(rec.SecretHash[:])),
			"spent-key-sha256":    []byte(hex.EncodeToString(by.Key[:])),
			"spent-registration":  []byte(by.Registration),
			"spent-at":            []byte(c.now().Add(24 * time.Hour).UTC().Format(time.RFC3339)),
		})
		_, err = tokens.Redeem(ctx, "cluster-6", tok, by)
		var d *identity.DenialError
		require.ErrorAs(t, err, &d)
		assert.Equal(t, identity.ReasonUsed, d.Reason)
	})

	t.Run("a foreign secret with a token name is refused", func(t *testing.T) {
		_, err := cs.CoreV1().Secrets("relaymesh").Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-bootstrap-token-00000000000000ff", Namespace: "relaymesh"},
			Data:       map[string][]byte{"cluster": []byte("cluster-1")},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = store.Get(ctx, "00000000000000ff")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not a bootstrap token")
	})
}

// With the watch cache, a redemption is one API call (the conditional
// patch); single use holds across two "replicas" with their own caches, a
// token reused by another key is refused while a cache still shows it
// unspent, the key that spent it is answered by the other replica, and a
// token minted after the cache synced is read from the API.
func TestKubeTokenStoreCached(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, admin, _ := localcluster.Management(t, "relaymesh")
	minter, err := identity.NewKubeTokenStore(admin, "relaymesh")
	require.NoError(t, err)
	mint, err := identity.NewTokens(identity.TokensConfig{Store: minter})
	require.NoError(t, err)

	var gets, patches atomic.Int32
	var stores []*identity.KubeTokenStore
	replica := func() *identity.Tokens {
		cfg := mgmt.RESTConfig()
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return rtFunc(func(r *http.Request) (*http.Response, error) {
				if strings.Contains(r.URL.Path, "/secrets/relaymesh-bootstrap-token-") {
					switch r.Method {
					case http.MethodGet:
						gets.Add(1)
					case http.MethodPatch:
						patches.Add(1)
					}
				}
				return rt.RoundTrip(r)
			})
		}
		cs, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		store, err := identity.NewKubeTokenStore(cs, "relaymesh")
		require.NoError(t, err)
		require.NoError(t, store.WatchCache(ctx))
		stores = append(stores, store)
		tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
		require.NoError(t, err)
		return tokens
	}
	a, b := replica(), replica()

	// Minted after the caches synced: read from the API once, then one patch.
	tok, _, err := mint.Mint(ctx, "cluster-1", time.Hour)
	require.NoError(t, err)
	_, err = a.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.NoError(t, err)
	assert.LessOrEqual(t, gets.Load(), int32(1))
	assert.Equal(t, int32(1), patches.Load())

	// Seen by the cache: a redemption is one patch and no read.
	tok, rec, err := mint.Mint(ctx, "cluster-1", time.Hour)
	require.NoError(t, err)
	// Once both replicas' watches delivered it (polled, not slept for: on
	// a loaded machine the event may take longer than any fixed pause).
	require.Eventually(t, func() bool {
		for _, st := range stores {
			if _, ok, err := st.Records().GetStore().GetByKey("relaymesh/relaymesh-bootstrap-token-" + rec.ID); err != nil || !ok {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
	gets.Store(0)
	patches.Store(0)
	_, err = a.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.NoError(t, err)
	assert.Equal(t, int32(0), gets.Load(), "read from the cache")
	assert.Equal(t, int32(1), patches.Load(), "one API call per bootstrap")
	// Reused at once by another key, while b's cache may still show the
	// record unspent: refused.
	_, err = b.Redeem(ctx, "cluster-1", tok, redeemer(2))
	require.ErrorIs(t, err, identity.ErrBootstrapDenied)
	// The key that spent it, on the other replica: a retry.
	r, err := b.Redeem(ctx, "cluster-1", tok, redeemer(1))
	require.NoError(t, err)
	assert.True(t, r.Retry)

	// Two replicas racing on one token, many rounds: exactly one wins.
	for range 20 {
		tok, _, err := mint.Mint(ctx, "cluster-1", time.Hour)
		require.NoError(t, err)
		var wins atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, r := range []*identity.Tokens{a, b, a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := r.Redeem(ctx, "cluster-1", tok, redeemer(i)); err == nil {
					wins.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, int32(1), wins.Load(), "exactly one of four racing redemptions on two replicas wins")
	}
}

// patchData merges data into token id's record, as someone with write
// access to the server's namespace could.
func patchData(t *testing.T, cs kubernetes.Interface, id string, data map[string][]byte) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"data": data})
	require.NoError(t, err)
	_, err = cs.CoreV1().Secrets("relaymesh").Patch(context.Background(), identity.TokenSecretName(id), types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
