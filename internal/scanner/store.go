package scanner

import (
	"context"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

// Store is what the loops need from the database; *store.Store satisfies it. Declared
// here, where it is used, so a reader sees the whole surface the scanner depends on,
// and every method is one store transaction (I7: never called with a GitLab call in
// flight inside it).
type Store interface {
	// claim
	BatchClaim(ctx context.Context, repo string, max int) (store.ClaimResult, error)
	BatchClaimFollowUp(ctx context.Context, repo string, max int) (store.ClaimResult, error)

	// reads and reservations
	BatchGet(ctx context.Context, id int64) (domain.Batch, error)
	BatchMembers(ctx context.Context, batchID int64) ([]domain.Operation, error)
	BatchMemberReasons(ctx context.Context, batchID int64) (map[string]string, error)
	BatchWaitingMembers(ctx context.Context, batchID int64) ([]store.WaitingMember, error)
	BatchMergeLatencies(ctx context.Context, batchID int64) ([]float64, error)
	BatchPublishing(ctx context.Context, id int64) (bool, error)
	BatchReserve(ctx context.Context, id, version int64, lease time.Duration) (domain.Batch, error)
	BatchMarkDue(ctx context.Context, id int64) error
	BatchesDue(ctx context.Context, limit int) ([]domain.Batch, error)
	BatchesTimedOut(ctx context.Context, timeout time.Duration, limit int) ([]domain.Batch, error)
	BatchesFailedRecently(ctx context.Context, within time.Duration, after store.FailedCursor, limit int) ([]domain.Batch, error)

	// guarded batch writes and settlements
	BatchRecordMR(ctx context.Context, id, version int64, mr store.MRRecord) (domain.Batch, error)
	BatchRecordMRFailed(ctx context.Context, id, version int64, mr store.MRRecord) (domain.Batch, error)
	BatchBlock(ctx context.Context, id, version int64, code, message string) (domain.Batch, error)
	BatchUnblock(ctx context.Context, id, version int64) (domain.Batch, error)
	BatchRecordRebase(ctx context.Context, id, version int64, oldSHA, newSHA string) (domain.Batch, error)
	BatchMarkFailing(ctx context.Context, id, version int64, class domain.FailureClass) (domain.Batch, error)
	BatchSettleSucceeded(ctx context.Context, id int64, from domain.BatchStatus, version int64) (domain.Batch, error)
	BatchSettleUnchanged(ctx context.Context, id, version int64) (domain.Batch, error)
	SearchResume(ctx context.Context, repo string, merged domain.SearchGroup) (int64, error)
	BatchSettleIsolate(ctx context.Context, id int64, from domain.BatchStatus, version int64, class domain.FailureClass, message string, plan []store.MemberFate, d store.Deferral) (domain.Batch, error)

	// expiry, cleanup, audit
	BindingsExpired(ctx context.Context, limit int) ([]domain.Binding, error)
	BindingExpire(ctx context.Context, b domain.Binding, operationID string) (domain.Operation, error)
	CleanupIdempotency(ctx context.Context, chunk int) (int64, error)
	CleanupWaiting(ctx context.Context, olderThan time.Duration, chunk int) (int64, error)
	EventRecord(ctx context.Context, e store.Event) (bool, error)

	// events (outbox.go)
	OutboxDue(ctx context.Context, receivers []int64, limit int) ([]store.OutboxRow, error)
	OutboxReserve(ctx context.Context, r store.OutboxRow, lease time.Duration) error
	OutboxDelivered(ctx context.Context, id int64) (bool, error)
	OutboxRetryAt(ctx context.Context, r store.OutboxRow, after time.Duration, why string) error
	OutboxPurge(ctx context.Context, olderThan time.Duration, chunk int) (int64, error)
	OutboxStats(ctx context.Context) ([]store.OutboxReceiverStats, error)

	// installation identity: names this installation's branches (orphans)
	Installation(ctx context.Context) (string, error)

	// repository state: GitLab access (access.go)
	RepoGitLabStateSet(ctx context.Context, repo, state, detail string) error
	// drift (drift.go)
	BindingFiles(ctx context.Context, repo string) ([]store.BindingFile, error)
	RepoDriftReserve(ctx context.Context, repo string, interval time.Duration) (bool, error)
	RepoDriftRecord(ctx context.Context, repo string, c store.DriftCounts) error
}

var _ Store = (*store.Store)(nil)
