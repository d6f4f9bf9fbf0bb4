package domain

// BatchStatus is merge_batch.status. The numeric values are part of the schema
// contract (docs/ARCHITECTURE.md, "State machine") and of the active_slot generated
// expression: 1 and 4 hold the slot.
type BatchStatus int8

const (
	BatchRunning   BatchStatus = 1
	BatchSucceeded BatchStatus = 2
	BatchFailed    BatchStatus = 3
	BatchBlocked   BatchStatus = 4
)

// BatchStatuses lists every batch status, in numeric order.
var BatchStatuses = []BatchStatus{BatchRunning, BatchSucceeded, BatchFailed, BatchBlocked}

// String returns the lower-case name used by the HTTP API.
func (s BatchStatus) String() string {
	switch s {
	case BatchRunning:
		return "running"
	case BatchSucceeded:
		return "succeeded"
	case BatchFailed:
		return "failed"
	case BatchBlocked:
		return "blocked"
	}
	return "unknown"
}

// Active reports whether a batch in this status holds its repository's slot (I1).
func (s BatchStatus) Active() bool { return s == BatchRunning || s == BatchBlocked }

// ParseBatchStatus maps an API name back to a status.
func ParseBatchStatus(s string) (BatchStatus, bool) {
	for _, st := range BatchStatuses {
		if st.String() == s {
			return st, true
		}
	}
	return 0, false
}

// OpStatus is operation.status.
type OpStatus string

const (
	OpPendingApproval OpStatus = "pending_approval"
	OpQueued          OpStatus = "queued"
	OpInBatch         OpStatus = "in_batch"
	OpMerged          OpStatus = "merged"
	OpFailed          OpStatus = "failed"
	OpRejected        OpStatus = "rejected"
	// OpWithdrawn: the requester or an admin took the operation back before any batch
	// claimed it (from pending_approval or queued only). Never claimed afterwards.
	OpWithdrawn OpStatus = "withdrawn"
)

// Priority is operation.priority: urgent operations are claimed before normal ones
// and their approval starts a claim round at once.
type Priority string

const (
	PriorityNormal Priority = "normal"
	PriorityUrgent Priority = "urgent"
)

// LiveOpStatuses are the statuses an operation leaves: how many are in them is bounded
// by the work in flight. FinishedOpStatuses are where operations end (failed can be
// retried, but stays until then); their counts grow with history.
var (
	LiveOpStatuses     = []OpStatus{OpPendingApproval, OpQueued, OpInBatch}
	FinishedOpStatuses = []OpStatus{OpMerged, OpFailed, OpRejected, OpWithdrawn}
)

// BindingStatus is binding.status: what the repository holds for a relation.
type BindingStatus string

const (
	BindingPending  BindingStatus = "pending"
	BindingActive   BindingStatus = "active"
	BindingRevoking BindingStatus = "revoking"
	BindingClosed   BindingStatus = "closed"
	BindingRejected BindingStatus = "rejected"
	BindingFailed   BindingStatus = "failed"
)

// BindingStatuses lists every binding status.
var BindingStatuses = []BindingStatus{BindingPending, BindingActive, BindingRevoking, BindingClosed, BindingRejected, BindingFailed}

// Reappliable reports whether a new application may reset this binding in place (I5).
// A failed binding is deliberately not re-appliable: overwriting it would orphan its
// recovery.
func (s BindingStatus) Reappliable() bool { return s == BindingRejected || s == BindingClosed }

// Action is what an operation does to its binding's file.
type Action string

const (
	ActionGrant  Action = "grant"
	ActionRevoke Action = "revoke"
)
