package api

import (
	"time"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/wire"

	"github.com/batcherd/batcherd/internal/domain"
)

// The JSON objects live in internal/wire, shared with the test client.

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

func errObj(code, msg string) *wire.Error {
	if code == "" && msg == "" {
		return nil
	}
	return &wire.Error{Code: code, Message: msg}
}

func renderOperation(op domain.Operation, mrURL string) wire.Operation {
	return wire.Operation{
		ID: op.OperationID, Subject: op.Subject, Target: op.Target, Repo: op.Repo,
		Action: string(op.Action), Status: string(op.Status), Priority: string(op.Priority), BatchID: op.BatchID,
		MRURL: strPtr(mrURL), Error: errObj(op.ErrorCode, op.ErrorMessage),
		ExpiresAt:   tsPtr(op.ExpiresAt),
		RequestedBy: strPtr(op.RequestedBy), ApprovedBy: strPtr(op.ApprovedBy),
		CreatedAt: ts(op.CreatedAt), UpdatedAt: ts(op.UpdatedAt),
	}
}

func renderBinding(b domain.Binding) wire.Binding {
	return wire.Binding{
		Subject: b.Subject, Target: b.Target, Repo: b.Repo, Status: string(b.Status),
		OperationID: b.OperationID, ExpiresAt: tsPtr(b.ExpiresAt),
		CreatedAt: ts(b.CreatedAt), UpdatedAt: ts(b.UpdatedAt),
	}
}

func renderBatch(b domain.Batch) wire.Batch {
	ids := b.OperationIDs
	if ids == nil {
		ids = []string{}
	}
	return wire.Batch{
		ID: b.ID, Repo: b.Repo, Status: b.Status.String(), Size: b.Size, SourceBranch: b.SourceBranch,
		MRIID: b.MRIID, MRURL: strPtr(b.MRURL), Error: errObj(b.ErrorCode, b.ErrorMessage),
		OperationIDs: ids, CreatedAt: ts(b.CreatedAt), UpdatedAt: ts(b.UpdatedAt), FinishedAt: tsPtr(b.FinishedAt),
		Kind: b.Kind, ParentID: b.ParentID, Depth: b.Depth,
	}
}

func renderEvent(e store.Event) wire.Event {
	return wire.Event{ID: e.ID, Code: e.Code, Detail: e.Detail, BatchID: e.BatchID, Actor: strPtr(e.Actor), CreatedAt: ts(e.CreatedAt)}
}
