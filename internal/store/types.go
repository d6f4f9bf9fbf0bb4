package store

import (
	"time"

	"github.com/batcherd/batcherd/internal/domain"
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
func laneOf(p domain.Priority) int {
	if p == domain.PriorityUrgent {
		return 0
	}
	return 1
}
