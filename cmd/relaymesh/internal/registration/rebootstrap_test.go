package registration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRebootstrapRequestValidate(t *testing.T) {
	good := RebootstrapRequest{Cluster: "cluster-1", Namespace: "relaymesh", RemoteNamespace: "relaymesh", TokenTTL: time.Hour}
	require.NoError(t, good.Validate())
	for _, tc := range []struct {
		name string
		mod  func(*RebootstrapRequest)
		want []string
	}{
		{"bad cluster name", func(r *RebootstrapRequest) { r.Cluster = "Cluster_1" }, []string{"Cluster_1"}},
		{"path as cluster name", func(r *RebootstrapRequest) { r.Cluster = "../kube-system" }, []string{"not a DNS label"}},
		{"oversized cluster name", func(r *RebootstrapRequest) { r.Cluster = strings.Repeat("a", 64) }, []string{"not a DNS label"}},
		{"no namespace", func(r *RebootstrapRequest) { r.Namespace = "" }, []string{"namespaces must not be empty"}},
		{"no remote namespace", func(r *RebootstrapRequest) { r.RemoteNamespace = "" }, []string{"namespaces must not be empty"}},
		{"ttl zero", func(r *RebootstrapRequest) { r.TokenTTL = 0 }, []string{"--token-ttl 0s out of range"}},
		{"ttl too long", func(r *RebootstrapRequest) { r.TokenTTL = identity.MaxTokenTTL + time.Second }, []string{"out of range"}},
		{"every fault at once", func(r *RebootstrapRequest) { r.Cluster, r.Namespace, r.TokenTTL = "", "", -time.Second }, []string{"namespaces must not be empty", "--token-ttl -1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.mod(&r)
			err := r.Validate()
			require.Error(t, err)
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

// A re-bootstrap's bundle is the two Secrets (built as Register builds
// them) and no ConfigMap: the registration's settings stand.
func TestRebootstrapBundleHasOnlyTheSecrets(t *testing.T) {
	b := &Bundle{Cluster: "cluster-1", Namespace: "agents", Secrets: agentSecrets("agents", []byte("roots"), "tok")}
	var names []string
	for _, o := range b.Objects() {
		m, err := meta.Accessor(o)
		require.NoError(t, err)
		names = append(names, m.GetName())
	}
	assert.Equal(t, "agents,"+identity.RootSecret+","+identity.TokenSecret, strings.Join(names, ","))
	assert.Equal(t, []byte("roots"), b.Secrets[0].Data[identity.KeyCACert])
	assert.Equal(t, []byte("tok"), b.Secrets[1].Data[identity.KeyToken])
	for _, s := range b.Secrets {
		assert.Equal(t, "agents", s.Namespace)
		assert.Equal(t, "Secret", s.Kind)
		assert.Equal(t, "relaymesh", s.Labels["app.kubernetes.io/managed-by"])
	}
}

// A token minted but not delivered is revoked: it no longer redeems, and
// revoking one that is gone (redeemed, or revoked before) is no error.
// Other tokens of the cluster stay.
func TestRevokeTokenRemovesOnlyThatToken(t *testing.T) {
	ctx := context.Background()
	_, cs, _ := localcluster.Management(t, "relaymesh")
	token, rec, err := MintToken(ctx, cs, "relaymesh", "cluster-1", time.Hour)
	require.NoError(t, err)
	other, _, err := MintToken(ctx, cs, "relaymesh", "cluster-1", time.Hour)
	require.NoError(t, err)
	require.NoError(t, RevokeToken(ctx, cs, "relaymesh", rec.ID))
	_, err = cs.CoreV1().Secrets("relaymesh").Get(ctx, identity.TokenSecretName(rec.ID), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the token's record is gone: %v", err)
	store, err := identity.NewKubeTokenStore(cs, "relaymesh")
	require.NoError(t, err)
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
	require.NoError(t, err)
	by := identity.Redeemer{Key: [32]byte{1}, Registration: "registration-1"}
	_, err = tokens.Redeem(ctx, "cluster-1", token, by)
	assert.Error(t, err, "a revoked token does not redeem")
	require.NoError(t, RevokeToken(ctx, cs, "relaymesh", rec.ID), "revoked twice")
	require.NoError(t, RevokeToken(ctx, cs, "relaymesh", strings.Repeat("a", len(rec.ID))), "never minted")
	otherRec, err := tokens.Redeem(ctx, "cluster-1", other, by)
	require.NoError(t, err, "the cluster's other token still redeems")
	// Revoking a spent token deletes its record: not even the key that
	// spent it can redeem it again.
	require.NoError(t, RevokeToken(ctx, cs, "relaymesh", otherRec.Record.ID))
	_, err = tokens.Redeem(ctx, "cluster-1", other, by)
	assert.Error(t, err, "a revoked spent token does not redeem again")
}
