package scanner

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// env is one test's world: a fresh MariaDB database, the GitLab simulator over real
// HTTP and a real *mr.Client. Nothing is mocked.
type env struct {
	t     *testing.T
	st    *store.Store
	dsn   string
	sim   *gitlabsim.Sim
	gl    *mr.Client
	repos []string
}

func newEnv(t *testing.T, opts gitlabsim.Options, repos ...string) *env {
	t.Helper()
	st, dsn := storetest.New(t)
	opts.Projects = repos
	sim := gitlabsim.StartTest(t, opts)
	gl, err := mr.New(mr.Config{
		BaseURL:      sim.URL(),
		Token:        sim.Token(),
		CallTimeout:  5 * time.Second,
		RetryWaitMin: 5 * time.Millisecond,
		RetryWaitMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, st: st, dsn: dsn, sim: sim, gl: gl, repos: repos}
}

// testConfig is a Config with intervals short enough for tests.
func (e *env) testConfig(name string) Config {
	return Config{
		Repos:             e.repos,
		ClaimSchedule:     "@every 1s",
		MaxBatchSize:      500,
		MergeMode:         MergeAuto,
		ReplicaID:         name,
		ReconcileInterval: 100 * time.Millisecond,
		BatchTimeout:      time.Minute,
		ShutdownTimeout:   3 * time.Second,
		PublishInterval:   100 * time.Millisecond,
		PublishLease:      300 * time.Millisecond,
		SettleLease:       300 * time.Millisecond,
		TimeoutInterval:   200 * time.Millisecond,
		ExpiryInterval:    200 * time.Millisecond,
		CleanupInterval:   time.Second,
		OrphanInterval:    300 * time.Millisecond,
		StartJitter:       20 * time.Millisecond,
		BackoffBase:       20 * time.Millisecond,
		BackoffMax:        200 * time.Millisecond,
	}
}

func (e *env) scanner(name string, mut func(*Config)) *Scanner {
	cfg := e.testConfig(name)
	if mut != nil {
		mut(&cfg)
	}
	return New(cfg, e.st, e.gl, testLogger(), prometheus.NewRegistry())
}

// testLogger logs to stderr at BATCHERD_TEST_LOG (debug, info, warn, error; default
// error so a failing test shows what went wrong without drowning in expected noise).
func testLogger() *slog.Logger {
	lvl := slog.LevelError
	switch strings.ToLower(os.Getenv("BATCHERD_TEST_LOG")) {
	case "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "warn":
		lvl = slog.LevelWarn
	case "off":
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// drive runs publish and reconcile passes of s until batch id is settled (or the
// deadline), as a replica's loops would, and returns the settled batch.
func (e *env) drive(s *Scanner, id int64, within time.Duration) domain.Batch {
	e.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		b, err := e.st.BatchGet(ctx, id)
		if err != nil {
			e.t.Fatalf("BatchGet(%d): %v", id, err)
		}
		if !b.Status.Active() {
			return b
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("batch %d still %s after %s (mr_iid=%v error=%s: %s)", id, b.Status, within, b.MRIID, b.ErrorCode, b.ErrorMessage)
		}
		_ = s.publish.runOnce(ctx)
		_ = s.reconcile.runOnce(ctx)
		_ = s.timeout.runOnce(ctx)
		time.Sleep(20 * time.Millisecond)
	}
}

// ops returns the operations by id.
func (e *env) ops(ids []string) map[string]domain.Operation {
	e.t.Helper()
	out := map[string]domain.Operation{}
	for _, id := range ids {
		op, err := e.st.OperationGet(context.Background(), id)
		if err != nil {
			e.t.Fatalf("OperationGet(%s): %v", id, err)
		}
		out[id] = op
	}
	return out
}

func (e *env) requireOps(ids []string, want domain.OpStatus) map[string]domain.Operation {
	e.t.Helper()
	ops := e.ops(ids)
	for id, op := range ops {
		if op.Status != want {
			e.t.Errorf("operation %s: status %s, want %s (error %s: %s)", id, op.Status, want, op.ErrorCode, op.ErrorMessage)
		}
		if want == domain.OpFailed && op.ErrorCode == "" {
			e.t.Errorf("operation %s failed without a reason", id)
		}
	}
	return ops
}

// requireFilesOnMain checks that every grant's binding file is on the default branch
// with its operation id (merged), or absent (failed, never merged behind the batch).
func (e *env) requireFiles(repo string, ops map[string]domain.Operation, onMain bool) {
	e.t.Helper()
	files := e.sim.Files(repo)
	for id, op := range ops {
		if op.Action != domain.ActionGrant {
			continue
		}
		content, ok := files[domain.BindingPath(op.Subject, op.Target)]
		switch {
		case onMain && !ok:
			e.t.Errorf("operation %s merged but %s is not on main", id, domain.BindingPath(op.Subject, op.Target))
		case onMain && !strings.Contains(content, id):
			e.t.Errorf("operation %s: file on main does not carry its id:\n%s", id, content)
		case !onMain && ok:
			e.t.Errorf("operation %s failed but its file is on main", id)
		}
	}
}

// branch is the source branch of batch id of this test's installation.
func (e *env) branch(id int64) string {
	e.t.Helper()
	inst, err := e.st.Installation(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return domain.BranchName(inst, id)
}

// mrsOf returns the MRs of a batch's branch.
func (e *env) mrsOf(repo string, batchID int64) []gitlabsim.MRState {
	return e.sim.MRsByBranch(repo)[e.branch(batchID)]
}

// commitsMade counts commit creations the simulator did: answered 201, or faulted
// after the work (tests here inject only after-work faults on that route).
func (e *env) commitsMade() int {
	n := 0
	for _, c := range e.sim.Calls() {
		if c.Method == "POST" && c.Route == "/projects/:id/repository/commits" && (c.Status == 201 || c.Fault) {
			n++
		}
	}
	return n
}

// runScanner runs s.Run until the test ends (or stop is called), failing the test
// if Run returns an error.
func runScanner(t *testing.T, s *Scanner) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// published runs a claim round of repo and a publish pass with s, and returns the batch
// as published (with its MR recorded).
func (e *env) published(s *Scanner, repo string) domain.Batch {
	e.t.Helper()
	bg := context.Background()
	res, err := s.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		e.t.Fatalf("round: %+v %v", res, err)
	}
	if err := s.publish.runOnce(bg); err != nil {
		e.t.Fatal(err)
	}
	b, err := e.st.BatchGet(bg, res.BatchID)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// due makes a batch due for its next check now.
func (e *env) due(id int64) {
	e.t.Helper()
	if _, err := e.st.DB().Exec("UPDATE merge_batch SET next_check_at = CURRENT_TIMESTAMP(6) WHERE id = ?", id); err != nil {
		e.t.Fatal(err)
	}
}

// frozenPublish starts a publish pass of s that freezes right after step freezeAt and,
// once resumed, dies right after opening the MR (publish.mr: its work context is
// cancelled, so every later call of it fails, as if the replica were killed there).
// It returns when the publisher is frozen; resume lets it go on and waits for the
// pass to end. A test that ends before resuming lets it go on, dead, at its cleanup.
func frozenPublish(t *testing.T, s *Scanner, freezeAt string) (resume func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	paused, release := make(chan struct{}), make(chan struct{})
	var froze, released sync.Once
	s.testHook = func(_ context.Context, step string, _ int64) {
		switch step {
		case freezeAt:
			froze.Do(func() {
				close(paused)
				<-release
			})
		case "publish.mr":
			cancel()
		}
	}
	done := make(chan error, 1)
	go func() { done <- s.publish.runOnce(ctx) }()
	resume = func() {
		released.Do(func() {
			close(release)
			<-done
		})
	}
	t.Cleanup(func() { cancel(); resume() })
	select {
	case <-paused:
	case err := <-done:
		released.Do(func() {}) // the pass is over: nothing to release or wait for
		t.Fatalf("the publish pass ended (%v) before reaching %s", err, freezeAt)
	}
	return resume
}

// leaseFindingStart is where the protocol model's lease findings begin (docs/MODEL.md,
// "Findings"): two queued operations, manual pipelines, and replica a — whose publish
// lease is 100 ms, so a freeze outlives it — has claimed them into one batch.
func leaseFindingStart(t *testing.T) (*env, []string, *Scanner, store.ClaimResult) {
	t.Helper()
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	a := e.scanner("a", func(c *Config) { c.PublishLease = 100 * time.Millisecond })
	res, err := a.RunRound(context.Background(), repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	return e, ids, a, res
}
