package scanner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// logBuffer collects a scanner's log lines so a test can check what was reported.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// loggedScanner is e.scanner with its log lines (warn and above) kept in the returned
// buffer.
func (e *env) loggedScanner(name string) (*Scanner, *logBuffer) {
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return New(e.testConfig(name), e.st, e.gl, log, prometheus.NewRegistry()), logs
}

// TestPanicInWorkerFailsOnlyItsItem: a panic while publishing one batch happens on a
// forEach worker goroutine, out of runPass's reach. It must fail that batch only
// (logged with its id and stack, counted), not end the process, and the pass's other
// batches must still be published. A pass whose every item panicked fails, so the
// loop backs off.
func TestPanicInWorkerFailsOnlyItsItem(t *testing.T) {
	repos := []string{"platform/a", "platform/b", "platform/c"}
	e := newEnv(t, gitlabsim.Options{}, repos...)
	bg := context.Background()
	s, logs := e.loggedScanner("a")
	batches := map[string]int64{}
	for _, r := range repos {
		storetest.InsertQueuedOps(t, e.st, r, 1)
		res, err := s.RunRound(bg, r)
		if err != nil || res.Outcome != store.ClaimClaimed {
			t.Fatalf("round %s: %+v %v", r, res, err)
		}
		batches[r] = res.BatchID
	}
	bad := batches["platform/a"]
	var panics atomic.Int32
	s.testHook = func(_ context.Context, step string, id int64) {
		if step == "publish.reserved" && id == bad {
			panics.Add(1)
			panic("bad batch")
		}
	}
	publish := loopSpec{name: "publish", run: s.publish.runOnce}

	// The pass survives the panic; the other batches are published.
	if err := s.runPass(bg, publish, s.log); err != nil {
		t.Fatalf("a pass where one of three batches panicked returned %v, want nil", err)
	}
	if panics.Load() != 1 {
		t.Fatalf("the hook panicked %d times, want 1", panics.Load())
	}
	for r, id := range batches {
		b, err := e.st.BatchGet(bg, id)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := b.MRIID != nil, id != bad; got != want {
			t.Errorf("batch %d of %s: MR recorded %v, want %v", id, r, got, want)
		}
	}
	// The panic is reported: at Error with the batch and the stack, and counted.
	out := logs.String()
	for _, want := range []string{"level=ERROR", "loop item panicked", fmt.Sprintf("batch_id=%d", bad), "panic=\"bad batch\"", "loop=publish", "stack="} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("publish", "panic")); n != 1 {
		t.Errorf("publish panic errors counted: %v, want 1", n)
	}

	// Once its reservation lapses the bad batch is the pass's only item: the panic
	// fails the whole pass.
	var err error
	waitUntil(t, 5*time.Second, "the bad batch to be published again", func() bool {
		err = s.runPass(bg, publish, s.log)
		return panics.Load() == 2
	})
	if !errors.Is(err, errSomeFailed) {
		t.Errorf("a pass whose only batch panicked returned %v, want errSomeFailed", err)
	}
}

// TestBackoffNeverShortensInterval: a loop whose interval is longer than BackoffMax
// must not run more often while it fails than while it succeeds. A healthy and a
// failing loop with the same interval run side by side until the healthy one has made
// five passes; the failing one must not have made more than a couple more.
func TestBackoffNeverShortensInterval(t *testing.T) {
	s := New(Config{StartJitter: time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond},
		nil, nil, nil, prometheus.NewRegistry())
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	var healthy, failing atomic.Int32
	const interval, passes = 50 * time.Millisecond, 5
	var wg sync.WaitGroup
	wg.Go(func() {
		s.runLoop(stop, context.Background(), loopSpec{name: "healthy", every: interval, run: func(context.Context) error {
			if healthy.Add(1) == passes {
				cancel()
			}
			return nil
		}})
	})
	wg.Go(func() {
		s.runLoop(stop, context.Background(), loopSpec{name: "failing", every: interval, run: func(context.Context) error {
			failing.Add(1)
			return errors.New("one repository keeps failing")
		}})
	})
	wg.Wait()
	if h, f := healthy.Load(), failing.Load(); f > h+2 {
		t.Errorf("interval %s, BackoffMax 5ms: the failing loop made %d passes while the healthy one made %d", interval, f, h)
	}
}

// TestOrphanSweepSurvivesOneBrokenRepo: one repository whose MRs cannot be listed (an
// archived project, lost access) must not stop the sweep of the others, and must not
// fail the pass (which would back the loop off and report it failed for as long as
// the repository stays broken); it is logged with the repository and counted. Only a
// pass where every repository failed fails.
func TestOrphanSweepSurvivesOneBrokenRepo(t *testing.T) {
	const healthy, broken = "platform/healthy", "platform/archived"
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, broken, healthy)
	bg := context.Background()
	s, logs := e.loggedScanner("a")

	// An open labelled MR of a batch the database does not know (with that batch's
	// commit, so it is batcherd's): an orphan.
	branch := e.branch(999999)
	if _, err := e.gl.CommitFiles(bg, healthy, branch, "main", mr.BatchRef{ID: 999999}, "orphan", []mr.FileAction{{Path: "orphan.txt", Content: "x\n"}}); err != nil {
		t.Fatal(err)
	}
	orphan, err := e.gl.EnsureMR(bg, healthy, mr.MRSpec{SourceBranch: branch, Batch: mr.BatchRef{ID: 999999}, TargetBranch: "main", Title: "orphan"})
	if err != nil {
		t.Fatal(err)
	}
	listRoute := "/projects/:id/merge_requests"
	fid := e.sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: listRoute, PathContains: url.PathEscape(broken), Status: 403})

	if err := s.orphans.runOnce(bg); err != nil {
		t.Errorf("orphan pass with one broken repository returned %v, want nil", err)
	}
	if e.sim.FaultApplied(fid) == 0 {
		t.Fatal("the broken repository's list call was not faulted")
	}
	if m, _ := e.sim.MR(healthy, orphan.IID); m.State != mr.StateClosed {
		t.Errorf("orphan MR in the healthy repository is %s, want closed", m.State)
	}
	out := logs.String()
	for _, want := range []string{"listing open batch MRs failed", "repo=" + broken} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if n := testutil.ToFloat64(s.m.errors.WithLabelValues("orphans", "gitlab_permanent")); n != 1 {
		t.Errorf("orphan errors counted: %v, want 1", n)
	}

	// Every repository broken: the pass fails, so the loop backs off.
	e.sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: listRoute, PathContains: url.PathEscape(healthy), Status: 403})
	if err := s.orphans.runOnce(bg); !errors.Is(err, errSomeFailed) {
		t.Errorf("orphan pass with every repository broken returned %v, want errSomeFailed", err)
	}
}

// The merged-wins check pages through the failed batches pass by pass: with more of
// them than one page holds, re-reading the first page every pass never reached the
// newest, whose members stayed failed although the repository had their files.
func TestMergedWinsReachesEveryFailedBatch(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	s := e.scanner("a", func(c *Config) { c.MergeMode = MergeManual; c.ScanLimit = 2 })
	bg := context.Background()
	var last domain.Batch
	var lastIDs []string
	for i := 0; i < 5; i++ {
		ids := storetest.InsertQueuedOps(t, e.st, repo, 1)
		b := e.published(s, repo)
		// Failed in the database only, its MR left as it is.
		var err error
		if last, err = e.st.BatchSettleFailed(bg, b.ID, b.Status, b.Version, "test", "failed behind its MR"); err != nil {
			t.Fatal(err)
		}
		lastIDs = ids
	}
	// A human merges the newest one anyway (the others' MRs the sweep closes).
	if err := e.sim.MergeMR(repo, *last.MRIID); err != nil {
		t.Fatal(err)
	}
	// Five failed batches, two per page: the newest is on the third page.
	for pass := 0; pass < 3; pass++ {
		if err := s.orphans.runOnce(bg); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := e.st.BatchGet(bg, last.ID); got.Status != domain.BatchSucceeded {
		t.Fatalf("the newest failed batch, merged by hand, is %s after three passes, want succeeded", got.Status)
	}
	e.requireOps(lastIDs, domain.OpMerged)
}

// A batch whose changes the repository already has (revokes of files a human deleted)
// is settled succeeded without an MR: an MR without commits is one GitLab never merges
// (it reports it as has_conflicts), which used to fail the batch as a merge conflict
// and then blame its revokes as culprits.
func TestNothingToChangeSettlesWithoutAnMR(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	s := e.scanner("a", nil)
	bg := context.Background()
	ids := storetest.InsertOps(t, e.st, storetest.Ops{Repo: repo, N: 3, Action: domain.ActionRevoke, Admit: true})
	res, err := s.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	if err := s.publish.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	b, _ := e.st.BatchGet(bg, res.BatchID)
	if b.Status != domain.BatchSucceeded || b.MRIID != nil {
		t.Fatalf("batch of revokes of absent files: %s, MR %v; want succeeded without an MR", b.Status, b.MRIID)
	}
	if n := len(e.sim.MRsByBranch(repo)); n != 0 {
		t.Fatalf("%d MRs opened for it", n)
	}
	if _, ok := e.sim.Branches(repo)[e.branch(b.ID)]; ok {
		t.Fatal("the empty batch branch was left behind")
	}
	e.requireOps(ids, domain.OpMerged)
	var why int
	if err := e.st.DB().Get(&why, "SELECT COUNT(*) FROM audit_event WHERE batch_id = ? AND code = ?", b.ID, store.EventBatchUnchanged); err != nil || why != 1 {
		t.Fatalf("%d %s events for the batch (%v), want one saying why it has no MR", why, store.EventBatchUnchanged, err)
	}
	for _, id := range ids {
		op, _ := e.st.OperationGet(bg, id)
		bs, _ := e.st.BindingList(bg, op.Subject, op.Target, 0, 1)
		if len(bs) != 1 || bs[0].Status != domain.BindingClosed {
			t.Fatalf("binding of %s: %+v, want closed", id, bs)
		}
	}
}

// Once someone pushed to the batch branch, a pipeline failing on their commit is not
// the members' failure: the batch blocks for an operator (head_moved) in isolate mode
// too, instead of closing the MR (discarding the push) and bisecting the members.
func TestHeadMovedBlocksEvenWhenItsPipelineFails(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 4)
	s := e.scanner("a", nil) // isolate, the default
	bg := context.Background()
	b := e.published(s, repo)
	if _, err := e.gl.CommitFiles(bg, repo, e.branch(b.ID), "", mr.BatchRef{ID: 999999}, "a human's fix", []mr.FileAction{{Path: "human.txt", Content: "x\n"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.FailMRPipeline(repo, *b.MRIID, "script_failure"); err != nil {
		t.Fatal(err)
	}
	e.due(b.ID)
	if err := s.reconcile.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	b, _ = e.st.BatchGet(bg, b.ID)
	if b.Status != domain.BatchBlocked || b.ErrorCode != domain.BlockHeadMoved {
		t.Fatalf("pipeline failed on a human's push: batch %s/%s, want blocked/%s", b.Status, b.ErrorCode, domain.BlockHeadMoved)
	}
	if m, _ := e.sim.MR(repo, *b.MRIID); m.State != "opened" {
		t.Fatalf("the MR with the human's push is %s, want opened", m.State)
	}
	e.requireOps(ids, domain.OpInBatch)
}

// A settle that found its culprit (this batch was bisection half 1) claims the next
// half at once, like a settle that bisected: it used to wait for the scheduled round.
func TestCulpritSettleClaimsTheNextHalf(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	storetest.InsertQueuedOps(t, e.st, repo, 2)
	// No flake retry: the lone member's failure names it the culprit at once (the flake
	// retry has its own test, TestFlakyLoneMemberIsNotACulprit).
	s := e.scanner("a", func(c *Config) { c.ClaimSchedule = "@every 1h"; c.FlakeRetries = -1 })
	bg := context.Background()
	failActive := func() {
		t.Helper()
		if err := s.publish.runOnce(bg); err != nil {
			t.Fatal(err)
		}
		var act []domain.Batch
		if err := e.st.DB().Select(&act, "SELECT id, mr_iid FROM merge_batch WHERE status IN (1, 4) AND mr_iid IS NOT NULL"); err != nil || len(act) != 1 {
			t.Fatalf("active published batches: %+v %v, want one", act, err)
		}
		if err := e.sim.FailMRPipeline(repo, *act[0].MRIID, "script_failure"); err != nil {
			t.Fatal(err)
		}
		e.due(act[0].ID)
		if err := s.reconcile.runOnce(bg); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := s.RunRound(bg, repo); err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	failActive() // both members: test failure → bisect, half 1 claimed at once
	failActive() // half 1 alone fails: its member is the culprit
	var active, waiting int
	if err := e.st.DB().Get(&active, "SELECT COUNT(*) FROM merge_batch WHERE status IN (1, 4)"); err != nil {
		t.Fatal(err)
	}
	if err := e.st.DB().Get(&waiting, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id IS NULL"); err != nil {
		t.Fatal(err)
	}
	if active != 1 || waiting != 0 {
		t.Fatalf("after the culprit's settle: %d active batches, %d waiting rows; want half 2 claimed", active, waiting)
	}
}

// A failed pipeline whose reason GitLab would not give (the jobs listing refused) is not
// classified as "unknown": reconcile looks again, and once the reason can be read the
// failure is isolated as what it was — here an infrastructure failure, retried as a
// group, never a member blamed as the culprit.
func TestUnreadableFailureReasonWaits(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 1)
	s := e.scanner("a", nil)
	bg := context.Background()
	b := e.published(s, repo)
	if err := e.sim.FailMRPipeline(repo, *b.MRIID, "runner_system_failure"); err != nil {
		t.Fatal(err)
	}
	refused := e.sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id/pipelines/:pid/jobs", Status: 403})
	e.due(b.ID)
	_ = s.reconcile.runOnce(bg) // the item fails: the reason could not be read
	if e.sim.FaultApplied(refused) == 0 {
		t.Fatal("the jobs listing was not read")
	}
	if got, _ := e.st.BatchGet(bg, b.ID); got.Status != domain.BatchRunning {
		t.Fatalf("batch settled on a reason it could not read: %s/%s", got.Status, got.ErrorCode)
	}
	e.sim.ClearFaults()
	e.due(b.ID)
	if err := s.reconcile.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	got, _ := e.st.BatchGet(bg, b.ID)
	if got.Status != domain.BatchFailed || got.ErrorCode != string(domain.ClassInfra) {
		t.Fatalf("once readable: batch %s/%s, want failed/%s", got.Status, got.ErrorCode, domain.ClassInfra)
	}
	for _, op := range e.requireOps(ids, domain.OpInBatch) { // retried as a group, claimed at once
		if op.ErrorCode == domain.ReasonCulprit {
			t.Fatalf("%s named the culprit of an infrastructure failure", op.OperationID)
		}
	}
}

// A locked MR (GitLab is merging it) is looked at again, never settled on: reconcile
// leaves it, an operator's settle is told it is still open (GitLab does not close a
// locked MR), and once the merge lands the batch succeeds.
func TestLockedMRIsWaitedFor(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	s := e.scanner("a", func(c *Config) { c.MergeMode = MergeManual })
	bg := context.Background()
	b := e.published(s, repo)
	if err := e.sim.LockMR(repo, *b.MRIID); err != nil {
		t.Fatal(err)
	}
	e.due(b.ID)
	if err := s.reconcile.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.st.BatchGet(bg, b.ID); !got.Status.Active() {
		t.Fatalf("reconcile settled a batch whose MR is being merged: %s/%s", got.Status, got.ErrorCode)
	}
	if _, err := s.SettleBatch(bg, b.ID); !errors.Is(err, mr.ErrStillOpen) {
		t.Fatalf("settling a batch whose MR is being merged: %v, want mr.ErrStillOpen", err)
	}
	if m, _ := e.sim.MR(repo, *b.MRIID); m.State != "locked" {
		t.Fatalf("the locked MR is %s", m.State)
	}
	if err := e.sim.UnlockMR(repo, *b.MRIID, true); err != nil {
		t.Fatal(err)
	}
	e.due(b.ID)
	if err := s.reconcile.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.st.BatchGet(bg, b.ID); got.Status != domain.BatchSucceeded {
		t.Fatalf("after the merge landed: %s/%s, want succeeded", got.Status, got.ErrorCode)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
}
