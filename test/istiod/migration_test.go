package istiod

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/internal/workloadapi/security"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/translationtest"
)

// The principals of the migration proof (trust domain cluster-1.local).
const (
	productpagePrincipal = "cluster-1.local/ns/shop/sa/productpage"
	waypointPrincipal    = "cluster-1.local/ns/shop/sa/waypoint"
)

// TestMigrationToAmbientKeepsEveryL7Rule moves namespace shop from sidecars
// to ambient, step by step as Istio's migration guide does, under a
// VirtualMesh with deny by default, and proves from a real istiod's xDS that
// no step leaves a window in which productpage's L7 grant (GET /reviews/* on
// 9080) is missing or turned into a deny.
//
// At every step the real discovery (discovery.Build over the cluster's own
// objects) and the real translators (all.Translate) produce the output set,
// which must equal the step's golden (testdata/migration/<step>) and is
// applied, pruning what the previous set had and this one has not. Twice per
// step — right after the world changed with the previous output still in
// place (the window), and after the new output is applied — every pod
// behind reviews must be covered: a pod that still runs a sidecar is told
// the L7 rule in its own inbound RBAC (a Go client posing as its
// istio-proxy); a pod captured by ztunnel is bound to an ALLOW that admits
// the waypoint and not productpage itself (a client posing as the ztunnel),
// and the waypoint is told the L7 rule (a client posing as the waypoint).
// No DENY reaches any of them.
//
// The steps: 0 sidecars; 1 a waypoint deployed and reviews bound to it; 2
// the namespace relabelled for ambient (injection off) while both pods still
// run sidecars; 3 reviews-v2 restarted into ambient; 4 reviews-v1 too.
func TestMigrationToAmbientKeepsEveryL7Rule(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cluster, cs := startCluster(ctx, t, dir,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"istio-injection": "enabled"}}},
	)
	translationtest.InstallGatewayAPI(ctx, t, cluster)
	dyn, err := dynamic.NewForConfig(cluster.RESTConfig())
	require.NoError(t, err)
	d := startAmbientIstiod(ctx, t, cluster, dir)

	m := &migration{t: t, cluster: cluster, cs: cs, dyn: dyn, d: d, sidecars: map[string]*DeltaWatch{}}
	m.installShop(ctx)
	m.ztunnelAuthz = m.watch(ctx, d.ZtunnelNode("10.0.0.1"), AuthorizationTypeURL)
	m.ztunnelAddrs = m.watch(ctx, d.ZtunnelNode("10.0.0.1"), AddressTypeURL)

	steps := []struct {
		name   string
		change func(context.Context)
	}{
		{"0-sidecar", nil},
		{"1-waypoint", m.deployWaypoint},
		{"2-relabelled", m.relabelForAmbient},
		{"3-v2-restarted", func(ctx context.Context) { m.restartIntoAmbient(ctx, "reviews-v2") }},
		{"4-v1-restarted", func(ctx context.Context) { m.restartIntoAmbient(ctx, "reviews-v1") }},
	}
	for _, s := range steps {
		if s.change != nil {
			s.change(ctx)
			m.requireCovered(ctx, s.name+", before Relaymesh translated the change")
		}
		out := m.translate(ctx, s.name)
		m.apply(ctx, out)
		m.requireCovered(ctx, s.name)
	}
}

// migration is the world of the migration proof and the watches on it.
type migration struct {
	t       *testing.T
	cluster *localcluster.Cluster
	cs      kubernetes.Interface
	dyn     dynamic.Interface
	d       *Istiod

	// pods behind reviews by Deployment: name, IP, and whether it runs a
	// sidecar.
	pods     []*migrationPod
	applied  *translation.Output
	waypoint *DeltaWatch

	ztunnelAuthz, ztunnelAddrs *DeltaWatch
	sidecars                   map[string]*DeltaWatch // by pod name
}

type migrationPod struct {
	deployment, name, ip string
	sidecar              bool
}

func (m *migration) watch(ctx context.Context, node *corev3.Node, typeURL string) *DeltaWatch {
	w, err := m.d.WatchDelta(ctx, node, typeURL)
	require.NoError(m.t, err)
	m.t.Cleanup(func() { _ = w.Close() })
	return w
}

// installShop makes what discovery reads at step 0: an istiod Deployment
// with ambient enabled and its ztunnel DaemonSet (installed, as the guide's
// first step, before any workload moves), the mesh config naming the trust
// domain, and in shop the Deployments productpage, reviews-v1 and
// reviews-v2 (injected: the namespace says istio-injection=enabled), the
// Service reviews and one running pod with a sidecar per reviews version.
func (m *migration) installShop(ctx context.Context) {
	t := m.t
	t.Helper()
	_, err := m.cs.AppsV1().Deployments(DefaultNamespace).Create(ctx, deploymentOf(DefaultNamespace, "istiod", map[string]string{"app": "istiod", "istio": "pilot"}, "istiod",
		"docker.io/istio/pilot:"+istioVersion, corev1.EnvVar{Name: "PILOT_ENABLE_AMBIENT", Value: "true"}), metav1.CreateOptions{})
	require.NoError(t, err)
	ztunnel := deploymentOf(DefaultNamespace, "ztunnel", map[string]string{"app": "ztunnel"}, "ztunnel", "docker.io/istio/ztunnel:"+istioVersion)
	_, err = m.cs.AppsV1().DaemonSets(DefaultNamespace).Create(ctx, &appsv1.DaemonSet{ObjectMeta: ztunnel.ObjectMeta,
		Spec: appsv1.DaemonSetSpec{Selector: ztunnel.Spec.Selector, Template: ztunnel.Spec.Template}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = m.cs.CoreV1().ConfigMaps(DefaultNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio"},
		Data: map[string]string{"mesh": "trustDomain: " + m.d.TrustDomain() + "\n"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	for _, sa := range []string{"productpage", "reviews"} {
		_, err := m.cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, dep := range []*appsv1.Deployment{
		deploymentOf("shop", "productpage", map[string]string{"app": "productpage"}, "productpage", "example.invalid/productpage"),
		deploymentOf("shop", "reviews-v1", map[string]string{"app": "reviews", "version": "v1"}, "reviews", "example.invalid/reviews"),
		deploymentOf("shop", "reviews-v2", map[string]string{"app": "reviews", "version": "v2"}, "reviews", "example.invalid/reviews"),
	} {
		_, err := m.cs.AppsV1().Deployments("shop").Create(ctx, dep, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	_, err = m.cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "reviews"}, Ports: []corev1.ServicePort{
			{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.pods = []*migrationPod{
		{deployment: "reviews-v1", name: "reviews-v1-a", ip: "10.1.0.11", sidecar: true},
		{deployment: "reviews-v2", name: "reviews-v2-a", ip: "10.1.0.12", sidecar: true},
	}
	for _, p := range m.pods {
		m.runPod(ctx, p)
	}
}

// deploymentOf is a Deployment whose pod template carries labels, runs as
// sa, and has one container of image (with env).
func deploymentOf(ns, name string, labels map[string]string, sa, image string, env ...corev1.EnvVar) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "main", Image: image, Env: env}}},
			},
		},
	}
}

// versionOf is the version label of a reviews Deployment.
func versionOf(deployment string) string { return strings.TrimPrefix(deployment, "reviews-") }

// runPod creates p's pod as the kubelet leaves it running: injected (the
// injector's status annotation and an istio-proxy container) when
// p.sidecar, else captured by istio-cni (its redirection annotation).
func (m *migration) runPod(ctx context.Context, p *migrationPod) {
	t := m.t
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"app": "reviews", "version": versionOf(p.deployment)}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "reviews",
			NodeName:           "node-test",
			Containers:         []corev1.Container{{Name: "main", Image: "example.invalid/reviews"}},
		},
	}
	if p.sidecar {
		pod.Annotations = map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "istio-proxy", Image: "example.invalid/proxyv2"})
	} else {
		pod.Annotations = map[string]string{"ambient.istio.io/redirection": "enabled"}
	}
	created, err := m.cs.CoreV1().Pods("shop").Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	created.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: p.ip, PodIPs: []corev1.PodIP{{IP: p.ip}}, HostIP: "10.0.0.1",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
	}
	_, err = m.cs.CoreV1().Pods("shop").UpdateStatus(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// deployWaypoint is step 1: a waypoint for shop's Services, and reviews
// bound to it (istio.io/use-waypoint on the Service), plus the Deployment
// the deployment controller would make (discovery learns its service
// account there).
func (m *migration) deployWaypoint(ctx context.Context) {
	t := m.t
	t.Helper()
	wp := deploymentOf("shop", "waypoint", map[string]string{"gateway.networking.k8s.io/gateway-name": "waypoint"}, "waypoint", "docker.io/istio/proxyv2:"+istioVersion)
	_, err := m.cs.AppsV1().Deployments("shop").Create(ctx, wp, metav1.CreateOptions{})
	require.NoError(t, err)
	installWaypoint(ctx, t, m.cs, m.dyn)
	patch := []byte(`{"metadata":{"labels":{"istio.io/use-waypoint":"waypoint"}}}`)
	_, err = m.cs.CoreV1().Services("shop").Patch(ctx, "reviews", types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
	m.waypoint = m.watch(ctx, m.d.WaypointNode("10.1.0.20", "waypoint-1", "shop", "waypoint", "waypoint"), ListenerTypeURL)
}

// relabelForAmbient is step 2: injection off and ambient on for namespace
// shop. The pods keep running with their sidecars until restarted.
func (m *migration) relabelForAmbient(ctx context.Context) {
	patch := []byte(`{"metadata":{"labels":{"istio-injection":null,"istio.io/dataplane-mode":"ambient"}}}`)
	_, err := m.cs.CoreV1().Namespaces().Patch(ctx, "shop", types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(m.t, err)
}

// restartIntoAmbient replaces the pod of deployment by a new one (a new
// name and IP, as a rollout gives), which the namespace's labels now put in
// ambient mode.
func (m *migration) restartIntoAmbient(ctx context.Context, deployment string) {
	t := m.t
	t.Helper()
	for _, p := range m.pods {
		if p.deployment != deployment {
			continue
		}
		require.NoError(t, m.cs.CoreV1().Pods("shop").Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}))
		if w := m.sidecars[p.name]; w != nil {
			_ = w.Close()
			delete(m.sidecars, p.name)
		}
		p.name, p.ip, p.sidecar = strings.Replace(p.name, "-a", "-b", 1), strings.Replace(p.ip, "10.1.0.", "10.1.0.2", 1), false
		m.runPod(ctx, p)
		return
	}
	t.Fatalf("no pod of %s", deployment)
}

// translate runs the real discovery over the cluster's objects and the real
// translators over what it found and the user's objects, and compares the
// output and statuses with the step's golden.
func (m *migration) translate(ctx context.Context, step string) *translation.Output {
	t := m.t
	t.Helper()
	var in discovery.Inputs
	nss, err := m.cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	in.Namespaces = pointers(nss.Items)
	deps, err := m.cs.AppsV1().Deployments("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	in.Deployments = pointers(deps.Items)
	dss, err := m.cs.AppsV1().DaemonSets("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	in.DaemonSets = pointers(dss.Items)
	svcs, err := m.cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	in.Services = pointers(svcs.Items)
	cms, err := m.cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	in.ConfigMaps = pointers(cms.Items)
	pods, err := m.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	in.Pods = pointers(pods.Items)
	gws, err := m.dyn.Resource(gatewayGVR).Namespace("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	in.Gateways = pointers(gws.Items)

	objs, err := server.DiscoveredObjects(discovery.Build("cluster-1", in), "relaymesh")
	require.NoError(t, err)
	docs, err := os.ReadFile(filepath.Join("testdata", "migration", "input.yaml"))
	require.NoError(t, err)
	for _, o := range objs {
		b, err := json.Marshal(o.Object.Object)
		require.NoError(t, err)
		docs = append(append(docs, "\n---\n"...), b...)
	}
	input := &translation.Input{}
	require.NoError(t, input.Decode(docs))
	out, r := all.Translate(input, "relaymesh")

	golden := filepath.Join("testdata", "migration", step)
	if *translationtest.Update {
		require.NoError(t, os.MkdirAll(golden, 0o755))
	}
	translationtest.Golden(t, golden, out, r)
	return out
}

func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// apply applies out's objects for cluster-1 and deletes those the previous
// output had and out has not, as the agent prunes.
func (m *migration) apply(ctx context.Context, out *translation.Output) {
	t := m.t
	t.Helper()
	_, err := m.cluster.Apply(ctx, "relaymesh-test", translationtest.RenderOutput(t, out))
	require.NoError(t, err)
	if m.applied != nil {
		keep := map[string]bool{}
		for _, o := range out.Objects() {
			keep[objectKey(o.Object)] = true
		}
		for _, o := range m.applied.Objects() {
			if keep[objectKey(o.Object)] {
				continue
			}
			gvk := o.Object.GroupVersionKind()
			gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: translationtest.Resource(gvk.Kind)}
			err := m.dyn.Resource(gvr).Namespace(o.Object.GetNamespace()).Delete(ctx, o.Object.GetName(), metav1.DeleteOptions{})
			if !apierrors.IsNotFound(err) {
				require.NoError(t, err, "prune %s %s/%s", gvk.Kind, o.Object.GetNamespace(), o.Object.GetName())
			}
			t.Logf("pruned %s %s/%s", gvk.Kind, o.Object.GetNamespace(), o.Object.GetName())
		}
	}
	m.applied = out
}

func objectKey(u *unstructured.Unstructured) string {
	return u.GroupVersionKind().String() + " " + u.GetNamespace() + "/" + u.GetName()
}

// requireCovered waits until istiod tells every pod behind reviews (and the
// waypoint, once a pod is captured) what keeps productpage's L7 grant, and
// fails with what it was told instead.
func (m *migration) requireCovered(ctx context.Context, when string) {
	t := m.t
	t.Helper()
	wait, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	anyAmbient := false
	for _, p := range m.pods {
		if !p.sidecar {
			anyAmbient = true
			continue
		}
		w := m.sidecars[p.name]
		if w == nil {
			w = m.watch(ctx, m.d.SidecarNode(p.ip, p.name, "shop", "reviews", map[string]string{"app": "reviews", "version": versionOf(p.deployment)}), ListenerTypeURL)
			m.sidecars[p.name] = w
		}
		labels := map[string]string{"app": "reviews", "version": versionOf(p.deployment)}
		want := m.sidecarRBACNames(labels)
		var got map[string]string
		err := w.Await(wait, func(res map[string]*anypb.Any) error {
			var err error
			if got, err = inboundRBAC(res, 9080); err != nil {
				return err
			}
			// istiod has caught up with what is applied: else the
			// previous set, still in the proxy, could pass for it.
			if names := sortedKeys(got); !slices.Equal(names, want) {
				return fmt.Errorf("RBAC policies %q, want those of the applied set %q", names, want)
			}
			return checkL7Grant(got, "ns[shop]-policy[relaymesh-reviews]-rule[0]")
		})
		require.NoError(t, err, "%s: the sidecar of %s (%s): RBAC %v", when, p.name, p.ip, got)
	}
	if !anyAmbient {
		return
	}
	err := m.ztunnelAddrs.Await(wait, func(res map[string]*anypb.Any) error {
		authz, _, _ := m.ztunnelAuthz.Snapshot()
		return m.checkZtunnel(res, authz)
	})
	require.NoError(t, err, "%s: the ztunnel: %s", when, describeAuthorizations(t, m.ztunnelAuthz))
	want := m.waypointRBACNames("reviews")
	var got map[string]string
	err = m.waypoint.Await(wait, func(res map[string]*anypb.Any) error {
		var err error
		if got, err = waypointRBAC(res, "reviews.shop.svc.cluster.local"); err != nil {
			return err
		}
		if names := sortedKeys(got); !slices.Equal(names, want) {
			return fmt.Errorf("RBAC policies %q, want those of the applied set %q", names, want)
		}
		return checkL7Grant(got, "ns[shop]-policy[relaymesh-reviews.waypoint]-rule[0]")
	})
	require.NoError(t, err, "%s: the waypoint: RBAC %v", when, got)
}

// appliedPolicies are the AuthorizationPolicies of the applied set.
func (m *migration) appliedPolicies() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range m.applied.Objects() {
		if o.Object.GetKind() == "AuthorizationPolicy" {
			out = append(out, o.Object)
		}
	}
	return out
}

// selects reports whether the selector policy ap applies to pods with
// labels in namespace shop (a policy without selector in the root namespace
// applies to every pod too, when root is set).
func selects(ap *unstructured.Unstructured, labels map[string]string, root bool) bool {
	if _, refs, _ := unstructured.NestedSlice(ap.Object, "spec", "targetRefs"); refs {
		return false
	}
	sel, hasSel, _ := unstructured.NestedStringMap(ap.Object, "spec", "selector", "matchLabels")
	switch ap.GetNamespace() {
	case DefaultNamespace:
		return root && !hasSel
	case "shop":
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	return false
}

// rbacNames are the names istiod gives the RBAC policies of an
// AuthorizationPolicy's rules: ns[<ns>]-policy[<name>]-rule[<i>].
func rbacNames(ap *unstructured.Unstructured) []string {
	rules, _, _ := unstructured.NestedSlice(ap.Object, "spec", "rules")
	var out []string
	for i := range rules {
		out = append(out, fmt.Sprintf("ns[%s]-policy[%s]-rule[%d]", ap.GetNamespace(), ap.GetName(), i))
	}
	return out
}

// sidecarRBACNames are the RBAC policies the applied set gives the sidecar
// of a pod with labels, sorted.
func (m *migration) sidecarRBACNames(labels map[string]string) []string {
	var out []string
	for _, ap := range m.appliedPolicies() {
		if selects(ap, labels, true) {
			out = append(out, rbacNames(ap)...)
		}
	}
	return slices.Sorted(slices.Values(out))
}

// boundAtZtunnel are the selector policies (namespace/name) istiod binds
// to a captured pod with labels, sorted.
func (m *migration) boundAtZtunnel(labels map[string]string) []string {
	var out []string
	for _, ap := range m.appliedPolicies() {
		if selects(ap, labels, false) {
			out = append(out, ap.GetNamespace()+"/"+ap.GetName())
		}
	}
	return slices.Sorted(slices.Values(out))
}

// waypointRBACNames are the RBAC policies the applied set gives the
// waypoint for Service svc, sorted: those targeting the Service, and those
// of the root namespace targeting every waypoint (GatewayClass
// istio-waypoint: the VirtualMesh's deny by default).
func (m *migration) waypointRBACNames(svc string) []string {
	var out []string
	for _, ap := range m.appliedPolicies() {
		refs, _, _ := unstructured.NestedSlice(ap.Object, "spec", "targetRefs")
		for _, r := range refs {
			ref, _ := r.(map[string]any)
			service := ref["kind"] == "Service" && ref["name"] == svc && ap.GetNamespace() == "shop"
			everyWaypoint := ref["kind"] == "GatewayClass" && ref["name"] == "istio-waypoint" && ap.GetNamespace() == DefaultNamespace
			if service || everyWaypoint {
				out = append(out, rbacNames(ap)...)
			}
		}
	}
	return slices.Sorted(slices.Values(out))
}

// checkL7Grant wants the named RBAC policy to grant productpage GET
// /reviews/* on 9080, and no DENY policy beside it.
func checkL7Grant(policies map[string]string, name string) error {
	for n := range policies {
		if strings.HasPrefix(n, "DENY:") {
			return fmt.Errorf("a DENY policy %s", n)
		}
	}
	p, ok := policies[name]
	if !ok {
		return fmt.Errorf("no policy %s among %q", name, sortedKeys(policies))
	}
	for _, s := range []string{productpagePrincipal, `"GET"`, "/reviews/", "9080"} {
		if !strings.Contains(p, s) {
			return fmt.Errorf("%s lacks %s: %s", name, s, p)
		}
	}
	return nil
}

// checkZtunnel wants every captured pod behind reviews bound to an ALLOW
// that admits the waypoint, no ALLOW that admits productpage itself (it
// would skip the waypoint's path and method check), and no DENY.
func (m *migration) checkZtunnel(addrs, authz map[string]*anypb.Any) error {
	bound := map[string][]string{}
	if err := workloadPolicies(addrs, bound); err != nil {
		return err
	}
	for _, p := range m.pods {
		if p.sidecar {
			continue
		}
		names, ok := bound[p.name]
		if !ok {
			return fmt.Errorf("workload %s not sent", p.name)
		}
		if want := m.boundAtZtunnel(map[string]string{"app": "reviews", "version": versionOf(p.deployment)}); !slices.Equal(names, want) {
			return fmt.Errorf("workload %s: policies %q, want those of the applied set %q", p.name, names, want)
		}
		admitsWaypoint := false
		for _, name := range names {
			a, err := DecodeAuthorization(authz[name])
			if err != nil {
				return fmt.Errorf("%s bound to %s: %w", name, p.name, err)
			}
			groups := RenderGroups(a)
			if a.GetAction() != security.Action_ALLOW {
				return fmt.Errorf("%s bound to %s is a %s: %q", name, p.name, a.GetAction(), groups)
			}
			for _, g := range groups {
				if strings.Contains(g, productpagePrincipal) {
					return fmt.Errorf("%s bound to %s admits productpage past the waypoint: %q", name, p.name, groups)
				}
				admitsWaypoint = admitsWaypoint || strings.Contains(g, "principal="+waypointPrincipal)
			}
		}
		if !admitsWaypoint {
			return fmt.Errorf("no policy bound to %s admits the waypoint: %q", p.name, names)
		}
	}
	return nil
}

// inboundRBAC returns the RBAC policies (as JSON by name) of a sidecar's
// inbound filter chains for port, ALLOW policies by name and others
// prefixed with their action.
func inboundRBAC(res map[string]*anypb.Any, port uint32) (map[string]string, error) {
	out := map[string]string{}
	found := false
	for _, name := range sortedKeys(res) {
		l := &listenerv3.Listener{}
		if err := res[name].UnmarshalTo(l); err != nil {
			return nil, fmt.Errorf("listener %s: %w", name, err)
		}
		if l.GetName() != "virtualInbound" {
			continue
		}
		for _, fc := range l.GetFilterChains() {
			if fc.GetFilterChainMatch().GetDestinationPort().GetValue() != port {
				continue
			}
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) == nil {
					found = true
					maps.Copy(out, rbacPolicies(hcm))
				}
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("no inbound HTTP filter chain for port %d among listeners %q", port, sortedKeys(res))
	}
	return out, nil
}
