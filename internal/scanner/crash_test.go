package scanner

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// crashAt returns a test hook that cancels the work context right after step: every
// later store or GitLab call of that replica fails, as if it died there.
func crashAt(step string, cancel context.CancelFunc, hit *bool) func(context.Context, string, int64) {
	return func(_ context.Context, s string, _ int64) {
		if s == step {
			*hit = true
			cancel()
		}
	}
}

// TestCrashAtEveryPublishStep abandons claim/publish right after each step boundary,
// then lets a fresh replica finish: one batch, one commit, one MR, every operation
// merged exactly once.
func TestCrashAtEveryPublishStep(t *testing.T) {
	steps := []string{
		"claim.in_tx", // inside the claim transaction, before COMMIT: the claim rolls back
		"claim.claimed",
		"publish.reserved",
		"publish.found",
		"publish.commit", // the commit created the branch; nothing recorded yet
		"publish.renewed",
		"publish.mr",
		"publish.recorded",
		"publish.armed",
	}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{PipelineDuration: 150 * time.Millisecond}, repo)
			ids := storetest.InsertQueuedOps(t, e.st, repo, 6)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			hit := false
			a := e.scanner("a", nil)
			if step == "claim.in_tx" {
				// A replica with its own pool whose claim dies before COMMIT.
				a = e.crashingClaimReplica(t, cancel, &hit)
			} else {
				a.testHook = crashAt(step, cancel, &hit)
			}
			res, _ := a.RunRound(ctx, repo)
			if ctx.Err() == nil {
				_ = a.publish.runOnce(ctx)
			}
			if !hit {
				t.Fatalf("step %s never reached", step)
			}
			// a is dead. A fresh replica takes over once a's reservation lapses.
			b := e.scanner("b", nil)
			bg := context.Background()
			id := res.BatchID
			if step == "claim.in_tx" {
				if n := e.countBatches(); n != 0 {
					t.Fatalf("a claim that died before COMMIT left %d batches", n)
				}
				// The dead claim's connection was closed, but the server rolls its
				// transaction back on its own time: until then its uncommitted slot row
				// answers slot_occupied, as a claimant meeting a live holder would be.
				// The fresh replica's later rounds then claim everything.
				r, err := b.RunRound(bg, repo)
				for deadline := time.Now().Add(10 * time.Second); err == nil && r.Outcome == store.ClaimSlotOccupied && time.Now().Before(deadline); {
					time.Sleep(50 * time.Millisecond)
					r, err = b.RunRound(bg, repo)
				}
				if err != nil || r.Outcome != store.ClaimClaimed || len(r.OperationIDs) != len(ids) {
					t.Fatalf("fresh replica's round: %+v %v", r, err)
				}
				id = r.BatchID
			}
			bt := e.drive(b, id, 15*time.Second)
			if bt.Status != domain.BatchSucceeded {
				t.Fatalf("batch %s (%s: %s), want succeeded", bt.Status, bt.ErrorCode, bt.ErrorMessage)
			}
			if len(bt.OperationIDs) != len(ids) {
				t.Errorf("batch has %d members, want %d", len(bt.OperationIDs), len(ids))
			}
			e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
			if mrs := e.mrsOf(repo, id); len(mrs) != 1 || mrs[0].State != "merged" {
				t.Errorf("MRs of the batch branch: %+v, want exactly one, merged", mrs)
			}
			if n := e.commitsMade(); n != 1 {
				t.Errorf("%d commits made, want 1", n)
			}
			if n := e.countBatches(); n != 1 {
				t.Errorf("%d batches, want 1", n)
			}
		})
	}
}

// crashingClaimReplica is a replica on its own connection pool whose claim
// transaction is cancelled after its guarded UPDATE, before COMMIT.
func (e *env) crashingClaimReplica(t *testing.T, cancel context.CancelFunc, hit *bool) *Scanner {
	t.Helper()
	st2, err := store.Open(context.Background(), e.dsn, store.Options{MaxOpenConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st2.Close() })
	st2.Hooks = &store.Hooks{ClaimAfterUpdate: func(context.Context, int64) { *hit = true; cancel() }}
	return New(e.testConfig("a"), st2, e.gl, testLogger(), prometheus.NewRegistry())
}

func (e *env) countBatches() int {
	e.t.Helper()
	var n int
	if err := e.st.DB().Get(&n, "SELECT COUNT(*) FROM merge_batch"); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestLostAnswers makes GitLab do the work of each publish call and then drop the
// connection: the replica never learns it succeeded, retries, and must not make a
// second branch, commit or MR.
func TestLostAnswers(t *testing.T) {
	routes := []struct{ method, route string }{
		{"POST", "/projects/:id/repository/commits"}, // the commit that creates the branch
		{"POST", "/projects/:id/merge_requests"},
		{"PUT", "/projects/:id/merge_requests/:iid/merge"},
	}
	for _, r := range routes {
		t.Run(r.method+" "+r.route, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{PipelineDuration: 100 * time.Millisecond}, repo)
			ids := storetest.InsertQueuedOps(t, e.st, repo, 4)
			fid := e.sim.InjectFault(gitlabsim.Fault{Method: r.method, Route: r.route, AfterWork: true, Drop: true, Count: 1})
			s := e.scanner("a", nil)
			res, err := s.RunRound(context.Background(), repo)
			if err != nil || res.Outcome != store.ClaimClaimed {
				t.Fatalf("round: %+v %v", res, err)
			}
			b := e.drive(s, res.BatchID, 15*time.Second)
			if e.sim.FaultApplied(fid) != 1 {
				t.Fatalf("fault on %s %s never applied", r.method, r.route)
			}
			if b.Status != domain.BatchSucceeded {
				t.Fatalf("batch %s (%s: %s)", b.Status, b.ErrorCode, b.ErrorMessage)
			}
			e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
			if mrs := e.mrsOf(repo, b.ID); len(mrs) != 1 {
				t.Errorf("%d MRs for the branch, want 1", len(mrs))
			}
			if n := e.commitsMade(); n != 1 {
				t.Errorf("%d commits made, want 1", n)
			}
		})
	}
}

// TestLostCloseAnswer: the timeout sweep's close is done by GitLab but its answer is
// lost; the settle still ends FAILED with the MR closed.
func TestLostCloseAnswer(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	// No retry: the timeout fails the members, which is what this test looks at.
	s := e.scanner("a", func(c *Config) { c.BatchTimeout = 400 * time.Millisecond; c.InfraRetries = -1 })
	// Published by a replica of the default timeout: under load a publish can outlast 400 ms.
	p := e.scanner("p", nil)
	bg := context.Background()
	res, _ := p.RunRound(bg, repo)
	if err := p.publish.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	if pb, _ := e.st.BatchGet(bg, res.BatchID); pb.MRIID == nil {
		t.Fatal("not published")
	}
	fid := e.sim.InjectFault(gitlabsim.Fault{Method: "PUT", Route: "/projects/:id/merge_requests/:iid", AfterWork: true, Drop: true, Count: 1})
	time.Sleep(500 * time.Millisecond)
	b := e.drive(s, res.BatchID, 10*time.Second)
	if e.sim.FaultApplied(fid) != 1 {
		t.Fatal("close fault never applied")
	}
	if b.Status != domain.BatchFailed || b.ErrorCode != string(domain.ClassTimeout) {
		t.Fatalf("batch %s %s, want failed timeout", b.Status, b.ErrorCode)
	}
	e.requireOps(ids, domain.OpFailed)
	if mrs := e.mrsOf(repo, b.ID); len(mrs) != 1 || mrs[0].State != "closed" {
		t.Errorf("MRs %+v, want one closed", mrs)
	}
}

// TestCrashAtEverySettleStep abandons the timeout sweep's settle failure right after
// each step; a fresh replica finishes it: FAILED with a reason, the one MR closed,
// nothing merged.
func TestCrashAtEverySettleStep(t *testing.T) {
	steps := []string{"timeout.reserved", "settle.found", "settle.marked", "settle.closed", "settle.reread", "settle.settled"}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
			ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
			// No retry: the timeout fails the members (retries have their own tests).
			timeout := func(c *Config) { c.BatchTimeout = 700 * time.Millisecond; c.InfraRetries = -1 }
			a := e.scanner("a", timeout)
			bg := context.Background()
			// Published by a replica with the default timeout: publish gives up on a batch
			// past its timeout, and on a loaded machine a publish can take longer than 700 ms.
			p := e.scanner("p", nil)
			res, _ := p.RunRound(bg, repo)
			if err := p.publish.runOnce(bg); err != nil {
				t.Fatal(err)
			}
			pb, _ := e.st.BatchGet(bg, res.BatchID)
			if pb.MRIID == nil {
				t.Fatal("not published")
			}
			time.Sleep(800 * time.Millisecond) // past a's batch timeout (DB clock)

			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			hit := false
			a.testHook = crashAt(step, cancel, &hit)
			_ = a.timeout.runOnce(ctx)
			if !hit {
				t.Fatalf("step %s never reached", step)
			}
			b := e.scanner("b", timeout)
			bt := e.drive(b, res.BatchID, 15*time.Second)
			// Crashed after the close: the class recorded before closing says batcherd
			// closed it, so the resumed settle is still a timeout, not closed_by_user.
			if bt.Status != domain.BatchFailed || bt.ErrorCode != string(domain.ClassTimeout) {
				t.Fatalf("batch %s %s, want failed timeout", bt.Status, bt.ErrorCode)
			}
			e.requireFiles(repo, e.requireOps(ids, domain.OpFailed), false)
			if mrs := e.mrsOf(repo, res.BatchID); len(mrs) != 1 || mrs[0].State != "closed" {
				t.Errorf("MRs of the batch branch: %+v, want exactly one, closed", mrs)
			}
		})
	}
}

// TestHumanMergeWhileTimeoutCloses: a human merges the MR between the timeout sweep's
// read and its close. Merged wins: SUCCEEDED, members merged.
func TestHumanMergeWhileTimeoutCloses(t *testing.T) {
	for _, step := range []string{"timeout.reserved", "settle.found"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
			ids := storetest.InsertQueuedOps(t, e.st, repo, 4)
			s := e.scanner("a", func(c *Config) { c.BatchTimeout = 500 * time.Millisecond })
			// Published by a replica of the default timeout (publish gives up on a batch past
			// its timeout, and a loaded machine's publish can take longer than 500 ms).
			p := e.scanner("p", nil)
			bg := context.Background()
			res, _ := p.RunRound(bg, repo)
			if err := p.publish.runOnce(bg); err != nil {
				t.Fatal(err)
			}
			b, _ := e.st.BatchGet(bg, res.BatchID)
			if b.MRIID == nil {
				t.Fatal("not published")
			}
			time.Sleep(600 * time.Millisecond)
			merged := false
			s.testHook = func(_ context.Context, st string, id int64) {
				if st == step && !merged {
					merged = true
					if err := e.sim.MergeMR(repo, *b.MRIID); err != nil {
						t.Errorf("human merge: %v", err)
					}
				}
			}
			if err := s.timeout.runOnce(bg); err != nil {
				t.Fatal(err)
			}
			if !merged {
				t.Fatal("the human never merged")
			}
			b, _ = e.st.BatchGet(bg, res.BatchID)
			if b.Status != domain.BatchSucceeded {
				t.Fatalf("batch %s (%s), want succeeded: merged wins", b.Status, b.ErrorCode)
			}
			e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
		})
	}
}

// TestStalePublisherIsFenced: a publisher stalls (GC pause, network) while an operator
// settles its batch as failed. Stalled before the MR exists, it wakes up to a
// reservation renewal that loses, and opens no MR at all; stalled after, its guarded
// MR write loses and it closes the MR it made. The MR never merges behind a FAILED
// batch, although the pipeline succeeds at once and auto-merge would merge it
// immediately.
func TestStalePublisherIsFenced(t *testing.T) {
	for _, step := range []string{"publish.found", "publish.commit", "publish.renewed", "publish.mr"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{}, repo) // pipelines succeed as created
			ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
			// A lease long enough that the publisher still holds it when it stalls, however
			// slowly a loaded machine got it to the step (300 ms lapsed on the way there).
			a := e.scanner("a", func(c *Config) { c.PublishLease = 3 * time.Second })
			bg := context.Background()
			res, _ := a.RunRound(bg, repo)
			paused, resume := make(chan struct{}), make(chan struct{})
			a.testHook = func(_ context.Context, s string, _ int64) {
				if s == step {
					close(paused)
					<-resume
				}
			}
			done := make(chan error, 1)
			go func() { done <- a.publish.runOnce(bg) }()
			<-paused

			// While the publisher's reservation is live the operator is asked to wait
			// (its MR may be opening); the publisher stalls past it.
			op := e.scanner("admin", nil)
			if _, err := op.SettleBatch(bg, res.BatchID); !errors.Is(err, store.ErrBatchPublishing) {
				t.Fatalf("SettleBatch under a live publish reservation: %v, want ErrBatchPublishing", err)
			}
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if busy, err := e.st.BatchPublishing(bg, res.BatchID); err != nil || !busy {
					break
				} else if time.Now().After(deadline) {
					t.Fatal("the publish reservation never lapsed")
				}
			}
			b, err := op.SettleBatch(bg, res.BatchID)
			if err != nil || b.Status != domain.BatchFailed || b.ErrorCode != string(domain.ClassManual) {
				t.Fatalf("SettleBatch: %+v %v", b, err)
			}
			close(resume)
			if err := <-done; err != nil {
				t.Fatalf("stale publish pass: %v", err)
			}

			b, _ = e.st.BatchGet(bg, res.BatchID)
			if b.Status != domain.BatchFailed {
				t.Fatalf("batch %s, want failed", b.Status)
			}
			for _, m := range e.mrsOf(repo, res.BatchID) {
				if m.State != "closed" {
					t.Errorf("MR !%d is %s behind a FAILED batch, want closed", m.IID, m.State)
				}
			}
			if n := len(e.mrsOf(repo, res.BatchID)); n > 1 {
				t.Errorf("%d MRs for one branch", n)
			} else if opened := step == "publish.renewed" || step == "publish.mr"; !opened && n != 0 {
				t.Errorf("an MR was opened for batch %d after it had failed, by a publisher stalled at %s", res.BatchID, step)
			}
			e.requireFiles(repo, e.requireOps(ids, domain.OpFailed), false)
		})
	}
}

// TestOrphanSweep: an open labelled MR whose batch is not active is closed; a FAILED
// batch whose MR a human merged anyway becomes SUCCEEDED with an audit event.
func TestOrphanSweep(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	s := e.scanner("a", func(c *Config) { c.MergeMode = MergeManual })
	bg := context.Background()

	publishOne := func() (domain.Batch, []string) {
		ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
		res, err := s.RunRound(bg, repo)
		if err != nil || res.Outcome != store.ClaimClaimed {
			t.Fatalf("round: %+v %v", res, err)
		}
		if err := s.publish.runOnce(bg); err != nil {
			t.Fatal(err)
		}
		b, _ := e.st.BatchGet(bg, res.BatchID)
		return b, ids
	}
	// Fail each batch in the database only, leaving its MR open, as a publisher that
	// lost to a settler before the settler could see its MR would.
	failInDBOnly := func(b domain.Batch) domain.Batch {
		fb, err := e.st.BatchSettleFailed(bg, b.ID, b.Status, b.Version, "test", "failed behind an open MR")
		if err != nil {
			t.Fatal(err)
		}
		return fb
	}

	b1, ids1 := publishOne()
	failInDBOnly(b1)
	b2, ids2 := publishOne()
	failInDBOnly(b2)
	// A human merges the second one anyway.
	if err := e.sim.MergeMR(repo, *b2.MRIID); err != nil {
		t.Fatal(err)
	}
	// A labelled MR on a branch that is not a batch branch is left alone.
	// (Open a third batch and keep it active: its MR must stay open too.)
	b3, _ := publishOne()

	if err := s.orphans.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	if m, _ := e.sim.MR(repo, *b1.MRIID); m.State != "closed" {
		t.Errorf("orphan MR of a failed batch is %s, want closed", m.State)
	}
	e.requireOps(ids1, domain.OpFailed)
	got, _ := e.st.BatchGet(bg, b2.ID)
	if got.Status != domain.BatchSucceeded {
		t.Errorf("failed batch whose MR merged is %s, want succeeded", got.Status)
	}
	e.requireFiles(repo, e.requireOps(ids2, domain.OpMerged), true)
	var n int
	if err := e.st.DB().Get(&n, "SELECT COUNT(*) FROM audit_event WHERE batch_id = ? AND code = 'merged_after_failed'", b2.ID); err != nil || n != 1 {
		t.Errorf("merged_after_failed events: %d %v", n, err)
	}
	if m, _ := e.sim.MR(repo, *b3.MRIID); m.State != "opened" {
		t.Errorf("MR of an active batch is %s, want opened", m.State)
	}
	// Idempotent: a second pass changes nothing.
	if err := s.orphans.runOnce(bg); err != nil {
		t.Fatal(err)
	}
	if err := e.st.DB().Get(&n, "SELECT COUNT(*) FROM audit_event WHERE batch_id = ? AND code = 'merged_after_failed'", b2.ID); err != nil || n != 1 {
		t.Errorf("after a second pass, merged_after_failed events: %d %v", n, err)
	}
}

// TestSettleBatchAdmin covers the admin settle: active → FAILED with the MR closed,
// settled batches returned as they are, unknown ids not found.
func TestSettleBatchAdmin(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	s := e.scanner("a", nil)
	bg := context.Background()
	res, _ := s.RunRound(bg, repo)
	_ = s.publish.runOnce(bg)
	b, err := s.SettleBatch(bg, res.BatchID)
	if err != nil || b.Status != domain.BatchFailed || len(b.OperationIDs) != 2 {
		t.Fatalf("SettleBatch = %+v, %v", b, err)
	}
	if m, _ := e.sim.MR(repo, *b.MRIID); m.State != "closed" {
		t.Errorf("MR %s after admin settle", m.State)
	}
	e.requireOps(ids, domain.OpFailed)
	again, err := s.SettleBatch(bg, res.BatchID)
	if err != nil || again.Status != domain.BatchFailed || again.Version != b.Version {
		t.Errorf("second SettleBatch changed something: %+v %v", again, err)
	}
	if _, err := s.SettleBatch(bg, 987654); err == nil {
		t.Errorf("SettleBatch of an unknown id succeeded")
	} else if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SettleBatch of an unknown id: %v", err)
	}
}

// TestStalePublisherAfterSuccess: a publisher stalls after opening the MR; its lease
// lapses, another replica records the same MR and the batch merges. When the stale one
// wakes up, its guarded write loses and it leaves the merged MR and batch alone.
func TestStalePublisherAfterSuccess(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{PipelineDuration: 50 * time.Millisecond}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	a := e.scanner("a", nil)
	bg := context.Background()
	res, _ := a.RunRound(bg, repo)
	paused, resume := make(chan struct{}), make(chan struct{})
	a.testHook = func(_ context.Context, s string, _ int64) {
		if s == "publish.mr" {
			close(paused)
			<-resume
		}
	}
	done := make(chan error, 1)
	go func() { done <- a.publish.runOnce(bg) }()
	<-paused
	time.Sleep(400 * time.Millisecond) // a's publish lease lapses
	b := e.drive(e.scanner("b", nil), res.BatchID, 10*time.Second)
	if b.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s", b.Status)
	}
	close(resume)
	if err := <-done; err != nil {
		t.Fatalf("stale publish pass: %v", err)
	}
	b, _ = e.st.BatchGet(bg, res.BatchID)
	if b.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s after the stale publisher woke", b.Status)
	}
	if mrs := e.mrsOf(repo, res.BatchID); len(mrs) != 1 || mrs[0].State != "merged" {
		t.Errorf("MRs %+v, want one merged", mrs)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
}
