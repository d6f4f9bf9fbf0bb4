package api

import (
	"time"

	"github.com/batcherd/batcherd/internal/store"
)

// The JSON objects of DESIGN §6. Absent values are null, never omitted, so clients
// see the same keys on every object. Times are RFC 3339 in UTC.

type errorObject struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type operationObject struct {
	ID        string       `json:"id"`
	Subject   string       `json:"subject"`
	Target    string       `json:"target"`
	Repo      string       `json:"repo"`
	Action    string       `json:"action"`
	Status    string       `json:"status"`
	BatchID   *int64       `json:"batch_id"`
	MRURL     *string      `json:"mr_url"`
	Error     *errorObject `json:"error"`
	ExpiresAt *string      `json:"expires_at"`
	CreatedAt string       `json:"created_at"`
	UpdatedAt string       `json:"updated_at"`
}

type bindingObject struct {
	Subject     string  `json:"subject"`
	Target      string  `json:"target"`
	Repo        string  `json:"repo"`
	Status      string  `json:"status"`
	OperationID string  `json:"operation_id"`
	ExpiresAt   *string `json:"expires_at"`
	CreatedAt   string  `json:"created_at"`
	UpdatedAt   string  `json:"updated_at"`
}

type batchObject struct {
	ID           int64        `json:"id"`
	Repo         string       `json:"repo"`
	Status       string       `json:"status"`
	Size         int          `json:"size"`
	SourceBranch string       `json:"source_branch"`
	MRIID        *int64       `json:"mr_iid"`
	MRURL        *string      `json:"mr_url"`
	Error        *errorObject `json:"error"`
	OperationIDs []string     `json:"operation_ids"`
	CreatedAt    string       `json:"created_at"`
	UpdatedAt    string       `json:"updated_at"`
	FinishedAt   *string      `json:"finished_at"`
	// Failure isolation: why this round exists (first_try, retry_<class>, bisect), the
	// failed batch it retries or bisects, and the bisection depth.
	Kind     string `json:"kind"`
	ParentID *int64 `json:"parent_id"`
	Depth    int    `json:"depth"`
}

type eventObject struct {
	ID        int64  `json:"id"`
	Code      string `json:"code"`
	Detail    string `json:"detail"`
	BatchID   *int64 `json:"batch_id"`
	CreatedAt string `json:"created_at"`
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func tsPtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := ts(*t)
	return &s
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func errObj(code, msg string) *errorObject {
	if code == "" && msg == "" {
		return nil
	}
	return &errorObject{Code: code, Message: msg}
}

func renderOperation(op store.Operation, mrURL string) operationObject {
	return operationObject{
		ID: op.OperationID, Subject: op.Subject, Target: op.Target, Repo: op.Repo,
		Action: string(op.Action), Status: string(op.Status), BatchID: op.BatchID,
		MRURL: strPtr(mrURL), Error: errObj(op.ErrorCode, op.ErrorMessage),
		ExpiresAt: tsPtr(op.ExpiresAt), CreatedAt: ts(op.CreatedAt), UpdatedAt: ts(op.UpdatedAt),
	}
}

func renderBinding(b store.Binding) bindingObject {
	return bindingObject{
		Subject: b.Subject, Target: b.Target, Repo: b.Repo, Status: string(b.Status),
		OperationID: b.OperationID, ExpiresAt: tsPtr(b.ExpiresAt),
		CreatedAt: ts(b.CreatedAt), UpdatedAt: ts(b.UpdatedAt),
	}
}

func renderBatch(b store.Batch) batchObject {
	ids := b.OperationIDs
	if ids == nil {
		ids = []string{}
	}
	return batchObject{
		ID: b.ID, Repo: b.Repo, Status: b.Status.String(), Size: b.Size, SourceBranch: b.SourceBranch,
		MRIID: b.MRIID, MRURL: strPtr(b.MRURL), Error: errObj(b.ErrorCode, b.ErrorMessage),
		OperationIDs: ids, CreatedAt: ts(b.CreatedAt), UpdatedAt: ts(b.UpdatedAt), FinishedAt: tsPtr(b.FinishedAt),
		Kind: b.Kind, ParentID: b.ParentID, Depth: b.Depth,
	}
}

func renderEvent(e store.Event) eventObject {
	return eventObject{ID: e.ID, Code: e.Code, Detail: e.Detail, BatchID: e.BatchID, CreatedAt: ts(e.CreatedAt)}
}
