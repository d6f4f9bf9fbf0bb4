package domain

import (
	"encoding/json"
	"time"
)

// The entities. The db tags name the columns store scans them from; they are the only
// trace of persistence here, kept so that store needs no second copy of each type.
// The HTTP API renders its own wire objects, so there are no JSON tags.

// Operation is one application (one row of `operation`).
type Operation struct {
	ID           int64           `db:"id"`
	OperationID  string          `db:"operation_id"`
	Subject      string          `db:"subject"`
	Target       string          `db:"target"`
	Repo         string          `db:"repo"`
	Action       Action          `db:"action"`
	Status       OpStatus        `db:"status"`
	Priority     Priority        `db:"priority"`
	Version      int64           `db:"version"`
	ExpiresAt    *time.Time      `db:"expires_at"`
	Attributes   json.RawMessage `db:"attributes"`
	BatchID      *int64          `db:"batch_id"`
	Attempts     int             `db:"attempts"`
	ErrorCode    string          `db:"error_code"`
	ErrorMessage string          `db:"error_message"`
	CreatedAt    time.Time       `db:"created_at"`
	UpdatedAt    time.Time       `db:"updated_at"`
	// Principals (migration 00006): who applied, approved (auto for
	// BATCHERD_AUTO_APPROVE and expiry), rejected, withdrew and last retried the
	// operation; "" = nobody recorded.
	RequestedBy string `db:"requested_by"`
	ApprovedBy  string `db:"approved_by"`
	RejectedBy  string `db:"rejected_by"`
	WithdrawnBy string `db:"withdrawn_by"`
	RetriedBy   string `db:"retried_by"`
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
	// Failure isolation: the claim group this batch took, its kind (KindFirstTry,
	// KindRetryPrefix+class, KindBisect), the failed batch it retries or bisects, the
	// bisection depth, and the failure class batcherd recorded before closing its MR.
	Kind      string       `db:"kind"`
	Grp       string       `db:"grp"`
	ParentID  *int64       `db:"parent_id"`
	Depth     int          `db:"depth"`
	FailClass FailureClass `db:"fail_class"`
	// OperationIDs is the member history, sorted (filled by store.BatchGet).
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

// Claim group kinds (merge_batch_request.kind, merge_batch.kind): why a round exists.
const (
	KindFirstTry = "first_try"
	KindBisect   = "bisect"
	// KindRetryPrefix + failure class, e.g. retry_infra: the same members again.
	KindRetryPrefix = "retry_"
)
