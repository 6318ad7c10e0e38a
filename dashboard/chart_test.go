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
// container and Service name "dashboard", and ships a viewer ClusterRole
// that grants exactly what the dashboard asks about (ViewerRules); with
// dashboard.enabled=false there is none of it.
func TestChartShipsTheDashboard(t *testing.T) {
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
	assert.Contains(t, out, "- name: dashboard\n              containerPort: 9092")
	assert.Contains(t, out, "- name: dashboard\n      port: 9092\n      targetPort: dashboard")

	off := render("--set", "dashboard.enabled=false")
	assert.NotContains(t, off, "dashboard-listen")
	assert.NotContains(t, off, "dashboard-viewer")
}
