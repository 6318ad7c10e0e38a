package dashboard

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	"github.com/relaymesh/relaymesh/internal/kubeauth"
)

// The session: the bearer token the user pasted, checked by TokenReview,
// in a cookie the browser sends to this origin only (HttpOnly: no script
// reads it; SameSite=Strict: no other site's page makes the browser send
// it; Secure when served over TLS). Every request checks the token again
// (TokenReview, cached for seconds), so a revoked or expired token ends the
// session.
const (
	cookieName = "relaymesh_dashboard"
	// maxCookieToken: a cookie holds about 4 KiB; a longer token (a large
	// OIDC token) cannot be kept, and must be sent as a header by a client.
	maxCookieToken = 3800
	// maxForm bounds a login or logout form.
	maxForm = 32 << 10
	// maxWhatIf bounds a what-if form (the pasted policy YAML).
	maxWhatIf = 1 << 20
)

// errNoSession: the request carries no session cookie.
var errNoSession = errors.New("no session")

// sessionToken is the token of the session cookie.
func sessionToken(r *http.Request) (string, error) {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return "", errors.Join(kubeauth.ErrUnauthenticated, errNoSession)
	}
	if len(c.Value) > maxCookieToken || strings.ContainsAny(c.Value, " \t\r\n") {
		return "", kubeauth.ErrUnauthenticated
	}
	return c.Value, nil
}

func setSession(w http.ResponseWriter, r *http.Request, token string) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

func clearSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// csrfToken is the form token of a session: a hash of its bearer token
// under a label of its own. A page of another origin can neither read it
// nor compute it; it is the same on every replica.
func csrfToken(token string) string {
	sum := sha256.Sum256([]byte("relaymesh-dashboard-csrf\x00" + token))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// checkCSRF says whether a form posted with the session's cookie carries
// its token. Requests authenticated by an Authorization header need none:
// no browser adds that header on its own.
func checkCSRF(r *http.Request, token string, fromCookie bool) bool {
	if !fromCookie {
		return true
	}
	got := r.PostFormValue("csrf")
	return subtle.ConstantTimeCompare([]byte(got), []byte(csrfToken(token))) == 1
}

// loginData is the login page's.
type loginData struct {
	// Next is the view to go to after signing in.
	Next string
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

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, http.StatusOK, "login", &pageData{Title: "Sign in", Data: loginData{Next: nextView(r.URL.Query().Get("next"))}})
}

// login checks the pasted token with a TokenReview and keeps it in the
// session cookie. The form is same-origin only (CrossOriginProtection), so
// no other site can sign a browser in as someone else.
func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		d.render(w, http.StatusBadRequest, "login", &pageData{Title: "Sign in", Message: "The form could not be read.", Data: loginData{Next: "/fleet"}})
		return
	}
	next := nextView(r.PostFormValue("next"))
	token := strings.TrimSpace(r.PostFormValue("token"))
	refuse := func(status int, msg string) {
		d.render(w, status, "login", &pageData{Title: "Sign in", Message: msg, Data: loginData{Next: next}})
	}
	switch {
	case token == "":
		refuse(http.StatusUnauthorized, "Paste a token.")
		return
	case len(token) > maxCookieToken:
		refuse(http.StatusBadRequest, "This token is too long to keep in a browser session; send it in an Authorization header from a client instead.")
		return
	case strings.ContainsAny(token, " \t\r\n"):
		refuse(http.StatusUnauthorized, "A token is one word, without spaces or line breaks.")
		return
	}
	user, err := d.cfg.Auth.Authenticate(r.Context(), token)
	switch {
	case errors.Is(err, kubeauth.ErrUnauthenticated):
		d.log.Info("dashboard sign-in refused: token not accepted", "peer", r.RemoteAddr)
		refuse(http.StatusUnauthorized, "The management cluster does not accept this token (wrong, expired, or for another audience).")
		return
	case err != nil:
		refuse(http.StatusServiceUnavailable, "The management cluster's apiserver could not check the token; try again.")
		return
	}
	d.log.Info("dashboard sign-in", "user", user.Username, "peer", r.RemoteAddr)
	setSession(w, r, token)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the session; it needs the form token, so no other page can
// sign the user out.
func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	token, err := sessionToken(r)
	if err == nil && !checkCSRF(r, token, true) {
		http.Error(w, "form token missing or wrong", http.StatusForbidden)
		return
	}
	clearSession(w, r)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
