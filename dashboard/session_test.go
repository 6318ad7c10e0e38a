package dashboard

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// jwtToken is a token shaped like a service account token that expires at
// exp (only the claim matters to the dashboard; the fake Authorizer checks
// nothing else).
func jwtToken(exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"exp":`+strconv.FormatInt(exp.Unix(), 10)+`}`)) + ".c2ln"
}

// sessionWorld is a dashboard over TLS (or not) with a settable clock and
// the session bounds given.
type sessionWorld struct {
	t     *testing.T
	srv   *httptest.Server
	d     *Dashboard
	clock *clock
	auth  tokenAuth
}

func newSessionWorld(t *testing.T, tls bool, bounds SessionConfig) *sessionWorld {
	t.Helper()
	c := &clock{now: testNow}
	auth := tokenAuth{
		users: map[string]string{"viewer-token": "viewer", "other-token": "other", jwtToken(testNow.Add(time.Hour)): "viewer"},
		allow: map[string]map[string]bool{"viewer": {"*": true}, "other": {"*": true}},
	}
	d, err := New(Config{Namespace: "relaymesh", Source: demoWorld("", testNow), Auth: auth, Sessions: bounds, Clock: c.Now})
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(d)
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return &sessionWorld{t: t, srv: srv, d: d, clock: c, auth: auth}
}

func (w *sessionWorld) do(method, path string, form url.Values, cookies ...*http.Cookie) (*http.Response, string) {
	w.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, w.srv.URL+path, body)
	require.NoError(w.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	c := w.srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	require.NoError(w.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(w.t, err)
	return resp, string(b)
}

// signIn signs in with token and returns the session cookie.
func (w *sessionWorld) signIn(token string) *http.Cookie {
	w.t.Helper()
	resp, body := w.do(http.MethodPost, "/login", url.Values{"token": {token}})
	require.Equal(w.t, http.StatusSeeOther, resp.StatusCode, body)
	require.Len(w.t, resp.Cookies(), 1)
	return resp.Cookies()[0]
}

// page GETs /trust with cookies and returns the status.
func (w *sessionWorld) page(cookies ...*http.Cookie) (int, string) {
	w.t.Helper()
	resp, body := w.do(http.MethodGet, "/trust", nil, cookies...)
	return resp.StatusCode, body
}

// The cookie is an opaque random id, never the token or anything computed
// from it: over TLS named __Host-, Secure, HttpOnly, SameSite=Strict,
// Path=/; two sign-ins with one token get unrelated ids.
func TestSessionCookieIsAnOpaqueIDNotTheToken(t *testing.T) {
	for _, tls := range []bool{true, false} {
		w := newSessionWorld(t, tls, SessionConfig{})
		const token = "viewer-token"
		a, b := w.signIn(token), w.signIn(token)
		for _, ck := range []*http.Cookie{a, b} {
			assert.True(t, ck.HttpOnly)
			assert.Equal(t, http.SameSiteStrictMode, ck.SameSite)
			assert.Equal(t, "/", ck.Path)
			assert.Empty(t, ck.Domain)
			assert.Equal(t, tls, ck.Secure, "Secure exactly when served over TLS")
			if tls {
				assert.Equal(t, "__Host-relaymesh_dashboard", ck.Name)
			} else {
				assert.Equal(t, "relaymesh_dashboard", ck.Name)
			}
			notDerived(t, ck.Value, token)
			raw, err := base64.RawURLEncoding.DecodeString(ck.Value)
			require.NoError(t, err)
			assert.Len(t, raw, 32, "256 bits from crypto/rand")
		}
		assert.NotEqual(t, a.Value, b.Value)
		code, _ := w.page(a)
		assert.Equal(t, http.StatusOK, code)
	}
}

// notDerived fails when value is token, holds it, or is one of its usual
// encodings or hashes.
func notDerived(t *testing.T, value, token string) {
	t.Helper()
	sum := sha256.Sum256([]byte(token))
	csrfSum := sha256.Sum256([]byte("relaymesh-dashboard-csrf\x00" + token))
	for _, d := range []string{token, base64.StdEncoding.EncodeToString([]byte(token)), base64.RawURLEncoding.EncodeToString([]byte(token)),
		hex.EncodeToString(sum[:]), base64.RawURLEncoding.EncodeToString(sum[:]), base64.RawURLEncoding.EncodeToString(csrfSum[:])} {
		assert.NotContains(t, value, d)
	}
}

// Cookies the server did not make are refused with the sign-in form and
// change nothing: the live session stays, no session is added.
func TestHostileSessionCookiesChangeNothing(t *testing.T) {
	w := newSessionWorld(t, true, SessionConfig{})
	good := w.signIn("viewer-token")
	name := good.Name
	unknown := base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	for label, cookies := range map[string][]*http.Cookie{
		"empty":                  {{Name: name, Value: ""}},
		"the token itself":       {{Name: name, Value: "viewer-token"}},
		"short":                  {{Name: name, Value: good.Value[:42]}},
		"long":                   {{Name: name, Value: good.Value + "A"}},
		"padded":                 {{Name: name, Value: good.Value[:40] + "=="}},
		"standard base64":        {{Name: name, Value: strings.Repeat("+", 43)}},
		"oversized":              {{Name: name, Value: strings.Repeat("A", 4000)}},
		"unknown id":             {{Name: name, Value: unknown}},
		"two of the name":        {{Name: name, Value: unknown}, good},
		"the plain-HTTP name":    {{Name: cookieName, Value: good.Value}},
		"a lookalike name":       {{Name: name + "x", Value: good.Value}},
		"the id's hash as an id": {{Name: name, Value: base64.RawURLEncoding.EncodeToString(func() []byte { k, _ := parseSessionID(good.Value); return k[:] }())}},
	} {
		before := w.d.sessions.count()
		code, body := w.page(cookies...)
		assert.Equal(t, http.StatusUnauthorized, code, label)
		assert.Contains(t, body, `id="token"`, "%s: the sign-in form", label)
		assert.NotContains(t, body, "bookinfo-federation", label)
		assert.Equal(t, before, w.d.sessions.count(), "%s: no session added or ended", label)
		code, _ = w.page(good)
		assert.Equal(t, http.StatusOK, code, "%s: the real session still works", label)
	}
	// A raw Cookie header the parser must cope with.
	for _, h := range []string{name + "=" + strings.Repeat("x", 60<<10), name + "=;;;" + name + "=", "=" + good.Value, name} {
		req, err := http.NewRequest(http.MethodGet, w.srv.URL+"/trust", nil)
		require.NoError(t, err)
		req.Header.Set("Cookie", h)
		resp, err := w.srv.Client().Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Contains(t, []int{http.StatusUnauthorized, http.StatusRequestHeaderFieldsTooLarge}, resp.StatusCode, "%.40q", h)
	}
	assert.Equal(t, 1, w.d.sessions.count())
}

// A session ends after IdleTimeout unused, at MaxLifetime, at its token's
// expiry (exp), and when the token is no longer accepted; an ended
// session's cookie signs nobody in and the page says why.
func TestSessionsExpire(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		w := newSessionWorld(t, true, SessionConfig{IdleTimeout: 10 * time.Minute, MaxLifetime: time.Hour})
		ck := w.signIn("viewer-token")
		w.clock.Add(9 * time.Minute)
		code, _ := w.page(ck)
		require.Equal(t, http.StatusOK, code, "used within the idle timeout")
		w.clock.Add(9 * time.Minute)
		code, _ = w.page(ck)
		require.Equal(t, http.StatusOK, code, "each use restarts the idle timeout")
		w.clock.Add(10 * time.Minute)
		code, body := w.page(ck)
		assert.Equal(t, http.StatusUnauthorized, code)
		assert.Contains(t, body, "Your session ended")
		assert.Equal(t, 0, w.d.sessions.count())
	})
	t.Run("lifetime", func(t *testing.T) {
		w := newSessionWorld(t, true, SessionConfig{IdleTimeout: 10 * time.Minute, MaxLifetime: 25 * time.Minute})
		ck := w.signIn("viewer-token")
		for range 2 {
			w.clock.Add(9 * time.Minute)
			code, _ := w.page(ck)
			require.Equal(t, http.StatusOK, code)
		}
		w.clock.Add(9 * time.Minute)
		code, _ := w.page(ck)
		assert.Equal(t, http.StatusUnauthorized, code, "in use, but past MaxLifetime")
	})
	t.Run("the token's expiry", func(t *testing.T) {
		w := newSessionWorld(t, true, SessionConfig{IdleTimeout: 2 * time.Hour, MaxLifetime: 8 * time.Hour})
		ck := w.signIn(jwtToken(testNow.Add(time.Hour)))
		w.clock.Add(59 * time.Minute)
		code, _ := w.page(ck)
		require.Equal(t, http.StatusOK, code)
		w.clock.Add(time.Minute)
		code, _ = w.page(ck)
		assert.Equal(t, http.StatusUnauthorized, code, "the session ends with its token")
	})
	t.Run("the token revoked", func(t *testing.T) {
		w := newSessionWorld(t, true, SessionConfig{})
		ck := w.signIn("other-token")
		delete(w.auth.users, "other-token")
		code, body := w.page(ck)
		assert.Equal(t, http.StatusUnauthorized, code)
		assert.Contains(t, body, "no longer accepted")
		assert.Equal(t, 0, w.d.sessions.count(), "the session is ended, not kept for the token to come back")
	})
}

// Sign-out ends the session on the server: the same cookie, replayed,
// signs nobody in.
func TestSignOutEndsTheSessionOnTheServer(t *testing.T) {
	w := newSessionWorld(t, true, SessionConfig{})
	ck := w.signIn("viewer-token")
	other := w.signIn("other-token")
	code, body := w.page(ck)
	require.Equal(t, http.StatusOK, code)
	resp, _ := w.do(http.MethodPost, "/logout", url.Values{"csrf": {formToken(t, body)}}, ck)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	code, _ = w.page(ck)
	assert.Equal(t, http.StatusUnauthorized, code, "the replayed cookie is refused")
	code, _ = w.page(other)
	assert.Equal(t, http.StatusOK, code, "another session is untouched")
	assert.Equal(t, 1, w.d.sessions.count())
	// Another session's form token does not sign this one out.
	_, otherBody := w.page(other)
	third := w.signIn("viewer-token")
	resp, _ = w.do(http.MethodPost, "/logout", url.Values{"csrf": {formToken(t, otherBody)}}, third)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
}

// One user's sessions are bounded (the least recently used ends); all
// sessions are bounded (sign-in is refused, nothing is ended).
func TestSessionBounds(t *testing.T) {
	w := newSessionWorld(t, true, SessionConfig{MaxPerUser: 2, MaxSessions: 3})
	a := w.signIn("viewer-token")
	b := w.signIn("viewer-token")
	w.clock.Add(time.Second)
	code, _ := w.page(a) // a is now used more recently than b
	require.Equal(t, http.StatusOK, code)
	c := w.signIn("viewer-token")
	code, _ = w.page(b)
	assert.Equal(t, http.StatusUnauthorized, code, "the viewer's least recently used session ended")
	for _, ck := range []*http.Cookie{a, c} {
		code, _ = w.page(ck)
		assert.Equal(t, http.StatusOK, code)
	}
	o := w.signIn("other-token")
	require.Equal(t, 3, w.d.sessions.count())
	resp, body := w.do(http.MethodPost, "/login", url.Values{"token": {"other-token"}})
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a session beyond MaxSessions is refused")
	assert.Empty(t, resp.Cookies())
	assert.Contains(t, body, "cannot start another session")
	for _, ck := range []*http.Cookie{a, c, o} {
		code, _ = w.page(ck)
		assert.Equal(t, http.StatusOK, code, "a refused sign-in ends no one's session")
	}
}

// parseSessionID accepts exactly the ids the server makes.
func TestParseSessionID(t *testing.T) {
	w := newSessionWorld(t, true, SessionConfig{})
	id, _, err := w.d.sessions.create("t", "u", time.Time{})
	require.NoError(t, err)
	_, err = parseSessionID(id)
	require.NoError(t, err)
	for _, bad := range []string{"", id[:42], id + "A", id[:42] + "=", strings.Repeat("/", 43), strings.Repeat("A", 42) + "B"} {
		_, err := parseSessionID(bad)
		assert.ErrorIs(t, err, errMalformedSession, "%q", bad)
	}
}

// FuzzSessionCookie: whatever Cookie header a client sends, reading the
// session never panics, and accepts only one well-formed id of the
// cookie's name, which round-trips.
func FuzzSessionCookie(f *testing.F) {
	id := base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	f.Add("relaymesh_dashboard=" + id)
	f.Add("__Host-relaymesh_dashboard=" + id)
	f.Add("relaymesh_dashboard=" + id + "; relaymesh_dashboard=" + id)
	f.Add("relaymesh_dashboard=\"" + id + "\"")
	f.Add("relaymesh_dashboard=a; b=c")
	f.Fuzz(func(t *testing.T, header string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Cookie", header)
		key, err := sessionCookie(r)
		if err != nil {
			return
		}
		cs := r.CookiesNamed(cookieName)
		require.Len(t, cs, 1)
		raw, derr := base64.RawURLEncoding.Strict().DecodeString(cs[0].Value)
		require.NoError(t, derr)
		require.Len(t, raw, sessionIDBytes)
		require.Equal(t, sha256.Sum256(raw), [32]byte(key))
	})
}

// FuzzParseSessionID: any string parses only when it is the encoding of a
// 32-byte id, and every such encoding parses.
func FuzzParseSessionID(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef"), "x")
	f.Fuzz(func(t *testing.T, raw []byte, s string) {
		if len(raw) == sessionIDBytes {
			_, err := parseSessionID(base64.RawURLEncoding.EncodeToString(raw))
			require.NoError(t, err)
		}
		if _, err := parseSessionID(s); err == nil {
			b, err := base64.RawURLEncoding.Strict().DecodeString(s)
			require.NoError(t, err)
			require.Len(t, b, sessionIDBytes)
			require.Equal(t, base64.RawURLEncoding.EncodeToString(b), s)
		}
	})
}

// Session ids come from the injected randomness, which fails closed.
func TestSessionRandomnessFailureStartsNoSession(t *testing.T) {
	s := newSessions(SessionConfig{}.Default(), io.LimitReader(rand.Reader, 40), time.Now)
	_, _, err := s.create("t", "u", time.Time{})
	require.Error(t, err)
	assert.Equal(t, 0, s.count())
}
