package store

// Operation-side store methods: admission with idempotency, approval, rejection,
// retry, bindings, expiry and audit events. Each exported method is one transaction
// through withTx (OperationCreate's idempotency loser adds one re-read of the winner,
// after its own transaction has rolled back; concurrent OperationCreate calls share
// one group transaction, admit_group.go).
//
// Lock order, everywhere: idempotency key (admission only), then the operation row,
// then the binding row. The claim and the settlers lock operations before bindings
// too, so no cycle can form between these paths.
//
// Isolation: these transactions run at READ COMMITTED. Every decision they make is
// taken either on a row locked FOR UPDATE or by a guarded write (status AND version,
// I6) whose affected-row count is checked, so a REPEATABLE READ snapshot would add
// nothing but the risk seed 004 describes (deciding on an old snapshot) and gap locks
// on the absent-key lookups (a new binding, a new idempotency key) that would make
// unrelated admissions wait on each other.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// ErrExpiresInPast: a grant's expires_at is not in the future by the database clock
// (HTTP 400). Checked in the store so the comparison uses the DB clock, like every
// other time comparison.
var ErrExpiresInPast = errors.New("expires_at is not in the future")

// ErrInvalidRequest: the parameters contradict each other (HTTP 400). The API
// validates first; the store refuses rather than guess.
var ErrInvalidRequest = errors.New("invalid request")

// ErrCaseCollision: a grant whose binding file differs from another relation's only by
// letter case (HTTP 409 case_collision). Admission returns it as a *CaseCollisionError
// naming the other binding.
var ErrCaseCollision = errors.New("binding file differs only by letter case from another binding's")

// CaseCollisionError is ErrCaseCollision with the binding the grant collides with:
// bindings/<target>/<subject>.yaml compared case-insensitively within one repository,
// of a binding whose file the repository holds or is about to (active, pending,
// revoking). A case-insensitive checkout (macOS, Windows) would make the two one file.
type CaseCollisionError struct{ Other domain.Binding }

func (e *CaseCollisionError) Error() string {
	return fmt.Sprintf("%v: %s → %s (%s)", ErrCaseCollision, e.Other.Subject, e.Other.Target, e.Other.Status)
}

// Unwrap makes errors.Is(err, ErrCaseCollision) hold.
func (e *CaseCollisionError) Unwrap() error { return ErrCaseCollision }

// caseCollisionWhere selects the bindings whose file is (repo, subject, target)'s when
// letter case is ignored, other than its own, among those whose file the repository
// holds or is about to: one lookup of idx_binding_fold (binding.fold_key, migration
// 00005). Its arguments are caseCollisionArgs.
const caseCollisionWhere = `fold_key = SHA2(CONCAT(?, 0x00, LOWER(?), 0x00, LOWER(?)), 256)
	AND status IN ('active', 'pending', 'revoking') AND NOT (subject = ? AND target = ?)`

func caseCollisionArgs(repo, subject, target string) []any {
	return []any{repo, target, subject, subject, target}
}

// Audit event codes written by this file.
const (
	EventCreated         = "created"
	EventAdmitted        = "admitted"
	EventApproved        = "approved"
	EventRejected        = "rejected"
	EventRetryByOperator = "retry_by_operator"
	EventExpiryRevoke    = "expiry_revoke"
)

// opIso is the isolation of every operation-side transaction (see the file comment).
const opIso = sql.LevelReadCommitted

// attributes is NULL when the application had none; json.RawMessage cannot scan NULL,
// so reads turn it into an empty value.
const opCols = `id, operation_id, subject, target, repo, action, status, priority, version, expires_at,
	COALESCE(attributes, '') AS attributes, batch_id, attempts, error_code, error_message, created_at, updated_at, ` +
	principalCols

// principalCols are the operation's principals (migration 00006).
const principalCols = `requested_by, approved_by, rejected_by, withdrawn_by, retried_by`

// principalColsOf is principalCols qualified with a table alias.
func principalColsOf(alias string) string {
	return alias + "." + strings.ReplaceAll(principalCols, ", ", ", "+alias+".")
}

const bindingCols = `id, subject, target, repo, status, operation_id, expires_at, version, created_at, updated_at`

// OperationCreateParams is one validated application.
type OperationCreateParams struct {
	OperationID string // a new UUID chosen by the caller
	Subject     string
	Target      string
	// Repo is where a grant's file is written. A revoke always goes to the repository
	// that holds the binding's file (the binding's repo), whatever Repo says.
	Repo       string
	Action     domain.Action
	ExpiresAt  *time.Time // grants only; must be in the future by the DB clock
	Attributes json.RawMessage
	// AutoApprove admits the operation to the waiting set at once (status queued).
	AutoApprove bool
	// Priority: "" or normal, or urgent (claimed before normal operations).
	Priority domain.Priority
	// IdempotencyKey, when set, makes the call idempotent: Fingerprint identifies the
	// request; a repeat with the same fingerprint returns the first operation with
	// created=false; another fingerprint returns ErrIdempotencyKeyReused.
	IdempotencyKey string
	Fingerprint    string
	IdempotencyTTL time.Duration
	// RequestedBy is the principal applying: recorded as requested_by and as the
	// created event's actor, and the scope of IdempotencyKey (two principals may send
	// the same key).
	RequestedBy string
}

// approvedByOnCreate is approved_by as admission writes it: auto for an auto-approved
// operation, nobody yet otherwise.
func approvedByOnCreate(p OperationCreateParams) string {
	if p.AutoApprove {
		return AutoApprover
	}
	return ""
}

// AutoApprover is approved_by of an operation nobody approved by hand
// (BATCHERD_AUTO_APPROVE, expiry revokes). internal/auth reserves the name, so no
// principal can be recorded as it.
const AutoApprover = "auto"

// SystemActor is requested_by of the operations batcherd makes itself (expiry revokes).
const SystemActor = "batcherd"

// errIdemSeen ends the transaction of a request whose key is already stored; the
// caller then reads the stored answer outside it.
var errIdemSeen = errors.New("idempotency key already stored")

// OperationCreate creates an operation and applies it to its binding (I5) in one
// transaction. Errors: ErrBindingBusy, ErrBindingActive, ErrBindingNotActive,
// ErrIdempotencyKeyReused, ErrExpiresInPast, ErrLostRace (concurrent re-application won).
//
// Concurrent calls on one Store are coalesced into group transactions (group commit,
// admit_group.go); each caller gets the answer its own transaction would have given,
// and whatever a group cannot answer exactly runs through OperationCreateSerial.
// SetAdmitOptions sizes and paces the groups; there is no other mode.
//
// When the COMMIT's answer was lost (ErrCommitUnknown) and the request carries an
// Idempotency-Key, the key is read again before anything else: found, the operation it
// names is the answer (as for a retry with the key); not found, the outcome stays
// unknown (on a Galera cluster the node that answers now may not have applied the
// write yet) and the caller retries with the same key. Without a key the caller gets
// ErrCommitUnknown; a retry cannot make a second operation, since the first one holds
// the binding (ErrBindingBusy).
func (s *Store) OperationCreate(ctx context.Context, p OperationCreateParams) (op domain.Operation, created bool, err error) {
	op, created, err = s.admitGrouped(ctx, p)
	if errors.Is(err, ErrCommitUnknown) && p.IdempotencyKey != "" {
		if o, rerr := s.idempotencyAnswer(ctx, p.RequestedBy, p.IdempotencyKey, p.Fingerprint); rerr == nil {
			return o, false, nil
		}
	}
	return op, created, err
}

// OperationCreateSerial is the per-request admission: one transaction for one request,
// retried a few times when it lost a race. It is the group path's fallback and the
// reference it is held to, exported so that tests compare with it and bench measures
// it; callers admit through OperationCreate.
func (s *Store) OperationCreateSerial(ctx context.Context, p OperationCreateParams) (op domain.Operation, created bool, err error) {
	// A few rounds, because losing is answered best by looking again: a concurrent
	// application of the same relation that won makes the next round report the
	// binding's real state (busy, active); a transaction holding our idempotency key
	// may roll back (its application was refused), and the waiters on that key can then
	// deadlock each other on the shared locks their 1062 left (docs/ARCHITECTURE.md, "Database facts").
	for attempt := 0; ; attempt++ {
		op, err = s.operationCreateTx(ctx, p)
		switch {
		case err == nil:
			return op, true, nil
		case p.IdempotencyKey != "" && (errors.Is(err, errIdemSeen) || errors.Is(err, ErrDuplicate)):
			// The key is (or was, a moment ago) held by another request: its answer is ours.
			op, err = s.idempotencyAnswer(ctx, p.RequestedBy, p.IdempotencyKey, p.Fingerprint)
			if errors.Is(err, ErrNotFound) && attempt < 3 {
				continue // the holder rolled back or the key just expired: try again
			}
			return op, false, err
		case errors.Is(err, ErrLostRace) && attempt < 3:
			continue
		default:
			return domain.Operation{}, false, err
		}
	}
}

// idempotencyAnswer reads the operation a principal's stored, unexpired key points at.
func (s *Store) idempotencyAnswer(ctx context.Context, principal, key, fingerprint string) (domain.Operation, error) {
	var row struct {
		Fingerprint string `db:"fingerprint"`
		OperationID string `db:"operation_id"`
	}
	err := s.db.GetContext(ctx, &row, `SELECT fingerprint, operation_id FROM idempotency_key
		WHERE principal = ? AND idem_key = ? AND expires_at > CURRENT_TIMESTAMP(6)`, principal, key)
	if err != nil {
		return domain.Operation{}, translate(err)
	}
	if row.Fingerprint != fingerprint {
		return domain.Operation{}, ErrIdempotencyKeyReused
	}
	return s.OperationGet(ctx, row.OperationID)
}

// operationCreateTx is one application in one transaction, step by step: the
// idempotency key (idempotencyKeyTx), the expiry against the database clock
// (expiryInFutureTx), the binding read and the decision on it (checkApplication, shared
// with the group path), the operation row, the binding write (applyToBindingTx), the
// created event, and for auto-approval the waiting row.
func (s *Store) operationCreateTx(ctx context.Context, p OperationCreateParams) (domain.Operation, error) {
	var out domain.Operation
	err := s.withTx(ctx, opIso, func(tx *sqlx.Tx) error {
		if err := idempotencyKeyTx(ctx, tx, p); err != nil {
			return err
		}
		if err := caseCollisionTx(ctx, tx, p); err != nil {
			return err
		}
		if err := expiryInFutureTx(ctx, tx, p); err != nil {
			return err
		}
		// Plain read: the decision below is enforced by a guarded write on the exact
		// status and version read (I5, I6), not by a lock taken here.
		b, found, err := bindingBySubjectTarget(ctx, tx, p.Subject, p.Target, false)
		if err != nil {
			return err
		}
		repo, err := checkApplication(p.Action, p.Repo, b, found)
		if err != nil {
			return err
		}
		status := domain.OpPendingApproval
		if p.AutoApprove {
			status = domain.OpQueued
		}
		var attrs any
		if len(p.Attributes) > 0 {
			attrs = string(p.Attributes)
		}
		// Operation row before the binding row: the lock order of every path.
		prio := p.Priority
		switch prio {
		case "":
			prio = domain.PriorityNormal
		case domain.PriorityNormal, domain.PriorityUrgent:
		default:
			return fmt.Errorf("%w: unknown priority %q", ErrInvalidRequest, prio)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO operation
			(operation_id, subject, target, repo, action, status, priority, expires_at, attributes, requested_by, approved_by)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			p.OperationID, p.Subject, p.Target, repo, p.Action, status, prio, utcPtr(p.ExpiresAt), attrs,
			p.RequestedBy, approvedByOnCreate(p)); err != nil {
			return err
		}
		if err := applyToBindingTx(ctx, tx, p, repo, b, found); err != nil {
			return err
		}
		// No created or admitted audit row: the operation row proves both, and
		// OperationEvents derives them from it (derivedEvents).
		if p.AutoApprove {
			if _, err := tx.ExecContext(ctx, `INSERT INTO merge_batch_request (operation_id, repo, lane) VALUES (?, ?, ?)`,
				p.OperationID, repo, laneOf(prio)); err != nil {
				return err
			}
		}
		if out, err = operationByID(ctx, tx, p.OperationID, false); err != nil || !p.AutoApprove {
			return err
		}
		return s.writeOutbox(ctx, tx, []outEvent{eventOfOperation(EventTypeOperationQueued, out)})
	})
	return out, err
}

// idempotencyKeyTx takes the request's idempotency key (scoped to its principal), if
// it has one. A live stored key ends the transaction with errIdemSeen (checked before
// the insert: the common repeat is answered without touching locks); a key another
// request holds right now makes the INSERT wait on the unique key until that one ends,
// then 1062 (ErrDuplicate): either way the caller reads the stored answer.
func idempotencyKeyTx(ctx context.Context, tx *sqlx.Tx, p OperationCreateParams) error {
	if p.IdempotencyKey == "" {
		return nil
	}
	var live []bool
	if err := tx.SelectContext(ctx, &live, `SELECT expires_at > CURRENT_TIMESTAMP(6)
		FROM idempotency_key WHERE principal = ? AND idem_key = ?`, p.RequestedBy, p.IdempotencyKey); err != nil {
		return err
	}
	if len(live) > 0 && live[0] {
		return errIdemSeen
	}
	if len(live) > 0 {
		// Expired but not purged yet: no longer an answer, free the key (guarded, so a
		// key renewed meanwhile by another request stays).
		if _, err := tx.ExecContext(ctx, `DELETE FROM idempotency_key
			WHERE principal = ? AND idem_key = ? AND expires_at <= CURRENT_TIMESTAMP(6)`, p.RequestedBy, p.IdempotencyKey); err != nil {
			return err
		}
	}
	ttl := p.IdempotencyTTL
	if ttl <= 0 {
		ttl = 24 * time.Hour
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO idempotency_key (principal, idem_key, fingerprint, operation_id, expires_at)
		VALUES (?, ?, ?, ?, CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`,
		p.RequestedBy, p.IdempotencyKey, p.Fingerprint, p.OperationID, ttl.Microseconds())
	return err // 1062 → ErrDuplicate → the caller reads the winner
}

// caseCollisionTx refuses a grant whose binding file differs from another binding's
// only by letter case (CaseCollisionError). A plain read, like the binding read: two
// grants racing for files that fold alike are kept apart inside one replica by the group
// path (runAdmitGroup runs the second after the first), not by a lock.
func caseCollisionTx(ctx context.Context, tx *sqlx.Tx, p OperationCreateParams) error {
	if p.Action != domain.ActionGrant {
		return nil
	}
	var other []domain.Binding
	if err := tx.SelectContext(ctx, &other, `SELECT `+bindingCols+` FROM binding WHERE `+caseCollisionWhere+` LIMIT 1`,
		caseCollisionArgs(p.Repo, p.Subject, p.Target)...); err != nil {
		return err
	}
	if len(other) > 0 {
		return &CaseCollisionError{Other: other[0]}
	}
	return nil
}

// expiryInFutureTx checks a grant's expires_at against the database clock (never the
// replica's).
func expiryInFutureTx(ctx context.Context, tx *sqlx.Tx, p OperationCreateParams) error {
	if p.ExpiresAt == nil {
		return nil
	}
	if p.Action != domain.ActionGrant {
		return fmt.Errorf("%w: expires_at applies to grants only", ErrInvalidRequest)
	}
	var future bool
	if err := tx.GetContext(ctx, &future, `SELECT ? > CURRENT_TIMESTAMP(6)`, p.ExpiresAt.UTC()); err != nil {
		return err
	}
	if !future {
		return ErrExpiresInPast
	}
	return nil
}

// checkApplication decides whether an application of action may proceed on the
// binding as read (found false: no row yet), and returns the repository it goes to: a
// grant's own, a revoke always the binding's (where its file is). Only re-appliable
// bindings take a grant (I5); only active ones a revoke. Shared by the serial and the
// group admission, so both answer alike.
func checkApplication(action domain.Action, repo string, b domain.Binding, found bool) (string, error) {
	switch action {
	case domain.ActionGrant:
		if found && !b.Status.Reappliable() {
			if b.Status == domain.BindingActive {
				return repo, ErrBindingActive
			}
			return repo, fmt.Errorf("%w: binding is %s", ErrBindingBusy, b.Status)
		}
		return repo, nil
	case domain.ActionRevoke:
		if !found {
			return repo, ErrBindingNotActive
		}
		switch b.Status {
		case domain.BindingActive:
			return b.Repo, nil
		case domain.BindingPending, domain.BindingRevoking, domain.BindingFailed:
			return repo, fmt.Errorf("%w: binding is %s", ErrBindingBusy, b.Status)
		}
		return repo, fmt.Errorf("%w: binding is %s", ErrBindingNotActive, b.Status)
	}
	return repo, fmt.Errorf("%w: unknown action %q", ErrInvalidRequest, action)
}

// applyToBindingTx writes the application to its binding: a new row for a first grant
// (a concurrent first application of the same relation makes it 1062: it won, we lost,
// ErrLostRace, read by the API as busy); a re-application in place (I5) or a revoke of
// an active binding, each guarded on the exact status and version read (I6).
func applyToBindingTx(ctx context.Context, tx *sqlx.Tx, p OperationCreateParams, repo string, b domain.Binding, found bool) error {
	var (
		res sql.Result
		err error
	)
	switch {
	case p.Action == domain.ActionGrant && !found:
		if _, err := tx.ExecContext(ctx, `INSERT INTO binding
			(subject, target, repo, status, operation_id, expires_at) VALUES (?, ?, ?, ?, ?, ?)`,
			p.Subject, p.Target, repo, domain.BindingPending, p.OperationID, utcPtr(p.ExpiresAt)); err != nil {
			if isDuplicate(err) {
				return ErrLostRace
			}
			return err
		}
		return nil
	case p.Action == domain.ActionGrant:
		res, err = tx.ExecContext(ctx, `UPDATE binding SET status = ?, operation_id = ?, repo = ?,
			expires_at = ?, version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
			WHERE id = ? AND status = ? AND version = ?`,
			domain.BindingPending, p.OperationID, repo, utcPtr(p.ExpiresAt), b.ID, b.Status, b.Version)
	default: // revoke of an active binding
		res, err = tx.ExecContext(ctx, `UPDATE binding SET status = ?, operation_id = ?,
			version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
			WHERE id = ? AND status = ? AND version = ?`,
			domain.BindingRevoking, p.OperationID, b.ID, domain.BindingActive, b.Version)
	}
	if err != nil {
		return err
	}
	return mustAffect(res, 1)
}

// OperationGet returns one operation by its public id. ErrNotFound when unknown.
func (s *Store) OperationGet(ctx context.Context, operationID string) (domain.Operation, error) {
	var op domain.Operation
	err := s.db.GetContext(ctx, &op, `SELECT `+opCols+` FROM operation WHERE operation_id = ?`, operationID)
	return op, translate(err)
}

// OperationView is an operation with the web URL of its batch's MR ("" when it is in
// no batch or the batch has no MR yet), as the HTTP API shows it.
type OperationView struct {
	domain.Operation
	MRURL string `db:"mr_url"`
}

// OperationGetView returns an operation and its batch's MR URL in one read.
// ErrNotFound when unknown.
func (s *Store) OperationGetView(ctx context.Context, operationID string) (OperationView, error) {
	var v OperationView
	err := s.db.GetContext(ctx, &v, `SELECT o.id, o.operation_id, o.subject, o.target, o.repo, o.action,
		o.status, o.priority, o.version, o.expires_at, COALESCE(o.attributes, '') AS attributes, o.batch_id, o.attempts, o.error_code,
		o.error_message, o.created_at, o.updated_at, `+principalColsOf("o")+`, COALESCE(b.mr_url, '') AS mr_url
		FROM operation o LEFT JOIN merge_batch b ON b.id = o.batch_id
		WHERE o.operation_id = ?`, operationID)
	return v, translate(err)
}

// BatchMRURL returns the MR web URL recorded on a batch ("" when none yet).
// ErrNotFound when the batch does not exist.
func (s *Store) BatchMRURL(ctx context.Context, batchID int64) (string, error) {
	var u string
	err := s.db.GetContext(ctx, &u, `SELECT mr_url FROM merge_batch WHERE id = ?`, batchID)
	return u, translate(err)
}

// OperationApprove approves as nobody in particular, without the four-eyes rule (tests
// and tools; the API calls OperationApproveBy).
func (s *Store) OperationApprove(ctx context.Context, operationID string) (domain.Operation, error) {
	return s.OperationApproveBy(ctx, operationID, "", false)
}

// OperationApproveBy: pending_approval → queued and admitted, recording the approver,
// guarded on the operation's version and on the binding still pointing at it. A repeat
// is a no-op returning the operation; ErrSelfApproval when fourEyes and the approver
// requested it (nothing changes); ErrStale when superseded or already rejected;
// ErrNotFound when unknown.
func (s *Store) OperationApproveBy(ctx context.Context, operationID, actor string, fourEyes bool) (domain.Operation, error) {
	var out domain.Operation
	err := s.withTxRetry(ctx, opIso, func(tx *sqlx.Tx) error {
		op, b, err := lockOperationAndBinding(ctx, tx, operationID)
		if err != nil {
			return err
		}
		switch op.Status {
		case domain.OpQueued, domain.OpInBatch, domain.OpMerged, domain.OpFailed:
			// Each of these lies past an approval: the same decision again changes nothing.
			out = op
			return nil
		case domain.OpRejected:
			return fmt.Errorf("%w: operation was rejected", ErrStale)
		case domain.OpPendingApproval:
		default:
			return fmt.Errorf("%w: operation is %s", ErrStale, op.Status)
		}
		// Four eyes, decided on the locked row: the requester cannot approve its own
		// operation. Checked before any write, so the refusal changes nothing.
		if fourEyes && actor != "" && op.RequestedBy == actor {
			return fmt.Errorf("%w: %q requested operation %s and cannot approve it too", ErrSelfApproval, actor, op.OperationID)
		}
		if err := guardBindingOwned(ctx, tx, op, b, pendingBindingStatus(op.Action), pendingBindingStatus(op.Action)); err != nil {
			return err
		}
		if err := setOperationStatusBy(ctx, tx, op, domain.OpQueued, "approved_by", actor); err != nil {
			return err
		}
		if err := recordEventBy(ctx, tx, op.OperationID, EventApproved, 0, "", actor); err != nil {
			return err
		}
		if err := admitTxBy(ctx, tx, op.OperationID, op.Repo, op.Priority, op.Attempts, "approved", actor); err != nil {
			return err
		}
		if out, err = operationByID(ctx, tx, operationID, false); err != nil {
			return err
		}
		return s.writeOutbox(ctx, tx, []outEvent{eventOfOperation(EventTypeOperationQueued, out)})
	})
	return out, err
}

// OperationReject rejects as nobody in particular (tests and tools; the API calls
// OperationRejectBy).
func (s *Store) OperationReject(ctx context.Context, operationID string) (domain.Operation, error) {
	return s.OperationRejectBy(ctx, operationID, "")
}

// OperationRejectBy: pending_approval → rejected (binding: grant → rejected, revoke →
// back to active), recording who rejected. A repeat is a no-op; ErrStale when
// superseded or already approved. The requester may reject (take back) its own
// operation: four eyes guards granting, not declining.
func (s *Store) OperationRejectBy(ctx context.Context, operationID, actor string) (domain.Operation, error) {
	var out domain.Operation
	err := s.withTxRetry(ctx, opIso, func(tx *sqlx.Tx) error {
		op, b, err := lockOperationAndBinding(ctx, tx, operationID)
		if err != nil {
			return err
		}
		switch op.Status {
		case domain.OpRejected:
			out = op
			return nil
		case domain.OpPendingApproval:
		default:
			return fmt.Errorf("%w: operation is %s (already approved)", ErrStale, op.Status)
		}
		// A rejected grant leaves no file (rejected, re-appliable); a rejected revoke
		// leaves the file in place, so the binding is active again.
		to := domain.BindingRejected
		if op.Action == domain.ActionRevoke {
			to = domain.BindingActive
		}
		if err := guardBindingOwned(ctx, tx, op, b, pendingBindingStatus(op.Action), to); err != nil {
			return err
		}
		if err := setOperationStatusBy(ctx, tx, op, domain.OpRejected, "rejected_by", actor); err != nil {
			return err
		}
		if err := recordEventBy(ctx, tx, op.OperationID, EventRejected, 0, "", actor); err != nil {
			return err
		}
		if out, err = operationByID(ctx, tx, operationID, false); err != nil {
			return err
		}
		return s.writeOutbox(ctx, tx, []outEvent{eventOfOperation(EventTypeOperationRejected, out)})
	})
	return out, err
}

// OperationRetry retries as nobody in particular (tests and tools; the API calls
// OperationRetryBy).
func (s *Store) OperationRetry(ctx context.Context, operationID string) (domain.Operation, error) {
	return s.OperationRetryBy(ctx, operationID, "")
}

// OperationRetryBy: failed → queued and re-admitted (binding back to pending/revoking),
// recording who retried, guarded; ErrStale when the operation is not failed or no
// longer owns its binding.
func (s *Store) OperationRetryBy(ctx context.Context, operationID, actor string) (domain.Operation, error) {
	var out domain.Operation
	err := s.withTxRetry(ctx, opIso, func(tx *sqlx.Tx) error {
		op, b, err := lockOperationAndBinding(ctx, tx, operationID)
		if err != nil {
			return err
		}
		if op.Status != domain.OpFailed {
			return fmt.Errorf("%w: operation is %s, not failed", ErrStale, op.Status)
		}
		// What a failed operation left on its binding (docs/ARCHITECTURE.md, "The state machine"): a failed grant leaves
		// it failed (no file), a failed revoke leaves it active (file still there).
		from, to := domain.BindingFailed, domain.BindingPending
		if op.Action == domain.ActionRevoke {
			from, to = domain.BindingActive, domain.BindingRevoking
		}
		if err := guardBindingOwned(ctx, tx, op, b, from, to); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE operation SET status = ?, batch_id = NULL, attempts = attempts + 1,
			error_code = '', error_message = '', retried_by = ?, version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
			WHERE id = ? AND status = ? AND version = ?`, domain.OpQueued, actor, op.ID, domain.OpFailed, op.Version)
		if err != nil {
			return err
		}
		if err := mustAffect(res, 1); err != nil {
			return err
		}
		attempt := op.Attempts + 1
		if err := recordEventBy(ctx, tx, op.OperationID, EventRetryByOperator, attempt, "", actor); err != nil {
			return err
		}
		// The failed batch's waiting row (if its settlement kept one) is dead: the
		// operation must wait again, and I4's unique key would read it as admitted.
		if _, err := tx.ExecContext(ctx, `DELETE FROM merge_batch_request
			WHERE operation_id = ? AND batch_id IS NOT NULL`, op.OperationID); err != nil {
			return err
		}
		if err := admitTxBy(ctx, tx, op.OperationID, op.Repo, op.Priority, attempt, "retry", actor); err != nil {
			return err
		}
		if out, err = operationByID(ctx, tx, operationID, false); err != nil {
			return err
		}
		return s.writeOutbox(ctx, tx, []outEvent{eventOfOperation(EventTypeOperationQueued, out)})
	})
	return out, err
}

// BindingList lists bindings, optionally of one subject and/or target, in id order
// after afterID (0: from the first). Callers page by passing the last id they got.
func (s *Store) BindingList(ctx context.Context, subject, target string, afterID int64, limit int) ([]domain.Binding, error) {
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 5000)
	var where []string
	var args []any
	if subject != "" {
		where = append(where, "subject = ?")
		args = append(args, subject)
	}
	if target != "" {
		where = append(where, "target = ?")
		args = append(args, target)
	}
	if afterID > 0 {
		where = append(where, "id > ?")
		args = append(args, afterID)
	}
	q := `SELECT ` + bindingCols + ` FROM binding`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id LIMIT ?"
	args = append(args, limit)
	out := []domain.Binding{}
	err := s.db.SelectContext(ctx, &out, q, args...)
	return out, translate(err)
}

// BindingsExpired returns active bindings whose expires_at has passed (DB clock),
// oldest expiry first, except those whose revoke failed. Read without locks:
// BindingExpire takes each with a guard.
//
// A failed revoke leaves its binding active, expired and owned by that revoke. Expiring
// it again would admit a new revoke every pass for ever — each with fresh attempts, so
// neither BATCHERD_MAX_ATTEMPTS nor a human closing the MR would stop it — and would
// make the failed revoke stale for the operator's retry, which is where it belongs.
func (s *Store) BindingsExpired(ctx context.Context, limit int) ([]domain.Binding, error) {
	if limit <= 0 {
		limit = 100
	}
	out := []domain.Binding{}
	err := s.db.SelectContext(ctx, &out, `SELECT `+bindingColsOf("b")+` FROM binding b
		LEFT JOIN operation o ON o.operation_id = b.operation_id
		WHERE b.status = ? AND b.expires_at <= CURRENT_TIMESTAMP(6)
		  AND NOT (o.action <=> ? AND o.status <=> ?)
		ORDER BY b.expires_at, b.id LIMIT ?`, domain.BindingActive, domain.ActionRevoke, domain.OpFailed, limit)
	return out, translate(err)
}

// BindingsExpiredActive counts active bindings past their expires_at (DB clock), for
// whatever reason they are still active: expiry has not reached them yet, or their
// revoke failed and waits for an operator. A metric: access that should have ended.
// It reads idx_status_expires' range of active bindings already expired.
func (s *Store) BindingsExpiredActive(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.GetContext(ctx, &n, `SELECT COUNT(*) FROM binding WHERE status = ? AND expires_at <= CURRENT_TIMESTAMP(6)`, domain.BindingActive)
	return n, translate(err)
}

// bindingColsOf is bindingCols qualified with a table alias.
func bindingColsOf(alias string) string {
	return alias + "." + strings.ReplaceAll(bindingCols, ", ", ", "+alias+".")
}

// BindingExpire creates and admits a revoke operation for an expired binding, guarded
// on the binding's version so two replicas make one. ErrLostRace when another did.
// The revoke is queued at once whatever BATCHERD_AUTO_APPROVE says: the expiry was
// approved with the grant.
func (s *Store) BindingExpire(ctx context.Context, b domain.Binding, operationID string) (domain.Operation, error) {
	var out domain.Operation
	err := s.withTx(ctx, opIso, func(tx *sqlx.Tx) error {
		// The binding's own operation (a plain read): a binding whose revoke failed is
		// not expired again (BindingsExpired). The guard on its version below keeps this
		// true until the write: the binding moves (and its version with it) whenever
		// that operation does.
		var owner struct {
			Action domain.Action   `db:"action"`
			Status domain.OpStatus `db:"status"`
		}
		switch err := tx.GetContext(ctx, &owner, `SELECT action, status FROM operation WHERE operation_id = ?`, b.OperationID); {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case owner.Action == domain.ActionRevoke && owner.Status == domain.OpFailed:
			return fmt.Errorf("%w: binding's revoke %s failed; it is the operator's to retry", ErrLostRace, b.OperationID)
		}
		// Operation first (lock order); the guarded binding write decides, and a loser
		// rolls the operation row back with it.
		// Requested by batcherd itself and approved with the grant: recorded as auto.
		if _, err := tx.ExecContext(ctx, `INSERT INTO operation
			(operation_id, subject, target, repo, action, status, requested_by, approved_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			operationID, b.Subject, b.Target, b.Repo, domain.ActionRevoke, domain.OpQueued, SystemActor, AutoApprover); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE binding SET status = ?, operation_id = ?,
			version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
			WHERE id = ? AND status = ? AND version = ? AND expires_at <= CURRENT_TIMESTAMP(6)`,
			domain.BindingRevoking, operationID, b.ID, domain.BindingActive, b.Version)
		if err != nil {
			return err
		}
		if err := mustAffect(res, 1); err != nil {
			return err
		}
		if err := recordEvent(ctx, tx, operationID, EventExpiryRevoke, 0,
			"binding expired; revokes operation "+b.OperationID); err != nil {
			return err
		}
		if err := admitTx(ctx, tx, operationID, b.Repo, domain.PriorityNormal, 0, "expiry"); err != nil {
			return err
		}
		if out, err = operationByID(ctx, tx, operationID, false); err != nil {
			return err
		}
		return s.writeOutbox(ctx, tx, []outEvent{eventOfOperation(EventTypeOperationQueued, out)})
	})
	return out, err
}

// EventRecord appends an audit event; a duplicate dedupe key is a no-op (returns false).
func (s *Store) EventRecord(ctx context.Context, e Event) (bool, error) {
	var inserted bool
	err := s.withTx(ctx, opIso, func(tx *sqlx.Tx) error {
		var err error
		inserted, err = insertEvent(ctx, tx, e)
		return err
	})
	return inserted, err
}

// maxEvents bounds the events OperationEvents returns.
const maxEvents = 1000

// OperationEvents lists an operation's events, oldest first. ErrNotFound when the
// operation is unknown. REPEATABLE READ: the existence check and both reads come from
// one snapshot.
//
// The events are the operation's audit rows plus one "claimed" event per batch it was
// claimed into, read from the batch's member history (merge_batch_member): a claim
// records that fact once, in the member row, instead of a second time as an audit row
// (the claim is the hottest batch path). A claimed event has ID 0 and the dedupe key an
// audit row of it would have had; it is placed by time between the audit rows, which
// keep their own order (by id).
func (s *Store) OperationEvents(ctx context.Context, operationID string) ([]Event, error) {
	var audit, claims []Event
	var op []opOrigin
	err := s.withTx(ctx, sql.LevelRepeatableRead, func(tx *sqlx.Tx) error {
		if err := tx.SelectContext(ctx, &op, `SELECT action, subject, target, requested_by, approved_by, created_at
			FROM operation WHERE operation_id = ?`, operationID); err != nil {
			return err
		}
		if len(op) == 0 {
			return ErrNotFound
		}
		if err := tx.SelectContext(ctx, &audit, `SELECT id, dedupe_key, operation_id, batch_id, code, detail, actor, created_at
			FROM audit_event WHERE operation_id = ? ORDER BY id LIMIT ?`, operationID, maxEvents); err != nil {
			return err
		}
		return tx.SelectContext(ctx, &claims, `SELECT 0 AS id,
				CONCAT('op:', operation_id, ':batch:', batch_id, ':claimed') AS dedupe_key,
				operation_id, batch_id, '`+EventMemberClaimed+`' AS code,
				CONCAT('claimed into batch ', batch_id, ': ', why) AS detail, '' AS actor, created_at
			FROM merge_batch_member WHERE operation_id = ? ORDER BY created_at, batch_id LIMIT ?`, operationID, maxEvents)
	})
	if err != nil {
		return nil, err
	}
	return mergeEvents(derivedEvents(operationID, op[0], audit), claims, maxEvents), nil
}

// opOrigin is what the operation row records of its creation.
type opOrigin struct {
	Action      domain.Action `db:"action"`
	Subject     string        `db:"subject"`
	Target      string        `db:"target"`
	RequestedBy string        `db:"requested_by"`
	ApprovedBy  string        `db:"approved_by"`
	CreatedAt   time.Time     `db:"created_at"`
}

// derivedEvents puts the events the operation row proves before its audit rows: an
// admission writes no audit row (issue 20: fewer rows per admission), since the row
// itself records that it was created (by requested_by, at created_at) and, when
// approved_by is AutoApprover, that it was admitted in the same transaction. Each
// derived event has ID 0 and the dedupe key its audit row would have had; an audit row
// with that key (written before this change, or by a path that records its own, such
// as an expiry revoke) stands instead of the derived one.
func derivedEvents(operationID string, o opOrigin, audit []Event) []Event {
	have := make(map[string]bool, len(audit))
	for _, a := range audit {
		have[a.DedupeKey] = true
	}
	var out []Event
	add := func(code, detail, actor string) {
		key := "op:" + operationID + ":" + code
		if have[key] {
			return
		}
		id := operationID
		out = append(out, Event{DedupeKey: key, OperationID: &id, Code: code, Detail: detail, Actor: actor, CreatedAt: o.CreatedAt})
	}
	// batcherd's own operations (expiry revokes record expiry_revoke; test fixtures
	// inserted behind the API's back) were never created by an admission.
	if o.RequestedBy != SystemActor {
		add(EventCreated, truncateUTF8(string(o.Action)+" "+o.Subject+" → "+o.Target, 2048), o.RequestedBy)
	}
	if o.ApprovedBy == AutoApprover {
		add(EventAdmitted, "auto-approved", AutoApprover)
	}
	if len(out) == 0 {
		return audit
	}
	return append(out, audit...)
}

// mergeEvents interleaves claimed events (ordered by time) into audit events (ordered
// by id): each claimed event goes before the first audit event recorded after it. An
// audit event at the same instant stays first. At most limit events are returned.
func mergeEvents(audit, claims []Event, limit int) []Event {
	out := make([]Event, 0, min(limit, len(audit)+len(claims)))
	i := 0
	for _, a := range audit {
		for i < len(claims) && claims[i].CreatedAt.Before(a.CreatedAt) {
			out = append(out, claims[i])
			i++
		}
		out = append(out, a)
	}
	out = append(out, claims[i:]...)
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}

// OperationCounts returns the number of operations in each of the given statuses, zero
// for a status with none (metrics). It counts each status's range of
// idx_status_updated, so the cost is the number of rows counted: small for the live
// statuses (bounded by the work in flight), growing with history for the finished ones,
// which operations keep for ever. Callers sample the two on different clocks.
func (s *Store) OperationCounts(ctx context.Context, statuses ...domain.OpStatus) (map[domain.OpStatus]int64, error) {
	out := make(map[domain.OpStatus]int64, len(statuses))
	if len(statuses) == 0 {
		return out, nil
	}
	args := make([]any, len(statuses))
	for i, st := range statuses {
		out[st] = 0
		args[i] = st
	}
	var rows []struct {
		Status domain.OpStatus `db:"status"`
		N      int64           `db:"n"`
	}
	if err := s.db.SelectContext(ctx, &rows, qOperationCounts(len(statuses)), args...); err != nil {
		return nil, translate(err)
	}
	for _, r := range rows {
		out[r.Status] = r.N
	}
	return out, nil
}

// qOperationCounts counts n statuses through idx_status_updated's ranges.
func qOperationCounts(n int) string {
	return `SELECT status, COUNT(*) AS n FROM operation WHERE status IN (` + inPlaceholders(n) + `) GROUP BY status`
}

// CleanupIdempotency deletes up to chunk expired idempotency keys (DB clock), oldest
// first through idx_expires. Returns rows deleted; callers loop while it returns chunk.
func (s *Store) CleanupIdempotency(ctx context.Context, chunk int) (int64, error) {
	if chunk <= 0 {
		chunk = 500
	}
	var n int64
	err := s.withTx(ctx, opIso, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM idempotency_key
			WHERE expires_at <= CURRENT_TIMESTAMP(6) ORDER BY expires_at LIMIT ?`, chunk)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// --- helpers, all inside a caller's transaction ---

func utcPtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UTC()
}

// pendingBindingStatus is the binding status while an operation of this action is
// waiting for approval or in flight.
func pendingBindingStatus(a domain.Action) domain.BindingStatus {
	if a == domain.ActionRevoke {
		return domain.BindingRevoking
	}
	return domain.BindingPending
}

func operationByID(ctx context.Context, tx *sqlx.Tx, operationID string, forUpdate bool) (domain.Operation, error) {
	q := `SELECT ` + opCols + ` FROM operation WHERE operation_id = ?`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	var op domain.Operation
	err := tx.GetContext(ctx, &op, q, operationID)
	return op, err
}

func bindingBySubjectTarget(ctx context.Context, tx *sqlx.Tx, subject, target string, forUpdate bool) (domain.Binding, bool, error) {
	q := `SELECT ` + bindingCols + ` FROM binding WHERE subject = ? AND target = ?`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	var b domain.Binding
	err := tx.GetContext(ctx, &b, q, subject, target)
	if errors.Is(err, sql.ErrNoRows) {
		return domain.Binding{}, false, nil
	}
	return b, err == nil, err
}

// lockOperationAndBinding locks the operation, then its binding: the lock order of
// every path that touches both. found=false bindings come back zero-valued.
func lockOperationAndBinding(ctx context.Context, tx *sqlx.Tx, operationID string) (domain.Operation, domain.Binding, error) {
	op, err := operationByID(ctx, tx, operationID, true)
	if err != nil {
		return domain.Operation{}, domain.Binding{}, err
	}
	b, _, err := bindingBySubjectTarget(ctx, tx, op.Subject, op.Target, true)
	return op, b, err
}

// guardBindingOwned moves the binding from → to, guarded on it still pointing at op
// and on the version read; anything else means the operation was superseded or its
// state moved on (ErrStale). from == to still bumps version, so the check is a write
// and a concurrent reader of the old version loses (I6).
func guardBindingOwned(ctx context.Context, tx *sqlx.Tx, op domain.Operation, b domain.Binding, from, to domain.BindingStatus) error {
	if b.ID == 0 || b.OperationID != op.OperationID {
		return fmt.Errorf("%w: the binding now belongs to another operation", ErrStale)
	}
	if b.Status != from {
		return fmt.Errorf("%w: binding is %s, want %s", ErrStale, b.Status, from)
	}
	res, err := tx.ExecContext(ctx, `UPDATE binding SET status = ?, version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
		WHERE id = ? AND operation_id = ? AND status = ? AND version = ?`,
		to, b.ID, op.OperationID, from, b.Version)
	if err != nil {
		return err
	}
	if err := mustAffect(res, 1); err != nil {
		return fmt.Errorf("%w: %w", ErrStale, err)
	}
	return nil
}

// setOperationStatusBy is setOperationStatus that also records a principal in column
// (approved_by, rejected_by, withdrawn_by), in the same guarded write.
func setOperationStatusBy(ctx context.Context, tx *sqlx.Tx, op domain.Operation, to domain.OpStatus, column, actor string) error {
	switch column {
	case "approved_by", "rejected_by", "withdrawn_by":
	default:
		return fmt.Errorf("store: %q is not a principal column", column)
	}
	res, err := tx.ExecContext(ctx, `UPDATE operation SET status = ?, `+column+` = ?, version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
		WHERE id = ? AND status = ? AND version = ?`, to, actor, op.ID, op.Status, op.Version)
	if err != nil {
		return err
	}
	if err := mustAffect(res, 1); err != nil {
		return fmt.Errorf("%w: %w", ErrStale, err)
	}
	return nil
}

// setOperationStatus is the guarded operation write (status AND version, I6).
func setOperationStatus(ctx context.Context, tx *sqlx.Tx, op domain.Operation, to domain.OpStatus) error {
	res, err := tx.ExecContext(ctx, `UPDATE operation SET status = ?, version = version + 1, updated_at = CURRENT_TIMESTAMP(6)
		WHERE id = ? AND status = ? AND version = ?`, to, op.ID, op.Status, op.Version)
	if err != nil {
		return err
	}
	if err := mustAffect(res, 1); err != nil {
		return fmt.Errorf("%w: %w", ErrStale, err)
	}
	return nil
}

// admitTx inserts the operation into its repository's waiting set (I4) inside the
// caller's transaction, so the status change and the admission commit together. A
// duplicate is "already admitted": ON DUPLICATE KEY turns it into a no-op without the
// 1062 (whose shared lock would linger to the end of the transaction). attempt keeps
// the admitted event of each retry distinct. The row's lane is the operation's priority.
func admitTx(ctx context.Context, tx *sqlx.Tx, operationID, repo string, prio domain.Priority, attempt int, why string) error {
	return admitTxBy(ctx, tx, operationID, repo, prio, attempt, why, "")
}

// admitTxBy is admitTx whose admitted event names the principal that caused it.
func admitTxBy(ctx context.Context, tx *sqlx.Tx, operationID, repo string, prio domain.Priority, attempt int, why, actor string) error {
	res, err := tx.ExecContext(ctx, `INSERT INTO merge_batch_request (operation_id, repo, lane) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE id = id`, operationID, repo, laneOf(prio))
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil // already admitted
	}
	return recordEventBy(ctx, tx, operationID, EventAdmitted, attempt, why, actor)
}

// recordEvent appends an operation event whose dedupe key is derived from the
// operation, the code and the attempt, so re-recording it is a no-op.
func recordEvent(ctx context.Context, tx *sqlx.Tx, operationID, code string, attempt int, detail string) error {
	return recordEventBy(ctx, tx, operationID, code, attempt, detail, "")
}

// recordEventBy is recordEvent naming the principal that caused the event.
func recordEventBy(ctx context.Context, tx *sqlx.Tx, operationID, code string, attempt int, detail, actor string) error {
	key := "op:" + operationID + ":" + code
	if attempt > 0 {
		key += ":" + itoa(int64(attempt))
	}
	_, err := insertEvent(ctx, tx, Event{DedupeKey: key, OperationID: &operationID, Code: code, Detail: detail, Actor: actor})
	return err
}

func insertEvent(ctx context.Context, tx *sqlx.Tx, e Event) (bool, error) {
	if len(e.Detail) > 2048 {
		e.Detail = truncateUTF8(e.Detail, 2048)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO audit_event (dedupe_key, operation_id, batch_id, code, detail, actor)
		VALUES (?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE id = id`,
		e.DedupeKey, e.OperationID, e.BatchID, e.Code, e.Detail, e.Actor)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// BatchOperationIDs returns the member operation ids of several batches (from member
// history), each list sorted — what the batch list of the HTTP API shows. One read per
// chunk of ids through the member primary key.
func (s *Store) BatchOperationIDs(ctx context.Context, batchIDs []int64) (map[int64][]string, error) {
	out := make(map[int64][]string, len(batchIDs))
	const chunk = 500
	for lo := 0; lo < len(batchIDs); lo += chunk {
		ids := batchIDs[lo:min(lo+chunk, len(batchIDs))]
		q, args, err := sqlx.In(`SELECT batch_id, operation_id FROM merge_batch_member
			WHERE batch_id IN (?) ORDER BY batch_id, operation_id`, ids)
		if err != nil {
			return nil, err
		}
		var rows []struct {
			BatchID     int64  `db:"batch_id"`
			OperationID string `db:"operation_id"`
		}
		if err := s.db.SelectContext(ctx, &rows, q, args...); err != nil {
			return nil, translate(err)
		}
		for _, r := range rows {
			out[r.BatchID] = append(out[r.BatchID], r.OperationID)
		}
	}
	return out, nil
}

type actorKey struct{}

// WithActor returns ctx carrying the principal on whose behalf the batch side's store
// methods record events (an operator's settle reaches the store through the scanner,
// whose methods take no principal). Methods that take an actor argument ignore it.
func WithActor(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, actorKey{}, name)
}

// actorOf is the principal WithActor put in ctx ("" for batcherd's own loops).
func actorOf(ctx context.Context) string {
	s, _ := ctx.Value(actorKey{}).(string)
	return s
}
