package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// SettleResult is one settlement of a claimed batch.
type SettleResult struct {
	Size       int
	Success    bool
	Time       time.Duration
	Statements Statements
	Moved      int // member operations in their final status afterwards
}

// Settlement claims a batch of size operations (loaded with pending bindings) and
// settles it as merged (success) or failed, on a one-connection store, timing it and
// counting its statements.
func Settlement(ctx context.Context, d *DB, size int, success bool) (SettleResult, error) {
	res := SettleResult{Size: size, Success: success}
	repo := fmt.Sprintf("bench/settle-%d-%v", size, success)
	raw, err := d.Raw(4)
	if err != nil {
		return res, err
	}
	defer raw.Close()
	if _, err := BulkLoad(ctx, raw, Load{Repo: repo, N: size, Bindings: true}); err != nil {
		return res, err
	}
	claimer, err := d.Open(ctx, 2)
	if err != nil {
		return res, err
	}
	defer claimer.Close()
	cr, err := claimer.BatchClaim(ctx, repo, size)
	if err != nil {
		return res, err
	}
	if cr.Outcome != store.ClaimClaimed || len(cr.OperationIDs) != size {
		return res, fmt.Errorf("claim for settlement: %s with %d", cr.Outcome, len(cr.OperationIDs))
	}
	st, err := d.Open(ctx, 1)
	if err != nil {
		return res, err
	}
	defer st.Close()
	b, err := st.BatchGet(ctx, cr.BatchID)
	if err != nil {
		return res, err
	}
	res.Statements, err = CountStatements(ctx, st.DB(), func() error {
		t0 := time.Now()
		var err error
		if success {
			_, err = st.BatchSettleSucceeded(ctx, b.ID, b.Status, b.Version)
		} else {
			_, err = st.BatchSettleFailed(ctx, b.ID, b.Status, b.Version, "pipeline_failed", "bench: settle failure")
		}
		res.Time = time.Since(t0)
		return err
	})
	if err != nil {
		return res, err
	}
	want := domain.OpMerged
	if !success {
		want = domain.OpFailed
	}
	n, err := countRows(ctx, raw, "SELECT COUNT(*) FROM operation WHERE batch_id = ? AND status = ?", b.ID, want)
	res.Moved = int(n)
	return res, err
}
