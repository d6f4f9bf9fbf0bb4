package store

import "context"

// Exposes the batch side's fixed queries to the EXPLAIN test (package store_test), so
// it plans exactly the text the store runs.
const (
	QClaimPrecheck   = qClaimPrecheck
	QWaitingRepos    = qWaitingRepos
	QClaimHead       = qClaimHead
	QClaimRead       = qClaimRead
	QClaimPaused     = qClaimPaused
	QBatchWaiting    = qBatchWaiting
	QDeleteBatchWait = qDeleteBatchWaiting
	QMemberIDs       = qMemberIDs
	QBatchMembers    = qBatchMembers
	QBatchesDue      = qBatchesDue
	QBatchesTimedOut = qBatchesTimedOut
	QFailedRecently  = qFailedRecently
	QWaitingStats    = qWaitingStats
	QCleanupWaiting  = qCleanupWaiting
)

// QOutboxDue is the dispatcher's read for n receivers.
func QOutboxDue(n int) string { return qOutboxDue(n) }

// SlotNoWait reports whether claims take the slot with the no-wait INSERT (probing the
// server if not yet done); SetSlotNoWait forces either way, so the tests prove both the
// MariaDB path and the one servers without it take.
// QOperationCounts is the metrics' count of n statuses.
func QOperationCounts(n int) string { return qOperationCounts(n) }

// QBatchList is GET /v1/batches' query for f.
func QBatchList(f BatchFilter) (string, []any) { return qBatchList(f) }

// QMoveBindings is the settle's binding move for n members.
func QMoveBindings(n int) string { return qMoveBindings(n) }

func (s *Store) SlotNoWait() bool { return s.slotNoWait(context.Background()) }

func (s *Store) SetSlotNoWait(on bool) {
	if on {
		s.noWait.Store(1)
	} else {
		s.noWait.Store(2)
	}
}

// WhySQL is the member history's why in SQL (set-based claim), over a claimed waiting row.
const WhySQL = whySQL

// WhyOf is waitingRow.why for a waiting row as the claim read it.
func WhyOf(kind string, parent *int64, depth, half, retries, tries int) string {
	return waitingRow{Kind: kind, ParentID: parent, Depth: depth, Half: half, Retries: retries, Tries: tries}.why()
}
