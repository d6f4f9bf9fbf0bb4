package store

// Withdrawal (issue #17): an operation not yet claimed leaves the queue.

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// ErrInBatch: the operation was claimed by a batch (in_batch, or later merged or
// failed), so it can no longer be withdrawn (HTTP 409 in_batch).
var ErrInBatch = errors.New("in batch")

// EventWithdrawn is the audit code of a withdrawal.
const EventWithdrawn = "withdrawn"

// OperationWithdraw takes an operation in pending_approval or queued out of the queue,
// by principal by (withdrawn_by, and the event's actor): status withdrawn, its waiting row deleted, its binding back to what the repository
// holds (a grant's binding closed — no file, re-appliable; a revoke's binding active
// again — the file stays), so a new application of the relation is accepted. A repeat
// returns the withdrawn operation. ErrInBatch once a batch claimed it; ErrStale when it
// was rejected or no longer owns its binding; ErrNotFound when unknown.
//
// A withdrawal racing a claim is settled by the waiting row, which both write with a
// guard on batch_id IS NULL, in the same lock order (waiting row, then operation, then
// binding): the withdrawal deletes the row only while no batch holds it, and the claim
// claims only rows still unclaimed, with its affected-row check (I2). Exactly one of
// them writes the row; the other sees it gone or taken — the claim rolls back as
// preempted and its next round no longer reads the operation, the withdrawal answers
// ErrInBatch. A withdrawal that loses a race to anything else (an approval moving the
// operation on between its read and its write) looks again, a few times.
func (s *Store) OperationWithdraw(ctx context.Context, operationID, by string) (domain.Operation, error) {
	for attempt := 0; ; attempt++ {
		op, err := s.operationWithdrawTx(ctx, operationID, by)
		if errors.Is(err, ErrLostRace) && attempt < 4 {
			continue
		}
		return op, err
	}
}

func (s *Store) operationWithdrawTx(ctx context.Context, operationID, by string) (domain.Operation, error) {
	var out domain.Operation
	err := s.withTx(ctx, opIso, func(tx *sqlx.Tx) error {
		// Plain read: every decision below is a guarded write on what was read.
		op, err := operationByID(ctx, tx, operationID, false)
		if err != nil {
			return err
		}
		switch op.Status {
		case domain.OpWithdrawn:
			out = op
			return nil
		case domain.OpPendingApproval:
		case domain.OpQueued:
			// The waiting row first (the claim's lock order), and only while unclaimed.
			res, err := tx.ExecContext(ctx, `DELETE FROM merge_batch_request
				WHERE operation_id = ? AND batch_id IS NULL`, op.OperationID)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n != 1 {
				// A claim took it (committed: the DELETE waited for its lock and then saw
				// the row claimed), or the operation moved on since the read.
				return ErrLostRace
			}
		case domain.OpInBatch, domain.OpMerged, domain.OpFailed:
			return fmt.Errorf("%w: operation is %s", ErrInBatch, op.Status)
		default:
			return fmt.Errorf("%w: operation is %s", ErrStale, op.Status)
		}
		// The operation, guarded on the status and version read (I6): a claim that
		// committed between the read and here has moved it to in_batch.
		if err := setOperationStatusBy(ctx, tx, op, domain.OpWithdrawn, "withdrawn_by", by); err != nil {
			return ErrLostRace
		}
		b, _, err := bindingBySubjectTarget(ctx, tx, op.Subject, op.Target, true)
		if err != nil {
			return err
		}
		// What the repository holds: nothing for a grant that never merged (closed is
		// the re-appliable state that says so), the file for a revoke that never merged.
		to := domain.BindingClosed
		if op.Action == domain.ActionRevoke {
			to = domain.BindingActive
		}
		if err := guardBindingOwned(ctx, tx, op, b, pendingBindingStatus(op.Action), to); err != nil {
			return err
		}
		if err := recordEventBy(ctx, tx, op.OperationID, EventWithdrawn, 0, "withdrawn from "+string(op.Status), by); err != nil {
			return err
		}
		if out, err = operationByID(ctx, tx, operationID, false); err != nil {
			return err
		}
		return s.operationWithdrawnEvent(ctx, tx, out)
	})
	if errors.Is(err, ErrLostRace) {
		// Read again to answer from the state that won, when it is final for us.
		op, gerr := s.OperationGet(ctx, operationID)
		if gerr == nil {
			switch op.Status {
			case domain.OpInBatch, domain.OpMerged, domain.OpFailed:
				return domain.Operation{}, fmt.Errorf("%w: operation is %s", ErrInBatch, op.Status)
			case domain.OpWithdrawn:
				return op, nil
			}
		}
	}
	return out, err
}
