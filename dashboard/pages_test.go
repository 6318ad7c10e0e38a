package dashboard

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"
)

var testNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// hostile strings a cluster could put in a free-text field (an agent
// version, a status message, an allowed path, an audit reason).
var hostile = []string{
	`<script>window.pwned=1</script>`,
	`"><img src=x onerror="window.pwned=1">`,
	`' onmouseover='window.pwned=1' x='`,
	`</title></textarea><svg onload=window.pwned=1>`,
	`javascript:window.pwned=1`,
	`{{.CSRF}}`,
}

func newTestDashboard(t testing.TB, src Source, auditPath string) *httptest.Server {
	t.Helper()
	d, err := New(Config{Namespace: "relaymesh", Source: src, Auth: tokenAuth{
		users: map[string]string{"viewer-token": "viewer", "nobody-token": "nobody", "fleet-token": "fleet"},
		allow: map[string]map[string]bool{"viewer": {"*": true}, "fleet": {"list multicluster.relaymesh.io/kubernetesclusters": true}},
	}, AuditLog: auditPath, AgentTTL: 24 * time.Hour, ServerVersion: "v1.0.0", Clock: func() time.Time { return testNow }})
	require.NoError(t, err)
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	return srv
}

func get(t testing.TB, srv *httptest.Server, path, token string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func writeAuditLog(t testing.TB, reason string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: p})
	require.NoError(t, err)
	require.NoError(t, l.Record(audit.Event{Type: audit.TokenMint, Result: audit.ResultSuccess, Cluster: "cluster-1"}))
	require.NoError(t, l.Record(audit.Event{Type: audit.CertDeny, Result: audit.ResultFailure, Cluster: "cluster-2", Reason: reason,
		Details: map[string]string{"mesh": reason}}))
	require.NoError(t, l.Close())
	return p
}

// Every page and API answers an allowed caller with its data, and renders
// hostile strings as text: the only script is app.js, no element carries
// an event handler, and the hostile text is there, escaped.
func TestPagesEscapeHostileStrings(t *testing.T) {
	for _, s := range hostile {
		t.Run(s, func(t *testing.T) {
			srv := newTestDashboard(t, demoWorld(s, testNow), writeAuditLog(t, s))
			for _, v := range AllViews {
				code, body, h := get(t, srv, "/"+string(v), "viewer-token")
				require.Equal(t, http.StatusOK, code, "%s: %s", v, body)
				assert.Equal(t, contentSecurityPolicy, h.Get("Content-Security-Policy"))
				assert.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
				checkMarkup(t, string(v), body)
				if v != ViewAccess || !strings.Contains(s, "{{") { // findings quote no path here
					assert.Contains(t, body, html.EscapeString(s), "%s shows the string, escaped", v)
				}
				code, body, h = get(t, srv, "/api/v1/"+string(v), "viewer-token")
				require.Equal(t, http.StatusOK, code, "%s: %s", v, body)
				assert.Equal(t, "application/json", h.Get("Content-Type"))
				assert.NotContains(t, body, "<script>", "JSON escapes < as \\u003c")
			}
		})
	}
}

// checkMarkup parses a page and fails on any script but app.js and any
// event-handler or javascript: attribute.
func checkMarkup(t *testing.T, page, body string) {
	t.Helper()
	z := html.NewTokenizer(strings.NewReader(body))
	scripts := 0
	for {
		tt := z.Next()
		if tt == html.ErrorToken {
			require.ErrorIs(t, z.Err(), io.EOF)
			break
		}
		if tt != html.StartTagToken && tt != html.SelfClosingTagToken {
			continue
		}
		tok := z.Token()
		if tok.Data == "script" {
			scripts++
			require.Len(t, tok.Attr, 2, "%s: script %v", page, tok.Attr)
		}
		for _, a := range tok.Attr {
			assert.False(t, strings.HasPrefix(strings.ToLower(a.Key), "on"), "%s: <%s %s=%q>", page, tok.Data, a.Key, a.Val)
			if a.Key == "href" || a.Key == "src" || a.Key == "action" {
				assert.True(t, strings.HasPrefix(a.Val, "/"), "%s: <%s %s=%q> is local", page, tok.Data, a.Key, a.Val)
			}
		}
	}
	assert.Equal(t, 1, scripts, "%s: only app.js", page)
}

// Refusals carry no data: no token, an unknown token, a user allowed
// nothing, and a user allowed only the Fleet.
func TestRefusalsCarryNoData(t *testing.T) {
	const marker = "marker-zq9"
	srv := newTestDashboard(t, demoWorld(marker, testNow), writeAuditLog(t, marker))
	for _, v := range AllViews {
		for _, tc := range []struct {
			token string
			code  int
		}{{"", http.StatusUnauthorized}, {"garbage", http.StatusUnauthorized}, {"nobody-token", http.StatusForbidden}, {"fleet-token", http.StatusForbidden}} {
			if tc.token == "fleet-token" && v == ViewFleet {
				code, body, _ := get(t, srv, "/fleet", tc.token)
				assert.Equal(t, http.StatusOK, code)
				assert.Contains(t, body, marker)
				continue
			}
			for _, p := range []string{"/" + string(v), "/api/v1/" + string(v)} {
				code, body, _ := get(t, srv, p, tc.token)
				assert.Equal(t, tc.code, code, "%s with %q", p, tc.token)
				assert.NotContains(t, body, marker, "%s with %q", p, tc.token)
				assert.NotContains(t, body, "cluster-1", "%s with %q", p, tc.token)
			}
		}
	}
	// The what-if is refused the same way, before its form is read.
	for _, tok := range []string{"", "nobody-token", "fleet-token"} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/access/whatif", strings.NewReader("without=accesspolicy/relaymesh/x"))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Contains(t, []int{401, 403}, resp.StatusCode)
		assert.NotContains(t, string(b), marker)
	}
}

// Sign-in: a form post sets an HttpOnly, SameSite=Strict cookie that then
// authenticates; a cross-site post is refused; the what-if and sign-out
// need the session's form token, which the session's pages carry.
func TestSessionCookieAndCSRF(t *testing.T) {
	srv := newTestDashboard(t, demoWorld("", testNow), "")
	c := srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	post := func(path string, form url.Values, hdr map[string]string, cookie *http.Cookie) *http.Response {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if cookie != nil {
			req.AddCookie(cookie)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := post("/login", url.Values{"token": {"wrong"}}, nil, nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Empty(t, resp.Cookies())

	resp = post("/login", url.Values{"token": {"viewer-token"}, "next": {"https://evil.example/"}}, map[string]string{"Sec-Fetch-Site": "cross-site"}, nil)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "cross-site sign-in refused")
	assert.Empty(t, resp.Cookies())
	resp = post("/login", url.Values{"token": {"viewer-token"}}, map[string]string{"Origin": "https://evil.example"}, nil)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "foreign Origin refused")

	resp = post("/login", url.Values{"token": {"viewer-token"}, "next": {"https://evil.example/"}}, map[string]string{"Sec-Fetch-Site": "same-origin"}, nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/fleet", resp.Header.Get("Location"), "never a redirect elsewhere")
	require.Len(t, resp.Cookies(), 1)
	ck := resp.Cookies()[0]
	assert.True(t, ck.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	assert.NotContains(t, ck.Value, "viewer-token")

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/trust", nil)
	req.AddCookie(ck)
	r2, err := c.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	require.Equal(t, http.StatusOK, r2.StatusCode)
	csrf := formToken(t, string(body))

	// The what-if with the cookie needs the form token.
	resp = post("/access/whatif", url.Values{"without": {"accesspolicy/relaymesh/productpage-to-reviews"}}, nil, ck)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp = post("/access/whatif", url.Values{"without": {"accesspolicy/relaymesh/productpage-to-reviews"}, "csrf": {"wrong"}}, nil, ck)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp = post("/access/whatif", url.Values{"without": {"accesspolicy/relaymesh/productpage-to-reviews"}, "csrf": {csrf}}, nil, ck)
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	resp = post("/logout", url.Values{"csrf": {"wrong"}}, nil, ck)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp = post("/logout", url.Values{"csrf": {csrf}}, nil, ck)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Len(t, resp.Cookies(), 1)
	assert.Equal(t, -1, resp.Cookies()[0].MaxAge)
}

// formToken is the csrf value of the first form of a page.
func formToken(t testing.TB, body string) string {
	t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, m, "the page carries a form token")
	return m[1]
}

// The what-if shows the difference a removal makes, and refuses bad input
// with a clear error and no change.
func TestWhatIf(t *testing.T) {
	srv := newTestDashboard(t, demoWorld("", testNow), "")
	whatIf := func(form url.Values) (int, string) { return postWhatIf(t, srv, form) }
	code, body := whatIf(url.Values{"without": {"accesspolicy/relaymesh/productpage-to-reviews"}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "removed")
	assert.Contains(t, body, "cluster-1/bookinfo/bookinfo-productpage")

	for _, tc := range []struct{ form url.Values }{
		{url.Values{}},
		{url.Values{"without": {"nonsense"}}},
		{url.Values{"with": {"kind: Pod\napiVersion: v1\nmetadata: {name: x}"}}},
		{url.Values{"with": {": : :"}}},
		{url.Values{"with": {"apiVersion: networking.relaymesh.io/v1alpha1\nkind: VirtualMesh\nmetadata: {name: x, namespace: relaymesh}\nspec: {meshes: [{clusterName: c, namespace: istio-system, name: istiod}], globalAccessPolicy: Maybe}"}}},
	} {
		code, body := whatIf(tc.form)
		assert.Equal(t, http.StatusBadRequest, code, "%v: %s", tc.form, body)
		assert.Contains(t, body, `role="alert"`)
	}
	code, body = whatIf(url.Values{"with": {"apiVersion: networking.relaymesh.io/v1alpha1\nkind: VirtualMesh\nmetadata: {name: x, namespace: relaymesh}\nspec: {meshes: [{clusterName: c, namespace: istio-system, name: istiod}], globalAccessPolicy: Maybe}"}})
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, html.UnescapeString(body), `the API server would refuse it: document 1: VirtualMesh relaymesh/x: spec.globalAccessPolicy: Unsupported value: "Maybe"`)
	code, _ = whatIf(url.Values{"with": {strings.Repeat("x", maxWhatIf+1)}})
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
}

// Assets are embedded and served; nothing else under /assets/.
func TestAssets(t *testing.T) {
	srv := newTestDashboard(t, demoWorld("", testNow), "")
	for _, p := range []string{"/assets/app.js", "/assets/app.css"} {
		code, body, _ := get(t, srv, p, "")
		assert.Equal(t, http.StatusOK, code)
		assert.NotEmpty(t, body)
	}
	for _, p := range []string{"/assets/", "/assets/../dashboard.go", "/nothing"} {
		code, _, _ := get(t, srv, p, "viewer-token")
		assert.Equal(t, http.StatusNotFound, code, p)
	}
	js, err := os.ReadFile("assets/app.js")
	require.NoError(t, err)
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		assert.NotContains(t, string(js), sink)
	}
}

// refusedAllowAll is an AccessPolicy selecting every source and
// destination without the opt-in: the server's admission refuses it.
const refusedAllowAll = `apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: allow-all, namespace: relaymesh}
spec:
  sourceSelector: [{kubeIdentityMatcher: {}}]
  destinationSelector: [{kubeServiceMatcher: {}}]
`

// The Access page and its what-if apply the server's admission and the
// statuses it wrote: a refused allow-all policy adds no pair to the demo's
// and leaves the demo's policy unshadowed (opted in, the same policy adds
// pairs); pasted, it adds nothing; a policy the server reports Invalid for
// its generation allows nothing either.
func TestAccessShowsOnlyWhatIsInForce(t *testing.T) {
	src := demoWorld("", testNow)
	matrix := func(srv *httptest.Server) (accessaudit.Matrix, map[string]string) {
		t.Helper()
		code, body, _ := get(t, srv, "/api/v1/access", "viewer-token")
		require.Equal(t, http.StatusOK, code, body)
		var api struct {
			Data struct {
				Matrix   accessaudit.Matrix
				Findings []accessaudit.Finding
			}
		}
		require.NoError(t, json.Unmarshal([]byte(body), &api))
		kinds := map[string]string{}
		for _, f := range api.Data.Findings {
			kinds[f.Objects[0]] += f.Kind + " "
		}
		return api.Data.Matrix, kinds
	}
	demo, _ := matrix(newTestDashboard(t, src, ""))
	require.NotEmpty(t, demo.Pairs)

	in := *src.In
	refused := translation.Input{}
	require.NoError(t, refused.Decode([]byte(refusedAllowAll)))
	serverInvalid := refused.AccessPolicies[0]
	serverInvalid.Name, serverInvalid.Generation = "team-refused", 3
	serverInvalid.Annotations = map[string]string{"relaymesh.io/allow-all": "true"}              // allowed by the default rules...
	serverInvalid.Status.State, serverInvalid.Status.ObservedGeneration = common.StateInvalid, 3 // ...refused by the server's
	serverInvalid.Status.Errors = []string{"refused by admission, so it is not translated: a team rule"}
	in.AccessPolicies = append(slices.Clone(in.AccessPolicies), refused.AccessPolicies[0], serverInvalid)
	srv := newTestDashboard(t, &StaticSource{KubernetesClusters: src.KubernetesClusters, In: &in, Rev: "2"}, "")
	got, kinds := matrix(srv)
	assert.Equal(t, demo.Pairs, got.Pairs, "the refused policies add no pair")
	assert.Equal(t, accessaudit.KindRefused+" ", kinds["AccessPolicy/relaymesh/allow-all"])
	// The server's verdict is an admission refusal too (by its rules).
	assert.Equal(t, accessaudit.KindRefused+" ", kinds["AccessPolicy/relaymesh/team-refused"])
	assert.NotContains(t, kinds["AccessPolicy/relaymesh/productpage-to-reviews"], accessaudit.KindShadowed, "the real policy is not shadowed")

	opted := in
	opted.AccessPolicies = slices.Clone(in.AccessPolicies)
	opted.AccessPolicies[len(opted.AccessPolicies)-2].Annotations = map[string]string{"relaymesh.io/allow-all": "true"}
	all, _ := matrix(newTestDashboard(t, &StaticSource{KubernetesClusters: src.KubernetesClusters, In: &opted, Rev: "3"}, ""))
	assert.Greater(t, len(all.Pairs), len(demo.Pairs), "opted in, the same policy is in force")

	code, page, _ := get(t, srv, "/access", "viewer-token")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, len(demo.Pairs), strings.Count(page, `class="edge `), "the graph draws the demo's pairs")

	// Pasting the refused policy into the what-if adds nothing.
	code, b := postWhatIf(t, srv, url.Values{"with": {strings.Replace(refusedAllowAll, "allow-all", "pasted", 1)}})
	require.Equal(t, http.StatusOK, code, b)
	assert.Contains(t, b, "0 pair(s) added")
	assert.Contains(t, b, "refused by admission")
}

// postWhatIf posts the what-if form as the viewer.
func postWhatIf(t *testing.T, srv *httptest.Server, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/access/whatif", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer viewer-token")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
