package kubeclient

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// noAmbientConfig leaves the test without $KUBECONFIG, ~/.kube/config or
// an in-cluster service account.
func noAmbientConfig(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
}

func TestRESTConfigSaysWhichKubeconfigIsEmpty(t *testing.T) {
	noAmbientConfig(t)
	_, _, err := Source{}.RESTConfig()
	require.ErrorIs(t, err, ErrNoConfiguration)

	// A named file that holds nothing (a file being written, a wrong
	// path to an empty file) is named in the error, not sent to look for
	// $KUBECONFIG.
	empty := filepath.Join(t.TempDir(), "empty.kubeconfig")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, _, err = Source{Kubeconfig: empty}.RESTConfig()
	require.Error(t, err)
	require.Contains(t, err.Error(), empty)
	require.Contains(t, err.Error(), "is the file empty?")
	require.NotContains(t, err.Error(), "set KUBECONFIG")

	_, _, err = Source{Kubeconfig: filepath.Join(t.TempDir(), "missing")}.RESTConfig()
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrNoConfiguration)
}

func TestRESTConfigReadsTheNamedContext(t *testing.T) {
	noAmbientConfig(t)
	cfg := clientcmdapi.NewConfig()
	for _, name := range []string{"mgmt", "east"} {
		cfg.Clusters[name] = &clientcmdapi.Cluster{Server: "https://" + name + ".example:6443"}
		cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: "t"}
		cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	}
	cfg.CurrentContext = "mgmt"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))

	rc, name, err := Source{Kubeconfig: path}.RESTConfig()
	require.NoError(t, err)
	require.Equal(t, "mgmt", name)
	require.Equal(t, "https://mgmt.example:6443", rc.Host)
	require.Equal(t, float32(50), rc.QPS)
	require.Equal(t, 100, rc.Burst)

	rc, name, err = Source{Kubeconfig: path, Context: "east", QPS: 5, Burst: 7}.RESTConfig()
	require.NoError(t, err)
	require.Equal(t, "east", name)
	require.Equal(t, "https://east.example:6443", rc.Host)
	require.Equal(t, float32(5), rc.QPS)
	require.Equal(t, 7, rc.Burst)

	_, _, err = Source{Kubeconfig: path, Context: "west"}.RESTConfig()
	require.ErrorContains(t, err, "west")
	require.True(t, Source{Kubeconfig: path}.HasContext("east"))
	names, err := Source{Kubeconfig: path}.Contexts()
	require.NoError(t, err)
	require.Equal(t, []string{"east", "mgmt"}, names)
}
