package api

// Queue control (issue #17): withdraw an operation, pause and resume a repository,
// the urgent lane's immediate round, and GET /v1/repos.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/wire"

	"github.com/batcherd/batcherd/internal/domain"
)

// actor names who made a request (its principal), for the records that say who
// paused or resumed a repository or withdrew an operation.
func actor(r *http.Request) string {
	if p := principal(r); p.Name != "" {
		return p.Name
	}
	return "unknown"
}

// handleWithdraw: POST /v1/operations/{id}/withdraw — pending_approval or queued →
// withdrawn, by the requester or an admin; 409 in_batch once a batch claimed it.
func (s *Server) handleWithdraw(w http.ResponseWriter, r *http.Request) error {
	id, err := opID(r)
	if err != nil {
		return err
	}
	if err := s.discardBody(w, r); err != nil {
		return err
	}
	// The requester or an admin: an application is its requester's to take back.
	// requested_by never changes, so this read decides as well as one inside the
	// withdrawal's transaction would. An operation without a recorded requester (made
	// before principals were recorded) is an admin's to withdraw.
	p := principal(r)
	if !p.Admin {
		cur, err := s.st.OperationGet(r.Context(), id)
		if err != nil {
			return notFoundAs(err, "operation %q not found", id)
		}
		if cur.RequestedBy == "" || cur.RequestedBy != p.Name {
			return errf(http.StatusForbidden, "forbidden", "only the operation's requester or an admin may withdraw it; %q is neither", p.Name)
		}
	}
	op, err := s.st.OperationWithdraw(r.Context(), id, actor(r))
	switch {
	case errors.Is(err, store.ErrInBatch):
		return errf(http.StatusConflict, codeInBatch, "the operation was claimed by a batch and can no longer be withdrawn: %v", err)
	case errors.Is(err, store.ErrLostRace):
		return errf(http.StatusConflict, codeStale, "the operation changed concurrently; read it again")
	case err != nil:
		return notFoundAs(err, "operation %q not found", id)
	}
	return s.writeOperation(r.Context(), w, http.StatusOK, op)
}

// urgentRound starts a claim round for repo at once, after an urgent operation was
// approved (or auto-approved) on this replica: the same code as the scheduled round
// (Rounds.RunRound), run before the approval is answered, so the answer already shows
// the operation in_batch when the round took it. It never preempts a running batch:
// a held slot is answered slot_occupied, and the replica that settles that batch
// claims the urgent work next (its follow-up round). Its outcome never fails the
// approval, which has committed: the scheduled round is the backstop.
func (s *Server) urgentRound(ctx context.Context, op domain.Operation) domain.Operation {
	if s.rounds == nil || op.Priority != domain.PriorityUrgent || op.Status != domain.OpQueued {
		return op
	}
	var res store.ClaimResult
	for attempt := 0; ; attempt++ {
		var err error
		res, err = s.rounds.RunRound(ctx, op.Repo)
		if err != nil {
			s.log.Warn("urgent round failed; the scheduled round will claim the operation", "repo", op.Repo, "operation", op.OperationID, "err", err)
			return op
		}
		// slot_occupied is final only when a batch holds the slot: its settlement claims
		// the urgent work next. A claim in flight that met us may instead end without a
		// batch (it read the waiting set before this approval committed and found
		// nothing, or lost a race): then nobody would claim until the schedule, so look
		// again, a few times, while no committed batch holds the slot.
		if res.Outcome != store.ClaimSlotOccupied || attempt == 4 {
			break
		}
		select {
		case <-ctx.Done():
			return op
		case <-time.After(time.Duration(10<<attempt) * time.Millisecond):
		}
		pre, err := s.st.BatchClaimPrecheck(ctx, op.Repo)
		if err != nil || pre.Held {
			break
		}
	}
	s.log.Info("urgent round", "repo", op.Repo, "operation", op.OperationID, "outcome", res.Outcome, "batch_id", res.BatchID)
	if res.Outcome == store.ClaimClaimed {
		if now, err := s.st.OperationGet(ctx, op.OperationID); err == nil {
			return now
		}
	}
	return op
}

// repoParam reads the path-escaped {repo} (platform%2Faccess); 404 unless configured.
func (s *Server) repoParam(r *http.Request) (string, error) {
	repo := r.PathValue("repo")
	if !s.repos[repo] {
		return "", errf(http.StatusNotFound, codeNotFound, "repository %q is not configured (BATCHERD_REPOS)", repo)
	}
	return repo, nil
}

type pauseRequest struct {
	Reason *string `json:"reason"`
	Until  *string `json:"until"`
}

// handlePause: POST /v1/admin/repos/{repo}/pause {"reason","until"?}.
func (s *Server) handlePause(w http.ResponseWriter, r *http.Request) error {
	repo, err := s.repoParam(r)
	if err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	if body == nil {
		return errf(http.StatusBadRequest, codeInvalidJSON, `request body is required: {"reason": "…", "until"?: "RFC 3339 time"}`)
	}
	var req pauseRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	reason, err := validReason(req.Reason)
	if err != nil {
		return err
	}
	var until *time.Time
	if req.Until != nil {
		t, err := time.Parse(time.RFC3339Nano, *req.Until)
		if err != nil {
			return badRequest("until must be an RFC 3339 time, e.g. 2026-12-24T18:00:00Z")
		}
		if t.Year() > 9999 {
			return badRequest("until is past year 9999")
		}
		t = t.UTC().Truncate(time.Microsecond)
		until = &t
	}
	c, err := s.st.RepoPause(r.Context(), store.RepoPauseParams{Repo: repo, Reason: reason, Until: until, By: actor(r)})
	if err != nil {
		if errors.Is(err, store.ErrInvalidRequest) {
			return badRequest("until must be in the future")
		}
		return err
	}
	return s.writeRepo(w, r, c)
}

// handleResume: POST /v1/admin/repos/{repo}/resume.
func (s *Server) handleResume(w http.ResponseWriter, r *http.Request) error {
	repo, err := s.repoParam(r)
	if err != nil {
		return err
	}
	if err := s.discardBody(w, r); err != nil {
		return err
	}
	c, err := s.st.RepoResume(r.Context(), repo, actor(r))
	if err != nil {
		return err
	}
	return s.writeRepo(w, r, c)
}

// writeRepo answers {"repo":{…}} with the repository's full state after a change.
func (s *Server) writeRepo(w http.ResponseWriter, r *http.Request, c store.RepoControl) error {
	states, err := s.st.RepoStates(r.Context(), []string{c.Repo})
	if err != nil {
		return err
	}
	states[0].RepoControl = c // what the change itself answered
	health, err := s.st.RepoHealths(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"repo": withHealth(s.renderRepo(states[0]), health)})
	return nil
}

// handleListRepos: GET /v1/repos — every configured repository, in configuration order.
func (s *Server) handleListRepos(w http.ResponseWriter, r *http.Request) error {
	states, err := s.st.RepoStates(r.Context(), s.cfg.Repos)
	if err != nil {
		return err
	}
	health, err := s.st.RepoHealths(r.Context())
	if err != nil {
		return err
	}
	out := make([]wire.Repo, 0, len(states))
	for _, st := range states {
		out = append(out, withHealth(s.renderRepo(st), health))
	}
	writeJSON(w, http.StatusOK, map[string]any{"repos": out})
	return nil
}

// handleRepoEvents: GET /v1/repos/{repo}/events — the repository's own history
// (pauses and resumes), oldest first.
func (s *Server) handleRepoEvents(w http.ResponseWriter, r *http.Request) error {
	repo, err := s.repoParam(r)
	if err != nil {
		return err
	}
	evs, err := s.st.RepoEvents(r.Context(), repo, 1000)
	if err != nil {
		return err
	}
	out := make([]wire.Event, 0, len(evs))
	for _, e := range evs {
		out = append(out, renderEvent(e))
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": out})
	return nil
}

func (s *Server) renderRepo(st store.RepoState) wire.Repo {
	o := wire.Repo{
		Repo: st.Repo, Paused: st.Paused, Waiting: st.Waiting,
		OldestWaitingAt: tsPtr(st.OldestWaitingAt), ActiveBatchID: st.ActiveBatchID,
	}
	// Who paused and why stay visible only while the pause is in force.
	if st.Paused {
		o.PauseReason, o.PausedUntil, o.PausedBy, o.PausedAt = &st.Reason, tsPtr(st.PausedUntil), &st.PausedBy, tsPtr(st.PausedAt)
	}
	return o
}

// validReason: a pause needs a reason (it is what the operators read): 1–1024
// printable characters of valid UTF-8 (line breaks and tabs are allowed in prose).
func validReason(p *string) (string, error) {
	if p == nil || strings.TrimSpace(*p) == "" {
		return "", badRequest("reason is required: say why the repository is paused")
	}
	v := *p
	if !utf8.ValidString(v) {
		return "", badRequest("reason must be valid UTF-8")
	}
	if utf8.RuneCountInString(v) > 1024 {
		return "", badRequest("reason must be at most 1024 characters")
	}
	for _, r := range v {
		if r != ' ' && r != '\n' && r != '\t' && !unicode.IsPrint(r) {
			return "", badRequest("reason must contain only printable characters, spaces, tabs and line breaks")
		}
	}
	return v, nil
}
