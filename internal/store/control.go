package store

// Queue control (issue #17): a repository's pause, and the stray waiting rows a claim
// skips. The pause lives in repo_control, one row per repository, written by guarded
// statements like every other state (I6) and read by every replica's claim inside
// the claim's own transaction (batches.go), so a pause needs no cache and no message
// between replicas: the next claim anywhere obeys it.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// pausedNow is the SQL truth of "paused at this instant" for a repo_control row: a
// pause with an end time ends by itself then, by the database clock.
const pausedNow = `(paused = 1 AND (paused_until IS NULL OR paused_until > CURRENT_TIMESTAMP(6)))`

// Repository event codes (audit_event rows keyed by repo).
const (
	EventRepoPaused  = "repo_paused"
	EventRepoResumed = "repo_resumed"
)

// Bounds of repo_control's text columns.
const (
	pauseReasonLen = 1024
	pausedByLen    = 255
)

// RepoControl is a repository's control row as the API shows it. Paused is the pause
// in force now (DB clock): a pause whose end time has passed reads as not paused.
type RepoControl struct {
	Repo        string     `db:"repo"`
	Paused      bool       `db:"paused_now"`
	Reason      string     `db:"reason"`
	PausedUntil *time.Time `db:"paused_until"`
	PausedBy    string     `db:"paused_by"`
	PausedAt    *time.Time `db:"paused_at"`
	Version     int64      `db:"version"`
}

const repoControlCols = `repo, ` + pausedNow + ` AS paused_now, reason, paused_until, paused_by, paused_at, version`

// RepoControlEnsure inserts a never-paused control row for each repository that has
// none. The claim's shared-lock read of the row is what orders a claim against a
// pause; a row that does not exist yet cannot be locked, so replicas create the rows
// of their configured repositories at start-up, before they claim anything.
func (s *Store) RepoControlEnsure(ctx context.Context, repos []string) error {
	return forChunks(len(repos), maxInPlaceholders, func(lo, hi int) error {
		args := make([]any, 0, hi-lo)
		for _, r := range repos[lo:hi] {
			args = append(args, r)
		}
		_, err := s.exec1(ctx, "INSERT IGNORE INTO repo_control (repo) VALUES "+values("(?)", hi-lo), args...)
		return err
	})
}

// RepoControls returns the control rows of the given repositories (every repository
// gets one; a missing row reads as never paused).
func (s *Store) RepoControls(ctx context.Context, repos []string) (map[string]RepoControl, error) {
	out := make(map[string]RepoControl, len(repos))
	for _, r := range repos {
		out[r] = RepoControl{Repo: r}
	}
	if len(repos) == 0 {
		return out, nil
	}
	q, args, err := sqlx.In(`SELECT `+repoControlCols+` FROM repo_control WHERE repo IN (?)`, repos)
	if err != nil {
		return nil, err
	}
	var rows []RepoControl
	if err := s.db.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, translate(err)
	}
	for _, c := range rows {
		out[c.Repo] = c
	}
	return out, nil
}

// RepoPauseParams is one pause request.
type RepoPauseParams struct {
	Repo   string
	Reason string
	Until  *time.Time // nil: until resumed
	By     string     // who paused (the principal's name)
}

// RepoPause pauses repo, in one transaction: the control row is locked (created if
// missing), then written with version + 1, and a repo_paused event is recorded. Pausing
// a paused repository again replaces its reason, end time and author (idempotent: the
// repository stays paused). An end time not in the future (DB clock) is ErrInvalidRequest.
// A claim in flight that read the row before this pause holds a shared lock on it, so
// this waits for that claim to end: once RepoPause returns, no claim that had not read
// the row can claim.
func (s *Store) RepoPause(ctx context.Context, p RepoPauseParams) (RepoControl, error) {
	var out RepoControl
	err := s.withTx(ctx, opIso, func(tx *sqlx.Tx) error {
		if p.Until != nil {
			var future bool
			if err := tx.GetContext(ctx, &future, `SELECT ? > CURRENT_TIMESTAMP(6)`, p.Until.UTC()); err != nil {
				return err
			}
			if !future {
				return fmt.Errorf("%w: until is not in the future", ErrInvalidRequest)
			}
		}
		cur, err := lockRepoControl(ctx, tx, p.Repo)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE repo_control SET paused = 1, reason = ?, paused_until = ?, paused_by = ?,
			paused_at = CURRENT_TIMESTAMP(6), version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
			WHERE repo = ? AND version = ?`,
			truncRunes(p.Reason, pauseReasonLen), utcPtr(p.Until), truncRunes(p.By, pausedByLen), p.Repo, cur.Version)
		if err != nil {
			return err
		}
		if err := mustAffect(res, 1); err != nil {
			return err
		}
		detail := fmt.Sprintf("paused by %s: %s", p.By, p.Reason)
		if p.Until != nil {
			detail += " (until " + p.Until.UTC().Format(time.RFC3339) + ")"
		}
		if err := recordRepoEvent(ctx, tx, p.Repo, cur.Version+1, EventRepoPaused, detail, p.By); err != nil {
			return err
		}
		out, err = readRepoControl(ctx, tx, p.Repo)
		return err
	})
	return out, err
}

// RepoResume ends repo's pause, in one transaction, and records a repo_resumed event
// when it was paused. Resuming a repository that is not paused (never paused, resumed
// already, or a pause whose end time has passed) changes nothing and is no error.
func (s *Store) RepoResume(ctx context.Context, repo, by string) (RepoControl, error) {
	var out RepoControl
	err := s.withTx(ctx, opIso, func(tx *sqlx.Tx) error {
		cur, err := lockRepoControl(ctx, tx, repo)
		if err != nil {
			return err
		}
		if cur.Paused {
			res, err := tx.ExecContext(ctx, `UPDATE repo_control SET paused = 0, paused_until = NULL,
				version = version + 1, updated_at = CURRENT_TIMESTAMP(6) WHERE repo = ? AND version = ?`, repo, cur.Version)
			if err != nil {
				return err
			}
			if err := mustAffect(res, 1); err != nil {
				return err
			}
			if err := recordRepoEvent(ctx, tx, repo, cur.Version+1, EventRepoResumed, "resumed by "+by, by); err != nil {
				return err
			}
		}
		out, err = readRepoControl(ctx, tx, repo)
		return err
	})
	return out, err
}

// lockRepoControl locks repo's control row, creating it first when missing.
func lockRepoControl(ctx context.Context, tx *sqlx.Tx, repo string) (RepoControl, error) {
	if _, err := tx.ExecContext(ctx, `INSERT IGNORE INTO repo_control (repo) VALUES (?)`, repo); err != nil {
		return RepoControl{}, err
	}
	var c RepoControl
	err := tx.GetContext(ctx, &c, `SELECT `+repoControlCols+` FROM repo_control WHERE repo = ? FOR UPDATE`, repo)
	return c, err
}

func readRepoControl(ctx context.Context, tx *sqlx.Tx, repo string) (RepoControl, error) {
	var c RepoControl
	err := tx.GetContext(ctx, &c, `SELECT `+repoControlCols+` FROM repo_control WHERE repo = ?`, repo)
	return c, err
}

// recordRepoEvent appends an event to repo's history. The dedupe key names the
// repository by a hash (a path may be longer than the key) and the control row's
// version the event's write produced, so each pause or resume is recorded once.
func recordRepoEvent(ctx context.Context, tx *sqlx.Tx, repo string, version int64, code, detail, actor string) error {
	sum := sha256.Sum256([]byte(repo))
	key := fmt.Sprintf("repo:%s:v%d:%s", hex.EncodeToString(sum[:12]), version, code)
	_, err := tx.ExecContext(ctx, `INSERT INTO audit_event (dedupe_key, repo, code, detail, actor) VALUES (?, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE id = id`, key, repo, code, truncateUTF8(detail, auditDetailLen), truncRunes(actor, 128))
	return err
}

// RepoEvents returns repo's own history (pauses, resumes), oldest first, at most limit.
func (s *Store) RepoEvents(ctx context.Context, repo string, limit int) ([]Event, error) {
	if limit <= 0 {
		limit = 100
	}
	out := []Event{}
	err := s.db.SelectContext(ctx, &out, `SELECT id, dedupe_key, operation_id, batch_id, code, detail, actor, created_at
		FROM audit_event WHERE repo = ? ORDER BY id LIMIT ?`, repo, limit)
	return out, translate(err)
}

// Stray is a waiting row whose operation is not queued: the claim skips it.
type Stray struct {
	Repo        string `db:"repo"`
	OperationID string `db:"operation_id"`
	Status      string `db:"status"` // the operation's status; "" when it has no operation row
}

// WaitingStrays lists up to limit waiting rows (not claimed) whose operation is not
// queued. No path of this version writes one: admission, approval, withdrawal and the
// settlements move an operation and its waiting row together. A row left by an older
// version, a manual edit or a bug would otherwise sit in the waiting set for ever; the
// claim skips it, and this names it for the metric, the log and batcherd verify. It
// reads the whole waiting set (a periodic check, not a hot path).
func (s *Store) WaitingStrays(ctx context.Context, limit int) ([]Stray, error) {
	if limit <= 0 {
		limit = 1000
	}
	out := []Stray{}
	err := s.db.SelectContext(ctx, &out, `SELECT STRAIGHT_JOIN r.repo, r.operation_id, COALESCE(o.status, '') AS status
		FROM merge_batch_request r LEFT JOIN operation o ON o.operation_id = r.operation_id
		WHERE r.batch_id IS NULL AND (o.status IS NULL OR o.status <> 'queued')
		ORDER BY r.id LIMIT ?`, limit)
	return out, translate(err)
}

// RepoState is what GET /v1/repos shows of a repository from the database: its pause,
// its waiting set (depth and the oldest waiting row's admission time) and its active
// batch.
type RepoState struct {
	RepoControl
	Waiting         int64
	OldestWaitingAt *time.Time
	ActiveBatchID   *int64
}

// RepoStates reads the state of each repository in repos: the control rows, the
// waiting set of each through idx_repo_waiting's (repo, batch_id) prefix, and the
// active batches through uk_active_slot. Three plain reads, no transaction: each
// answer is a snapshot of its own moment, which is all a status listing promises.
func (s *Store) RepoStates(ctx context.Context, repos []string) ([]RepoState, error) {
	ctl, err := s.RepoControls(ctx, repos)
	if err != nil {
		return nil, err
	}
	out := make([]RepoState, len(repos))
	idx := make(map[string]int, len(repos))
	for i, r := range repos {
		out[i] = RepoState{RepoControl: ctl[r]}
		idx[r] = i
	}
	if len(repos) == 0 {
		return out, nil
	}
	q, args, err := sqlx.In(`SELECT repo, COUNT(*) AS n, MIN(created_at) AS oldest FROM merge_batch_request
		WHERE repo IN (?) AND batch_id IS NULL GROUP BY repo`, repos)
	if err != nil {
		return nil, err
	}
	var waits []struct {
		Repo   string    `db:"repo"`
		N      int64     `db:"n"`
		Oldest time.Time `db:"oldest"`
	}
	if err := s.db.SelectContext(ctx, &waits, q, args...); err != nil {
		return nil, translate(err)
	}
	for _, w := range waits {
		if i, ok := idx[w.Repo]; ok {
			t := w.Oldest
			out[i].Waiting, out[i].OldestWaitingAt = w.N, &t
		}
	}
	q, args, err = sqlx.In(`SELECT id, repo FROM merge_batch WHERE active_slot IN (?)`, repos)
	if err != nil {
		return nil, err
	}
	var active []struct {
		ID   int64  `db:"id"`
		Repo string `db:"repo"`
	}
	if err := s.db.SelectContext(ctx, &active, q, args...); err != nil {
		return nil, translate(err)
	}
	for _, a := range active {
		if i, ok := idx[a.Repo]; ok {
			id := a.ID
			out[i].ActiveBatchID = &id
		}
	}
	return out, nil
}
