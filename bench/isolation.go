package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/scanner"
)

// Failure isolation against its limit (issue 20): how many pipeline runs batcherd's
// failure isolation (docs/ARCHITECTURE.md, the failure policy in internal/scanner/policy.go)
// needs until every good operation of a batch merged and every culprit is named,
// compared with the group-testing lower bound and two simple alternatives. Pipelines
// are the scarce resource (a real one takes minutes), so the figure is counted in
// pipeline runs of the GitLab simulator, not in seconds: the run is real (a fresh
// database, the simulator over loopback HTTP, the real client, one scanner running
// its loops), only the pipelines are short.

// IsolationCase is one run: N operations in one repository, K of them culprits (every
// pipeline whose commit contains one fails with script_failure), Flaky the probability
// that any pipeline fails by itself (script_failure too, so it looks exactly like a
// culprit's failure).
type IsolationCase struct {
	N, K  int
	Flaky float64
	Seed  uint64
	// PipelineDuration of the simulator (short: runs are counted, not timed).
	PipelineDuration time.Duration
	Timeout          time.Duration
}

// IsolationResult is what one run needed.
type IsolationResult struct {
	Case IsolationCase
	// Runs counts every pipeline run of a batch's commit: each batch's pipeline, each rebuild, and each
	// in-place retry of a lone member's failed pipeline (BATCHERD_FLAKE_RETRIES).
	Runs int
	// FlakeRetries is the part of Runs that were in-place retries.
	FlakeRetries int
	// Batches is how many batches were published (one after another: a repository has
	// one active batch, I1).
	Batches         int
	Merged          int // good operations merged
	CulpritsNamed   int // culprits failed as culprit
	InnocentsFailed int // good operations failed (any reason): must be 0
	CulpritsMerged  int // culprits merged: must be 0
	Elapsed         time.Duration
}

// LowerBound is the group-testing lower bound ⌈log₂ C(n,k)⌉ + 1: a test tells pass or
// fail, so naming k culprits among n needs at least log₂ of the number of possible
// culprit sets as tests, plus the batch's first run.
func LowerBound(n, k int) int {
	lg := 0.0
	for i := range k {
		lg += math.Log2(float64(n-i)) - math.Log2(float64(i+1))
	}
	return int(math.Ceil(lg-1e-9)) + 1
}

// RunIsolation runs one case and reports its pipeline runs.
func RunIsolation(ctx context.Context, c IsolationCase) (IsolationResult, error) {
	res := IsolationResult{Case: c}
	if c.PipelineDuration == 0 {
		c.PipelineDuration = 10 * time.Millisecond
	}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Minute
	}
	const repo = "bench/isolation"
	d, err := NewDB(ctx, "isolation")
	if err != nil {
		return res, err
	}
	defer d.Close()
	st, err := d.Open(ctx, 8)
	if err != nil {
		return res, err
	}
	defer st.Close()

	sim := gitlabsim.New(gitlabsim.Options{
		Projects:         []string{repo},
		PipelineDuration: c.PipelineDuration,
		FailureRate:      c.Flaky,
		FailureReason:    "script_failure",
		Seed:             c.Seed,
	})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		return res, err
	}
	defer sim.Close()
	gl, err := mr.New(mr.Config{BaseURL: sim.URL(), Token: sim.Token(), CallTimeout: 10 * time.Second,
		RetryWaitMin: 5 * time.Millisecond, RetryWaitMax: 50 * time.Millisecond})
	if err != nil {
		return res, err
	}

	// N queued grants with pending bindings and waiting rows, inserted as the store's
	// test fixtures do (storetest.InsertOps), oldest first.
	ids := make([]string, c.N)
	var ops, binds, waits []string
	var opArgs, bindArgs, waitArgs []any
	for i := range ids {
		ids[i] = uuid.NewString()
		subject, target := "s-"+ids[i][:13], "target-"+ids[i][14:18]
		ops = append(ops, "(?,?,?,?,'grant','queued')")
		opArgs = append(opArgs, ids[i], subject, target, repo)
		binds = append(binds, "(?,?,?,'pending',?)")
		bindArgs = append(bindArgs, subject, target, repo, ids[i])
		waits = append(waits, "(?,?)")
		waitArgs = append(waitArgs, ids[i], repo)
	}
	db := st.DB()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{"INSERT INTO operation (operation_id, subject, target, repo, action, status) VALUES " + strings.Join(ops, ","), opArgs},
		{"INSERT INTO binding (subject, target, repo, status, operation_id) VALUES " + strings.Join(binds, ","), bindArgs},
		{"INSERT INTO merge_batch_request (operation_id, repo) VALUES " + strings.Join(waits, ","), waitArgs},
	} {
		if _, err := db.ExecContext(ctx, q.sql, q.args...); err != nil {
			return res, fmt.Errorf("fixtures: %w", err)
		}
	}
	// Culprits at random positions (the seed's).
	rng := rand.New(rand.NewPCG(c.Seed, 20))
	culprit := map[string]bool{}
	for _, p := range rng.Perm(c.N)[:c.K] {
		culprit[ids[p]] = true
		if err := sim.AddPoison(repo, gitlabsim.PoisonRule{Substring: "s-" + ids[p][:13], InPath: true, FailureReason: "script_failure"}); err != nil {
			return res, err
		}
	}

	// The first round is claimed below; every later one is the settling replica's
	// follow-up claim. The scheduled round is only a safety net here: firing between a
	// merge and its resume of a bisection (store.SearchResume), it would take the
	// remainder whole — correct, but a few runs more — and make the counts depend on
	// timing.
	cfg := scanner.Config{
		Repos: []string{repo}, ClaimSchedule: "@every 30s", MaxBatchSize: 500, MergeMode: scanner.MergeAuto,
		ReplicaID: "iso", ReconcileInterval: 20 * time.Millisecond, PublishInterval: 20 * time.Millisecond,
		BatchTimeout: time.Minute, ShutdownTimeout: 3 * time.Second, PublishLease: 2 * time.Second, SettleLease: 2 * time.Second,
		TimeoutInterval: time.Second, ExpiryInterval: time.Second, CleanupInterval: time.Minute, OrphanInterval: time.Second,
		StartJitter: time.Millisecond, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		FlakeRetries: 1,
	}
	s := scanner.New(cfg, st, gl, nil, prometheus.NewRegistry())
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = s.Run(rctx) })
	stop := func() { cancel(); wg.Wait() }
	start := time.Now()
	if _, err := s.RunRound(ctx, repo); err != nil {
		stop()
		return res, err
	}
	deadline := time.Now().Add(c.Timeout)
	for {
		var open int
		if err := db.GetContext(ctx, &open, "SELECT COUNT(*) FROM operation WHERE status NOT IN ('merged', 'failed')"); err != nil {
			stop()
			return res, err
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return res, fmt.Errorf("isolation n=%d k=%d seed=%d: %d operations still open after %s", c.N, c.K, c.Seed, open, c.Timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.Elapsed = time.Since(start)
	stop()
	if runErr != nil {
		return res, runErr
	}

	var rows []struct {
		ID     string `db:"operation_id"`
		Status string `db:"status"`
		Code   string `db:"error_code"`
	}
	if err := db.SelectContext(ctx, &rows, "SELECT operation_id, status, COALESCE(error_code, '') AS error_code FROM operation"); err != nil {
		return res, err
	}
	for _, r := range rows {
		switch {
		case culprit[r.ID] && r.Status == "failed" && r.Code == domain.ReasonCulprit:
			res.CulpritsNamed++
		case culprit[r.ID] && r.Status == "merged":
			res.CulpritsMerged++
		case !culprit[r.ID] && r.Status == "merged":
			res.Merged++
		case !culprit[r.ID]:
			res.InnocentsFailed++
		}
	}
	var branches []string
	if err := db.SelectContext(ctx, &branches, "SELECT source_branch FROM merge_batch WHERE source_branch <> ''"); err != nil {
		return res, err
	}
	res.Batches = len(branches)
	for _, b := range branches {
		// Every pipeline of a batch branch is a batch commit's: the branch is created by
		// the batch's commit (mr.CommitFiles), so none runs for its creation alone.
		n, _ := sim.PipelineCount(repo, b)
		res.Runs += n
	}
	for _, call := range sim.Calls() {
		if call.Method == http.MethodPost && strings.HasSuffix(call.Route, "/retry") && call.Status/100 == 2 {
			res.FlakeRetries++
		}
	}
	res.Runs += res.FlakeRetries
	return res, nil
}
