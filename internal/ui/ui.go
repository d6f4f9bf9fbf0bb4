// Package ui is batcherd's status page at /ui (README, "Status page"): a few
// server-rendered HTML pages an operator opens in a browser: the repositories, recent
// batches, a batch's members and an operation's timeline.
//
// Rendering is html/template (contextual auto-escaping: text from requests and from the
// database — subjects, targets, reasons, error messages — never becomes markup), CSS is
// embedded, there is no JavaScript at all and no third-party asset, and every response
// carries a Content-Security-Policy that would refuse any script. Every page is a few
// bounded, indexed reads of the database through the store (the same queries the API
// uses); a page view never calls GitLab.
//
// Authentication is the API's (internal/auth), carried by a signed session cookie
// because a browser cannot send a bearer header: session.go.
package ui

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Defaults.
const (
	DefaultSessionTTL = 8 * time.Hour
	// MinKeyLen is the shortest session key accepted (bytes): HMAC-SHA256's block of
	// entropy.
	MinKeyLen = 32
	// pageSize is how many batches a page of the batch list shows.
	pageSize = 50
	// maxLoginBody bounds the login form (an OIDC JWT is a few KiB).
	maxLoginBody = 32 << 10

	sessionCookie = "batcherd_ui"
	loginCookie   = "batcherd_ui_login"
)

// Store is what the pages read; *store.Store satisfies it. Every method is one bounded
// read: RepoStates per configured repository, BatchList a keyset page, BatchMembers a
// batch's members (at most BATCHERD_MAX_BATCH_SIZE), OperationEvents at most 1000.
type Store interface {
	RepoStates(ctx context.Context, repos []string) ([]store.RepoState, error)
	BatchGet(ctx context.Context, id int64) (domain.Batch, error)
	BatchList(ctx context.Context, f store.BatchFilter) ([]domain.Batch, error)
	BatchMembers(ctx context.Context, batchID int64) ([]domain.Operation, error)
	OperationGetView(ctx context.Context, operationID string) (store.OperationView, error)
	OperationEvents(ctx context.Context, operationID string) ([]store.Event, error)
	// RepoHealths: what replicas last recorded of each repository's GitLab access and
	// drift (one row per repository).
	RepoHealths(ctx context.Context) (map[string]store.RepoHealth, error)
}

var _ Store = (*store.Store)(nil)

// Config is the status page's configuration.
type Config struct {
	// Auth checks the token a login form sends (the API's authenticator).
	Auth           *auth.Authenticator
	InsecureNoAuth bool
	// SessionKey signs session cookies (BATCHERD_UI_SESSION_KEY): every replica behind
	// one load balancer needs the same. Empty: a random key of this process, so a
	// session works only on the replica that opened it and ends with its restart.
	SessionKey []byte
	SessionTTL time.Duration
	Repos      []string
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// Handler serves /ui.
type Handler struct {
	cfg   Config
	st    Store
	log   *slog.Logger
	seal  sealer
	pages map[string]*template.Template
	mux   *http.ServeMux
	now   func() time.Time
}

// New builds the status page.
func New(cfg Config, st Store, log *slog.Logger) (*Handler, error) {
	if st == nil {
		return nil, errors.New("ui: a store is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if !cfg.InsecureNoAuth && !cfg.Auth.Configured() {
		return nil, errors.New("ui: no authenticator configured")
	}
	key := cfg.SessionKey
	switch {
	case len(key) == 0:
		key = make([]byte, 32)
		_, _ = rand.Read(key)
		if !cfg.InsecureNoAuth {
			log.Warn("BATCHERD_UI_SESSION_KEY is not set: status page sessions are signed with a key of this process, so they work only on this replica and end when it restarts; set the same key on every replica behind a load balancer")
		}
	case len(key) < MinKeyLen:
		return nil, fmt.Errorf("ui: the session key must be at least %d bytes, got %d", MinKeyLen, len(key))
	}
	h := &Handler{cfg: cfg, st: st, log: log, seal: sealer{key: append([]byte(nil), key...)}, now: cfg.Now}
	if h.now == nil {
		h.now = time.Now
	}
	if err := h.parse(); err != nil {
		return nil, err
	}
	h.mux = h.routes()
	return h, nil
}

// Routes are the patterns the handler serves (api registers and documents each).
var Routes = []string{
	"GET /ui",
	"GET /ui/login",
	"POST /ui/login",
	"POST /ui/logout",
	"GET /ui/batches",
	"GET /ui/batches/{id}",
	"GET /ui/operations/{id}",
	"GET /ui/static/{file}",
}

func (h *Handler) routes() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("GET /ui", h.authed(h.repos))
	m.HandleFunc("GET /ui/login", h.loginForm)
	m.HandleFunc("POST /ui/login", h.login)
	m.HandleFunc("POST /ui/logout", h.logout)
	m.HandleFunc("GET /ui/batches", h.authed(h.batches))
	m.HandleFunc("GET /ui/batches/{id}", h.authed(h.batch))
	m.HandleFunc("GET /ui/operations/{id}", h.authed(h.operation))
	m.Handle("GET /ui/static/", http.StripPrefix("/ui/", http.FileServerFS(mustSub(assets, "."))))
	return m
}

func mustSub(f fs.FS, dir string) fs.FS {
	s, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return s
}

// ServeHTTP sets the headers every answer carries and dispatches.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// No script may run, no page may frame this one, forms post only here.
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, "/ui/static/") {
		hd.Set("Cache-Control", "no-store")
	}
	h.mux.ServeHTTP(w, r)
}

type ctxKey struct{}

// authed runs a page for a valid session; anything else goes to the login form.
func (h *Handler) authed(page func(w http.ResponseWriter, r *http.Request, s Session) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := h.session(r)
		if !ok {
			// A bad or expired cookie is dropped so the browser stops sending it.
			if _, err := r.Cookie(sessionCookie); err == nil {
				h.clearCookie(w, r, sessionCookie)
			}
			http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if err := page(w, r, s); err != nil {
			h.fail(w, r, s, err)
		}
	}
}

// session is the request's valid session (InsecureNoAuth: every request is anonymous).
func (h *Handler) session(r *http.Request) (Session, bool) {
	if h.cfg.InsecureNoAuth {
		return Session{Name: auth.Anonymous, Admin: true}, true
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return Session{}, false
	}
	s, err := h.seal.open(c.Value, h.now())
	if err != nil {
		return Session{}, false
	}
	return h.current(s)
}

// current checks that the credential a session was opened with is still configured:
// a token session needs the same token under the same name (and takes the admin flag
// configured now); an OIDC session needs an issuer (its token's expiry already bounds
// it). A token removed or replaced in the configuration ends its sessions on the next
// request to a replica that runs the new configuration.
func (h *Handler) current(s Session) (Session, bool) {
	switch s.source {
	case "token":
		p, ok := h.cfg.Auth.TokenPrincipal(s.Name)
		if !ok || !hmac.Equal([]byte(h.seal.credentialMAC(p.Credential)), []byte(s.cred)) {
			return Session{}, false
		}
		s.Admin = p.Admin
		return s, true
	case "oidc":
		return s, h.cfg.Auth.OIDCEnabled()
	}
	return Session{}, false
}

// secure: the Secure attribute when the browser reached us over TLS, directly or
// through a proxy that says so. Trusting X-Forwarded-Proto here can only add the
// attribute (a forged header makes the browser withhold the cookie over plain HTTP,
// which harms only the forger), never remove it.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (h *Handler) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge time.Duration) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: "/ui", MaxAge: int(maxAge / time.Second),
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
}

func (h *Handler) clearCookie(w http.ResponseWriter, r *http.Request, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/ui", MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
}

// sameOrigin refuses a state-changing request another site's page sent: a browser
// names the sending page in Origin (and in Sec-Fetch-Site); either, when present, must
// say it is this host. SameSite=Strict already keeps the cookies off such a request,
// and the form's CSRF token is checked as well.
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// safeNext keeps a post-login redirect on the status page: a path under /ui, never
// another host ("//evil", "/ui\\..", a scheme).
func safeNext(next string) string {
	if next == "" || len(next) > 2048 || !strings.HasPrefix(next, "/ui") ||
		strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/ui"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || (u.Path != "/ui" && !strings.HasPrefix(u.Path, "/ui/")) ||
		path.Clean(u.Path) != strings.TrimSuffix(u.Path, "/") {
		return "/ui"
	}
	return next
}

type loginData struct {
	base
	CSRF  string
	Next  string
	Error string
}

func (h *Handler) loginForm(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.session(r); ok {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	h.renderLogin(w, r, http.StatusOK, r.URL.Query().Get("next"), "")
}

func (h *Handler) renderLogin(w http.ResponseWriter, r *http.Request, status int, next, msg string) {
	tok := h.seal.loginToken()
	h.setCookie(w, r, loginCookie, tok, time.Hour)
	h.render(w, r, status, "login", loginData{base: base{Title: "Log in"}, CSRF: tok, Next: safeNext(next), Error: msg})
}

// login exchanges a token (API or admin token, or an OIDC JWT) for a session. The token
// is checked by the API's authenticator and then forgotten: the session names the
// principal only.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if h.cfg.InsecureNoAuth {
		http.Redirect(w, r, "/ui", http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		h.renderLogin(w, r, http.StatusBadRequest, "", "The form could not be read.")
		return
	}
	next := r.PostForm.Get("next")
	c, _ := r.Cookie(loginCookie)
	cv := ""
	if c != nil {
		cv = c.Value
	}
	if !sameOrigin(r) || !h.seal.checkLoginToken(r.PostForm.Get("csrf"), cv) {
		h.renderLogin(w, r, http.StatusForbidden, next, "The form expired or came from another site; please log in again.")
		return
	}
	tok := strings.TrimSpace(r.PostForm.Get("token"))
	if tok == "" {
		h.renderLogin(w, r, http.StatusUnauthorized, next, "Enter a token.")
		return
	}
	p, err := h.cfg.Auth.Authenticate(r.Context(), tok)
	if err != nil {
		// The reason is logged without the token; the browser learns only "refused".
		h.log.Info("status page login refused", "remote", r.RemoteAddr)
		h.renderLogin(w, r, http.StatusUnauthorized, next, "That token was refused.")
		return
	}
	// A session never outlives its credential: an OIDC token's expiry ends it.
	now := h.now()
	expires := now.Add(h.cfg.SessionTTL)
	if !p.Expires.IsZero() && p.Expires.Before(expires) {
		expires = p.Expires
	}
	v, _ := h.seal.seal(p, expires)
	h.setCookie(w, r, sessionCookie, v, expires.Sub(now))
	h.clearCookie(w, r, loginCookie)
	h.log.Info("status page login", p.LogAttr(), "source", p.Source)
	http.Redirect(w, r, safeNext(next), http.StatusSeeOther)
}

// logout ends the session: the cookie is cleared (a copy of it stays valid until its
// expiry; README, "Status page").
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	s, ok := h.session(r)
	if !ok {
		http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
		return
	}
	_ = r.ParseForm()
	if !sameOrigin(r) || (!h.cfg.InsecureNoAuth && !h.seal.checkCSRF(s, r.PostForm.Get("csrf"))) {
		h.render(w, r, http.StatusForbidden, "error", errorData{base: h.base(s, "Refused"), Status: http.StatusForbidden,
			Message: "The form expired or came from another site."})
		return
	}
	h.clearCookie(w, r, sessionCookie)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// base is what every page's layout shows.
type base struct {
	Title    string
	User     string
	Admin    bool
	CSRF     string
	Insecure bool
	Nav      string
	Now      time.Time
}

func (h *Handler) base(s Session, title string) base {
	b := base{Title: title, User: s.Name, Admin: s.Admin, Insecure: h.cfg.InsecureNoAuth, Now: h.now().UTC()}
	if !h.cfg.InsecureNoAuth && s.payload != "" {
		b.CSRF = h.seal.csrf(s)
	}
	return b
}

type errorData struct {
	base
	Status  int
	Message string
}

type pageError struct {
	status int
	msg    string
}

func (e *pageError) Error() string { return e.msg }

func notFound(format string, a ...any) error {
	return &pageError{http.StatusNotFound, fmt.Sprintf(format, a...)}
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, s Session, err error) {
	var pe *pageError
	switch {
	case errors.As(err, &pe):
	case errors.Is(err, store.ErrNotFound):
		pe = &pageError{http.StatusNotFound, "Not found."}
	default:
		h.log.Error("status page failed", "path", r.URL.Path, "err", err)
		pe = &pageError{http.StatusInternalServerError, "The page could not be read from the database; try again."}
	}
	h.render(w, r, pe.status, "error", errorData{base: h.base(s, http.StatusText(pe.status)), Status: pe.status, Message: pe.msg})
}

// render executes a page into a buffer first, so a template error is a clean 500
// instead of half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, page string, data any) {
	var b strings.Builder
	if err := h.pages[page].ExecuteTemplate(&b, "layout", data); err != nil {
		h.log.Error("status page template failed", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write([]byte(b.String()))
	}
}

func pathID(r *http.Request) (int64, bool) {
	v, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	return v, err == nil && v > 0
}
