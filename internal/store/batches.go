package store

// Batch-side store methods: the waiting set, the claim, the batch state machine and
// the sweeps' reads. Each exported method is one transaction through withTx, or one
// autocommit statement (which is its own transaction) through the query helpers below.
//
// Batch paths are set-based: one statement per chunk of at most maxInPlaceholders
// placeholders, never one statement per member.

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// ClaimOutcome is the result of one claim attempt. None of them is an error.
type ClaimOutcome string

const (
	ClaimClaimed        ClaimOutcome = "claimed"
	ClaimSlotOccupied   ClaimOutcome = "slot_occupied"
	ClaimNothingToClaim ClaimOutcome = "nothing_to_claim"
	ClaimPreempted      ClaimOutcome = "preempted"
)

// ClaimResult describes one claim attempt.
type ClaimResult struct {
	Outcome      ClaimOutcome
	BatchID      int64    // set when Outcome == ClaimClaimed
	OperationIDs []string // claimed members, oldest first
}

// Audit event codes written by the batch side. Batch events carry batch_id only; member
// events carry both the operation and the batch, so an operation's history explains
// which round it went through and how that round ended.
const (
	EventBatchClaimed  = "batch_claimed"
	EventBatchBlocked  = "batch_blocked"
	EventBatchMerged   = "batch_merged"
	EventBatchFailed   = "batch_failed"
	EventMemberClaimed = "in_batch"
	EventMemberMerged  = "merged"
	EventMemberFailed  = "failed"
)

// maxInPlaceholders bounds the placeholders of one statement. Batches can be large, and
// one huge IN list makes a statement whose plan and packet size nobody has tested.
const maxInPlaceholders = 500

// batchCols lists merge_batch's columns except the generated active_slot, which Batch
// does not carry (sqlx refuses a column without a destination).
const batchCols = "id, repo, status, version, size, source_branch, mr_iid, mr_url, mr_sha, " +
	"next_check_at, error_code, error_message, created_at, updated_at, finished_at"

// memberOpCols lists operation's columns as Operation carries them, prefixed for joins.
// attributes is NULL when the application had none, and json.RawMessage cannot scan
// NULL, so it reads as empty.
const memberOpCols = "o.id, o.operation_id, o.subject, o.target, o.repo, o.action, o.status, " +
	"o.version, o.expires_at, COALESCE(o.attributes, '') AS attributes, o.batch_id, o.attempts, o.error_code, " +
	"o.error_message, o.created_at, o.updated_at"

// The fixed read queries of the batch side, named so the EXPLAIN test checks exactly
// the text the store runs (export_test.go). The IN-list writes are built per call.
const (
	// qWaitingExists: the claim's lock-free precheck (idx_repo_waiting).
	qWaitingExists = "SELECT EXISTS (SELECT 1 FROM merge_batch_request WHERE repo = ? AND batch_id IS NULL)"
	// qWaitingRepos: repositories with waiting work (loose scan of idx_repo_waiting).
	qWaitingRepos = "SELECT DISTINCT repo FROM merge_batch_request WHERE batch_id IS NULL ORDER BY repo LIMIT ?"
	// qClaimRead: waiting rows of a repository, oldest first (idx_repo_waiting, index
	// order, no sort). Deliberately without FOR UPDATE (I3).
	qClaimRead = `SELECT id, operation_id FROM merge_batch_request
		WHERE repo = ? AND batch_id IS NULL ORDER BY created_at, id LIMIT ?`
	// qMemberIDs: member history of a batch (primary key prefix).
	qMemberIDs = "SELECT operation_id FROM merge_batch_member WHERE batch_id = ? ORDER BY operation_id"
	// qBatchMembers: the member operations publish writes (member PK, then uk_operation_id).
	qBatchMembers = "SELECT " + memberOpCols + ` FROM merge_batch_member m
		JOIN operation o ON o.operation_id = m.operation_id
		WHERE m.batch_id = ? ORDER BY m.operation_id`
	// qBatchesDue: active batches due for a check (idx_status_next_check).
	qBatchesDue = "SELECT " + batchCols + ` FROM merge_batch
		WHERE status IN (1, 4) AND next_check_at <= CURRENT_TIMESTAMP(6)
		ORDER BY next_check_at, id LIMIT ?`
	// qBatchesTimedOut: active batches older than the timeout. No ORDER BY: with one,
	// the optimizer walks the whole primary key in id order instead of the small range
	// of active statuses; the caller sorts the few rows it gets.
	qBatchesTimedOut = "SELECT " + batchCols + ` FROM merge_batch
		WHERE status IN (1, 4) AND created_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		LIMIT ?`
	// qFailedWithMR: recently failed batches with an MR (idx_status_updated). updated_at
	// bounds the index range: a FAILED batch is not written again except by "merged
	// wins", which moves it out of FAILED, so updated_at == finished_at here.
	qFailedWithMR = "SELECT " + batchCols + ` FROM merge_batch
		WHERE status = 3 AND updated_at >= CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		  AND finished_at >= CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		  AND mr_iid IS NOT NULL
		ORDER BY updated_at, id LIMIT ?`
	// qWaitingStats: depth and oldest age per repository (covering scan of
	// idx_repo_waiting; a periodic metric, not a hot path).
	qWaitingStats = `SELECT repo, COUNT(*) AS depth,
		TIMESTAMPDIFF(MICROSECOND, MIN(created_at), CURRENT_TIMESTAMP(6)) / 1000000 AS oldest_age
		FROM merge_batch_request WHERE batch_id IS NULL
		GROUP BY repo ORDER BY repo`
	// qCleanupWaiting: waiting rows of SUCCEEDED batches finished long enough ago
	// (idx_status_updated, then idx_batch). No ORDER BY: any chunk will do, and ordering
	// by r.id makes the optimizer walk the waiting table's primary key instead.
	qCleanupWaiting = `SELECT r.id FROM merge_batch b
		JOIN merge_batch_request r ON r.batch_id = b.id
		WHERE b.status = 2 AND b.updated_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		  AND b.finished_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		LIMIT ?`
)

// Lengths of the bounded text columns written from caller input; longer values are cut
// rather than refused, because a settle must not fail over the length of a message.
const (
	errorCodeLen    = 64
	errorMessageLen = 1024
	auditDetailLen  = 2048
)

// inPlaceholders returns "?,?,…" with n marks.
func inPlaceholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}

// forChunks calls fn for consecutive [lo, hi) windows of at most size elements of n.
func forChunks(n, size int, fn func(lo, hi int) error) error {
	for lo := 0; lo < n; lo += size {
		hi := min(lo+size, n)
		if err := fn(lo, hi); err != nil {
			return err
		}
	}
	return nil
}

// truncRunes cuts s to at most n characters without splitting a UTF-8 sequence.
func truncRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}

// micros converts a duration to the integer microseconds that INTERVAL ? MICROSECOND
// takes. Negative durations are treated as zero: a lease or age is never negative.
func micros(d time.Duration) int64 {
	if d < 0 {
		return 0
	}
	return d.Microseconds()
}

// exec1 runs one autocommit statement. A single statement outside BEGIN/COMMIT is its own
// transaction, and on the hottest paths (admission) it saves two round trips.
func (s *Store) exec1(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := s.db.ExecContext(ctx, query, args...)
	return res, translate(err)
}

// Admit inserts an operation into its repository's waiting set (I4). It returns false,
// and no error, when the operation was already admitted: the 1062 is the answer.
// (Callers that admit inside their own transaction use admitTx in operations.go.)
func (s *Store) Admit(ctx context.Context, operationID, repo string) (bool, error) {
	_, err := s.exec1(ctx,
		"INSERT INTO merge_batch_request (operation_id, repo) VALUES (?, ?)", operationID, repo)
	if errors.Is(err, ErrDuplicate) {
		return false, nil
	}
	return err == nil, err
}

// WaitingExists is the claim's lock-free precheck: is anything waiting in repo?
// Runs outside any transaction.
func (s *Store) WaitingExists(ctx context.Context, repo string) (bool, error) {
	var ok bool
	err := s.db.GetContext(ctx, &ok, qWaitingExists, repo)
	return ok, translate(err)
}

// WaitingRepos lists the repositories that have waiting requests, in name order, so the
// claim loop knows where to try. Lock-free; the index serves it with a loose scan.
func (s *Store) WaitingRepos(ctx context.Context, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 1000
	}
	var repos []string
	err := s.db.SelectContext(ctx, &repos, qWaitingRepos, limit)
	return repos, translate(err)
}

// waitingRow is one row of the waiting set as the claim reads it.
type waitingRow struct {
	ID          int64  `db:"id"`
	OperationID string `db:"operation_id"`
}

// BatchClaim claims up to max waiting requests of repo into a new RUNNING batch, in one
// READ COMMITTED transaction: insert the slot row (1062/1213/1205 → slot_occupied),
// read waiting rows without FOR UPDATE (empty → roll back, nothing_to_claim), guarded
// UPDATE … WHERE batch_id IS NULL AND id IN (…) (affected ≠ read → roll back, preempted),
// member history appended in bulk, operations queued → in_batch.
//
// Every waiting row must have a queued operation (admission commits both together); if
// one does not, the claim rolls back as preempted rather than half-claim, and keeps doing
// so until an operator removes the stray row — a loud, visible state, not a silent one.
func (s *Store) BatchClaim(ctx context.Context, repo string, max int) (ClaimResult, error) {
	if max < 1 {
		return ClaimResult{}, fmt.Errorf("store: BatchClaim max must be at least 1, got %d", max)
	}
	var res ClaimResult
	slotTaken := false
	// READ COMMITTED, not the server's REPEATABLE READ: when the claim takes every waiting
	// row the optimizer may scan the whole index for the guarded UPDATE, and under
	// REPEATABLE READ that leaves next-key locks on the waiting range and the gap at its
	// end, so admissions wait until the claim commits (DESIGN §7, I3). READ COMMITTED
	// takes no gap locks and releases non-matching rows at once. Correctness does not
	// need a snapshot here: the slot keeps other claimants out, and the guarded UPDATE's
	// affected-row check catches any row claimed elsewhere (I2).
	err := s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		r, err := tx.ExecContext(ctx, "INSERT INTO merge_batch (repo, status) VALUES (?, ?)", repo, BatchRunning)
		if err != nil {
			// 1062: another batch holds the slot. 1213/1205: we queued behind another
			// claimant that rolled back and the server picked us as the victim. All three
			// mean "occupied, try next round".
			if te := translate(err); errors.Is(te, ErrDuplicate) || errors.Is(te, ErrLostRace) {
				res.Outcome = ClaimSlotOccupied
				return errRollback
			}
			return err
		}
		slotTaken = true
		batchID, err := r.LastInsertId()
		if err != nil {
			return err
		}

		var rows []waitingRow
		// No FOR UPDATE: a locking read would put next-key locks where admissions insert.
		if err := tx.SelectContext(ctx, &rows, qClaimRead, repo, max); err != nil {
			return err
		}
		if len(rows) == 0 {
			// Committing would leave a memberless RUNNING batch holding the slot.
			res.Outcome = ClaimNothingToClaim
			return errRollback
		}
		reqIDs := make([]int64, len(rows))
		opIDs := make([]string, len(rows))
		for i, w := range rows {
			reqIDs[i], opIDs[i] = w.ID, w.OperationID
		}
		if s.Hooks != nil && s.Hooks.ClaimAfterRead != nil {
			s.Hooks.ClaimAfterRead(ctx, batchID, slices.Clone(reqIDs))
		}

		// I2: claim only rows still unclaimed; any shortfall means another transaction
		// got some of them between our read and this write, so nothing is kept.
		sortedReq := slices.Clone(reqIDs)
		slices.Sort(sortedReq)
		var claimed int64
		if err := forChunks(len(sortedReq), maxInPlaceholders, func(lo, hi int) error {
			args := make([]any, 0, hi-lo+1)
			args = append(args, batchID)
			for _, id := range sortedReq[lo:hi] {
				args = append(args, id)
			}
			r, err := tx.ExecContext(ctx,
				"UPDATE merge_batch_request SET batch_id = ? WHERE batch_id IS NULL AND id IN ("+
					inPlaceholders(hi-lo)+")", args...)
			if err != nil {
				return err
			}
			n, err := r.RowsAffected()
			claimed += n
			return err
		}); err != nil {
			return err
		}
		if claimed != int64(len(rows)) {
			res.Outcome = ClaimPreempted
			return errRollback
		}

		// Operations queued → in_batch, in key order. The same all-or-nothing rule holds:
		// a member whose operation is not queued would be written to the repository
		// without ever being settled.
		sortedOps := slices.Clone(opIDs)
		slices.Sort(sortedOps)
		var moved int64
		if err := forChunks(len(sortedOps), maxInPlaceholders, func(lo, hi int) error {
			args := make([]any, 0, hi-lo+3)
			args = append(args, OpInBatch, batchID)
			for _, id := range sortedOps[lo:hi] {
				args = append(args, id)
			}
			args = append(args, OpQueued)
			r, err := tx.ExecContext(ctx,
				`UPDATE operation SET status = ?, batch_id = ?,
				        version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
				  WHERE operation_id IN (`+inPlaceholders(hi-lo)+`) AND status = ?`, args...)
			if err != nil {
				return err
			}
			n, err := r.RowsAffected()
			moved += n
			return err
		}); err != nil {
			return err
		}
		if moved != int64(len(rows)) {
			res.Outcome = ClaimPreempted
			return errRollback
		}

		// Member history, multi-row INSERTs (two placeholders per row).
		if err := forChunks(len(sortedOps), maxInPlaceholders/2, func(lo, hi int) error {
			args := make([]any, 0, 2*(hi-lo))
			for _, id := range sortedOps[lo:hi] {
				args = append(args, batchID, id)
			}
			_, err := tx.ExecContext(ctx,
				"INSERT INTO merge_batch_member (batch_id, operation_id) VALUES "+
					strings.TrimSuffix(strings.Repeat("(?,?),", hi-lo), ","), args...)
			return err
		}); err != nil {
			return err
		}

		// The batch row is still invisible to everyone else, so this write needs no
		// version guard or bump.
		r, err = tx.ExecContext(ctx,
			"UPDATE merge_batch SET size = ?, source_branch = ? WHERE id = ?",
			len(rows), BranchName(batchID), batchID)
		if err != nil {
			return err
		}
		if err := mustAffect(r, 1); err != nil {
			return err
		}

		if err := recordBatchEvents(ctx, tx, batchID, EventBatchClaimed, "claimed",
			fmt.Sprintf("claimed %d operation(s) of %s", len(rows), repo),
			EventMemberClaimed, sortedOps, fmt.Sprintf("claimed into batch %d", batchID)); err != nil {
			return err
		}

		if s.Hooks != nil && s.Hooks.ClaimAfterUpdate != nil {
			s.Hooks.ClaimAfterUpdate(ctx, batchID)
		}
		res = ClaimResult{Outcome: ClaimClaimed, BatchID: batchID, OperationIDs: opIDs}
		return nil
	})
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, errRollback):
		return ClaimResult{Outcome: res.Outcome}, nil
	case errors.Is(err, ErrLostRace) && slotTaken:
		// A deadlock or lock-wait victim after the slot was ours: the server rolled
		// everything back, including the slot. Another transaction interfered; try again
		// next round.
		return ClaimResult{Outcome: ClaimPreempted}, nil
	case errors.Is(err, ErrLostRace):
		return ClaimResult{Outcome: ClaimSlotOccupied}, nil
	}
	return ClaimResult{}, err
}

// recordBatchEvents appends one batch event and one event per member, all with INSERT
// IGNORE on the unique dedupe key so re-recording is a no-op. The dedupe keys embed the
// batch id and the transition, and every transition happens once per batch, so a
// duplicate can only be a replay of the same fact.
func recordBatchEvents(ctx context.Context, tx *sqlx.Tx, batchID int64, batchCode, verb, batchDetail,
	memberCode string, opIDs []string, memberDetail string) error {
	if _, err := tx.ExecContext(ctx,
		`INSERT IGNORE INTO audit_event (dedupe_key, batch_id, code, detail) VALUES (?, ?, ?, ?)`,
		fmt.Sprintf("batch:%d:%s", batchID, verb), batchID, batchCode,
		truncRunes(batchDetail, auditDetailLen)); err != nil {
		return err
	}
	detail := truncRunes(memberDetail, auditDetailLen)
	const perRow = 5
	return forChunks(len(opIDs), maxInPlaceholders/perRow, func(lo, hi int) error {
		args := make([]any, 0, perRow*(hi-lo))
		for _, id := range opIDs[lo:hi] {
			args = append(args, fmt.Sprintf("op:%s:batch:%d:%s", id, batchID, verb), id, batchID, memberCode, detail)
		}
		_, err := tx.ExecContext(ctx,
			"INSERT IGNORE INTO audit_event (dedupe_key, operation_id, batch_id, code, detail) VALUES "+
				strings.TrimSuffix(strings.Repeat("(?,?,?,?,?),", hi-lo), ","), args...)
		return err
	})
}

// getBatch reads one batch row through q (the pool or a transaction).
func getBatch(ctx context.Context, q sqlx.QueryerContext, id int64) (Batch, error) {
	var b Batch
	err := sqlx.GetContext(ctx, q, &b, "SELECT "+batchCols+" FROM merge_batch WHERE id = ?", id)
	return b, translate(err)
}

// memberIDs returns the operation ids of a batch's member history, sorted.
func memberIDs(ctx context.Context, q sqlx.QueryerContext, batchID int64) ([]string, error) {
	ids := []string{}
	err := sqlx.SelectContext(ctx, q, &ids, qMemberIDs, batchID)
	return ids, translate(err)
}

// BatchGet returns a batch with its OperationIDs (from member history).
func (s *Store) BatchGet(ctx context.Context, id int64) (Batch, error) {
	var b Batch
	// REPEATABLE READ so the batch row and its member list come from one snapshot.
	err := s.withTx(ctx, sql.LevelRepeatableRead, func(tx *sqlx.Tx) error {
		var err error
		if b, err = getBatch(ctx, tx, id); err != nil {
			return err
		}
		b.OperationIDs, err = memberIDs(ctx, tx, id)
		return err
	})
	return b, err
}

// BatchFilter selects batches for BatchList. Results are ordered by id descending;
// AfterID is the cursor (return batches with id < AfterID when > 0).
type BatchFilter struct {
	Repo    string
	Status  BatchStatus // 0 = any
	Limit   int         // default 50, max 500
	AfterID int64
}

// BatchList lists batches (without OperationIDs).
func (s *Store) BatchList(ctx context.Context, f BatchFilter) ([]Batch, error) {
	if f.Limit <= 0 {
		f.Limit = 50
	}
	f.Limit = min(f.Limit, 500)
	var where []string
	var args []any
	if f.Repo != "" {
		where = append(where, "repo = ?")
		args = append(args, f.Repo)
	}
	if f.Status != 0 {
		where = append(where, "status = ?")
		args = append(args, f.Status)
	}
	if f.AfterID > 0 {
		where = append(where, "id < ?")
		args = append(args, f.AfterID)
	}
	q := "SELECT " + batchCols + " FROM merge_batch"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id DESC LIMIT ?"
	args = append(args, f.Limit)
	out := []Batch{}
	err := s.db.SelectContext(ctx, &out, q, args...)
	return out, translate(err)
}

// BatchMembers returns the operations of a batch (from member history), sorted by
// operation_id — what publish needs to write the files.
func (s *Store) BatchMembers(ctx context.Context, batchID int64) ([]Operation, error) {
	out := []Operation{}
	err := s.db.SelectContext(ctx, &out, qBatchMembers, batchID)
	return out, translate(err)
}

// BatchesDue is the fetch half of fetch → tryLock: active batches whose next_check_at
// has passed (DB clock), oldest check first. Read without locks.
func (s *Store) BatchesDue(ctx context.Context, limit int) ([]Batch, error) {
	if limit <= 0 {
		limit = 100
	}
	out := []Batch{}
	err := s.db.SelectContext(ctx, &out, qBatchesDue, limit)
	return out, translate(err)
}

// guardedBatchWrite runs one guarded UPDATE on merge_batch (the caller's SET and status
// guard, plus version guard, version bump and updated_at) and returns the row as now
// stored. ErrLostRace when the guard matched nothing.
func (s *Store) guardedBatchWrite(ctx context.Context, id, version int64, set, statusGuard string, args ...any) (Batch, error) {
	var b Batch
	// READ COMMITTED: the write is a single-row primary-key UPDATE whose guard reads the
	// latest committed row anyway; the lower level just avoids any gap locking and the
	// snapshot-isolation 1020 that newer MariaDB raises under REPEATABLE READ.
	err := s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		all := append(slices.Clone(args), id, version)
		r, err := tx.ExecContext(ctx, "UPDATE merge_batch SET "+set+
			", version = version + 1, updated_at = CURRENT_TIMESTAMP(6) WHERE id = ? AND version = ? AND "+
			statusGuard, all...)
		if err != nil {
			return err
		}
		if err := mustAffect(r, 1); err != nil {
			return err
		}
		b, err = getBatch(ctx, tx, id)
		return err
	})
	return b, err
}

// BatchReserve is the tryLock half: it pushes next_check_at to NOW(6)+lease and bumps
// version, guarded on id, version and an active status. It returns the batch as now
// stored, or ErrLostRace when another replica took it first.
func (s *Store) BatchReserve(ctx context.Context, id, version int64, lease time.Duration) (Batch, error) {
	return s.guardedBatchWrite(ctx, id, version,
		"next_check_at = CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND", "status IN (1, 4)", micros(lease))
}

// BatchMarkDue makes an active batch due for a check now (webhook hint). It does not
// bump version: it is a scheduling hint, and bumping would make an in-flight publish
// lose its guarded MR write.
func (s *Store) BatchMarkDue(ctx context.Context, id int64) error {
	// Not a state write, so neither version nor updated_at moves. A batch that is no
	// longer active is simply not touched: a late hint is not an error.
	_, err := s.exec1(ctx,
		"UPDATE merge_batch SET next_check_at = CURRENT_TIMESTAMP(6) WHERE id = ? AND status IN (1, 4)", id)
	return err
}

// MRRecord is what publish records on a batch.
type MRRecord struct {
	IID int64
	URL string
	SHA string // the head sha batcherd committed; every merge is guarded on it
}

// BatchRecordMR records the MR on a RUNNING batch, guarded on version (fencing: done
// before any merge is armed). ErrLostRace when the batch moved on.
func (s *Store) BatchRecordMR(ctx context.Context, id, version int64, mr MRRecord) (Batch, error) {
	return s.guardedBatchWrite(ctx, id, version,
		"mr_iid = ?, mr_url = ?, mr_sha = ?", "status = 1", mr.IID, truncRunes(mr.URL, 1024), mr.SHA)
}

// BatchBlock moves RUNNING → BLOCKED (keeps the slot) with a reason, guarded on version.
func (s *Store) BatchBlock(ctx context.Context, id, version int64, code, message string) (Batch, error) {
	return s.guardedBatchWrite(ctx, id, version,
		"status = 4, error_code = ?, error_message = ?", "status = 1",
		truncRunes(code, errorCodeLen), truncRunes(message, errorMessageLen))
}

// BatchUnblock moves BLOCKED → RUNNING (e.g. the pipeline was retried), guarded on version.
// The block reason is cleared: a running batch carries no error.
func (s *Store) BatchUnblock(ctx context.Context, id, version int64) (Batch, error) {
	return s.guardedBatchWrite(ctx, id, version,
		"status = 1, error_code = '', error_message = ''", "status = 4")
}

// settledOp is a member operation as a settlement locks it.
type settledOp struct {
	OperationID string `db:"operation_id"`
	Action      Action `db:"action"`
	Subject     string `db:"subject"`
	Target      string `db:"target"`
}

// settlePlan says what one settlement does to the members and their bindings.
type settlePlan struct {
	to            BatchStatus
	opFrom, opTo  OpStatus
	grantFrom     BindingStatus // binding of a grant member: grantFrom → grantTo
	grantTo       BindingStatus
	revokeFrom    BindingStatus // binding of a revoke member: revokeFrom → revokeTo
	revokeTo      BindingStatus
	code, message string // batch and operation error; empty on success
	deleteWaiting bool
	eventBatch    string
	eventMember   string
	verb          string
	detail        string
}

// BatchSettleSucceeded settles a batch as merged in one transaction, batch guard first
// (status = from AND version = version → SUCCEEDED), then members in_batch → merged and
// their bindings (grant → active, revoke → closed), operations before bindings, keys
// sorted. from is RUNNING or BLOCKED normally, FAILED when a human merged an MR after
// batcherd failed it (merged wins). ErrLostRace when another settler was first.
func (s *Store) BatchSettleSucceeded(ctx context.Context, id int64, from BatchStatus, version int64) (Batch, error) {
	p := settlePlan{
		to: BatchSucceeded, opFrom: OpInBatch, opTo: OpMerged,
		grantFrom: BindingPending, grantTo: BindingActive,
		revokeFrom: BindingRevoking, revokeTo: BindingClosed,
		eventBatch: EventBatchMerged, eventMember: EventMemberMerged, verb: "merged",
		detail: "merge request merged",
	}
	switch from {
	case BatchRunning, BatchBlocked:
	case BatchFailed:
		// Merged wins: the repository holds the files although the database said the
		// batch failed, so members and bindings follow the repository from the states the
		// failure left them in (grant binding failed, revoke binding back to active).
		p.opFrom, p.grantFrom, p.revokeFrom = OpFailed, BindingFailed, BindingActive
		p.detail = "merge request merged after the batch was settled failed: the repository wins"
	default:
		return Batch{}, fmt.Errorf("store: cannot settle a batch as succeeded from status %s", from)
	}
	return s.settle(ctx, id, from, version, p)
}

// BatchSettleFailed settles a batch as failed in one transaction, batch guard first
// (active status AND version → FAILED with code/message), then members in_batch →
// failed with the reason, bindings (grant → failed, revoke → back to active), waiting
// rows deleted; member history and audit kept. ErrLostRace when another settler was first.
func (s *Store) BatchSettleFailed(ctx context.Context, id int64, from BatchStatus, version int64, code, message string) (Batch, error) {
	if !from.Active() {
		return Batch{}, fmt.Errorf("store: cannot settle a batch as failed from status %s", from)
	}
	code, message = truncRunes(code, errorCodeLen), truncRunes(message, errorMessageLen)
	return s.settle(ctx, id, from, version, settlePlan{
		to: BatchFailed, opFrom: OpInBatch, opTo: OpFailed,
		grantFrom: BindingPending, grantTo: BindingFailed,
		revokeFrom: BindingRevoking, revokeTo: BindingActive,
		code: code, message: message,
		// The waiting rows go so that a retry can admit the operation again (the
		// waiting set is unique on operation_id); the member history keeps the record.
		deleteWaiting: true,
		eventBatch:    EventBatchFailed, eventMember: EventMemberFailed, verb: "failed",
		detail: code + ": " + message,
	})
}

// settle is the one settlement transaction. Order matters and is the same everywhere so
// concurrent settlers and claims take locks in one order: the batch row first (a second
// settler fails right there and changes nothing), then operations in key order, then
// bindings in key order, then the waiting rows.
func (s *Store) settle(ctx context.Context, id int64, from BatchStatus, version int64, p settlePlan) (Batch, error) {
	var b Batch
	// READ COMMITTED: every statement is a guarded or locking write on rows found by
	// unique keys, which read the latest committed version anyway; the lower level keeps
	// the IN-list range writes from taking gap locks that admissions or other settles
	// would queue behind.
	err := s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		r, err := tx.ExecContext(ctx,
			`UPDATE merge_batch SET status = ?, error_code = ?, error_message = ?,
			        finished_at = CURRENT_TIMESTAMP(6), version = version + 1,
			        updated_at = CURRENT_TIMESTAMP(6)
			  WHERE id = ? AND status = ? AND version = ?`,
			p.to, p.code, p.message, id, from, version)
		if err != nil {
			return err
		}
		if err := mustAffect(r, 1); err != nil {
			return err
		}

		members, err := memberIDs(ctx, tx, id)
		if err != nil {
			return err
		}

		// Operations: lock the members still in the expected state in this batch (a
		// member retried into another batch has another batch_id and is left alone),
		// then move exactly those.
		var ops []settledOp
		if err := forChunks(len(members), maxInPlaceholders, func(lo, hi int) error {
			args := make([]any, 0, hi-lo+2)
			for _, m := range members[lo:hi] {
				args = append(args, m)
			}
			args = append(args, id, p.opFrom)
			var chunk []settledOp
			if err := tx.SelectContext(ctx, &chunk,
				`SELECT operation_id, action, subject, target FROM operation
				  WHERE operation_id IN (`+inPlaceholders(hi-lo)+`) AND batch_id = ? AND status = ?
				  ORDER BY operation_id FOR UPDATE`, args...); err != nil {
				return err
			}
			if len(chunk) == 0 {
				return nil
			}
			ops = append(ops, chunk...)
			upd := make([]any, 0, len(chunk)+5)
			upd = append(upd, p.opTo, p.code, p.message)
			for _, o := range chunk {
				upd = append(upd, o.OperationID)
			}
			upd = append(upd, id, p.opFrom)
			r, err := tx.ExecContext(ctx,
				`UPDATE operation SET status = ?, error_code = ?, error_message = ?,
				        version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
				  WHERE operation_id IN (`+inPlaceholders(len(chunk))+`) AND batch_id = ? AND status = ?`, upd...)
			if err != nil {
				return err
			}
			// We hold the row locks since the SELECT, so anything but a full match means
			// the rows are not what we locked: refuse rather than half-settle.
			return mustAffect(r, int64(len(chunk)))
		}); err != nil {
			return err
		}

		// Bindings, grants then revokes, each in (subject, target) order, guarded on the
		// binding still belonging to that operation and being in the expected state.
		// A binding that does not match is left as it is: the batch outcome is a fact
		// about the repository and must not be refused over one relation, and I5 keeps
		// a binding with an in-flight operation from being taken over anyway.
		for _, kind := range []struct {
			action   Action
			from, to BindingStatus
		}{{ActionGrant, p.grantFrom, p.grantTo}, {ActionRevoke, p.revokeFrom, p.revokeTo}} {
			var sel []settledOp
			for _, o := range ops {
				if o.Action == kind.action {
					sel = append(sel, o)
				}
			}
			slices.SortFunc(sel, func(a, b settledOp) int {
				if c := strings.Compare(a.Subject, b.Subject); c != 0 {
					return c
				}
				return strings.Compare(a.Target, b.Target)
			})
			if err := forChunks(len(sel), maxInPlaceholders/3, func(lo, hi int) error {
				args := make([]any, 0, 3*(hi-lo)+2)
				args = append(args, kind.to)
				for _, o := range sel[lo:hi] {
					args = append(args, o.Subject, o.Target, o.OperationID)
				}
				args = append(args, kind.from)
				_, err := tx.ExecContext(ctx,
					`UPDATE binding SET status = ?, version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
					  WHERE (subject, target, operation_id) IN (`+
						strings.TrimSuffix(strings.Repeat("(?,?,?),", hi-lo), ",")+`) AND status = ?`, args...)
				return err
			}); err != nil {
				return err
			}
		}

		if p.deleteWaiting {
			if _, err := tx.ExecContext(ctx, "DELETE FROM merge_batch_request WHERE batch_id = ?", id); err != nil {
				return err
			}
		}

		settled := make([]string, len(ops))
		for i, o := range ops {
			settled[i] = o.OperationID
		}
		if err := recordBatchEvents(ctx, tx, id, p.eventBatch, p.verb,
			fmt.Sprintf("%s; %d of %d member(s) moved to %s", p.detail, len(ops), len(members), p.opTo),
			p.eventMember, settled, fmt.Sprintf("batch %d %s: %s", id, p.verb, p.detail)); err != nil {
			return err
		}

		if b, err = getBatch(ctx, tx, id); err != nil {
			return err
		}
		b.OperationIDs = members
		return nil
	})
	return b, err
}

// BatchesTimedOut returns active batches created more than timeout ago (DB clock).
func (s *Store) BatchesTimedOut(ctx context.Context, timeout time.Duration, limit int) ([]Batch, error) {
	if limit <= 0 {
		limit = 100
	}
	out := []Batch{}
	err := s.db.SelectContext(ctx, &out, qBatchesTimedOut, micros(timeout), limit)
	slices.SortFunc(out, func(a, b Batch) int { return cmp.Compare(a.ID, b.ID) })
	return out, translate(err)
}

// BatchesFailedWithMR returns FAILED batches with a recorded MR finished within the
// last `within` (DB clock) — what the orphan sweep re-reads to let "merged wins".
func (s *Store) BatchesFailedWithMR(ctx context.Context, within time.Duration, limit int) ([]Batch, error) {
	if limit <= 0 {
		limit = 100
	}
	out := []Batch{}
	err := s.db.SelectContext(ctx, &out, qFailedWithMR, micros(within), micros(within), limit)
	return out, translate(err)
}

// RepoWaiting is a metrics sample of one repository's waiting set.
type RepoWaiting struct {
	Repo      string  `db:"repo"`
	Depth     int64   `db:"depth"`
	OldestAge float64 `db:"oldest_age"` // seconds, DB clock
}

// WaitingStats returns waiting depth and oldest waiting age per repository.
func (s *Store) WaitingStats(ctx context.Context) ([]RepoWaiting, error) {
	out := []RepoWaiting{}
	err := s.db.SelectContext(ctx, &out, qWaitingStats)
	return out, translate(err)
}

// CleanupWaiting deletes up to chunk waiting rows of SUCCEEDED batches finished more
// than olderThan ago. Returns rows deleted; callers loop while it returns chunk.
func (s *Store) CleanupWaiting(ctx context.Context, olderThan time.Duration, chunk int) (int64, error) {
	if chunk <= 0 {
		chunk = 500
	}
	chunk = min(chunk, maxInPlaceholders)
	var deleted int64
	// READ COMMITTED: the candidate read is a plain read of finished rows nobody writes
	// any more, and the DELETE by primary key must not gap-lock the waiting set. The
	// updated_at bound serves the index range (a SUCCEEDED batch is never written again,
	// so it equals finished_at); finished_at states the rule.
	err := s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		var ids []int64
		if err := tx.SelectContext(ctx, &ids, qCleanupWaiting, micros(olderThan), micros(olderThan), chunk); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		args := make([]any, len(ids))
		for i, id := range ids {
			args[i] = id
		}
		r, err := tx.ExecContext(ctx,
			"DELETE FROM merge_batch_request WHERE id IN ("+inPlaceholders(len(ids))+") AND batch_id IS NOT NULL", args...)
		if err != nil {
			return err
		}
		deleted, err = r.RowsAffected()
		return err
	})
	return deleted, err
}
