// Package api is batcherd's HTTP API (a contract, README "HTTP API" and api/openapi.yaml: other systems and an
// independent client call it exactly as documented in api/openapi.yaml).
//
// Everything here is a thin layer over the store: handlers validate input, call one
// store method (one transaction) and render the result. The API never holds state of
// its own, so any replica answers any request. Routing is the standard library's
// method-and-pattern ServeMux; every path also gets a method-less fallback so a wrong
// method is a JSON 405, and "/" is a JSON 404.
package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/ui"

	"github.com/batcherd/batcherd/internal/domain"
)

// Defaults for zero Config fields.
const (
	DefaultMaxBodyBytes   = 64 << 10 // 64 KiB: the documented request body limit (413 above it)
	DefaultIdempotencyTTL = 24 * time.Hour
)

// Config is the API's share of batcherd's configuration.
type Config struct {
	// Auth establishes each request's principal (auth.New over tokens and OIDC). When
	// nil, one is built from APITokens and AdminTokens (entries name=token or a bare
	// token, as BATCHERD_API_TOKENS takes them).
	Auth *auth.Authenticator
	// APITokens may call every /v1 route except /v1/admin/*. AdminTokens may call all.
	APITokens   []string
	AdminTokens []string
	// InsecureNoAuth serves every route without a token (development only); every
	// request then acts as the principal "anonymous".
	InsecureNoAuth bool
	// AllowSelfApproval turns four eyes off (BATCHERD_FOUR_EYES=false): the zero value
	// refuses an approval by the operation's requester with 403 self_approval.
	AllowSelfApproval bool
	// WebhookSecret is the X-Gitlab-Token GitLab sends; empty disables the webhook.
	WebhookSecret string
	// Repos are the configured GitLab project paths; the first is the default.
	Repos []string
	// AutoApprove admits operations at once, skipping the approve call.
	AutoApprove bool
	// IdempotencyTTL is how long an Idempotency-Key is remembered (default 24h).
	IdempotencyTTL time.Duration
	// MaxBodyBytes bounds request bodies (default 64 KiB).
	MaxBodyBytes int64
	// LogRequests logs every request at info (BATCHERD_LOG_REQUESTS); else at debug.
	LogRequests bool
}

// Rounds runs a claim round through the same code as the scheduled round.
// repo "" means every configured repository.
type Rounds interface {
	RunRound(ctx context.Context, repo string) (store.ClaimResult, error)
}

// Settler runs close-then-reread settlement of one batch now.
type Settler interface {
	SettleBatch(ctx context.Context, id int64) (domain.Batch, error)
}

// Deps are the API's collaborators.
type Deps struct {
	Store Store
	Log   *slog.Logger
	// Registry receives the API's collectors and is what /metrics serves. One per
	// server (never the global default registry): tests run many servers in a process,
	// and the app registers the other components' collectors on the same one.
	Registry *prometheus.Registry
	Rounds   Rounds
	Settler  Settler
	// SchemaCheck verifies the live schema (I8) for /readyz; nil skips it.
	SchemaCheck func(context.Context) error
	// Kick, when set, wakes the scanner's publish and reconcile loops (webhook hints).
	Kick func()
	// Context bounds the work the server starts in the background (the metrics' count
	// of finished operations); end it before closing the store. Nil: never ends.
	Context context.Context
	// UI serves the status page's routes (internal/ui, which authenticates them itself
	// with its session cookie); nil answers them 404.
	UI http.Handler
}

// Server is the HTTP handler of the API, health and metrics.
type Server struct {
	cfg     Config
	st      Store
	log     *slog.Logger
	rounds  Rounds
	settler Settler
	schema  func(context.Context) error
	kick    func()
	repos   map[string]bool
	// authn turns a bearer credential into a principal (internal/auth keeps token
	// digests only and compares them in constant time).
	authn *auth.Authenticator
	// webhook is the secret's digest: comparing fixed-size digests in constant time
	// leaks neither its contents nor its length.
	webhook [32]byte
	mux     *http.ServeMux
	bg      context.Context // Deps.Context
	m       *httpMetrics
	routes  []route
	ui      http.Handler // Deps.UI
}

type authLevel int

const (
	authPublic  authLevel = iota // health, readiness, metrics
	authWebhook                  // X-Gitlab-Token
	authAPI                      // API or admin bearer token
	authAdmin                    // admin bearer token
	authUI                       // the status page's own session (internal/ui)
)

// route is one registered method+path. The table is also what the OpenAPI test
// compares with api/openapi.yaml.
type route struct {
	method  string
	path    string
	auth    authLevel
	handler func(w http.ResponseWriter, r *http.Request) error
}

// New builds the server and registers its metrics on deps.Registry.
func New(cfg Config, deps Deps) (*Server, error) {
	if deps.Store == nil {
		return nil, errors.New("api: Deps.Store is required")
	}
	if deps.Registry == nil {
		return nil, errors.New("api: Deps.Registry is required")
	}
	if len(cfg.Repos) == 0 {
		return nil, errors.New("api: at least one repository must be configured")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.IdempotencyTTL <= 0 {
		cfg.IdempotencyTTL = DefaultIdempotencyTTL
	}
	log := deps.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, st: deps.Store, log: log.With("component", "api"),
		rounds: deps.Rounds, settler: deps.Settler, schema: deps.SchemaCheck, kick: deps.Kick,
		repos: map[string]bool{}, bg: deps.Context, ui: deps.UI,
	}
	if s.bg == nil {
		s.bg = context.Background()
	}
	for _, r := range cfg.Repos {
		s.repos[r] = true
	}
	s.authn = cfg.Auth
	if s.authn == nil {
		toks, err := auth.ParseTokens(
			auth.TokenList{Var: "APITokens", Entries: cfg.APITokens},
			auth.TokenList{Var: "AdminTokens", Entries: cfg.AdminTokens, Admin: true})
		if err != nil {
			return nil, fmt.Errorf("api: %w", err)
		}
		s.authn = auth.New(toks, nil)
	}
	if !s.authn.Configured() && !cfg.InsecureNoAuth {
		return nil, errors.New("api: no API or admin token configured (set tokens, or InsecureNoAuth for development)")
	}
	if cfg.InsecureNoAuth {
		s.log.Warn("API authentication is disabled (BATCHERD_INSECURE_NO_AUTH=true): anyone who reaches this port can apply for and approve access")
	}
	if cfg.WebhookSecret != "" {
		s.webhook = sha256.Sum256([]byte(cfg.WebhookSecret))
	}
	m, err := newHTTPMetrics(deps.Registry, s)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.routes = s.routeTable()
	s.mux = s.buildMux(deps.Registry)
	return s, nil
}

func (s *Server) routeTable() []route {
	rt := []route{
		{"POST", "/v1/operations", authAPI, s.handleCreateOperation},
		{"GET", "/v1/operations/{id}", authAPI, s.handleGetOperation},
		{"POST", "/v1/operations/{id}/approve", authAPI, s.handleApprove},
		{"POST", "/v1/operations/{id}/reject", authAPI, s.handleReject},
		// Retry takes an API token, as the contract puts admin-only routes under /v1/admin/*
		// and retry is not one of them. It grants nothing an API token cannot already
		// do (approve): it re-queues an operation that was approved and then failed.
		{"POST", "/v1/operations/{id}/retry", authAPI, s.handleRetry},
		// Withdraw takes an API principal: the operation's requester (or an admin) may
		// take its application back (handleWithdraw).
		{"POST", "/v1/operations/{id}/withdraw", authAPI, s.handleWithdraw},
		{"GET", "/v1/operations/{id}/events", authAPI, s.handleOperationEvents},
		{"GET", "/v1/bindings", authAPI, s.handleListBindings},
		{"GET", "/v1/batches", authAPI, s.handleListBatches},
		{"GET", "/v1/batches/{id}", authAPI, s.handleGetBatch},
		{"GET", "/v1/repos", authAPI, s.handleListRepos},
		{"GET", "/v1/repos/{repo}/events", authAPI, s.handleRepoEvents},
		{"POST", "/v1/admin/repos/{repo}/pause", authAdmin, s.handlePause},
		{"POST", "/v1/admin/repos/{repo}/resume", authAdmin, s.handleResume},
		{"POST", "/v1/admin/rounds", authAdmin, s.handleAdminRound},
		{"POST", "/v1/admin/batches/{id}/settle", authAdmin, s.handleAdminSettle},
		{"POST", "/v1/webhooks/gitlab", authWebhook, s.handleWebhook},
		{"GET", "/healthz", authPublic, s.handleHealthz},
		{"GET", "/readyz", authPublic, s.handleReadyz},
		{"GET", "/metrics", authPublic, nil}, // promhttp, set in buildMux
	}
	// The status page (README, "Status page"): HTML, served by internal/ui.
	for _, p := range ui.Routes {
		method, path, _ := strings.Cut(p, " ")
		rt = append(rt, route{method, path, authUI, nil})
	}
	return rt
}

func (s *Server) buildMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	methods := map[string][]string{}
	for _, rt := range s.routes {
		name := rt.method + " " + rt.path
		var h http.Handler
		switch {
		case rt.auth == authUI:
			h = s.uiHandler()
		case rt.handler == nil:
			h = metricsHandler(reg)
		default:
			h = s.wrap(rt)
		}
		mux.Handle(name, s.instrument(name, h))
		methods[rt.path] = append(methods[rt.path], rt.method)
	}
	// A known path with another method: JSON 405 with Allow (the mux's own 405 is text).
	for path, ms := range methods {
		if slices.Contains(ms, "GET") {
			ms = append(ms, "HEAD")
		}
		sort.Strings(ms)
		allow := strings.Join(ms, ", ")
		mux.Handle(path, s.instrument("405 "+path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, errf(http.StatusMethodNotAllowed, "method_not_allowed", "%s is not allowed on %s; allowed: %s", r.Method, path, allow))
		})))
	}
	mux.Handle("/", s.instrument("unmatched", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errf(http.StatusNotFound, "not_found", "no such route: %s", r.URL.Path))
	})))
	return mux
}

// uiHandler is the status page, or a 404 when the server has none.
func (s *Server) uiHandler() http.Handler {
	if s.ui != nil {
		return s.ui
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errf(http.StatusNotFound, "not_found", "the status page is not served here"))
	})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// wrap applies authentication, panic recovery and error rendering to one handler.
func (s *Server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("handler panic", "route", rt.method+" "+rt.path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				writeError(w, errf(http.StatusInternalServerError, "internal", "internal error"))
			}
		}()
		p, aerr := s.authorize(r, rt.auth)
		if p.Name != "" {
			// The request log line names the principal (never its credential), also
			// when it is refused the route (403).
			if rec, ok := w.(*statusRecorder); ok {
				rec.principal = p.Name
			}
			r = r.WithContext(withPrincipal(r.Context(), p))
		}
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		if err := rt.handler(w, r); err != nil {
			ae := s.toAPIError(err)
			if ae.status >= 500 {
				s.log.Error("request failed", "route", rt.method+" "+rt.path, "status", ae.status, "err", err)
			} else {
				s.log.Debug("request refused", "route", rt.method+" "+rt.path, "status", ae.status, "code", ae.code, "err", err)
			}
			writeError(w, ae)
		}
	})
}

// authorize checks the credentials a route needs and returns the principal the
// request acts as (none for public and webhook routes). Tokens are never logged.
func (s *Server) authorize(r *http.Request, level authLevel) (auth.Principal, *apiError) {
	switch level {
	case authPublic:
		return auth.Principal{}, nil
	case authWebhook:
		if s.cfg.WebhookSecret == "" {
			return auth.Principal{}, errf(http.StatusNotFound, "webhook_disabled", "the GitLab webhook is disabled: no webhook secret is configured")
		}
		got := r.Header.Get("X-Gitlab-Token")
		sum := sha256.Sum256([]byte(got))
		if got == "" || subtle.ConstantTimeCompare(sum[:], s.webhook[:]) != 1 {
			return auth.Principal{}, errf(http.StatusUnauthorized, "unauthorized", "missing or invalid X-Gitlab-Token")
		}
		return auth.Principal{}, nil
	}
	if s.cfg.InsecureNoAuth {
		return auth.Principal{Name: auth.Anonymous, Admin: true, Source: "insecure"}, nil
	}
	tok, ok := bearer(r)
	if !ok {
		return auth.Principal{}, errUnauthorized("missing bearer token: send Authorization: Bearer <token>")
	}
	p, err := s.authn.Authenticate(r.Context(), tok)
	if err != nil {
		msg := "invalid bearer token"
		if errors.Is(err, auth.ErrUnauthenticated) {
			msg = strings.TrimPrefix(err.Error(), auth.ErrUnauthenticated.Error()+": ")
		}
		return auth.Principal{}, errUnauthorized(msg)
	}
	if level == authAdmin && !p.Admin {
		return p, errf(http.StatusForbidden, "forbidden", "this route needs an admin principal; %q is not one", p.Name)
	}
	return p, nil
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p auth.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// principal is who the request acts as ("" only on public and webhook routes).
func principal(r *http.Request) auth.Principal {
	p, _ := r.Context().Value(principalKey{}).(auth.Principal)
	return p
}

func errUnauthorized(msg string) *apiError {
	e := errf(http.StatusUnauthorized, "unauthorized", "%s", msg)
	e.header = [2]string{"WWW-Authenticate", `Bearer realm="batcherd"`}
	return e
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// pathInt64 parses a positive int64 path value (batch ids).
func pathInt64(r *http.Request, name string) (int64, bool) {
	v, err := strconv.ParseInt(r.PathValue(name), 10, 64)
	return v, err == nil && v > 0
}
