package store

// Admission group commit: concurrent OperationCreate calls of one replica are coalesced
// into one short transaction with multi-row INSERTs, and each caller still gets exactly
// the answer a transaction of its own would have given it.
//
// Why: an admission is a handful of small writes (idempotency key, operation, binding,
// waiting row, audit events) and a COMMIT that waits for the redo log flush. Done one
// transaction per request, the round trips and the flush dominate and the server idles
// between them; done per group, a group of n pays them once (measured in BENCHMARKS.md).
//
// How, per group (one READ COMMITTED transaction, like the per-request path):
//
//  1. one plain read: the database clock, every binding the group touches, and every
//     idempotency key it carries (no locks: the decisions are enforced by guarded writes,
//     I5/I6, and by unique keys, exactly as in the per-request path);
//  2. decide each request in arrival order on what was read: refused requests get their
//     answer (409 busy/active/not active, expires in the past, invalid) and write nothing;
//  3. multi-row writes in the per-request lock order — keys, operations, bindings
//     (INSERT new relations; one guarded UPDATE … WHERE (id, status, version) IN … for
//     re-applied/revoked ones, affected rows checked), waiting rows, audit events;
//  4. COMMIT; the accepted callers get their operation, built from what was written
//     (no re-read).
//
// Correctness never depends on this path. Whatever the group cannot answer exactly is
// handed back to the caller, which then runs the per-request transaction
// (operationCreateSerial, the original, proven path) after the group has finished:
//
//   - a request whose idempotency key or (subject, target) already appeared earlier in
//     the same group (its answer depends on the earlier one's outcome: running it after
//     the group committed is exactly the serial order);
//   - a request whose idempotency key is already stored (repeat: the serial path reads
//     the stored answer, or frees an expired key);
//   - every accepted request of a group whose writes failed — a 1062 from a concurrent
//     replica on a key or a binding, a deadlock, a guard that matched fewer rows than
//     read, anything: the group rolls back and nothing of it was written.
//
// A connection lost during the group's COMMIT is answered ErrCommitUnknown to each
// accepted caller, as the per-request path does.

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
)

// admitOutcome says what a request's caller does once its group is done.
type admitOutcome int8

const (
	admitAnswered admitOutcome = iota // op/created/err is the answer
	admitSerial                       // run the per-request transaction (see the file comment)
)

// admitReq is one OperationCreate call waiting for, or inside, a group.
type admitReq struct {
	p    OperationCreateParams
	done chan struct{}
	// state: 0 queued, 1 taken by a group, 2 abandoned by its caller (context ended
	// before a group took it: it is skipped and nothing of it is written).
	state atomic.Int32

	outcome admitOutcome
	op      Operation
	err     error
}

// admitter is the per-Store admission queue. It holds no reference to the Store: the
// requests carry it, so a Store nobody uses any more can be collected.
type admitter struct {
	mu      sync.Mutex
	opts    AdmitOptions
	queue   []*admitReq
	running int // groups in flight (worker goroutines)

	// autoinc: how to compute the ids of a multi-row INSERT (read once).
	autoincOnce sync.Once
	autoincStep int64 // > 0: ids are first, first+step, …; 0: read them back

	stats admitCounters
}

type admitCounters struct {
	groups, grouped, serial, fallbacks, abandoned, maxGroup atomic.Int64
}

// submit queues r and waits for its group. It returns false when the caller's context
// ended before a group took the request (nothing was written for it).
func (a *admitter) submit(ctx context.Context, s *Store, r *admitReq) bool {
	a.mu.Lock()
	a.queue = append(a.queue, r)
	spawn := a.running < a.opts.MaxInflight
	if spawn {
		a.running++
	}
	a.mu.Unlock()
	if spawn {
		go a.work(s)
	}
	select {
	case <-r.done:
		return true
	case <-ctx.Done():
		if r.state.CompareAndSwap(0, 2) {
			a.stats.abandoned.Add(1)
			return false
		}
		// A group has it: its outcome is decided by the group, not by this caller
		// leaving. Wait for it (the group runs on its own bounded context), so the
		// answer is never "unknown" merely because the caller's context ended.
		<-r.done
		return true
	}
}

// work runs groups until the queue is empty. At most MaxInflight workers run at once;
// while they run, new requests accumulate and form the next groups (no timer: a lone
// request is never delayed, and under load the groups grow by themselves).
func (a *admitter) work(s *Store) {
	for {
		if a.opts.Linger > 0 {
			time.Sleep(a.opts.Linger)
		}
		a.mu.Lock()
		var group []*admitReq
		n := 0
		for n < len(a.queue) && len(group) < a.opts.MaxGroup {
			r := a.queue[n]
			n++
			if r.state.CompareAndSwap(0, 1) {
				group = append(group, r)
			}
		}
		// Drop the taken prefix without keeping the backing array growing forever.
		rest := copy(a.queue, a.queue[n:])
		clear(a.queue[rest:])
		a.queue = a.queue[:rest]
		if len(group) == 0 {
			a.running--
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		s.runAdmitGroup(a, group)
		for _, r := range group {
			close(r.done)
		}
	}
}

// groupTimeout bounds one group's transaction. The group does not run on any caller's
// context: one caller leaving must not roll back the others.
const groupTimeout = 30 * time.Second

// groupBinding is a binding as the group read it.
type groupBinding struct {
	Binding
	found bool
}

// admitReadRow is one row of the group's read (kind n: clock, b: binding, k: key).
type admitReadRow struct {
	Kind        string         `db:"kind"`
	TS          sql.NullTime   `db:"ts"`
	ID          sql.NullInt64  `db:"id"`
	Subject     sql.NullString `db:"subject"`
	Target      sql.NullString `db:"target"`
	Repo        sql.NullString `db:"repo"`
	Status      sql.NullString `db:"status"`
	OperationID sql.NullString `db:"operation_id"`
	Version     sql.NullInt64  `db:"version"`
	Live        sql.NullBool   `db:"live"`
}

type relKey struct{ subject, target string }

// accepted is a request the group writes.
type accepted struct {
	r      *admitReq
	repo   string
	status OpStatus
	b      groupBinding // as read
	attrs  any
	exp    any
}

// runAdmitGroup runs one group and sets every request's outcome.
func (s *Store) runAdmitGroup(a *admitter, group []*admitReq) {
	a.stats.groups.Add(1)
	a.stats.grouped.Add(int64(len(group)))
	for {
		m := a.stats.maxGroup.Load()
		if int64(len(group)) <= m || a.stats.maxGroup.CompareAndSwap(m, int64(len(group))) {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()

	// Requests whose key or relation already appeared earlier in the group go serial,
	// after the group (their answer depends on the earlier request's outcome).
	seenKey := map[string]bool{}
	seenRel := map[relKey]bool{}
	var work []*admitReq
	for _, r := range group {
		k := relKey{r.p.Subject, r.p.Target}
		if seenRel[k] || (r.p.IdempotencyKey != "" && seenKey[r.p.IdempotencyKey]) {
			r.outcome = admitSerial
			a.stats.serial.Add(1)
			continue
		}
		seenRel[k] = true
		if r.p.IdempotencyKey != "" {
			seenKey[r.p.IdempotencyKey] = true
		}
		work = append(work, r)
	}
	if len(work) == 0 {
		return
	}
	toSerial := func(rs []accepted) {
		for _, x := range rs {
			x.r.outcome, x.r.err = admitSerial, nil
		}
		a.stats.fallbacks.Add(1)
		a.stats.serial.Add(int64(len(rs)))
	}

	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{Isolation: opIso})
	if err != nil {
		for _, r := range work {
			r.outcome = admitSerial
		}
		a.stats.fallbacks.Add(1)
		a.stats.serial.Add(int64(len(work)))
		return
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()

	now, bindings, keys, err := admitRead(ctx, tx, work)
	if err != nil {
		for _, r := range work {
			r.outcome = admitSerial
		}
		a.stats.fallbacks.Add(1)
		a.stats.serial.Add(int64(len(work)))
		return
	}

	var acc []accepted
	for _, r := range work {
		p := r.p
		if p.IdempotencyKey != "" {
			if _, stored := keys[p.IdempotencyKey]; stored {
				// A repeat (live key) or an expired key to free: the serial path does
				// both exactly as before.
				r.outcome = admitSerial
				a.stats.serial.Add(1)
				continue
			}
		}
		x, err := decideAdmission(p, now, bindings[relKey{p.Subject, p.Target}])
		if err != nil {
			r.outcome, r.err = admitAnswered, err
			continue
		}
		x.r = r
		acc = append(acc, x)
	}
	if len(acc) == 0 {
		return // everything refused or serial: nothing to write
	}

	ids, err := s.admitWrite(ctx, a, tx, now, acc)
	if err != nil {
		toSerial(acc)
		return
	}
	if err := tx.Commit(); err != nil {
		committed = true // Commit ends the transaction whatever it returns
		if isConnLost(err) {
			storeErrors.WithLabelValues("commit_unknown").Inc()
			for _, x := range acc {
				x.r.outcome, x.r.err = admitAnswered, fmt.Errorf("%w: %v", ErrCommitUnknown, err)
			}
			return
		}
		translate(err) // counts it
		toSerial(acc)
		return
	}
	committed = true
	for i, x := range acc {
		p := x.r.p
		op := Operation{
			ID: ids[i], OperationID: p.OperationID, Subject: p.Subject, Target: p.Target,
			Repo: x.repo, Action: p.Action, Status: x.status, Version: 1,
			Attributes: []byte{}, CreatedAt: now, UpdatedAt: now,
		}
		if p.ExpiresAt != nil {
			t := p.ExpiresAt.UTC().Truncate(time.Microsecond)
			op.ExpiresAt = &t
		}
		if len(p.Attributes) > 0 {
			op.Attributes = slices.Clone(p.Attributes)
		}
		x.r.outcome, x.r.op, x.r.err = admitAnswered, op, nil
	}
}

// admitRead is the group's one read: the database clock, the bindings of every
// relation in the group and which of its idempotency keys are stored.
func admitRead(ctx context.Context, tx *sqlx.Tx, work []*admitReq) (now time.Time, bindings map[relKey]groupBinding, keys map[string]bool, err error) {
	var q strings.Builder
	args := make([]any, 0, 3*len(work))
	q.WriteString(`SELECT 'n' AS kind, CURRENT_TIMESTAMP(6) AS ts, NULL AS id, NULL AS subject, NULL AS target,
		NULL AS repo, NULL AS status, NULL AS operation_id, NULL AS version, NULL AS live
		UNION ALL SELECT 'b', NULL, id, subject, target, repo, status, operation_id, version, NULL
		FROM binding WHERE (subject, target) IN (`)
	for i, r := range work {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString("(?,?)")
		args = append(args, r.p.Subject, r.p.Target)
	}
	q.WriteByte(')')
	nk := 0
	for _, r := range work {
		if r.p.IdempotencyKey == "" {
			continue
		}
		if nk == 0 {
			q.WriteString(` UNION ALL SELECT 'k', NULL, NULL, idem_key, NULL, NULL, NULL, NULL, NULL,
				expires_at > CURRENT_TIMESTAMP(6) FROM idempotency_key WHERE idem_key IN (?`)
		} else {
			q.WriteString(",?")
		}
		args = append(args, r.p.IdempotencyKey)
		nk++
	}
	if nk > 0 {
		q.WriteByte(')')
	}
	var rows []admitReadRow
	if err = tx.SelectContext(ctx, &rows, q.String(), args...); err != nil {
		return
	}
	bindings = make(map[relKey]groupBinding, len(rows))
	keys = map[string]bool{}
	for _, row := range rows {
		switch row.Kind {
		case "n":
			now = row.TS.Time.UTC()
		case "b":
			b := Binding{
				ID: row.ID.Int64, Subject: row.Subject.String, Target: row.Target.String, Repo: row.Repo.String,
				Status: BindingStatus(row.Status.String), OperationID: row.OperationID.String, Version: row.Version.Int64,
			}
			bindings[relKey{b.Subject, b.Target}] = groupBinding{Binding: b, found: true}
		case "k":
			keys[row.Subject.String] = row.Live.Bool
		}
	}
	if now.IsZero() {
		err = errors.New("store: admission read returned no clock row")
	}
	return
}

// decideAdmission is the per-request decision of operationCreateSerial, on the
// group's read: the same checks in the same order, the same errors.
func decideAdmission(p OperationCreateParams, now time.Time, b groupBinding) (accepted, error) {
	x := accepted{b: b, repo: p.Repo, status: OpPendingApproval}
	if p.ExpiresAt != nil {
		if p.Action != ActionGrant {
			return x, fmt.Errorf("%w: expires_at applies to grants only", ErrInvalidRequest)
		}
		// DATETIME(6) keeps microseconds; the comparison is the database's
		// `? > CURRENT_TIMESTAMP(6)` on the clock read by this group.
		if !p.ExpiresAt.UTC().Truncate(time.Microsecond).After(now) {
			return x, ErrExpiresInPast
		}
	}
	switch p.Action {
	case ActionGrant:
		if b.found && !b.Status.Reappliable() {
			if b.Status == BindingActive {
				return x, ErrBindingActive
			}
			return x, fmt.Errorf("%w: binding is %s", ErrBindingBusy, b.Status)
		}
	case ActionRevoke:
		if !b.found {
			return x, ErrBindingNotActive
		}
		switch b.Status {
		case BindingActive:
		case BindingPending, BindingRevoking, BindingFailed:
			return x, fmt.Errorf("%w: binding is %s", ErrBindingBusy, b.Status)
		default:
			return x, fmt.Errorf("%w: binding is %s", ErrBindingNotActive, b.Status)
		}
		x.repo = b.Repo
	default:
		return x, fmt.Errorf("%w: unknown action %q", ErrInvalidRequest, p.Action)
	}
	if p.AutoApprove {
		x.status = OpQueued
	}
	if len(p.Attributes) > 0 {
		x.attrs = string(p.Attributes)
	}
	x.exp = utcPtr(p.ExpiresAt)
	return x, nil
}

// values returns "(row),(row),…" with n copies of row.
func values(row string, n int) string {
	return strings.TrimSuffix(strings.Repeat(row+",", n), ",")
}

// admitWrite writes the accepted requests of a group inside tx and returns the
// operation ids (primary keys) in the order of acc. Any error means "roll back and
// let each caller run its own transaction".
func (s *Store) admitWrite(ctx context.Context, a *admitter, tx *sqlx.Tx, now time.Time, acc []accepted) ([]int64, error) {
	// 1. Idempotency keys, in key order (lock order between concurrent groups). A
	//    concurrent request with the same key makes this wait and then 1062: fallback.
	var keyed []accepted
	for _, x := range acc {
		if x.r.p.IdempotencyKey != "" {
			keyed = append(keyed, x)
		}
	}
	if len(keyed) > 0 {
		slices.SortFunc(keyed, func(x, y accepted) int { return strings.Compare(x.r.p.IdempotencyKey, y.r.p.IdempotencyKey) })
		args := make([]any, 0, 4*len(keyed))
		for _, x := range keyed {
			ttl := x.r.p.IdempotencyTTL
			if ttl <= 0 {
				ttl = 24 * time.Hour
			}
			args = append(args, x.r.p.IdempotencyKey, x.r.p.Fingerprint, x.r.p.OperationID, ttl.Microseconds())
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency_key (idem_key, fingerprint, operation_id, expires_at) VALUES `+
			values("(?, ?, ?, CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND)", len(keyed)), args...); err != nil {
			return nil, err
		}
	}

	// 2. Operations, in arrival order, created_at = the group's clock read.
	args := make([]any, 0, 10*len(acc))
	for _, x := range acc {
		p := x.r.p
		args = append(args, p.OperationID, p.Subject, p.Target, x.repo, p.Action, x.status, x.exp, x.attrs, now, now)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO operation
		(operation_id, subject, target, repo, action, status, expires_at, attributes, created_at, updated_at) VALUES `+
		values("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", len(acc)), args...)
	if err != nil {
		return nil, err
	}
	ids, err := s.insertedIDs(ctx, a, tx, res, acc)
	if err != nil {
		return nil, err
	}

	// 3. Bindings. New relations: one INSERT in (subject, target) order; a concurrent
	//    first application of one of them makes it 1062 (fallback: the serial path
	//    answers busy, as it would have). Existing ones: one guarded UPDATE on the exact
	//    (id, status, version) each was read with (I5, I6), affected rows checked.
	var fresh, reuse []accepted
	for _, x := range acc {
		if x.b.found {
			reuse = append(reuse, x)
		} else {
			fresh = append(fresh, x)
		}
	}
	if len(fresh) > 0 {
		slices.SortFunc(fresh, func(x, y accepted) int {
			if c := strings.Compare(x.r.p.Subject, y.r.p.Subject); c != 0 {
				return c
			}
			return strings.Compare(x.r.p.Target, y.r.p.Target)
		})
		args = args[:0]
		for _, x := range fresh {
			p := x.r.p
			args = append(args, p.Subject, p.Target, x.repo, BindingPending, p.OperationID, x.exp)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO binding (subject, target, repo, status, operation_id, expires_at) VALUES `+
			values("(?, ?, ?, ?, ?, ?)", len(fresh)), args...); err != nil {
			return nil, err
		}
	}
	if len(reuse) > 0 {
		slices.SortFunc(reuse, func(x, y accepted) int { return cmp.Compare(x.b.ID, y.b.ID) })
		var status, opID, repo, exp strings.Builder
		var aStatus, aOp, aRepo, aExp, aWhere []any
		for _, x := range reuse {
			to := BindingPending
			if x.r.p.Action == ActionRevoke {
				to = BindingRevoking
			}
			status.WriteString(" WHEN ? THEN ?")
			aStatus = append(aStatus, x.b.ID, to)
			opID.WriteString(" WHEN ? THEN ?")
			aOp = append(aOp, x.b.ID, x.r.p.OperationID)
			if x.r.p.Action == ActionGrant {
				// A grant re-applies in place: its repo and expiry replace the old ones; a
				// revoke keeps both (the file stays where it is until the revoke merges).
				repo.WriteString(" WHEN ? THEN ?")
				aRepo = append(aRepo, x.b.ID, x.repo)
				exp.WriteString(" WHEN ? THEN ?")
				aExp = append(aExp, x.b.ID, x.exp)
			}
			aWhere = append(aWhere, x.b.ID, x.b.Status, x.b.Version)
		}
		q := "UPDATE binding SET status = CASE id" + status.String() + " END, operation_id = CASE id" + opID.String() + " END"
		all := append(aStatus, aOp...)
		if repo.Len() > 0 {
			q += ", repo = CASE id" + repo.String() + " ELSE repo END, expires_at = CASE id" + exp.String() + " ELSE expires_at END"
			all = append(all, aRepo...)
			all = append(all, aExp...)
		}
		q += ", version = version + 1, updated_at = CURRENT_TIMESTAMP(6) WHERE id IN (" + inPlaceholders(len(reuse)) +
			") AND (id, status, version) IN (" + values("(?, ?, ?)", len(reuse)) + ")"
		for _, x := range reuse {
			all = append(all, x.b.ID)
		}
		all = append(all, aWhere...)
		r, err := tx.ExecContext(ctx, q, all...)
		if err != nil {
			return nil, err
		}
		if err := mustAffect(r, int64(len(reuse))); err != nil {
			return nil, err // one of them moved on since the read: let each caller retry alone
		}
	}

	// 4. Waiting rows of auto-approved operations (I4: unique operation_id).
	var queued []accepted
	for _, x := range acc {
		if x.status == OpQueued {
			queued = append(queued, x)
		}
	}
	if len(queued) > 0 {
		args = args[:0]
		for _, x := range queued {
			args = append(args, x.r.p.OperationID, x.repo)
		}
		r, err := tx.ExecContext(ctx, `INSERT INTO merge_batch_request (operation_id, repo) VALUES `+
			values("(?, ?)", len(queued))+` ON DUPLICATE KEY UPDATE id = id`, args...)
		if err != nil {
			return nil, err
		}
		// Every operation here is new, so every row must be new: anything else is a
		// state this path does not explain, and the serial path decides.
		if err := mustAffect(r, int64(len(queued))); err != nil {
			return nil, err
		}
	}

	// 5. Audit events: created (and admitted) per operation, one statement, in the order
	//    the per-request path writes them.
	args = args[:0]
	n := 0
	for _, x := range acc {
		p := x.r.p
		id := p.OperationID
		args = append(args, "op:"+id+":"+EventCreated, id, EventCreated,
			truncateUTF8(string(p.Action)+" "+p.Subject+" → "+p.Target, 2048))
		n++
		if x.status == OpQueued {
			args = append(args, "op:"+id+":"+EventAdmitted, id, EventAdmitted, "auto-approved")
			n++
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO audit_event (dedupe_key, operation_id, code, detail) VALUES `+
		values("(?, ?, ?, ?)", n)+` ON DUPLICATE KEY UPDATE id = id`, args...); err != nil {
		return nil, err
	}
	return ids, nil
}

// insertedIDs returns the primary keys of the operations one multi-row INSERT wrote,
// in row order. With InnoDB's "consecutive" or "traditional" auto-increment lock mode
// a multi-row INSERT of known size gets consecutive values (LAST_INSERT_ID is the
// first, each next one auto_increment_increment further); otherwise they are read back.
func (s *Store) insertedIDs(ctx context.Context, a *admitter, tx *sqlx.Tx, res sql.Result, acc []accepted) ([]int64, error) {
	a.autoincOnce.Do(func() {
		var row struct {
			Step int64 `db:"step"`
			Mode int64 `db:"mode"`
		}
		if err := s.db.GetContext(ctx, &row, `SELECT @@auto_increment_increment AS step, @@innodb_autoinc_lock_mode AS mode`); err == nil &&
			row.Step > 0 && (row.Mode == 0 || row.Mode == 1) {
			a.autoincStep = row.Step
		}
	})
	ids := make([]int64, len(acc))
	if step := a.autoincStep; step > 0 {
		first, err := res.LastInsertId()
		if err != nil {
			return nil, err
		}
		if err := mustAffect(res, int64(len(acc))); err != nil {
			return nil, err
		}
		for i := range ids {
			ids[i] = first + int64(i)*step
		}
		return ids, nil
	}
	args := make([]any, len(acc))
	for i, x := range acc {
		args[i] = x.r.p.OperationID
	}
	var rows []struct {
		ID          int64  `db:"id"`
		OperationID string `db:"operation_id"`
	}
	if err := tx.SelectContext(ctx, &rows, `SELECT id, operation_id FROM operation WHERE operation_id IN (`+
		inPlaceholders(len(acc))+`)`, args...); err != nil {
		return nil, err
	}
	byOp := make(map[string]int64, len(rows))
	for _, r := range rows {
		byOp[r.OperationID] = r.ID
	}
	for i, x := range acc {
		id, ok := byOp[x.r.p.OperationID]
		if !ok {
			return nil, errors.New("store: inserted operation not found")
		}
		ids[i] = id
	}
	return ids, nil
}
