package dashboard_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/check"
	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/test/e2e"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The session tests of TestDashboard, against the real server process.

// exchange is one request to a dashboard and its answer.
type exchange struct {
	code    int
	body    string
	cookies []*http.Cookie
	// setCookie is the raw Set-Cookie headers.
	setCookie []string
}

// send posts form (nil: GET) to base+path with cookies, through client.
func send(t *testing.T, client *http.Client, base, method, path string, form url.Values, cookies ...*http.Cookie) exchange {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, base+path, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return exchange{code: resp.StatusCode, body: string(b), cookies: resp.Cookies(), setCookie: resp.Header.Values("Set-Cookie")}
}

// metric reads a metric of the server's ops port (summed over labels
// containing match).
func metric(t *testing.T, opsAddr, name, match string) float64 {
	t.Helper()
	v, err := e2e.MetricWith("http://"+opsAddr+"/metrics", name, match)
	require.NoError(t, err)
	return v
}

// formToken is the csrf value of a page's first form.
func formToken(t *testing.T, body string) string {
	t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, m, "the page carries a form token")
	return m[1]
}

// noTokenIn fails when any Set-Cookie header holds the token or a usual
// encoding or hash of it.
func noTokenIn(t *testing.T, setCookie []string, token string) {
	t.Helper()
	sum := sha256.Sum256([]byte(token))
	for _, h := range setCookie {
		for _, d := range []string{token, token[:32], base64.StdEncoding.EncodeToString([]byte(token)), base64.RawURLEncoding.EncodeToString([]byte(token)),
			hex.EncodeToString(sum[:]), base64.RawURLEncoding.EncodeToString(sum[:])} {
			assert.NotContains(t, h, d, "Set-Cookie carries the token")
		}
	}
}

// sessions: the cookie is a random id, never the token; a token for
// another audience signs no one in and starts no session; cookies the
// server did not make change nothing; sign-out ends the session on the
// server.
func (w *world) sessions(t *testing.T) {
	sessions := func() float64 { return metric(t, w.opsAddr, dashboard.MetricSessions, "") }
	refused := func() float64 { return metric(t, w.opsAddr, dashboard.MetricSignIns, `result="refused"`) }
	token := w.tokens["viewer"]

	// Tokens of the viewer for other audiences: 401, no cookie, no session.
	before, refusedBefore := sessions(), refused()
	for name, tok := range map[string]string{"istio-ca": w.mint(t, "viewer", "istio-ca"), "the apiserver's own": w.mint(t, "viewer")} {
		x := send(t, w.client, w.url, http.MethodPost, "/login", url.Values{"token": {tok}})
		assert.Equal(t, http.StatusUnauthorized, x.code, name)
		assert.Contains(t, x.body, "minted for another audience", name)
		assert.Empty(t, x.setCookie, name)
		code, body := w.do(t, http.MethodGet, "/api/v1/fleet", tok, nil)
		assert.Equal(t, http.StatusUnauthorized, code, "%s as a header", name)
		assert.NotContains(t, body, "cluster-1", name)
	}
	assert.Equal(t, before, sessions(), "no session was created")
	assert.Equal(t, refusedBefore+2, refused(), "both refusals counted")

	// The dashboard's token is no credential for the apiserver itself.
	cfg := rest.AnonymousClientConfig(w.mgmt.RESTConfig())
	cfg.BearerToken = token
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = cs.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	assert.True(t, apierrors.IsUnauthorized(err), "the apiserver refuses a token for the dashboard's audience: %v", err)

	// The viewer's token: a random id in a Secure __Host- cookie.
	x := send(t, w.client, w.url, http.MethodPost, "/login", url.Values{"token": {token}})
	require.Equal(t, http.StatusSeeOther, x.code, x.body)
	require.Len(t, x.cookies, 1)
	ck := x.cookies[0]
	assert.Equal(t, "__Host-relaymesh_dashboard", ck.Name)
	assert.True(t, ck.Secure, "Secure over TLS")
	assert.True(t, ck.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	assert.Equal(t, "/", ck.Path)
	noTokenIn(t, x.setCookie, token)
	raw, err := base64.RawURLEncoding.DecodeString(ck.Value)
	require.NoError(t, err)
	assert.Len(t, raw, 32)
	again := send(t, w.client, w.url, http.MethodPost, "/login", url.Values{"token": {token}})
	require.Len(t, again.cookies, 1)
	assert.NotEqual(t, ck.Value, again.cookies[0].Value, "one token, unrelated ids")
	assert.Equal(t, before+2, sessions())

	page := send(t, w.client, w.url, http.MethodGet, "/trust", nil, ck)
	require.Equal(t, http.StatusOK, page.code)
	assert.NotContains(t, page.body, token, "the page does not carry the token either")

	// Cookies the server did not make: the sign-in form, no data, and no
	// session added or ended.
	unknown := base64.RawURLEncoding.EncodeToString(make([]byte, 32))
	for name, cookies := range map[string][]*http.Cookie{
		"the token as the cookie": {{Name: ck.Name, Value: token}},
		"malformed":               {{Name: ck.Name, Value: "../../etc/passwd"}},
		"oversized":               {{Name: ck.Name, Value: strings.Repeat("A", 8000)}},
		"an unknown id":           {{Name: ck.Name, Value: unknown}},
		"two ids":                 {{Name: ck.Name, Value: unknown}, ck},
		"the plain-HTTP name":     {{Name: "relaymesh_dashboard", Value: ck.Value}},
	} {
		n := sessions()
		x := send(t, w.client, w.url, http.MethodGet, "/trust", nil, cookies...)
		assert.Equal(t, http.StatusUnauthorized, x.code, name)
		assert.NotContains(t, x.body, "bookinfo-federation", name)
		assert.Equal(t, n, sessions(), "%s: no state change", name)
		assert.Equal(t, http.StatusOK, send(t, w.client, w.url, http.MethodGet, "/trust", nil, ck).code, "%s: the real session still works", name)
	}

	// Sign-out ends the session on the server: the cookie replayed is
	// refused.
	n := sessions()
	out := send(t, w.client, w.url, http.MethodPost, "/logout", url.Values{"csrf": {formToken(t, page.body)}}, ck)
	require.Equal(t, http.StatusSeeOther, out.code)
	require.Len(t, out.cookies, 1)
	assert.Equal(t, -1, out.cookies[0].MaxAge)
	assert.Equal(t, n-1, sessions())
	replay := send(t, w.client, w.url, http.MethodGet, "/trust", nil, ck)
	assert.Equal(t, http.StatusUnauthorized, replay.code, "the replayed cookie signs nobody in")
	assert.Contains(t, replay.body, "Your session ended")
	send(t, w.client, w.url, http.MethodPost, "/logout", url.Values{"csrf": {formToken(t, send(t, w.client, w.url, http.MethodGet, "/trust", nil, again.cookies[0]).body)}}, again.cookies[0])
	assert.Equal(t, before, sessions())
}

// plainHTTPOffLoopback: the server refuses to start with a plain-HTTP
// dashboard on any address but loopback, naming the flag.
func (w *world) plainHTTPOffLoopback(t *testing.T) {
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0"} {
		_, err := e2e.Run(t, w.bin, "server", "--kubeconfig", w.mgmt.Kubeconfig, "--audit-log", filepath.Join(t.TempDir(), "audit.log"),
			"--listen", e2e.Addr(t), "--metrics-listen", e2e.Addr(t), "--metrics-plain-http", "--dashboard-listen", addr, "--dashboard-plain-http")
		require.Error(t, err, addr)
		assert.Contains(t, err.Error(), "--dashboard-plain-http is allowed only on a loopback --dashboard-listen", addr)
	}
}

// checkDashboard runs relaymesh check against the server of opsAddr and
// returns its dashboard result.
func (w *world) checkDashboard(t *testing.T, opsAddr string) check.Result {
	t.Helper()
	out, _ := e2e.Run(t, w.bin, "check", "--kubeconfig", w.mgmt.Kubeconfig, "--server-metrics-address", opsAddr, "--server-metrics-plain-http", "-o", "json")
	var r check.Report
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	var found []check.Result
	for _, res := range r.Results {
		if res.Area == check.AreaDashboard {
			found = append(found, res)
		}
	}
	require.Len(t, found, 1, "%+v", r.Results)
	return found[0]
}

// secondReplica starts another replica of the server whose dashboard
// serves a provided certificate and ends sessions after 10 s unused: its
// chain verifies against the provided CA, renewed files are served, the
// first replica's session is not its own (sessions are per replica), its
// own idles out, and check reports both replicas' transport.
func (w *world) secondReplica(t *testing.T) {
	res := w.checkDashboard(t, w.opsAddr)
	assert.Equal(t, check.OK, res.Severity, res.Message)
	assert.Contains(t, res.Message, "certificate from the relay CA")

	pki := newServingPKI(t)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(chain, key []byte) {
		require.NoError(t, os.WriteFile(keyPath+".new", key, 0o600))
		require.NoError(t, os.WriteFile(certPath+".new", chain, 0o600))
		require.NoError(t, os.Rename(keyPath+".new", keyPath))
		require.NoError(t, os.Rename(certPath+".new", certPath))
	}
	opsAddr, dashAddr := e2e.Addr(t), e2e.Addr(t)
	chain, key, leaf := pki.issue(e2e.Host(dashAddr))
	write(chain, key)
	e2e.Start(t, w.bin, w.dir, "server-2", "server", "--kubeconfig", w.mgmt.Kubeconfig, "--listen", e2e.Addr(t), "--metrics-listen", opsAddr, "--metrics-plain-http",
		"--dashboard-listen", dashAddr, "--dashboard-tls-cert", certPath, "--dashboard-tls-key", keyPath, "--dashboard-session-idle-timeout", "10s",
		"--audit-log", filepath.Join(dir, "audit.log"), "--server-dns-names", "localhost", "--server-ips", "127.0.0.1")
	e2e.Eventually(t, 2*time.Minute, "the second replica's health", func() (bool, string) {
		code, err := e2e.GetJSON("http://"+opsAddr+"/healthz", nil)
		return code == http.StatusOK, fmt.Sprint(code, err)
	})
	roots := x509.NewCertPool()
	roots.AddCert(pki.root.Cert)
	servedSerial := func() (string, error) {
		conn, err := tls.Dial("tcp", dashAddr, &tls.Config{RootCAs: roots, ServerName: e2e.Host(dashAddr), MinVersion: tls.VersionTLS12})
		if err != nil {
			return "", err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
	}
	var serial string
	e2e.Eventually(t, 30*time.Second, "the provided certificate, verified against its CA", func() (bool, string) {
		s, err := servedSerial()
		serial = s
		return err == nil, fmt.Sprint(err)
	})
	assert.Equal(t, leaf.SerialNumber.String(), serial)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	base := "https://" + dashAddr

	// The first replica's session is not this replica's.
	first := send(t, w.client, w.url, http.MethodPost, "/login", url.Values{"token": {w.tokens["viewer"]}})
	require.Len(t, first.cookies, 1)
	x := send(t, client, base, http.MethodGet, "/trust", nil, first.cookies[0])
	assert.Equal(t, http.StatusUnauthorized, x.code)
	assert.Contains(t, x.body, "started on another server replica")

	// Its own session works, then ends unused.
	own := send(t, client, base, http.MethodPost, "/login", url.Values{"token": {w.tokens["viewer"]}})
	require.Equal(t, http.StatusSeeOther, own.code, own.body)
	require.Len(t, own.cookies, 1)
	assert.True(t, own.cookies[0].Secure)
	// (No timing asserted before the idle timeout: on a loaded machine the
	// next request may come late. After it, the session must be gone.)
	time.Sleep(11 * time.Second)
	x = send(t, client, base, http.MethodGet, "/trust", nil, own.cookies[0])
	assert.Equal(t, http.StatusUnauthorized, x.code, "the session idled out")
	assert.Contains(t, x.body, "Your session ended")
	assert.Equal(t, float64(0), metric(t, opsAddr, dashboard.MetricSessions, ""))

	// Renewed files are served without a restart.
	chain, key, leaf = pki.issue(e2e.Host(dashAddr))
	write(chain, key)
	e2e.Eventually(t, 30*time.Second, "the renewed certificate served", func() (bool, string) {
		s, err := servedSerial()
		return err == nil && s == leaf.SerialNumber.String(), fmt.Sprint(s, err)
	})

	res = w.checkDashboard(t, opsAddr)
	assert.Equal(t, check.OK, res.Severity, res.Message)
	assert.Contains(t, res.Message, "provided certificate")
	send(t, w.client, w.url, http.MethodPost, "/logout", url.Values{"csrf": {formToken(t, send(t, w.client, w.url, http.MethodGet, "/trust", nil, first.cookies[0]).body)}}, first.cookies[0])
}
