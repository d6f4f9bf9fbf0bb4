package bench

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/batcherd/batcherd/internal/store"
)

// ClaimSample is the cost of claiming Batch requests out of a waiting set of Waiting.
type ClaimSample struct {
	Waiting, Batch int
	Times          []time.Duration
	Median, Max    time.Duration
	Statements     Statements
	// Median time of the claim's phases (through store.Hooks): the precheck, BEGIN, the
	// slot INSERT and the waiting-row read; the guarded UPDATEs, member history, batch
	// row, event and COMMIT (on MariaDB one round trip each: store's claim_compound.go).
	Read, Writes time.Duration
}

// claimPhases are one claim's phase durations.
type claimPhases struct{ read, writes time.Duration }

// ClaimRig is a database with one repository's waiting set that grows on demand, a
// store with a one-connection pool (so its statements can be counted) and a raw pool
// for fixtures and for undoing claims.
type ClaimRig struct {
	DB      *DB
	St      *store.Store
	Raw     *sql.DB
	Repo    string
	waiting int
	// OpsFor is how many of the oldest waiting rows have operations: the most a claim
	// ever takes (the largest batch size measured).
	OpsFor int
}

// NewClaimRig creates the database. opsFor is the largest batch to be claimed.
func NewClaimRig(ctx context.Context, opsFor int) (*ClaimRig, error) {
	d, err := NewDB(ctx, "claim")
	if err != nil {
		return nil, err
	}
	st, err := d.Open(ctx, 1)
	if err != nil {
		d.Close()
		return nil, err
	}
	raw, err := d.Raw(4)
	if err != nil {
		st.Close()
		d.Close()
		return nil, err
	}
	return &ClaimRig{DB: d, St: st, Raw: raw, Repo: "bench/claim", OpsFor: opsFor}, nil
}

// Close drops everything.
func (r *ClaimRig) Close() {
	r.St.Close()
	r.Raw.Close()
	r.DB.Close()
}

// Grow bulk-loads waiting rows until the waiting set holds n. The first load carries
// the operations of the oldest OpsFor rows.
func (r *ClaimRig) Grow(ctx context.Context, n int) (time.Duration, error) {
	if n <= r.waiting {
		return 0, nil
	}
	t0 := time.Now()
	// Rows that a claim of up to OpsFor can take get operations; the rest only wait.
	withOps := max(0, min(r.OpsFor, n)-r.waiting)
	var err error
	if withOps > 0 {
		_, err = BulkLoad(ctx, r.Raw, Load{Repo: r.Repo, N: n - r.waiting, OpsFirst: withOps})
	} else {
		_, err = BulkLoadWaitingOnly(ctx, r.Raw, r.Repo, n-r.waiting)
	}
	if err != nil {
		return 0, err
	}
	r.waiting = n
	_, err = r.Raw.ExecContext(ctx, "ANALYZE TABLE merge_batch_request")
	return time.Since(t0), err
}

// BulkLoadWaitingOnly loads n waiting rows without operations (never claimed: they
// are newer than the rows a claim takes).
func BulkLoadWaitingOnly(ctx context.Context, db *sql.DB, repo string, n int) ([]string, error) {
	return BulkLoad(ctx, db, Load{Repo: repo, N: n, OpsFirst: 0, waitingOnly: true})
}

// Claim claims batch requests once through the store, counts its statements, and
// undoes it (the rows wait again, the slot is free), so the waiting set keeps its size.
func (r *ClaimRig) Claim(ctx context.Context, batch int) (time.Duration, Statements, claimPhases, error) {
	var res store.ClaimResult
	var el time.Duration
	var ph claimPhases
	var tRead time.Time
	// Only the read is marked: a hook after the writes would split their COMMIT into a
	// round trip of its own.
	r.St.Hooks = &store.Hooks{
		ClaimAfterRead: func(context.Context, int64, []int64) { tRead = time.Now() },
	}
	defer func() { r.St.Hooks = nil }()
	stmts, err := CountStatements(ctx, r.St.DB(), func() error {
		t0 := time.Now()
		var err error
		res, err = r.St.BatchClaim(ctx, r.Repo, batch)
		t1 := time.Now()
		el = t1.Sub(t0)
		ph = claimPhases{tRead.Sub(t0), t1.Sub(tRead)}
		return err
	})
	if err != nil {
		return 0, stmts, ph, err
	}
	if res.Outcome != store.ClaimClaimed || len(res.OperationIDs) != min(batch, r.waiting) {
		return 0, stmts, ph, fmt.Errorf("claim of %d from %d: %s with %d", batch, r.waiting, res.Outcome, len(res.OperationIDs))
	}
	return el, stmts, ph, r.Unclaim(ctx, res.BatchID)
}

// Unclaim puts a claimed batch's rows back into the waiting set and frees the slot
// (fixture surgery, not a store operation).
func (r *ClaimRig) Unclaim(ctx context.Context, batchID int64) error {
	for _, q := range []string{
		"UPDATE merge_batch_request SET batch_id = NULL WHERE batch_id = ?",
		"UPDATE operation SET status = 'queued', batch_id = NULL WHERE batch_id = ?",
		"DELETE FROM merge_batch_member WHERE batch_id = ?",
		"UPDATE merge_batch SET status = 3 WHERE id = ?",
	} {
		if _, err := r.Raw.ExecContext(ctx, q, batchID); err != nil {
			return err
		}
	}
	return nil
}

// Sample claims batch reps times (after one unmeasured warm-up claim) and summarizes.
func (r *ClaimRig) Sample(ctx context.Context, batch, reps int) (ClaimSample, error) {
	s := ClaimSample{Waiting: r.waiting, Batch: batch}
	if _, _, _, err := r.Claim(ctx, batch); err != nil {
		return s, err
	}
	var rd, wr []time.Duration
	for i := 0; i < reps; i++ {
		d, st, ph, err := r.Claim(ctx, batch)
		if err != nil {
			return s, err
		}
		s.Times = append(s.Times, d)
		s.Statements = st
		rd, wr = append(rd, ph.read), append(wr, ph.writes)
	}
	sum := Summarize(append([]time.Duration(nil), s.Times...))
	s.Median, s.Max = sum.P50, sum.Max
	s.Read, s.Writes = Summarize(rd).P50, Summarize(wr).P50
	return s, nil
}
