package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batcherd/batcherd/internal/harness"
)

// E2EConfig is one end-to-end run.
type E2EConfig struct {
	Ops       int
	Repos     int
	Replicas  int
	MaxBatch  int           // BATCHERD_MAX_BATCH_SIZE (1 = one MR per operation)
	CallDelay time.Duration // added to every GitLab API call
	Pipeline  time.Duration
	Clients   int           // concurrent API clients submitting
	Timeout   time.Duration // give up waiting for merges after this
	Binaries  *harness.Binaries
	Logf      func(string, ...any)
}

// E2EResult is what an end-to-end run measured.
type E2EResult struct {
	Cfg         E2EConfig
	Submitted   int
	SubmitTime  time.Duration // all admissions answered
	MergedTime  time.Duration // from the first submission until every operation merged (or Timeout)
	Merged      int
	Failed      int
	MRs         int // merge requests created in the simulator
	Batches     int
	GitLabCalls int // API calls the simulator answered (after start-up)
	Complete    bool
}

// CallsPerOp is GitLab API calls per merged operation.
func (r E2EResult) CallsPerOp() float64 {
	if r.Merged == 0 {
		return 0
	}
	return float64(r.GitLabCalls) / float64(r.Merged)
}

// EndToEnd starts batcherd replicas as processes with the GitLab simulator (internal/
// harness), adds CallDelay to every GitLab call, submits Ops grants over Repos
// repositories through the HTTP API (auto-approved, with Idempotency-Keys) and waits
// until every one is merged.
func EndToEnd(ctx context.Context, cfg E2EConfig) (E2EResult, error) {
	res := E2EResult{Cfg: cfg}
	repos := make([]string, cfg.Repos)
	for i := range repos {
		repos[i] = fmt.Sprintf("bench/e2e-%d", i+1)
	}
	c, err := harness.Start(ctx, harness.Options{
		Replicas: cfg.Replicas, Repos: repos, DBPrefix: "bench_e2e", Binaries: cfg.Binaries,
		PipelineDuration: cfg.Pipeline, ClaimSchedule: "@every 1s", ReconcileInterval: time.Second,
		AutoApprove: true, Logf: cfg.Logf,
		Env: map[string]string{
			"BATCHERD_MAX_BATCH_SIZE": strconv.Itoa(cfg.MaxBatch),
			"BATCHERD_LOG_LEVEL":      "warn",
		},
	})
	if err != nil {
		return res, err
	}
	defer c.Close()
	if cfg.CallDelay > 0 {
		if _, err := c.Sim.InjectFault(ctx, harness.SimFault{Latency: cfg.CallDelay, LatencyMS: cfg.CallDelay.Milliseconds()}); err != nil {
			return res, err
		}
	}
	st0, err := c.Sim.State(ctx)
	if err != nil {
		return res, err
	}
	calls0 := 0
	for _, n := range st0.Calls {
		calls0 += n
	}
	db, err := c.DB()
	if err != nil {
		return res, err
	}
	defer db.Close()

	// Submit.
	cl := c.Client()
	t0 := time.Now()
	var next, submitted atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < cfg.Clients; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.Ops || ctx.Err() != nil {
					return
				}
				req := harness.OperationRequest{Subject: fmt.Sprintf("user-%06d", i), Target: "db/prod",
					Action: "grant", Repo: repos[i%len(repos)]}
				if _, _, err := cl.Submit(ctx, req, fmt.Sprintf("bench-e2e-%d", i)); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				submitted.Add(1)
			}
		})
	}
	wg.Wait()
	res.SubmitTime = time.Since(t0)
	res.Submitted = int(submitted.Load())
	if e, ok := firstErr.Load().(string); ok {
		return res, fmt.Errorf("submitting: %s", e)
	}

	// Wait until every operation merged (or failed).
	deadline := t0.Add(cfg.Timeout)
	for {
		var merged, failed int
		if err := db.QueryRowContext(ctx, `SELECT COALESCE(SUM(status = 'merged'), 0), COALESCE(SUM(status = 'failed'), 0) FROM operation`).Scan(&merged, &failed); err != nil {
			return res, err
		}
		res.Merged, res.Failed = merged, failed
		if merged+failed >= cfg.Ops {
			res.Complete = true
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	res.MergedTime = time.Since(t0)

	st, err := c.Sim.State(ctx)
	if err != nil {
		return res, err
	}
	for _, p := range st.Projects {
		for _, mrs := range p.MergeRequests {
			res.MRs += len(mrs)
		}
	}
	for _, n := range st.Calls {
		res.GitLabCalls += n
	}
	res.GitLabCalls -= calls0
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM merge_batch`).Scan(&res.Batches); err != nil {
		return res, err
	}
	if cfg.Logf != nil {
		rows, err := db.QueryContext(ctx, `SELECT b.id, b.repo, b.size, b.created_at, b.finished_at,
			(SELECT MIN(e.created_at) FROM audit_event e WHERE e.batch_id = b.id AND e.operation_id IS NULL) AS first_event,
			(SELECT GROUP_CONCAT(CONCAT(e.code, '@', TIMESTAMPDIFF(MICROSECOND, b.created_at, e.created_at) DIV 1000) ORDER BY e.id) FROM audit_event e WHERE e.batch_id = b.id AND e.operation_id IS NULL) AS evs
			FROM merge_batch b ORDER BY b.id`)
		if err == nil {
			for rows.Next() {
				var id, size int64
				var repo, created string
				var finished, first, evs *string
				_ = rows.Scan(&id, &repo, &size, &created, &finished, &first, &evs)
				cfg.Logf("batch %d %s size %d created %s finished %v events %v", id, repo, size, created, deref(finished), deref(evs))
			}
			rows.Close()
		}
	}
	return res, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
