package store

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// EventBatchRebased is the batch event of a recorded rebase.
const EventBatchRebased = "rebased"

// BatchRecordRebase records the head sha of the batch's MR after GitLab rebased its
// branch onto the target (fast-forward and semi-linear projects), guarded on version
// and an active status, with a batch event naming both shas. Every merge call carries
// the recorded sha, so the rebased head must be on record before a merge is armed
// with it (fencing, as the first record in BatchRecordMR). ErrLostRace when the batch
// moved on.
func (s *Store) BatchRecordRebase(ctx context.Context, id, version int64, oldSHA, newSHA string) (domain.Batch, error) {
	detail := fmt.Sprintf("merge request of batch %d rebased onto its target: head %s → %s", id, oldSHA, newSHA)
	return s.guardedBatchWriteThen(ctx, id, version, "mr_sha = ?", "status IN (1, 4) AND mr_iid IS NOT NULL",
		func(tx *sqlx.Tx) error {
			return recordBatchEvent(ctx, tx, id, EventBatchRebased, EventBatchRebased+":"+newSHA, detail)
		}, newSHA)
}
