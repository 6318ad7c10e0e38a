package istiod

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/test/internal/workloadapi"
	"github.com/relaymesh/relaymesh/test/internal/workloadapi/security"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
)

// wantAuthz is what a ztunnel must be told about one policy: its scope,
// action, and its rule groups in the canonical form of renderGroups.
type wantAuthz struct {
	scope  security.Scope
	action security.Action
	groups []string
}

// TestZtunnelGetsOnlyTheL4RulesOfAmbientAccessPolicies is the proof by
// istiod's own xDS: the real translator's output for the ambient-waypoint
// golden (policy/testdata/access/ambient-waypoint) is applied to a cluster
// whose namespace is enrolled in ambient, a real pilot-discovery in ambient
// mode serves it, and a Go delta-xDS client posing as a ztunnel receives
// exactly the L4 rules each AccessPolicy asked for: the waypoint's identity
// (and only it) admitted where an L7 rule sits behind the waypoint, ports and
// principals of the L4-only policies, a fail-closed empty ALLOW where an L7
// rule has no waypoint, and no trace of the waypoint's L7 policy. Changing a
// policy changes what ztunnel is told, and the old expectation then fails.
func TestZtunnelGetsOnlyTheL4RulesOfAmbientAccessPolicies(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, cs, d, in := ambientWorld(ctx, t, false)

	w, err := d.WatchDelta(ctx, d.ZtunnelNode("10.0.0.1"), AuthorizationTypeURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })

	const (
		waypoint = "principal=cluster-1.local/ns/shop/sa/waypoint"
		ratings  = "principal=cluster-1.local/ns/shop/sa/ratings"
		reviews  = "principal=cluster-1.local/ns/shop/sa/reviews"
		// ratings-from-frontend names namespace frontend: its known
		// identities, here web's.
		frontend = "port=9080 & principal=cluster-1.local/ns/frontend/sa/web"
	)
	want := map[string]wantAuthz{
		// reviews-get (GET /reviews/*) is enforced at the waypoint, so
		// ztunnel admits the waypoint's identity, on any port, and not
		// productpage; reviews-l4 (ratings, any port) stays L4.
		"shop/relaymesh-reviews.ztunnel": {security.Scope_WORKLOAD_SELECTOR, security.Action_ALLOW, []string{ratings, waypoint}},
		// ratings-l4: reviews on 9080; ratings-from-frontend: namespace
		// frontend on 9080. ratings-paths (L7, no waypoint) adds nothing.
		"shop/relaymesh-ratings.ztunnel": {security.Scope_WORKLOAD_SELECTOR, security.Action_ALLOW, []string{frontend, "port=9080 & " + reviews}},
		// details-paths (L7, its waypoint not ready): an ALLOW with no
		// rule, so ztunnel denies everyone (fail closed).
		"shop/relaymesh-details.ztunnel": {security.Scope_WORKLOAD_SELECTOR, security.Action_ALLOW, nil},
	}
	wait, waitCancel := context.WithTimeout(ctx, 60*time.Second)
	defer waitCancel()
	require.NoError(t, w.Await(wait, func(res map[string]*anypb.Any) error { return checkAuthorizations(res, want) }),
		"what istiod told the ztunnel: %s", describeAuthorizations(t, w))
	t.Logf("ztunnel was told: %s", describeAuthorizations(t, w))

	// Per workload: each captured pod carries exactly its Destination's
	// ztunnel policy, and the waypoint's policy binds to none.
	for _, app := range []string{"reviews", "ratings", "details"} {
		ambientPod(ctx, t, cs, app)
	}
	addrs, err := d.WatchDelta(ctx, d.ZtunnelNode("10.0.0.1"), AddressTypeURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = addrs.Close() })
	wantPolicies := map[string][]string{
		"reviews-1": {"shop/relaymesh-reviews.ztunnel"},
		"ratings-1": {"shop/relaymesh-ratings.ztunnel"},
		"details-1": {"shop/relaymesh-details.ztunnel"},
	}
	require.NoError(t, addrs.Await(wait, func(res map[string]*anypb.Any) error { return checkWorkloadPolicies(res, wantPolicies) }))

	// The same test can fail: ratings-l4 now asks for port 9090 and
	// ratings as its source; ztunnel is told so, and the old
	// expectation no longer holds.
	for i := range in.AccessPolicies {
		if in.AccessPolicies[i].Name == "ratings-l4" {
			in.AccessPolicies[i].Spec.AllowedPorts = []int32{9090}
			in.AccessPolicies[i].Spec.SourceSelector[0].KubeServiceAccountRefs.ServiceAccounts[0].Name = "ratings"
		}
	}
	applyAccess(ctx, t, cluster, in)
	changed := map[string]wantAuthz{}
	for k, v := range want {
		changed[k] = v
	}
	changed["shop/relaymesh-ratings.ztunnel"] = wantAuthz{security.Scope_WORKLOAD_SELECTOR, security.Action_ALLOW, []string{frontend, "port=9090 & " + ratings}}
	require.NoError(t, w.Await(wait, func(res map[string]*anypb.Any) error { return checkAuthorizations(res, changed) }),
		"what istiod told the ztunnel after the change: %s", describeAuthorizations(t, w))
	res, _, err := w.Snapshot()
	require.NoError(t, err)
	assert.ErrorContains(t, checkAuthorizations(res, want), "shop/relaymesh-ratings.ztunnel", "the expectation before the change still holds: the check cannot fail")

	// The pitfall the ambient translation avoids: the sidecar-era object
	// for reviews (one selector policy, reviews-get's GET /reviews/* in
	// its rule) on ambient pods. istiod drops the HTTP rule for ztunnel,
	// so productpage's allow silently vanishes: the test tells the wrong
	// output apart.
	sidecar := *in
	sidecar.Destinations = slices.Clone(in.Destinations)
	for i := range sidecar.Destinations {
		if sidecar.Destinations[i].Name == "reviews-shop-cluster-1" {
			sidecar.Destinations[i].Spec.KubeService.DataPlaneMode = "sidecar"
		}
	}
	applyAccess(ctx, t, cluster, &sidecar)
	require.NoError(t, w.Await(wait, func(res map[string]*anypb.Any) error {
		a, err := DecodeAuthorization(res["shop/relaymesh-reviews"])
		if err != nil {
			return fmt.Errorf("shop/relaymesh-reviews: %w", err)
		}
		if got := RenderGroups(a); !slices.Equal(got, []string{ratings}) {
			return fmt.Errorf("shop/relaymesh-reviews: got %q, want only %q (the L7 rule dropped)", got, ratings)
		}
		return nil
	}), "what istiod told the ztunnel about the sidecar-era object: %s", describeAuthorizations(t, w))
}

// ambientPod creates a running pod <app>-1 in shop, labelled app=<app>,
// running as service account <app>, captured by istio-cni (the
// redirection annotation), as a kubelet and istio-cni would leave it.
func ambientPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, app string) {
	t.Helper()
	_, err := cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: app}}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        app + "-1",
			Labels:      map[string]string{"app": app},
			Annotations: map[string]string{"ambient.istio.io/redirection": "enabled"},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: app,
			NodeName:           "node-test",
			Containers:         []corev1.Container{{Name: app, Image: "example.invalid/" + app}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	ip := map[string]string{"reviews": "10.1.0.11", "ratings": "10.1.0.12", "details": "10.1.0.13"}[app]
	pod.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		PodIP:      ip,
		PodIPs:     []corev1.PodIP{{IP: ip}},
		HostIP:     "10.0.0.1",
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
	}
	_, err = cs.CoreV1().Pods("shop").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// checkWorkloadPolicies says how the Authorizations bound to each named
// pod workload differ from want.
func checkWorkloadPolicies(res map[string]*anypb.Any, want map[string][]string) error {
	got := map[string][]string{}
	if err := workloadPolicies(res, got); err != nil {
		return err
	}
	var problems []string
	for _, name := range sortedKeys(want) {
		g, ok := got[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("workload %s not sent", name))
		} else if !slices.Equal(g, want[name]) {
			problems = append(problems, fmt.Sprintf("workload %s: policies %q, want %q", name, g, want[name]))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// workloadPolicies records, for every pod workload of namespace shop in
// res, the Authorizations bound to it, sorted.
func workloadPolicies(res map[string]*anypb.Any, got map[string][]string) error {
	for _, r := range res {
		addr := &workloadapi.Address{}
		if err := r.UnmarshalTo(addr); err != nil {
			return fmt.Errorf("decode Address: %w", err)
		}
		if wl := addr.GetWorkload(); wl != nil && wl.GetNamespace() == "shop" {
			got[wl.GetName()] = slices.Sorted(slices.Values(wl.GetAuthorizationPolicies()))
		}
	}
	return nil
}

// ambientWorld starts one cluster with namespace shop enrolled in ambient,
// (with gatewayAPI) Gateway API's standard CRDs, a real pilot-discovery in
// ambient mode for the golden's mesh (cluster-1, trust domain
// cluster-1.local), and applies the real translator's output for the
// ambient-waypoint golden's input, which it returns.
func ambientWorld(ctx context.Context, t *testing.T, gatewayAPI bool) (*localcluster.Cluster, kubernetes.Interface, *Istiod, *translation.Input) {
	t.Helper()
	dir := t.TempDir()

	cluster, cs := startCluster(ctx, t, dir,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"istio.io/dataplane-mode": "ambient"}}},
	)
	if gatewayAPI {
		translationtest.InstallGatewayAPI(ctx, t, cluster)
	}
	d := startAmbientIstiod(ctx, t, cluster, dir)

	in := translationtest.LoadInput(t, filepath.Join("..", "..", "policy", "testdata", "access", "ambient-waypoint"))
	applyAccess(ctx, t, cluster, in)
	return cluster, cs, d, in
}

// startAmbientIstiod starts a real pilot-discovery in ambient mode for
// cluster (ID cluster-1, trust domain cluster-1.local), stopped with the
// test, its log shown when the test failed.
func startAmbientIstiod(ctx context.Context, t *testing.T, cluster *localcluster.Cluster, dir string) *Istiod {
	t.Helper()
	d, err := Start(ctx, Config{
		Kubeconfig:  cluster.Kubeconfig,
		ClusterID:   "cluster-1",
		Dir:         filepath.Join(dir, "istiod"),
		CACerts:     newTestPKI(t, "mesh-1").cacerts(),
		TrustDomain: "cluster-1.local",
		Ambient:     true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Stop()) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod log (last lines):\n%s", d.LogTail(60))
		}
	})
	return d
}

// applyAccess translates in with the real translator and applies what it
// emits for cluster-1 to cluster.
func applyAccess(ctx context.Context, t *testing.T, cluster *localcluster.Cluster, in *translation.Input) {
	t.Helper()
	out, r := translation.NewOutput(), translation.NewReport()
	policy.TranslateAccess(in, out, r)
	require.NotEmpty(t, out.Objects())
	_, err := cluster.Apply(ctx, "relaymesh-test", translationtest.RenderOutput(t, out))
	require.NoError(t, err)
}

// checkAuthorizations says how the Authorizations istiod sent differ from
// want: every one wanted, with its scope, action and groups, and no other
// one in any namespace (the waypoint's targetRefs policy must not reach a
// ztunnel at all).
func checkAuthorizations(res map[string]*anypb.Any, want map[string]wantAuthz) error {
	var problems []string
	for _, name := range sortedKeys(res) {
		if _, ok := want[name]; !ok {
			problems = append(problems, fmt.Sprintf("unexpected Authorization %s", name))
		}
	}
	for _, name := range sortedKeys(want) {
		w := want[name]
		a, err := DecodeAuthorization(res[name])
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		got := RenderGroups(a)
		if a.GetScope() != w.scope || a.GetAction() != w.action || !slices.Equal(got, w.groups) {
			problems = append(problems, fmt.Sprintf("%s: got %s %s %q, want %s %s %q", name, a.GetScope(), a.GetAction(), got, w.scope, w.action, w.groups))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// describeAuthorizations renders everything the watch holds, for messages.
func describeAuthorizations(t *testing.T, w *DeltaWatch) string {
	res, n, err := w.Snapshot()
	var b strings.Builder
	fmt.Fprintf(&b, "%d responses (stream error: %v)", n, err)
	for _, name := range sortedKeys(res) {
		a, err := DecodeAuthorization(res[name])
		if err != nil {
			fmt.Fprintf(&b, "\n  %s: %v", name, err)
			continue
		}
		fmt.Fprintf(&b, "\n  %s: %s %s %q", name, a.GetScope(), a.GetAction(), RenderGroups(a))
	}
	return b.String()
}
