package store

// The transactional outbox of events (README.md, "Events"). Every state
// change that reports an event writes its rows in the transaction of the change — one
// more statement, one row per event and configured receiver — so the event commits
// with the change or not at all; the dispatcher loop (internal/scanner/outbox.go)
// delivers the rows later, outside any transaction. No receiver configured, no rows.

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// Event types a receiver is sent (the contract's list; README "Events").
const (
	EventTypeOperationQueued    = "operation.queued"
	EventTypeOperationMerged    = "operation.merged"
	EventTypeOperationFailed    = "operation.failed"
	EventTypeOperationRejected  = "operation.rejected"
	EventTypeOperationWithdrawn = "operation.withdrawn"
	EventTypeBatchOpened        = "batch.opened"
	EventTypeBatchSucceeded     = "batch.succeeded"
	EventTypeBatchFailed        = "batch.failed"
)

// SetEventReceivers sets the receivers (their identities, domain.EventReceiver.ID)
// each event is written for; none writes no event rows. Call it before serving
// (Options.EventReceivers does the same at Open).
func (s *Store) SetEventReceivers(ids []int64) {
	c := slices.Clone(ids)
	s.receivers.Store(&c)
}

// EventReceivers is what SetEventReceivers set.
func (s *Store) EventReceivers() []int64 {
	if p := s.receivers.Load(); p != nil {
		return *p
	}
	return nil
}

// EventOperation is the body's "operation" object: the operation as the change left it.
type EventOperation struct {
	ID           string `json:"id"`
	Subject      string `json:"subject"`
	Target       string `json:"target"`
	Repo         string `json:"repo"`
	Action       string `json:"action"`
	Status       string `json:"status"`
	BatchID      *int64 `json:"batch_id,omitempty"`
	ErrorCode    string `json:"error_code,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
}

// EventBatch is the body's "batch" object: the batch as the change left it.
type EventBatch struct {
	ID           int64  `json:"id"`
	Repo         string `json:"repo"`
	Status       string `json:"status"`
	Size         int    `json:"size"`
	MRURL        string `json:"mr_url,omitempty"`
	ErrorCode    string `json:"error_code,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
}

// outEvent is one event to write: its type, its delivery-order key and the body's
// objects, marshalled once at the change.
type outEvent struct {
	typ, orderKey string
	op, batch     []byte
}

func opEvent(typ string, o EventOperation) outEvent {
	b, _ := json.Marshal(o) // plain strings and numbers: cannot fail
	return outEvent{typ: typ, orderKey: o.ID, op: b}
}

func batchEvent(typ string, b domain.Batch) outEvent {
	j, _ := json.Marshal(EventBatch{ID: b.ID, Repo: b.Repo, Status: b.Status.String(), Size: b.Size,
		MRURL: b.MRURL, ErrorCode: b.ErrorCode, ErrorMessage: b.ErrorMessage})
	return outEvent{typ: typ, orderKey: "batch:" + itoa(b.ID), batch: j}
}

// eventOfOperation is an operation event carrying the operation row as read.
func eventOfOperation(typ string, op domain.Operation) outEvent {
	return opEvent(typ, EventOperation{ID: op.OperationID, Subject: op.Subject, Target: op.Target, Repo: op.Repo,
		Action: string(op.Action), Status: string(op.Status), BatchID: op.BatchID,
		ErrorCode: op.ErrorCode, ErrorMessage: op.ErrorMessage})
}

// outboxRowSQL is one row's VALUES tuple and its argument count.
const (
	outboxRowSQL  = "(?, ?, ?, ?, ?, ?)"
	outboxPerRow  = 6
	outboxColumns = "INSERT INTO event_outbox (receiver, event_id, type, order_key, operation_json, batch_json) VALUES "
)

// outboxArgs appends evs' rows for receivers to args: one event id per event, the
// same for every receiver.
func outboxArgs(args []any, evs []outEvent, receivers []int64) []any {
	for _, e := range evs {
		id := uuid.NewString()
		for _, r := range receivers {
			args = append(args, r, id, e.typ, e.orderKey, nullBytes(e.op), nullBytes(e.batch))
		}
	}
	return args
}

func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// writeOutbox writes evs (for every configured receiver) inside the caller's
// transaction, in as few multi-row statements as the placeholder limit allows (one in
// every common case). No receivers, no statement.
func (s *Store) writeOutbox(ctx context.Context, tx *sqlx.Tx, evs []outEvent) error {
	rs := s.EventReceivers()
	n := len(rs)
	if n == 0 || len(evs) == 0 {
		return nil
	}
	per := max(maxInPlaceholders/(outboxPerRow*n), 1)
	return forChunks(len(evs), per, func(lo, hi int) error {
		args := outboxArgs(make([]any, 0, outboxPerRow*n*(hi-lo)), evs[lo:hi], rs)
		_, err := tx.ExecContext(ctx, outboxColumns+values(outboxRowSQL, n*(hi-lo)), args...)
		return err
	})
}

// outboxStmt is writeOutbox as one statement of the admission group (admit_group.go).
func outboxStmt(evs []outEvent, receivers []int64) []admitStmt {
	n := len(receivers)
	if n == 0 || len(evs) == 0 {
		return nil
	}
	args := outboxArgs(make([]any, 0, outboxPerRow*n*len(evs)), evs, receivers)
	return []admitStmt{{outboxColumns + values(outboxRowSQL, n*len(evs)), args, int64(n * len(evs)), true}}
}

// operationWithdrawnEvent writes the operation.withdrawn event of op (as the withdraw
// left it) inside the withdraw's own transaction (withdraw.go), after its guarded
// operation write, like every other change here does.
func (s *Store) operationWithdrawnEvent(ctx context.Context, tx *sqlx.Tx, op domain.Operation) error {
	return s.writeOutbox(ctx, tx, []outEvent{eventOfOperation(EventTypeOperationWithdrawn, op)})
}

// OutboxRow is one undelivered event for one receiver, as the dispatcher reads it.
type OutboxRow struct {
	ID            int64     `db:"id"`
	Receiver      int64     `db:"receiver"`
	EventID       string    `db:"event_id"`
	Type          string    `db:"type"`
	OrderKey      string    `db:"order_key"`
	OperationJSON *string   `db:"operation_json"`
	BatchJSON     *string   `db:"batch_json"`
	CreatedAt     time.Time `db:"created_at"`
	Attempts      int       `db:"attempts"`
}

// Body is the event's JSON body, {"id","type","occurred_at","operation"?,"batch"?}: a
// pure function of the row, so every retry (and every replica) sends the same bytes and
// the same signature.
func (r OutboxRow) Body() []byte {
	var body struct {
		ID         string          `json:"id"`
		Type       string          `json:"type"`
		OccurredAt string          `json:"occurred_at"`
		Operation  json.RawMessage `json:"operation,omitempty"`
		Batch      json.RawMessage `json:"batch,omitempty"`
	}
	body.ID, body.Type = r.EventID, r.Type
	body.OccurredAt = r.CreatedAt.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	if r.OperationJSON != nil {
		body.Operation = json.RawMessage(*r.OperationJSON)
	}
	if r.BatchJSON != nil {
		body.Batch = json.RawMessage(*r.BatchJSON)
	}
	b, _ := json.Marshal(body)
	return b
}

// qOutboxDue reads due rows through idx_due in index order (no sort) and checks each
// for an earlier undelivered row of its order key through idx_order (EXPLAIN-tested),
// for n receivers.
func qOutboxDue(n int) string {
	return `SELECT o.id, o.receiver, o.event_id, o.type, o.order_key,
		       o.operation_json, o.batch_json, o.created_at, o.attempts
		  FROM event_outbox o
		 WHERE o.delivered_at IS NULL AND o.next_attempt_at <= CURRENT_TIMESTAMP(6) AND o.receiver IN (` + inPlaceholders(n) + `)
		   AND NOT EXISTS (SELECT 1 FROM event_outbox p
		                    WHERE p.order_key = o.order_key AND p.receiver = o.receiver
		                      AND p.delivered_at IS NULL AND p.id < o.id)
		 ORDER BY o.next_attempt_at, o.id LIMIT ?`
}

// OutboxDue returns up to limit undelivered rows for the given receivers whose next
// attempt is due, each the earliest undelivered row of its order key for its receiver
// (one operation's events go out in order: event n+1 is not even read while event n
// waits). Rows of receivers not asked for are never read: a replica delivers only to
// the receivers it is configured with. A plain read: OutboxReserve decides who delivers.
func (s *Store) OutboxDue(ctx context.Context, receivers []int64, limit int) ([]OutboxRow, error) {
	if len(receivers) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(receivers)+1)
	for _, r := range receivers {
		args = append(args, r)
	}
	var rows []OutboxRow
	err := s.db.SelectContext(ctx, &rows, qOutboxDue(len(receivers)), append(args, limit)...)
	return rows, translate(err)
}

// OutboxReserve takes row r for one delivery attempt: a guarded UPDATE on the attempts
// read (the row's version) that counts the attempt and pushes next_attempt_at lease
// into the future, so no other replica takes it meanwhile; a replica that dies holding
// it leaves it to whoever comes after the lease. ErrLostRace when another was first.
func (s *Store) OutboxReserve(ctx context.Context, r OutboxRow, lease time.Duration) error {
	res, err := s.exec1(ctx, `UPDATE event_outbox SET attempts = attempts + 1,
		       next_attempt_at = CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND
		 WHERE id = ? AND attempts = ? AND delivered_at IS NULL AND next_attempt_at <= CURRENT_TIMESTAMP(6)`,
		micros(lease), r.ID, r.Attempts)
	if err != nil {
		return err
	}
	return translate(mustAffect(res, 1))
}

// OutboxDelivered records a 2xx for row id. Not guarded on the attempt: a delivery
// is a fact whoever holds the row now (a retry after it is a duplicate the receiver
// drops by id). False when it was already recorded.
func (s *Store) OutboxDelivered(ctx context.Context, id int64) (bool, error) {
	res, err := s.exec1(ctx, `UPDATE event_outbox SET delivered_at = CURRENT_TIMESTAMP(6), last_error = ''
		 WHERE id = ? AND delivered_at IS NULL`, id)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, translate(err)
}

// OutboxRetryAt records a failed attempt of row r (reserved at attempts r.Attempts+1)
// and when to try again. Guarded on that attempt, so a late replica whose lease ran
// out does not move the next try of the one that took the row after it.
func (s *Store) OutboxRetryAt(ctx context.Context, r OutboxRow, after time.Duration, why string) error {
	res, err := s.exec1(ctx, `UPDATE event_outbox SET last_error = ?,
		       next_attempt_at = CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND
		 WHERE id = ? AND attempts = ? AND delivered_at IS NULL`,
		truncRunes(why, 255), micros(after), r.ID, r.Attempts+1)
	if err != nil {
		return err
	}
	return translate(mustAffect(res, 1))
}

// OutboxPurge deletes up to chunk rows delivered more than olderThan ago (DB clock) and
// returns how many; callers loop while it returns chunk.
func (s *Store) OutboxPurge(ctx context.Context, olderThan time.Duration, chunk int) (int64, error) {
	res, err := s.exec1(ctx, `DELETE FROM event_outbox
		 WHERE delivered_at IS NOT NULL AND delivered_at <= CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		 LIMIT ?`, micros(olderThan), chunk)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return n, translate(err)
}

// OutboxReceiverStats is the undelivered backlog of one receiver.
type OutboxReceiverStats struct {
	Receiver  int64   `db:"receiver"`
	Depth     int64   `db:"depth"`
	OldestAge float64 `db:"oldest_age"` // seconds since the oldest undelivered event (DB clock)
}

// OutboxStats reads the undelivered backlog per receiver (index range delivered_at IS
// NULL: the backlog only, never the delivered history).
func (s *Store) OutboxStats(ctx context.Context) ([]OutboxReceiverStats, error) {
	var out []OutboxReceiverStats
	err := s.db.SelectContext(ctx, &out, `SELECT receiver, COUNT(*) AS depth,
		       TIMESTAMPDIFF(MICROSECOND, MIN(created_at), CURRENT_TIMESTAMP(6)) / 1e6 AS oldest_age
		  FROM event_outbox WHERE delivered_at IS NULL GROUP BY receiver ORDER BY receiver`)
	return out, translate(err)
}

// eventsOfSettled are the operation events of settled members: each as moved to status
// in batch b, with its error when failed.
func eventsOfSettled(typ string, b domain.Batch, ops []settledOp, status domain.OpStatus, code, message string) []outEvent {
	evs := make([]outEvent, len(ops))
	for i, o := range ops {
		id := b.ID
		evs[i] = opEvent(typ, EventOperation{ID: o.OperationID, Subject: o.Subject, Target: o.Target, Repo: b.Repo,
			Action: string(o.Action), Status: string(status), BatchID: &id, ErrorCode: code, ErrorMessage: message})
	}
	return evs
}
