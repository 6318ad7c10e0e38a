package dashboard

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"k8s.io/apimachinery/pkg/util/duration"
)

// The session. A browser pastes its bearer token once; the server checks
// it with a TokenReview, keeps it in memory under a random session id, and
// gives the browser only that id, in a cookie it sends to this origin only
// (HttpOnly: no script reads it; SameSite=Strict: no other site's page
// makes the browser send it; over TLS Secure and __Host-, so it never
// travels in clear and no other host or path can set it). The token never
// leaves the server again. Every request checks the token again
// (TokenReview, cached for seconds), so a revoked token ends the session;
// a session also ends at the token's own expiry, after MaxLifetime, after
// IdleTimeout unused, and at sign-out.
//
// Sessions live in the memory of the replica that signed the browser in:
// tokens are never written to shared state. `relaymesh dashboard` forwards
// to one pod, so its browser always reaches that replica; behind a load
// balancer, make it sticky or sign in again when moved (see
// docs/dashboard.md).
const (
	// cookieName is the session cookie over plain HTTP (loopback only);
	// secureCookieName over TLS. The __Host- prefix makes a browser accept
	// the cookie only with Secure, Path=/ and no Domain, from this host.
	cookieName       = "relaymesh_dashboard"
	secureCookieName = "__Host-" + cookieName
	// sessionIDBytes is the entropy of a session id.
	sessionIDBytes = 32
	// maxForm bounds a login or logout form (a token is at most
	// kubeauth.MaxTokenBytes).
	maxForm = 32 << 10
	// maxWhatIf bounds a what-if form (the pasted policy YAML).
	maxWhatIf = 1 << 20
)

// SessionConfig bounds the sign-in sessions.
type SessionConfig struct {
	// IdleTimeout ends a session unused this long; default 30m.
	IdleTimeout time.Duration
	// MaxLifetime ends a session this long after sign-in at the latest;
	// the token's own expiry (its exp claim) ends it sooner. Default 8h.
	MaxLifetime time.Duration
	// MaxSessions bounds the sessions a replica holds (default 10,000):
	// beyond, sign-in is refused until some end. MaxPerUser bounds one
	// user's (default 16): a new one ends that user's least recently used.
	MaxSessions, MaxPerUser int
}

// Default fills what is unset.
func (c SessionConfig) Default() SessionConfig {
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 30 * time.Minute
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = 8 * time.Hour
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 10000
	}
	if c.MaxPerUser == 0 {
		c.MaxPerUser = 16
	}
	return c
}

// Validate reports every bad field.
func (c SessionConfig) Validate() error {
	var errs []error
	if c.IdleTimeout < 0 {
		errs = append(errs, errors.New("dashboard: Sessions.IdleTimeout must not be negative"))
	}
	if c.MaxLifetime < 0 {
		errs = append(errs, errors.New("dashboard: Sessions.MaxLifetime must not be negative"))
	}
	if c.MaxSessions < 0 || c.MaxPerUser < 0 {
		errs = append(errs, errors.New("dashboard: Sessions.MaxSessions and MaxPerUser must not be negative"))
	}
	return errors.Join(errs...)
}

// Errors of sessions.
var (
	// errNoSession: the request carries no session cookie.
	errNoSession = errors.New("no session")
	// errSessionEnded: the cookie names no live session (ended, or held by
	// another replica).
	errSessionEnded = errors.New("session ended")
	// errMalformedSession: the cookie is not a session id this server
	// could have made.
	errMalformedSession = errors.New("malformed session cookie")
	// errTooManySessions: the replica holds MaxSessions.
	errTooManySessions = errors.New("too many sessions")
)

// sessionKey is how a session is stored: the SHA-256 of its id, so a
// lookup compares no secret byte by byte and memory holds no cookie.
type sessionKey [sha256.Size]byte

// session is one signed-in browser.
type session struct {
	token string
	user  string
	// csrf is the form token of the session's pages.
	csrf                   string
	created, used, expires time.Time
}

// sessions holds a replica's sessions. Safe for concurrent use.
type sessions struct {
	cfg   SessionConfig
	rand  io.Reader
	clock func() time.Time

	mu   sync.Mutex
	byID map[sessionKey]*session
}

func newSessions(cfg SessionConfig, rand io.Reader, clock func() time.Time) *sessions {
	return &sessions{cfg: cfg, rand: rand, clock: clock, byID: map[sessionKey]*session{}}
}

// parseSessionID checks that v is a session id this server could have
// made (sessionIDBytes of base64url, no padding) and returns its key.
func parseSessionID(v string) (sessionKey, error) {
	if len(v) != base64.RawURLEncoding.EncodedLen(sessionIDBytes) {
		return sessionKey{}, errMalformedSession
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(v)
	if err != nil || len(raw) != sessionIDBytes {
		return sessionKey{}, errMalformedSession
	}
	return sha256.Sum256(raw), nil
}

// random returns n bytes of s.rand as base64url.
func (s *sessions) random(n int) (string, []byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(s.rand, b); err != nil {
		return "", nil, fmt.Errorf("session randomness: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), b, nil
}

// create starts a session for user's token, ending no later than
// tokenExpires (zero: the token names no expiry), and returns its id.
func (s *sessions) create(token, user string, tokenExpires time.Time) (string, *session, error) {
	id, raw, err := s.random(sessionIDBytes)
	if err != nil {
		return "", nil, err
	}
	csrf, _, err := s.random(sessionIDBytes)
	if err != nil {
		return "", nil, err
	}
	now := s.clock()
	sess := &session{token: token, user: user, csrf: csrf, created: now, used: now, expires: now.Add(s.cfg.MaxLifetime)}
	if !tokenExpires.IsZero() && tokenExpires.Before(sess.expires) {
		sess.expires = tokenExpires
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now)
	// A user at MaxPerUser loses the least recently used session.
	var oldest sessionKey
	var oldestUsed time.Time
	n := 0
	for k, o := range s.byID {
		if o.user != user {
			continue
		}
		if n == 0 || o.used.Before(oldestUsed) {
			oldest, oldestUsed = k, o.used
		}
		n++
	}
	switch {
	case n > 0 && n >= s.cfg.MaxPerUser:
		delete(s.byID, oldest)
	case len(s.byID) >= s.cfg.MaxSessions:
		return "", nil, errTooManySessions
	}
	s.byID[sha256.Sum256(raw)] = sess
	c := *sess
	return id, &c, nil
}

// get returns the live session of key and marks it used; an expired one
// is ended.
func (s *sessions) get(key sessionKey) (*session, error) {
	now := s.clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.byID[key]
	if !ok {
		return nil, errSessionEnded
	}
	if s.expiredLocked(sess, now) {
		delete(s.byID, key)
		return nil, errSessionEnded
	}
	sess.used = now
	c := *sess
	return &c, nil
}

// end ends the session of key, if there is one.
func (s *sessions) end(key sessionKey) {
	s.mu.Lock()
	delete(s.byID, key)
	s.mu.Unlock()
}

// count is the number of live sessions.
func (s *sessions) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(s.clock())
	return len(s.byID)
}

func (s *sessions) expiredLocked(sess *session, now time.Time) bool {
	return !now.Before(sess.expires) || now.Sub(sess.used) >= s.cfg.IdleTimeout
}

func (s *sessions) sweepLocked(now time.Time) {
	for k, sess := range s.byID {
		if s.expiredLocked(sess, now) {
			delete(s.byID, k)
		}
	}
}

// sessionCookieName is the session cookie's name on r's connection.
func sessionCookieName(r *http.Request) string {
	if r.TLS != nil {
		return secureCookieName
	}
	return cookieName
}

// sessionCookie returns the key of r's session cookie. Exactly one cookie
// of the name is accepted: two are someone trying to make the browser
// send theirs.
func sessionCookie(r *http.Request) (sessionKey, error) {
	cs := r.CookiesNamed(sessionCookieName(r))
	switch len(cs) {
	case 0:
		return sessionKey{}, errNoSession
	case 1:
		return parseSessionID(cs[0].Value)
	default:
		return sessionKey{}, errMalformedSession
	}
}

// hasSessionCookie says whether r carries a cookie of the session's name.
func hasSessionCookie(r *http.Request) bool {
	return len(r.CookiesNamed(sessionCookieName(r))) > 0
}

func setSession(w http.ResponseWriter, r *http.Request, id string) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookieName(r), Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

func clearSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookieName(r), Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// checkCSRF says whether a form posted with a session's cookie carries
// the session's form token. Requests authenticated by an Authorization
// header need none (csrf is then empty and fromCookie false): no browser
// adds that header on its own.
func checkCSRF(r *http.Request, csrf string, fromCookie bool) bool {
	if !fromCookie {
		return true
	}
	got := r.PostFormValue("csrf")
	return csrf != "" && subtle.ConstantTimeCompare([]byte(got), []byte(csrf)) == 1
}

// loginData is the login page's.
type loginData struct {
	// Next is the view to go to after signing in.
	Next string
	// Namespace and Audience make the page's example token command.
	Namespace, Audience string
	// Idle is how long an unused session lasts.
	Idle string
}

// nextView returns the local path of a view named by next, else /fleet:
// never a URL that leads elsewhere.
func nextView(next string) string {
	for _, v := range AllViews {
		if next == "/"+string(v) {
			return next
		}
	}
	return "/fleet"
}

// loginPage renders the sign-in form with msg and status.
func (d *Dashboard) loginPage(w http.ResponseWriter, status int, msg, next string) {
	d.render(w, status, "login", &pageData{Title: "Sign in", Message: msg, Data: loginData{Next: nextView(next), Namespace: d.cfg.Namespace, Audience: d.cfg.Audience,
		Idle: duration.HumanDuration(d.cfg.Sessions.IdleTimeout)}})
}

func (d *Dashboard) showLogin(w http.ResponseWriter, r *http.Request) {
	d.loginPage(w, http.StatusOK, "", r.URL.Query().Get("next"))
}

// login checks the pasted token with a TokenReview (for the dashboard's
// audience) and starts a session. The form is same-origin only
// (CrossOriginProtection), so no other site can sign a browser in as
// someone else. A refused sign-in starts no session.
func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		d.loginPage(w, http.StatusBadRequest, "The form could not be read.", "")
		return
	}
	next := r.PostFormValue("next")
	token := strings.TrimSpace(r.PostFormValue("token"))
	switch {
	case token == "":
		d.loginPage(w, http.StatusUnauthorized, "Paste a token.", next)
		return
	case len(token) > kubeauth.MaxTokenBytes:
		d.loginPage(w, http.StatusBadRequest, fmt.Sprintf("This token is longer than %d bytes.", kubeauth.MaxTokenBytes), next)
		return
	case strings.ContainsAny(token, " \t\r\n"):
		d.loginPage(w, http.StatusUnauthorized, "A token is one word, without spaces or line breaks.", next)
		return
	}
	user, err := d.cfg.Auth.Authenticate(r.Context(), token)
	switch {
	case errors.Is(err, kubeauth.ErrUnauthenticated):
		d.signIns.WithLabelValues("refused").Inc()
		d.log.Info("dashboard sign-in refused: token not accepted", "peer", r.RemoteAddr)
		d.loginPage(w, http.StatusUnauthorized, fmt.Sprintf("The management cluster does not accept this token for the audience %s (wrong, expired, or minted for another audience).", d.cfg.Audience), next)
		return
	case err != nil:
		d.signIns.WithLabelValues("unavailable").Inc()
		d.loginPage(w, http.StatusServiceUnavailable, "The management cluster's apiserver could not check the token; try again.", next)
		return
	}
	expires, _ := kubeauth.Expiry(token)
	if key, err := sessionCookie(r); err == nil {
		d.sessions.end(key) // signing in again replaces the browser's session
	}
	id, _, err := d.sessions.create(token, user.Username, expires)
	if err != nil {
		d.signIns.WithLabelValues("unavailable").Inc()
		d.log.Warn("dashboard sign-in refused: no session could be started", "user", user.Username, "error", err)
		d.loginPage(w, http.StatusServiceUnavailable, "This server cannot start another session now; try again later.", next)
		return
	}
	d.signIns.WithLabelValues("success").Inc()
	d.log.Info("dashboard sign-in", "user", user.Username, "peer", r.RemoteAddr)
	setSession(w, r, id)
	http.Redirect(w, r, nextView(next), http.StatusSeeOther)
}

// logout ends the session; it needs the session's form token, so no other
// page can sign the user out.
func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	key, err := sessionCookie(r)
	if err == nil {
		sess, err := d.sessions.get(key)
		if err == nil && !checkCSRF(r, sess.csrf, true) {
			http.Error(w, "form token missing or wrong", http.StatusForbidden)
			return
		}
		d.sessions.end(key)
	}
	clearSession(w, r)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
