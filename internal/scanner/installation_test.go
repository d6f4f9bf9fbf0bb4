package scanner

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// Issue #14, lie 1: a second database pointed at the same GitLab project (a staging
// install, a restore, a re-created database) counts batch ids from 1 again. Its batch 1
// found the first installation's long-merged MR by the branch name and settled its
// operations merged — with none of their files written. Each database's operations
// must end merged with their own files on the target branch.
func TestTwoDatabasesOneProjectNeverAdoptEachOthersMRs(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	bg := context.Background()
	st2, _ := storetest.New(t)
	a := e.scanner("a", nil)
	b := New(e.testConfig("b"), st2, e.gl, testLogger(), prometheus.NewRegistry())

	for round := range 3 {
		idsA := storetest.InsertOps(t, e.st, storetest.Ops{Repo: repo, N: 4, Admit: true, Prefix: fmt.Sprintf("a%d", round)})
		idsB := storetest.InsertOps(t, st2, storetest.Ops{Repo: repo, N: 4, Admit: true, Prefix: fmt.Sprintf("b%d", round)})
		resA, err := a.RunRound(bg, repo)
		if err != nil || resA.Outcome != store.ClaimClaimed {
			t.Fatalf("round A: %+v %v", resA, err)
		}
		e.drive(a, resA.BatchID, 20*time.Second)
		resB, err := b.RunRound(bg, repo)
		if err != nil || resB.Outcome != store.ClaimClaimed {
			t.Fatalf("round B: %+v %v", resB, err)
		}
		if resA.BatchID != resB.BatchID {
			t.Fatalf("the two databases numbered their batches %d and %d; the test needs them equal", resA.BatchID, resB.BatchID)
		}
		driveStore(t, st2, b, resB.BatchID, 20*time.Second)

		e.requireFiles(repo, e.requireOps(idsA, domain.OpMerged), true)
		opsB := map[string]domain.Operation{}
		for _, id := range idsB {
			op, err := st2.OperationGet(bg, id)
			if err != nil {
				t.Fatal(err)
			}
			if op.Status != domain.OpMerged {
				t.Errorf("database B, operation %s: %s (%s: %s), want merged", id, op.Status, op.ErrorCode, op.ErrorMessage)
			}
			opsB[id] = op
		}
		e.requireFiles(repo, opsB, true)
	}
	// Each database's batches have MRs of their own.
	for id := int64(1); id <= 3; id++ {
		ba, _ := e.st.BatchGet(bg, id)
		bb, _ := st2.BatchGet(bg, id)
		if ba.MRIID == nil || bb.MRIID == nil || *ba.MRIID == *bb.MRIID || ba.SourceBranch == bb.SourceBranch {
			t.Errorf("batch %d: A %s %s, B %s %s — two databases share an MR or a branch", id, ba.SourceBranch, iidText(ba.MRIID), bb.SourceBranch, iidText(bb.MRIID))
		}
	}
}

// Issue #14, lie 1, the other way round: a database dropped and re-created against a
// project full of old merged batch MRs (a former installation's, under the branch names
// of that time and of installations since) starts at batch 1 and must write every file.
func TestRecreatedDatabaseIgnoresOldMergedBatchMRs(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	bg := context.Background()
	// The project's history: merged batch MRs 1..6 on the branch names a legacy
	// installation used (batcherd/batch-<id>) and on another installation's.
	for id := int64(1); id <= 6; id++ {
		for _, branch := range []string{fmt.Sprintf("batcherd/batch-%d", id), fmt.Sprintf("batcherd/oldinst01/batch-%d", id)} {
			if err := e.gl.EnsureBranch(bg, repo, branch, "main"); err != nil {
				t.Fatal(err)
			}
			path := fmt.Sprintf("bindings/old/%s-%d.yaml", strings.ReplaceAll(branch, "/", "_"), id)
			if _, err := e.gl.CommitFiles(bg, repo, branch, "", mr.BatchRef{ID: id}, "an old batch", []mr.FileAction{{Path: path, Content: "old: true\n"}}); err != nil {
				t.Fatal(err)
			}
			m, err := e.gl.EnsureMR(bg, repo, mr.MRSpec{SourceBranch: branch, Batch: mr.BatchRef{ID: id}, TargetBranch: "main", Title: "old batch", Labels: []string{mr.Label}})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.sim.MergeMR(repo, m.IID); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := e.scanner("new", nil)
	for round := range 6 {
		ids := storetest.InsertOps(t, e.st, storetest.Ops{Repo: repo, N: 3, Admit: true, Prefix: fmt.Sprintf("n%d", round)})
		res, err := s.RunRound(bg, repo)
		if err != nil || res.Outcome != store.ClaimClaimed {
			t.Fatalf("round: %+v %v", res, err)
		}
		b := e.drive(s, res.BatchID, 20*time.Second)
		if b.Status != domain.BatchSucceeded {
			t.Fatalf("batch %d: %s (%s: %s)", b.ID, b.Status, b.ErrorCode, b.ErrorMessage)
		}
		e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
	}
}

// An MR on the batch's own branch name whose commits do not carry this installation's
// trailers for the batch (a human pushed a branch of that name; a database restored
// from an old backup) is never adopted: the batch fails at once with a reason naming
// the MR, the MR is left as it is, and the members go on in a new batch (new branch)
// that writes their files.
func TestForeignMROnTheBatchBranchIsNeverAdopted(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	bg := context.Background()
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	s := e.scanner("a", nil)
	res, err := s.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	b, err := e.st.BatchGet(bg, res.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	// Someone else's merged MR on exactly that branch, its commit without our trailers.
	content := "someone: else\n"
	if _, err := e.sim.CommitToBranch(repo, b.SourceBranch, map[string]*string{"bindings/x/other.yaml": &content}, "someone's change\n\nBatcherd-Batch: 1"); err != nil {
		t.Fatal(err)
	}
	iid, err := e.sim.OpenMR(repo, b.SourceBranch, "main", []string{mr.Label}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.sim.MergeMR(repo, iid); err != nil {
		t.Fatal(err)
	}

	if err := s.publish.runOnce(bg); err != nil {
		t.Logf("publish pass: %v", err)
	}
	b, _ = e.st.BatchGet(bg, res.BatchID)
	if b.Status != domain.BatchFailed || b.ErrorCode != string(domain.ClassForeignMR) || !strings.Contains(b.ErrorMessage, fmt.Sprintf("!%d", iid)) {
		t.Fatalf("batch %d: %s %s %q; want failed %s naming !%d", b.ID, b.Status, b.ErrorCode, b.ErrorMessage, domain.ClassForeignMR, iid)
	}
	if b.MRIID != nil {
		t.Fatalf("the foreign MR was recorded as the batch's: !%d", *b.MRIID)
	}
	if m, _ := e.sim.MR(repo, iid); m.State != "merged" {
		t.Fatalf("foreign MR is %s", m.State)
	}
	// The members are retried in a new batch, on a new branch, and their files land
	// (the settle claims the retry group at once; a round would too).
	_, _ = s.RunRound(bg, repo)
	retry, err := e.st.BatchList(bg, store.BatchFilter{Repo: repo, Limit: 1})
	if err != nil || len(retry) != 1 || retry[0].ID == b.ID {
		t.Fatalf("no retry batch: %+v %v", retry, err)
	}
	if b2 := e.drive(s, retry[0].ID, 20*time.Second); b2.Status != domain.BatchSucceeded {
		t.Fatalf("retry batch: %s (%s: %s)", b2.Status, b2.ErrorCode, b2.ErrorMessage)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
}

// driveStore is env.drive for a scanner on another database.
func driveStore(t *testing.T, st *store.Store, s *Scanner, id int64, within time.Duration) domain.Batch {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		b, err := st.BatchGet(ctx, id)
		if err != nil {
			t.Fatalf("BatchGet(%d): %v", id, err)
		}
		if !b.Status.Active() {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %d still %s after %s", id, b.Status, within)
		}
		_ = s.publish.runOnce(ctx)
		_ = s.reconcile.runOnce(ctx)
		_ = s.timeout.runOnce(ctx)
		time.Sleep(20 * time.Millisecond)
	}
}

func iidText(p *int64) string {
	if p == nil {
		return "no MR"
	}
	return fmt.Sprintf("!%d", *p)
}

// The orphan sweep closes an open labelled MR on one of this installation's batch
// branches whose batch is not active — only when the MR is the batch's. A human's MR on
// that (predictable) branch name, without the batch's trailers, is left alone: closing
// it is not batcherd's to do, and had it merged while the sweep closed it, "merged wins"
// settled the FAILED batch SUCCEEDED with the human's merge — its members merged, none
// of their files written.
func TestOrphanSweepLeavesAForeignMROnABatchBranch(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	s := e.scanner("a", nil)
	bg := context.Background()
	res, err := s.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	branch := e.branch(res.BatchID)
	// A human's branch of that name and a labelled MR of it, before batcherd published.
	change := "a human's change\n"
	if _, err := e.sim.CommitToBranch(repo, branch, map[string]*string{"human.txt": &change}, "a human's change"); err != nil {
		t.Fatal(err)
	}
	iid, err := e.sim.OpenMR(repo, branch, "main", []string{mr.Label}, false)
	if err != nil {
		t.Fatal(err)
	}
	// The batch fails without an MR of its own (an operator's settle, say).
	b, _ := e.st.BatchGet(bg, res.BatchID)
	if _, err := e.st.BatchSettleFailed(bg, b.ID, b.Status, b.Version, "test", "failed before publishing"); err != nil {
		t.Fatal(err)
	}

	// The human merges the MR just as the sweep would close it: a close call is held on
	// its way to GitLab, and the MR merges meanwhile.
	fid := e.sim.InjectFault(gitlabsim.Fault{Method: "PUT", Route: "/projects/:id/merge_requests/:iid", Latency: 300 * time.Millisecond, Count: 1})
	done := make(chan error, 1)
	go func() { done <- s.orphans.runOnce(bg) }()
	merged := false
	for swept := false; !swept; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("orphan pass: %v", err)
			}
			swept = true
		case <-time.After(5 * time.Millisecond):
			if !merged && e.sim.FaultApplied(fid) > 0 {
				merged = true
				if err := e.sim.MergeMR(repo, iid); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if m, _ := e.sim.MR(repo, iid); !merged && m.State != "opened" {
		t.Fatalf("the sweep left the human's MR %s, want opened: not batcherd's to close", m.State)
	}
	// Merged now in any case; the sweeps that follow must not adopt it either.
	if !merged {
		if err := e.sim.MergeMR(repo, iid); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := s.orphans.runOnce(bg); err != nil {
			t.Fatalf("orphan pass: %v", err)
		}
	}
	got, _ := e.st.BatchGet(bg, res.BatchID)
	if got.Status != domain.BatchFailed || got.MRIID != nil {
		t.Fatalf("batch %s with MR %s, want failed with none: the merged MR is a human's", got.Status, iidText(got.MRIID))
	}
	for id, op := range e.ops(ids) {
		if op.Status == domain.OpMerged {
			t.Errorf("operation %s merged by a human's MR that carries none of its files", id)
		}
	}
}

// A database restored from an older backup keeps its installation id and issues the
// batch ids of the batches it forgot again; GitLab still has their MRs, merged, with
// this installation's trailers for that id. The re-issued batch was claimed at another
// time, and its commits carry that time (Batcherd-Batch-Claimed), so it never adopts
// the forgotten batch's MR: before, it settled its operations merged with none of their
// files written (a revoke then never applied). Here the restored database is a second
// database with the first one's installation id, numbering from 1 again.
func TestRestoredDatabaseNeverAdoptsAForgottenBatchesMR(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	bg := context.Background()
	a := e.scanner("before-restore", nil)
	idsA := storetest.InsertOps(t, e.st, storetest.Ops{Repo: repo, N: 3, Admit: true, Prefix: "forgotten"})
	resA, err := a.RunRound(bg, repo)
	if err != nil || resA.Outcome != store.ClaimClaimed {
		t.Fatalf("round before the restore: %+v %v", resA, err)
	}
	if b := e.drive(a, resA.BatchID, 20*time.Second); b.Status != domain.BatchSucceeded {
		t.Fatalf("batch before the restore: %s (%s)", b.Status, b.ErrorMessage)
	}
	e.requireFiles(repo, e.requireOps(idsA, domain.OpMerged), true)
	inst, err := e.st.Installation(bg)
	if err != nil {
		t.Fatal(err)
	}

	restored, _ := storetest.New(t)
	if _, err := restored.DB().Exec("UPDATE installation SET installation_id = ? WHERE singleton = 1", inst); err != nil {
		t.Fatal(err)
	}
	b := New(e.testConfig("after-restore"), restored, e.gl, testLogger(), prometheus.NewRegistry())
	idsB := storetest.InsertOps(t, restored, storetest.Ops{Repo: repo, N: 3, Admit: true, Prefix: "restored"})
	resB, err := b.RunRound(bg, repo)
	if err != nil || resB.Outcome != store.ClaimClaimed || resB.BatchID != resA.BatchID {
		t.Fatalf("round after the restore: %+v %v (the test needs batch %d again)", resB, err, resA.BatchID)
	}
	first := driveStore(t, restored, b, resB.BatchID, 20*time.Second)
	if first.Status != domain.BatchFailed || first.ErrorCode != string(domain.ClassForeignMR) {
		t.Fatalf("re-issued batch %d: %s %s %q; want failed %s (the forgotten batch's MR is not its own)",
			first.ID, first.Status, first.ErrorCode, first.ErrorMessage, domain.ClassForeignMR)
	}
	// Its members go on in a new batch and their files land.
	_, _ = b.RunRound(bg, repo)
	retry, err := restored.BatchList(bg, store.BatchFilter{Repo: repo, Limit: 1})
	if err != nil || len(retry) != 1 || retry[0].ID == first.ID {
		t.Fatalf("no retry batch: %+v %v", retry, err)
	}
	if b2 := driveStore(t, restored, b, retry[0].ID, 20*time.Second); b2.Status != domain.BatchSucceeded {
		t.Fatalf("retry batch: %s (%s: %s)", b2.Status, b2.ErrorCode, b2.ErrorMessage)
	}
	opsB := map[string]domain.Operation{}
	for _, id := range idsB {
		op, err := restored.OperationGet(bg, id)
		if err != nil || op.Status != domain.OpMerged {
			t.Fatalf("restored database, operation %s: %+v %v, want merged", id, op.Status, err)
		}
		opsB[id] = op
	}
	e.requireFiles(repo, opsB, true)
}
