package scanner

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// The end-to-end scenarios — publish → merge, failure isolation, crash resume — against
// each GitLab version the simulator speaks × each merge method. In the suite a
// representative slice runs: every version once and every merge method once (a Latin
// square, 3 cells). BATCHERD_GITLAB_MATRIX=full (make gitlab-matrix) runs all 9.
// Every cell also computes mergeability asynchronously, creates each pipeline after a
// read of its MR (405 to merge calls meanwhile), and moves the target branch
// under a batch, so the rebase path of ff and rebase_merge is on the way of each.
type matrixCell struct{ version, method string }

func matrixCells() []matrixCell {
	if os.Getenv("BATCHERD_GITLAB_MATRIX") == "full" {
		var all []matrixCell
		for _, v := range gitlabsim.Versions {
			for _, m := range gitlabsim.MergeMethods {
				all = append(all, matrixCell{v, m})
			}
		}
		return all
	}
	return []matrixCell{
		{gitlabsim.Version16, gitlabsim.MergeMethodMerge},
		{gitlabsim.Version17, gitlabsim.MergeMethodFastForward},
		{gitlabsim.Version18, gitlabsim.MergeMethodRebaseMerge},
	}
}

func (c matrixCell) options() gitlabsim.Options {
	return gitlabsim.Options{Version: c.version, MergeMethod: c.method, MergeCheckReads: 2, PipelineCreateReads: 1, PipelineDuration: 30 * time.Millisecond}
}

// moveTarget lands a human's commit on the default branch (a file no batch touches).
func (e *env) moveTarget(label string) {
	e.t.Helper()
	content := label
	if _, err := e.sim.PushToDefault(repo, map[string]*string{"human/" + label + ".txt": &content}, "human "+label); err != nil {
		e.t.Fatal(err)
	}
}

func TestGitLabMatrix(t *testing.T) {
	t.Parallel()
	for _, cell := range matrixCells() {
		name := strings.SplitN(cell.version, ".", 3)[0] + "." + strings.SplitN(cell.version, ".", 3)[1] + "_" + cell.method
		t.Run(name, func(t *testing.T) {
			t.Run("publish_merge", func(t *testing.T) {
				t.Parallel()
				// Pipelines take long enough here that the target moves before the MR
				// could merge: every batch of ff and rebase_merge needs its rebase.
				opts := cell.options()
				opts.PipelineDuration = 300 * time.Millisecond
				e := newEnv(t, opts, repo)
				ids := storetest.InsertQueuedOps(t, e.st, repo, 6)
				b := e.published(e.scanner("p", longTimeout), repo)
				e.moveTarget("under-the-batch")
				c := e.startCluster(2, longTimeout)
				e.settleAll(30 * time.Second)
				c.stop()
				e.requireOutcome(ids)
				e.requireClean()
				got, _ := e.st.BatchGet(context.Background(), b.ID)
				if got.Status != domain.BatchSucceeded {
					t.Fatalf("batch %s (%s)", got.Status, got.ErrorCode)
				}
				if cell.method != gitlabsim.MergeMethodMerge && got.MRSHA == b.MRSHA {
					t.Errorf("%s: merged without recording a rebased head", cell.method)
				}
				if n := e.maxTries(); n != 1 {
					t.Errorf("an operation was charged %d attempts", n)
				}
			})
			t.Run("isolation", func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, cell.options(), repo)
				ids := storetest.InsertQueuedOps(t, e.st, repo, 8)
				poison := ids[5]
				e.poison(poison, "script_failure", 0)
				c := e.startCluster(2, longTimeout)
				if _, err := c.scanners[0].RunRound(context.Background(), repo); err != nil {
					t.Fatal(err)
				}
				e.moveTarget("during-isolation")
				e.settleAll(60 * time.Second)
				c.stop()
				e.requireOutcome(ids, poison)
				e.requireClean()
			})
			t.Run("crash_resume", func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, cell.options(), repo)
				for _, step := range []string{"publish.mr", "publish.recorded"} {
					ids := storetest.InsertQueuedOps(t, e.st, repo, 4)
					ctx, cancel := context.WithCancel(context.Background())
					hit := false
					a := e.scanner("a", longTimeout)
					a.testHook = crashAt(step, cancel, &hit)
					res, _ := a.RunRound(ctx, repo)
					if ctx.Err() == nil {
						_ = a.publish.runOnce(ctx)
					}
					cancel()
					if !hit {
						t.Fatalf("step %s never reached", step)
					}
					e.moveTarget("after-the-crash")
					b := e.scanner("b", longTimeout)
					if got := e.drive(b, res.BatchID, 30*time.Second); got.Status != domain.BatchSucceeded {
						t.Fatalf("%s: batch %s (%s: %s)", step, got.Status, got.ErrorCode, got.ErrorMessage)
					}
					e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
					if mrs := e.mrsOf(repo, res.BatchID); len(mrs) != 1 || mrs[0].State != "merged" {
						t.Errorf("%s: MRs of the batch branch: %+v, want exactly one, merged", step, mrs)
					}
					e.requireClean()
				}
			})
		})
	}
}
