package identity_test

import (
	"context"
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
	"k8s.io/client-go/kubernetes"
)

// TestKubeTokenStore runs the token rules against a real kube-apiserver,
// where atomic consumption rests on delete preconditions.
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
		_, err = tokens.Redeem(ctx, "cluster-1", tok)
		require.NoError(t, err)
		_, err = cs.CoreV1().Secrets("relaymesh").Get(ctx, sec.Name, metav1.GetOptions{})
		assert.Error(t, err, "a redeemed token's record is gone")
		_, err = tokens.Redeem(ctx, "cluster-1", tok)
		assert.ErrorIs(t, err, identity.ErrBootstrapDenied, "reuse is refused")
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

	t.Run("wrong cluster and expired leave the record", func(t *testing.T) {
		tok, rec, err := tokens.Mint(ctx, "cluster-1", time.Hour)
		require.NoError(t, err)
		_, err = tokens.Redeem(ctx, "cluster-2", tok)
		require.ErrorIs(t, err, identity.ErrBootstrapDenied)
		_, err = store.Get(ctx, rec.ID)
		require.NoError(t, err)
		c.advance(2 * time.Hour)
		_, err = tokens.Redeem(ctx, "cluster-1", tok)
		require.ErrorIs(t, err, identity.ErrBootstrapDenied)
		_, err = store.Get(ctx, rec.ID)
		require.NoError(t, err)
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
// delete); single use holds across two "replicas" with their own caches,
// a reused token is refused while a cache still shows it, and a token minted
// after the cache synced is read from the API.
func TestKubeTokenStoreCached(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, admin, _ := localcluster.Management(t, "relaymesh")
	minter, err := identity.NewKubeTokenStore(admin, "relaymesh")
	require.NoError(t, err)
	mint, err := identity.NewTokens(identity.TokensConfig{Store: minter})
	require.NoError(t, err)

	var gets, deletes atomic.Int32
	replica := func() *identity.Tokens {
		cfg := mgmt.RESTConfig()
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return rtFunc(func(r *http.Request) (*http.Response, error) {
				if strings.Contains(r.URL.Path, "/secrets/relaymesh-bootstrap-token-") {
					switch r.Method {
					case http.MethodGet:
						gets.Add(1)
					case http.MethodDelete:
						deletes.Add(1)
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
		tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
		require.NoError(t, err)
		return tokens
	}
	a, b := replica(), replica()

	// Minted after the caches synced: read from the API once, then one delete.
	tok, _, err := mint.Mint(ctx, "cluster-1", time.Hour)
	require.NoError(t, err)
	_, err = a.Redeem(ctx, "cluster-1", tok)
	require.NoError(t, err)
	assert.LessOrEqual(t, gets.Load(), int32(1))
	assert.Equal(t, int32(1), deletes.Load())

	// Seen by the cache: a redemption is one delete and no read.
	tok, rec, err := mint.Mint(ctx, "cluster-1", time.Hour)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := admin.CoreV1().Secrets("relaymesh").Get(ctx, "relaymesh-bootstrap-token-"+rec.ID, metav1.GetOptions{})
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // the watch delivers it
	gets.Store(0)
	deletes.Store(0)
	_, err = a.Redeem(ctx, "cluster-1", tok)
	require.NoError(t, err)
	assert.Equal(t, int32(0), gets.Load(), "read from the cache")
	assert.Equal(t, int32(1), deletes.Load(), "one API call per bootstrap")
	// Reused at once, while b's cache may still hold the record: refused.
	_, err = b.Redeem(ctx, "cluster-1", tok)
	require.ErrorIs(t, err, identity.ErrBootstrapDenied)

	// Two replicas racing on one token, many rounds: exactly one wins.
	for range 20 {
		tok, _, err := mint.Mint(ctx, "cluster-1", time.Hour)
		require.NoError(t, err)
		var wins atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, r := range []*identity.Tokens{a, b, a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := r.Redeem(ctx, "cluster-1", tok); err == nil {
					wins.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, int32(1), wins.Load(), "exactly one of four racing redemptions on two replicas wins")
	}
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
