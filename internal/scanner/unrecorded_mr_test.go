package scanner

import (
	"context"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
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
	if b.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s (%s), want succeeded: its MR merged", b.Status, b.ErrorCode)
	}
	if b.MRIID == nil || *b.MRIID != mrs[0].IID || b.MRURL == "" {
		t.Fatalf("SUCCEEDED batch records MR %v %q, want !%d", b.MRIID, b.MRURL, mrs[0].IID)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
	e.requireClean()
}

// Found by the chaos run: the timeout sweep settled a batch (FAILED, members requeued)
// while its publisher, still within its reservation, was between the commit and
// opening the MR; the publisher then opened the MR of a FAILED batch and died before
// closing it, and a human merged it — the files of a failed batch on main for good,
// with nothing in the database saying so. Now the sweep leaves a batch without an MR
// alone while its publish reservation is live, publish stops renewing the reservation
// past the timeout, and once it lapses the settle finds the MR by its branch: merged
// wins, the batch SUCCEEDED with its MR, its operations merged, nothing requeued.
func TestTimeoutWaitsForALivePublish(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	bg := context.Background()
	a := e.scanner("a", nil)
	res, err := a.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	// a publishes: it stops after the commit (a slow GitLab), then dies right after
	// opening the MR.
	resume := frozenPublish(t, a, "publish.commit")

	// Past the timeout, but a's reservation is live: the sweep leaves the batch alone.
	sweeper := e.scanner("t", func(c *Config) { c.BatchTimeout = 10 * time.Millisecond })
	time.Sleep(20 * time.Millisecond)
	if err := sweeper.timeout.runOnce(bg); err != nil {
		t.Fatalf("timeout pass: %v", err)
	}
	if b, _ := e.st.BatchGet(bg, res.BatchID); b.Status != domain.BatchRunning {
		t.Fatalf("batch %s (%s) while its publisher held it, want running", b.Status, b.ErrorCode)
	}
	resume()
	mrs := e.mrsOf(repo, res.BatchID)
	if len(mrs) != 1 || mrs[0].State != "opened" {
		t.Fatalf("MRs of the batch: %+v, want one open", mrs)
	}
	if err := e.sim.MergeMR(repo, mrs[0].IID); err != nil {
		t.Fatal(err)
	}

	// The reservation lapses; the sweeper's loops (its publish leaves a batch past the
	// timeout) settle it.
	b := e.drive(sweeper, res.BatchID, 10*time.Second)
	if b.Status != domain.BatchSucceeded || b.MRIID == nil || *b.MRIID != mrs[0].IID {
		t.Fatalf("batch %s (%s) MR %v, want succeeded with !%d", b.Status, b.ErrorCode, b.MRIID, mrs[0].IID)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
	var batches int
	if err := e.st.DB().Get(&batches, "SELECT COUNT(*) FROM merge_batch"); err != nil || batches != 1 {
		t.Fatalf("%d batches (%v), want 1: nothing requeued", batches, err)
	}
	e.requireClean()
}

// Publish leaves a batch without an MR that is past the timeout: renewing its
// reservation could keep the timeout sweep (which waits for a live publish
// reservation to lapse) away for good, and race the settle again.
func TestPublishLeavesATimedOutBatch(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	storetest.InsertQueuedOps(t, e.st, repo, 2)
	s := e.scanner("a", func(c *Config) { c.BatchTimeout = 10 * time.Millisecond })
	bg := context.Background()
	res, err := s.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := s.publish.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.sim.Branches(repo)[e.branch(res.BatchID)]; ok {
		t.Fatal("publish took a batch past the timeout: its branch exists")
	}
	if err := s.timeout.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	if b, _ := e.st.BatchGet(bg, res.BatchID); b.Status != domain.BatchFailed || b.ErrorCode != string(domain.ClassUnavailable) {
		t.Fatalf("batch %s (%s), want failed %s", b.Status, b.ErrorCode, domain.ClassUnavailable)
	}
}

// Merged wins on a FAILED batch whose MR was never recorded (the orphan sweep found it
// by its branch, or a publisher lost its record) records the MR before settling, so
// the SUCCEEDED batch names the MR that merged it.
func TestMergedAfterFailedRecordsAnUnrecordedMR(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	s := e.scanner("a", nil)
	bg := context.Background()
	b := e.published(s, repo)
	iid := *b.MRIID
	// As if its publisher had died before recording the MR, then the batch failed.
	if _, err := e.st.DB().Exec("UPDATE merge_batch SET mr_iid = NULL, mr_url = '', mr_sha = '' WHERE id = ?", b.ID); err != nil {
		t.Fatal(err)
	}
	b, _ = e.st.BatchGet(bg, b.ID)
	fb, err := e.st.BatchSettleFailed(bg, b.ID, b.Status, b.Version, "test", "failed with its MR unrecorded")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.sim.MergeMR(repo, iid); err != nil {
		t.Fatal(err)
	}
	m, err := e.gl.GetMR(bg, repo, iid)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.mergedAfterFailed(bg, fb, m, s.log); err != nil {
		t.Fatal(err)
	}
	got, _ := e.st.BatchGet(bg, b.ID)
	if got.Status != domain.BatchSucceeded || got.MRIID == nil || *got.MRIID != iid {
		t.Fatalf("merged wins left batch %s with MR %v, want succeeded naming !%d", got.Status, got.MRIID, iid)
	}
	e.requireOps(ids, domain.OpMerged)
}
