package domain

// The state machines as data. Each table lists every status change the code makes
// and the step that makes it; a From of "" (or 0) is the row being created. The store
// writes each of them as a guarded UPDATE on the From status and the version read (I6);
// docs/ARCHITECTURE.md draws the same tables, and transitions_test.go checks the
// README's state lines against them.

// Transition is one allowed status change of an entity whose status type is S.
type Transition[S comparable] struct {
	From, To S
	// By names the step that makes it (for readers, logs and the architecture doc).
	By string
}

// OpTransitions: operation.status.
var OpTransitions = []Transition[OpStatus]{
	{"", OpPendingApproval, "create"},
	{"", OpQueued, "create with auto-approve, or the expiry loop's revoke"},
	{OpPendingApproval, OpQueued, "approve"},
	{OpPendingApproval, OpRejected, "reject"},
	{OpPendingApproval, OpWithdrawn, "withdraw"},
	{OpQueued, OpWithdrawn, "withdraw (the waiting row goes in the same transaction)"},
	{OpQueued, OpInBatch, "claim"},
	{OpInBatch, OpMerged, "settle success"},
	{OpInBatch, OpFailed, "settle failure: failed, culprit or max_attempts"},
	{OpInBatch, OpQueued, "settle failure: retry or bisection half (requeued)"},
	{OpFailed, OpQueued, "operator retry"},
	{OpFailed, OpMerged, "merged wins: the MR of a failed batch merged after all"},
}

// BatchTransitions: merge_batch.status. RUNNING and BLOCKED hold the slot (I1).
var BatchTransitions = []Transition[BatchStatus]{
	{0, BatchRunning, "claim"},
	{BatchRunning, BatchBlocked, "reconcile with the block failure mode"},
	{BatchBlocked, BatchRunning, "reconcile: the blocking pipeline or conflict is gone"},
	{BatchRunning, BatchSucceeded, "settle success (MR merged, or the batch changes nothing)"},
	{BatchBlocked, BatchSucceeded, "settle success"},
	{BatchRunning, BatchFailed, "settle failure"},
	{BatchBlocked, BatchFailed, "settle failure"},
	{BatchFailed, BatchSucceeded, "merged wins"},
}

// BindingTransitions: binding.status, which says what the repository holds.
var BindingTransitions = []Transition[BindingStatus]{
	{"", BindingPending, "grant created"},
	{BindingRejected, BindingPending, "grant re-applied (I5)"},
	{BindingClosed, BindingPending, "grant re-applied (I5)"},
	{BindingActive, BindingRevoking, "revoke created (by a caller or the expiry loop), or a failed revoke retried"},
	{BindingPending, BindingActive, "grant merged"},
	{BindingPending, BindingFailed, "grant failed (no file)"},
	{BindingPending, BindingRejected, "grant rejected"},
	{BindingPending, BindingClosed, "grant withdrawn (no file)"},
	{BindingRevoking, BindingClosed, "revoke merged"},
	{BindingRevoking, BindingActive, "revoke failed, rejected or withdrawn (the file is still there)"},
	{BindingFailed, BindingPending, "failed grant retried"},
	{BindingFailed, BindingActive, "merged wins for a grant"},
	{BindingActive, BindingClosed, "merged wins for a revoke"},
}

// Allowed reports whether table has the transition from → to.
func Allowed[S comparable](table []Transition[S], from, to S) bool {
	for _, t := range table {
		if t.From == from && t.To == to {
			return true
		}
	}
	return false
}
