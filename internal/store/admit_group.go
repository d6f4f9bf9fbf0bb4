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
// (OperationCreateSerial, the original, proven path) after the group has finished:
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
	"unicode"

	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
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
	op      domain.Operation
	err     error
}

// admitter is the per-Store admission queue. It holds no reference to the Store: the
// requests carry it, so a Store nobody uses any more can be collected.
type admitter struct {
	mu      sync.Mutex
	opts    AdmitOptions
	queue   []*admitReq
	running int // groups in flight (worker goroutines)

	// compound: whether the server takes compound statements (admit_compound.go);
	// optimisticSkip: groups left that skip the optimistic attempt after a miss.
	compound       atomic.Int32
	optimisticSkip atomic.Int32

	// autoinc: how to compute the ids of a multi-row INSERT (read once).
	autoincOnce sync.Once
	autoincStep int64 // > 0: ids are first, first+step, …; 0: read them back

	stats admitCounters
}

type admitCounters struct {
	groups, compound, optimistic, optimisticMisses, grouped, serial, fallbacks, abandoned, maxGroup atomic.Int64
}

// submit runs r in a group and waits for the group's outcome. It returns false when
// the caller's context ended before a group took the request (nothing was written for
// it).
//
// When fewer than MaxInflight groups run, the caller runs the group itself, its own
// request first and whatever queued behind it: a lone request pays no hand-off to
// another goroutine. Otherwise it queues, and the running groups' workers take it.
func (a *admitter) submit(ctx context.Context, s *Store, r *admitReq) bool {
	a.mu.Lock()
	if a.running < a.opts.MaxInflight {
		a.running++
		r.state.Store(1)
		group := append([]*admitReq{r}, a.takeLocked(a.opts.MaxGroup-1, maxGroupBytes-approxBytes(r.p))...)
		a.mu.Unlock()
		a.runAndRelease(s, group)
		// Requests that queued meanwhile: a worker goroutine takes over this slot.
		a.mu.Lock()
		if len(a.queue) > 0 {
			a.mu.Unlock()
			go a.work(s)
		} else {
			a.running--
			a.mu.Unlock()
		}
		return true
	}
	a.queue = append(a.queue, r)
	a.mu.Unlock()
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

// takeLocked removes up to n requests (and about bytes of parameters) from the head of
// the queue, skipping those their callers abandoned. a.mu must be held.
func (a *admitter) takeLocked(n, bytes int) []*admitReq {
	var group []*admitReq
	i, size := 0, 0
	for i < len(a.queue) && len(group) < n && size < bytes {
		r := a.queue[i]
		i++
		if r.state.CompareAndSwap(0, 1) {
			group = append(group, r)
			size += approxBytes(r.p)
		}
	}
	// Drop the taken prefix without keeping the backing array growing forever.
	rest := copy(a.queue, a.queue[i:])
	clear(a.queue[rest:])
	a.queue = a.queue[:rest]
	return group
}

// runAndRelease runs one group and wakes its callers.
func (a *admitter) runAndRelease(s *Store, group []*admitReq) {
	s.runAdmitGroup(a, group)
	for _, r := range group {
		close(r.done)
	}
}

// work runs groups on behalf of one running slot until the queue is empty. While groups
// run, new requests accumulate and form the next groups (no timer: under load the
// groups grow by themselves).
func (a *admitter) work(s *Store) {
	for {
		a.mu.Lock()
		linger := a.opts.Linger
		a.mu.Unlock()
		if linger > 0 {
			time.Sleep(linger)
		}
		a.mu.Lock()
		group := a.takeLocked(a.opts.MaxGroup, maxGroupBytes)
		if len(group) == 0 {
			a.running--
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		a.runAndRelease(s, group)
	}
}

// maxGroupBytes bounds the parameters of one group, far below max_allowed_packet (16 MiB
// by default on MariaDB, 64 MiB on MySQL): attributes may be up to the API's body limit.
const maxGroupBytes = 1 << 20

// approxBytes is about how much a request adds to the group's statements.
func approxBytes(p OperationCreateParams) int {
	return 512 + 3*(len(p.Subject)+len(p.Target)) + 2*len(p.Repo) + len(p.IdempotencyKey) + 3*len(p.RequestedBy) + len(p.Attributes)
}

// A group does not run on any caller's context: one caller leaving must not roll back
// the others. It runs on context.Background(), which also spares the driver its
// per-query cancellation watcher (a goroutine hand-off per statement, measurable on
// the admission path); the connection's read and write timeouts (Options.IOTimeout,
// forced on every DSN by ParseDSN) bound every wait on the server instead.

// admitAfterRead, when set (tests only, admit_export_test.go), runs in every group
// after its read and before its writes, so a test can move a row in between.
var admitAfterRead func(ctx context.Context)

// groupBinding is a binding as the group read it.
type groupBinding struct {
	domain.Binding
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

// idemRef is an idempotency key as the database keys it: per principal.
type idemRef struct{ principal, key string }

func idemOf(p OperationCreateParams) idemRef { return idemRef{p.RequestedBy, p.IdempotencyKey} }

// accepted is a request the group writes.
type accepted struct {
	r      *admitReq
	repo   string
	status domain.OpStatus
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
	ctx := context.Background()

	// Requests whose key or relation already appeared earlier in the group go serial,
	// after the group (their answer depends on the earlier request's outcome).
	// So do requests whose binding file folds like an earlier one's: the later one's
	// case-collision check must see the earlier one's binding.
	seenKey := map[idemRef]bool{}
	seenRel := map[relKey]bool{}
	seenFold := map[string]bool{}
	var work []*admitReq
	for _, r := range group {
		k := relKey{r.p.Subject, r.p.Target}
		f := foldFile(r.p)
		if seenRel[k] || seenFold[f] || (r.p.IdempotencyKey != "" && seenKey[idemOf(r.p)]) {
			r.outcome = admitSerial
			a.stats.serial.Add(1)
			continue
		}
		seenRel[k] = true
		seenFold[f] = true
		if r.p.IdempotencyKey != "" {
			seenKey[idemOf(r.p)] = true
		}
		work = append(work, r)
	}
	if len(work) == 0 {
		return
	}
	if s.useCompound(ctx, a) {
		a.stats.compound.Add(1)
		s.groupCompound(ctx, a, work)
	} else {
		s.groupPlain(ctx, a, work)
	}
}

// foldFile is the request's binding file (repository, target, subject) with letter
// case folded: every rune replaced by the least rune of its Unicode case-folding orbit,
// so two names the database's LOWER() maps alike fold alike here too (the orbit is at
// least as coarse as any simple case mapping). Used only to keep such requests out of
// one group; the database decides the collision itself (caseCollisionWhere).
func foldFile(p OperationCreateParams) string {
	var b strings.Builder
	b.Grow(len(p.Repo) + len(p.Target) + len(p.Subject) + 2)
	b.WriteString(p.Repo)
	for _, s := range [2]string{p.Target, p.Subject} {
		b.WriteByte(0)
		for _, r := range s {
			least := r
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				least = min(least, f)
			}
			b.WriteRune(least)
		}
	}
	return b.String()
}

// fallback hands requests back to their callers' per-request transactions.
func (a *admitter) fallback(rs []*admitReq, groupFailed bool) {
	for _, r := range rs {
		r.outcome, r.err = admitSerial, nil
	}
	if groupFailed {
		a.stats.fallbacks.Add(1)
	}
	a.stats.serial.Add(int64(len(rs)))
}

func acceptedReqs(acc []accepted) []*admitReq {
	rs := make([]*admitReq, len(acc))
	for i, x := range acc {
		rs[i] = x.r
	}
	return rs
}

// decideGroup decides every request of the group on the group's read, in arrival
// order, and returns the accepted ones. Refused requests get their answer here;
// requests whose idempotency key is already stored go serial. The checks run in the
// per-request path's order: key, case collision, then decideAdmission.
func (a *admitter) decideGroup(work []*admitReq, rd admitRead) []accepted {
	var acc []accepted
	for i, r := range work {
		p := r.p
		if p.IdempotencyKey != "" {
			if _, stored := rd.keys[idemOf(p)]; stored {
				// A repeat (live key) or an expired key to free: the serial path does
				// both exactly as before.
				a.fallback([]*admitReq{r}, false)
				continue
			}
		}
		if other, ok := rd.collisions[i]; ok {
			r.outcome, r.err = admitAnswered, &CaseCollisionError{Other: other}
			continue
		}
		x, err := decideAdmission(p, rd.now, rd.bindings[relKey{p.Subject, p.Target}])
		if err != nil {
			r.outcome, r.err = admitAnswered, err
			continue
		}
		x.r = r
		acc = append(acc, x)
	}
	return acc
}

// answer gives each accepted caller its operation, as written.
func answer(acc []accepted, ids []int64, now time.Time) {
	for i, x := range acc {
		answerOne(x, ids[i], now, now)
	}
}

// answerOne gives an accepted caller its operation, as written: what the request asked
// for, the decisions of the group (repo, status) and what the database assigned.
func answerOne(x accepted, id int64, created, updated time.Time) {
	p := x.r.p
	op := domain.Operation{
		ID: id, OperationID: p.OperationID, Subject: p.Subject, Target: p.Target,
		Repo: x.repo, Action: p.Action, Status: x.status, Priority: domain.PriorityNormal, Version: 1,
		Attributes: []byte{}, CreatedAt: created, UpdatedAt: updated,
		RequestedBy: p.RequestedBy, ApprovedBy: approvedByOnCreate(p),
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

// commitUnknown answers every accepted caller that the COMMIT's outcome is unknown
// (the connection broke during it), as the per-request path does.
func commitUnknown(acc []accepted, err error) {
	storeErrors.WithLabelValues("commit_unknown").Inc()
	for _, x := range acc {
		x.r.outcome, x.r.err = admitAnswered, fmt.Errorf("%w: %v", ErrCommitUnknown, err)
	}
}

// groupPlain runs the group as a database/sql transaction, one statement per write:
// BEGIN, the read, one multi-row statement per table, COMMIT. It works on every server.
func (s *Store) groupPlain(ctx context.Context, a *admitter, work []*admitReq) {
	step := s.autoincStepOf(ctx, a)
	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{Isolation: opIso})
	if err != nil {
		a.fallback(work, true)
		return
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	q, args := admitReadQuery(work)
	var rows []admitReadRow
	if err := tx.SelectContext(ctx, &rows, q, args...); err != nil {
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
		return // everything refused or serial: nothing to write
	}
	now := rd.now
	stmts, opStmt := buildAdmitWrites(admitClock{t: now}, acc, s.EventReceivers())
	var opRes sql.Result
	for i, st := range stmts {
		res, err := tx.ExecContext(ctx, st.q, st.args...)
		if err == nil && st.want >= 0 {
			err = mustAffect(res, st.want)
		}
		if err != nil {
			// A 1062 from a concurrent replica, a deadlock, a guard that lost: nothing
			// of the group stays, each caller runs its own transaction.
			translate(err) // counts it
			a.fallback(acceptedReqs(acc), true)
			return
		}
		if i == opStmt {
			opRes = res
		}
	}
	ids, err := insertedIDs(ctx, step, tx, opRes, acc)
	if err != nil {
		a.fallback(acceptedReqs(acc), true)
		return
	}
	err = tx.Commit()
	committed = true // Commit ends the transaction whatever it returns
	if err != nil {
		if isConnLost(err) {
			commitUnknown(acc, err)
			return
		}
		translate(err)
		a.fallback(acceptedReqs(acc), true)
		return
	}
	answer(acc, ids, now)
}

// admitReadQuery is the group's one read: the database clock, the bindings of every
// relation in the group, which of its idempotency keys are stored (with whether each
// is still live) and the bindings its grants' files collide with. A plain read: no
// locks.
func admitReadQuery(work []*admitReq) (string, []any) {
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
		// Keys are per principal (uk_principal_key): the principal rides in the target
		// column of the 'k' rows.
		if nk == 0 {
			q.WriteString(` UNION ALL SELECT 'k', NULL, NULL, idem_key, principal, NULL, NULL, NULL, NULL,
				expires_at > CURRENT_TIMESTAMP(6) FROM idempotency_key FORCE INDEX (uk_principal_key)
				WHERE (principal, idem_key) IN ((?,?)`)
		} else {
			q.WriteString(",(?,?)")
		}
		args = append(args, r.p.RequestedBy, r.p.IdempotencyKey)
		nk++
	}
	if nk > 0 {
		q.WriteByte(')')
	}
	// Case collisions of the grants (caseCollisionWhere), the request's index in the id
	// column: at most one row each.
	for i, r := range work {
		if r.p.Action != domain.ActionGrant {
			continue
		}
		q.WriteString(` UNION ALL (SELECT 'c', NULL, ` + itoa(int64(i)) + `, subject, target, repo, status, operation_id, version, NULL
			FROM binding WHERE ` + caseCollisionWhere + ` LIMIT 1)`)
		args = append(args, caseCollisionArgs(r.p.Repo, r.p.Subject, r.p.Target)...)
	}
	return q.String(), args
}

// admitRead is what the group's read found.
type admitRead struct {
	now        time.Time
	bindings   map[relKey]groupBinding
	keys       map[idemRef]bool       // stored key → live
	collisions map[int]domain.Binding // request index in the group's work → the binding its file collides with
}

// admitReadResult turns the read's rows into the clock, the bindings found, the keys
// stored and the case collisions.
func admitReadResult(rows []admitReadRow) (rd admitRead, err error) {
	rd.bindings = make(map[relKey]groupBinding, len(rows))
	rd.keys = map[idemRef]bool{}
	for _, row := range rows {
		switch row.Kind {
		case "n":
			rd.now = row.TS.Time.UTC()
		case "b":
			b := domain.Binding{
				ID: row.ID.Int64, Subject: row.Subject.String, Target: row.Target.String, Repo: row.Repo.String,
				Status: domain.BindingStatus(row.Status.String), OperationID: row.OperationID.String, Version: row.Version.Int64,
			}
			rd.bindings[relKey{b.Subject, b.Target}] = groupBinding{Binding: b, found: true}
		case "k":
			rd.keys[idemRef{row.Target.String, row.Subject.String}] = row.Live.Bool
		case "c":
			if rd.collisions == nil {
				rd.collisions = map[int]domain.Binding{}
			}
			rd.collisions[int(row.ID.Int64)] = domain.Binding{Subject: row.Subject.String, Target: row.Target.String,
				Repo: row.Repo.String, Status: domain.BindingStatus(row.Status.String), OperationID: row.OperationID.String,
				Version: row.Version.Int64}
		}
	}
	if rd.now.IsZero() {
		err = errors.New("store: admission read returned no clock row")
	}
	return
}

// decideAdmission is the per-request decision of OperationCreateSerial, on the
// group's read: the same checks in the same order, the same errors.
func decideAdmission(p OperationCreateParams, now time.Time, b groupBinding) (accepted, error) {
	x := accepted{b: b, repo: p.Repo, status: domain.OpPendingApproval}
	if p.ExpiresAt != nil {
		if p.Action != domain.ActionGrant {
			return x, fmt.Errorf("%w: expires_at applies to grants only", ErrInvalidRequest)
		}
		// DATETIME(6) keeps microseconds; the comparison is the database's
		// `? > CURRENT_TIMESTAMP(6)` on the clock read by this group.
		if !p.ExpiresAt.UTC().Truncate(time.Microsecond).After(now) {
			return x, ErrExpiresInPast
		}
	}
	repo, err := checkApplication(p.Action, p.Repo, b.Binding, b.found)
	if err != nil {
		return x, err
	}
	x.repo = repo
	if p.AutoApprove {
		x.status = domain.OpQueued
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

// admitStmt is one write of a group; want ≥ 0 is the exact affected-row count it must
// report (a guard), else anything goes. exact says that the statement cannot report
// another count without failing (a plain multi-row INSERT: every row or an error), so a
// compound needs no ROW_COUNT() test after it.
type admitStmt struct {
	q     string
	args  []any
	want  int64
	exact bool
}

// buildAdmitWrites returns the group's writes, in the per-request lock order (keys,
// operations, bindings, waiting rows), and the index of the operation INSERT. The
// operations' created_at and updated_at are clock: the group's clock read (plain
// statements), or the compound's local variable (admit_compound.go), never a column
// default, so the caller knows them without reading them back.
//
// receivers (any) adds step 6, the operation.queued events of auto-approved operations
// (outbox.go): one multi-row INSERT into the outbox, in the group's transaction.
func buildAdmitWrites(clock admitClock, acc []accepted, receivers []int64) (stmts []admitStmt, opStmt int) {
	stmts = append(stmts, keyWrites(acc)...)
	opStmt = len(stmts)
	stmts = append(stmts, operationWrite(clock, acc))
	stmts = append(stmts, bindingWrites(acc)...)
	stmts = append(stmts, waitingWrites(acc)...)
	// No audit rows: the created and auto-admitted events are derived from the
	// operation row when its events are read (OperationEvents, derivedEvents).
	return append(stmts, outboxStmt(queuedEvents(acc), receivers)...), opStmt
}

// queuedEvents are the operation.queued events of the group's auto-approved operations.
func queuedEvents(acc []accepted) []outEvent {
	var evs []outEvent
	for _, x := range acc {
		if x.status == domain.OpQueued {
			p := x.r.p
			evs = append(evs, opEvent(EventTypeOperationQueued, EventOperation{ID: p.OperationID, Subject: p.Subject,
				Target: p.Target, Repo: x.repo, Action: string(p.Action), Status: string(domain.OpQueued)}))
		}
	}
	return evs
}

// keyWrites is step 1: idempotency keys, in (principal, key) order (lock order between
// concurrent groups). A concurrent request with the same key makes this wait and then
// 1062: fallback.
func keyWrites(acc []accepted) []admitStmt {
	var keyed []accepted
	for _, x := range acc {
		if x.r.p.IdempotencyKey != "" {
			keyed = append(keyed, x)
		}
	}
	if len(keyed) == 0 {
		return nil
	}
	slices.SortFunc(keyed, func(x, y accepted) int {
		if c := strings.Compare(x.r.p.RequestedBy, y.r.p.RequestedBy); c != 0 {
			return c
		}
		return strings.Compare(x.r.p.IdempotencyKey, y.r.p.IdempotencyKey)
	})
	args := make([]any, 0, 5*len(keyed))
	for _, x := range keyed {
		ttl := x.r.p.IdempotencyTTL
		if ttl <= 0 {
			ttl = 24 * time.Hour
		}
		args = append(args, x.r.p.RequestedBy, x.r.p.IdempotencyKey, x.r.p.Fingerprint, x.r.p.OperationID, ttl.Microseconds())
	}
	return []admitStmt{{`INSERT INTO idempotency_key (principal, idem_key, fingerprint, operation_id, expires_at) VALUES ` +
		values("(?, ?, ?, ?, CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND)", len(keyed)), args, int64(len(keyed)), true}}
}

// admitClock is where a group's operations take created_at and updated_at from: the
// group's clock read (t), or a variable of the compound statement that writes them
// (sqlVar, admit_compound.go).
type admitClock struct {
	t      time.Time
	sqlVar string
}

// operationWrite is step 2: operations, in arrival order, created_at = updated_at =
// the group's clock.
func operationWrite(clock admitClock, acc []accepted) admitStmt {
	args := make([]any, 0, 12*len(acc))
	for _, x := range acc {
		p := x.r.p
		args = append(args, p.OperationID, p.Subject, p.Target, x.repo, p.Action, x.status, x.exp, x.attrs,
			p.RequestedBy, approvedByOnCreate(p))
		if clock.sqlVar == "" {
			args = append(args, clock.t, clock.t)
		}
	}
	row := "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
	if clock.sqlVar != "" {
		row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, " + clock.sqlVar + ", " + clock.sqlVar + ")"
	}
	return admitStmt{`INSERT INTO operation
		(operation_id, subject, target, repo, action, status, expires_at, attributes, requested_by, approved_by, created_at, updated_at) VALUES ` +
		values(row, len(acc)), args, int64(len(acc)), true}
}

// bindingWrites is step 3. New relations: one INSERT in (subject, target) order; a
// concurrent first application of one of them makes it 1062 (fallback: the serial path
// answers busy, as it would have). Existing ones: one guarded UPDATE on the exact (id,
// status, version) each was read with (I5, I6), affected rows checked (reuseWrite).
func bindingWrites(acc []accepted) []admitStmt {
	var fresh, reuse []accepted
	for _, x := range acc {
		if x.b.found {
			reuse = append(reuse, x)
		} else {
			fresh = append(fresh, x)
		}
	}
	var stmts []admitStmt
	if len(fresh) > 0 {
		slices.SortFunc(fresh, func(x, y accepted) int {
			if c := strings.Compare(x.r.p.Subject, y.r.p.Subject); c != 0 {
				return c
			}
			return strings.Compare(x.r.p.Target, y.r.p.Target)
		})
		args := make([]any, 0, 6*len(fresh))
		for _, x := range fresh {
			p := x.r.p
			args = append(args, p.Subject, p.Target, x.repo, domain.BindingPending, p.OperationID, x.exp)
		}
		stmts = append(stmts, admitStmt{`INSERT INTO binding (subject, target, repo, status, operation_id, expires_at) VALUES ` +
			values("(?, ?, ?, ?, ?, ?)", len(fresh)), args, int64(len(fresh)), true})
	}
	if len(reuse) > 0 {
		stmts = append(stmts, reuseWrite(reuse))
	}
	return stmts
}

// reuseWrite is the guarded UPDATE of existing bindings, in id order. Fewer rows than
// read means one of them moved on since the read: the group rolls back and each caller
// retries alone.
func reuseWrite(reuse []accepted) admitStmt {
	slices.SortFunc(reuse, func(x, y accepted) int { return cmp.Compare(x.b.ID, y.b.ID) })
	var status, opID, repo, exp strings.Builder
	var aStatus, aOp, aRepo, aExp, aWhere []any
	for _, x := range reuse {
		to := domain.BindingPending
		if x.r.p.Action == domain.ActionRevoke {
			to = domain.BindingRevoking
		}
		status.WriteString(" WHEN ? THEN ?")
		aStatus = append(aStatus, x.b.ID, to)
		opID.WriteString(" WHEN ? THEN ?")
		aOp = append(aOp, x.b.ID, x.r.p.OperationID)
		if x.r.p.Action == domain.ActionGrant {
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
	return admitStmt{q, all, int64(len(reuse)), false}
}

// waitingWrites is step 4: waiting rows of auto-approved operations (I4: unique
// operation_id). Every operation here is new, so every row must be new: a plain INSERT,
// whose 1062 (a state this path does not explain) rolls the group back and the serial
// path decides.
func waitingWrites(acc []accepted) []admitStmt {
	var queued []accepted
	for _, x := range acc {
		if x.status == domain.OpQueued {
			queued = append(queued, x)
		}
	}
	if len(queued) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(queued))
	for _, x := range queued {
		args = append(args, x.r.p.OperationID, x.repo)
	}
	return []admitStmt{{`INSERT INTO merge_batch_request (operation_id, repo) VALUES ` +
		values("(?, ?)", len(queued)), args, int64(len(queued)), true}}
}

// autoincStepOf returns how the ids of a multi-row INSERT follow each other on this
// server: with InnoDB's "consecutive" or "traditional" auto-increment lock mode a
// multi-row INSERT of known size gets consecutive values (LAST_INSERT_ID is the first,
// each next one auto_increment_increment further), and the step is returned; 0 means
// the ids must be read back. Read once per Store, on a connection of its own: call it
// before taking the group's connection, which may be the pool's last one.
func (s *Store) autoincStepOf(ctx context.Context, a *admitter) int64 {
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
	return a.autoincStep
}

// insertedIDs returns the primary keys of the operations one multi-row INSERT wrote,
// in row order: computed when step > 0 (autoincStepOf), read back otherwise.
func insertedIDs(ctx context.Context, step int64, tx *sqlx.Tx, res sql.Result, acc []accepted) ([]int64, error) {
	if res == nil {
		return nil, errors.New("store: no operation INSERT result")
	}
	ids := make([]int64, len(acc))
	if step > 0 {
		first, err := res.LastInsertId()
		if err != nil {
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
