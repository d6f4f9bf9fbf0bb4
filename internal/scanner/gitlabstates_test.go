package scanner

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// GitLab states beyond opened/merged/closed, each driven through the real client
// against the simulator in that state (gitlabstates.go has the table).

// longTimeout makes the batch timeout unreachable in a test, so whatever settles a
// batch is the state under test, never the timeout sweep.
func longTimeout(c *Config) { c.BatchTimeout = 10 * time.Minute }

// batchEvents returns a batch's own audit codes.
func (e *env) batchEvents(id int64) []string {
	e.t.Helper()
	var codes []string
	if err := e.st.DB().Select(&codes, "SELECT code FROM audit_event WHERE batch_id = ? AND operation_id IS NULL ORDER BY id", id); err != nil {
		e.t.Fatal(err)
	}
	return codes
}

// followUp is the batch a failure settlement claimed next for a failed batch's members
// (a retry or the first bisection half), claimed at once by the settling replica.
func (e *env) followUp(parent int64) domain.Batch {
	e.t.Helper()
	var id int64
	if err := e.st.DB().Get(&id, "SELECT id FROM merge_batch WHERE parent_id = ? ORDER BY id LIMIT 1", parent); err != nil {
		e.t.Fatalf("no batch follows batch %d: %v", parent, err)
	}
	b, err := e.st.BatchGet(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// maxTries is the most charged attempts of any waiting row ever (rows stay after merge).
func (e *env) maxTries() int {
	e.t.Helper()
	var n int
	if err := e.st.DB().Get(&n, "SELECT COALESCE(MAX(tries), 0) FROM merge_batch_request"); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A fast-forward (or semi-linear) project whose target moves under every batch: the
// MR needs a rebase, batcherd asks GitLab for it, records the rebased head (guarded)
// and merges with it. Not one batch fails, nothing is rebuilt, no attempt is charged
// twice — where before every such batch ended max_attempts ("needs a rebase").
func TestRebaseWhenTheTargetMovesIsNotAConflict(t *testing.T) {
	t.Parallel()
	for _, method := range []string{gitlabsim.MergeMethodFastForward, gitlabsim.MergeMethodRebaseMerge} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{MergeMethod: method, ManualPipelines: true}, repo)
			s := e.scanner("r1", longTimeout)
			for round := range 4 {
				ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
				b := e.published(s, repo)
				// A human lands something on the target under the batch.
				content := "round " + string(rune('a'+round))
				if _, err := e.sim.PushToDefault(repo, map[string]*string{"human.txt": &content}, "human"); err != nil {
					t.Fatal(err)
				}
				// Pipelines pass whenever they run (the rebased head runs a new one).
				stop := make(chan struct{})
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(20 * time.Millisecond):
						}
						if st, ok := e.sim.MR(repo, *b.MRIID); ok && st.PipelineStatus == "running" {
							_ = e.sim.SucceedMRPipeline(repo, *b.MRIID)
						}
					}
				}()
				got := e.drive(s, b.ID, 20*time.Second)
				close(stop)
				if got.Status != domain.BatchSucceeded {
					t.Fatalf("round %d: batch %d %s (%s: %s)", round, b.ID, got.Status, got.ErrorCode, got.ErrorMessage)
				}
				if got.MRSHA == b.MRSHA {
					t.Fatalf("round %d: the rebased head was never recorded (still %s)", round, b.MRSHA)
				}
				if !slices.Contains(e.batchEvents(b.ID), store.EventBatchRebased) {
					t.Errorf("round %d: no rebased event: %v", round, e.batchEvents(b.ID))
				}
				e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
			}
			if byStatus := e.batchesByStatus(); byStatus[domain.BatchFailed] != 0 || byStatus[domain.BatchSucceeded] != 4 {
				t.Fatalf("batches: %v", byStatus)
			}
			if n := e.maxTries(); n != 1 {
				t.Fatalf("an operation was charged %d attempts", n)
			}
			if n := testutil.ToFloat64(s.m.rebases.WithLabelValues(repo)); n < 4 {
				t.Fatalf("rebases metric %v, want at least 4", n)
			}
		})
	}
}

// A rebase GitLab cannot do (the target changed a member's file too) is a conflict:
// the conflict policy rebuilds the batch on the new target.
func TestRebaseThatConflictsIsAConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, gitlabsim.Options{MergeMethod: gitlabsim.MergeMethodFastForward, ManualPipelines: true}, repo)
	s := e.scanner("r1", longTimeout)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 1)
	b := e.published(s, repo)
	op := e.ops(ids)[ids[0]]
	theirs := "someone else's file"
	if _, err := e.sim.PushToDefault(repo, map[string]*string{domain.BindingPath(op.Subject, op.Target): &theirs}, "human"); err != nil {
		t.Fatal(err)
	}
	got := e.drive(s, b.ID, 20*time.Second)
	if got.Status != domain.BatchFailed || got.ErrorCode != string(domain.ClassConflict) {
		t.Fatalf("batch %s (%s: %s), want failed conflict", got.Status, got.ErrorCode, got.ErrorMessage)
	}
}

// canceled, skipped and manual head pipelines are acted on at once — never a silent
// wait for the batch timeout: canceled is infra, skipped/manual (not mergeable) are
// ci_blocked; both retry the members once as a group, then fail them with the class.
func TestCanceledSkippedManualPipelinesAreActedOn(t *testing.T) {
	t.Parallel()
	for status, want := range map[string]domain.FailureClass{
		"canceled": domain.ClassInfra,
		"skipped":  domain.ClassCIBlocked,
		"manual":   domain.ClassCIBlocked,
	} {
		t.Run(status, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{PipelineRules: []gitlabsim.PipelineRule{{RefPrefix: "batcherd/", Status: status}}}, repo)
			s := e.scanner("r1", longTimeout)
			ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
			b := e.published(s, repo)
			got := e.drive(s, b.ID, 20*time.Second)
			if got.Status != domain.BatchFailed || got.ErrorCode != string(want) {
				t.Fatalf("batch %s (%s: %s), want failed %s", got.Status, got.ErrorCode, got.ErrorMessage, want)
			}
			// The retry of the same members meets the same pipeline and fails them.
			retry := e.followUp(b.ID)
			if retry.Kind != domain.KindRetryPrefix+string(want) {
				t.Fatalf("follow-up batch kind %s", retry.Kind)
			}
			if retry := e.drive(s, retry.ID, 20*time.Second); retry.Status != domain.BatchFailed {
				t.Fatalf("retry batch %s", retry.Status)
			}
			for id, op := range e.requireOps(ids, domain.OpFailed) {
				if op.ErrorCode != string(want) {
					t.Errorf("operation %s failed with %s, want %s", id, op.ErrorCode, want)
				}
			}
		})
	}
}

// Pipelines that have not ended (created … scheduled, canceling) are waited for, with
// neither a block nor a failure.
func TestPipelinesThatHaveNotEndedAreWaitedFor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	s := e.scanner("r1", longTimeout)
	for _, status := range []string{"created", "waiting_for_resource", "preparing", "pending", "running", "scheduled", "canceling"} {
		storetest.InsertQueuedOps(t, e.st, repo, 1)
		b := e.published(s, repo)
		if err := e.sim.SetMRPipelineStatus(repo, *b.MRIID, status, ""); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			e.due(b.ID)
			if err := s.reconcile.runOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		got, _ := e.st.BatchGet(context.Background(), b.ID)
		if got.Status != domain.BatchRunning || got.ErrorCode != "" {
			t.Fatalf("%s: batch %s %s", status, got.Status, got.ErrorCode)
		}
		if err := e.sim.SetMRPipelineStatus(repo, *b.MRIID, "success", ""); err != nil {
			t.Fatal(err)
		}
		if got := e.drive(s, b.ID, 10*time.Second); got.Status != domain.BatchSucceeded {
			t.Fatalf("%s then success: %s", status, got.Status)
		}
	}
}

// withSim is e with a fresh simulator (and client) on the same database: one database
// serves several GitLab setups in turn (creating a database is the slow part).
func (e *env) withSim(opts gitlabsim.Options) *env {
	e.t.Helper()
	opts.Projects = e.repos
	sim := gitlabsim.StartTest(e.t, opts)
	gl, err := mr.New(mr.Config{BaseURL: sim.URL(), Token: sim.Token(), CallTimeout: 5 * time.Second,
		RetryWaitMin: 5 * time.Millisecond, RetryWaitMax: 50 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	cp := *e
	cp.sim, cp.gl = sim, gl
	return &cp
}

// Mergeability still being computed (checking) is waited for in every merge mode and
// version; it is never read as a conflict.
func TestCheckingMergeabilityIsWaitedFor(t *testing.T) {
	t.Parallel()
	base := newEnv(t, gitlabsim.Options{}, repo)
	for _, mode := range []MergeMode{MergeAuto, MergeDirect} {
		for _, v := range []string{gitlabsim.Version16, gitlabsim.Version18} {
			e := base.withSim(gitlabsim.Options{Version: v, MergeCheckReads: 4, PipelineDuration: 30 * time.Millisecond})
			s := e.scanner("r1", func(c *Config) { longTimeout(c); c.MergeMode = mode })
			ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
			b := e.published(s, repo)
			if got := e.drive(s, b.ID, 20*time.Second); got.Status != domain.BatchSucceeded {
				t.Fatalf("%s %s: batch %s (%s: %s)", mode, v, got.Status, got.ErrorCode, got.ErrorMessage)
			}
			e.requireOps(ids, domain.OpMerged)
		}
	}
}

// Each failure reason goes to its class on purpose: a job timeout (a hung test) is
// bisected like a failing test, unknown_failure is retried once then bisected, a
// runner failure is retried without bisection.
func TestFailureReasonsGoToTheirClass(t *testing.T) {
	t.Parallel()
	for reason, want := range map[string]struct {
		class domain.FailureClass
		kind  string // the kind of the batch the failure leads to
	}{
		"job_execution_timeout": {domain.ClassTest, domain.KindBisect},
		"script_failure":        {domain.ClassTest, domain.KindBisect},
		"unknown_failure":       {domain.ClassUnknown, domain.KindRetryPrefix + string(domain.ClassUnknown)},
		"runner_system_failure": {domain.ClassInfra, domain.KindRetryPrefix + string(domain.ClassInfra)},
		"a_future_reason":       {domain.ClassUnknown, domain.KindRetryPrefix + string(domain.ClassUnknown)},
	} {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{PipelineRules: []gitlabsim.PipelineRule{{RefPrefix: "batcherd/", FailureReason: reason}}}, repo)
			s := e.scanner("r1", longTimeout)
			storetest.InsertQueuedOps(t, e.st, repo, 2)
			b := e.published(s, repo)
			got := e.drive(s, b.ID, 20*time.Second)
			if got.Status != domain.BatchFailed || got.ErrorCode != string(want.class) {
				t.Fatalf("batch %s %s, want failed %s", got.Status, got.ErrorCode, want.class)
			}
			if next := e.followUp(b.ID); next.Kind != want.kind {
				t.Fatalf("next batch kind %s, want %s", next.Kind, want.kind)
			}
		})
	}
	for _, r := range gitlabsim.FailureReasons {
		if !slices.Contains(domain.KnownFailureReasons(), r) {
			t.Errorf("GitLab's failure reason %s is not mapped on purpose", r)
		}
	}
}

// A flaky test fails a lone member's pipeline once: batcherd retries the pipeline in
// place before naming a culprit, the retry passes and the member merges — the batch
// is never failed — and the flake is counted for its repository. With retries off,
// the same member is named the culprit.
func TestFlakyLoneMemberIsNotACulprit(t *testing.T) {
	t.Parallel()
	for _, retries := range []int{1, -1} {
		// The branch's first run fails (its commit's: the branch is created by it); the
		// second (the retry) passes.
		e := newEnv(t, gitlabsim.Options{PipelineRules: []gitlabsim.PipelineRule{{RefPrefix: "batcherd/", First: 1, FailureReason: "script_failure"}}}, repo)
		s := e.scanner("r1", func(c *Config) { longTimeout(c); c.FlakeRetries = retries })
		ids := storetest.InsertQueuedOps(t, e.st, repo, 1)
		b := e.published(s, repo)
		got := e.drive(s, b.ID, 20*time.Second)
		flakes := testutil.ToFloat64(s.m.flakes.WithLabelValues(repo))
		if retries > 0 {
			if got.Status != domain.BatchSucceeded || flakes != 1 || testutil.ToFloat64(s.m.flakeRetries.WithLabelValues(repo)) != 1 {
				t.Fatalf("with a flake retry: batch %s (%s), flakes %v", got.Status, got.ErrorCode, flakes)
			}
			e.requireOps(ids, domain.OpMerged)
			continue
		}
		if got.Status != domain.BatchFailed || got.ErrorCode != string(domain.ClassTest) || flakes != 0 {
			t.Fatalf("without: batch %s %s, flakes %v", got.Status, got.ErrorCode, flakes)
		}
		if op := e.ops(ids)[ids[0]]; op.ErrorCode != domain.ReasonCulprit || !strings.Contains(op.ErrorMessage, "alone") {
			t.Fatalf("without retries the lone member is %s/%s", op.Status, op.ErrorCode)
		}
	}
}

// The scenario: a fast-forward project whose target branch moves under every
// batch, 40 operations in waves, three replicas. Before, 40 of 40 ended max_attempts
// ("needs a rebase": each batch was rebuilt on a target that had moved again). Now
// every operation merges, no batch fails and nobody is charged a second attempt.
func TestFastForwardProjectWithAMovingTarget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, gitlabsim.Options{MergeMethod: gitlabsim.MergeMethodFastForward, PipelineDuration: 40 * time.Millisecond}, repo)
	var ids []string
	c := e.startCluster(3, func(c *Config) { longTimeout(c); c.MaxBatchSize = 5 })
	stop := make(chan struct{})
	pushed := make(chan int)
	go func() {
		n := 0
		defer func() { pushed <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(60 * time.Millisecond):
			}
			content := time.Now().String()
			if _, err := e.sim.PushToDefault(repo, map[string]*string{"human/clock.txt": &content}, "a human's commit"); err != nil {
				t.Error(err)
				return
			}
			n++
		}
	}()
	for range 4 {
		ids = append(ids, storetest.InsertQueuedOps(t, e.st, repo, 10)...)
		if _, err := c.scanners[0].RunRound(context.Background(), repo); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.settleAll(90 * time.Second)
	close(stop)
	n := <-pushed
	c.stop()
	e.requireOutcome(ids)
	e.requireClean()
	if byStatus := e.batchesByStatus(); byStatus[domain.BatchFailed] != 0 {
		t.Fatalf("batches: %v", byStatus)
	}
	if m := e.maxTries(); m != 1 {
		t.Fatalf("an operation was charged %d attempts", m)
	}
	rebases := c.sum(func(m *metrics) prometheus.Collector { return m.rebases.WithLabelValues(repo) })
	t.Logf("%d operations merged while the target moved %d times; %v rebases, %v batches", len(ids), n, rebases, e.batchesByStatus()[domain.BatchSucceeded])
	if rebases == 0 {
		t.Fatal("no batch needed a rebase: the target did not move under any")
	}
}

// In block mode a rebase is still not a failure: the batch is rebased and merges,
// never BLOCKED for it.
func TestBlockModeRebasesToo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, gitlabsim.Options{MergeMethod: gitlabsim.MergeMethodRebaseMerge, ManualPipelines: true}, repo)
	s := e.scanner("r1", func(c *Config) { longTimeout(c); c.OnFailure = FailureBlock })
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	b := e.published(s, repo)
	e.moveTarget("under-the-batch")
	if err := e.sim.SucceedMRPipeline(repo, *b.MRIID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, _ := e.st.BatchGet(context.Background(), b.ID)
		if got.Status == domain.BatchBlocked {
			t.Fatalf("blocked: %s %s", got.ErrorCode, got.ErrorMessage)
		}
		if got.Status == domain.BatchSucceeded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s", got.Status)
		}
		if st, ok := e.sim.MR(repo, *b.MRIID); ok && st.PipelineStatus == "running" {
			_ = e.sim.SucceedMRPipeline(repo, *b.MRIID)
		}
		e.due(b.ID)
		_ = s.reconcile.runOnce(context.Background())
		time.Sleep(20 * time.Millisecond)
	}
	e.requireOps(ids, domain.OpMerged)
}
