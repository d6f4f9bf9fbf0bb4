package bench

import (
	"context"

	"github.com/batcherd/batcherd/internal/api"
	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// AdmitMode is how a measurement admits operations. The store has one admission path
// (group commit, with the per-request transaction as its fallback); the other two
// modes exist only to be measured against it, so they live here.
type AdmitMode int8

const (
	// AdmitGrouped is production: OperationCreate, concurrent admissions coalesced
	// into group transactions.
	AdmitGrouped AdmitMode = iota
	// AdmitSingle runs each request alone through the group code (groups of one, as
	// many in flight as there are callers): the statement-level savings without group
	// commit.
	AdmitSingle
	// AdmitSerial is the per-request transaction (store.OperationCreateSerial), the
	// admission used before group commit and still the group path's fallback.
	AdmitSerial
)

// String names the mode in reports.
func (m AdmitMode) String() string {
	switch m {
	case AdmitGrouped:
		return "grouped"
	case AdmitSingle:
		return "single"
	case AdmitSerial:
		return "serial"
	}
	return "unknown"
}

// Options returns the store's admission options for m with up to clients concurrent
// callers.
func (m AdmitMode) Options(clients int) store.AdmitOptions {
	if m == AdmitSingle {
		return store.AdmitOptions{MaxGroup: 1, MaxInflight: max(clients, 1)}
	}
	return store.AdmitOptions{}
}

// Create admits p on st the way m says.
func (m AdmitMode) Create(ctx context.Context, st *store.Store, p store.OperationCreateParams) (domain.Operation, bool, error) {
	if m == AdmitSerial {
		return st.OperationCreateSerial(ctx, p)
	}
	return st.OperationCreate(ctx, p)
}

// Use sets st's admission options for m and returns the store the HTTP API should use
// to admit in mode m.
func (m AdmitMode) Use(st *store.Store, clients int) api.Store {
	st.SetAdmitOptions(m.Options(clients))
	if m == AdmitSerial {
		return serialStore{st}
	}
	return st
}

// serialStore is a store whose OperationCreate is the per-request transaction.
type serialStore struct{ *store.Store }

func (s serialStore) OperationCreate(ctx context.Context, p store.OperationCreateParams) (domain.Operation, bool, error) {
	return s.Store.OperationCreateSerial(ctx, p)
}
