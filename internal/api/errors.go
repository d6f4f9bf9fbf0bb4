package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
)

// Error codes of the {"error":{"code","message"}} body. Clients branch on the code;
// the message is for humans and may change.
const (
	codeInvalidRequest       = "invalid_request"
	codeInvalidJSON          = "invalid_json"
	codeUnknownField         = "unknown_field"
	codeUnsupportedMediaType = "unsupported_media_type"
	codePayloadTooLarge      = "payload_too_large"
	codeNotFound             = "not_found"
	codeBindingBusy          = "binding_busy"
	codeCaseCollision        = "case_collision"
	codeBindingActive        = "binding_active"
	codeBindingNotActive     = "binding_not_active"
	codeStale                = "stale"
	codeSelfApproval         = "self_approval"
	codeInBatch              = "in_batch"
	codeConflict             = "conflict"
	codeIdempotencyReused    = "idempotency_key_reused"
	codeInternal             = "internal"
	codeUnavailable          = "unavailable"
	codeGitLab               = "gitlab_error"
)

// apiError is an error with the HTTP status and code it is answered with.
type apiError struct {
	status  int
	code    string
	message string
	header  [2]string // optional extra header (WWW-Authenticate)
	cause   error     // for logs only, never sent
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return e.code + ": " + e.message + ": " + e.cause.Error()
	}
	return e.code + ": " + e.message
}

func (e *apiError) Unwrap() error { return e.cause }

func errf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, message: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *apiError {
	return errf(http.StatusBadRequest, codeInvalidRequest, format, args...)
}

// toAPIError maps store and handler errors to the documented answers. Anything not
// recognised is a 500 whose details stay in the log.
// Its complexity is the table of answers, one case each, kept in one place so a
// reader can check it against api/openapi.yaml.
func (s *Server) toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	wrap := func(status int, code, msg string) *apiError {
		return &apiError{status: status, code: code, message: msg, cause: err}
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return wrap(http.StatusNotFound, codeNotFound, "not found")
	case errors.Is(err, store.ErrIdempotencyKeyReused):
		return wrap(http.StatusUnprocessableEntity, codeIdempotencyReused,
			"this Idempotency-Key was first used with a different request")
	case errors.Is(err, store.ErrBindingActive):
		return wrap(http.StatusConflict, codeBindingActive, "the binding is already active")
	case errors.Is(err, store.ErrBindingNotActive):
		return wrap(http.StatusConflict, codeBindingNotActive, "the binding is not active: "+err.Error())
	case errors.Is(err, store.ErrBindingBusy):
		return wrap(http.StatusConflict, codeBindingBusy,
			"the binding has an application in flight or awaits recovery: "+err.Error())
	case errors.Is(err, store.ErrSelfApproval):
		return wrap(http.StatusForbidden, codeSelfApproval,
			"four eyes: the principal that requested an operation cannot approve it; another principal must (nothing was changed)")
	case errors.Is(err, store.ErrStale):
		return wrap(http.StatusConflict, codeStale, err.Error())
	case errors.Is(err, store.ErrExpiresInPast):
		return wrap(http.StatusBadRequest, codeInvalidRequest, "expires_at must be in the future")
	case errors.Is(err, store.ErrInvalidRequest):
		return wrap(http.StatusBadRequest, codeInvalidRequest, err.Error())
	case errors.Is(err, store.ErrTxAborted):
		a := wrap(http.StatusServiceUnavailable, codeUnavailable,
			"the database aborted the transaction (a deadlock, or a cluster changing its members); nothing was changed; retry")
		a.header = [2]string{"Retry-After", "1"}
		return a
	case errors.Is(err, store.ErrLostRace):
		return wrap(http.StatusConflict, codeConflict, "a concurrent request changed this resource; read it again")
	case errors.Is(err, store.ErrCommitUnknown):
		// The store re-read an application with an Idempotency-Key before answering
		// this; a retry with the same key is answered with the same operation, and one
		// without a key is refused (409 binding_busy) if the first was written.
		a := wrap(http.StatusServiceUnavailable, codeUnavailable,
			"the database connection broke during commit, so the change may or may not have been made: read the resource (or GET /v1/bindings for an application) before retrying; a retry with the same Idempotency-Key is answered with the same operation")
		a.header = [2]string{"Retry-After", "1"}
		return a
	case errors.Is(err, store.ErrNotPrimary):
		a := wrap(http.StatusServiceUnavailable, codeUnavailable,
			"the database node is not in the primary component of its cluster (failover in progress); nothing was changed; retry")
		a.header = [2]string{"Retry-After", "1"}
		return a
	case errors.Is(err, store.ErrUnavailable):
		a := wrap(http.StatusServiceUnavailable, codeUnavailable,
			"the database connection broke before commit (failover in progress?); nothing was changed; retry")
		a.header = [2]string{"Retry-After", "1"}
		return a
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return wrap(http.StatusServiceUnavailable, codeUnavailable, "request cancelled or timed out")
	case errors.Is(err, store.ErrBatchPublishing):
		return wrap(http.StatusConflict, codeConflict, err.Error())
	case errors.Is(err, mr.ErrStillOpen):
		return wrap(http.StatusConflict, codeConflict,
			"the merge request is still open after closing it (GitLab is merging it, or someone reopened it); settle again in a minute")
	}
	// GitLab's answer reaches the operator who asked (admin settle): GitLab's message
	// is kept by the mr package, and never carries the token.
	var ge *mr.Error
	if errors.As(err, &ge) {
		if ge.Class == mr.ClassTransient {
			a := wrap(http.StatusServiceUnavailable, codeUnavailable, "GitLab is unavailable, retry later: "+ge.Error())
			if ge.RetryAfter > 0 {
				a.header = [2]string{"Retry-After", strconv.Itoa(int(ge.RetryAfter.Round(time.Second) / time.Second))}
			}
			return a
		}
		return wrap(http.StatusBadGateway, codeGitLab,
			"GitLab refused the request; check the token's access to the project and the MR: "+ge.Error())
	}
	return wrap(http.StatusInternalServerError, codeInternal, "internal error")
}

func writeError(w http.ResponseWriter, err *apiError) {
	if err.header[0] != "" {
		w.Header().Set(err.header[0], err.header[1])
	}
	writeJSON(w, err.status, map[string]any{"error": map[string]string{"code": err.code, "message": err.message}})
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	b, err := json.Marshal(body)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"cannot encode response"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
