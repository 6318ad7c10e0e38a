package helm

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestRBACByRealProcesses installs both charts, runs the main job with
// `relaymesh server` and `relaymesh agent` authenticated as the charts'
// ServiceAccounts, and checks in the API servers' audit logs that nothing
// was denied and every verb of every rule was used. Then, for each rule the
// charts grant, a fresh run without that one rule fails (at the first step
// the full run used it: a run whose rule was first used at the server's
// start needs only the management cluster), with a denied request the rule
// would have allowed. The agent's account is also shown unable to read
// other Secrets or write anything but the Istio kinds and cacerts, and the
// server's unable to leave its namespace's Secrets.
//
// Which rules are removed in turn is -helm.rules: "first-use" (the default,
// what make test runs) removes every rule first used at the server's start
// (each tried on the management cluster alone, the cheap runs) and, of each
// chart, the first rule first used in each later step — every step's first
// use of a permission is shown to break the job, while the full run's audit
// shows every verb of every rule used; "all" (make test-rbac) removes each
// rule.
var rbacRules = flag.String("helm.rules", "first-use",
	`which of the charts' rules TestRBACByRealProcesses removes in turn: "first-use" (those first used at the server's start, and of each chart the first rule first used in each later step) or "all"`)

// removedInTurn picks the rules -helm.rules names, by index into gs.
func removedInTurn(t *testing.T, gs []grant, firstStep map[int]string) []int {
	var picked []int
	seen := map[string]bool{}
	for i, g := range gs {
		if exemptFromTheJob(g) {
			t.Logf("not removed: %s (notInTheJob: the main job cannot use it yet)", g)
			continue
		}
		switch *rbacRules {
		case "all":
			picked = append(picked, i)
		case "first-use":
			if k := g.chart + "/" + firstStep[i]; firstStep[i] == "server" || !seen[k] {
				seen[k] = true
				picked = append(picked, i)
			}
		default:
			t.Fatalf("-helm.rules=%q: want first-use or all", *rbacRules)
		}
	}
	t.Logf("-helm.rules=%s: removing %d of the %d rules in turn", *rbacRules, len(picked), len(gs))
	return picked
}

// exemptFromTheJob reports whether every API group of g's rule is one the
// main job cannot use yet (notInTheJob): removing it proves nothing.
func exemptFromTheJob(g grant) bool {
	for _, group := range g.rule.APIGroups {
		if _, ok := notInTheJob[group]; !ok {
			return false
		}
	}
	return len(g.rule.APIGroups) > 0
}

func TestRBACByRealProcesses(t *testing.T) {
	h := newHelm(t)
	var gs []grant
	for _, c := range []struct {
		chart  string
		values []string
	}{{serverChart, jobServerValues}, {agentChart, jobAgentValues}} {
		objs, err := h.template(chartDir(t, c.chart), c.chart, namespace, c.values...)
		require.NoError(t, err)
		gs = append(gs, grants(t, c.chart, objs)...)
	}
	firstStep := map[int]string{}
	t.Run("main job", func(t *testing.T) {
		start := time.Now()
		j := newJob(t, jobConfig{workload: []string{"cluster-1", "cluster-2"}})
		_, _ = j.run(mainJob)
		t.Logf("main job as the charts' ServiceAccounts: %s", time.Since(start).Round(time.Millisecond))
		first := coverage(t, gs, j.audit())
		for i, g := range gs {
			firstStep[i] = j.stepAt(first[i].at)
			t.Logf("%-75s first used in step %-12s by %s", g, firstStep[i], first[i])
		}
		agentCannot(t, j, "cluster-1")
		serverCannot(t, j)
	})
	if t.Failed() {
		return
	}
	t.Run("without each rule", func(t *testing.T) {
		for _, i := range removedInTurn(t, gs, firstStep) {
			g := gs[i]
			t.Run(fmt.Sprintf("%s-%s-%d", strings.TrimPrefix(g.chart, "relaymesh-"), g.kind, g.index), func(t *testing.T) {
				t.Parallel()
				withoutRule(t, g, firstStep[i])
			})
		}
	})
}

// withoutRule runs the job with one rule removed from the installed chart
// and checks that it fails because of it. A rule the full run first used
// at the server's start is tried on the management cluster alone (most of
// the server's rules: a quarter of the cost); if the server starts, the
// whole job runs. (Trying agent rules on one workload cluster first costs
// more than it saves: several are first used at registration, where a
// denied list only costs the agent a kind, and break a later step.)
func withoutRule(t *testing.T, g grant, first string) {
	start := time.Now()
	full := part{[]string{"cluster-1", "cluster-2"}, mainJob}
	parts := []part{full}
	if first == "server" {
		parts = []part{{nil, mainJob[:1]}, full}
	}
	for _, p := range parts {
		j := newJob(t, jobConfig{workload: p.workload, failFast: true, before: func(t testing.TB, j *job) { j.removeRule(g) }})
		failed, err := j.run(p.steps)
		if failed == "" {
			t.Logf("without %s, steps up to %s passed", g, p.steps[len(p.steps)-1].name)
			require.NoError(t, j.env.Stop())
			continue
		}
		var because []string
		for _, d := range j.denied() {
			if g.allows(d) {
				because = append(because, d.String())
			}
		}
		require.NotEmpty(t, because, "step %s failed (%v), but no denied request needed %s; denied: %v", failed, err, g, j.denied())
		t.Logf("without %s: step %s failed (%s into the run): %v; denied: %s", g, failed, time.Since(start).Round(time.Second), err, strings.Join(uniq(because), "; "))
		return
	}
	t.Fatalf("the whole job passed without %s: the chart grants more than the processes need", g)
}

// part is a part of the job on some workload clusters.
type part struct {
	workload []string
	steps    []step
}

// removeRule deletes one rule from the installed Role or ClusterRole, as an
// admin editing the chart's objects would.
func (j *job) removeRule(g grant) {
	t := j.t
	clusters := []string{"mgmt"}
	if g.chart == agentChart {
		clusters = j.cfg.workload
	}
	for _, name := range clusters {
		cs, err := j.env.Cluster(name).Clientset()
		require.NoError(t, err)
		rbac := cs.RbacV1()
		switch g.kind {
		case "Role":
			r, err := rbac.Roles(g.namespace).Get(j.ctx, g.role, metav1.GetOptions{})
			require.NoError(t, err)
			r.Rules = without(t, r.Rules, g)
			_, err = rbac.Roles(g.namespace).Update(j.ctx, r, metav1.UpdateOptions{})
			require.NoError(t, err)
		case "ClusterRole":
			r, err := rbac.ClusterRoles().Get(j.ctx, g.role, metav1.GetOptions{})
			require.NoError(t, err)
			r.Rules = without(t, r.Rules, g)
			_, err = rbac.ClusterRoles().Update(j.ctx, r, metav1.UpdateOptions{})
			require.NoError(t, err)
		}
	}
}

func without(t testing.TB, rules []rbacv1.PolicyRule, g grant) []rbacv1.PolicyRule {
	t.Helper()
	require.Greater(t, len(rules), g.index)
	require.True(t, reflect.DeepEqual(rules[g.index], g.rule), "installed rule %d differs from the rendered one", g.index)
	return slices.Delete(slices.Clone(rules), g.index, g.index+1)
}

// clientAs is a client authenticated as one of the job's ServiceAccount
// kubeconfigs.
func clientAs(t testing.TB, kubeconfig string) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	return cs, dyn
}

func forbidden(t testing.TB, what string, err error, msg ...string) {
	t.Helper()
	require.True(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", what, err)
	for _, m := range msg {
		require.Contains(t, err.Error(), m, what)
	}
}

// agentCannot shows what the agent's account may not do: read any Secret
// but its own and cacerts, create Secrets of other names, or write any kind
// but the Istio kinds it applies.
func agentCannot(t *testing.T, j *job, cluster string) {
	ctx := context.Background()
	admin := j.kube[cluster]
	cs, dyn := clientAs(t, j.agentKubeconfig(cluster, 0))
	for _, ns := range []string{"istio-system", namespace, "bookinfo"} {
		_, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "decoy"}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = cs.CoreV1().Secrets(ns).Get(ctx, "decoy", metav1.GetOptions{})
		forbidden(t, "get secret "+ns+"/decoy", err)
		_, err = cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		forbidden(t, "list secrets in "+ns, err)
		_, err = cs.CoreV1().Secrets(ns).Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "decoy", Namespace: ns}}, metav1.UpdateOptions{})
		forbidden(t, "update secret "+ns+"/decoy", err)
		err = cs.CoreV1().Secrets(ns).Delete(ctx, "decoy", metav1.DeleteOptions{})
		forbidden(t, "delete secret "+ns+"/decoy", err)
		_, err = cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{})
		forbidden(t, "create secret "+ns+"/other", err, "the relay agent creates only cacerts Secrets and its own relay-client-tls-secret")
		_, err = cs.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{})
		forbidden(t, "watch secrets in "+ns, err)
	}
	_, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	forbidden(t, "list every secret", err)
	_, err = cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=decoy"})
	forbidden(t, "list the secrets named decoy", err)
	_, err = cs.CoreV1().Secrets("istio-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "relay-client-tls-secret"}}, metav1.CreateOptions{})
	forbidden(t, "create its credential's name elsewhere", err, "creates only cacerts")
	// What it may do, so the refusals above are not a broken account.
	_, err = cs.CoreV1().Secrets(namespace).Get(ctx, "relay-client-tls-secret", metav1.GetOptions{})
	require.NoError(t, err)
	_, err = cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=cacerts"})
	require.NoError(t, err)
	_, err = cs.CoreV1().Secrets("bookinfo").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cacerts"}}, metav1.CreateOptions{})
	require.NoError(t, err, "a cacerts Secret in a mesh namespace")
	require.NoError(t, cs.CoreV1().Secrets("bookinfo").Delete(ctx, "cacerts", metav1.DeleteOptions{}))

	// No kind but the Istio ones.
	meta := metav1.ObjectMeta{Name: "probe", Namespace: "bookinfo"}
	for what, create := range map[string]func() error{
		"configmap": func() error {
			_, err := cs.CoreV1().ConfigMaps("bookinfo").Create(ctx, &corev1.ConfigMap{ObjectMeta: meta}, metav1.CreateOptions{})
			return err
		},
		"service": func() error {
			_, err := cs.CoreV1().Services("bookinfo").Create(ctx, &corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
			return err
		},
		"pod": func() error {
			_, err := cs.CoreV1().Pods("bookinfo").Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}, metav1.CreateOptions{})
			return err
		},
		"namespace": func() error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, namespaceObject("probe", nil), metav1.CreateOptions{})
			return err
		},
		"deployment patch": func() error {
			_, err := cs.AppsV1().Deployments("istio-system").Patch(ctx, "istiod", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		},
		"deployment": func() error {
			_, err := cs.AppsV1().Deployments("bookinfo").Create(ctx, &appsv1.Deployment{ObjectMeta: meta}, metav1.CreateOptions{})
			return err
		},
		"rolebinding": func() error {
			_, err := cs.RbacV1().RoleBindings("bookinfo").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "admin"}}, metav1.CreateOptions{})
			return err
		},
		"lease elsewhere": func() error {
			_, err := cs.CoordinationV1().Leases("istio-system").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, metav1.CreateOptions{})
			return err
		},
		"namespace delete": func() error { return cs.CoreV1().Namespaces().Delete(ctx, "bookinfo", metav1.DeleteOptions{}) },
	} {
		forbidden(t, "agent: "+what, create())
	}
	vs := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
		"metadata": map[string]any{"name": "probe", "namespace": "bookinfo"}, "spec": map[string]any{"hosts": []any{"probe"}}}}
	_, err = dyn.Resource(istioKinds[0]).Namespace("bookinfo").Create(ctx, vs, metav1.CreateOptions{})
	require.NoError(t, err, "the agent writes Istio kinds")
	require.NoError(t, dyn.Resource(istioKinds[0]).Namespace("bookinfo").Delete(ctx, "probe", metav1.DeleteOptions{}))
}

// serverCannot shows the server's account confined to its namespace's
// Secrets and to reading and status-writing the user's objects.
func serverCannot(t *testing.T, j *job) {
	ctx := context.Background()
	cs, dyn := clientAs(t, filepath.Join(j.dir, "server-sa.kubeconfig"))
	_, err := cs.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
	forbidden(t, "server: list kube-system secrets", err)
	_, err = cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	forbidden(t, "server: list every secret", err)
	_, err = cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, metav1.CreateOptions{})
	forbidden(t, "server: create a secret in default", err)
	_, err = cs.AppsV1().Deployments(namespace).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, metav1.CreateOptions{})
	forbidden(t, "server: create a deployment", err)
	vm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": "VirtualMesh",
		"metadata": map[string]any{"name": "probe", "namespace": namespace}, "spec": map[string]any{}}}
	_, err = dyn.Resource(gvrVirtualMesh).Namespace(namespace).Create(ctx, vm, metav1.CreateOptions{})
	forbidden(t, "server: create a VirtualMesh", err)
	err = dyn.Resource(gvrAccess).Namespace(namespace).Delete(ctx, "productpage-to-reviews", metav1.DeleteOptions{})
	forbidden(t, "server: delete a user's policy", err)
}
