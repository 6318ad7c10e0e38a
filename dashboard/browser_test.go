package dashboard_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

var screenshots = flag.String("screenshots", "", "write a PNG of every page to this directory (make screenshots)")

// hostile is the string put into free-text fields of the world's objects.
// make screenshots puts a plain version string there instead (see
// TestDashboard): the published pictures show the demo's world, not the
// test's attack strings.
var hostile = `<script>window.pwned=1</script>"><img src=x onerror=window.pwned=1>`

var (
	gvrVirtualMesh = networkingv1alpha1.VirtualMeshes
	gvrAccess      = networkingv1alpha1.AccessPolicies
	gvrClusters    = multiclusterv1alpha1.KubernetesClusters
	gvrPeers       = networkingv1alpha1.FederatedTrustDomains
)

// world is the demo's world (examples/demo: three local clusters, the
// sample workloads, the VirtualMesh with shared trust and the policies),
// with `relaymesh server --dashboard-listen` and two agents as real
// processes; its VirtualMesh verifies rotations by hand, so a test can
// watch each phase.
type world struct {
	bin, dir  string
	env       *localcluster.Env
	url       string
	opsAddr   string
	mgmt      *localcluster.Cluster
	dyn       dynamic.Interface
	kube      kubernetes.Interface
	tokens    map[string]string
	auditPath string
	// client trusts only the relay roots (relay-root-tls-secret), which
	// issue the dashboard's certificate: every request verifies the chain.
	client *http.Client
	// spki is the SHA-256 of the dashboard certificate's public key, for
	// Chromium, which does not trust the relay root.
	spki string
}

func startWorld(t *testing.T) *world {
	ctx := context.Background()
	bin, env, dir := e2e.Setup(t, "mgmt", "cluster-1", "cluster-2")
	w := &world{bin: bin, dir: dir, env: env, mgmt: env.Cluster("mgmt"), tokens: map[string]string{}, auditPath: filepath.Join(dir, "audit.log")}
	var err error
	w.dyn, err = dynamic.NewForConfig(w.mgmt.RESTConfig())
	require.NoError(t, err)
	w.kube, err = w.mgmt.Clientset()
	require.NoError(t, err)

	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	for _, c := range []string{"cluster-1", "cluster-2"} {
		_, err := env.Cluster(c).Apply(ctx, "dashboard-test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", c)))
		require.NoError(t, err)
	}
	vm, err := examples.Demo.ReadFile("demo/virtualmesh.yaml")
	require.NoError(t, err)
	manual := strings.Replace(string(vm), "rotationStrategy: MultiRoot", "rotationStrategy: MultiRoot\n    rotationVerification: Manual", 1)
	require.NotEqual(t, string(vm), manual)
	_, err = w.mgmt.Apply(ctx, "dashboard-test", []byte(manual))
	require.NoError(t, err)

	relayAddr, opsAddr, dashAddr := e2e.Addr(t), e2e.Addr(t), e2e.Addr(t)
	e2e.Start(t, bin, dir, "server", "server", "--kubeconfig", w.mgmt.Kubeconfig, "--listen", relayAddr, "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--dashboard-listen", dashAddr, "--audit-log", w.auditPath, "--server-dns-names", "localhost", "--server-ips", e2e.Host(relayAddr)+","+e2e.Host(dashAddr))
	w.url, w.opsAddr = "https://"+dashAddr, opsAddr
	e2e.Eventually(t, time.Minute, "the server's health", func() (bool, string) {
		code, err := e2e.GetJSON("http://"+opsAddr+"/healthz", nil)
		return code == http.StatusOK, fmt.Sprint(code, err)
	})
	w.trustRelayRoots(t, dashAddr)
	for _, c := range []string{"cluster-1", "cluster-2"} {
		_, err := e2e.Run(t, bin, "cluster", "register", c, "--mgmt-kubeconfig", w.mgmt.Kubeconfig,
			"--remote-kubeconfig", env.Cluster(c).Kubeconfig, "--server-address", relayAddr)
		require.NoError(t, err)
		e2e.Start(t, bin, dir, "agent-"+c, "agent", "--kubeconfig", env.Cluster(c).Kubeconfig, "--health-listen", e2e.Addr(t), "--metrics-listen", e2e.Addr(t))
	}
	policies, err := examples.Demo.ReadFile("demo/policies.yaml")
	require.NoError(t, err)
	_, err = w.mgmt.Apply(ctx, "dashboard-test", policies)
	require.NoError(t, err)
	w.hostileObjects(t)
	w.accounts(t)

	e2e.Eventually(t, 2*time.Minute, "both meshes' intermediates and the policies applied", func() (bool, string) {
		vm, err := w.dyn.Resource(gvrVirtualMesh).Namespace("relaymesh").Get(ctx, "bookinfo-federation", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		meshes, _, _ := unstructured.NestedSlice(vm.Object, "status", "sharedTrust", "meshes")
		ap, err := w.dyn.Resource(gvrAccess).Namespace("relaymesh").Get(ctx, "productpage-to-reviews", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		applied, _, _ := unstructured.NestedInt64(ap.Object, "status", "clusterCounts", "applied")
		refused, err := w.dyn.Resource(gvrAccess).Namespace("relaymesh").Get(ctx, "allow-all", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		state, _, _ := unstructured.NestedString(refused.Object, "status", "state")
		return len(meshes) == 2 && applied == 2 && state == "Invalid", fmt.Sprintf("%d intermediates, policy applied in %d clusters, allow-all %q", len(meshes), applied, state)
	})
	return w
}

// hostileObjects adds what a careless or hostile party can put into free
// text the apiserver accepts: a policy's allowed path, the status of a
// registered cluster whose agent never came (its version, its errors), a
// federation peer's bundle endpoint URL (the server fetches it and writes
// why it failed), and a FederatedTrustDomain outside the server's
// namespace whose status says anything (no page may show it: only the
// server's namespace counts).
func (w *world) hostileObjects(t *testing.T) {
	ctx := context.Background()
	_, err := w.mgmt.Apply(ctx, "dashboard-test", []byte(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: reviews-to-productpage, namespace: relaymesh}
spec:
  sourceSelector:
  - kubeServiceAccountRefs:
      serviceAccounts: [{name: bookinfo-reviews, namespace: bookinfo, clusterName: cluster-1}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: productpage, namespace: bookinfo, clusterName: cluster-1}]
  allowedPaths: [`+strconvQuote("/api/"+hostile)+`]
---
# Every source to every destination, without the relaymesh.io/allow-all
# opt-in: the server's admission refuses it (there is no webhook here, so
# it is stored), and every view must show it as not in force.
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: allow-all, namespace: relaymesh}
spec:
  sourceSelector: [{kubeIdentityMatcher: {}}]
  destinationSelector: [{kubeServiceMatcher: {}}]
---
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: cluster-3, namespace: relaymesh}
spec: {mode: relay}
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: FederatedTrustDomain
metadata: {name: foreign-peer, namespace: relaymesh}
spec:
  trustDomain: foreign.example
  bundleEndpointURL: `+strconvQuote("https://peer.invalid/"+hostile)+`
  profile: https_web
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: FederatedTrustDomain
metadata: {name: elsewhere-peer, namespace: default}
spec:
  trustDomain: elsewhere.example
  bundleEndpointURL: https://elsewhere.invalid/bundle
  profile: https_web
`))
	require.NoError(t, err)
	elsewhere, err := w.dyn.Resource(gvrPeers).Namespace("default").Get(ctx, "elsewhere-peer", metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, unstructured.SetNestedMap(elsewhere.Object, map[string]any{"state": "Stale", "error": "elsewhere-error " + hostile, "sequence": int64(9)}, "status"))
	_, err = w.dyn.Resource(gvrPeers).Namespace("default").UpdateStatus(ctx, elsewhere, metav1.UpdateOptions{})
	require.NoError(t, err)
	// The server writes cluster-3's status too (it is registered, not
	// connected), so a read-modify-write may meet a newer resourceVersion.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		kc, err := w.dyn.Resource(gvrClusters).Namespace("relaymesh").Get(ctx, "cluster-3", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedField(kc.Object, hostile, "status", "agentVersion"); err != nil {
			return err
		}
		if err := unstructured.SetNestedStringSlice(kc.Object, []string{hostile}, "status", "errors"); err != nil {
			return err
		}
		_, err = w.dyn.Resource(gvrClusters).Namespace("relaymesh").UpdateStatus(ctx, kc, metav1.UpdateOptions{})
		return err
	})
	require.NoError(t, err)
}

// refusedAllowAll is the allow-all policy of hostileObjects.
const refusedAllowAll = `apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: allow-all, namespace: relaymesh}
spec:
  sourceSelector: [{kubeIdentityMatcher: {}}]
  destinationSelector: [{kubeServiceMatcher: {}}]
`

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// accounts makes three ServiceAccounts and their tokens: viewer, bound to
// a ClusterRole of dashboard.ViewerRules; fleet, allowed the Fleet only
// (list kubernetesclusters in relaymesh); nobody, allowed nothing.
func (w *world) accounts(t *testing.T) {
	ctx := context.Background()
	cs := w.kube
	_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "dashboard-viewer"}, Rules: dashboard.ViewerRules()}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "dashboard-viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "dashboard-viewer"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "viewer", Namespace: "relaymesh"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().Roles("relaymesh").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "fleet"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"multicluster.relaymesh.io"}, Resources: []string{"kubernetesclusters"}, Verbs: []string{"list"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().RoleBindings("relaymesh").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "fleet"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "fleet"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "fleet", Namespace: "relaymesh"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, sa := range []string{"viewer", "fleet", "nobody"} {
		_, err := cs.CoreV1().ServiceAccounts("relaymesh").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
		w.tokens[sa] = w.mint(t, sa, dashboard.DefaultAudience)
	}
}

// mint is a token of ServiceAccount sa for audiences (none: the
// apiserver's own).
func (w *world) mint(t *testing.T, sa string, audiences ...string) string {
	t.Helper()
	tr, err := w.kube.CoreV1().ServiceAccounts("relaymesh").CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}

// trustRelayRoots reads the relay roots the server published, and makes
// w.client trust them only; the dashboard's certificate must verify
// against them for its address.
func (w *world) trustRelayRoots(t *testing.T, dashAddr string) {
	sec, err := w.kube.CoreV1().Secrets("relaymesh").Get(context.Background(), "relay-root-tls-secret", metav1.GetOptions{})
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(sec.Data["ca.crt"]))
	tlsCfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	w.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	var leaf *x509.Certificate
	e2e.Eventually(t, 30*time.Second, "the dashboard's TLS", func() (bool, string) {
		conn, err := tls.Dial("tcp", dashAddr, &tls.Config{RootCAs: roots, ServerName: e2e.Host(dashAddr), MinVersion: tls.VersionTLS12})
		if err != nil {
			return false, err.Error()
		}
		defer conn.Close()
		leaf = conn.ConnectionState().PeerCertificates[0]
		return true, ""
	})
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	w.spki = base64.StdEncoding.EncodeToString(sum[:])
}

func (w *world) do(t *testing.T, method, path, token string, form url.Values) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, w.url+path, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := w.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestDashboard runs the dashboard of a real server on the demo's world,
// over TLS from the relay CA (every request of the test verifies the
// chain against the relay roots): the refusals of every page and API;
// sessions (the cookie a random id, never the token; a token for another
// audience refused with no session; hostile cookies changing nothing;
// sign-out ending the session on the server); plain HTTP off loopback
// refused at start; each page in headless Chromium — signed in through
// the form, the rows each page must show, the access graph's edges,
// hostile strings shown as text, and the Trust page following a root
// rotation phase by phase without a reload; and a second replica serving
// a provided, reloaded certificate, whose sessions are its own and idle
// out, with relaymesh check reporting both replicas' transport.
func TestDashboard(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "the browser tests need Debian's chromium: make deps (hack/deps.sh test) installs it")
	if *screenshots != "" {
		// The same checks hold for a plain string; the pictures then
		// show no attack strings (issue 28).
		hostile = "1.30.0"
	}
	start := time.Now()
	w := startWorld(t)
	t.Logf("world up in %s", time.Since(start).Round(time.Millisecond))

	t.Run("refusals carry no data", func(t *testing.T) { w.refusals(t) })
	t.Run("sessions keep the token on the server", func(t *testing.T) { w.sessions(t) })
	t.Run("plain HTTP off loopback is refused at start", func(t *testing.T) { w.plainHTTPOffLoopback(t) })
	t.Run("browser", func(t *testing.T) { w.browser(t, chromium) })
	t.Run("a second replica with a provided certificate", func(t *testing.T) { w.secondReplica(t) })
}

// refusals: every page, API and the what-if, without a token, with a
// token the apiserver does not accept, with the token of an account
// allowed nothing, and of one allowed the Fleet only.
func (w *world) refusals(t *testing.T) {
	markers := []string{"cluster-1", "bookinfo", "productpage"}
	for _, v := range dashboard.AllViews {
		for _, who := range []struct {
			name, token string
			code        int
		}{{"no token", "", 401}, {"garbage", "not-a-token", 401}, {"nobody", w.tokens["nobody"], 403}, {"fleet only", w.tokens["fleet"], 403}} {
			if who.name == "fleet only" && v == dashboard.ViewFleet {
				code, body := w.do(t, http.MethodGet, "/fleet", who.token, nil)
				assert.Equal(t, http.StatusOK, code)
				assert.Contains(t, body, "cluster-1")
				continue
			}
			for _, p := range []string{"/" + string(v), "/api/v1/" + string(v)} {
				code, body := w.do(t, http.MethodGet, p, who.token, nil)
				assert.Equal(t, who.code, code, "%s as %s", p, who.name)
				for _, m := range markers {
					assert.NotContains(t, body, m, "%s as %s", p, who.name)
				}
			}
		}
	}
	for _, tok := range []string{"", "not-a-token", w.tokens["nobody"], w.tokens["fleet"]} {
		code, body := w.do(t, http.MethodPost, "/access/whatif", tok, url.Values{"without": {"accesspolicy/relaymesh/productpage-to-reviews"}})
		assert.Contains(t, []int{401, 403}, code)
		for _, m := range markers {
			assert.NotContains(t, body, m)
		}
	}
	// The viewer sees every view, as HTML and as JSON.
	for _, v := range dashboard.AllViews {
		code, body := w.do(t, http.MethodGet, "/api/v1/"+string(v), w.tokens["viewer"], nil)
		assert.Equal(t, http.StatusOK, code, "%s: %s", v, body)
	}
}

// page drives one browser tab.
type page struct {
	t   *testing.T
	ctx context.Context
}

func (p page) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	require.NoError(p.t, chromedp.Do(p.ctx, steps...), what)
}

func (p page) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(p.t, err, "text of %s", sel)
	return s
}

func eval[T any](p page, expr string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](expr))
	require.NoError(p.t, err, "evaluate %s", expr)
	return v
}

func (p page) shot(name string) {
	p.t.Helper()
	if *screenshots == "" {
		return
	}
	png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	require.NoError(p.t, err)
	require.NoError(p.t, os.MkdirAll(*screenshots, 0o755))
	require.NoError(p.t, os.WriteFile(filepath.Join(*screenshots, name+".png"), png, 0o644))
}

// noScriptRan checks that no hostile string ran: window.pwned unset, and
// app.js the only script.
func (p page) noScriptRan(name string) {
	p.t.Helper()
	assert.False(p.t, eval[bool](p, `window.pwned === 1`), "%s: a hostile string ran as script", name)
	assert.Equal(p.t, 1, eval[int](p, `document.scripts.length`), "%s: app.js only", name)
}

func (w *world) browser(t *testing.T, chromium string) {
	// Chromium does not trust the relay root: it is told the key of the
	// dashboard's certificate instead (the chain itself is verified by
	// w.client on every other request).
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]), chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(1440, 1000), chromedp.DisableGPU, chromedp.Flag("ignore-certificate-errors-spki-list", w.spki))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The first action starts the browser, on a context without deadline.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate("about:blank")))
	ctx, cancelT := context.WithTimeout(bctx, 5*time.Minute)
	defer cancelT()
	p := page{t: t, ctx: ctx}

	// Unauthenticated, a page is the sign-in form and no data.
	p.do("open /fleet", chromedp.Navigate(w.url+"/fleet"), chromedp.WaitVisible(chromedp.ID("token")))
	assert.NotContains(t, p.text("main"), "cluster-1")
	p.shot("login")
	// A token the apiserver does not accept: still the form.
	p.do("bad token", chromedp.SetValue(chromedp.ID("token"), "not-a-token"), chromedp.Submit(chromedp.ID("token")), chromedp.WaitVisible(chromedp.CSS(".message")))
	assert.Contains(t, p.text(".message"), "does not accept this token")
	// A token of the viewer for another audience: still the form.
	p.do("foreign audience", chromedp.SetValue(chromedp.ID("token"), w.mint(t, "viewer", "istio-ca")), chromedp.Submit(chromedp.ID("token")), chromedp.WaitVisible(chromedp.CSS(".message")))
	assert.Contains(t, p.text(".message"), "minted for another audience")
	// The viewer's token signs in and lands on the Fleet.
	p.do("sign in", chromedp.SetValue(chromedp.ID("token"), w.tokens["viewer"]), chromedp.Submit(chromedp.ID("token")), chromedp.WaitVisible(chromedp.ID("fleet-table")))
	// The browser holds one cookie: a random id, Secure, HttpOnly,
	// SameSite=Strict, __Host-; not the token.
	cookies, err := chromedp.Run(p.ctx, func(ctx context.Context, target *chromedp.Target) ([]*network.Cookie, error) {
		res, err := cdp.Call(ctx, target, network.GetCookies, network.GetCookiesParams{URLs: []string{w.url}})
		return res.Cookies, err
	})
	require.NoError(t, err)
	require.Len(t, cookies, 1)
	assert.Equal(t, "__Host-relaymesh_dashboard", cookies[0].Name)
	assert.True(t, cookies[0].Secure)
	assert.True(t, cookies[0].HTTPOnly)
	assert.Equal(t, network.CookieSameSiteStrict, cookies[0].SameSite)
	assert.NotContains(t, cookies[0].Value, w.tokens["viewer"])
	assert.Len(t, cookies[0].Value, 43)

	// Fleet: both agents connected; cluster-3 (no agent) not ready, its
	// hostile version shown as text.
	w.eventuallyText(p, `#fleet-table tr[data-cluster="cluster-2"]`, "connected", "/fleet")
	text := p.text("#fleet-table")
	for _, want := range []string{"cluster-1", "cluster-2", "cluster-3", "agent never connected", hostile} {
		assert.Contains(t, text, want)
	}
	for _, c := range []string{"cluster-1", "cluster-2"} {
		row := p.text(`#fleet-table tr[data-cluster="` + c + `"]`)
		assert.Contains(t, row, "ready", c)
		assert.NotContains(t, row, "not ready", c)
		assert.NotContains(t, row, "disconnected", c)
	}
	p.noScriptRan("fleet")
	p.shot("fleet")

	// Certificates: the relay's, both agents', the mesh root and both
	// intermediates.
	p.do("certificates", chromedp.Navigate(w.url+"/certificates"), chromedp.WaitVisible(chromedp.ID("cert-table")))
	text = p.text("#cert-table")
	for _, want := range []string{"relay root", "relay issuing CA", "relay server", "spiffe://relaymesh.local/cluster/cluster-1/agent",
		"spiffe://relaymesh.local/cluster/cluster-2/agent", "mesh root", "mesh intermediate", "generated"} {
		assert.Contains(t, text, want)
	}
	assert.Equal(t, 2, eval[int](p, `document.querySelectorAll('#cert-table tr[data-kind="mesh intermediate"]').length`))
	p.noScriptRan("certificates")
	p.shot("certificates")

	// Policies: the VirtualMesh and both demo policies Accepted; the
	// AccessPolicy applied in both clusters.
	p.do("policies", chromedp.Navigate(w.url+"/policies"), chromedp.WaitVisible(chromedp.ID("policy-table")))
	text = p.text("#policy-table")
	for _, want := range []string{"relaymesh/bookinfo-federation", "relaymesh/reviews-shift", "relaymesh/productpage-to-reviews", "Accepted"} {
		assert.Contains(t, text, want)
	}
	assert.Contains(t, p.text(`#policy-table tr[data-name="relaymesh/allow-all"]`), "Invalid")
	assert.Contains(t, p.text(`#policy-table tr[data-name="relaymesh/productpage-to-reviews"]`), "cluster-1, cluster-2")
	p.noScriptRan("policies")
	p.shot("policies")

	// Access: the graph's edges are exactly the matrix's (source,
	// destination) pairs, including the demo's two: productpage in
	// cluster-1 to reviews in cluster-1 and, federated, in cluster-2.
	var api struct {
		Data struct {
			Matrix struct {
				Pairs []struct{ Source, Destination string }
			}
			Findings []struct {
				Kind    string
				Objects []string
			}
		}
	}
	code, body := w.do(t, http.MethodGet, "/api/v1/access", w.tokens["viewer"], nil)
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, json.Unmarshal([]byte(body), &api))
	want := map[string]bool{}
	for _, pr := range api.Data.Matrix.Pairs {
		want[pr.Source+" → "+pr.Destination] = true
	}
	p.do("access", chromedp.Navigate(w.url+"/access"), chromedp.WaitVisible(chromedp.ID("access-graph")))
	edges := eval[[]map[string]string](p, `[...document.querySelectorAll('#access-graph path.edge')].map(e => ({source: e.dataset.source, destination: e.dataset.destination, policies: e.dataset.policies}))`)
	got, policyOf := map[string]bool{}, map[string]string{}
	for _, e := range edges {
		got[e["source"]+" → "+e["destination"]] = true
		policyOf[e["source"]+" → "+e["destination"]] = e["policies"]
	}
	assert.Equal(t, want, got, "the graph draws the matrix")
	for _, dst := range []string{"cluster-1", "cluster-2"} {
		k := "cluster-1/bookinfo/bookinfo-productpage → " + dst + "/bookinfo/reviews"
		assert.Equal(t, "relaymesh/productpage-to-reviews", policyOf[k], "edge %s (have %v)", k, policyOf)
	}
	// The refused allow-all policy is neither in the matrix nor in the
	// graph: the demo's 2 pairs and the hostile policy's 1, not the 16 it
	// would allow; it is a refused-by-admission finding, and the demo's
	// policy is not "shadowed" by it.
	assert.Len(t, api.Data.Matrix.Pairs, 3)
	assert.Len(t, edges, 3)
	for k, pol := range policyOf {
		assert.NotContains(t, pol, "relaymesh/allow-all", k)
	}
	findings := map[string][]string{}
	for _, f := range api.Data.Findings {
		findings[f.Objects[0]] = append(findings[f.Objects[0]], f.Kind)
	}
	assert.Equal(t, []string{"refused-by-admission"}, findings["AccessPolicy/relaymesh/allow-all"])
	assert.NotContains(t, findings["AccessPolicy/relaymesh/productpage-to-reviews"], "shadowed")
	assert.Contains(t, p.text("#findings-table"), "refused by admission")
	assert.NotContains(t, p.text("#findings-table"), "shadowed")
	assert.Contains(t, p.text("#access-table"), hostile, "the hostile path is shown as text")
	p.noScriptRan("access")
	p.shot("access")

	// What-if: removing the policy removes its pairs.
	p.do("what-if", chromedp.SetValue(chromedp.ID("without"), "accesspolicy/relaymesh/productpage-to-reviews"), chromedp.Submit(chromedp.ID("without")),
		chromedp.WaitVisible(chromedp.ID("whatif-summary")))
	assert.Contains(t, p.text("#whatif-summary"), "2 removed")
	p.shot("whatif")
	// What-if: pasting the refused policy (under another name) adds
	// nothing; the finding it adds says why.
	p.do("what-if refused", chromedp.Navigate(w.url+"/access"), chromedp.WaitVisible(chromedp.ID("with")),
		chromedp.SetValue(chromedp.ID("with"), strings.Replace(refusedAllowAll, "name: allow-all", "name: pasted", 1)), chromedp.Submit(chromedp.ID("with")),
		chromedp.WaitVisible(chromedp.ID("whatif-summary")))
	assert.Contains(t, p.text("#whatif-summary"), "0 pair(s) added")
	assert.Contains(t, p.text("main"), "refused by admission")

	// Audit log: the chain verified, issuances listed.
	p.do("audit", chromedp.Navigate(w.url+"/audit"), chromedp.WaitVisible(chromedp.ID("chain")))
	assert.Contains(t, p.text("#chain"), "Chain verified")
	text = p.text("#audit-table")
	assert.Contains(t, text, "cert.issue")
	assert.Contains(t, text, "token.use")
	p.noScriptRan("audit")
	p.shot("audit")

	w.rotation(t, p)

	// Signing out drops the session: the next page is the sign-in form.
	p.do("sign out", chromedp.Click(chromedp.CSS(`form.session button`)), chromedp.WaitVisible(chromedp.ID("token")))
	p.do("after sign-out", chromedp.Navigate(w.url+"/trust"), chromedp.WaitVisible(chromedp.ID("token")))
	assert.NotContains(t, p.text("main"), "bookinfo-federation")
}

// rotation starts a root rotation and watches the Trust page, which is
// not reloaded, show each phase (Manual verification: the test lets each
// phase go once the page showed it) until Finished, with every mesh acked
// and issued by the new root.
func (w *world) rotation(t *testing.T, p page) {
	const vm = "relaymesh/bookinfo-federation"
	p.do("trust", chromedp.Navigate(w.url+"/trust"), chromedp.WaitVisible(chromedp.ID("trust")))
	_ = eval[string](p, `document.body.dataset.probe = "same-page"`)
	assert.Equal(t, "NotRotating", strings.TrimSpace(p.text(`.phase[data-field="phase"]`)))
	// The federation peers: the server's namespace's only, the hostile
	// endpoint URL shown as text.
	peers := p.text("#federation-peers")
	for _, want := range []string{"foreign-peer", "foreign.example", "https://peer.invalid/" + hostile, "https_web"} {
		assert.Contains(t, peers, want)
	}
	assert.NotContains(t, p.text("main"), "elsewhere", "a FederatedTrustDomain of another namespace is no peer")
	p.noScriptRan("trust")
	p.shot("trust")

	_, err := e2e.Run(t, w.bin, "ca", "rotate", "start", vm, "--kubeconfig", w.mgmt.Kubeconfig)
	require.NoError(t, err)
	for _, phase := range []string{"AddingNewRoot", "PropagatingNewIntermediate", "DeletingOldRoot"} {
		w.waitPhase(p, phase, true)
		if phase == "PropagatingNewIntermediate" {
			p.shot("trust-rotating")
		}
		_, err := e2e.Run(t, w.bin, "ca", "rotate", "continue", vm, "--kubeconfig", w.mgmt.Kubeconfig)
		require.NoError(t, err)
	}
	w.waitPhase(p, "Finished", false)
	assert.Equal(t, "same-page", eval[string](p, `document.body.dataset.probe`), "the page followed the rotation without a reload")
	deadline := time.Now().Add(30 * time.Second)
	var issuers, progress []string
	for time.Now().Before(deadline) {
		issuers = eval[[]string](p, `[...document.querySelectorAll('td[data-field="issuer"]')].map(e => e.textContent)`)
		progress = eval[[]string](p, `[...document.querySelectorAll('td[data-field="progress"]')].map(e => e.textContent)`)
		if len(issuers) == 2 && strings.HasPrefix(issuers[0], "new root ") && strings.HasPrefix(issuers[1], "new root ") && slices.Equal(progress, []string{"acked", "acked"}) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.Len(t, issuers, 2)
	for _, s := range issuers {
		assert.True(t, strings.HasPrefix(s, "new root "), "issued by the new root: %q", s)
	}
	assert.Equal(t, []string{"acked", "acked"}, progress)
}

// waitPhase waits until the Trust page shows phase (and, with awaiting,
// that it waits for a continue: every mesh acked the phase's step).
func (w *world) waitPhase(p page, phase string, awaiting bool) {
	p.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var shown, wait string
	for time.Now().Before(deadline) {
		shown, wait = strings.TrimSpace(p.text(`.phase[data-field="phase"]`)), strings.TrimSpace(p.text(`[data-field="awaiting"]`))
		if shown == phase && (!awaiting || wait != "") {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.t.Fatalf("the Trust page did not show %s (awaiting %t) within 90s; it shows %q %q", phase, awaiting, shown, wait)
}

// eventuallyText reloads path until the element sel contains want.
func (w *world) eventuallyText(p page, sel, want, path string) {
	p.t.Helper()
	var text string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		p.do("reload", chromedp.Navigate(w.url+path), chromedp.WaitReady(chromedp.CSS("body")))
		if text = p.text(sel); strings.Contains(text, want) && !strings.Contains(text, "disconnected") {
			return
		}
	}
	p.t.Fatalf("%s of %s does not show %q: %q", sel, path, want, text)
}
