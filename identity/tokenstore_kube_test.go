package identity_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeTokenStore runs the token rules against a real kube-apiserver,
// where atomic consumption rests on delete preconditions.
func TestKubeTokenStore(t *testing.T) {
	ctx := context.Background()
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: t.TempDir(), Clusters: []string{"mgmt"}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	cs, err := env.Cluster("mgmt").Clientset()
	require.NoError(t, err)
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh"}}, metav1.CreateOptions{})
	require.NoError(t, err)
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
