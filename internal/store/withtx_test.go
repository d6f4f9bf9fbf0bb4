package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// TestCancelBeforeCommitIsCanceled: a context cancelled after a transaction's last
// statement and before its COMMIT makes database/sql roll the transaction back by
// itself, and Commit then answers sql.ErrTxDone. The store must report that as the
// cancellation it is, or every shutdown that lands there is logged as an error.
func TestCancelBeforeCommitIsCanceled(t *testing.T) {
	st, _ := storetest.New(t)
	st.SetSlotNoWait(false) // the claim through withTx (claim_compound.go pins a connection instead)
	const repo = "group/withtx"
	storetest.InsertQueuedOps(t, st, repo, 2)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rolledBack := false
	st.Hooks = &store.Hooks{ClaimAfterUpdate: func(context.Context, int64) {
		cancel()
		// Wait until database/sql's own rollback has released the transaction's
		// connection: Commit then finds the transaction done (ErrTxDone) every time,
		// instead of sometimes winning the race and answering context.Canceled itself.
		deadline := time.Now().Add(5 * time.Second)
		for st.DB().Stats().InUse > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		rolledBack = st.DB().Stats().InUse == 0
	}}
	_, err := st.BatchClaim(ctx, repo, 10)
	st.Hooks = nil
	if !rolledBack {
		t.Fatal("the cancelled transaction was not rolled back within 5s")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("claim cancelled before COMMIT returned %v, want context.Canceled", err)
	}
	var n int
	if err := st.DB().Get(&n, "SELECT COUNT(*) FROM merge_batch"); err != nil || n != 0 {
		t.Fatalf("batches after the cancelled claim: %d %v, want 0", n, err)
	}
}
