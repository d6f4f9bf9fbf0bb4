package scanner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
	"github.com/batcherd/batcherd/internal/verify"

	"github.com/batcherd/batcherd/internal/domain"
)

// Failure isolation (issue #9), proven end to end: real MariaDB, the GitLab simulator
// over real HTTP, a real *mr.Client, three scanners running their loops in one process.

// isoCluster is three replicas running Run on one database and one simulator.
type isoCluster struct {
	e        *env
	scanners []*Scanner
	regs     []*prometheus.Registry
	stops    []func()
}

func (e *env) isoConfig(name string) Config {
	cfg := e.testConfig(name)
	cfg.ReconcileInterval = 50 * time.Millisecond
	cfg.PublishInterval = 50 * time.Millisecond
	cfg.BatchTimeout = 30 * time.Second
	cfg.OrphanInterval = 500 * time.Millisecond
	return cfg
}

func (e *env) startCluster(n int, mut func(*Config)) *isoCluster {
	c := &isoCluster{e: e}
	for i := range n {
		cfg := e.isoConfig(fmt.Sprintf("r%d", i))
		if mut != nil {
			mut(&cfg)
		}
		reg := prometheus.NewRegistry()
		s := New(cfg, e.st, e.gl, testLogger(), reg)
		c.scanners = append(c.scanners, s)
		c.regs = append(c.regs, reg)
		c.stops = append(c.stops, runScanner(e.t, s))
	}
	return c
}

func (c *isoCluster) stop() {
	for _, s := range c.stops {
		s()
	}
}

// sumCounter adds a counter of every replica.
func (c *isoCluster) sum(get func(*metrics) prometheus.Collector) float64 {
	var n float64
	for _, s := range c.scanners {
		n += testutil.ToFloat64(get(s.m))
	}
	return n
}

// subjectOf is the subject storetest.InsertOps gives operation id (prefix "s").
func subjectOf(id string) string { return "s-" + id[:13] }

// poison makes every pipeline whose commit writes the binding file of operation id fail.
func (e *env) poison(id, reason string, times int) {
	e.t.Helper()
	if err := e.sim.AddPoison(repo, gitlabsim.PoisonRule{Substring: subjectOf(id), InPath: true, FailureReason: reason, Times: times}); err != nil {
		e.t.Fatal(err)
	}
}

// settleAll waits until every operation is merged or failed.
func (e *env) settleAll(within time.Duration) {
	e.t.Helper()
	waitUntil(e.t, within, "every operation merged or failed", func() bool {
		var n int
		if err := e.st.DB().Get(&n, "SELECT COUNT(*) FROM operation WHERE status NOT IN ('merged', 'failed')"); err != nil {
			e.t.Fatal(err)
		}
		return n == 0
	})
}

// eventCodes returns an operation's event codes, oldest first.
func (e *env) eventCodes(id string) []string {
	e.t.Helper()
	evs, err := e.st.OperationEvents(context.Background(), id)
	if err != nil {
		e.t.Fatalf("OperationEvents(%s): %v", id, err)
	}
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Code
	}
	return out
}

func count(codes []string, code string) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// batchesByStatus counts the batches of each status.
func (e *env) batchesByStatus() map[domain.BatchStatus]int {
	e.t.Helper()
	var rows []struct {
		Status domain.BatchStatus `db:"status"`
		N      int                `db:"n"`
	}
	if err := e.st.DB().Select(&rows, "SELECT status, COUNT(*) AS n FROM merge_batch GROUP BY status"); err != nil {
		e.t.Fatal(err)
	}
	out := map[domain.BatchStatus]int{}
	for _, r := range rows {
		out[r.Status] = r.N
	}
	return out
}

// requireClean runs the database audit (verify.Run): no invariant or agreement
// violation, with the multi-batch history bisection leaves behind.
func (e *env) requireClean() {
	e.t.Helper()
	rep, err := verify.Run(context.Background(), e.st.DB(), verify.Options{})
	if err != nil {
		e.t.Fatalf("verify: %v", err)
	}
	for _, v := range rep.Violations {
		e.t.Errorf("verify: %s", v)
	}
}

// requireOutcome checks the final state: culprits failed/culprit with their file absent,
// every other operation merged with its file on main, exactly once in a SUCCEEDED batch.
func (e *env) requireOutcome(ids []string, culprits ...string) {
	e.t.Helper()
	ops := e.ops(ids)
	for id, op := range ops {
		if slices.Contains(culprits, id) {
			if op.Status != domain.OpFailed || op.ErrorCode != domain.ReasonCulprit {
				e.t.Errorf("poison %s: %s/%s, want failed/culprit", id, op.Status, op.ErrorCode)
			}
			continue
		}
		if op.Status != domain.OpMerged {
			e.t.Errorf("operation %s: %s (%s: %s), want merged", id, op.Status, op.ErrorCode, op.ErrorMessage)
		}
	}
	files := e.sim.Files(repo)
	for id, op := range ops {
		content, ok := files[domain.BindingPath(op.Subject, op.Target)]
		if slices.Contains(culprits, id) == ok || (ok && !strings.Contains(content, id)) {
			e.t.Errorf("operation %s (%s): file on main = %v", id, op.Status, ok)
		}
	}
	var doubled int
	if err := e.st.DB().Get(&doubled, `SELECT COUNT(*) FROM (
		SELECT m.operation_id FROM merge_batch_member m JOIN merge_batch b ON b.id = m.batch_id
		 WHERE b.status = 2 GROUP BY m.operation_id HAVING COUNT(*) > 1) x`); err != nil || doubled != 0 {
		e.t.Errorf("%d operations in more than one succeeded batch (%v)", doubled, err)
	}
	// Bisected bindings keep nothing half-done: grants of merged operations are active,
	// the culprit's binding failed.
	var bad int
	if err := e.st.DB().Get(&bad, `SELECT COUNT(*) FROM binding b JOIN operation o ON o.operation_id = b.operation_id
		WHERE NOT ((o.status = 'merged' AND b.status = 'active') OR (o.status = 'failed' AND b.status = 'failed'))`); err != nil || bad != 0 {
		e.t.Errorf("%d bindings disagree with their operation (%v)", bad, err)
	}
}

// TestBisectIsolatesOnePoison: 64 operations, one poison at a random position. The
// poison ends failed/culprit after at most ⌈log2 64⌉+1 = 7 failing rounds, the other 63
// merge, and the events tell each one's story.
func TestBisectIsolatesOnePoison(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{PipelineDuration: 20 * time.Millisecond}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 64)
	seed := uint64(time.Now().UnixNano())
	p := rand.New(rand.NewPCG(seed, 9)).IntN(len(ids))
	t.Logf("poison at position %d (seed %d)", p, seed)
	poison := ids[p]
	e.poison(poison, "script_failure", 0)

	start := time.Now()
	c := e.startCluster(3, nil)
	if _, err := c.scanners[0].RunRound(context.Background(), repo); err != nil {
		t.Fatal(err)
	}
	e.settleAll(60 * time.Second)
	c.stop()

	byStatus := e.batchesByStatus()
	failing := byStatus[domain.BatchFailed]
	t.Logf("isolated in %s: %d failing rounds, %d succeeded batches", time.Since(start).Round(time.Millisecond), failing, byStatus[domain.BatchSucceeded])
	if failing > 7 {
		t.Errorf("%d failing rounds, want at most ⌈log2 64⌉+1 = 7", failing)
	}
	e.requireOutcome(ids, poison)
	e.requireClean()

	// Every failed batch failed for the test, and the poison was in each of them.
	var failed []domain.Batch
	if err := e.st.DB().Select(&failed, "SELECT id, error_code, depth FROM merge_batch WHERE status = 3 ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	for i, b := range failed {
		if b.ErrorCode != string(domain.ClassTest) {
			t.Errorf("failed batch %d: code %s, want test", b.ID, b.ErrorCode)
		}
		if b.Depth != i {
			t.Errorf("failed batch %d at depth %d, want %d (one failing round per depth)", b.ID, b.Depth, i)
		}
	}

	// The poison's story: claimed, published and failed in every round, bisected each
	// time until it was alone, then the culprit.
	codes := e.eventCodes(poison)
	t.Logf("poison events: %v", codes)
	if count(codes, store.EventMemberClaimed) != failing || count(codes, store.EventMemberBatchFailed) != failing ||
		count(codes, EventBisected) != failing-1 || count(codes, EventCulprit) != 1 || count(codes, store.EventMemberPublished) != failing {
		t.Errorf("poison events %v do not tell its story", codes)
	}
	if codes[len(codes)-1] != EventCulprit {
		t.Errorf("poison's last event %s, want culprit", codes[len(codes)-1])
	}
	op, _ := e.st.OperationGet(context.Background(), poison)
	if !strings.Contains(op.ErrorMessage, "alone in batch") {
		t.Errorf("poison's error message %q does not explain", op.ErrorMessage)
	}
	// A bystander: in the first failing batch, bisected, then merged as a bystander.
	other := ids[(p+len(ids)/2)%len(ids)]
	oc := e.eventCodes(other)
	t.Logf("bystander events: %v", oc)
	if count(oc, store.EventMemberBatchFailed) < 1 || count(oc, EventBisected) < 1 || count(oc, store.EventBystander) != 1 ||
		count(oc, store.EventMemberMerged) != 1 || count(oc, EventCulprit) != 0 {
		t.Errorf("bystander events %v do not tell its story", oc)
	}

	// Metrics: one culprit, bisection depths 1..6, time to merge observed per repository.
	if n := c.sum(func(m *metrics) prometheus.Collector { return m.culprits.WithLabelValues(repo) }); n != 1 {
		t.Errorf("culprits metric %v, want 1", n)
	}
	var depthObs uint64
	for _, reg := range c.regs {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			switch mf.GetName() {
			case "batcherd_bisection_depth":
				depthObs += mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
	}
	if depthObs != uint64(failing-1) {
		t.Errorf("bisection depth observed %d times, want %d", depthObs, failing-1)
	}
	if n := testutil.CollectAndCount(c.scanners[0].m.timeToMerge) + testutil.CollectAndCount(c.scanners[1].m.timeToMerge) +
		testutil.CollectAndCount(c.scanners[2].m.timeToMerge); n == 0 {
		t.Errorf("no time-to-merge series")
	}
}

// TestBisectIsolatesTwoPoisons: 64 operations, two poisons in different halves of the
// first batch: both isolated, the other 62 merged.
func TestBisectIsolatesTwoPoisons(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{PipelineDuration: 20 * time.Millisecond}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 64)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 11))
	a, b := rng.IntN(32), 32+rng.IntN(32)
	t.Logf("poisons at positions %d and %d (seed %d)", a, b, seed)
	e.poison(ids[a], "script_failure", 0)
	e.poison(ids[b], "script_failure", 0)

	c := e.startCluster(3, nil)
	if _, err := c.scanners[1].RunRound(context.Background(), repo); err != nil {
		t.Fatal(err)
	}
	e.settleAll(75 * time.Second)
	c.stop()

	byStatus := e.batchesByStatus()
	t.Logf("%d failing rounds, %d succeeded batches", byStatus[domain.BatchFailed], byStatus[domain.BatchSucceeded])
	// The first batch, the failing chain of the first half's poison (at most 5 rounds
	// below the half), the remainder holding the other poison, and its failing chain
	// (at most 6).
	if n := byStatus[domain.BatchFailed]; n > 1+2*6 {
		t.Errorf("%d failing rounds, want at most 13", n)
	}
	e.requireOutcome(ids, ids[a], ids[b])
	e.requireClean()
	if n := c.sum(func(m *metrics) prometheus.Collector { return m.culprits.WithLabelValues(repo) }); n != 2 {
		t.Errorf("culprits metric %v, want 2", n)
	}
}

// TestInfraFailureRetriedWhole: a runner_system_failure once → the same members are
// retried as one group, no bisection, all merged.
func TestInfraFailureRetriedWhole(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{PipelineDuration: 20 * time.Millisecond}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 16)
	e.poison(ids[5], "runner_system_failure", 1) // fails one pipeline, then the runner recovers

	c := e.startCluster(3, nil)
	if _, err := c.scanners[2].RunRound(context.Background(), repo); err != nil {
		t.Fatal(err)
	}
	e.settleAll(30 * time.Second)
	c.stop()

	e.requireOps(ids, domain.OpMerged)
	e.requireClean()
	var batches []domain.Batch
	if err := e.st.DB().Select(&batches, "SELECT id, status, size, kind, error_code, depth, parent_id, mr_iid FROM merge_batch ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	if len(batches) != 2 {
		t.Fatalf("batches %+v, want the failed one and its retry", batches)
	}
	first, retry := batches[0], batches[1]
	if first.Status != domain.BatchFailed || first.ErrorCode != string(domain.ClassInfra) || first.Size != 16 {
		t.Errorf("first batch %+v, want failed infra with 16 members", first)
	}
	if retry.Status != domain.BatchSucceeded || retry.Kind != "retry_infra" || retry.Size != 16 || retry.Depth != 0 ||
		retry.ParentID == nil || *retry.ParentID != first.ID {
		t.Errorf("retry batch %+v, want the same 16 members retried whole, succeeded", retry)
	}
	codes := e.eventCodes(ids[0])
	if count(codes, "retry_infra") != 1 || count(codes, EventBisected) != 0 || count(codes, store.EventMemberMerged) != 1 {
		t.Errorf("events %v, want one retry_infra, no bisection, merged", codes)
	}
	if n := c.sum(func(m *metrics) prometheus.Collector { return m.retries.WithLabelValues(string(domain.ClassInfra)) }); n != 1 {
		t.Errorf("retries{class=infra} = %v, want 1", n)
	}
	// The retry's MR says why its members are there.
	if retry.MRIID == nil {
		t.Fatal("retry batch has no MR")
	}
	desc := mrDescriptionOf(t, e, repo, *retry.MRIID)
	if !strings.Contains(desc, fmt.Sprintf("retry of failed batch %d after a infra failure", first.ID)) ||
		!strings.Contains(desc, "retry 1 of failed batch") {
		t.Errorf("retry MR description does not say why:\n%s", desc)
	}
}

// TestReplicaKilledMidBisection: a replica is killed in the middle of a bisection — at
// a step of a round at depth ≥ 2 its in-flight work is abandoned (the work context is
// cancelled there, as a kill after the shutdown grace would) and it never comes back —
// and two fresh replicas finish the job. No member is lost or duplicated, and the
// database audit stays clean. One subtest per step.
func TestReplicaKilledMidBisection(t *testing.T) {
	for _, step := range []string{"settle.marked", "settle.closed", "settle.settled", "claim.claimed", "publish.commit"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{PipelineDuration: 20 * time.Millisecond}, repo)
			ids := storetest.InsertQueuedOps(t, e.st, repo, 64)
			seed := uint64(time.Now().UnixNano())
			// In the first half, so the search goes to depth 2 (the first part fails and
			// is split); a poison in the last parts is found at depth 1.
			poison := ids[rand.New(rand.NewPCG(seed, 5)).IntN(len(ids)/2)]
			t.Logf("poison %s (seed %d)", poison, seed)
			e.poison(poison, "script_failure", 0)

			// The victim works alone until it dies, so the kill happens where chosen.
			victimCtx, kill := context.WithCancel(context.Background())
			killedAt := make(chan int64, 1)
			var once sync.Once
			vcfg := e.isoConfig("victim")
			vcfg.ShutdownTimeout = 300 * time.Millisecond
			victim := New(vcfg, e.st, e.gl, testLogger(), prometheus.NewRegistry())
			victim.testHook = func(ctx context.Context, s string, batchID int64) {
				if s != step {
					return
				}
				b, err := e.st.BatchGet(context.Background(), batchID)
				if err != nil || b.Depth < 2 {
					return
				}
				hit := false
				once.Do(func() { hit = true })
				if !hit {
					return
				}
				killedAt <- batchID
				kill()
				// Frozen here until the shutdown grace abandons the step: every call the
				// step would make next fails on the cancelled work context.
				<-ctx.Done()
			}
			var vwg sync.WaitGroup
			vwg.Go(func() { _ = victim.Run(victimCtx) })
			t.Cleanup(func() { kill(); vwg.Wait() })
			if _, err := victim.RunRound(context.Background(), repo); err != nil {
				t.Fatal(err)
			}
			var id int64
			select {
			case id = <-killedAt:
			case <-time.After(45 * time.Second):
				t.Fatalf("the victim never reached %s at depth ≥ 2", step)
			}
			vwg.Wait()
			b, _ := e.st.BatchGet(context.Background(), id)
			t.Logf("victim killed at %s of batch %d (depth %d, %s)", step, id, b.Depth, b.Status)

			c := e.startCluster(2, nil)
			e.settleAll(60 * time.Second)
			c.stop()

			e.requireOutcome(ids, poison)
			e.requireClean()
			if n := e.batchesByStatus()[domain.BatchFailed]; n > 7 {
				t.Errorf("%d failing rounds, want at most 7", n)
			}
			// No member lost or duplicated: every merged operation has exactly one
			// non-FAILED batch in its history, the culprit none, and nothing waits.
			var multi int
			if err := e.st.DB().Get(&multi, `SELECT COUNT(*) FROM (SELECT o.operation_id, o.status,
				SUM(b.status IS NOT NULL AND b.status <> 3) AS live FROM operation o
				LEFT JOIN merge_batch_member m ON m.operation_id = o.operation_id
				LEFT JOIN merge_batch b ON b.id = m.batch_id GROUP BY o.operation_id, o.status) x
				WHERE (status = 'merged' AND live <> 1) OR (status = 'failed' AND live <> 0)`); err != nil || multi != 0 {
				t.Errorf("%d operations lost or duplicated (%v)", multi, err)
			}
			var waiting int
			if err := e.st.DB().Get(&waiting, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id IS NULL"); err != nil || waiting != 0 {
				t.Errorf("%d rows still waiting (%v)", waiting, err)
			}
		})
	}
}

// TestConflictRebuiltOnNewHead: someone changes the same binding file on main while the
// batch's MR is open; the conflict is retried once, rebuilt on the new target head, and
// merges.
func TestConflictRebuiltOnNewHead(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 4)
	s := e.scanner("a", nil)
	ctx := context.Background()
	res, _ := s.RunRound(ctx, repo)
	if err := s.publish.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	op := e.ops(ids[:1])[ids[0]]
	human := "subject: someone else\n"
	if _, err := e.sim.PushToDefault(repo, map[string]*string{domain.BindingPath(op.Subject, op.Target): &human}, "hand edit"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the conflict settled and the retry claimed", func() bool {
		_ = s.reconcile.runOnce(ctx)
		b, _ := e.st.BatchGet(ctx, res.BatchID)
		return b.Status == domain.BatchFailed
	})
	first, _ := e.st.BatchGet(ctx, res.BatchID)
	if first.ErrorCode != string(domain.ClassConflict) {
		t.Fatalf("first batch failed with %s (%s), want conflict", first.ErrorCode, first.ErrorMessage)
	}
	var retryID int64
	if err := e.st.DB().Get(&retryID, "SELECT id FROM merge_batch WHERE parent_id = ? AND kind = 'retry_conflict'", first.ID); err != nil {
		t.Fatalf("no retry batch claimed at once: %v", err)
	}
	if err := s.publish.runOnce(ctx); err != nil {
		t.Fatal(err)
	}
	rb, _ := e.st.BatchGet(ctx, retryID)
	if rb.MRIID == nil {
		t.Fatal("retry not published")
	}
	if err := e.sim.SucceedMRPipeline(repo, *rb.MRIID); err != nil {
		t.Fatal(err)
	}
	if b := e.drive(s, retryID, 10*time.Second); b.Status != domain.BatchSucceeded {
		t.Fatalf("retry batch %s (%s: %s)", b.Status, b.ErrorCode, b.ErrorMessage)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
	if c := e.eventCodes(ids[0]); count(c, "retry_conflict") != 1 || count(c, store.EventMemberMerged) != 1 {
		t.Errorf("events %v", c)
	}
	e.requireClean()
}

// TestTimeoutRetriedThenMaxAttempts: a batch that times out is retried once as a group;
// with MAX_ATTEMPTS 1 the same failure fails the members with max_attempts instead.
func TestTimeoutRetriedThenMaxAttempts(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxAttempts int
	}{{"retried", 3}, {"max_attempts", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
			ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
			s := e.scanner("a", func(c *Config) { c.BatchTimeout = 500 * time.Millisecond; c.MaxAttempts = tc.maxAttempts })
			// p publishes and finishes the retry with the default timeout: publish gives up
			// on a batch past its timeout, and on a loaded machine a publish (or a retry's
			// whole life) can take longer than 500 ms. Only s's sweep times batches out.
			p := e.scanner("p", func(c *Config) { c.MaxAttempts = tc.maxAttempts })
			ctx := context.Background()
			res, _ := p.RunRound(ctx, repo)
			if err := p.publish.runOnce(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(600 * time.Millisecond)
			b := e.drive(s, res.BatchID, 10*time.Second)
			if b.Status != domain.BatchFailed || b.ErrorCode != string(domain.ClassTimeout) {
				t.Fatalf("batch %s %s, want failed timeout", b.Status, b.ErrorCode)
			}
			if tc.maxAttempts == 1 {
				for id, op := range e.requireOps(ids, domain.OpFailed) {
					if op.ErrorCode != domain.ReasonMaxAttempts {
						t.Errorf("%s failed with %s, want max_attempts", id, op.ErrorCode)
					}
				}
				e.requireClean()
				return
			}
			var retryID int64
			if err := e.st.DB().Get(&retryID, "SELECT id FROM merge_batch WHERE parent_id = ? AND kind = 'retry_timeout'", b.ID); err != nil {
				t.Fatalf("no retry: %v", err)
			}
			_ = p.publish.runOnce(ctx)
			rb, _ := e.st.BatchGet(ctx, retryID)
			if rb.MRIID == nil {
				t.Fatal("retry not published")
			}
			if err := e.sim.SucceedMRPipeline(repo, *rb.MRIID); err != nil {
				t.Fatal(err)
			}
			if rb = e.drive(p, retryID, 10*time.Second); rb.Status != domain.BatchSucceeded {
				t.Fatalf("retry %s", rb.Status)
			}
			e.requireOps(ids, domain.OpMerged)
			e.requireClean()
		})
	}
}

// TestFlakyPartResumesItsSiblings: 8 operations, the culprit last. The batch fails (the
// culprit); its first part (4, no culprit) fails once by a flake, so the parts after it
// are deferred to the remainder; every part of that first part then merges, which
// shows the flake, and the deferred parts go back to being searched in place: the
// culprit is found without the remainder ever running (or failing) whole. Runs: the
// batch, part 1, its three parts, then 2, 1 and the culprit alone with its retry.
func TestFlakyPartResumesItsSiblings(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{PipelineDuration: 20 * time.Millisecond}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 8)
	e.poison(ids[7], "script_failure", 0) // first rule: the batch's failure is the culprit's
	e.poison(ids[0], "script_failure", 1) // then one flake, on part 1 (positions 0-3)

	c := e.startCluster(2, func(cfg *Config) { cfg.ClaimSchedule = "@every 1h" })
	if _, err := c.scanners[0].RunRound(context.Background(), repo); err != nil {
		t.Fatal(err)
	}
	e.settleAll(45 * time.Second)
	c.stop()
	e.requireOutcome(ids, ids[7])
	e.requireClean()

	var batches []domain.Batch
	if err := e.st.DB().Select(&batches, "SELECT id, status, size, grp FROM merge_batch ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range batches {
		got = append(got, fmt.Sprintf("%d:%s", b.Size, map[domain.BatchStatus]string{domain.BatchSucceeded: "ok", domain.BatchFailed: "failed"}[b.Status]))
		if g, ok := domain.ParseSearchGroup(b.Grp); ok && g.Rest() {
			t.Errorf("batch %d ran the remainder (%d members): the flaky part's siblings were not resumed", b.ID, b.Size)
		}
	}
	want := []string{"8:failed", "4:failed", "2:ok", "1:ok", "1:ok", "2:ok", "1:ok", "1:failed"}
	if !slices.Equal(got, want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
	var resumed int
	if err := e.st.DB().Get(&resumed, "SELECT COUNT(*) FROM audit_event WHERE batch_id = ? AND code = ?", batches[1].ID, store.EventSearchResumed); err != nil || resumed != 1 {
		t.Fatalf("%d resume events on the flaky part (%v), want 1", resumed, err)
	}
}
