package check

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

// remoteSecretManifest is what `istioctl create-remote-secret` writes into
// a cluster (its kubeconfig holding a token), beside a Secret that is not
// one.
const remoteSecretManifest = `
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Secret
metadata:
  name: istio-remote-secret-cluster-2
  namespace: istio-system
  labels: {istio/multiCluster: "true"}
  annotations: {networking.istio.io/cluster: cluster-2}
stringData:
  cluster-2: |
    apiVersion: v1
    kind: Config
    clusters: [{name: cluster-2, cluster: {server: "https://127.0.0.9:6443"}}]
    users: [{name: cluster-2, user: {token: remote-secret-token-must-not-leak}}]
    contexts: [{name: cluster-2, context: {cluster: cluster-2, user: cluster-2}}]
    current-context: cluster-2
---
apiVersion: v1
kind: Secret
metadata: {name: cacerts, namespace: istio-system}
stringData: {ca-key.pem: not-a-remote-secret}
`

// The remote secrets of a real apiserver are found by Istio's label, in
// metadata only (no kubeconfig crosses the wire, so none can end up in a
// report), and a client that may not list Secrets gets an error that says
// what was not checked.
func TestGatherRemoteSecretsFromAPIServer(t *testing.T) {
	ctx := context.Background()
	c, _, _ := localcluster.Management(t, "")
	clients, err := kubeclient.NewClients(c.RESTConfig(), "w")
	require.NoError(t, err)
	_, err = c.Apply(ctx, "relaymesh-test", []byte(remoteSecretManifest))
	require.NoError(t, err)

	got, err := gatherRemoteSecrets(ctx, clients)
	require.NoError(t, err)
	assert.Equal(t, []RemoteSecret{{Namespace: "istio-system", Name: "istio-remote-secret-cluster-2", Cluster: "cluster-2"}}, got)
	o := &Observations{Workloads: []Workload{{Context: "w", Cluster: "cluster-1", RemoteSecrets: got}}, VirtualMeshes: nil}
	o.VirtualMeshes = append(o.VirtualMeshes, federatedVM("cluster-1", "cluster-2"))
	rs := evalMulticluster(o)
	require.Len(t, rs, 1)
	assert.Equal(t, Error, rs[0].Severity)
	report, err := json.Marshal(NewReport(now, rs))
	require.NoError(t, err)
	assert.NotContains(t, string(report), "remote-secret-token-must-not-leak")

	cfg := rest.CopyConfig(c.RESTConfig())
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "reader-without-secrets"}
	denied, err := kubeclient.NewClients(cfg, "w")
	require.NoError(t, err)
	_, err = gatherRemoteSecrets(ctx, denied)
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Contains(t, err.Error(), "list Secrets labelled istio/multiCluster=true")
}
