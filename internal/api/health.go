package api

import (
	"context"
	"net/http"
	"time"
)

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
	if err := s.st.Ping(ctx); err != nil {
		s.log.Warn("not ready: database unreachable", "err", err)
		writeError(w, errf(http.StatusServiceUnavailable, "not_ready", "database unreachable: %v", err))
		return nil
	}
	if s.schema != nil {
		if err := s.schema(ctx); err != nil {
			s.log.Warn("not ready: schema check failed", "err", err)
			writeError(w, errf(http.StatusServiceUnavailable, "not_ready", "schema check failed: %v", err))
			return nil
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}
