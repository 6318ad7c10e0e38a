package kubeclient

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/flowcontrol"
)

// noAmbientConfig leaves the test without $KUBECONFIG, ~/.kube/config or
// an in-cluster service account.
func noAmbientConfig(t *testing.T) {
	// A $KUBECONFIG naming a missing file: client-go skips it and then
	// does not read ~/.kube/config (whose path it fixed at start, so
	// $HOME cannot hide it).
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
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
	require.Contains(t, err.Error(), "selects no cluster")
	require.NotContains(t, err.Error(), "set KUBECONFIG")

	// Clusters and contexts, but no current context: the same error,
	// which says so among its causes.
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["east"] = &clientcmdapi.Cluster{Server: "https://east.example:6443"}
	cfg.AuthInfos["east"] = &clientcmdapi.AuthInfo{Token: "t"}
	cfg.Contexts["east"] = &clientcmdapi.Context{Cluster: "east", AuthInfo: "east"}
	noCurrent := filepath.Join(t.TempDir(), "no-current.kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, noCurrent))
	_, _, err = Source{Kubeconfig: noCurrent}.RESTConfig()
	require.ErrorContains(t, err, noCurrent)
	require.ErrorContains(t, err, "has no current context")
	_, name, err := Source{Kubeconfig: noCurrent, Context: "east"}.RESTConfig()
	require.NoError(t, err)
	require.Equal(t, "east", name)

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

// A copy with a budget of its own: its own limiter and rate, the
// original untouched; qps 0 keeps the original's rate.
func TestOwnBudget(t *testing.T) {
	shared := flowcontrol.NewTokenBucketRateLimiter(50, 100)
	cfg := &rest.Config{Host: "https://127.0.0.1:6443", QPS: 50, Burst: 100, RateLimiter: shared}
	own := OwnBudget(cfg, 5, 10)
	require.Nil(t, own.RateLimiter, "the copy's clients make a limiter of their own")
	require.Equal(t, float32(5), own.QPS)
	require.Equal(t, 10, own.Burst)
	require.Equal(t, cfg.Host, own.Host)
	require.Same(t, shared, cfg.RateLimiter, "cfg is not changed")
	require.Equal(t, float32(50), cfg.QPS)
	same := OwnBudget(cfg, 0, 0)
	require.Nil(t, same.RateLimiter)
	require.Equal(t, float32(50), same.QPS)
	require.Equal(t, 100, same.Burst)
}
