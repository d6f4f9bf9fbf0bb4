package scanner

import (
	"context"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// Found by the chaos run (test/chaos): a publisher opened the batch's MR and died
// before recording it; a human merged the MR; the timeout sweep then found it by its
// branch, merged, and settled the batch SUCCEEDED ("merged wins") — without recording
// the MR, so the batch did not name the MR that merged it (batcherd verify: "SUCCEEDED
// batch has no MR recorded"; the harness audit: "records MR iid nil"). The settlement
// must record the MR it found.
func TestMergedWinsRecordsAnUnrecordedMR(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	bg := context.Background()

	// a opens the MR and dies before recording it.
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	hit := false
	a := e.scanner("a", nil)
	a.testHook = crashAt("publish.mr", cancel, &hit)
	res, err := a.RunRound(ctx, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	_ = a.publish.runOnce(ctx)
	if !hit {
		t.Fatal("publish never reached publish.mr")
	}
	mrs := e.mrsOf(repo, res.BatchID)
	if len(mrs) != 1 || mrs[0].State != "opened" {
		t.Fatalf("MRs of the batch: %+v, want one open", mrs)
	}
	if b, _ := e.st.BatchGet(bg, res.BatchID); b.MRIID != nil {
		t.Fatalf("MR recorded although the publisher died first: %v", *b.MRIID)
	}

	// A human merges it; the timeout sweep of another replica settles the batch once
	// a's publish reservation has lapsed.
	if err := e.sim.MergeMR(repo, mrs[0].IID); err != nil {
		t.Fatal(err)
	}
	s := e.scanner("b", func(c *Config) { c.BatchTimeout = 50 * time.Millisecond })
	waitUntil(t, 10*time.Second, "the timeout sweep settles the batch", func() bool {
		_ = s.timeout.runOnce(bg)
		b, _ := e.st.BatchGet(bg, res.BatchID)
		return !b.Status.Active()
	})

	b, _ := e.st.BatchGet(bg, res.BatchID)
	if b.Status != store.BatchSucceeded {
		t.Fatalf("batch %s (%s), want succeeded: its MR merged", b.Status, b.ErrorCode)
	}
	if b.MRIID == nil || *b.MRIID != mrs[0].IID || b.MRURL == "" {
		t.Fatalf("SUCCEEDED batch records MR %v %q, want !%d", b.MRIID, b.MRURL, mrs[0].IID)
	}
	e.requireFiles(repo, e.requireOps(ids, store.OpMerged), true)
	e.requireClean()
}
