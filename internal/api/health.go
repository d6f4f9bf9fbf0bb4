package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/batcherd/batcherd/internal/store"
)

// ErrDraining is what Deps.SchemaCheck answers while the replica shuts down.
var ErrDraining = errors.New("shutting down")

// readyTimeout bounds a readiness check: a probe that hangs is worse than one that fails.
const readyTimeout = 3 * time.Second

// handleHealthz: the process is up and serving. It touches nothing else, so a
// database outage does not get every replica restarted.
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// handleReadyz: the database answers and its schema has every constraint batcherd
// relies on (I8). 503 with the reason otherwise.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	// The answer is public (probes carry no token): what it says must not hand out the
	// database user, host or address a driver error names. The log has the cause.
	if err := s.st.Ping(ctx); err != nil {
		if errors.Is(err, store.ErrNotPrimary) {
			// A Galera node that lost its cluster: it answers pings, and nothing else.
			s.log.Warn("not ready: database node not in the primary component", "err", err)
			writeError(w, errf(http.StatusServiceUnavailable, "not_ready", "database node not in the primary component (Galera); retry elsewhere"))
			return nil
		}
		s.log.Warn("not ready: database unreachable", "err", err)
		writeError(w, errf(http.StatusServiceUnavailable, "not_ready", "database unreachable; the replica's log has the cause"))
		return nil
	}
	if s.schema != nil {
		if err := s.schema(ctx); err != nil {
			s.log.Warn("not ready: schema check failed", "err", err)
			msg := "schema check could not run; the replica's log has the cause"
			switch {
			case errors.Is(err, store.ErrSchemaDrift):
				msg = "schema drift: " + err.Error() // names tables and indexes only
			case errors.Is(err, ErrDraining):
				msg = "shutting down"
			}
			writeError(w, errf(http.StatusServiceUnavailable, "not_ready", "%s", msg))
			return nil
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}
