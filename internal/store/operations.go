package store

// Operation-side store methods: admission with idempotency, approval, rejection,
// retry, bindings, expiry and audit events. Each exported method is one transaction.
//
// STATUS: signatures are the contract the API builds against; bodies are being
// written (issue #5). Every method returning errUnimplemented is unfinished work.

import (
	"context"
	"encoding/json"
	"time"
)

// OperationCreateParams is one validated application.
type OperationCreateParams struct {
	OperationID string // a new UUID chosen by the caller
	Subject     string
	Target      string
	Repo        string
	Action      Action
	ExpiresAt   *time.Time
	Attributes  json.RawMessage
	// AutoApprove admits the operation to the waiting set at once (status queued).
	AutoApprove bool
	// IdempotencyKey, when set, makes the call idempotent: Fingerprint identifies the
	// request; a repeat with the same fingerprint returns the first operation with
	// created=false; another fingerprint returns ErrIdempotencyKeyReused.
	IdempotencyKey string
	Fingerprint    string
	IdempotencyTTL time.Duration
}

// OperationCreate creates an operation and applies it to its binding (I5) in one
// transaction. Errors: ErrBindingBusy, ErrBindingActive, ErrBindingNotActive,
// ErrIdempotencyKeyReused, ErrLostRace (concurrent re-application won).
func (s *Store) OperationCreate(ctx context.Context, p OperationCreateParams) (op Operation, created bool, err error) {
	return Operation{}, false, errUnimplemented
}

// OperationGet returns one operation by its public id. ErrNotFound when unknown.
func (s *Store) OperationGet(ctx context.Context, operationID string) (Operation, error) {
	return Operation{}, errUnimplemented
}

// OperationApprove: pending_approval → queued and admitted, guarded on the operation's
// version and on the binding still pointing at it. A repeat is a no-op returning the
// operation; ErrStale when superseded or already rejected; ErrNotFound when unknown.
func (s *Store) OperationApprove(ctx context.Context, operationID string) (Operation, error) {
	return Operation{}, errUnimplemented
}

// OperationReject: pending_approval → rejected (binding: grant → rejected, revoke →
// back to active). A repeat is a no-op; ErrStale when superseded or already approved.
func (s *Store) OperationReject(ctx context.Context, operationID string) (Operation, error) {
	return Operation{}, errUnimplemented
}

// OperationRetry: failed → queued and re-admitted (binding back to pending/revoking),
// guarded; ErrStale when the operation is not failed or no longer owns its binding.
func (s *Store) OperationRetry(ctx context.Context, operationID string) (Operation, error) {
	return Operation{}, errUnimplemented
}

// BindingList returns bindings filtered by subject and/or target (either may be empty).
func (s *Store) BindingList(ctx context.Context, subject, target string, limit int) ([]Binding, error) {
	return nil, errUnimplemented
}

// BindingsExpired returns active bindings whose expires_at has passed (DB clock).
func (s *Store) BindingsExpired(ctx context.Context, limit int) ([]Binding, error) {
	return nil, errUnimplemented
}

// BindingExpire creates and admits a revoke operation for an expired binding, guarded
// on the binding's version so two replicas make one. ErrLostRace when another did.
func (s *Store) BindingExpire(ctx context.Context, b Binding, operationID string) (Operation, error) {
	return Operation{}, errUnimplemented
}

// EventRecord appends an audit event; a duplicate dedupe key is a no-op (returns false).
func (s *Store) EventRecord(ctx context.Context, e Event) (bool, error) {
	return false, errUnimplemented
}

// OperationEvents lists an operation's events, oldest first.
func (s *Store) OperationEvents(ctx context.Context, operationID string) ([]Event, error) {
	return nil, errUnimplemented
}

// OperationCounts returns the number of operations per status (metrics).
func (s *Store) OperationCounts(ctx context.Context) (map[OpStatus]int64, error) {
	return nil, errUnimplemented
}

// CleanupIdempotency deletes up to chunk expired idempotency keys (DB clock).
func (s *Store) CleanupIdempotency(ctx context.Context, chunk int) (int64, error) {
	return 0, errUnimplemented
}
