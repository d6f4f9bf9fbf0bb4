package store_test

import (
	"context"
	"testing"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// TestExplainBatchListCursor: a later page of a repository's batches (GET /v1/batches
// with a cursor, the status page's Older link) starts at its cursor. With 20,000
// batches in two repositories the unhinted plan was a ref read of idx_repo_id on the
// repository alone, walking every newer batch before reaching the cursor (10 ms at page
// 100 instead of 0.3 ms, and growing with the depth); qBatchList's index hint makes it a
// range read of (repo, id < cursor), with a status of (repo, status, id < cursor).
func TestExplainBatchListCursor(t *testing.T) {
	st, _ := storetest.New(t)
	if _, err := st.DB().ExecContext(context.Background(), `INSERT INTO merge_batch (id, repo, status, size, created_at, updated_at)
		SELECT seq, IF(seq % 2 = 0, 'group/a', 'group/b'), 2, 5, NOW(6), NOW(6) FROM seq_1_to_20000`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().ExecContext(context.Background(), "ANALYZE TABLE merge_batch"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f       store.BatchFilter
		wantKey string
	}{
		{store.BatchFilter{Repo: "group/b", AfterID: 10_000, Limit: 51}, "idx_repo_id"},
		{store.BatchFilter{Repo: "group/b", Status: domain.BatchSucceeded, AfterID: 10_000, Limit: 51}, "idx_repo_status"},
		{store.BatchFilter{Repo: "group/b", AfterID: 20, Limit: 51}, "idx_repo_id"},
	} {
		q, args := store.QBatchList(c.f)
		plan := btExplain(t, st, q, args...)
		t.Logf("%+v: %+v", c.f, plan)
		if len(plan) != 1 || plan[0].Type != "range" || plan[0].Key != c.wantKey {
			t.Errorf("%+v: plan %+v is not a range read of %s from the cursor", c.f, plan, c.wantKey)
		}
	}
}
