package server_test

import (
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const kubeconfigTmpl = `apiVersion: v1
kind: Config
current-context: c
contexts:
- name: c
  context: {cluster: c, user: u}
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    CLUSTER
users:
- name: u
  user:
    USER
`

func kubeconfig(cluster, user string) []byte {
	return []byte(strings.NewReplacer("CLUSTER", cluster, "USER", user).Replace(kubeconfigTmpl))
}

func TestParseKubeconfig(t *testing.T) {
	good := kubeconfig("certificate-authority-data: Zm9v", "token: abc")
	cfg, err := server.ParseKubeconfig(good)
	require.NoError(t, err)
	assert.Equal(t, "https://127.0.0.1:6443", cfg.Host)

	for name, tt := range map[string]struct {
		raw  []byte
		want string
	}{
		"exec plugin":      {kubeconfig("certificate-authority-data: Zm9v", "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'id > /tmp/pwned']}"), "exec credential plugins are refused"},
		"auth provider":    {kubeconfig("certificate-authority-data: Zm9v", "auth-provider: {name: gcp}"), "auth providers are refused"},
		"client cert file": {kubeconfig("certificate-authority-data: Zm9v", "client-certificate: /etc/relaymesh/tls.crt"), "file references are refused"},
		"token file":       {kubeconfig("certificate-authority-data: Zm9v", "tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"), "file references are refused"},
		"CA file":          {kubeconfig("certificate-authority: /etc/ssl/ca.pem", "token: abc"), "file references are refused"},
		"insecure":         {kubeconfig("insecure-skip-tls-verify: true", "token: abc"), "insecure-skip-tls-verify is refused"},
		"garbage":          {[]byte("{{{"), "kubeconfig"},
		"no context":       {[]byte("apiVersion: v1\nkind: Config\ncurrent-context: nope\n"), "current context"},
		"oversized":        {[]byte(strings.Repeat("#", 2<<20)), "at most 1 MiB"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := server.ParseKubeconfig(tt.raw)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
