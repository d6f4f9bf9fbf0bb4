package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

// ClaimVariant is what runs next to the admissions in the latency measurement.
type ClaimVariant string

const (
	NoClaims          ClaimVariant = "no claims"
	StoreClaims       ClaimVariant = "store.BatchClaim (READ COMMITTED, no FOR UPDATE)"
	ForUpdateRRClaims ClaimVariant = "FOR UPDATE under REPEATABLE READ (the rejected design)"
)

// LatencyResult is the admission latency while a claim variant ran.
type LatencyResult struct {
	Variant    ClaimVariant
	Admissions Summary
	Rate       float64
	Claims     int
	ClaimTime  Summary
	Elapsed    time.Duration
	Errors     int64
}

// LatencyRig is a database with a large preloaded waiting set in one repository, a
// store for admissions into that repository, and a pool for the claimer.
type LatencyRig struct {
	DB       *DB
	Adm      *store.Store // admissions (grouped, the default)
	Claimer  *store.Store
	ClaimRaw *sqlx.DB // the FOR UPDATE variant's pool
	Raw      *sql.DB
	Repo     string
	preload  int
}

// NewLatencyRig loads preload waiting rows (with operations) in one repository.
func NewLatencyRig(ctx context.Context, preload int) (*LatencyRig, error) {
	d, err := NewDB(ctx, "latency")
	if err != nil {
		return nil, err
	}
	r := &LatencyRig{DB: d, Repo: "bench/latency", preload: preload}
	if r.Adm, err = d.Open(ctx, 20); err == nil {
		if r.Claimer, err = d.Open(ctx, 2); err == nil {
			if r.Raw, err = d.Raw(4); err == nil {
				var cr *sql.DB
				if cr, err = d.Raw(2); err == nil {
					r.ClaimRaw = sqlx.NewDb(cr, "mysql")
				}
			}
		}
	}
	if err == nil {
		err = r.topUp(ctx)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close drops everything.
func (r *LatencyRig) Close() {
	if r.Adm != nil {
		r.Adm.Close()
	}
	if r.Claimer != nil {
		r.Claimer.Close()
	}
	if r.ClaimRaw != nil {
		r.ClaimRaw.Close()
	}
	if r.Raw != nil {
		r.Raw.Close()
	}
	r.DB.Close()
}

// topUp loads waiting rows (with operations) until the preloaded repository has its
// preload again: the claims of the previous runs took some.
func (r *LatencyRig) topUp(ctx context.Context) error {
	n, err := countRows(ctx, r.Raw, "SELECT COUNT(*) FROM merge_batch_request WHERE repo = ? AND batch_id IS NULL", r.Repo)
	if err != nil || int(n) >= r.preload {
		return err
	}
	_, err = BulkLoad(ctx, r.Raw, Load{Repo: r.Repo, N: r.preload - int(n)})
	return err
}

// Run admits from clients closed-loop clients into the repository for d while the
// variant claims up to 1,000 back to back, and returns the admission latencies. With
// drain, the claims take whatever waits (every waiting row: the common case, and the
// one where a locking claim blocks admissions); without, they take 1,000 of the
// preloaded rows each, and the claimer stops early if those run out (the admissions
// stop with it).
func (r *LatencyRig) Run(ctx context.Context, v ClaimVariant, drain bool, clients int, d time.Duration) (LatencyResult, error) {
	if !drain && v != NoClaims {
		if err := r.topUp(ctx); err != nil {
			return LatencyResult{}, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	res := LatencyResult{Variant: v}
	repo := r.Repo // preloaded
	if drain {
		repo += "-drain" // only what the admissions add
	}
	var claimTimes []time.Duration
	var claimErr error
	var wg sync.WaitGroup
	if v != NoClaims {
		wg.Go(func() {
			defer cancel() // no more claims: stop the admissions too
			for ctx.Err() == nil {
				t0 := time.Now()
				var id int64
				var n int
				var err error
				if v == StoreClaims {
					var cr store.ClaimResult
					cr, err = r.Claimer.BatchClaim(ctx, repo, 1000)
					id, n = cr.BatchID, len(cr.OperationIDs)
					if err == nil && cr.Outcome == store.ClaimNothingToClaim {
						err = errNothing
					} else if err == nil && cr.Outcome != store.ClaimClaimed {
						err = fmt.Errorf("claim: %s", cr.Outcome)
					}
				} else {
					id, n, err = claimForUpdateRR(ctx, r.ClaimRaw, repo, 1000)
				}
				if id != 0 && err == nil {
					// Free the slot (the batch's rows stay claimed), so the next claim
					// runs now; also after the last claim, so the next run starts free.
					if _, ferr := r.Raw.ExecContext(context.Background(), "UPDATE merge_batch SET status = 2 WHERE id = ?", id); ferr != nil {
						claimErr = ferr
						return
					}
				}
				if ctx.Err() != nil {
					return
				}
				if drain && errors.Is(err, errNothing) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					claimErr = err
					return
				}
				claimTimes = append(claimTimes, time.Since(t0))
				if n < 1000 && !drain {
					return // the preloaded waiting set ran out
				}
			}
		})
	}
	var lat Latencies
	var ops, errs atomic.Int64
	run := uuid.NewString()[:8]
	t0 := time.Now()
	for w := 0; w < clients; w++ {
		wg.Go(func() {
			local := make([]time.Duration, 0, 1024)
			for i := 0; ctx.Err() == nil; i++ {
				t := time.Now()
				_, _, err := r.Adm.OperationCreate(ctx, AdmissionParams(repo, fmt.Sprintf("lat-%s-%d-%d", run, w, i)))
				if ctx.Err() != nil {
					break
				}
				if err != nil {
					errs.Add(1)
					continue
				}
				local = append(local, time.Since(t))
				ops.Add(1)
			}
			lat.Add(local...)
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(t0)
	// A claim whose context ended while its COMMIT ran may have committed without
	// telling the claimer (store.ErrCommitUnknown): free the slot for the next run.
	if _, err := r.Raw.ExecContext(context.Background(), "UPDATE merge_batch SET status = 2 WHERE repo = ? AND status IN (1, 4)", repo); err != nil && claimErr == nil {
		claimErr = err
	}
	if claimErr != nil {
		return res, claimErr
	}
	res.Admissions = lat.Summary()
	res.Rate = float64(ops.Load()) / res.Elapsed.Seconds()
	res.Errors = errs.Load()
	res.Claims = len(claimTimes)
	res.ClaimTime = Summarize(claimTimes)
	return res, nil
}

// claimForUpdateRR is the claim design the seed rejected, written here only to be
// measured: the same statements as store.BatchClaim, but the waiting rows are read
// with FOR UPDATE, under REPEATABLE READ. Its writes follow the store's claim: waiting
// rows, operations, member rows, one batch event (no per-member audit rows).
func claimForUpdateRR(ctx context.Context, db *sqlx.DB, repo string, max int) (int64, int, error) {
	tx, err := db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback()
	r, err := tx.ExecContext(ctx, "INSERT INTO merge_batch (repo, status) VALUES (?, 1)", repo)
	if err != nil {
		return 0, 0, err
	}
	batchID, _ := r.LastInsertId()
	var rows []struct {
		ID          int64  `db:"id"`
		OperationID string `db:"operation_id"`
	}
	if err := tx.SelectContext(ctx, &rows, `SELECT id, operation_id FROM merge_batch_request
		WHERE repo = ? AND batch_id IS NULL ORDER BY created_at, id LIMIT ? FOR UPDATE`, repo, max); err != nil {
		return 0, 0, err
	}
	if len(rows) == 0 {
		return 0, 0, errNothing
	}
	reqIDs := make([]int64, len(rows))
	opIDs := make([]string, len(rows))
	for i, w := range rows {
		reqIDs[i], opIDs[i] = w.ID, w.OperationID
	}
	slices.Sort(reqIDs)
	slices.Sort(opIDs)
	for lo := 0; lo < len(rows); lo += 500 {
		hi := min(lo+500, len(rows))
		args := []any{batchID}
		for _, id := range reqIDs[lo:hi] {
			args = append(args, id)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE merge_batch_request SET batch_id = ? WHERE batch_id IS NULL AND id IN ("+
			placeholders(hi-lo)+")", args...); err != nil {
			return 0, 0, err
		}
		args = []any{"in_batch", batchID}
		for _, id := range opIDs[lo:hi] {
			args = append(args, id)
		}
		args = append(args, "queued")
		if _, err := tx.ExecContext(ctx, `UPDATE operation SET status = ?, batch_id = ?, version = version + 1,
			updated_at = CURRENT_TIMESTAMP(6) WHERE operation_id IN (`+placeholders(hi-lo)+`) AND status = ?`, args...); err != nil {
			return 0, 0, err
		}
	}
	for lo := 0; lo < len(opIDs); lo += 250 {
		hi := min(lo+250, len(opIDs))
		args := make([]any, 0, 2*(hi-lo))
		for _, id := range opIDs[lo:hi] {
			args = append(args, batchID, id)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO merge_batch_member (batch_id, operation_id) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?,?),", hi-lo), ","), args...); err != nil {
			return 0, 0, err
		}
	}
	if _, err := tx.ExecContext(ctx, "INSERT IGNORE INTO audit_event (dedupe_key, batch_id, code, detail) VALUES (?, ?, ?, ?)",
		fmt.Sprintf("batch:%d:claimed", batchID), batchID, store.EventBatchClaimed, "claimed"); err != nil {
		return 0, 0, err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE merge_batch SET size = ?, source_branch = ? WHERE id = ?",
		len(rows), domain.LegacyBranchName(batchID), batchID); err != nil {
		return 0, 0, err
	}
	return batchID, len(rows), tx.Commit()
}

var errNothing = errors.New("nothing to claim")

func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?,", n), ",") }
