// Package wire holds the JSON objects of the HTTP API (api/openapi.yaml describes
// them): the server (internal/api) renders them and the test client (internal/harness)
// reads them, so the two cannot drift apart. Absent values are null, never omitted, so
// clients see the same keys on every object. Times are RFC 3339 in UTC.
//
// It holds data only; it imports nothing of batcherd's.
package wire

// Error is the {"code","message"} of an error answer or of an object's error.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Operation is an operation object.
type Operation struct {
	ID        string  `json:"id"`
	Subject   string  `json:"subject"`
	Target    string  `json:"target"`
	Repo      string  `json:"repo"`
	Action    string  `json:"action"`
	Status    string  `json:"status"`
	Priority  string  `json:"priority"` // normal or urgent
	BatchID   *int64  `json:"batch_id"`
	MRURL     *string `json:"mr_url"`
	Error     *Error  `json:"error"`
	ExpiresAt *string `json:"expires_at"`
	// Principals: who applied and who approved ("auto" when BATCHERD_AUTO_APPROVE or
	// expiry did); null when nobody is recorded.
	RequestedBy *string `json:"requested_by"`
	ApprovedBy  *string `json:"approved_by"`
	CreatedAt   string  `json:"created_at"`
	UpdatedAt   string  `json:"updated_at"`
}

// Binding is a binding object.
type Binding struct {
	Subject     string  `json:"subject"`
	Target      string  `json:"target"`
	Repo        string  `json:"repo"`
	Status      string  `json:"status"`
	OperationID string  `json:"operation_id"`
	ExpiresAt   *string `json:"expires_at"`
	CreatedAt   string  `json:"created_at"`
	UpdatedAt   string  `json:"updated_at"`
}

// Batch is a batch object.
type Batch struct {
	ID           int64    `json:"id"`
	Repo         string   `json:"repo"`
	Status       string   `json:"status"`
	Size         int      `json:"size"`
	SourceBranch string   `json:"source_branch"`
	MRIID        *int64   `json:"mr_iid"`
	MRURL        *string  `json:"mr_url"`
	Error        *Error   `json:"error"`
	OperationIDs []string `json:"operation_ids"`
	CreatedAt    string   `json:"created_at"`
	UpdatedAt    string   `json:"updated_at"`
	FinishedAt   *string  `json:"finished_at"`
	// Failure isolation: why this round exists (first_try, retry_<class>, bisect), the
	// failed batch it retries or bisects, and the bisection depth.
	Kind     string `json:"kind"`
	ParentID *int64 `json:"parent_id"`
	Depth    int    `json:"depth"`
}

// Event is one entry of an operation's event log.
type Event struct {
	ID      int64  `json:"id"`
	Code    string `json:"code"`
	Detail  string `json:"detail"`
	BatchID *int64 `json:"batch_id"`
	// Actor is the principal that caused the event; null for batcherd's own loops.
	Actor     *string `json:"actor"`
	CreatedAt string  `json:"created_at"`
}

// Repo is a repository object (GET /v1/repos, and the pause and resume answers). gitlab
// and drift are null until the server knows them.
type Repo struct {
	Repo            string  `json:"repo"`
	Paused          bool    `json:"paused"`
	PauseReason     *string `json:"pause_reason"`
	PausedUntil     *string `json:"paused_until"`
	PausedBy        *string `json:"paused_by"`
	PausedAt        *string `json:"paused_at"`
	Waiting         int64   `json:"waiting"`
	OldestWaitingAt *string `json:"oldest_waiting_at"`
	ActiveBatchID   *int64  `json:"active_batch_id"`
	GitLab          *string `json:"gitlab"`
	Drift           any     `json:"drift"`
}

// RoundResult is the answer of POST /v1/admin/rounds.
type RoundResult struct {
	Outcome string `json:"outcome"`
	BatchID *int64 `json:"batch_id,omitempty"`
}

// Drift is the result of a repository's last drift check.
type Drift struct {
	Unexpected int    `json:"unexpected"`
	Missing    int    `json:"missing"`
	Modified   int    `json:"modified"`
	CheckedAt  string `json:"checked_at"`
}
