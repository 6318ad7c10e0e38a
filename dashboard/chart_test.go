package dashboard_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The server chart serves the dashboard by default, on the port its
// container and Service name "dashboard", over TLS from the relay CA for
// the dashboard's audience, and ships a viewer ClusterRole that grants
// exactly what the dashboard asks about (ViewerRules); dashboard.tls
// names a Secret whose certificate it serves instead (mounted whole, so
// renewals reach the server); with dashboard.enabled=false there is none
// of it.
func TestChartShipsTheDashboard(t *testing.T) {
	localcluster.SkipIfShort(t)
	root, err := localcluster.RepoRoot()
	require.NoError(t, err)
	helm := filepath.Join(root, ".cache", "bin", "helm")
	_, err = os.Stat(helm)
	require.NoError(t, err, "helm is built by make tools")
	render := func(args ...string) string {
		cmd := exec.Command(helm, append([]string{"template", "relaymesh-server", filepath.Join(root, "charts", "relaymesh-server"), "--namespace", "relaymesh"}, args...)...)
		home := t.TempDir()
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
		out, err := cmd.Output()
		require.NoError(t, err)
		return string(out)
	}
	objs, err := localcluster.DecodeObjects([]byte(render()))
	require.NoError(t, err)
	var viewer *rbacv1.ClusterRole
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && strings.HasSuffix(o.GetName(), "-dashboard-viewer") {
			viewer = &rbacv1.ClusterRole{}
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, viewer))
		}
		if o.GetKind() == "ClusterRoleBinding" || o.GetKind() == "RoleBinding" {
			ref := o.Object["roleRef"].(map[string]any)["name"]
			assert.NotContains(t, ref, "dashboard-viewer", "the chart binds the viewer role to no one")
		}
	}
	require.NotNil(t, viewer, "a dashboard-viewer ClusterRole")
	assert.Equal(t, "relaymesh-relaymesh-server-dashboard-viewer", viewer.Name)
	assert.Equal(t, dashboard.ViewerRules(), viewer.Rules)

	out := render()
	assert.Contains(t, out, "- --dashboard-listen=:9092")
	assert.Contains(t, out, "- --dashboard-audience=relaymesh-dashboard\n")
	assert.Contains(t, out, "- --dashboard-session-idle-timeout=30m\n")
	assert.NotContains(t, out, "dashboard-tls", "by default a certificate from the relay CA")
	assert.NotContains(t, out, "dashboard-plain-http", "the chart never serves plain HTTP")

	provided := render("--set", "dashboard.tls.secretName=dashboard-tls", "--set", "dashboard.audience=dash.example")
	for _, want := range []string{"- --dashboard-tls-cert=/etc/relaymesh/dashboard-tls/tls.crt", "- --dashboard-tls-key=/etc/relaymesh/dashboard-tls/tls.key",
		"- name: dashboard-tls\n              mountPath: /etc/relaymesh/dashboard-tls\n              readOnly: true", "secretName: dashboard-tls", "- --dashboard-audience=dash.example"} {
		assert.Contains(t, provided, want)
	}
	assert.NotContains(t, provided, "subPath:", "a subPath mount would never see the Secret's updates")
	assert.Contains(t, out, "- name: dashboard\n              containerPort: 9092")
	assert.Contains(t, out, "- name: dashboard\n      port: 9092\n      targetPort: dashboard")

	off := render("--set", "dashboard.enabled=false", "--set", "dashboard.tls.secretName=dashboard-tls")
	assert.NotContains(t, off, "dashboard-listen")
	assert.NotContains(t, off, "dashboard-tls")
	assert.NotContains(t, off, "dashboard-viewer")
}
