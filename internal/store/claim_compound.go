package store

// The claim in two round trips, on servers that take the no-wait slot INSERT (MariaDB,
// innodb_rollback_on_timeout OFF: Store.slotNoWait), which also take anonymous compound
// statements (BEGIN NOT ATOMIC … END, one statement on the wire).
//
//  1. claimStartSQL: the lock-free precheck (anything waiting? slot held by a committed
//     batch? paused?), and only when it may claim: READ COMMITTED, START TRANSACTION,
//     the pause read with its shared lock, the no-wait slot INSERT (a lock met: the
//     no-wait holder read, then the waiting INSERT when no holder was there, exactly as
//     takeSlot), the claim head and the group's waiting rows. A round that cannot claim
//     is answered by this one round trip, its transaction (if it began one) rolled back
//     inside it: a losing claimant costs one round trip, as a bare query does, not five
//     (SET TRANSACTION, START TRANSACTION, the pause read, the slot INSERT, ROLLBACK).
//  2. claimWritesRun: the same guarded writes as the statement path, in the same order
//     (claimRequests; the operations and the member history set-based, one statement
//     each, claimOperationsOf and insertMembersOf; finishClaimedBatch; the outbox), each
//     guard a ROW_COUNT() test that SIGNALs, and COMMIT.
//
// The decisions are those of claim on the statement path: the slot's unique key decides
// I1, the guarded UPDATE's row count I2, and nothing reads the waiting rows FOR UPDATE
// (I3). The transaction is driven with plain SQL on one pinned connection; every way out
// ends it (COMMIT, or ROLLBACK on a fresh context) before the connection goes back to
// the pool, and a connection in an unknown state is discarded (endConn, discardConn).

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// claimPreemptedSignal aborts the writes compound when a guarded claim changed fewer
// rows than it read (I2): another transaction took some between the read and the
// writes. claimGuardSignal aborts it when any other guarded write missed.
const (
	errUserSignal        = 1644 // SIGNAL SQLSTATE '45000'
	claimPreemptedMsg    = "batcherd: claim preempted"
	claimPreemptedSignal = "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '" + claimPreemptedMsg + "'"
	claimGuardSignal     = "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'batcherd: claim write matched another row count'"
)

// claimStartSQL is the first round trip (see the file comment). Its first result set
// is one row (outcome, batch_id, grp); after "claimed" the second is the group's
// waiting rows in queue order, as qClaimRead reads them. Every way that does not claim
// ends its transaction inside the statement; an error (the waiting INSERT after a
// neighbour's lock, answered 1062 or 1213) leaves it to the caller's ROLLBACK.
//
// Arguments: repo ×3 (precheck), repo (pause), repo and status (slot), repo (holder),
// repo and status (slot, waiting), repo (head), groupsOnly, the urgent lane, repo and
// max (read).
const claimStartSQL = `BEGIN NOT ATOMIC
  DECLARE v_waiting, v_held, v_paused, v_lock, v_found TINYINT DEFAULT 0;
  DECLARE v_batch, v_holder BIGINT DEFAULT 0;
  DECLARE v_grp VARCHAR(64) DEFAULT '';
  DECLARE v_lane TINYINT DEFAULT 1;
  SELECT EXISTS (SELECT 1 FROM merge_batch_request WHERE repo = ? AND batch_id IS NULL),
         EXISTS (SELECT 1 FROM merge_batch WHERE active_slot = ?),
         EXISTS (SELECT 1 FROM repo_control WHERE repo = ? AND ` + pausedNow + `)
    INTO v_waiting, v_held, v_paused;
  IF v_paused THEN
    SELECT '` + string(ClaimPaused) + `' AS outcome, 0 AS batch_id, '' AS grp;
  ELSEIF v_held THEN
    SELECT '` + string(ClaimSlotOccupied) + `' AS outcome, 0 AS batch_id, '' AS grp;
  ELSEIF NOT v_waiting THEN
    SELECT '` + string(ClaimNothingToClaim) + `' AS outcome, 0 AS batch_id, '' AS grp;
  ELSE
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    BEGIN
      DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_paused = 0;
      SELECT ` + pausedNow + ` INTO v_paused FROM repo_control WHERE repo = ? LOCK IN SHARE MODE;
    END;
    IF v_paused THEN
      ROLLBACK;
      SELECT '` + string(ClaimPaused) + `' AS outcome, 0 AS batch_id, '' AS grp;
    ELSE
      BEGIN
        DECLARE CONTINUE HANDLER FOR 1062 SET v_held = 1;
        DECLARE CONTINUE HANDLER FOR 1205 SET v_lock = 1;
        ` + slotInsertNoWait + `;
        IF NOT v_held AND NOT v_lock THEN SET v_batch = LAST_INSERT_ID(); END IF;
      END;
      IF v_lock THEN
        BEGIN
          DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_holder = 0;
          DECLARE CONTINUE HANDLER FOR 1205 SET v_held = 1;
          SET STATEMENT innodb_lock_wait_timeout = 0 FOR
            SELECT id INTO v_holder FROM merge_batch WHERE active_slot = ? FOR UPDATE;
          IF v_holder <> 0 THEN SET v_held = 1; END IF;
        END;
        IF NOT v_held THEN
          ` + slotInsertWait + `;
          SET v_batch = LAST_INSERT_ID();
        END IF;
      END IF;
      IF v_held THEN
        ROLLBACK;
        SELECT '` + string(ClaimSlotOccupied) + `' AS outcome, 0 AS batch_id, '' AS grp;
      ELSE
        BEGIN
          DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
          SET v_found = 1;
          ` + qClaimHeadInto + `;
        END;
        IF NOT v_found OR (? AND v_grp = '' AND v_lane <> ?) THEN
          ROLLBACK;
          SELECT '` + string(ClaimNothingToClaim) + `' AS outcome, 0 AS batch_id, '' AS grp;
        ELSE
          SELECT '` + string(ClaimClaimed) + `' AS outcome, v_batch AS batch_id, v_grp AS grp;
          ` + qClaimReadGroup + `;
        END IF;
      END IF;
    END IF;
  END IF;
END`

// claimStartRow is the first result set of claimStartSQL.
type claimStartRow struct {
	Outcome ClaimOutcome
	BatchID int64
	Grp     string
}

// claimCompound is claim on the two-round-trip path (see the file comment).
func (s *Store) claimCompound(ctx context.Context, repo string, max int, groupsOnly bool, inst string) (ClaimResult, error) {
	conn, err := s.db.Connx(ctx)
	if err != nil {
		return ClaimResult{}, translate(err)
	}
	open := false // a transaction may be open on conn
	defer func() {
		if open {
			endConn(conn)
			return
		}
		conn.Close()
	}()

	open = true
	start, rows, err := claimStart(ctx, conn, repo, max, groupsOnly)
	if err != nil {
		// The waiting INSERT after a neighbour's lock met a holder (1062), or lost a
		// deadlock (1213): occupied, as on the statement path.
		if slotAnswer(err) {
			return ClaimResult{Outcome: ClaimSlotOccupied}, nil
		}
		return ClaimResult{}, translate(txDone(ctx, err))
	}
	if start.Outcome != ClaimClaimed {
		open = false // ended inside the statement, or never begun
		return ClaimResult{Outcome: start.Outcome}, nil
	}
	if len(rows) == 0 {
		// Committing would leave a memberless RUNNING batch holding the slot.
		return ClaimResult{Outcome: ClaimNothingToClaim}, nil
	}

	s.claimAfterRead(ctx, start.BatchID, rows)
	w := s.claimWrites(ctx, start.BatchID, repo, start.Grp, rows, inst, true)
	hook := s.Hooks != nil && s.Hooks.ClaimAfterUpdate != nil
	err = claimWritesRun(ctx, conn, w.stmts, !hook)
	if err == nil && hook {
		s.claimAfterUpdate(ctx, start.BatchID)
		if ctx.Err() != nil {
			// Cancelled before COMMIT was sent: nothing committed (the deferred ROLLBACK).
			return ClaimResult{}, ctx.Err()
		}
		_, err = conn.ExecContext(ctx, "COMMIT")
	}
	switch {
	case err == nil:
		open = false
		return ClaimResult{Outcome: ClaimClaimed, BatchID: start.BatchID, OperationIDs: w.opIDs,
			Group: start.Grp, Kind: w.kind, ParentID: rows[0].ParentID, Depth: rows[0].Depth}, nil
	case isClaimPreempted(err):
		return ClaimResult{Outcome: ClaimPreempted}, nil
	}
	var me *mysql.MySQLError
	if !errors.As(err, &me) || ctx.Err() != nil {
		// The connection broke (or the context ended, which makes the driver drop it)
		// while a statement with COMMIT ran: it may have committed, as a lost COMMIT on
		// the statement path. A cancellation stays visible as one (shutdown).
		open = false
		discardConn(conn)
		if ctx.Err() != nil {
			return ClaimResult{}, fmt.Errorf("%w: %w", ErrCommitUnknown, ctx.Err())
		}
		return ClaimResult{}, commitError(ctx, err)
	}
	// The server refused: nothing committed. A deadlock after the slot was ours is
	// preempted, as on the statement path (claimAnswer).
	return claimAnswer(ClaimResult{}, translate(err), true)
}

// claimStart runs claimStartSQL and reads its answer.
func claimStart(ctx context.Context, conn *sqlx.Conn, repo string, max int, groupsOnly bool) (claimStartRow, []waitingRow, error) {
	var start claimStartRow
	var rows []waitingRow
	res, err := conn.QueryxContext(ctx, claimStartSQL, repo, repo, repo, repo,
		repo, domain.BatchRunning, repo, repo, domain.BatchRunning, repo,
		groupsOnly, laneOf(domain.PriorityUrgent), repo, max)
	if err != nil {
		return start, nil, err
	}
	defer res.Close()
	if !res.Next() {
		if err := res.Err(); err != nil {
			return start, nil, err
		}
		return start, nil, errors.New("store: claim answered no outcome")
	}
	// Plain Scan: sqlx keeps the first result set's column mapping across NextResultSet.
	if err := res.Scan(&start.Outcome, &start.BatchID, &start.Grp); err != nil {
		return start, nil, err
	}
	for res.Next() {
	}
	if start.Outcome == ClaimClaimed && res.NextResultSet() {
		for res.Next() {
			var w waitingRow
			if err := res.Scan(&w.ID, &w.OperationID, &w.Kind, &w.ParentID, &w.Depth, &w.Half, &w.Retries, &w.Tries); err != nil {
				return start, nil, err
			}
			rows = append(rows, w)
		}
	}
	for res.NextResultSet() {
		for res.Next() {
		}
	}
	return start, rows, res.Err()
}

// claimWritesRun runs the claim's writes as one compound statement, each guarded one
// followed by its ROW_COUNT() test, and COMMIT when commit.
func claimWritesRun(ctx context.Context, conn *sqlx.Conn, stmts []claimStmt, commit bool) error {
	var b strings.Builder
	var args []any
	b.WriteString("BEGIN NOT ATOMIC\n")
	for _, st := range stmts {
		b.WriteString(st.q)
		b.WriteString(";\n")
		if st.want >= 0 {
			sig := claimGuardSignal
			if st.preempts {
				sig = claimPreemptedSignal
			}
			b.WriteString("IF ROW_COUNT() <> " + itoa(st.want) + " THEN " + sig + "; END IF;\n")
		}
		args = append(args, st.args...)
	}
	if commit {
		b.WriteString("COMMIT;\n")
	}
	b.WriteString("END")
	_, err := conn.ExecContext(ctx, b.String(), args...)
	return err
}

// isClaimPreempted reports whether err is claimPreemptedSignal.
func isClaimPreempted(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errUserSignal && strings.Contains(me.Message, claimPreemptedMsg)
}
