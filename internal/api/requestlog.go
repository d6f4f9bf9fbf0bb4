package api

import (
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// logRequest writes one line per request: the method, the route (the registered
// pattern, as in the metrics: never the raw path or query, which may carry names an
// operator did not ask to log), the status, the duration and the principal's name
// ("" on public and webhook routes and for refused credentials; never a credential).
// At info with Config.LogRequests, else at debug; the probes (health, readiness,
// metrics) always at debug, so that kubelets and Prometheus do not fill the log.
func (s *Server) logRequest(r *http.Request, route string, code int, d time.Duration, principal string) {
	level := slog.LevelDebug
	if s.cfg.LogRequests && !strings.HasSuffix(route, " /healthz") && !strings.HasSuffix(route, " /readyz") && !strings.HasSuffix(route, " /metrics") {
		level = slog.LevelInfo
	}
	if !s.log.Enabled(r.Context(), level) {
		return
	}
	s.log.LogAttrs(r.Context(), level, "request", slog.String("method", r.Method), slog.String("route", route),
		slog.Int("status", code), slog.Duration("duration", d), slog.String("principal", principal))
}
