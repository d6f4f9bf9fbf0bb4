package scanner

import (
	"context"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
)

// Found by the protocol model (docs/MODEL.md, "Findings"): a publisher renews its
// reservation and is then frozen for longer than the lease; the timeout sweep of
// another replica settles the batch FAILED (its lookup by branch finds no MR yet); the
// publisher wakes, opens the MR, loses its record and dies before lostRecord closes
// it; a human merges the open MR. The batch is FAILED with no MR recorded and its MR
// merged: the open-MR sweep no longer sees it (merged, not open) and the failed-batch
// sweep read only batches with a recorded MR, so merged wins never came — the files
// of a FAILED batch on the target branch for good, the database saying failed. Now the
// failed-batch sweep also looks a batch without a recorded MR up by its branch.
func TestMergedWinsReachesAFailedBatchWhoseMRWasNeverRecorded(t *testing.T) {
	e, ids, a, res := leaseFindingStart(t)
	bg := context.Background()
	// a freezes right after renewing its reservation, then dies right after opening
	// the MR (before recording it).
	resume := frozenPublish(t, a, "publish.renewed")

	// The lease lapses while a is frozen; the sweep of replica t settles the batch.
	sweeper := e.scanner("t", func(c *Config) { c.BatchTimeout = 10 * time.Millisecond })
	waitUntil(t, 10*time.Second, "the timeout sweep settles the batch", func() bool {
		_ = sweeper.timeout.runOnce(bg)
		b, _ := e.st.BatchGet(bg, res.BatchID)
		return !b.Status.Active()
	})
	if b, _ := e.st.BatchGet(bg, res.BatchID); b.Status != domain.BatchFailed || b.MRIID != nil {
		t.Fatalf("batch %s MR %v, want failed without an MR", b.Status, b.MRIID)
	}

	resume()
	mrs := e.mrsOf(repo, res.BatchID)
	if len(mrs) != 1 || mrs[0].State != "opened" {
		t.Fatalf("MRs of the batch: %+v, want one open (the frozen publisher's)", mrs)
	}
	if err := e.sim.MergeMR(repo, mrs[0].IID); err != nil {
		t.Fatal(err)
	}

	// The orphan sweep must let the repository win.
	for range 3 {
		if err := sweeper.orphans.runOnce(bg); err != nil {
			t.Fatalf("orphan pass: %v", err)
		}
	}
	b, _ := e.st.BatchGet(bg, res.BatchID)
	if b.Status != domain.BatchSucceeded || b.MRIID == nil || *b.MRIID != mrs[0].IID {
		t.Fatalf("batch %s (%s) MR %v, want succeeded with !%d: its MR merged", b.Status, b.ErrorCode, b.MRIID, mrs[0].IID)
	}
	// The settle had requeued the members for a retry (and claimed it): that round
	// goes through as any other.
	c := e.scanner("c", nil)
	if op := e.ops(ids)[ids[0]]; op.BatchID != nil && *op.BatchID != res.BatchID {
		retry := *op.BatchID
		_ = c.publish.runOnce(bg)
		for _, m := range e.mrsOf(repo, retry) {
			if m.State == "opened" {
				if err := e.sim.SucceedMRPipeline(repo, m.IID); err != nil {
					t.Fatal(err)
				}
			}
		}
		if b := e.drive(c, retry, 10*time.Second); b.Status != domain.BatchSucceeded {
			t.Fatalf("retry batch %d %s (%s), want succeeded", retry, b.Status, b.ErrorCode)
		}
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
}
