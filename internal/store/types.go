package store

import (
	"time"

	"github.com/batcherd/batcherd/internal/domain"
)

// The entity types, statuses and naming rules live in internal/domain; store maps rows
// to them. The aliases below keep callers compiling while they move to domain's names;
// they go once nothing uses them (new code uses domain directly).
type (
	BatchStatus   = domain.BatchStatus
	OpStatus      = domain.OpStatus
	BindingStatus = domain.BindingStatus
	Action        = domain.Action
	Operation     = domain.Operation
	Batch         = domain.Batch
	Binding       = domain.Binding
	Priority      = domain.Priority
)

// Deprecated forwarding names: use domain's.
const (
	BatchRunning   = domain.BatchRunning
	BatchSucceeded = domain.BatchSucceeded
	BatchFailed    = domain.BatchFailed
	BatchBlocked   = domain.BatchBlocked

	OpPendingApproval = domain.OpPendingApproval
	OpQueued          = domain.OpQueued
	OpInBatch         = domain.OpInBatch
	OpMerged          = domain.OpMerged
	OpFailed          = domain.OpFailed
	OpRejected        = domain.OpRejected
	OpWithdrawn       = domain.OpWithdrawn

	PriorityNormal = domain.PriorityNormal
	PriorityUrgent = domain.PriorityUrgent

	BindingPending  = domain.BindingPending
	BindingActive   = domain.BindingActive
	BindingRevoking = domain.BindingRevoking
	BindingClosed   = domain.BindingClosed
	BindingRejected = domain.BindingRejected
	BindingFailed   = domain.BindingFailed

	ActionGrant  = domain.ActionGrant
	ActionRevoke = domain.ActionRevoke

	KindFirstTry    = domain.KindFirstTry
	KindBisect      = domain.KindBisect
	KindRetryPrefix = domain.KindRetryPrefix
)

// Deprecated forwarding names: use domain's.
var (
	ParseBatchStatus   = domain.ParseBatchStatus
	LiveOpStatuses     = domain.LiveOpStatuses
	FinishedOpStatuses = domain.FinishedOpStatuses
)

// Event is one append-only audit/explanation row.
type Event struct {
	ID          int64   `db:"id"`
	DedupeKey   string  `db:"dedupe_key"`
	OperationID *string `db:"operation_id"`
	BatchID     *int64  `db:"batch_id"`
	Code        string  `db:"code"`
	Detail      string  `db:"detail"`
	// Actor is the principal that caused the event ("" for batcherd's own loops).
	Actor     string    `db:"actor"`
	CreatedAt time.Time `db:"created_at"`
}

// laneOf is the waiting row's claim order (merge_batch_request.lane) of an operation of
// priority p: urgent rows (0) are claimed before normal ones (1).
func laneOf(p Priority) int {
	if p == PriorityUrgent {
		return 0
	}
	return 1
}
