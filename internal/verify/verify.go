// Package verify audits a live batcherd database, read-only, for violations of the
// invariants (docs/ARCHITECTURE.md, I1–I8) and of the agreement between tables that the state machine
// maintains. It is what `batcherd verify` runs and what the chaos run trusts.
//
// Every check runs inside one READ ONLY transaction WITH CONSISTENT SNAPSHOT: each
// store method is one transaction, so a single snapshot sees the database between
// transitions and a live system never shows a transient "violation". Tables are scanned
// in primary-key chunks with a few indexed queries per chunk, so the cost is bounded
// and linear on large tables.
package verify

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// Violation is one broken rule.
type Violation struct {
	Check  string // e.g. "I1", "I2", "I5", "agreement"
	Table  string
	IDs    []string
	Detail string
}

func (v Violation) String() string {
	return fmt.Sprintf("[%s] %s %s: %s", v.Check, v.Table, strings.Join(v.IDs, ","), v.Detail)
}

// Report is the result of a run.
type Report struct {
	Operations, Batches, Bindings int
	Violations                    []Violation
}

// Clean reports whether no violation was found.
func (r *Report) Clean() bool { return len(r.Violations) == 0 }

// Print writes a human-readable report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "scanned: %d operations, %d batches, %d bindings\n", r.Operations, r.Batches, r.Bindings)
	if r.Clean() {
		fmt.Fprintln(w, "no violations")
		return
	}
	fmt.Fprintf(w, "%d violation(s):\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintln(w, "  "+v.String())
	}
}

// Options tunes a run.
type Options struct {
	Chunk int // rows per chunk, default 1000
	// MaxViolations stops collecting after this many (default 1000) so a badly broken
	// database still gives a readable report.
	MaxViolations int
}

type auditor struct {
	tx   *sqlx.Tx
	opt  Options
	rep  *Report
	full bool
}

func (a *auditor) add(check, table, detail string, ids ...string) {
	if len(a.rep.Violations) >= a.opt.MaxViolations {
		a.full = true
		return
	}
	a.rep.Violations = append(a.rep.Violations, Violation{Check: check, Table: table, IDs: ids, Detail: detail})
}

// Run audits the database behind db. It changes nothing.
func Run(ctx context.Context, db *sqlx.DB, opt Options) (*Report, error) {
	if opt.Chunk <= 0 {
		opt.Chunk = 1000
	}
	if opt.MaxViolations <= 0 {
		opt.MaxViolations = 1000
	}
	conn, err := db.Connx(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
		return nil, fmt.Errorf("start snapshot: %w", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK") //nolint:errcheck
	a := &auditor{opt: opt, rep: &Report{}}
	q := &querier{conn: conn}
	for _, step := range []func(context.Context, *querier) error{a.batches, a.operations, a.bindings} {
		if err := step(ctx, q); err != nil {
			return a.rep, err
		}
	}
	if a.full {
		a.add("report", "-", fmt.Sprintf("stopped after %d violations", opt.MaxViolations))
	}
	return a.rep, nil
}

type querier struct{ conn *sqlx.Conn }

func (q *querier) sel(ctx context.Context, dest any, query string, args ...any) error {
	query, args, err := sqlx.In(query, args...)
	if err != nil {
		return err
	}
	return q.conn.SelectContext(ctx, dest, query, args...)
}

// eventBatchUnchanged is store.EventBatchUnchanged, spelled out: the auditor reads the
// tables the way an outside tool would, not through the store.
const eventBatchUnchanged = "batch_unchanged"

type batchRow struct {
	ID     int64              `db:"id"`
	Repo   string             `db:"repo"`
	Status domain.BatchStatus `db:"status"`
	MRIID  sql.NullInt64      `db:"mr_iid"`
	Size   int                `db:"size"`
}

// batches: I1 (one active batch per repository), "a SUCCEEDED batch has an MR" (or
// the event saying the repository already had its changes), and
// "a batch's member history is what it claimed" (size = member rows, never none: the
// claim writes both in one transaction and nothing adds members later).
func (a *auditor) batches(ctx context.Context, q *querier) error {
	active := map[string][]string{}
	var after int64
	for {
		var rows []batchRow
		if err := q.sel(ctx, &rows, "SELECT id, repo, status, mr_iid, size FROM merge_batch WHERE id > ? ORDER BY id LIMIT ?", after, a.opt.Chunk); err != nil {
			return fmt.Errorf("scan merge_batch: %w", err)
		}
		members := map[int64]int{}
		if len(rows) > 0 {
			ids := make([]int64, len(rows))
			for i, b := range rows {
				ids[i] = b.ID
			}
			var counts []struct {
				BatchID int64 `db:"batch_id"`
				N       int   `db:"n"`
			}
			// Primary-key prefix of merge_batch_member: one range per chunk.
			if err := q.sel(ctx, &counts, "SELECT batch_id, COUNT(*) AS n FROM merge_batch_member WHERE batch_id IN (?) GROUP BY batch_id", ids); err != nil {
				return fmt.Errorf("count merge_batch_member: %w", err)
			}
			for _, c := range counts {
				members[c.BatchID] = c.N
			}
		}
		// A SUCCEEDED batch without an MR is one whose changes the repository already
		// had (store.EventBatchUnchanged says so, written with the settle); any other is
		// a batch marked merged that no MR merged.
		unchanged, err := unchangedBatches(ctx, q, rows)
		if err != nil {
			return err
		}
		for _, b := range rows {
			id := fmt.Sprint(b.ID)
			switch n := members[b.ID]; {
			case n == 0:
				a.add("agreement", "merge_batch_member", fmt.Sprintf("batch (status %d) has no member history", b.Status), id)
			case n != b.Size:
				a.add("agreement", "merge_batch_member", fmt.Sprintf("batch size is %d but its member history has %d rows", b.Size, n), id)
			}
			switch {
			case b.Status.Active():
				active[b.Repo] = append(active[b.Repo], id)
			case b.Status == domain.BatchSucceeded:
				if !b.MRIID.Valid && !unchanged[b.ID] {
					a.add("agreement", "merge_batch", "SUCCEEDED batch has no MR recorded", id)
				}
			case b.Status == domain.BatchFailed:
			default:
				a.add("agreement", "merge_batch", fmt.Sprintf("unknown status %d", b.Status), id)
			}
		}
		a.rep.Batches += len(rows)
		if len(rows) < a.opt.Chunk {
			break
		}
		after = rows[len(rows)-1].ID
	}
	repos := make([]string, 0, len(active))
	for r := range active {
		repos = append(repos, r)
	}
	sort.Strings(repos)
	for _, r := range repos {
		if ids := active[r]; len(ids) > 1 {
			a.add("I1", "merge_batch", fmt.Sprintf("repository %q has %d active batches", r, len(ids)), ids...)
		}
	}
	return nil
}

// unchangedBatches returns which SUCCEEDED batches without an MR of rows carry the
// event saying the repository already had their changes (store.EventBatchUnchanged,
// written with the settle).
func unchangedBatches(ctx context.Context, q *querier, rows []batchRow) (map[int64]bool, error) {
	unchanged := map[int64]bool{}
	var noMR []int64
	for _, b := range rows {
		if b.Status == domain.BatchSucceeded && !b.MRIID.Valid {
			noMR = append(noMR, b.ID)
		}
	}
	if len(noMR) > 0 {
		var ids []int64
		if err := q.sel(ctx, &ids, "SELECT DISTINCT batch_id FROM audit_event WHERE batch_id IN (?) AND code = ?", noMR, eventBatchUnchanged); err != nil {
			return nil, fmt.Errorf("read batch events: %w", err)
		}
		for _, id := range ids {
			unchanged[id] = true
		}
	}
	return unchanged, nil
}

type opRow struct {
	ID          int64           `db:"id"`
	OperationID string          `db:"operation_id"`
	Status      domain.OpStatus `db:"status"`
	BatchID     sql.NullInt64   `db:"batch_id"`
	ErrorCode   string          `db:"error_code"`
}

type memberRow struct {
	OperationID string             `db:"operation_id"`
	BatchID     int64              `db:"batch_id"`
	Status      domain.BatchStatus `db:"status"`
}

type waitRow struct {
	OperationID string        `db:"operation_id"`
	BatchID     sql.NullInt64 `db:"batch_id"`
}

// operations: I2 and the operation ↔ waiting set ↔ member history ↔ batch agreement.
func (a *auditor) operations(ctx context.Context, q *querier) error {
	var after int64
	for {
		var ops []opRow
		if err := q.sel(ctx, &ops, "SELECT id, operation_id, status, batch_id, error_code FROM operation WHERE id > ? ORDER BY id LIMIT ?", after, a.opt.Chunk); err != nil {
			return fmt.Errorf("scan operation: %w", err)
		}
		if len(ops) == 0 {
			break
		}
		ids := make([]string, len(ops))
		for i, o := range ops {
			ids[i] = o.OperationID
		}
		var members []memberRow
		if err := q.sel(ctx, &members, `SELECT m.operation_id, m.batch_id, b.status FROM merge_batch_member m
			JOIN merge_batch b ON b.id = m.batch_id WHERE m.operation_id IN (?)`, ids); err != nil {
			return fmt.Errorf("scan merge_batch_member: %w", err)
		}
		var waits []waitRow
		if err := q.sel(ctx, &waits, "SELECT operation_id, batch_id FROM merge_batch_request WHERE operation_id IN (?)", ids); err != nil {
			return fmt.Errorf("scan merge_batch_request: %w", err)
		}
		byOp := map[string][]memberRow{}
		for _, m := range members {
			byOp[m.OperationID] = append(byOp[m.OperationID], m)
		}
		wait := map[string]waitRow{}
		for _, w := range waits {
			wait[w.OperationID] = w
		}
		for _, o := range ops {
			a.checkOp(o, byOp[o.OperationID], wait)
		}
		a.rep.Operations += len(ops)
		if len(ops) < a.opt.Chunk {
			break
		}
		after = ops[len(ops)-1].ID
	}
	return nil
}

func (a *auditor) checkOp(o opRow, members []memberRow, wait map[string]waitRow) {
	id := o.OperationID
	inMembers := func(b int64) (memberRow, bool) {
		for _, m := range members {
			if m.BatchID == b {
				return m, true
			}
		}
		return memberRow{}, false
	}
	// I2: a request is claimed by at most one batch. Failed batches release their
	// members (retry, bisection), so at most one non-FAILED batch may hold it.
	var live []string
	for _, m := range members {
		if m.Status != domain.BatchFailed {
			live = append(live, fmt.Sprint(m.BatchID))
		}
	}
	if len(live) > 1 {
		a.add("I2", "merge_batch_member", fmt.Sprintf("operation %s is a member of %d batches that did not fail: %s", id, len(live), strings.Join(live, ",")), id)
	}
	// A SUCCEEDED batch's MR merged every member's file: each member is merged, in that
	// batch. (A member left in_batch or requeued elsewhere would have its file in the
	// repository while the database says otherwise.)
	for _, m := range members {
		if m.Status == domain.BatchSucceeded && (o.Status != domain.OpMerged || !o.BatchID.Valid || o.BatchID.Int64 != m.BatchID) {
			batch := "none"
			if o.BatchID.Valid {
				batch = fmt.Sprint(o.BatchID.Int64)
			}
			a.add("agreement", "operation", fmt.Sprintf("member of SUCCEEDED batch %d but the operation is %s in batch %s", m.BatchID, o.Status, batch), id)
		}
	}
	w, hasWait := wait[id]
	if hasWait && w.BatchID.Valid {
		if _, ok := inMembers(w.BatchID.Int64); !ok {
			a.add("I2", "merge_batch_request", fmt.Sprintf("waiting row claimed by batch %d, but the member history has no such row", w.BatchID.Int64), id)
		}
	}
	a.checkOpStatus(o, inMembers, hasWait, w)
}

// checkOpStatus checks what an operation's status says against its waiting row and
// its batch's member history (inMembers).
// Its complexity is one case per operation status, each a flat list of checks: split
// further, the checks of one status would no longer read together.
func (a *auditor) checkOpStatus(o opRow, inMembers func(int64) (memberRow, bool), hasWait bool, w waitRow) {
	id := o.OperationID
	waiting := hasWait && !w.BatchID.Valid
	switch o.Status {
	case domain.OpPendingApproval, domain.OpRejected, domain.OpWithdrawn:
		// A waiting row of an operation that is not queued is a stray: the claim skips
		// it (so it holds nothing up), and this names it for the operator to delete.
		if hasWait {
			a.add("agreement", "merge_batch_request", "operation "+string(o.Status)+" but present in the waiting set (a stray the claim skips)", id)
		}
	case domain.OpQueued:
		if !waiting {
			a.add("agreement", "operation", "queued operation missing from the waiting set (it would never be claimed)", id)
		}
	case domain.OpInBatch:
		if !o.BatchID.Valid {
			a.add("agreement", "operation", "in_batch operation has no batch_id", id)
			return
		}
		m, ok := inMembers(o.BatchID.Int64)
		switch {
		case !ok:
			a.add("agreement", "operation", fmt.Sprintf("in_batch in batch %d, which has no member row for it", o.BatchID.Int64), id)
		case !m.Status.Active():
			a.add("agreement", "operation", fmt.Sprintf("in_batch but its batch %d is not active (status %d)", o.BatchID.Int64, m.Status), id)
		}
		if !hasWait || !w.BatchID.Valid || w.BatchID.Int64 != o.BatchID.Int64 {
			a.add("agreement", "merge_batch_request", fmt.Sprintf("in_batch in batch %d but its waiting row does not say so", o.BatchID.Int64), id)
		}
	case domain.OpMerged:
		if waiting {
			a.add("agreement", "merge_batch_request", "merged operation still waiting to be claimed (a stray the claim skips)", id)
		}
		if !o.BatchID.Valid {
			a.add("agreement", "operation", "merged operation has no batch_id", id)
			return
		}
		if m, ok := inMembers(o.BatchID.Int64); !ok || m.Status != domain.BatchSucceeded {
			a.add("agreement", "operation", fmt.Sprintf("merged but its batch %d did not succeed", o.BatchID.Int64), id)
		}
	case domain.OpFailed:
		if waiting {
			a.add("agreement", "merge_batch_request", "failed operation still waiting to be claimed (a stray the claim skips)", id)
		}
		if o.ErrorCode == "" {
			a.add("agreement", "operation", "failed operation has no reason (error_code empty)", id)
		}
	default:
		a.add("agreement", "operation", "unknown status "+string(o.Status), id)
	}
}

type bindingRow struct {
	ID          int64                `db:"id"`
	Subject     string               `db:"subject"`
	Target      string               `db:"target"`
	Status      domain.BindingStatus `db:"status"`
	OperationID string               `db:"operation_id"`
	Latest      sql.NullString       `db:"latest"`
	OpStatus    sql.NullString       `db:"op_status"`
	OpAction    sql.NullString       `db:"op_action"`
}

// expectedBinding is the binding status its latest operation implies (the binding
// says what the repository holds; docs/ARCHITECTURE.md, "State machine").
func expectedBinding(action domain.Action, opStatus domain.OpStatus) []domain.BindingStatus {
	grant := action == domain.ActionGrant
	pick := func(ifGrant, ifRevoke domain.BindingStatus) []domain.BindingStatus {
		if grant {
			return []domain.BindingStatus{ifGrant}
		}
		return []domain.BindingStatus{ifRevoke}
	}
	switch opStatus {
	case domain.OpPendingApproval, domain.OpQueued, domain.OpInBatch:
		return pick(domain.BindingPending, domain.BindingRevoking)
	case domain.OpMerged:
		return pick(domain.BindingActive, domain.BindingClosed)
	case domain.OpFailed:
		return pick(domain.BindingFailed, domain.BindingActive)
	case domain.OpRejected:
		return pick(domain.BindingRejected, domain.BindingActive)
	case domain.OpWithdrawn:
		// Withdrawn before any batch: the repository holds what it held (no file for a
		// grant, the file for a revoke).
		return pick(domain.BindingClosed, domain.BindingActive)
	}
	return nil
}

// bindings: I5 (one row per relation, pointing at its latest operation) and the
// binding status its operation implies.
func (a *auditor) bindings(ctx context.Context, q *querier) error {
	var after int64
	seen := 0
	for {
		var rows []bindingRow
		if err := q.sel(ctx, &rows, `SELECT b.id, b.subject, b.target, b.status, b.operation_id,
			(SELECT o.operation_id FROM operation o WHERE o.subject = b.subject AND o.target = b.target ORDER BY o.id DESC LIMIT 1) AS latest,
			op.status AS op_status, op.action AS op_action
			FROM binding b LEFT JOIN operation op ON op.operation_id = b.operation_id
			WHERE b.id > ? ORDER BY b.id LIMIT ?`, after, a.opt.Chunk); err != nil {
			return fmt.Errorf("scan binding: %w", err)
		}
		for _, b := range rows {
			id := fmt.Sprint(b.ID)
			if !b.OpStatus.Valid {
				a.add("I5", "binding", fmt.Sprintf("binding points at unknown operation %s", b.OperationID), id)
				continue
			}
			if b.Latest.Valid && b.Latest.String != b.OperationID {
				a.add("I5", "binding", fmt.Sprintf("binding (%q, %q) points at %s but its latest operation is %s", b.Subject, b.Target, b.OperationID, b.Latest.String), id)
			}
			want := expectedBinding(domain.Action(b.OpAction.String), domain.OpStatus(b.OpStatus.String))
			ok := false
			for _, s := range want {
				ok = ok || s == b.Status
			}
			if !ok {
				a.add("agreement", "binding", fmt.Sprintf("binding is %s but its %s operation %s is %s (want %s)", b.Status, b.OpAction.String, b.OperationID, b.OpStatus.String, joinStatuses(want)), id)
			}
		}
		seen += len(rows)
		if len(rows) < a.opt.Chunk {
			break
		}
		after = rows[len(rows)-1].ID
	}
	a.rep.Bindings = seen
	// I5 is enforced by uk_subject_target; a GROUP BY over the unique key is an index
	// scan, and finding a duplicate means the index is gone (also reported by I8).
	var dups []struct {
		Subject string `db:"subject"`
		Target  string `db:"target"`
		N       int    `db:"n"`
	}
	if err := q.sel(ctx, &dups, "SELECT subject, target, COUNT(*) AS n FROM binding GROUP BY subject, target HAVING COUNT(*) > 1 LIMIT 100"); err != nil {
		return fmt.Errorf("binding duplicates: %w", err)
	}
	for _, d := range dups {
		a.add("I5", "binding", fmt.Sprintf("relation (%q, %q) has %d rows", d.Subject, d.Target, d.N))
	}
	return nil
}

func joinStatuses(ss []domain.BindingStatus) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return strings.Join(out, "|")
}
