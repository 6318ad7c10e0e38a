package localcluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// Management starts one local cluster, "mgmt" (etcd and a kube-apiserver
// with the Relaymesh and Istio CRDs), for the test, creates namespace ns in
// it (none if ns is "") and stops it when the test ends. It returns the
// cluster and a typed and a dynamic client of its admin. It is the one
// management-cluster set-up of the tests; under -short it skips the test.
func Management(t testing.TB, ns string) (*Cluster, kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	SkipIfShort(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	env, err := Start(ctx, Config{Dir: t.TempDir(), Clusters: []string{"mgmt"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the local cluster: %v", err)
		}
	})
	mgmt := env.Cluster("mgmt")
	cs, err := mgmt.Clientset()
	require.NoError(t, err)
	if ns != "" {
		_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	return mgmt, cs, dyn
}
