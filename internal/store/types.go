package store

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// BatchStatus is merge_batch.status. The numeric values are part of the schema
// contract (DESIGN §3) and of the active_slot generated expression: 1 and 4 hold the slot.
type BatchStatus int8

const (
	BatchRunning   BatchStatus = 1
	BatchSucceeded BatchStatus = 2
	BatchFailed    BatchStatus = 3
	BatchBlocked   BatchStatus = 4
)

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

// Active reports whether a batch in this status holds its repository's slot.
func (s BatchStatus) Active() bool { return s == BatchRunning || s == BatchBlocked }

// ParseBatchStatus maps an API name back to a status.
func ParseBatchStatus(s string) (BatchStatus, bool) {
	for _, st := range []BatchStatus{BatchRunning, BatchSucceeded, BatchFailed, BatchBlocked} {
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
)

// LiveOpStatuses are the statuses an operation leaves: how many are in them is bounded
// by the work in flight. FinishedOpStatuses are where operations end (failed can be
// retried, but stays until then); their counts grow with history.
var (
	LiveOpStatuses     = []OpStatus{OpPendingApproval, OpQueued, OpInBatch}
	FinishedOpStatuses = []OpStatus{OpMerged, OpFailed, OpRejected}
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

// Reappliable reports whether a new application may reset this binding in place (I5).
// A failed binding is deliberately not re-appliable: overwriting it would orphan its recovery.
func (s BindingStatus) Reappliable() bool { return s == BindingRejected || s == BindingClosed }

// Action is what an operation does to its binding's file.
type Action string

const (
	ActionGrant  Action = "grant"
	ActionRevoke Action = "revoke"
)

// Operation is one application (one row of `operation`).
type Operation struct {
	ID           int64           `db:"id" json:"-"`
	OperationID  string          `db:"operation_id" json:"id"`
	Subject      string          `db:"subject" json:"subject"`
	Target       string          `db:"target" json:"target"`
	Repo         string          `db:"repo" json:"repo"`
	Action       Action          `db:"action" json:"action"`
	Status       OpStatus        `db:"status" json:"status"`
	Version      int64           `db:"version" json:"-"`
	ExpiresAt    *time.Time      `db:"expires_at" json:"expires_at"`
	Attributes   json.RawMessage `db:"attributes" json:"attributes,omitempty"`
	BatchID      *int64          `db:"batch_id" json:"batch_id"`
	Attempts     int             `db:"attempts" json:"-"`
	ErrorCode    string          `db:"error_code" json:"-"`
	ErrorMessage string          `db:"error_message" json:"-"`
	CreatedAt    time.Time       `db:"created_at" json:"created_at"`
	UpdatedAt    time.Time       `db:"updated_at" json:"updated_at"`
}

// Batch is one round for one repository (one row of `merge_batch`).
type Batch struct {
	ID           int64       `db:"id"`
	Repo         string      `db:"repo"`
	Status       BatchStatus `db:"status"`
	Version      int64       `db:"version"`
	Size         int         `db:"size"`
	SourceBranch string      `db:"source_branch"`
	MRIID        *int64      `db:"mr_iid"`
	MRURL        string      `db:"mr_url"`
	MRSHA        string      `db:"mr_sha"`
	NextCheckAt  time.Time   `db:"next_check_at"`
	ErrorCode    string      `db:"error_code"`
	ErrorMessage string      `db:"error_message"`
	CreatedAt    time.Time   `db:"created_at"`
	UpdatedAt    time.Time   `db:"updated_at"`
	FinishedAt   *time.Time  `db:"finished_at"`
	// Failure isolation (migration 00002): the claim group this batch took, its kind
	// (first_try, retry_<class>, bisect), the failed batch it retries or bisects, the
	// bisection depth, and the failure class batcherd recorded before closing its MR.
	Kind      string `db:"kind"`
	Grp       string `db:"grp"`
	ParentID  *int64 `db:"parent_id"`
	Depth     int    `db:"depth"`
	FailClass string `db:"fail_class"`
	// OperationIDs is filled by BatchGet from the member history, sorted.
	OperationIDs []string `db:"-"`
}

// Binding is the current state of one (subject, target) relation.
type Binding struct {
	ID          int64         `db:"id"`
	Subject     string        `db:"subject"`
	Target      string        `db:"target"`
	Repo        string        `db:"repo"`
	Status      BindingStatus `db:"status"`
	OperationID string        `db:"operation_id"`
	ExpiresAt   *time.Time    `db:"expires_at"`
	Version     int64         `db:"version"`
	CreatedAt   time.Time     `db:"created_at"`
	UpdatedAt   time.Time     `db:"updated_at"`
}

// Event is one append-only audit/explanation row.
type Event struct {
	ID          int64     `db:"id"`
	DedupeKey   string    `db:"dedupe_key"`
	OperationID *string   `db:"operation_id"`
	BatchID     *int64    `db:"batch_id"`
	Code        string    `db:"code"`
	Detail      string    `db:"detail"`
	CreatedAt   time.Time `db:"created_at"`
}

// BranchName is the deterministic source branch of a batch. Every publish step is
// idempotent by it, and settle failure finds the batch's MR through it even when none
// is recorded yet.
func BranchName(batchID int64) string { return branchPrefix + itoa(batchID) }

const branchPrefix = "batcherd/batch-"

// BatchIDFromBranch returns the batch id of a batcherd branch, only when the branch is
// exactly what BranchName makes for that id (no leading zeros, no suffix).
func BatchIDFromBranch(branch string) (int64, bool) {
	rest, ok := strings.CutPrefix(branch, branchPrefix)
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || id <= 0 || BranchName(id) != branch {
		return 0, false
	}
	return id, true
}
