package scanner

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
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

const repo = "platform/access"

func TestHappyPathAutoMerge(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{PipelineDuration: 50 * time.Millisecond}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 7)
	s := e.scanner("a", nil)
	ctx := context.Background()

	res, err := s.RunRound(ctx, repo)
	if err != nil || res.Outcome != store.ClaimClaimed || len(res.OperationIDs) != 7 {
		t.Fatalf("RunRound = %+v, %v", res, err)
	}
	if err := s.publish.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := e.st.BatchGet(ctx, res.BatchID)
	if err != nil || b.MRIID == nil || b.MRSHA == "" {
		t.Fatalf("after publish: %+v, %v", b, err)
	}
	m, ok := e.sim.MR(repo, *b.MRIID)
	if !ok || m.SourceBranch != e.branch(b.ID) || !m.AutoMerge && m.State != "merged" {
		t.Fatalf("MR after publish: %+v", m)
	}
	if !containsAll(m.Labels, mr.Label) {
		t.Errorf("MR labels %v lack %q", m.Labels, mr.Label)
	}
	b = e.drive(s, res.BatchID, 10*time.Second)
	if b.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s (%s: %s), want succeeded", b.Status, b.ErrorCode, b.ErrorMessage)
	}
	ops := e.requireOps(ids, domain.OpMerged)
	e.requireFiles(repo, ops, true)
	if n := len(e.mrsOf(repo, b.ID)); n != 1 {
		t.Errorf("%d MRs for the batch branch, want 1", n)
	}
	if n := e.commitsMade(); n != 1 {
		t.Errorf("%d commits made, want 1", n)
	}

	// The MR description lists the batch id and every operation id (README, "Files written to the repository").
	desc := mrDescriptionOf(t, e, repo, *b.MRIID)
	for _, id := range ids {
		if !strings.Contains(desc, id) {
			t.Errorf("MR description lacks operation %s", id)
		}
	}
	if !strings.Contains(desc, strconv.FormatInt(b.ID, 10)) {
		t.Errorf("MR description lacks the batch id")
	}

	// Next round: nothing waiting.
	res, err = s.RunRound(ctx, repo)
	if err != nil || res.Outcome != store.ClaimNothingToClaim {
		t.Fatalf("second RunRound = %+v, %v", res, err)
	}
}

// mrDescriptionOf reads an MR's description over the simulator's REST API (the
// layer's MergeRequest does not carry it).
func mrDescriptionOf(t *testing.T, e *env, project string, iid int64) string {
	t.Helper()
	req, _ := http.NewRequest("GET", e.sim.URL()+"/api/v4/projects/"+url.PathEscape(project)+"/merge_requests/"+strconv.FormatInt(iid, 10), nil)
	req.Header.Set("PRIVATE-TOKEN", e.sim.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Description string `json:"description"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Description
}

func containsAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

func TestRevokeDeletesFile(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	s := e.scanner("a", nil)
	ctx := context.Background()
	grants := storetest.InsertQueuedOps(t, e.st, repo, 3)
	res, err := s.RunRound(ctx, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("RunRound = %+v, %v", res, err)
	}
	if b := e.drive(s, res.BatchID, 10*time.Second); b.Status != domain.BatchSucceeded {
		t.Fatalf("grant batch %s", b.Status)
	}
	gops := e.requireOps(grants, domain.OpMerged)
	e.requireFiles(repo, gops, true)

	// Revoke the first grant through the expiry path: an expired active binding gets a
	// revoke operation, which the next round deletes.
	first := gops[grants[0]]
	if _, err := e.st.DB().ExecContext(ctx,
		"UPDATE binding SET expires_at = CURRENT_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE subject = ? AND target = ?",
		first.Subject, first.Target); err != nil {
		t.Fatal(err)
	}
	if err := s.expiry.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = s.RunRound(ctx, repo)
	if err != nil || res.Outcome != store.ClaimClaimed || len(res.OperationIDs) != 1 {
		t.Fatalf("revoke RunRound = %+v, %v", res, err)
	}
	if b := e.drive(s, res.BatchID, 10*time.Second); b.Status != domain.BatchSucceeded {
		t.Fatalf("revoke batch %s", b.Status)
	}
	e.requireOps(res.OperationIDs, domain.OpMerged)
	if _, ok := e.sim.Files(repo)[domain.BindingPath(first.Subject, first.Target)]; ok {
		t.Errorf("revoked binding's file still on main")
	}
	bs, err := e.st.BindingList(ctx, first.Subject, first.Target, 0, 10)
	if err != nil || len(bs) != 1 || bs[0].Status != domain.BindingClosed {
		t.Errorf("binding after revoke: %+v, %v", bs, err)
	}
	// A second expiry pass finds nothing to do.
	if err := s.expiry.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if res, _ := s.RunRound(ctx, repo); res.Outcome != store.ClaimNothingToClaim {
		t.Errorf("after revoke, round = %s", res.Outcome)
	}
}

func TestPipelineFailureBlocksThenUnblocks(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	// Block mode: a failed pipeline waits for an operator instead of being isolated.
	s := e.scanner("a", func(c *Config) { c.OnFailure = FailureBlock })
	ctx := context.Background()
	res, _ := s.RunRound(ctx, repo)
	if err := s.publish.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := e.st.BatchGet(ctx, res.BatchID)
	if err := e.sim.FailMRPipeline(repo, *b.MRIID, "script_failure"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "batch blocked", func() bool {
		_ = s.reconcile.runOnce(ctx)
		b, _ = e.st.BatchGet(ctx, res.BatchID)
		return b.Status == domain.BatchBlocked
	})
	if b.ErrorCode != domain.BlockPipelineFailed || !strings.Contains(b.ErrorMessage, "script_failure") {
		t.Errorf("blocked with %s: %s", b.ErrorCode, b.ErrorMessage)
	}
	// The slot stays taken while blocked.
	storetest.InsertQueuedOps(t, e.st, repo, 1)
	if r, _ := s.RunRound(ctx, repo); r.Outcome != store.ClaimSlotOccupied {
		t.Errorf("round while blocked = %s, want slot_occupied", r.Outcome)
	}
	// An operator retries the pipeline (it succeeds): the batch unblocks, re-arms and merges.
	if err := e.sim.SucceedMRPipeline(repo, *b.MRIID); err != nil {
		t.Fatal(err)
	}
	b = e.drive(s, res.BatchID, 10*time.Second)
	if b.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s, want succeeded", b.Status)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
}

func TestDirectMode(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	s := e.scanner("a", func(c *Config) { c.MergeMode = MergeDirect })
	ctx := context.Background()
	res, _ := s.RunRound(ctx, repo)
	if err := s.publish.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := e.st.BatchGet(ctx, res.BatchID)
	if m, _ := e.sim.MR(repo, *b.MRIID); m.AutoMerge || m.State != "opened" {
		t.Fatalf("direct mode armed or merged before the pipeline: %+v", m)
	}
	// Pipeline still running: reconcile must not merge.
	time.Sleep(150 * time.Millisecond)
	_ = s.reconcile.runOnce(ctx)
	if m, _ := e.sim.MR(repo, *b.MRIID); m.State != "opened" {
		t.Fatalf("merged while the pipeline runs: %+v", m)
	}
	if err := e.sim.SucceedMRPipeline(repo, *b.MRIID); err != nil {
		t.Fatal(err)
	}
	b = e.drive(s, res.BatchID, 10*time.Second)
	if b.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s", b.Status)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
}

func TestManualModeMRClosedByHuman(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	s := e.scanner("a", func(c *Config) { c.MergeMode = MergeManual })
	ctx := context.Background()
	res, _ := s.RunRound(ctx, repo)
	_ = s.publish.runOnce(ctx)
	b, _ := e.st.BatchGet(ctx, res.BatchID)
	time.Sleep(150 * time.Millisecond)
	_ = s.reconcile.runOnce(ctx)
	if m, _ := e.sim.MR(repo, *b.MRIID); m.State != "opened" || m.AutoMerge {
		t.Fatalf("manual mode touched the merge: %+v", m)
	}
	if err := e.sim.CloseMR(repo, *b.MRIID); err != nil {
		t.Fatal(err)
	}
	b = e.drive(s, res.BatchID, 10*time.Second)
	if b.Status != domain.BatchFailed || b.ErrorCode != string(domain.ClassClosedByUser) {
		t.Fatalf("batch %s %s, want failed closed_by_user", b.Status, b.ErrorCode)
	}
	ops := e.requireOps(ids, domain.OpFailed)
	for id, op := range ops {
		if op.ErrorCode != string(domain.ClassClosedByUser) {
			t.Errorf("operation %s failed with %s, want closed_by_user (no retry)", id, op.ErrorCode)
		}
	}
	e.requireFiles(repo, ops, false)
}

func TestRunRoundUnknownRepoAndAllRepos(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, "g/a", "g/b")
	s := e.scanner("a", nil)
	ctx := context.Background()
	if _, err := s.RunRound(ctx, "g/zzz"); !errors.Is(err, ErrUnknownRepo) {
		t.Fatalf("unknown repo: %v", err)
	}
	if res, err := s.RunRound(ctx, ""); err != nil || res.Outcome != store.ClaimNothingToClaim {
		t.Fatalf("empty round: %+v %v", res, err)
	}
	storetest.InsertQueuedOps(t, e.st, "g/b", 2)
	res, err := s.RunRound(ctx, "")
	if err != nil || res.Outcome != store.ClaimClaimed || len(res.OperationIDs) != 2 {
		t.Fatalf("all-repos round: %+v %v", res, err)
	}
	b, _ := e.st.BatchGet(ctx, res.BatchID)
	if b.Repo != "g/b" {
		t.Errorf("claimed repo %s", b.Repo)
	}
}

func TestMetricsOnGivenRegistry(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	storetest.InsertQueuedOps(t, e.st, repo, 2)
	reg1, reg2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	s1 := New(e.testConfig("m1"), e.st, e.gl, testLogger(), reg1)
	_ = New(e.testConfig("m2"), e.st, e.gl, testLogger(), reg2) // a second scanner must not collide
	// Two scanners sharing one registry with distinct replica ids must not panic either.
	_ = New(e.testConfig("m3"), e.st, e.gl, testLogger(), reg1)
	ctx := context.Background()
	res, _ := s1.RunRound(ctx, repo)
	e.drive(s1, res.BatchID, 10*time.Second)
	if v := testutil.ToFloat64(s1.m.outcomes.WithLabelValues("claim", "claimed")); v != 1 {
		t.Errorf("claimed outcomes = %v", v)
	}
	if v := testutil.ToFloat64(s1.m.gitlab.WithLabelValues("commit_files", "ok")); v != 1 {
		t.Errorf("commit_files ok = %v", v)
	}
	if v := testutil.ToFloat64(s1.m.settles.WithLabelValues("succeeded", "")); v != 1 {
		t.Errorf("settles succeeded = %v", v)
	}
	n, err := testutil.GatherAndCount(reg1, "batcherd_scanner_gitlab_calls_total", "batcherd_batch_size")
	if err != nil || n == 0 {
		t.Errorf("gather: %d %v", n, err)
	}
}

func TestRunStopsGracefully(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{PipelineDuration: 20 * time.Millisecond}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 5)
	s := e.scanner("a", nil)
	stop := runScanner(t, s)
	// The cron round claims within a second; the loops publish and settle.
	waitUntil(t, 15*time.Second, "operations merged", func() bool {
		for _, op := range e.ops(ids) {
			if op.Status != domain.OpMerged {
				return false
			}
		}
		return true
	})
	start := time.Now()
	stop()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Run took %s to stop", d)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	for _, mut := range []func(*Config){
		func(c *Config) { c.ClaimSchedule = "every thirty seconds" },
		func(c *Config) { c.MergeMode = "yolo" },
	} {
		s := e.scanner("a", mut)
		if err := s.Run(context.Background()); err == nil {
			t.Errorf("Run accepted a bad config")
		}
	}
}

func TestBackoff(t *testing.T) {
	for f := 1; f < 20; f++ {
		d := backoff(time.Second, time.Minute, f)
		if d < 0 || d > time.Minute {
			t.Fatalf("backoff(%d) = %s", f, d)
		}
	}
	if d := backoff(time.Second, time.Minute, 1); d < 500*time.Millisecond || d > time.Second {
		t.Errorf("first backoff %s", d)
	}
	if d := backoff(time.Second, time.Minute, 30); d < 30*time.Second {
		t.Errorf("capped backoff %s too small", d)
	}
}

// TestShutdownFinishesShortStep: a step in flight when Run's context ends finishes
// (it is shorter than ShutdownTimeout), so the publish completes and records its MR.
func TestShutdownFinishesShortStep(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	storetest.InsertQueuedOps(t, e.st, repo, 3)
	s := e.scanner("a", func(c *Config) { c.ShutdownTimeout = 2 * time.Second })
	reached := make(chan struct{})
	var once sync.Once
	s.testHook = func(_ context.Context, step string, _ int64) {
		if step == "publish.commit" {
			once.Do(func() { close(reached) })
			time.Sleep(300 * time.Millisecond) // a slow GitLab call
		}
	}
	stop := runScanner(t, s)
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("publish never reached the commit")
	}
	start := time.Now()
	stop()
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("stop took %s", d)
	}
	bs, err := e.st.BatchList(context.Background(), store.BatchFilter{})
	if err != nil || len(bs) != 1 || bs[0].MRIID == nil {
		t.Fatalf("the publish in flight did not finish: %+v %v", bs, err)
	}
}

// TestShutdownAbandonsLongStep: a step that outlives ShutdownTimeout is abandoned (its
// context is cancelled), Run returns, and a fresh replica finishes the batch with one MR.
func TestShutdownAbandonsLongStep(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{PipelineDuration: 30 * time.Millisecond}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	s := e.scanner("a", func(c *Config) { c.ShutdownTimeout = 300 * time.Millisecond })
	reached := make(chan struct{})
	var once sync.Once
	s.testHook = func(ctx context.Context, step string, _ int64) {
		if step == "publish.mr" {
			once.Do(func() { close(reached) })
			<-ctx.Done() // a GitLab call that hangs until abandoned
		}
	}
	stop := runScanner(t, s)
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("publish never reached the MR")
	}
	start := time.Now()
	stop()
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Errorf("stop took %s, want about the shutdown timeout", d)
	}
	bs, _ := e.st.BatchList(context.Background(), store.BatchFilter{})
	if len(bs) != 1 {
		t.Fatalf("%d batches", len(bs))
	}
	b := e.drive(e.scanner("b", nil), bs[0].ID, 15*time.Second)
	if b.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s", b.Status)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
	if mrs := e.mrsOf(repo, b.ID); len(mrs) != 1 {
		t.Errorf("%d MRs", len(mrs))
	}
}

// TestExpiryTwoReplicasOneRevoke: two replicas expire the same bindings at once; the
// guarded write makes one revoke per binding.
func TestExpiryTwoReplicasOneRevoke(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	ctx := context.Background()
	a, b := e.scanner("a", nil), e.scanner("b", nil)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 20)
	res, _ := a.RunRound(ctx, repo)
	if bt := e.drive(a, res.BatchID, 10*time.Second); bt.Status != domain.BatchSucceeded {
		t.Fatalf("grant batch %s", bt.Status)
	}
	if _, err := e.st.DB().ExecContext(ctx, "UPDATE binding SET expires_at = CURRENT_TIMESTAMP(6) - INTERVAL 1 SECOND"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, s := range []*Scanner{a, b} {
		wg.Go(func() {
			if err := s.expiry.runOnce(ctx); err != nil {
				t.Errorf("expiry: %v", err)
			}
		})
	}
	wg.Wait()
	var revokes int
	if err := e.st.DB().Get(&revokes, "SELECT COUNT(*) FROM operation WHERE action = 'revoke'"); err != nil || revokes != len(ids) {
		t.Fatalf("%d revoke operations for %d expired bindings (%v)", revokes, len(ids), err)
	}
	res, _ = a.RunRound(ctx, repo)
	if bt := e.drive(b, res.BatchID, 10*time.Second); bt.Status != domain.BatchSucceeded || len(bt.OperationIDs) != len(ids) {
		t.Fatalf("revoke batch %s with %d members", bt.Status, len(bt.OperationIDs))
	}
	for p := range e.sim.Files(repo) {
		if strings.HasPrefix(p, "bindings/") {
			t.Errorf("%s still on main after every binding expired", p)
		}
	}
}

// TestCleanup purges expired idempotency keys and finished waiting rows.
func TestCleanup(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	ctx := context.Background()
	s := e.scanner("a", func(c *Config) { c.WaitingRetention = time.Millisecond; c.CleanupChunk = 3 })
	storetest.InsertQueuedOps(t, e.st, repo, 8)
	res, _ := s.RunRound(ctx, repo)
	e.drive(s, res.BatchID, 10*time.Second)
	if _, err := e.st.DB().ExecContext(ctx, `INSERT INTO idempotency_key (idem_key, fingerprint, operation_id, expires_at)
		VALUES ('k1', REPEAT('a', 64), 'x', CURRENT_TIMESTAMP(6) - INTERVAL 1 SECOND),
		       ('k2', REPEAT('a', 64), 'y', CURRENT_TIMESTAMP(6) + INTERVAL 1 HOUR)`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := s.cleanup.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var waiting, keys int
	_ = e.st.DB().Get(&waiting, "SELECT COUNT(*) FROM merge_batch_request")
	_ = e.st.DB().Get(&keys, "SELECT COUNT(*) FROM idempotency_key")
	if waiting != 0 || keys != 1 {
		t.Errorf("after cleanup: %d waiting rows (want 0), %d keys (want 1)", waiting, keys)
	}
}

// TestOneBatchRunsOnePipeline: a published batch costs GitLab one pipeline, its
// commit's. Its branch is created by that commit; a branch created from the target
// first ran a second pipeline, on the target's head, testing nothing of the batch
// (issue 20). The simulator runs a pipeline for every branch created, as GitLab does.
func TestOneBatchRunsOnePipeline(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	s := e.scanner("a", nil)
	b := e.published(s, repo)
	if b.MRIID == nil {
		t.Fatalf("not published: %+v", b)
	}
	m, _ := e.sim.MR(repo, *b.MRIID)
	if n, _ := e.sim.PipelineCount(repo, e.branch(b.ID)); n != 1 {
		t.Fatalf("%d pipelines for one published batch, want 1 (its commit's)", n)
	}
	if m.PipelineID == 0 || m.SHA != b.MRSHA {
		t.Fatalf("the MR's head pipeline %d on %s, want the batch commit %s's", m.PipelineID, m.SHA, b.MRSHA)
	}
	if err := e.sim.SucceedMRPipeline(repo, *b.MRIID); err != nil {
		t.Fatal(err)
	}
	if got := e.drive(s, b.ID, 10*time.Second); got.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s (%s)", got.Status, got.ErrorCode)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
	if n, _ := e.sim.PipelineCount(repo, e.branch(b.ID)); n != 1 {
		t.Errorf("%d pipelines for the batch by its merge, want 1", n)
	}
}
