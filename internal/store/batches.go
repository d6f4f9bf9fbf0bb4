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

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// ClaimOutcome is the result of one claim attempt. None of them is an error.
type ClaimOutcome string

const (
	ClaimClaimed        ClaimOutcome = "claimed"
	ClaimSlotOccupied   ClaimOutcome = "slot_occupied"
	ClaimNothingToClaim ClaimOutcome = "nothing_to_claim"
	ClaimPreempted      ClaimOutcome = "preempted"
	// ClaimPaused: the repository is paused (repo_control); nothing was claimed.
	ClaimPaused ClaimOutcome = "paused"
)

// ClaimResult describes one claim attempt.
type ClaimResult struct {
	Outcome      ClaimOutcome
	BatchID      int64    // set when Outcome == ClaimClaimed
	OperationIDs []string // claimed members in queue order: urgent first, then oldest
	// The claim group taken (failure isolation): "" is the ordinary queue; Kind is
	// first_try, retry_<class> or bisect; ParentID the failed batch it comes from.
	Group    string
	Kind     string
	ParentID *int64
	Depth    int
}

// Audit event codes written by the batch side. Batch events carry batch_id only; member
// events carry both the operation and the batch, so an operation's history explains
// which round it went through and how that round ended. A member of a failed batch gets
// batch_failed and then one outcome event: failed (with the reason), retry_<class>,
// bisected, culprit, closed_by_user or max_attempts (bisect.go).
const (
	EventBatchClaimed = "batch_claimed"
	EventBatchBlocked = "batch_blocked"
	EventBatchMerged  = "batch_merged"
	// EventBatchUnchanged: the batch succeeded without an MR, the repository already
	// having every change it makes (verify accepts a SUCCEEDED batch without an MR only
	// with this event).
	EventBatchUnchanged  = "batch_unchanged"
	EventBatchFailed     = "batch_failed"
	EventMemberClaimed   = "claimed"
	EventMemberPublished = "published"
	EventMemberMerged    = "merged"
	EventMemberFailed    = "failed"
	// EventMemberBatchFailed: the member's batch failed (detail: class and message).
	EventMemberBatchFailed = "batch_failed"
	// EventBystander: the member merged in a bisection half after an earlier batch of
	// it failed: it was not the culprit.
	EventBystander = "bystander"
)

// maxInPlaceholders bounds the placeholders of one statement. Batches can be large, and
// one huge IN list makes a statement whose plan and packet size nobody has tested.
const maxInPlaceholders = 500

// batchCols lists merge_batch's columns except the generated active_slot, which Batch
// does not carry (sqlx refuses a column without a destination).
const batchCols = "id, repo, status, version, size, source_branch, mr_iid, mr_url, mr_sha, " +
	"next_check_at, error_code, error_message, created_at, updated_at, finished_at, " +
	"kind, grp, parent_id, depth, fail_class"

// memberOpCols lists operation's columns as Operation carries them, prefixed for joins.
// attributes is NULL when the application had none, and json.RawMessage cannot scan
// NULL, so it reads as empty.
const memberOpCols = "o.id, o.operation_id, o.subject, o.target, o.repo, o.action, o.status, o.priority, " +
	"o.version, o.expires_at, COALESCE(o.attributes, '') AS attributes, o.batch_id, o.attempts, o.error_code, " +
	"o.error_message, o.created_at, o.updated_at, " +
	"o.requested_by, o.approved_by, o.rejected_by, o.withdrawn_by, o.retried_by"

// The fixed read queries of the batch side, named so the EXPLAIN test checks exactly
// the text the store runs (export_test.go). The IN-list writes are built per call.
const (
	// qClaimPrecheck: the claim's lock-free precheck, one round trip: anything waiting
	// (idx_repo_waiting), and is the slot held by a committed active batch
	// (uk_active_slot). A plain read: it never waits for another transaction's locks.
	qClaimPrecheck = `SELECT EXISTS (SELECT 1 FROM merge_batch_request WHERE repo = ? AND batch_id IS NULL) AS waiting,
		EXISTS (SELECT 1 FROM merge_batch WHERE active_slot = ?) AS held,
		EXISTS (SELECT 1 FROM repo_control WHERE repo = ? AND ` + pausedNow + `) AS paused`
	// qWaitingRepos: repositories with waiting work (loose scan of idx_repo_waiting).
	qWaitingRepos = "SELECT DISTINCT repo FROM merge_batch_request WHERE batch_id IS NULL ORDER BY repo LIMIT ?"
	// qClaimHead: the claim group and lane of the first waiting row of a repository in
	// queue order — urgent first, then oldest (idx_repo_waiting, index order, no sort).
	// Without FOR UPDATE (I3).
	//
	// Only rows whose operation is queued count: a waiting row whose operation is
	// anything else (a stray: no path writes one any more, a withdrawal deletes its row
	// in the same transaction) would make every claim of the repository roll back as
	// preempted for ever. It is skipped here and in qClaimRead, and reported by
	// WaitingStrays (metric, log, batcherd verify). STRAIGHT_JOIN keeps the waiting
	// index as the driving side: planned from the operation's status index, the read
	// would collect every repository's queued operations and sort them.
	qClaimHead = `SELECT STRAIGHT_JOIN r.grp, r.lane` + claimHeadFrom
	// qClaimHeadInto is qClaimHead inside the claim's compound statement
	// (claim_compound.go), into its variables.
	qClaimHeadInto = `SELECT STRAIGHT_JOIN r.grp, r.lane INTO v_grp, v_lane` + claimHeadFrom
	claimHeadFrom  = ` FROM merge_batch_request r
		JOIN operation o ON o.operation_id = r.operation_id AND o.status = 'queued'
		WHERE r.repo = ? AND r.batch_id IS NULL ORDER BY r.lane, r.created_at, r.id LIMIT 1`
	// qClaimRead: waiting rows of one group of a repository in queue order, urgent
	// first, then oldest (idx_repo_group_waiting, index order, no sort); strays skipped
	// as in qClaimHead. Deliberately without FOR UPDATE (I3).
	qClaimRead = claimReadWhere + `r.grp = ?` + claimReadOrder
	// qClaimReadGroup is qClaimRead inside the claim's compound statement, for the group
	// its head read found.
	qClaimReadGroup = claimReadWhere + `r.grp = v_grp` + claimReadOrder
	claimReadWhere  = `SELECT STRAIGHT_JOIN r.id, r.operation_id, r.kind, r.parent_id, r.depth, r.half, r.retries, r.tries
		FROM merge_batch_request r
		JOIN operation o ON o.operation_id = r.operation_id AND o.status = 'queued'
		WHERE r.repo = ? AND r.batch_id IS NULL AND `
	claimReadOrder = ` ORDER BY r.lane, r.created_at, r.id LIMIT ?`
	// qClaimPaused: is the repository paused now (DB clock), read inside the claim with
	// a shared lock on its control row (see claim).
	qClaimPaused = `SELECT ` + pausedNow + ` FROM repo_control WHERE repo = ? LOCK IN SHARE MODE`
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
	//
	// A batch without an MR under a live reservation is left out: its publisher holds
	// it and may be opening the MR right now. Settling it then (a lookup by branch
	// finds nothing yet) let the publisher open the MR after the batch had failed; a
	// publisher dying before it closed that MR left an open orphan, and a human who
	// merged it put the files of a FAILED batch — whose members had been requeued —
	// on the target branch for good. Found by the chaos run. Once the reservation
	// lapses (the publish loop stops renewing it past the timeout), the sweep takes the
	// batch, and settle failure finds any MR by its branch.
	//
	// While GitLab refuses the repository (401, 403, or a 404 for the project: a token
	// revoked or without access) the batch timeout does not run: the refusal is not
	// the batch's fault, and failing it would fail (and charge) every member for a
	// token an operator is about to fix. Once GitLab answers again, a held batch gets a
	// whole timeout from then (repo_state.timeout_resume_at), so the loops can finish it
	// before the sweep looks at it again.
	qBatchesTimedOut = "SELECT " + batchCols + ` FROM merge_batch
		WHERE status IN (1, 4) AND created_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		  AND (mr_iid IS NOT NULL OR next_check_at <= CURRENT_TIMESTAMP(6))
		  AND NOT EXISTS (SELECT 1 FROM repo_state rs WHERE rs.repo = merge_batch.repo
		        AND (rs.gitlab_state IN ` + refusalList + `
		             OR rs.timeout_resume_at > CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND))
		LIMIT ?`
	// qFailedRecently: recently failed batches, with or without a recorded MR
	// (idx_status_updated). updated_at bounds the index range: a FAILED batch is not
	// written again except by "merged wins", which moves it out of FAILED (or records
	// its MR first, in the same pass), so updated_at == finished_at here. Batches
	// without a recorded MR are read too: an MR its publisher opened and never recorded
	// can have merged (found by the protocol model, docs/MODEL.md).
	qFailedRecently = "SELECT " + batchCols + ` FROM merge_batch
		WHERE status = 3 AND updated_at >= CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		  AND finished_at >= CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		  AND (updated_at > ? OR (updated_at = ? AND id > ?))
		ORDER BY updated_at, id LIMIT ?`
	// qWaitingStats: depth and oldest age per repository (covering scan of
	// idx_repo_waiting; a periodic metric, not a hot path).
	qWaitingStats = `SELECT repo, COUNT(*) AS depth,
		TIMESTAMPDIFF(MICROSECOND, MIN(created_at), CURRENT_TIMESTAMP(6)) / 1000000 AS oldest_age
		FROM merge_batch_request WHERE batch_id IS NULL
		GROUP BY repo ORDER BY repo`
	// qCleanupWaiting: waiting rows of SUCCEEDED batches finished long enough ago (a
	// covering walk of idx_repo_waiting — the waiting table is the small side once
	// cleanup runs — then the batch by primary key). No ORDER BY: any chunk will do, and
	// ordering by r.id makes the optimizer walk the waiting table's primary key instead.
	qCleanupWaiting = `SELECT r.id FROM merge_batch b
		JOIN merge_batch_request r ON r.repo = b.repo AND r.batch_id = b.id
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
//
// A connection lost during it leaves the outcome unknown, as at a COMMIT.
func (s *Store) exec1(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil && isConnLost(err) {
		return res, commitError(ctx, err)
	}
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

// ClaimPrecheck is what the claim's precheck saw: is anything waiting in the
// repository, and does a committed active batch hold its slot.
type ClaimPrecheck struct {
	Waiting bool `db:"waiting"`
	Held    bool `db:"held"`
	Paused  bool `db:"paused"`
}

// BatchClaimPrecheck reads, in one lock-free statement outside any transaction, whether
// a claim of repo could do anything now. A round with nothing waiting, or whose slot a
// committed batch holds, is answered from it without a transaction: the claim itself
// would only queue on the slot row behind its holder to learn the same (1062) answer.
// It is a hint, never a decision: a slot freed or taken right after it is read is
// decided by the claim's INSERT on the unique slot (I1) as always.
func (s *Store) BatchClaimPrecheck(ctx context.Context, repo string) (ClaimPrecheck, error) {
	var p ClaimPrecheck
	err := s.db.GetContext(ctx, &p, qClaimPrecheck, repo, repo, repo)
	return p, translate(err)
}

// outcome is the claim's answer the precheck gives by itself, or "" when a claim may
// take the slot. The order is the transaction's: the pause is read first, then the
// slot is taken, then the waiting rows are read.
func (p ClaimPrecheck) outcome() ClaimOutcome {
	switch {
	case p.Paused:
		return ClaimPaused
	case p.Held:
		return ClaimSlotOccupied
	case !p.Waiting:
		return ClaimNothingToClaim
	}
	return ""
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
	Kind        string `db:"kind"`
	ParentID    *int64 `db:"parent_id"`
	Depth       int    `db:"depth"`
	Half        int    `db:"half"`
	Retries     int    `db:"retries"`
	Tries       int    `db:"tries"`
}

// BatchClaim claims up to max waiting requests of repo into a new RUNNING batch. A
// lock-free precheck answers a round that cannot claim (paused, a committed batch holds
// the slot, nothing waits) without a transaction; otherwise one READ COMMITTED
// transaction: read the repository's pause (paused → roll back, paused),
// insert the slot row (1062/1213/1205 → slot_occupied), read waiting rows in queue order
// (urgent first, then oldest) without FOR UPDATE (empty → roll back, nothing_to_claim),
// guarded UPDATE … WHERE batch_id IS NULL AND id IN (…) (affected ≠ read → roll back,
// preempted), member history appended in bulk, operations queued → in_batch.
//
// Every waiting row should have a queued operation (admission, approval and withdrawal
// write both together). The read skips a row whose operation is not queued, so such a
// stray cannot hold up its repository; WaitingStrays names them. An operation that
// leaves queued between the read and the writes (a withdrawal) makes the claim roll
// back as preempted, once: the next round no longer reads it.
func (s *Store) BatchClaim(ctx context.Context, repo string, max int) (ClaimResult, error) {
	return s.claim(ctx, repo, max, false)
}

// BatchClaimFollowUp is BatchClaim when the first waiting row of repo is in a retry or
// bisection group (a failed batch's members waiting for their next round) or urgent,
// and nothing_to_claim otherwise: the settling replica calls it so a bisection goes on
// without waiting for the next scheduled round, while the ordinary queue keeps its
// schedule.
func (s *Store) BatchClaimFollowUp(ctx context.Context, repo string, max int) (ClaimResult, error) {
	return s.claim(ctx, repo, max, true)
}

// claim is BatchClaim: on MariaDB claimCompound (claim_compound.go: the same steps in
// two round trips); elsewhere the precheck, then the transaction step by step: read the
// repository's pause (paused:
// nothing else happens), take the slot (takeSlot), read the group of the first waiting
// row, urgent first (readClaimGroup), guarded claim of its waiting rows
// (claimRequests, I2), operations queued → in_batch (claimOperations), member history
// (insertMembers), then the batch row and its event (finishClaimedBatch). Any step's
// "no" rolls everything back with its outcome; claimAnswer maps the transaction's end
// to the caller's answer.
// It stays one function on purpose: the steps are functions already; what is left is
// their order inside the one transaction and each step's rollback outcome.
func (s *Store) claim(ctx context.Context, repo string, max int, groupsOnly bool) (ClaimResult, error) {
	if max < 1 {
		return ClaimResult{}, fmt.Errorf("store: BatchClaim max must be at least 1, got %d", max)
	}
	// A follow-up round looks first, lock-free, whether its repository's first waiting
	// row is one it takes (a group's, or urgent): the replica that settles calls it after
	// every batch, and most of the time the answer is no. Asking the transaction instead
	// would insert and roll back a slot row each time (an auto-increment id burnt, and a
	// slot row a concurrent claimant meets). A row that qualifies right after this read
	// waits for the next round as before.
	if groupsOnly {
		due, err := s.followUpDue(ctx, repo)
		if err != nil {
			return ClaimResult{}, err
		}
		if !due {
			return ClaimResult{Outcome: ClaimNothingToClaim}, nil
		}
	}
	// The installation id names the batch's branch (cached after the first read, so
	// this is no extra statement per claim).
	inst, err := s.Installation(ctx)
	if err != nil {
		return ClaimResult{}, err
	}
	// Probed before the transaction: the probe needs a connection of its own, and the
	// transaction may hold the pool's last one.
	noWait := s.slotNoWait(ctx)
	if noWait {
		// Two round trips, the precheck in the first (claim_compound.go).
		return s.claimCompound(ctx, repo, max, groupsOnly, inst)
	}
	// The lock-free precheck (BatchClaimPrecheck): most rounds of most repositories have
	// nothing waiting, and an empty round must not touch the slot; a round whose slot a
	// committed batch holds is answered at once, instead of queueing on the slot row
	// behind its holder only to be told the same. Neither answer is a decision: the
	// slot's unique key decides every claim that gets past it (I1).
	pre, err := s.BatchClaimPrecheck(ctx, repo)
	if err != nil {
		return ClaimResult{}, err
	}
	if o := pre.outcome(); o != "" {
		return ClaimResult{Outcome: o}, nil
	}
	var res ClaimResult
	slotTaken := false
	// READ COMMITTED, not the server's REPEATABLE READ: when the claim takes every waiting
	// row the optimizer may scan the whole index for the guarded UPDATE, and under
	// REPEATABLE READ that leaves next-key locks on the waiting range and the gap at its
	// end, so admissions wait until the claim commits (I3; docs/ARCHITECTURE.md). READ
	// COMMITTED takes no gap locks and releases non-matching rows at once. Correctness
	// does not need a snapshot here: the slot keeps other claimants out, and the guarded
	// UPDATE's affected-row check catches any row claimed elsewhere (I2).
	err = s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		if paused, err := claimPaused(ctx, tx, repo); err != nil || paused {
			if paused {
				res.Outcome = ClaimPaused
				return errRollback
			}
			return err
		}
		batchID, err := takeSlot(ctx, tx, repo, noWait)
		if err != nil {
			if slotAnswer(err) {
				res.Outcome = ClaimSlotOccupied
				return errRollback
			}
			return err
		}
		slotTaken = true
		grp, rows, outcome, err := readClaimGroup(ctx, tx, repo, max, groupsOnly)
		if err != nil {
			return err
		}
		if outcome != "" {
			res.Outcome = outcome
			return errRollback
		}
		opIDs, kind, outcome, err := s.claimRows(ctx, tx, batchID, repo, grp, rows, inst)
		if err != nil {
			return err
		}
		if outcome != "" {
			res.Outcome = outcome
			return errRollback
		}
		s.claimAfterUpdate(ctx, batchID)
		res = ClaimResult{Outcome: ClaimClaimed, BatchID: batchID, OperationIDs: opIDs,
			Group: grp, Kind: kind, ParentID: rows[0].ParentID, Depth: rows[0].Depth}
		return nil
	})
	return claimAnswer(res, err, slotTaken)
}

// claimPaused reads whether repo is paused. The control row is read first, inside the
// claim, with a shared lock: a pause (an UPDATE of that row) then waits for a claim
// that already read it, and a claim that starts after the pause committed sees it — so
// once a pause has been answered, no claim that did not already exist can make a
// batch. Claims share the lock with each other, and admission never touches the row
// (I3). No row: never paused.
func claimPaused(ctx context.Context, tx *sqlx.Tx, repo string) (bool, error) {
	var paused []bool
	if err := tx.SelectContext(ctx, &paused, qClaimPaused, repo); err != nil {
		return false, err
	}
	return len(paused) > 0 && paused[0], nil
}

// claimRows claims the waiting rows read into batch batchID: the guarded claim of the
// rows (I2), their operations queued → in_batch, the member history, the batch row, its
// event and its outbox rows (claimWrites), one statement at a time. It returns the
// members' operation ids in queue order and the batch's kind, or the outcome preempted
// when any row or operation was taken elsewhere between the read and these writes (all
// or nothing: the caller rolls back).
func (s *Store) claimRows(ctx context.Context, tx *sqlx.Tx, batchID int64, repo, grp string, rows []waitingRow, inst string) ([]string, string, ClaimOutcome, error) {
	s.claimAfterRead(ctx, batchID, rows)
	w := s.claimWrites(ctx, batchID, repo, grp, rows, inst, false)
	for _, st := range w.stmts {
		r, err := tx.ExecContext(ctx, st.q, st.args...)
		if err != nil {
			return nil, "", "", err
		}
		if st.want < 0 {
			continue
		}
		n, err := r.RowsAffected()
		switch {
		case err != nil:
			return nil, "", "", err
		case n != st.want && st.preempts:
			return nil, "", ClaimPreempted, nil
		case n != st.want:
			return nil, "", "", ErrLostRace
		}
	}
	return w.opIDs, w.kind, "", nil
}

// claimAfterUpdate calls the test hook between the writes and COMMIT.
func (s *Store) claimAfterUpdate(ctx context.Context, batchID int64) {
	if s.Hooks != nil && s.Hooks.ClaimAfterUpdate != nil {
		s.Hooks.ClaimAfterUpdate(ctx, batchID)
	}
}

// claimAfterRead calls the test hook between the read and the writes.
func (s *Store) claimAfterRead(ctx context.Context, batchID int64, rows []waitingRow) {
	if s.Hooks != nil && s.Hooks.ClaimAfterRead != nil {
		reqIDs := make([]int64, len(rows))
		for i, w := range rows {
			reqIDs[i] = w.ID
		}
		s.Hooks.ClaimAfterRead(ctx, batchID, reqIDs)
	}
}

// claimStmt is one write of a claim. want < 0: no row-count guard; otherwise the
// statement must change exactly want rows, and a different count means the rows were
// taken elsewhere (preempts: the claim rolls back as preempted) or is an error.
type claimStmt struct {
	q        string
	args     []any
	want     int64
	preempts bool
}

// claimWriteSet is what a claim writes for the rows it read, and what it answers.
type claimWriteSet struct {
	stmts []claimStmt
	opIDs []string // queue order
	kind  string
}

// claimWrites builds the claim's writes for rows (read into batch batchID), in the
// order both paths run them: the guarded claim of the waiting rows in key order
// (claimRequests, I2), the operations queued → in_batch in key order
// (claimOperations), the member history (insertMembers), the batch row and its event
// (finishClaimedBatch), and batch.opened in the outbox.
//
// setBased (the compound path) moves the operations and writes the member history
// with one statement each, from the waiting rows the first statements claimed (the
// repository's (repo, batch_id) range of idx_repo_waiting), instead of sending every
// operation id twice in IN lists and VALUES: the same rows, the same guards, about a
// tenth less of the claim's server time (BENCHMARKS.md, section 3).
func (s *Store) claimWrites(ctx context.Context, batchID int64, repo, grp string, rows []waitingRow, inst string, setBased bool) claimWriteSet {
	reqIDs := make([]int64, len(rows))
	opIDs := make([]string, len(rows))
	why := make(map[string]string, len(rows))
	for i, w := range rows {
		reqIDs[i], opIDs[i] = w.ID, w.OperationID
		why[w.OperationID] = w.why()
	}
	sortedOps := slices.Clone(opIDs)
	slices.Sort(sortedOps)
	stmts := claimRequests(batchID, reqIDs)
	if setBased {
		stmts = append(stmts, claimOperationsOf(batchID, repo, len(rows)), insertMembersOf(batchID, repo, len(rows)))
	} else {
		stmts = append(stmts, claimOperations(batchID, sortedOps)...)
		stmts = append(stmts, insertMembers(batchID, sortedOps, why)...)
	}
	kind, fin := finishClaimedBatch(ctx, batchID, repo, grp, rows, inst)
	stmts = append(stmts, fin...)
	// batch.opened at the claim: the batch exists and holds its members from here on,
	// whether or not an MR is ever recorded for it (its settle reports the MR).
	for _, o := range outboxStmt([]outEvent{batchEvent(EventTypeBatchOpened,
		domain.Batch{ID: batchID, Repo: repo, Status: domain.BatchRunning, Size: len(rows)})}, s.EventReceivers()) {
		stmts = append(stmts, claimStmt{q: o.q, args: o.args, want: o.want})
	}
	return claimWriteSet{stmts: stmts, opIDs: opIDs, kind: kind}
}

// claimAnswer turns the end of a claim transaction into the caller's answer. None of
// the outcomes is an error: a rollback by choice answers its outcome; losing a
// deadlock or lock wait after the slot was ours (the server rolled everything back,
// the slot included) is preempted, before it slot_occupied.
func claimAnswer(res ClaimResult, err error, slotTaken bool) (ClaimResult, error) {
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, errRollback):
		return ClaimResult{Outcome: res.Outcome}, nil
	case errors.Is(err, ErrLostRace) && slotTaken:
		return ClaimResult{Outcome: ClaimPreempted}, nil
	case errors.Is(err, ErrLostRace):
		return ClaimResult{Outcome: ClaimSlotOccupied}, nil
	}
	return ClaimResult{}, err
}

// followUpDue reports, from one plain read outside any transaction, whether the first
// waiting row of repo (qClaimHead) is in a retry or bisection group or urgent.
func (s *Store) followUpDue(ctx context.Context, repo string) (bool, error) {
	var head struct {
		Grp  string `db:"grp"`
		Lane int    `db:"lane"`
	}
	err := s.db.GetContext(ctx, &head, qClaimHead, repo)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, translate(err)
	}
	return head.Grp != "" || head.Lane == laneOf(domain.PriorityUrgent), nil
}

// readClaimGroup reads the claim group of the first waiting row of repo in queue order
// (urgent first, then oldest) and up to max of its rows in that order, skipping rows
// whose operation is not queued (strays, qClaimHead); a non-empty outcome (nothing_to_claim) means there is
// nothing for this claim. The ordinary queue is group ""; a failed batch's retry or
// bisection halves are their own groups, and their rows keep their created_at, so they
// come before anything admitted after them (bystanders keep their queue position).
// No FOR UPDATE: a locking read would put next-key locks where admissions insert (I3).
func readClaimGroup(ctx context.Context, tx *sqlx.Tx, repo string, max int, groupsOnly bool) (string, []waitingRow, ClaimOutcome, error) {
	var head struct {
		Grp  string `db:"grp"`
		Lane int    `db:"lane"`
	}
	if err := tx.GetContext(ctx, &head, qClaimHead, repo); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return "", nil, ClaimNothingToClaim, nil
		}
		return "", nil, "", err
	}
	grp := head.Grp
	// A follow-up round also goes on for urgent work: an urgent operation that met a
	// held slot is claimed as soon as that batch settles, not at the next scheduled
	// round.
	if groupsOnly && grp == "" && head.Lane != laneOf(domain.PriorityUrgent) {
		return "", nil, ClaimNothingToClaim, nil
	}
	var rows []waitingRow
	if err := tx.SelectContext(ctx, &rows, qClaimRead, repo, grp, max); err != nil {
		return "", nil, "", err
	}
	if len(rows) == 0 {
		// Committing would leave a memberless RUNNING batch holding the slot.
		return "", nil, ClaimNothingToClaim, nil
	}
	return grp, rows, "", nil
}

// claimRequests is the guarded claim (I2): only rows still unclaimed, in key order,
// each chunk guarded on its row count. The charged-attempt counter moves with the
// claim, except for bisection rounds (a bisection narrows down someone else's failure;
// MAX_ATTEMPTS does not pay it).
func claimRequests(batchID int64, reqIDs []int64) []claimStmt {
	sorted := slices.Clone(reqIDs)
	slices.Sort(sorted)
	var out []claimStmt
	_ = forChunks(len(sorted), maxInPlaceholders, func(lo, hi int) error {
		args := make([]any, 0, hi-lo+1)
		args = append(args, batchID)
		for _, id := range sorted[lo:hi] {
			args = append(args, id)
		}
		out = append(out, claimStmt{q: "UPDATE merge_batch_request SET batch_id = ?, tries = tries + (kind <> '" + domain.KindBisect +
			"') WHERE batch_id IS NULL AND id IN (" + inPlaceholders(hi-lo) + ")", args: args, want: int64(hi - lo), preempts: true})
		return nil
	})
	return out
}

// claimOperations moves the members' operations queued → in_batch, in key order
// (sortedOps), each chunk guarded on its row count. A member whose operation is not
// queued would be written to the repository without ever being settled, so the claim
// keeps nothing unless all moved.
func claimOperations(batchID int64, sortedOps []string) []claimStmt {
	var out []claimStmt
	_ = forChunks(len(sortedOps), maxInPlaceholders, func(lo, hi int) error {
		args := make([]any, 0, hi-lo+3)
		args = append(args, domain.OpInBatch, batchID)
		for _, id := range sortedOps[lo:hi] {
			args = append(args, id)
		}
		args = append(args, domain.OpQueued)
		out = append(out, claimStmt{q: `UPDATE operation SET status = ?, batch_id = ?, attempts = attempts + 1,
			        version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
			  WHERE operation_id IN (` + inPlaceholders(hi-lo) + `) AND status = ?`, args: args, want: int64(hi - lo), preempts: true})
		return nil
	})
	return out
}

// claimOperationsOf is claimOperations as one statement over the n waiting rows the
// claim took into batchID (set-based, see claimWrites), guarded on its row count.
// STRAIGHT_JOIN keeps the waiting rows' (repo, batch_id) index range as the driving
// side: planned from operation's status index, it would walk every queued operation.
func claimOperationsOf(batchID int64, repo string, n int) claimStmt {
	return claimStmt{q: `UPDATE merge_batch_request r STRAIGHT_JOIN operation o ON o.operation_id = r.operation_id
		SET o.status = ?, o.batch_id = ?, o.attempts = o.attempts + 1, o.version = o.version + 1,
		    o.updated_at = CURRENT_TIMESTAMP(6)
		WHERE r.repo = ? AND r.batch_id = ? AND o.status = ?`,
		args: []any{domain.OpInBatch, batchID, repo, batchID, domain.OpQueued}, want: int64(n), preempts: true}
}

// whySQL is waitingRow.why in SQL, over a waiting row the claim has just updated: its
// tries already count this round, except in a bisection (claimRequests), so "attempt
// tries" here is "attempt w.Tries+1" there. TestClaimWhySQLMatchesWhy holds them equal.
const whySQL = `LEFT(CASE
		WHEN kind = '` + domain.KindBisect + `' AND half = 0 THEN CONCAT('remainder of a bisection: split from failed batch ',
		     IFNULL(parent_id, 0), ', deferred until the failing part''s search ended')
		WHEN kind = '` + domain.KindBisect + `' THEN CONCAT('part ', half, ' of failed batch ', IFNULL(parent_id, 0), ', bisection depth ', depth)
		WHEN kind LIKE '` + domain.KindRetryPrefix + `%' THEN CONCAT('retry ', retries, ' of failed batch ', IFNULL(parent_id, 0),
		     ' after a ', SUBSTRING(kind, CHAR_LENGTH('` + domain.KindRetryPrefix + `') + 1), ' failure (attempt ', tries, ')')
		WHEN tries > 1 THEN CONCAT('first try (attempt ', tries, ')')
		ELSE 'first try' END, 255)` // whyLen

// insertMembersOf is insertMembers as one INSERT … SELECT over the n waiting rows the
// claim took into batchID (set-based, see claimWrites), why computed by whySQL.
func insertMembersOf(batchID int64, repo string, n int) claimStmt {
	return claimStmt{q: `INSERT INTO merge_batch_member (batch_id, operation_id, why)
		SELECT batch_id, operation_id, ` + whySQL + `
		FROM merge_batch_request WHERE repo = ? AND batch_id = ?`,
		args: []any{repo, batchID}, want: int64(n)}
}

// insertMembers appends the member history with why each member is in this round,
// multi-row INSERTs (three placeholders per row).
func insertMembers(batchID int64, sortedOps []string, why map[string]string) []claimStmt {
	var out []claimStmt
	_ = forChunks(len(sortedOps), maxInPlaceholders/3, func(lo, hi int) error {
		args := make([]any, 0, 3*(hi-lo))
		for _, id := range sortedOps[lo:hi] {
			args = append(args, batchID, id, truncRunes(why[id], whyLen))
		}
		out = append(out, claimStmt{q: "INSERT INTO merge_batch_member (batch_id, operation_id, why) VALUES " +
			strings.TrimSuffix(strings.Repeat("(?,?,?),", hi-lo), ","), args: args, want: -1})
		return nil
	})
	return out
}

// finishClaimedBatch fills in the claimed batch's row and records its event; it
// returns the batch's kind. The batch row is still invisible to everyone else, so this
// write needs no version guard or bump. A group is uniform in kind, parent and depth,
// so the head row (rows[0]) speaks for it.
func finishClaimedBatch(ctx context.Context, batchID int64, repo, grp string, rows []waitingRow, inst string) (string, []claimStmt) {
	head := rows[0]
	kind := head.Kind
	if grp == "" {
		kind = domain.KindFirstTry
	}
	round := "first try"
	if grp != "" {
		round = head.why()
	}
	// One batch event, and no per-member audit rows: each member's "claimed" fact is its
	// merge_batch_member row (batch, operation, why, time), which OperationEvents reads
	// back as the member's claimed event. Writing it twice cost a claim of 1,000 about a
	// fifth of its time (BENCHMARKS.md, section 3).
	q, args := batchEventStmt(ctx, batchID, EventBatchClaimed, "claimed",
		fmt.Sprintf("claimed %d operation(s) of %s (%s)", len(rows), repo, round))
	return kind, []claimStmt{
		{q: "UPDATE merge_batch SET size = ?, source_branch = ?, kind = ?, grp = ?, parent_id = ?, depth = ? WHERE id = ?",
			args: []any{len(rows), domain.BranchName(inst, batchID), kind, grp, head.ParentID, head.Depth, batchID}, want: 1},
		{q: q, args: args, want: -1},
	}
}

// Taking a repository's slot, without queueing behind a holder.
//
// The slot is the repository's entry in merge_batch's unique uk_active_slot; the
// INSERT of a RUNNING batch takes it. A plain INSERT that meets a holder in flight — a
// claim not yet committed (a claim of 1,000 takes tens of milliseconds) or a
// settlement freeing the slot — waits for that transaction on the unique key, only to
// be told 1062 when it commits, or, when that claim rolls back, to be one of several
// queued claimants the server answers with 1213. Losing rounds then cost as much as
// the winner's claim.
//
// So the INSERT does not wait for locks (MariaDB: SET STATEMENT
// innodb_lock_wait_timeout = 0, answered 1205 at once; only the statement rolls back).
// A lock it meets is not always a holder, though: right after a settlement the old
// entries of the slot index are delete-marked until purge, and a claim of a
// neighbouring repository locks the gap next to them, so the INSERT can meet the
// neighbour's gap lock while the key itself is free. A 1205 is therefore checked with
// a locking read of this repository's entries only, also without waiting
// (qSlotHolder): a lock or a row there is a holder (occupied); neither means a
// neighbour, and the INSERT is repeated with a wait, which is short and must be
// waited out (the key is not taken).
//
// Where the no-wait INSERT is not available (MySQL has no SET STATEMENT and no lock
// wait timeout below a second), or would not be safe (innodb_rollback_on_timeout=ON
// rolls back the whole transaction on a 1205, and the next statement would run in
// autocommit), the no-wait read comes first and the INSERT waits as before.
const (
	slotInsertWait   = "INSERT INTO merge_batch (repo, status) VALUES (?, ?)"
	slotInsertNoWait = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR " + slotInsertWait
	// qSlotHolder: a holder of repo's slot, committed (a row) or in flight (NOWAIT
	// answers 1205, or 3572 on MySQL). It locks only repo's entries of uk_active_slot.
	qSlotHolder = "SELECT id FROM merge_batch WHERE active_slot = ? FOR UPDATE NOWAIT"
)

// errSlotHeld is takeSlot's answer when a committed batch holds the slot.
var errSlotHeld = &mysql.MySQLError{Number: errDupEntry, Message: "the repository's slot is held"}

// takeSlot inserts the RUNNING batch that holds repo's slot and returns its id, or an
// error slotAnswer reads as "occupied". noWait is Store.slotNoWait. See above.
func takeSlot(ctx context.Context, tx *sqlx.Tx, repo string, noWait bool) (int64, error) {
	holder := func() error {
		var held []int64
		if err := tx.SelectContext(ctx, &held, qSlotHolder, repo); err != nil {
			return err
		}
		if len(held) > 0 {
			return errSlotHeld
		}
		return nil
	}
	insert := func(q string) (int64, error) {
		r, err := tx.ExecContext(ctx, q, repo, domain.BatchRunning)
		if err != nil {
			return 0, err
		}
		return r.LastInsertId()
	}
	if !noWait {
		if err := holder(); err != nil {
			return 0, err
		}
		return insert(slotInsertWait)
	}
	id, err := insert(slotInsertNoWait)
	var me *mysql.MySQLError
	if err == nil || !errors.As(err, &me) || me.Number != errLockWaitTimeout {
		return id, err
	}
	if err := holder(); err != nil {
		return 0, err
	}
	return insert(slotInsertWait) // a neighbour's gap lock: wait it out
}

// slotNoWait reports whether this server takes the no-wait slot INSERT safely,
// probing once (a connection problem probes again next time).
func (s *Store) slotNoWait(ctx context.Context) bool {
	switch s.noWait.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	var rollbackOnTimeout bool
	err := s.db.GetContext(ctx, &rollbackOnTimeout,
		"SET STATEMENT innodb_lock_wait_timeout = 0 FOR SELECT @@innodb_rollback_on_timeout")
	var me *mysql.MySQLError
	switch {
	case err == nil && !rollbackOnTimeout:
		s.noWait.Store(1)
		return true
	case err == nil, errors.As(err, &me):
		s.noWait.Store(2) // rolls back whole transactions on a timeout, or not MariaDB
	}
	return false
}

// slotAnswer reports whether err is the server telling a claimant that the slot is
// taken: 1062 (a committed holder), 1205 or MySQL 8's 3572 (NOWAIT met a holder in
// flight), 1213 (a queue behind a claim that rolled back). These are answers, so they
// are not counted as store errors.
func slotAnswer(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case errDupEntry, errLockWaitTimeout, errLockDeadlock, errLockNoWait:
		return true
	}
	return false
}

// recordBatchEvents appends one batch event and one event per member, all with INSERT
// IGNORE on the unique dedupe key so re-recording is a no-op. The dedupe keys embed the
// batch id and the transition, and every transition happens once per batch, so a
// duplicate can only be a replay of the same fact.
func recordBatchEvents(ctx context.Context, tx *sqlx.Tx, batchID int64, batchCode, verb, batchDetail,
	memberCode string, opIDs []string, memberDetail string) error {
	if err := recordBatchEvent(ctx, tx, batchID, batchCode, verb, batchDetail); err != nil {
		return err
	}
	evs := make([]memberEvent, len(opIDs))
	for i, id := range opIDs {
		evs[i] = memberEvent{op: id, code: memberCode, verb: verb, detail: memberDetail}
	}
	return insertMemberEvents(ctx, tx, batchID, evs)
}

// recordBatchEvent appends the batch-level event of a transition (INSERT IGNORE).
func recordBatchEvent(ctx context.Context, tx *sqlx.Tx, batchID int64, code, verb, detail string) error {
	q, args := batchEventStmt(ctx, batchID, code, verb, detail)
	_, err := tx.ExecContext(ctx, q, args...)
	return err
}

// batchEventStmt is recordBatchEvent's statement.
func batchEventStmt(ctx context.Context, batchID int64, code, verb, detail string) (string, []any) {
	return `INSERT IGNORE INTO audit_event (dedupe_key, batch_id, code, detail, actor) VALUES (?, ?, ?, ?, ?)`,
		[]any{fmt.Sprintf("batch:%d:%s", batchID, verb), batchID, code, truncRunes(detail, auditDetailLen), actorOf(ctx)}
}

// memberEvent is one member's event of a batch transition. Its dedupe key is
// op:<operation>:batch:<batch>:<verb>: one fact per member, batch and transition.
type memberEvent struct {
	op, code, verb, detail string
}

// insertMemberEvents appends member events set-based: multi-row INSERT IGNORE, one
// statement per chunk, never one per member.
func insertMemberEvents(ctx context.Context, tx *sqlx.Tx, batchID int64, evs []memberEvent) error {
	const perRow = 6
	actor := actorOf(ctx)
	return forChunks(len(evs), maxInPlaceholders/perRow, func(lo, hi int) error {
		args := make([]any, 0, perRow*(hi-lo))
		for _, e := range evs[lo:hi] {
			args = append(args, fmt.Sprintf("op:%s:batch:%d:%s", e.op, batchID, e.verb), e.op, batchID, e.code,
				truncRunes(e.detail, auditDetailLen), actor)
		}
		_, err := tx.ExecContext(ctx,
			"INSERT IGNORE INTO audit_event (dedupe_key, operation_id, batch_id, code, detail, actor) VALUES "+
				strings.TrimSuffix(strings.Repeat("(?,?,?,?,?,?),", hi-lo), ","), args...)
		return err
	})
}

// getBatch reads one batch row through q (the pool or a transaction).
func getBatch(ctx context.Context, q sqlx.QueryerContext, id int64) (domain.Batch, error) {
	var b domain.Batch
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
func (s *Store) BatchGet(ctx context.Context, id int64) (domain.Batch, error) {
	var b domain.Batch
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
	Status  domain.BatchStatus // 0 = any
	Limit   int                // default 50, max 500
	AfterID int64
}

// BatchList lists batches (without OperationIDs), newest first.
func (s *Store) BatchList(ctx context.Context, f BatchFilter) ([]domain.Batch, error) {
	q, args := qBatchList(f)
	out := []domain.Batch{}
	err := s.db.SelectContext(ctx, &out, q, args...)
	return out, translate(err)
}

// qBatchList is BatchList's query, newest first: a repository alone is read through
// idx_repo_id, a repository with a status through idx_repo_status, both in id order
// without a sort however much history other repositories have.
func qBatchList(f BatchFilter) (string, []any) {
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
	// With a repository the index is named: after a cursor the optimizer otherwise read
	// idx_repo_id by ref on the repository alone, walking all of its newer batches
	// before the cursor (TestExplainBatchListCursor), so a deep page cost its depth.
	switch {
	case f.Repo != "" && f.Status != 0:
		q += " FORCE INDEX (idx_repo_status)"
	case f.Repo != "":
		q += " FORCE INDEX (idx_repo_id)"
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id DESC LIMIT ?"
	return q, append(args, f.Limit)
}

// BatchMembers returns the operations of a batch (from member history), sorted by
// operation_id — what publish needs to write the files.
func (s *Store) BatchMembers(ctx context.Context, batchID int64) ([]domain.Operation, error) {
	out := []domain.Operation{}
	err := s.db.SelectContext(ctx, &out, qBatchMembers, batchID)
	return out, translate(err)
}

// BatchesDue is the fetch half of fetch → tryLock: active batches whose next_check_at
// has passed (DB clock), oldest check first. Read without locks.
func (s *Store) BatchesDue(ctx context.Context, limit int) ([]domain.Batch, error) {
	if limit <= 0 {
		limit = 100
	}
	out := []domain.Batch{}
	err := s.db.SelectContext(ctx, &out, qBatchesDue, limit)
	return out, translate(err)
}

// guardedBatchWrite runs one guarded UPDATE on merge_batch (the caller's SET and status
// guard, plus version guard, version bump and updated_at) and returns the row as now
// stored. ErrLostRace when the guard matched nothing.
func (s *Store) guardedBatchWrite(ctx context.Context, id, version int64, set, statusGuard string, args ...any) (domain.Batch, error) {
	return s.guardedBatchWriteThen(ctx, id, version, set, statusGuard, nil, args...)
}

// guardedBatchWriteThen is guardedBatchWrite with more work in the same transaction
// after the guarded write won (then may be nil).
func (s *Store) guardedBatchWriteThen(ctx context.Context, id, version int64, set, statusGuard string,
	then func(tx *sqlx.Tx) error, args ...any) (domain.Batch, error) {
	var b domain.Batch
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
		if then != nil {
			if err := then(tx); err != nil {
				return err
			}
		}
		b, err = getBatch(ctx, tx, id)
		return err
	})
	return b, err
}

// BatchReserve is the tryLock half: it pushes next_check_at to NOW(6)+lease and bumps
// version, guarded on id, version and an active status. It returns the batch as now
// stored, or ErrLostRace when another replica took it first.
func (s *Store) BatchReserve(ctx context.Context, id, version int64, lease time.Duration) (domain.Batch, error) {
	return s.guardedBatchWrite(ctx, id, version,
		"next_check_at = CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND", "status IN (1, 4)", micros(lease))
}

// BatchPublishing reports whether an active batch without a recorded MR is under a
// live publish reservation (DB clock): its publisher may be opening the MR now. A
// settle that does not wait for it can fail the batch with no MR to close, and the
// MR then opened and merged is one no loop records (the timeout sweep has the same
// rule, qBatchesTimedOut).
func (s *Store) BatchPublishing(ctx context.Context, id int64) (bool, error) {
	var busy bool
	err := s.db.GetContext(ctx, &busy, `SELECT COUNT(*) > 0 FROM merge_batch
		WHERE id = ? AND status IN (1, 4) AND mr_iid IS NULL AND next_check_at > CURRENT_TIMESTAMP(6)`, id)
	return busy, translate(err)
}

// BatchMarkDue makes an active batch with a recorded MR due for a check now (webhook
// hint). It does not bump version: it is a scheduling hint, and bumping would make an
// in-flight publish lose its guarded MR write.
//
// A batch without a recorded MR is left alone: its next_check_at is its publisher's
// reservation, which the timeout sweep honours, and a hint that lapsed it (GitLab sends
// pipeline events for the branch before the MR exists) let the sweep fail the batch
// under a live publisher, which then opened an MR for a FAILED batch. Reconcile needs
// the MR anyway; publish wakes it once the MR is recorded.
func (s *Store) BatchMarkDue(ctx context.Context, id int64) error {
	// Not a state write, so neither version nor updated_at moves. A batch that is no
	// longer active is simply not touched: a late hint is not an error.
	_, err := s.exec1(ctx,
		"UPDATE merge_batch SET next_check_at = CURRENT_TIMESTAMP(6) WHERE id = ? AND status IN (1, 4) AND mr_iid IS NOT NULL", id)
	return err
}

// BatchRecordMRFailed records on a FAILED batch without one the MR that merged for its
// branch after all (found by branch: its publisher never recorded it), so that merged
// wins leaves a SUCCEEDED batch naming the MR that merged it. Guarded on version.
func (s *Store) BatchRecordMRFailed(ctx context.Context, id, version int64, mr MRRecord) (domain.Batch, error) {
	return s.guardedBatchWrite(ctx, id, version, "mr_iid = ?, mr_url = ?, mr_sha = ?",
		"status = 3 AND mr_iid IS NULL", mr.IID, truncRunes(mr.URL, 1024), mr.SHA)
}

// MRRecord is what publish records on a batch.
type MRRecord struct {
	IID int64
	URL string
	SHA string // the head sha batcherd committed; every merge is guarded on it
}

// BatchRecordMR records the MR on a RUNNING batch, guarded on version (fencing: done
// before any merge is armed), and appends a published event per member in the same
// transaction (one INSERT … SELECT over the member history). ErrLostRace when the
// batch moved on.
func (s *Store) BatchRecordMR(ctx context.Context, id, version int64, mr MRRecord) (domain.Batch, error) {
	url := truncRunes(mr.URL, 1024)
	detail := fmt.Sprintf("merge request !%d of batch %d opened: %s", mr.IID, id, url)
	return s.guardedBatchWriteThen(ctx, id, version,
		"mr_iid = ?, mr_url = ?, mr_sha = ?", "status = 1", func(tx *sqlx.Tx) error {
			if err := recordBatchEvent(ctx, tx, id, EventMemberPublished, "published", detail); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT IGNORE INTO audit_event (dedupe_key, operation_id, batch_id, code, detail)
				SELECT CONCAT('op:', operation_id, ':batch:', batch_id, ':published'), operation_id, batch_id, ?, ?
				  FROM merge_batch_member WHERE batch_id = ?`,
				EventMemberPublished, truncRunes(detail, auditDetailLen), id)
			return err
		}, mr.IID, url, mr.SHA)
}

// BatchBlock moves RUNNING → BLOCKED (keeps the slot) with a reason, guarded on version.
func (s *Store) BatchBlock(ctx context.Context, id, version int64, code, message string) (domain.Batch, error) {
	return s.guardedBatchWrite(ctx, id, version,
		"status = 4, error_code = ?, error_message = ?", "status = 1",
		truncRunes(code, errorCodeLen), truncRunes(message, errorMessageLen))
}

// BatchUnblock moves BLOCKED → RUNNING (e.g. the pipeline was retried), guarded on version.
// The block reason is cleared: a running batch carries no error.
func (s *Store) BatchUnblock(ctx context.Context, id, version int64) (domain.Batch, error) {
	return s.guardedBatchWrite(ctx, id, version,
		"status = 1, error_code = '', error_message = ''", "status = 4")
}

// settledOp is a member operation as a settlement locks it.
type settledOp struct {
	OperationID string        `db:"operation_id"`
	Action      domain.Action `db:"action"`
	Subject     string        `db:"subject"`
	Target      string        `db:"target"`
}

// BatchSettleSucceeded settles a batch as merged in one transaction, batch guard first
// (status = from AND version = version → SUCCEEDED), then members in_batch → merged and
// their bindings (grant → active, revoke → closed), operations before bindings, keys
// sorted. from is RUNNING or BLOCKED normally, FAILED when a human merged an MR after
// batcherd failed it (merged wins). ErrLostRace when another settler was first.
//
// Members of a bisection half (or of a retry of one) also get a bystander event: they
// were in a failed batch and this merge clears them.
func (s *Store) BatchSettleSucceeded(ctx context.Context, id int64, from domain.BatchStatus, version int64) (domain.Batch, error) {
	return s.batchSettleSucceeded(ctx, id, from, version, false)
}

// BatchSettleUnchanged settles a RUNNING batch whose changes the repository already has
// (every member a revoke of a file that is gone) as succeeded without an MR, like
// BatchSettleSucceeded, with an EventBatchUnchanged saying why there is no MR.
func (s *Store) BatchSettleUnchanged(ctx context.Context, id, version int64) (domain.Batch, error) {
	return s.batchSettleSucceeded(ctx, id, domain.BatchRunning, version, true)
}

func (s *Store) batchSettleSucceeded(ctx context.Context, id int64, from domain.BatchStatus, version int64, unchanged bool) (domain.Batch, error) {
	opFrom, grantFrom, revokeFrom := domain.OpInBatch, domain.BindingPending, domain.BindingRevoking
	detail, code, suffix := "merge request merged", EventBatchMerged, "merged"
	if unchanged {
		detail, code, suffix = "the repository already had every change of the batch; no merge request was needed", EventBatchUnchanged, "unchanged"
	}
	switch from {
	case domain.BatchRunning, domain.BatchBlocked:
	case domain.BatchFailed:
		// Merged wins: the repository holds the files although the database said the
		// batch failed, so members and bindings follow the repository from the states the
		// failure left them in (grant binding failed, revoke binding back to active).
		opFrom, grantFrom, revokeFrom = domain.OpFailed, domain.BindingFailed, domain.BindingActive
		detail = "merge request merged after the batch was settled failed: the repository wins"
	default:
		return domain.Batch{}, fmt.Errorf("store: cannot settle a batch as succeeded from status %s", from)
	}
	var b domain.Batch
	// READ COMMITTED: every statement is a guarded or locking write on rows found by
	// unique keys, which read the latest committed version anyway; the lower level keeps
	// the IN-list range writes from taking gap locks that admissions or other settles
	// would queue behind.
	err := s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		if err := settleBatchRow(ctx, tx, id, from, version, domain.BatchSucceeded, "", "", ""); err != nil {
			return err
		}
		members, err := memberIDs(ctx, tx, id)
		if err != nil {
			return err
		}
		ops, err := lockMembers(ctx, tx, id, members, opFrom)
		if err != nil {
			return err
		}
		if err := moveOps(ctx, tx, id, opIDsOf(ops), opFrom, domain.OpMerged, "", ""); err != nil {
			return err
		}
		if err := moveBindings(ctx, tx, ops, grantFrom, domain.BindingActive, revokeFrom, domain.BindingClosed); err != nil {
			return err
		}
		if b, err = getBatch(ctx, tx, id); err != nil {
			return err
		}
		b.OperationIDs = members
		settled := opIDsOf(ops)
		if err := recordBatchEvents(ctx, tx, id, code, suffix,
			fmt.Sprintf("%s; %d of %d member(s) moved to %s", detail, len(ops), len(members), domain.OpMerged),
			EventMemberMerged, settled, fmt.Sprintf("batch %d merged: %s", id, detail)); err != nil {
			return err
		}
		// Merged wins (from FAILED) reports too: the receiver saw failed, then merged.
		evs := append([]outEvent{batchEvent(EventTypeBatchSucceeded, b)},
			eventsOfSettled(EventTypeOperationMerged, b, ops, domain.OpMerged, "", "")...)
		if err := s.writeOutbox(ctx, tx, evs); err != nil {
			return err
		}
		// Depth > 0: the members went through a bisection (this batch is a half, or a
		// retry of one) after an earlier batch of theirs failed; this merge clears them.
		if b.Depth > 0 && b.ParentID != nil {
			evs := make([]memberEvent, len(settled))
			for i, op := range settled {
				evs[i] = memberEvent{op: op, code: EventBystander, verb: "bystander",
					detail: fmt.Sprintf("not the culprit: merged in batch %d, a bisection round at depth %d (from failed batch %d)", id, b.Depth, *b.ParentID)}
			}
			return insertMemberEvents(ctx, tx, id, evs)
		}
		return nil
	})
	return b, err
}

// BatchSettleFailed settles a batch as failed in one transaction, batch guard first
// (active status AND version → FAILED with code/message), then members in_batch →
// failed with the reason, bindings (grant → failed, revoke → back to active), waiting
// rows deleted; member history and audit kept. ErrLostRace when another settler was
// first. It is BatchSettleRequeue with an empty plan.
func (s *Store) BatchSettleFailed(ctx context.Context, id int64, from domain.BatchStatus, version int64, code, message string) (domain.Batch, error) {
	return s.BatchSettleRequeue(ctx, id, from, version, domain.FailureClass(code), message, nil)
}

// settleBatchRow is every settlement's first statement: the guarded batch write. A
// second settler fails right here (ErrLostRace) and changes nothing. failClass is
// written only when not empty.
func settleBatchRow(ctx context.Context, tx *sqlx.Tx, id int64, from domain.BatchStatus, version int64, to domain.BatchStatus,
	code, message, failClass string) error {
	r, err := tx.ExecContext(ctx,
		`UPDATE merge_batch SET status = ?, error_code = ?, error_message = ?,
		        fail_class = IF(? = '', fail_class, ?),
		        finished_at = CURRENT_TIMESTAMP(6), version = version + 1,
		        updated_at = CURRENT_TIMESTAMP(6)
		  WHERE id = ? AND status = ? AND version = ?`,
		to, code, message, failClass, failClass, id, from, version)
	if err != nil {
		return err
	}
	return mustAffect(r, 1)
}

// lockMembers locks, in key order, the members of batch id still in state from in this
// batch (a member retried into another batch has another batch_id and is left alone).
func lockMembers(ctx context.Context, tx *sqlx.Tx, id int64, members []string, from domain.OpStatus) ([]settledOp, error) {
	var ops []settledOp
	err := forChunks(len(members), maxInPlaceholders, func(lo, hi int) error {
		args := make([]any, 0, hi-lo+2)
		for _, m := range members[lo:hi] {
			args = append(args, m)
		}
		args = append(args, id, from)
		var chunk []settledOp
		if err := tx.SelectContext(ctx, &chunk,
			`SELECT operation_id, action, subject, target FROM operation
			  WHERE operation_id IN (`+inPlaceholders(hi-lo)+`) AND batch_id = ? AND status = ?
			  ORDER BY operation_id FOR UPDATE`, args...); err != nil {
			return err
		}
		ops = append(ops, chunk...)
		return nil
	})
	return ops, err
}

func opIDsOf(ops []settledOp) []string {
	out := make([]string, len(ops))
	for i, o := range ops {
		out[i] = o.OperationID
	}
	return out
}

// moveOps moves locked member operations of batch id from → to with an error code and
// message, in chunks. A move to queued (a requeue) also clears batch_id: the operation
// waits again. We hold the row locks since lockMembers, so anything but a full match
// means the rows are not what we locked: refuse rather than half-settle.
func moveOps(ctx context.Context, tx *sqlx.Tx, id int64, opIDs []string, from, to domain.OpStatus, code, message string) error {
	clear := ""
	if to == domain.OpQueued {
		clear = "batch_id = NULL, "
	}
	return forChunks(len(opIDs), maxInPlaceholders, func(lo, hi int) error {
		upd := make([]any, 0, hi-lo+5)
		upd = append(upd, to, code, message)
		for _, o := range opIDs[lo:hi] {
			upd = append(upd, o)
		}
		upd = append(upd, id, from)
		r, err := tx.ExecContext(ctx,
			`UPDATE operation SET status = ?, error_code = ?, error_message = ?, `+clear+`
			        version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
			  WHERE operation_id IN (`+inPlaceholders(hi-lo)+`) AND batch_id = ? AND status = ?`, upd...)
		if err != nil {
			return err
		}
		return mustAffect(r, int64(hi-lo))
	})
}

// qMoveBindings is the guarded binding move for n (subject, target, operation_id)
// triples. The index hint is there because the optimizer's choice is not stable: where
// targets are nearly unique it prefers idx_target (the shorter key, same row estimate),
// and a busy target shared by many subjects would then be read — and, for the
// statement's duration, locked — row by row. uk_subject_target finds each triple's one
// row, whatever the data looks like.
func qMoveBindings(n int) string {
	return `UPDATE binding FORCE INDEX (uk_subject_target)
	           SET status = ?, version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
	         WHERE (subject, target, operation_id) IN (` +
		strings.TrimSuffix(strings.Repeat("(?,?,?),", n), ",") + `) AND status = ?`
}

// moveBindings moves the bindings of settled members, grants then revokes, each in
// (subject, target) order, guarded on the binding still belonging to that operation and
// being in the expected state. A binding that does not match is left as it is: the
// batch outcome is a fact about the repository and must not be refused over one
// relation, and I5 keeps a binding with an in-flight operation from being taken over.
func moveBindings(ctx context.Context, tx *sqlx.Tx, ops []settledOp, grantFrom, grantTo, revokeFrom, revokeTo domain.BindingStatus) error {
	for _, kind := range []struct {
		action   domain.Action
		from, to domain.BindingStatus
	}{{domain.ActionGrant, grantFrom, grantTo}, {domain.ActionRevoke, revokeFrom, revokeTo}} {
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
			_, err := tx.ExecContext(ctx, qMoveBindings(hi-lo), args...)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// BatchesTimedOut returns active batches created more than timeout ago (DB clock),
// except those without an MR whose publish reservation is still live.
func (s *Store) BatchesTimedOut(ctx context.Context, timeout time.Duration, limit int) ([]domain.Batch, error) {
	if limit <= 0 {
		limit = 100
	}
	out := []domain.Batch{}
	err := s.db.SelectContext(ctx, &out, qBatchesTimedOut, micros(timeout), micros(timeout), limit)
	slices.SortFunc(out, func(a, b domain.Batch) int { return cmp.Compare(a.ID, b.ID) })
	return out, translate(err)
}

// FailedCursor is a position in BatchesFailedRecently's (updated_at, id) order; the zero
// value is the start.
type FailedCursor struct {
	UpdatedAt time.Time
	ID        int64
}

// After is the cursor just past b.
func (c FailedCursor) After(b domain.Batch) FailedCursor {
	return FailedCursor{UpdatedAt: b.UpdatedAt, ID: b.ID}
}

// BatchesFailedRecently returns FAILED batches, with or without a recorded MR, finished within the
// last `within` (DB clock) — what the orphan sweep re-reads to let "merged wins" — in
// (updated_at, id) order after the cursor. A caller pages through them pass by pass and
// starts over when a page comes back short: reading the first page every time would
// never reach the newest failures once more than a page of them accumulate.
func (s *Store) BatchesFailedRecently(ctx context.Context, within time.Duration, after FailedCursor, limit int) ([]domain.Batch, error) {
	if limit <= 0 {
		limit = 100
	}
	from := after.UpdatedAt.UTC()
	if from.Year() < 1970 {
		from = time.Unix(0, 0).UTC() // DATETIME(6) holds no year 1 the driver would send
	}
	out := []domain.Batch{}
	err := s.db.SelectContext(ctx, &out, qFailedRecently, micros(within), micros(within), from, from, after.ID, limit)
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
