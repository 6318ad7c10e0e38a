package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"github.com/relaymesh/relaymesh/internal/text"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
)

// Authorizer checks callers against the management cluster (a
// *kubeauth.Authenticator). Errors MUST wrap kubeauth.ErrUnauthenticated,
// kubeauth.ErrForbidden or kubeauth.ErrUnavailable.
type Authorizer interface {
	Authenticate(ctx context.Context, token string) (*authenticationv1.UserInfo, error)
	Authorize(ctx context.Context, user *authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) error
}

// DefaultAudience is the audience a dashboard sign-in token is minted
// for: `kubectl create token NAME --audience relaymesh-dashboard`.
const DefaultAudience = "relaymesh-dashboard"

// Config configures a Dashboard.
type Config struct {
	// Namespace is the server's: KubernetesClusters, discovered objects and
	// the audit log's permission live there.
	Namespace string
	Source    Source
	// Auth checks tokens; it MUST accept only tokens for Audience (a
	// kubeauth.Authenticator with Audiences: {Audience}).
	Auth Authorizer
	// Audience is the one tokens are minted for, shown on the sign-in
	// page; default DefaultAudience.
	Audience string
	// Sessions bounds the sign-in sessions (SessionConfig.Default).
	Sessions SessionConfig
	// Agents, Relay and Serving are the server's own state; nil leaves
	// their rows out.
	Agents  Agents
	Relay   RelayPKI
	Serving func() (*x509.Certificate, error)
	// AuditLog is the path of the server's audit log; AuditHead its
	// running head (audit.Log.Head), to tell a cut-short file.
	AuditLog  string
	AuditHead func() (uint64, string)
	// AgentTTL is the lifetime of agent certificates (their warning band).
	AgentTTL time.Duration
	// ServerVersion is compared with the agents'.
	ServerVersion string
	// MaxAccessRows bounds the rows of the access table (default 500; a
	// filter finds the rest, the JSON has everything).
	MaxAccessRows int
	// Registerer gets the dashboard's metrics (sessions, sign-ins); nil:
	// not exported.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	Clock      func() time.Time
	// Rand makes session ids and form tokens; default crypto/rand.
	Rand io.Reader
}

// Validate reports every missing field.
func (c Config) Validate() error {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("dashboard: Namespace is required"))
	}
	if c.Source == nil {
		errs = append(errs, errors.New("dashboard: Source is required"))
	}
	if c.Auth == nil {
		errs = append(errs, errors.New("dashboard: Auth is required: the dashboard serves no one anonymously"))
	}
	errs = append(errs, c.Sessions.Validate())
	return errors.Join(errs...)
}

//go:embed templates/*.tmpl
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Dashboard serves the pages. Safe for concurrent use.
type Dashboard struct {
	cfg      Config
	log      *slog.Logger
	pages    map[string]*template.Template
	audit    *auditReader
	access   *accessCache
	sessions *sessions
	signIns  *prometheus.CounterVec
	h        http.Handler
}

// Metric names.
const (
	MetricSessions = "relaymesh_dashboard_sessions"
	MetricSignIns  = "relaymesh_dashboard_sign_ins_total"
)

// New returns a Dashboard.
func New(cfg Config) (*Dashboard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.MaxAccessRows <= 0 {
		cfg.MaxAccessRows = 500
	}
	if cfg.Audience == "" {
		cfg.Audience = DefaultAudience
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	cfg.Sessions = cfg.Sessions.Default()
	d := &Dashboard{cfg: cfg, log: cfg.Logger.With("component", "dashboard"), audit: &auditReader{path: cfg.AuditLog, head: cfg.AuditHead},
		access: &accessCache{}, sessions: newSessions(cfg.Sessions, cfg.Rand, cfg.Clock),
		signIns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricSignIns,
			Help: "Dashboard sign-ins by result: success (a session started), refused (the token is not accepted for the dashboard's audience), unavailable (the apiserver could not be asked, or no session could be started)."},
			[]string{"result"})}
	for _, r := range []string{"success", "refused", "unavailable"} {
		d.signIns.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		sessions := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricSessions,
			Help: "Dashboard sessions this replica holds (signed in, not expired, idle or signed out)."}, func() float64 { return float64(d.sessions.count()) })
		if err := errors.Join(cfg.Registerer.Register(sessions), cfg.Registerer.Register(d.signIns)); err != nil {
			return nil, fmt.Errorf("dashboard metrics: %w", err)
		}
	}
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	d.pages = pages
	d.h = d.routes()
	return d, nil
}

func parseTemplates() (map[string]*template.Template, error) {
	layout, err := template.New("layout.tmpl").Funcs(funcs).ParseFS(templateFS, "templates/layout.tmpl")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(templateFS, "templates/*.tmpl")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(path.Base(n), ".tmpl")
		if name == "layout" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("dashboard template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// ServeHTTP implements http.Handler.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) { d.h.ServeHTTP(w, r) }

func (d *Dashboard) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/fleet", http.StatusSeeOther) })
	mux.HandleFunc("GET /login", d.showLogin)
	mux.HandleFunc("POST /login", d.login)
	mux.HandleFunc("POST /logout", d.logout)
	assets, _ := fs.Sub(assetFS, "assets")
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", assetHandler(http.FileServerFS(assets))))
	for _, v := range AllViews {
		mux.HandleFunc("GET /"+string(v), d.page(v))
		mux.HandleFunc("GET /api/v1/"+string(v), d.api(v))
	}
	mux.HandleFunc("POST /access/whatif", d.whatIf)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	// Requests that change something (POST) must come from this origin:
	// Sec-Fetch-Site, else Origin compared with Host.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
	}))
	return securityHeaders(cop.Handler(mux))
}

// contentSecurityPolicy allows this origin's script, style and fetches
// only; no inline script or style, no plugins, no framing, no forms to
// elsewhere, and Trusted Types so no script can reach an HTML sink.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'; require-trusted-types-for 'script'; trusted-types 'none'"

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), payment=(), usb=()")
		if !strings.HasPrefix(r.URL.Path, "/assets/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

func assetHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no directory listings
			return
		}
		w.Header().Set("Cache-Control", "private, max-age=300")
		next.ServeHTTP(w, r)
	})
}

// navItem is one link of the navigation.
type navItem struct {
	View   View
	Title  string
	Active bool
}

// pageData is what every page template gets.
type pageData struct {
	Title string
	View  View
	Nav   []navItem
	// User is the signed-in caller's name; empty on the login page.
	User string
	// CSRF is the form token of the session (empty for a caller that sent
	// its token in a header).
	CSRF string
	Now  time.Time
	// Message is an error or notice for the page.
	Message string
	Data    any
}

func (d *Dashboard) nav(v View) []navItem {
	out := make([]navItem, 0, len(AllViews))
	for _, x := range AllViews {
		out = append(out, navItem{View: x, Title: x.Title(), Active: x == v})
	}
	return out
}

// render writes a page; a template error is logged and answered 500
// without the partial page.
func (d *Dashboard) render(w http.ResponseWriter, status int, name string, p *pageData) {
	t, ok := d.pages[name]
	if !ok {
		http.Error(w, "no such page", http.StatusInternalServerError)
		return
	}
	var buf strings.Builder
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		d.log.Error("rendering a page failed", "page", name, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(buf.String()))
}

// caller authenticates r: its Authorization header, else its session
// cookie. csrf is the session's form token ("" for a header); fromCookie
// says which. A session whose token the apiserver no longer accepts is
// ended.
func (d *Dashboard) caller(r *http.Request) (user *authenticationv1.UserInfo, csrf string, fromCookie bool, err error) {
	if r.Header.Get("Authorization") != "" {
		token, err := kubeauth.Token(r)
		if err != nil {
			return nil, "", false, err
		}
		user, err := d.cfg.Auth.Authenticate(r.Context(), token)
		if err != nil {
			return nil, "", false, err
		}
		return user, "", false, nil
	}
	key, err := sessionCookie(r)
	if err != nil {
		return nil, "", false, errors.Join(kubeauth.ErrUnauthenticated, err)
	}
	sess, err := d.sessions.get(key)
	if err != nil {
		return nil, "", false, errors.Join(kubeauth.ErrUnauthenticated, err)
	}
	user, err = d.cfg.Auth.Authenticate(r.Context(), sess.token)
	if errors.Is(err, kubeauth.ErrUnauthenticated) {
		d.sessions.end(key)
		d.log.Info("dashboard session ended: its token is no longer accepted", "user", sess.user)
	}
	if err != nil {
		return nil, "", false, err
	}
	return user, sess.csrf, true, nil
}

// authorize checks every permission view v needs, for user.
func (d *Dashboard) authorize(ctx context.Context, user *authenticationv1.UserInfo, v View) error {
	for _, a := range Attributes(v, d.cfg.Namespace) {
		if err := d.cfg.Auth.Authorize(ctx, user, a); err != nil {
			if errors.Is(err, kubeauth.ErrForbidden) {
				d.log.Info("dashboard view forbidden", "user", user.Username, "view", string(v), "verb", a.Verb, "resource", a.Group+"/"+a.Resource)
			}
			return err
		}
	}
	return nil
}

// sectionsFor checks the sections of view v for user: nil for each it may
// see, else why not (wrapping kubeauth.ErrForbidden or ErrUnavailable).
func (d *Dashboard) sectionsFor(ctx context.Context, user *authenticationv1.UserInfo, v View) map[Section]error {
	out := map[Section]error{}
	for _, s := range sections[v] {
		out[s] = nil
		for _, a := range SectionAttributes(s, d.cfg.Namespace) {
			if err := d.cfg.Auth.Authorize(ctx, user, a); err != nil {
				out[s] = err
				break
			}
		}
	}
	return out
}

// refuse answers a page request that did not authenticate or authorize,
// with no data: the login form (401), a page that names the permissions
// the view needs (403), or 503.
func (d *Dashboard) refuse(w http.ResponseWriter, r *http.Request, v View, err error) {
	switch {
	case errors.Is(err, kubeauth.ErrUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="relaymesh"`)
		msg := ""
		if r.Header.Get("Authorization") == "" && hasSessionCookie(r) {
			switch {
			case errors.Is(err, errSessionEnded):
				msg = "Your session ended (signed out, unused for too long, at its token's expiry, or started on another server replica): sign in again."
			case errors.Is(err, errMalformedSession):
				msg = "Your session cookie is not one this server made: sign in again."
			default:
				msg = "Your token is no longer accepted (expired or revoked): sign in again."
			}
			clearSession(w, r)
		}
		d.loginPage(w, http.StatusUnauthorized, msg, "/"+string(v))
	case errors.Is(err, kubeauth.ErrForbidden):
		d.render(w, http.StatusForbidden, "forbidden", &pageData{Title: "Not allowed", View: v, Nav: d.nav(v), Data: forbiddenData(v, d.cfg.Namespace)})
	default:
		d.render(w, http.StatusServiceUnavailable, "forbidden", &pageData{Title: "Unavailable", View: v, Nav: d.nav(v),
			Message: "The management cluster's apiserver could not check your token; try again."})
	}
}

// forbidden is what the 403 page says: the permissions the view needs.
type forbidden struct {
	View  string
	Needs []string
}

func forbiddenData(v View, namespace string) forbidden {
	f := forbidden{View: v.Title()}
	for _, a := range Attributes(v, namespace) {
		f.Needs = append(f.Needs, needText(a))
	}
	return f
}

// needText says a permission: "list kubernetesclusters.multicluster.relaymesh.io
// in namespace relaymesh".
func needText(a authorizationv1.ResourceAttributes) string {
	where := "in every namespace"
	if a.Namespace != "" {
		where = "in namespace " + a.Namespace
	}
	return fmt.Sprintf("%s %s.%s %s", a.Verb, a.Resource, a.Group, where)
}

// page serves view v as HTML.
func (d *Dashboard) page(v View) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user, csrf, _, err := d.caller(r)
		if err == nil {
			err = d.authorize(r.Context(), user, v)
		}
		if err != nil {
			d.refuse(w, r, v, err)
			return
		}
		data, err := d.data(v, r, d.sectionsFor(r.Context(), user, v))
		p := &pageData{Title: v.Title(), View: v, Nav: d.nav(v), User: user.Username, CSRF: csrf, Now: d.cfg.Clock().UTC(), Data: data}
		if err != nil {
			d.log.Warn("dashboard data unavailable", "view", string(v), "error", err)
			p.Data, p.Message = nil, "Could not read the data of this page: "+err.Error()
		}
		d.render(w, http.StatusOK, string(v), p)
	}
}

// api serves view v as JSON; refusals are kubeauth's plain-text answers.
func (d *Dashboard) api(v View) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user, _, _, err := d.caller(r)
		if err == nil {
			err = d.authorize(r.Context(), user, v)
		}
		if err != nil {
			kubeauth.WriteError(w, err)
			return
		}
		data, err := d.data(v, r, d.sectionsFor(r.Context(), user, v))
		if err != nil {
			d.log.Warn("dashboard data unavailable", "view", string(v), "error", err)
			http.Error(w, "data unavailable", http.StatusServiceUnavailable)
			return
		}
		if a, ok := data.(*accessPage); ok {
			data = a.Result // the whole matrix, not the page's excerpt
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{"view": string(v), "generated": d.cfg.Clock().UTC(), "data": data})
	}
}

// data builds view v, with its sections as sectionsFor checked them.
func (d *Dashboard) data(v View, r *http.Request, allowed map[Section]error) (any, error) {
	now := d.cfg.Clock().UTC()
	switch v {
	case ViewFleet:
		clusters, err := d.cfg.Source.Clusters()
		if err != nil {
			return nil, err
		}
		var agents map[string]AgentState
		var replicas map[string]time.Time
		if d.cfg.Agents != nil {
			agents = d.cfg.Agents.Agents()
		}
		if reps, ok := d.cfg.Agents.(Replicas); ok {
			if replicas, err = reps.Replicas(r.Context()); err != nil {
				d.log.Warn("cannot read the replicas' Leases; last seen is the status's last event", "error", err)
			}
		}
		return fleet(fleetInput{clusters: clusters, agents: agents, replicas: replicas, serverVersion: d.cfg.ServerVersion, agentTTL: d.cfg.AgentTTL, now: now}), nil
	case ViewCertificates:
		clusters, err := d.cfg.Source.Clusters()
		if err != nil {
			return nil, err
		}
		in, err := d.cfg.Source.Input()
		if err != nil {
			return nil, err
		}
		ci := certificateInput{relay: d.cfg.Relay, clusters: clusters, vms: in.VirtualMeshes, agentTTL: d.cfg.AgentTTL, now: now}
		if d.cfg.Serving != nil {
			if c, err := d.cfg.Serving(); err == nil {
				ci.serving = c
			}
		}
		return certificates(ci), nil
	case ViewTrust:
		in, err := d.cfg.Source.Input()
		if err != nil {
			return nil, err
		}
		page := &TrustPage{VirtualMeshes: trustMeshes(in.VirtualMeshes, now), Peers: d.peers(allowed[SectionFederationPeers], now)}
		if d.cfg.Relay != nil {
			clusters, err := d.cfg.Source.Clusters()
			if err != nil {
				return nil, err
			}
			page.Relay = relayTrust(d.cfg.Relay, clusters, now)
		}
		return page, nil
	case ViewPolicies:
		in, err := d.cfg.Source.Input()
		if err != nil {
			return nil, err
		}
		return policies(in), nil
	case ViewAccess:
		return d.accessPage(accessFilterOf(r))
	case ViewAudit:
		return d.audit.read(), nil
	}
	return nil, fmt.Errorf("no view %q", v)
}

// peers builds the Trust page's federation peers for a caller whose
// permission to see them sectionsFor checked (allowed).
func (d *Dashboard) peers(allowed error, now time.Time) TrustPeers {
	switch {
	case errors.Is(allowed, kubeauth.ErrForbidden):
		var needs []string
		for _, a := range SectionAttributes(SectionFederationPeers, d.cfg.Namespace) {
			needs = append(needs, needText(a))
		}
		return TrustPeers{Hidden: strings.Join(needs, ", "), Peers: []TrustPeer{}}
	case allowed != nil:
		return TrustPeers{Unavailable: "the management cluster's apiserver could not check your permission to see them; reload to try again", Peers: []TrustPeer{}}
	}
	ftds, err := d.cfg.Source.FederatedTrustDomains()
	p := trustPeers(ftds, now)
	if err != nil {
		d.log.Warn("cannot read the FederatedTrustDomains", "error", err)
		p.Unavailable = "not read: " + text.Truncate(err.Error(), maxPeerError)
	}
	return p
}

// funcs are the template helpers.
var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"date": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format(time.DateOnly)
	},
	"join":  strings.Join,
	"short": short,
	"add":   func(a, b int) int { return a + b },
}
