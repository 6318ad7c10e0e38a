package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/test/localcluster"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// dashboardViewerName names the demo's dashboard reader: a ServiceAccount
// in the relaymesh namespace of mgmt, and the ClusterRole (the dashboard's
// ViewerRules, as the server chart ships it) bound to it.
const dashboardViewerName = "dashboard-viewer"

// dashboardViewer creates the demo's dashboard reader. It holds no token:
// the user mints a short-lived one with tokenCommand.
func dashboardViewer(ctx context.Context, cs kubernetes.Interface) error {
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-" + dashboardViewerName},
		Rules: dashboard.ViewerRules()}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("dashboard viewer role: %w", err)
	}
	if _, err := cs.CoreV1().ServiceAccounts("relaymesh").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: dashboardViewerName}},
		metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("dashboard viewer account: %w", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-" + dashboardViewerName},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "relaymesh-" + dashboardViewerName},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: dashboardViewerName, Namespace: "relaymesh"}}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("dashboard viewer binding: %w", err)
	}
	return nil
}

// tokenCommand is the command that prints a token for the dashboard: the
// pinned kubectl of `make tools` when it is there, else the one on PATH.
func tokenCommand(kubeconfig string) []string {
	kubectl := "kubectl"
	if root, err := localcluster.RepoRoot(); err == nil {
		if p := filepath.Join(root, ".cache", "bin", "kubectl"); fileExists(p) {
			kubectl = p
		}
	}
	if abs, err := filepath.Abs(kubeconfig); err == nil {
		kubeconfig = abs
	}
	return []string{kubectl, "--kubeconfig", kubeconfig, "-n", "relaymesh", "create", "token", dashboardViewerName, "--audience", dashboard.DefaultAudience}
}

// checkDashboard runs the printed token command and reads the Fleet's API
// with its token (200), and without a token (401): what the demo prints
// works. The token is never printed.
func checkDashboard(ctx context.Context, url string, tokenCmd []string) error {
	b, err := exec.CommandContext(ctx, tokenCmd[0], tokenCmd[1:]...).Output()
	if err != nil {
		return fmt.Errorf("the dashboard's token command failed: %w", err)
	}
	token := strings.TrimSpace(string(b))
	c := http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {token, http.StatusOK}} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"api/v1/fleet", nil)
		if err != nil {
			return err
		}
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("dashboard: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			return fmt.Errorf("dashboard: GET /api/v1/fleet (token given: %t) answered %d, want %d", tc.token != "", resp.StatusCode, tc.want)
		}
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
