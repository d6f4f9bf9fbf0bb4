package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/wire"

	"github.com/batcherd/batcherd/internal/domain"
)

// handleCreateOperation is admission: POST /v1/operations.
func (s *Server) handleCreateOperation(w http.ResponseWriter, r *http.Request) error {
	key, hasKey := r.Header["Idempotency-Key"]
	idemKey := ""
	if hasKey {
		idemKey = key[0]
		if idemKey == "" {
			return badRequest("Idempotency-Key must not be empty")
		}
		if err := validIdemKey(idemKey); err != nil {
			return err
		}
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	if body == nil {
		return errf(http.StatusBadRequest, codeInvalidJSON, "request body is required: a JSON object with subject, target and action")
	}
	var req createRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	p, err := s.validateCreate(req)
	if err != nil {
		return err
	}
	// The requester is recorded, and scopes the idempotency key: two principals may use
	// the same key without seeing each other's operations.
	p.RequestedBy = principal(r).Name
	if idemKey != "" {
		p.IdempotencyKey = idemKey
		p.Fingerprint = fingerprint(p)
		p.IdempotencyTTL = s.cfg.IdempotencyTTL
	}
	// A grant whose file differs from an active binding's only by letter case would be
	// the same file on a case-insensitive checkout (macOS, Windows): the store refuses
	// it inside the admission's own transaction (CaseCollisionError).
	op, created, err := s.st.OperationCreate(r.Context(), p)
	if err != nil {
		var cc *store.CaseCollisionError
		if errors.As(err, &cc) {
			return errf(http.StatusConflict, codeCaseCollision,
				"the file of this binding differs only by letter case from that of %s → %s (%s): case-insensitive checkouts would make them one file",
				cc.Other.Subject, cc.Other.Target, cc.Other.Status)
		}
		if errors.Is(err, store.ErrLostRace) {
			// A concurrent application of the same relation committed first.
			return errf(http.StatusConflict, codeBindingBusy, "a concurrent application for this binding won; read the binding and try again")
		}
		return err
	}
	status := http.StatusCreated
	if !created {
		status = http.StatusOK // the Idempotency-Key was seen: the first request's operation
	}
	if created {
		w.Header().Set("Location", "/v1/operations/"+op.OperationID)
		op = s.urgentRound(r.Context(), op) // auto-approved and urgent: claim it now
	}
	return s.writeOperation(r.Context(), w, status, op)
}

// validateCreate turns a decoded body into store parameters, or a 400 naming the field.
func (s *Server) validateCreate(req createRequest) (store.OperationCreateParams, error) {
	var p store.OperationCreateParams
	var err error
	if p.Subject, err = validName("subject", req.Subject); err != nil {
		return p, err
	}
	if p.Target, err = validName("target", req.Target); err != nil {
		return p, err
	}
	if err := validPathSegments(p.Subject, p.Target); err != nil {
		return p, err
	}
	if req.Action == nil {
		return p, badRequest("action is required: grant or revoke")
	}
	switch domain.Action(*req.Action) {
	case domain.ActionGrant, domain.ActionRevoke:
		p.Action = domain.Action(*req.Action)
	default:
		return p, badRequest("action must be grant or revoke, got %q", *req.Action)
	}
	p.Repo = s.cfg.Repos[0]
	if req.Repo != nil {
		if !s.repos[*req.Repo] {
			return p, badRequest("repo %q is not configured", *req.Repo)
		}
		p.Repo = *req.Repo
	}
	if p.ExpiresAt, err = parseExpiresAt(req.ExpiresAt); err != nil {
		return p, err
	}
	if p.ExpiresAt != nil && p.Action != domain.ActionGrant {
		return p, badRequest("expires_at applies to grants only")
	}
	if p.Attributes, err = canonicalAttributes(req.Attributes); err != nil {
		return p, err
	}
	p.Priority = domain.PriorityNormal
	if req.Priority != nil {
		switch domain.Priority(*req.Priority) {
		case domain.PriorityNormal, domain.PriorityUrgent:
			p.Priority = domain.Priority(*req.Priority)
		default:
			return p, badRequest("priority must be normal or urgent, got %q", *req.Priority)
		}
	}
	p.OperationID = uuid.NewString()
	p.AutoApprove = s.cfg.AutoApprove
	return p, nil
}

// opID reads the {id} path value. A value that cannot be an operation id is simply an
// unknown operation (404), like any id that is not stored. UUIDs are case-insensitive
// on input (RFC 9562) and batcherd stores them in lower case, so an id sent in upper
// case (as .NET and SQL Server print GUIDs) finds its operation.
func opID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if uuid.Validate(id) != nil || len(id) != 36 {
		return "", errf(http.StatusNotFound, codeNotFound, "operation %q not found", id)
	}
	return strings.ToLower(id), nil
}

func (s *Server) handleGetOperation(w http.ResponseWriter, r *http.Request) error {
	id, err := opID(r)
	if err != nil {
		return err
	}
	v, err := s.st.OperationGetView(r.Context(), id)
	if err != nil {
		return notFoundAs(err, "operation %q not found", id)
	}
	writeJSON(w, http.StatusOK, map[string]any{"operation": renderOperation(v.Operation, v.MRURL)})
	return nil
}

// handleApprove approves as the calling principal; four eyes (unless
// AllowSelfApproval) refuses the requester with 403 self_approval, changing nothing.
func (s *Server) handleApprove(w http.ResponseWriter, r *http.Request) error {
	return s.decide(w, r, func(ctx context.Context, id string) (domain.Operation, error) {
		op, err := s.st.OperationApproveBy(ctx, id, principal(r).Name, !s.cfg.AllowSelfApproval)
		if err != nil {
			return op, err
		}
		return s.urgentRound(ctx, op), nil // an urgent approval claims at once
	})
}

func (s *Server) handleReject(w http.ResponseWriter, r *http.Request) error {
	return s.decide(w, r, func(ctx context.Context, id string) (domain.Operation, error) {
		return s.st.OperationRejectBy(ctx, id, principal(r).Name)
	})
}

func (s *Server) handleRetry(w http.ResponseWriter, r *http.Request) error {
	return s.decide(w, r, func(ctx context.Context, id string) (domain.Operation, error) {
		return s.st.OperationRetryBy(ctx, id, principal(r).Name)
	})
}

// decide runs approve, reject or retry. They take no body; one sent is read (bounded)
// and ignored, so an approval flow that posts a comment is not refused.
func (s *Server) decide(w http.ResponseWriter, r *http.Request, fn func(context.Context, string) (domain.Operation, error)) error {
	id, err := opID(r)
	if err != nil {
		return err
	}
	if err := s.discardBody(w, r); err != nil {
		return err
	}
	op, err := fn(r.Context(), id)
	if err != nil {
		if errors.Is(err, store.ErrLostRace) && !errors.Is(err, store.ErrTxAborted) {
			return errf(http.StatusConflict, codeStale, "the operation or its binding changed concurrently; read it again")
		}
		return notFoundAs(err, "operation %q not found", id)
	}
	return s.writeOperation(r.Context(), w, http.StatusOK, op)
}

func (s *Server) handleOperationEvents(w http.ResponseWriter, r *http.Request) error {
	id, err := opID(r)
	if err != nil {
		return err
	}
	evs, err := s.st.OperationEvents(r.Context(), id)
	if err != nil {
		return notFoundAs(err, "operation %q not found", id)
	}
	out := make([]wire.Event, 0, len(evs))
	for _, e := range evs {
		out = append(out, renderEvent(e))
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": out})
	return nil
}

// writeOperation renders {"operation":{…}} with the MR URL of its batch, if any.
func (s *Server) writeOperation(ctx context.Context, w http.ResponseWriter, status int, op domain.Operation) error {
	mrURL := ""
	if op.BatchID != nil {
		u, err := s.st.BatchMRURL(ctx, *op.BatchID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		mrURL = u
	}
	writeJSON(w, status, map[string]any{"operation": renderOperation(op, mrURL)})
	return nil
}

// handleListBindings: GET /v1/bindings?subject=&target=&limit=&cursor=, oldest first.
// Paged like /v1/batches: pass next_cursor of the previous page; null means there is
// no further page (a target with more subjects than one page used to be cut short
// without a word).
func (s *Server) handleListBindings(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := queryLimit(q.Get("limit"), 100, 1000)
	if err != nil {
		return err
	}
	var after int64
	if v := q.Get("cursor"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after <= 0 {
			return badRequest("cursor is not one this server returned")
		}
	}
	bs, err := s.st.BindingList(r.Context(), q.Get("subject"), q.Get("target"), after, limit+1)
	if err != nil {
		return err
	}
	var next *string
	if len(bs) > limit {
		bs = bs[:limit]
		c := strconv.FormatInt(bs[len(bs)-1].ID, 10)
		next = &c
	}
	out := make([]wire.Binding, 0, len(bs))
	for _, b := range bs {
		out = append(out, renderBinding(b))
	}
	writeJSON(w, http.StatusOK, map[string]any{"bindings": out, "next_cursor": next})
	return nil
}

// queryLimit parses ?limit=: default def, 1..max.
func queryLimit(v string, def, max int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > max {
		return 0, badRequest("limit must be an integer from 1 to %d", max)
	}
	return n, nil
}

// notFoundAs gives a store ErrNotFound a message naming what was not found.
func notFoundAs(err error, format string, args ...any) error {
	if errors.Is(err, store.ErrNotFound) {
		return errf(http.StatusNotFound, codeNotFound, format, args...)
	}
	return err
}
