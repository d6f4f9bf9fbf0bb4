package store

// Exposes the batch side's fixed queries to the EXPLAIN test (package store_test), so
// it plans exactly the text the store runs.
const (
	QClaimPrecheck   = qClaimPrecheck
	QWaitingRepos    = qWaitingRepos
	QClaimHead       = qClaimHead
	QClaimRead       = qClaimRead
	QBatchWaiting    = qBatchWaiting
	QMemberIDs       = qMemberIDs
	QBatchMembers    = qBatchMembers
	QBatchesDue      = qBatchesDue
	QBatchesTimedOut = qBatchesTimedOut
	QFailedWithMR    = qFailedWithMR
	QWaitingStats    = qWaitingStats
	QCleanupWaiting  = qCleanupWaiting
)
