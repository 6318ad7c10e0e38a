package identity_test

import (
	"context"
	"testing"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAgentSecretsRefuseTheServersNamespace: an agent whose namespace is
// the relay server's (its relay-root-tls-secret holds the root key) reads
// no roots from it and writes none into it; its own namespace works.
func TestAgentSecretsRefuseTheServersNamespace(t *testing.T) {
	ctx := context.Background()
	_, cs, _ := localcluster.Management(t, "relaymesh")
	server := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: identity.RootSecret, Namespace: "relaymesh"},
		Data: map[string][]byte{identity.KeyCACert: []byte("server root"), corev1.TLSPrivateKeyKey: []byte("server key")}}
	_, err := cs.CoreV1().Secrets("relaymesh").Create(ctx, server, metav1.CreateOptions{})
	require.NoError(t, err)

	s, err := identity.NewKubeAgentSecrets(cs, "relaymesh")
	require.NoError(t, err)
	_, err = s.Roots(ctx)
	require.ErrorIs(t, err, identity.ErrServerNamespace)
	assert.ErrorContains(t, err, "--namespace relaymesh-agent")
	assert.NotContains(t, err.Error(), "server key")
	require.ErrorIs(t, s.SaveRoots(ctx, []byte("agent roots")), identity.ErrServerNamespace)
	got, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, identity.RootSecret, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, server.Data, got.Data, "the server's Secret is untouched")

	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-agent"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	own, err := identity.NewKubeAgentSecrets(cs, "relaymesh-agent")
	require.NoError(t, err)
	require.NoError(t, own.SaveRoots(ctx, []byte("agent roots")))
	roots, err := own.Roots(ctx)
	require.NoError(t, err)
	assert.Equal(t, "agent roots", string(roots))
}
