package api

import (
	"net/http"
	"strconv"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/wire"

	"github.com/batcherd/batcherd/internal/domain"
)

const (
	defaultBatchLimit = 50
	maxBatchLimit     = 100 // each listed batch carries its operation_ids
)

func (s *Server) handleGetBatch(w http.ResponseWriter, r *http.Request) error {
	id, ok := pathInt64(r, "id")
	if !ok {
		return errf(http.StatusNotFound, codeNotFound, "batch %q not found", r.PathValue("id"))
	}
	b, err := s.st.BatchGet(r.Context(), id)
	if err != nil {
		return notFoundAs(err, "batch %d not found", id)
	}
	writeJSON(w, http.StatusOK, map[string]any{"batch": renderBatch(b)})
	return nil
}

// handleListBatches: GET /v1/batches?repo=&status=&limit=&cursor=, newest first.
// cursor is opaque to clients: pass next_cursor of the previous page; null means
// there is no further page.
func (s *Server) handleListBatches(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := store.BatchFilter{Repo: q.Get("repo")}
	if v := q.Get("status"); v != "" {
		st, ok := domain.ParseBatchStatus(v)
		if !ok {
			return badRequest("status must be one of running, blocked, succeeded, failed; got %q", v)
		}
		f.Status = st
	}
	limit, err := queryLimit(q.Get("limit"), defaultBatchLimit, maxBatchLimit)
	if err != nil {
		return err
	}
	if v := q.Get("cursor"); v != "" {
		c, err := strconv.ParseInt(v, 10, 64)
		if err != nil || c <= 0 {
			return badRequest("cursor is not one this server returned")
		}
		f.AfterID = c
	}
	f.Limit = limit + 1 // one more tells whether another page exists
	bs, err := s.st.BatchList(r.Context(), f)
	if err != nil {
		return err
	}
	var next *string
	if len(bs) > limit {
		bs = bs[:limit]
		c := strconv.FormatInt(bs[len(bs)-1].ID, 10)
		next = &c
	}
	ids := make([]int64, len(bs))
	for i, b := range bs {
		ids[i] = b.ID
	}
	members, err := s.st.BatchOperationIDs(r.Context(), ids)
	if err != nil {
		return err
	}
	out := make([]wire.Batch, 0, len(bs))
	for _, b := range bs {
		b.OperationIDs = members[b.ID]
		out = append(out, renderBatch(b))
	}
	writeJSON(w, http.StatusOK, map[string]any{"batches": out, "next_cursor": next})
	return nil
}

type roundRequest struct {
	Repo *string `json:"repo"`
}

// handleAdminRound: POST /v1/admin/rounds {"repo"?}. Without repo the round covers
// every configured repository (what the schedule does).
func (s *Server) handleAdminRound(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	var req roundRequest
	if body != nil {
		if err := decodeStrict(body, &req); err != nil {
			return err
		}
	}
	repo := ""
	if req.Repo != nil {
		if !s.repos[*req.Repo] {
			return badRequest("repo %q is not configured", *req.Repo)
		}
		repo = *req.Repo
	}
	if s.rounds == nil {
		return errf(http.StatusServiceUnavailable, codeUnavailable, "claim rounds are not available on this server")
	}
	res, err := s.rounds.RunRound(r.Context(), repo)
	if err != nil {
		return err
	}
	out := wire.RoundResult{Outcome: string(res.Outcome)}
	if res.Outcome == store.ClaimClaimed {
		id := res.BatchID
		out.BatchID = &id
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// handleAdminSettle: POST /v1/admin/batches/{id}/settle — close-then-reread
// settlement through the scanner.
func (s *Server) handleAdminSettle(w http.ResponseWriter, r *http.Request) error {
	id, ok := pathInt64(r, "id")
	if !ok {
		return errf(http.StatusNotFound, codeNotFound, "batch %q not found", r.PathValue("id"))
	}
	if err := s.discardBody(w, r); err != nil {
		return err
	}
	if s.settler == nil {
		return errf(http.StatusServiceUnavailable, codeUnavailable, "settlement is not available on this server")
	}
	// The members' manual_settle events name the operator (their actor).
	b, err := s.settler.SettleBatch(store.WithActor(r.Context(), principal(r).Name), id)
	if err != nil {
		return notFoundAs(err, "batch %d not found", id)
	}
	if b.OperationIDs == nil {
		if full, err := s.st.BatchGet(r.Context(), id); err == nil {
			b.OperationIDs = full.OperationIDs
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"batch": renderBatch(b)})
	return nil
}
