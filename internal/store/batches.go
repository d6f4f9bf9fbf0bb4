package store

// Batch-side store methods: the waiting set, the claim, the batch state machine and
// the sweeps' reads. Each exported method is one transaction through withTx.
//
// STATUS: signatures are the contract the scanner builds against; bodies are being
// written (issue #2). Every method returning errUnimplemented is unfinished work.

import (
	"context"
	"errors"
	"time"
)

var errUnimplemented = errors.New("store: not implemented yet")

// ClaimOutcome is the result of one claim attempt. None of them is an error.
type ClaimOutcome string

const (
	ClaimClaimed        ClaimOutcome = "claimed"
	ClaimSlotOccupied   ClaimOutcome = "slot_occupied"
	ClaimNothingToClaim ClaimOutcome = "nothing_to_claim"
	ClaimPreempted      ClaimOutcome = "preempted"
)

// ClaimResult describes one claim attempt.
type ClaimResult struct {
	Outcome      ClaimOutcome
	BatchID      int64    // set when Outcome == ClaimClaimed
	OperationIDs []string // claimed members, oldest first
}

// Admit inserts an operation into its repository's waiting set (I4). It returns false,
// and no error, when the operation was already admitted.
func (s *Store) Admit(ctx context.Context, operationID, repo string) (bool, error) {
	return false, errUnimplemented
}

// WaitingExists is the claim's lock-free precheck: is anything waiting in repo?
// Runs outside any transaction.
func (s *Store) WaitingExists(ctx context.Context, repo string) (bool, error) {
	return false, errUnimplemented
}

// BatchClaim claims up to max waiting requests of repo into a new RUNNING batch, in one
// READ COMMITTED transaction: insert the slot row (1062/1213/1205 → slot_occupied),
// read waiting rows without FOR UPDATE (empty → roll back, nothing_to_claim), guarded
// UPDATE … WHERE batch_id IS NULL AND id IN (…) (affected ≠ read → roll back, preempted),
// member history appended in bulk, operations queued → in_batch.
func (s *Store) BatchClaim(ctx context.Context, repo string, max int) (ClaimResult, error) {
	return ClaimResult{}, errUnimplemented
}

// BatchGet returns a batch with its OperationIDs (from member history).
func (s *Store) BatchGet(ctx context.Context, id int64) (Batch, error) {
	return Batch{}, errUnimplemented
}

// BatchFilter selects batches for BatchList. Results are ordered by id descending;
// AfterID is the cursor (return batches with id < AfterID when > 0).
type BatchFilter struct {
	Repo    string
	Status  BatchStatus // 0 = any
	Limit   int         // default 50, max 500
	AfterID int64
}

// BatchList lists batches (without OperationIDs).
func (s *Store) BatchList(ctx context.Context, f BatchFilter) ([]Batch, error) {
	return nil, errUnimplemented
}

// BatchMembers returns the operations of a batch (from member history), sorted by
// operation_id — what publish needs to write the files.
func (s *Store) BatchMembers(ctx context.Context, batchID int64) ([]Operation, error) {
	return nil, errUnimplemented
}

// BatchesDue is the fetch half of fetch → tryLock: active batches whose next_check_at
// has passed (DB clock), oldest check first. Read without locks.
func (s *Store) BatchesDue(ctx context.Context, limit int) ([]Batch, error) {
	return nil, errUnimplemented
}

// BatchReserve is the tryLock half: it pushes next_check_at to NOW(6)+lease and bumps
// version, guarded on id, version and an active status. It returns the batch as now
// stored, or ErrLostRace when another replica took it first.
func (s *Store) BatchReserve(ctx context.Context, id, version int64, lease time.Duration) (Batch, error) {
	return Batch{}, errUnimplemented
}

// BatchMarkDue makes an active batch due for a check now (webhook hint). It does not
// bump version: it is a scheduling hint, and bumping would make an in-flight publish
// lose its guarded MR write.
func (s *Store) BatchMarkDue(ctx context.Context, id int64) error {
	return errUnimplemented
}

// MRRecord is what publish records on a batch.
type MRRecord struct {
	IID int64
	URL string
	SHA string // the head sha batcherd committed; every merge is guarded on it
}

// BatchRecordMR records the MR on a RUNNING batch, guarded on version (fencing: done
// before any merge is armed). ErrLostRace when the batch moved on.
func (s *Store) BatchRecordMR(ctx context.Context, id, version int64, mr MRRecord) (Batch, error) {
	return Batch{}, errUnimplemented
}

// BatchBlock moves RUNNING → BLOCKED (keeps the slot) with a reason, guarded on version.
func (s *Store) BatchBlock(ctx context.Context, id, version int64, code, message string) (Batch, error) {
	return Batch{}, errUnimplemented
}

// BatchUnblock moves BLOCKED → RUNNING (e.g. the pipeline was retried), guarded on version.
func (s *Store) BatchUnblock(ctx context.Context, id, version int64) (Batch, error) {
	return Batch{}, errUnimplemented
}

// BatchSettleSucceeded settles a batch as merged in one transaction, batch guard first
// (status = from AND version = version → SUCCEEDED), then members in_batch → merged and
// their bindings (grant → active, revoke → closed), operations before bindings, keys
// sorted. from is RUNNING or BLOCKED normally, FAILED when a human merged an MR after
// batcherd failed it (merged wins). ErrLostRace when another settler was first.
func (s *Store) BatchSettleSucceeded(ctx context.Context, id int64, from BatchStatus, version int64) (Batch, error) {
	return Batch{}, errUnimplemented
}

// BatchSettleFailed settles a batch as failed in one transaction, batch guard first
// (active status AND version → FAILED with code/message), then members in_batch →
// failed with the reason, bindings (grant → failed, revoke → back to active), waiting
// rows deleted; member history and audit kept. ErrLostRace when another settler was first.
func (s *Store) BatchSettleFailed(ctx context.Context, id int64, from BatchStatus, version int64, code, message string) (Batch, error) {
	return Batch{}, errUnimplemented
}

// BatchesTimedOut returns active batches created more than timeout ago (DB clock).
func (s *Store) BatchesTimedOut(ctx context.Context, timeout time.Duration, limit int) ([]Batch, error) {
	return nil, errUnimplemented
}

// BatchesFailedWithMR returns FAILED batches with a recorded MR finished within the
// last `within` (DB clock) — what the orphan sweep re-reads to let "merged wins".
func (s *Store) BatchesFailedWithMR(ctx context.Context, within time.Duration, limit int) ([]Batch, error) {
	return nil, errUnimplemented
}

// RepoWaiting is a metrics sample of one repository's waiting set.
type RepoWaiting struct {
	Repo      string  `db:"repo"`
	Depth     int64   `db:"depth"`
	OldestAge float64 `db:"oldest_age"` // seconds, DB clock
}

// WaitingStats returns waiting depth and oldest waiting age per repository.
func (s *Store) WaitingStats(ctx context.Context) ([]RepoWaiting, error) {
	return nil, errUnimplemented
}

// CleanupWaiting deletes up to chunk waiting rows of SUCCEEDED batches finished more
// than olderThan ago. Returns rows deleted; callers loop while it returns chunk.
func (s *Store) CleanupWaiting(ctx context.Context, olderThan time.Duration, chunk int) (int64, error) {
	return 0, errUnimplemented
}
