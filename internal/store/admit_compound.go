package store

// The group transaction in one or two round trips, on servers that take anonymous
// compound statements (MariaDB ≥ 10.1: BEGIN NOT ATOMIC … END is one statement on the
// wire; no multi-statement flag is needed).
//
// Optimistic, one round trip, when every request of the group is a valid grant: most
// admissions apply for a relation that has no binding yet, with a new idempotency key,
// and then there is nothing to decide that the unique keys do not decide already:
//
//	BEGIN NOT ATOMIC
//	  DECLARE adm_now DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6); DECLARE adm_id BIGINT DEFAULT 0;
//	  SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;
//	  IF <an expires_at is not in the future> THEN SIGNAL …; END IF;
//	  IF <a grant's file collides by letter case with another binding's> THEN SIGNAL …; END IF;
//	  <the writes of buildAdmitWrites; after a guarded one IF ROW_COUNT() <> n THEN SIGNAL …>;
//	  (after the operation INSERT) SET adm_id = LAST_INSERT_ID();
//	  COMMIT;
//	  SELECT adm_id, adm_now;
//	END
//
// A stored key or an existing binding makes it fail (1062), a case collision or a past
// expiry makes it SIGNAL, and nothing of it stays: the group then takes the read path.
// A run of failures turns optimism off for a while, so a workload of re-applications
// pays for it at most once in a few groups.
//
// Read path, two round trips, the same decisions as groupPlain:
//
//  1. SET TRANSACTION …; START TRANSACTION; the read (admitReadQuery);
//  2. the writes, guarded, COMMIT and the answer.
//
// The writes, their order and their guards are exactly those of groupPlain (both use
// buildAdmitWrites); only the round trips differ. No row is read back: the compound
// answers with the time it wrote and the first id (writeCompound; on a server whose ids
// do not follow each other, such as Galera, it reads the ids before COMMIT instead).
// The transaction is driven with plain SQL on one pinned connection, so every way out
// ends it (COMMIT, or ROLLBACK on a fresh context) before the connection goes back to
// the pool, and a connection in an unknown state is discarded. Errors:
//
//   - the server refuses a statement before COMMIT (1062, deadlock, a guard's SIGNAL):
//     the transaction did not commit; ROLLBACK, then the read path (after an
//     optimistic attempt) or the per-request path (after the read path);
//   - the COMMIT fails: not committed either, same as above;
//   - the connection breaks while a compound with COMMIT runs: the outcome is unknown
//     (the server may finish it after we stopped listening), so each accepted caller
//     gets ErrCommitUnknown, exactly as when the per-request path loses its COMMIT.
//
// On a server that refuses the syntax (MySQL), a one-time probe turns this path off and
// groupPlain runs instead.

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

const (
	compoundUnknown int32 = iota
	compoundYes
	compoundNo
)

// useCompound reports whether groups use compound statements: on unless the options
// say plain statements, and the server takes them (probed once).
func (s *Store) useCompound(ctx context.Context, a *admitter) bool {
	a.mu.Lock()
	plain := a.opts.PlainStatements
	a.mu.Unlock()
	if plain {
		return false
	}
	switch a.compound.Load() {
	case compoundYes:
		return true
	case compoundNo:
		return false
	}
	_, err := s.db.ExecContext(ctx, "BEGIN NOT ATOMIC DO 1; END")
	var me *mysql.MySQLError
	switch {
	case err == nil:
		a.compound.Store(compoundYes)
		return true
	case errors.As(err, &me):
		a.compound.Store(compoundNo) // a syntax error (1064): not MariaDB
	}
	return false // a connection problem: plain this time, probe again next time
}

// Messages of the SIGNALs (MySQL error 1644, SQLSTATE 45000) that abort a compound.
const (
	guardSignal   = "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'batcherd: admission guard matched another row count'"
	expiredSignal = "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'batcherd: expires_at is not in the future'"
	foldSignal    = "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'batcherd: a binding file differs only by letter case'"
)

// optimisticBackoff is how many groups skip the optimistic attempt after one failed.
const optimisticBackoff = 8

// compoundResult is how a compound statement with COMMIT ended.
type compoundResult int8

const (
	compoundCommitted      compoundResult = iota
	compoundRefused                       // the server refused: not committed, the transaction may still be open
	compoundUnknownOutcome                // the connection broke: it may or may not have committed
)

// newOp is a new operation as a write compound answers it (writeCompound).
type newOp struct {
	ID          int64     `db:"id"`
	OperationID string    `db:"operation_id"`
	CreatedAt   time.Time `db:"created_at"`
	UpdatedAt   time.Time `db:"updated_at"`
}

// groupCompound runs the group (see the file comment).
func (s *Store) groupCompound(ctx context.Context, a *admitter, work []*admitReq) {
	step := s.autoincStepOf(ctx, a) // before taking the group's connection
	conn, err := s.db.Connx(ctx)
	if err != nil {
		a.fallback(work, true)
		return
	}
	open := false // a transaction may be open on conn
	defer func() {
		if open {
			endConn(conn)
			return
		}
		conn.Close()
	}()

	if s.tryOptimistic(ctx, a, conn, work, step, &open) {
		return
	}

	// 1. Isolation, begin and the read.
	q, args := admitReadQuery(work)
	var rows []admitReadRow
	open = true
	if err := sqlx.SelectContext(ctx, conn, &rows,
		"BEGIN NOT ATOMIC SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;\n"+q+";\nEND", args...); err != nil {
		a.fallback(work, true)
		return
	}
	rd, err := admitReadResult(rows)
	if err != nil {
		a.fallback(work, true)
		return
	}
	if admitAfterRead != nil {
		admitAfterRead(ctx)
	}
	acc := a.decideGroup(work, rd)
	if len(acc) == 0 {
		return // refused or serial: the deferred ROLLBACK ends the read-only transaction
	}

	// 2. The writes, guarded, the new operations, COMMIT.
	stmts, opStmt := buildAdmitWrites(compoundClock, acc, s.EventReceivers())
	ops, res, err := writeCompound(ctx, conn, "", nil, stmts, opStmt, step, acc)
	switch res {
	case compoundCommitted:
		open = false
		answerNew(acc, ops)
	case compoundUnknownOutcome:
		open = false
		discardConn(conn)
		commitUnknown(acc, err)
	default:
		// A 1062 from a concurrent replica, a deadlock, a guard that lost: nothing of
		// the group stays (the deferred ROLLBACK), each caller runs its own transaction.
		a.fallback(acceptedReqs(acc), true)
	}
}

// tryOptimistic is the one-round-trip attempt of a group that needs no read to be
// decided (optimisticCandidates): its writes, guarded by the expiry test on the
// database clock, in one compound statement. It reports whether the group has been
// answered; false leaves conn with no transaction open (*open false), for the read
// path. After a refusal the next optimisticBackoff groups skip the attempt.
func (s *Store) tryOptimistic(ctx context.Context, a *admitter, conn *sqlx.Conn, work []*admitReq, step int64, open *bool) bool {
	acc, ok := optimisticCandidates(work)
	if !ok {
		return false
	}
	if a.optimisticSkip.Load() > 0 {
		a.optimisticSkip.Add(-1)
		return false
	}
	a.stats.optimistic.Add(1)
	stmts, opStmt := buildAdmitWrites(compoundClock, acc, s.EventReceivers())
	pre, preArgs := optimisticPrelude(acc)
	*open = true
	rows, res, err := writeCompound(ctx, conn, pre, preArgs, stmts, opStmt, step, acc)
	switch res {
	case compoundCommitted:
		*open = false
		answerNew(acc, rows)
		return true
	case compoundUnknownOutcome:
		*open = false
		discardConn(conn)
		commitUnknown(acc, err)
		return true
	}
	// Refused: a stored key, an existing binding, a past expiry, a concurrent replica.
	// Nothing stays; decide on a read.
	a.stats.optimisticMisses.Add(1)
	a.optimisticSkip.Store(optimisticBackoff)
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		a.fallback(work, true)
		return true
	}
	*open = false
	return false
}

// optimisticPrelude begins the optimistic transaction and refuses it when any grant's
// expiry is not in the future (expiredSignal: the same test as decideAdmission's, on
// the database clock) or any grant's file collides by letter case with another
// binding's (foldSignal: caseCollisionWhere). The read path then answers each request.
func optimisticPrelude(acc []accepted) (string, []any) {
	var pre strings.Builder
	var args []any
	pre.WriteString("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;\n")
	n := 0
	for _, x := range acc {
		if x.r.p.ExpiresAt == nil {
			continue
		}
		if n == 0 {
			pre.WriteString("IF ")
		} else {
			pre.WriteString(" OR ")
		}
		pre.WriteString("? <= CURRENT_TIMESTAMP(6)")
		args = append(args, x.r.p.ExpiresAt.UTC().Truncate(time.Microsecond))
		n++
	}
	if n > 0 {
		pre.WriteString(" THEN " + expiredSignal + "; END IF;\n")
	}
	// Every candidate is a grant (optimisticCandidates).
	for i, x := range acc {
		if i == 0 {
			pre.WriteString("IF ")
		} else {
			pre.WriteString(" OR ")
		}
		pre.WriteString("EXISTS (SELECT 1 FROM binding WHERE " + caseCollisionWhere + ")")
		args = append(args, caseCollisionArgs(x.repo, x.r.p.Subject, x.r.p.Target)...)
	}
	if len(acc) > 0 {
		pre.WriteString(" THEN " + foldSignal + "; END IF;\n")
	}
	return pre.String(), args
}

// optimisticCandidates returns the group as accepted grants when every request is a
// grant that needs no read to be decided (valid; whether its relation or key exists is
// left to the unique keys, its expiry to the database clock).
func optimisticCandidates(work []*admitReq) ([]accepted, bool) {
	acc := make([]accepted, 0, len(work))
	for _, r := range work {
		if r.p.Action != domain.ActionGrant {
			return nil, false
		}
		// The expiry is checked in SQL; decide as if the clock allowed it.
		x, err := decideAdmission(r.p, time.Time{}, groupBinding{})
		if err != nil {
			return nil, false
		}
		x.r = r
		acc = append(acc, x)
	}
	return acc, true
}

// compoundClock makes a write compound's operations take created_at and updated_at
// from its adm_now variable (writeCompound), which the compound answers with.
var compoundClock = admitClock{sqlVar: "adm_now"}

// writeCompound runs one compound: pre (with preArgs), the writes with their guards
// (none after a statement that cannot report another row count), COMMIT and the
// answer, and returns the new operations when it committed.
//
// What the database assigns, the compound answers without reading a row back: the
// time is its local variable adm_now, read once (every statement of a compound reads
// the clock anew, so the operations are written with the variable, not the column
// default), and when ids follow each other by step (autoincStepOf), the first one is
// LAST_INSERT_ID() after the operation INSERT (stmts[opStmt]). The answer is then one
// row, after COMMIT: it arrives only when COMMIT succeeded. With step 0 (ids
// interleaved, as on Galera) the compound reads the new operations' ids before COMMIT,
// whose answer then follows that result set.
func writeCompound(ctx context.Context, conn *sqlx.Conn, pre string, preArgs []any, stmts []admitStmt, opStmt int, step int64,
	acc []accepted) ([]newOp, compoundResult, error) {
	var b strings.Builder
	all := append([]any(nil), preArgs...)
	b.WriteString("BEGIN NOT ATOMIC\nDECLARE adm_now DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6);\nDECLARE adm_id BIGINT DEFAULT 0;\n")
	b.WriteString(pre)
	for i, st := range stmts {
		b.WriteString(st.q)
		b.WriteString(";\n")
		if st.want >= 0 && !st.exact {
			b.WriteString("IF ROW_COUNT() <> ")
			b.WriteString(itoa(st.want))
			b.WriteString(" THEN " + guardSignal + "; END IF;\n")
		}
		if i == opStmt && step > 0 {
			b.WriteString("SET adm_id = LAST_INSERT_ID();\n")
		}
		all = append(all, st.args...)
	}
	if step > 0 {
		b.WriteString("COMMIT;\nSELECT adm_id AS id, adm_now AS now;\nEND")
	} else {
		b.WriteString("SELECT id, operation_id, adm_now AS created_at, adm_now AS updated_at FROM operation WHERE operation_id IN (" +
			inPlaceholders(len(acc)) + ");\nCOMMIT;\nEND")
		for _, x := range acc {
			all = append(all, x.r.p.OperationID)
		}
	}
	rows, err := conn.QueryxContext(ctx, b.String(), all...)
	if err != nil {
		return nil, classify(ctx, err), err
	}
	var out []newOp
	var first struct {
		ID  int64     `db:"id"`
		Now time.Time `db:"now"`
	}
	for rows.Next() {
		var err error
		if step > 0 {
			err = rows.StructScan(&first)
		} else {
			var o newOp
			if err = rows.StructScan(&o); err == nil {
				out = append(out, o)
			}
		}
		if err != nil {
			rows.Close()
			return nil, classify(ctx, err), err
		}
	}
	// With step 0 the COMMIT's answer follows the result set: a failure shows up only here.
	for rows.NextResultSet() {
		for rows.Next() {
		}
	}
	err = rows.Err()
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, classify(ctx, err), err
	}
	if step > 0 {
		if first.ID == 0 {
			// Cannot happen (the SELECT follows COMMIT in the same compound), but the
			// group has committed: say so honestly (answerNew finds no operation).
			return nil, compoundCommitted, nil
		}
		out = make([]newOp, len(acc))
		for i, x := range acc {
			out[i] = newOp{ID: first.ID + int64(i)*step, OperationID: x.r.p.OperationID, CreatedAt: first.Now, UpdatedAt: first.Now}
		}
	}
	return out, compoundCommitted, nil
}

// classify reads an error of a compound with COMMIT: a server error means it did not
// commit; anything else (connection lost, context ended mid-way) leaves it unknown.
func classify(ctx context.Context, err error) compoundResult {
	var me *mysql.MySQLError
	if errors.As(err, &me) && ctx.Err() == nil {
		translate(err) // counts it
		return compoundRefused
	}
	return compoundUnknownOutcome
}

// answerNew answers the accepted callers with the operations the compound read back.
func answerNew(acc []accepted, ops []newOp) {
	byOp := make(map[string]newOp, len(ops))
	for _, o := range ops {
		byOp[o.OperationID] = o
	}
	for _, x := range acc {
		o, ok := byOp[x.r.p.OperationID]
		if !ok {
			// Cannot happen (the INSERT was guarded on its row count and the SELECT ran
			// in the same transaction), but the group has committed: say so honestly.
			commitUnknown([]accepted{x}, errors.New("store: committed operation not read back"))
			continue
		}
		answerOne(x, o.ID, o.CreatedAt.UTC(), o.UpdatedAt.UTC())
	}
}

// endConn ends a possibly open transaction on conn with ROLLBACK on a fresh bounded
// context and returns conn to the pool, or discards it when that failed: a connection
// must never go back to the pool inside a transaction.
func endConn(conn *sqlx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		discardConn(conn)
		return
	}
	conn.Close()
}

// discardConn closes conn's underlying connection instead of returning it to the pool.
func discardConn(conn *sqlx.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	conn.Close()
}
