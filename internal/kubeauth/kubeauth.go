// Package kubeauth authenticates and authorizes HTTP callers the way the
// Kubernetes ecosystem does for its components' own endpoints: the caller
// presents a bearer token the management cluster's apiserver accepts (a
// service account token from `kubectl create token`, or an OIDC token the
// apiserver is configured for), the server checks it with a TokenReview,
// and authorizes every request with a SubjectAccessReview on a resource of
// the relaymesh.io group. Nothing is allowed without both; an apiserver
// that cannot be asked means no access (fail closed). Tokens are never
// logged, and only their SHA-256 is kept, in a short-lived cache.
//
// An Authenticator configured with Audiences accepts only tokens minted for
// one of them (`kubectl create token NAME --audience AUDIENCE`): the
// TokenReview asks for them, and its answer must name one, so a token for
// another service (istio-ca, the apiserver itself) or an authenticator that
// ignores audiences is refused.
package kubeauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Bounds of what a caller can make the server do.
const (
	// MaxTokenBytes bounds a bearer token; longer ones are refused unread.
	MaxTokenBytes = 16 << 10
	// defaultCacheTTL is how long a review's answer is reused.
	defaultCacheTTL = 10 * time.Second
	// maxCacheEntries bounds each cache; a full cache is emptied.
	maxCacheEntries = 4096
	// reviewTimeout bounds one call to the apiserver.
	reviewTimeout = 5 * time.Second
)

// Errors the middleware maps to HTTP statuses.
var (
	// ErrUnauthenticated: no token, or one the apiserver does not accept.
	ErrUnauthenticated = errors.New("a bearer token the management cluster accepts is required")
	// ErrForbidden: the token's user may not do this.
	ErrForbidden = errors.New("forbidden")
	// ErrUnavailable: the apiserver could not be asked.
	ErrUnavailable = errors.New("cannot check the token with the apiserver")
)

// Config configures an Authenticator.
type Config struct {
	// Client reaches the management cluster's apiserver; the server's
	// account needs create on tokenreviews and subjectaccessreviews.
	Client kubernetes.Interface
	// Audiences the token must be for (one of them); the TokenReview's
	// answer must name one. Empty: the apiserver's own audience, i.e. any
	// token the apiserver itself would accept.
	Audiences []string
	// CacheTTL reuses a review's answer this long; default 10s; negative:
	// no caching.
	CacheTTL time.Duration
	Logger   *slog.Logger
	Clock    func() time.Time
}

// Authenticator checks callers. Safe for concurrent use.
type Authenticator struct {
	cfg   Config
	log   *slog.Logger
	mu    sync.Mutex
	users map[[32]byte]cachedUser
	sars  map[string]cachedDecision
}

type cachedUser struct {
	user    *authenticationv1.UserInfo // nil: not authenticated
	expires time.Time
}

type cachedDecision struct {
	allowed bool
	expires time.Time
}

// New returns an Authenticator.
func New(cfg Config) (*Authenticator, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubeauth: client is required")
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = defaultCacheTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &Authenticator{cfg: cfg, log: cfg.Logger.With("component", "kubeauth"), users: map[[32]byte]cachedUser{}, sars: map[string]cachedDecision{}}, nil
}

// Token returns the bearer token of r, or ErrUnauthenticated.
func Token(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if len(h) > MaxTokenBytes+len("Bearer ") {
		return "", ErrUnauthenticated
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", ErrUnauthenticated
	}
	tok = strings.TrimSpace(tok)
	if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
		return "", ErrUnauthenticated
	}
	return tok, nil
}

// Authenticate returns who token belongs to, by TokenReview.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (*authenticationv1.UserInfo, error) {
	key := sha256.Sum256([]byte(token))
	now := a.cfg.Clock()
	a.mu.Lock()
	if c, ok := a.users[key]; ok && now.Before(c.expires) {
		a.mu.Unlock()
		if c.user == nil {
			return nil, ErrUnauthenticated
		}
		return c.user, nil
	}
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	tr, err := a.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: a.cfg.Audiences}}, metav1.CreateOptions{})
	if err != nil {
		// The error is the apiserver's; it never echoes the token.
		a.log.Warn("token review failed", "error", err)
		return nil, ErrUnavailable
	}
	var user *authenticationv1.UserInfo
	switch {
	case !tr.Status.Authenticated || tr.Status.Error != "":
	case !a.audienceAnswered(tr.Status.Audiences):
		// The token may be valid, but not for us: a token minted for
		// another service, or an authenticator that ignored the audiences
		// asked for (it then answers none).
		a.log.Info("token refused: the token review names none of the audiences asked for", "want", a.cfg.Audiences, "answered", tr.Status.Audiences)
	default:
		u := tr.Status.User
		user = &u
	}
	a.remember(func() {
		if len(a.users) >= maxCacheEntries {
			a.users = map[[32]byte]cachedUser{}
		}
		a.users[key] = cachedUser{user: user, expires: now.Add(a.cfg.CacheTTL)}
	})
	if user == nil {
		return nil, ErrUnauthenticated
	}
	return user, nil
}

// audienceAnswered says whether a review's answer names one of the
// audiences asked for (always, when none were). The Kubernetes API asks
// clients that set spec.audiences to check this: an authenticator that is
// not audience-aware answers with none.
func (a *Authenticator) audienceAnswered(answered []string) bool {
	if len(a.cfg.Audiences) == 0 {
		return true
	}
	for _, want := range a.cfg.Audiences {
		if slices.Contains(answered, want) {
			return true
		}
	}
	return false
}

// Authorize asks whether user may do attrs, by SubjectAccessReview.
func (a *Authenticator) Authorize(ctx context.Context, user *authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) error {
	key := fmt.Sprintf("%s\x00%s\x00%v\x00%s/%s/%s/%s/%s/%s", user.Username, user.UID, user.Groups, attrs.Verb, attrs.Group, attrs.Resource, attrs.Subresource, attrs.Namespace, attrs.Name)
	now := a.cfg.Clock()
	a.mu.Lock()
	if c, ok := a.sars[key]; ok && now.Before(c.expires) {
		a.mu.Unlock()
		return decision(c.allowed)
	}
	a.mu.Unlock()
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	sar, err := a.cfg.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra, ResourceAttributes: &attrs}}, metav1.CreateOptions{})
	if err != nil {
		a.log.Warn("subject access review failed", "error", err)
		return ErrUnavailable
	}
	allowed := sar.Status.Allowed && !sar.Status.Denied
	a.remember(func() {
		if len(a.sars) >= maxCacheEntries {
			a.sars = map[string]cachedDecision{}
		}
		a.sars[key] = cachedDecision{allowed: allowed, expires: now.Add(a.cfg.CacheTTL)}
	})
	return decision(allowed)
}

func (a *Authenticator) remember(f func()) {
	if a.cfg.CacheTTL <= 0 {
		return
	}
	a.mu.Lock()
	f()
	a.mu.Unlock()
}

func decision(allowed bool) error {
	if !allowed {
		return ErrForbidden
	}
	return nil
}

// Attributes says what a request needs to be allowed; nil refuses it.
type Attributes func(*http.Request) *authorizationv1.ResourceAttributes

// Handler serves next to callers that authenticate and are allowed attrs
// of the request. Refusals are 401 (with WWW-Authenticate), 403 or 503 with
// a short plain-text reason, and never reach next.
func (a *Authenticator) Handler(attrs Attributes, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, err := a.Check(r, attrs)
		if err != nil {
			WriteError(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// Check authenticates r and authorizes attrs(r).
func (a *Authenticator) Check(r *http.Request, attrs Attributes) (*authenticationv1.UserInfo, error) {
	tok, err := Token(r)
	if err != nil {
		return nil, err
	}
	user, err := a.Authenticate(r.Context(), tok)
	if err != nil {
		return nil, err
	}
	at := attrs(r)
	if at == nil {
		return nil, ErrForbidden
	}
	if err := a.Authorize(r.Context(), user, *at); err != nil {
		a.log.Info("request forbidden", "user", user.Username, "verb", at.Verb, "resource", at.Group+"/"+at.Resource, "name", at.Name)
		return nil, err
	}
	return user, nil
}

// WriteError answers a refused request.
func WriteError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case errors.Is(err, ErrUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="relaymesh"`)
		http.Error(w, ErrUnauthenticated.Error(), http.StatusUnauthorized)
	case errors.Is(err, ErrForbidden):
		http.Error(w, "forbidden: the token's user may not see this (RBAC)", http.StatusForbidden)
	default:
		http.Error(w, ErrUnavailable.Error(), http.StatusServiceUnavailable)
	}
}

type userKey struct{}

// User is the authenticated caller of a request served by Handler.
func User(ctx context.Context) (*authenticationv1.UserInfo, bool) {
	u, ok := ctx.Value(userKey{}).(*authenticationv1.UserInfo)
	return u, ok
}
