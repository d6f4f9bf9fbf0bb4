package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/harness"
)

// killReplicas kills a random running replica every KillEvery (±50%) — kill -9
// mostly, now and then a graceful SIGTERM — and restarts it 0.2–2s later; or freezes
// one (SIGSTOP) for up to FreezeMax and lets it go on (SIGCONT). At least two
// replica processes keep running (a frozen one counts: it still holds connections and
// leases). A restart that fails (MariaDB is restarting) is retried until
// the replica is up; restarts run on the run's context and outlive the chaos phase
// (recover waits for them).
func (r *run) killReplicas(ctx context.Context, restarts *sync.WaitGroup) {
	runCtx := r.ctx // outlives the chaos phase, not an interrupt
	for sleep(ctx, r.rnd.Around(r.cfg.KillEvery)) {
		var cands []*harness.Replica
		running := 0
		r.mu.Lock()
		for _, rep := range r.c.Replicas {
			if rep.Running() {
				running++
			}
			if rep.Running() && !r.busy[rep.ID] {
				cands = append(cands, rep)
			}
		}
		if running <= 2 || len(cands) == 0 {
			r.mu.Unlock()
			continue
		}
		rep := cands[r.rnd.IntN(len(cands))]
		r.busy[rep.ID] = true
		r.mu.Unlock()

		p := r.rnd.Float64()
		if p < 0.12 && r.cfg.FreezeMax > 0 {
			// A frozen process (a long GC pause, a stopped VM): its leases run out, other
			// replicas take its work over, and when it wakes up its writes must lose
			// (fencing). Its connections and any open transaction stay meanwhile.
			d := r.rnd.Dur(time.Second, r.cfg.FreezeMax)
			r.event("SIGSTOP %s (pid %d) for %s", rep.ID, rep.Pid(), d.Round(100*time.Millisecond))
			_ = rep.Signal(syscall.SIGSTOP)
			r.count(func(s *stats) { s.ReplicaFreezes++ })
			restarts.Go(func() {
				defer func() {
					r.mu.Lock()
					delete(r.busy, rep.ID)
					r.mu.Unlock()
				}()
				sleep(runCtx, d)
				_ = rep.Signal(syscall.SIGCONT)
				r.event("SIGCONT %s", rep.ID)
			})
			continue
		}
		if graceful := p < 0.27; graceful {
			r.event("SIGTERM %s (pid %d)", rep.ID, rep.Pid())
			if _, err := rep.Stop(10 * time.Second); err != nil {
				r.logf("%s: %v", rep.ID, err)
			}
			r.count(func(s *stats) { s.ReplicaTerms++ })
		} else {
			r.event("kill -9 %s (pid %d)", rep.ID, rep.Pid())
			if err := rep.Kill(); err != nil {
				r.logf("killing %s: %v", rep.ID, err)
			}
			r.count(func(s *stats) { s.ReplicaKills++ })
		}
		down := r.rnd.Dur(200*time.Millisecond, 2*time.Second)
		restarts.Go(func() {
			defer func() {
				r.mu.Lock()
				delete(r.busy, rep.ID)
				r.mu.Unlock()
			}()
			sleep(runCtx, down)
			for attempt := 1; ; attempt++ {
				err := rep.Start(runCtx)
				if err == nil {
					r.event("%s restarted (pid %d)", rep.ID, rep.Pid())
					return
				}
				r.count(func(s *stats) { s.ReplicaRestartFailures++ })
				r.event("%s did not start (attempt %d, MariaDB down?): %s", rep.ID, attempt, firstLine(err.Error()))
				if runCtx.Err() != nil {
					return
				}
				if attempt >= 60 {
					r.logf("%s: giving up restarting after %d attempts: %v", rep.ID, attempt, err)
					return
				}
				sleep(runCtx, time.Second)
			}
		})
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// killConnections KILLs 1–2 random batcherd connections every ConnKillEvery: the
// whole connection mostly, now and then only the running statement (KILL QUERY).
// Half the time it picks among the connections that are busy (running a statement or
// holding an open transaction), where a kill hurts: a pool's idle connections are the
// majority, and killing one only makes the driver dial again. The run's own
// connections log in as root and are never chosen.
func (r *run) killConnections(ctx context.Context) {
	for sleep(ctx, r.rnd.Around(r.cfg.ConnKillEvery)) {
		if !r.db.Running() {
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		query := `SELECT ID FROM information_schema.PROCESSLIST
			WHERE USER = ? AND DB = ? AND ID <> CONNECTION_ID()`
		if r.rnd.Float64() < 0.5 {
			query += ` AND (COMMAND <> 'Sleep' OR ID IN (SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX))`
		}
		rows, err := r.sql.QueryContext(qctx, query, r.dbUser(), r.c.DBName)
		if err != nil {
			cancel()
			continue
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if rows.Scan(&id) == nil {
				ids = append(ids, id)
			}
		}
		rows.Close()
		for n := 1 + r.rnd.IntN(2); n > 0 && len(ids) > 0; n-- {
			i := r.rnd.IntN(len(ids))
			id := ids[i]
			ids = append(ids[:i], ids[i+1:]...)
			what := "CONNECTION"
			if r.rnd.Float64() < 0.25 {
				what = "QUERY"
			}
			_, err := r.sql.ExecContext(qctx, fmt.Sprintf("KILL %s %d", what, id))
			var me *mysql.MySQLError
			if err != nil && !(errors.As(err, &me) && me.Number == 1094) { // 1094: unknown thread (gone already)
				continue
			}
			if err == nil {
				r.count(func(s *stats) {
					if what == "QUERY" {
						s.QueryKills++
					} else {
						s.ConnKills++
					}
				})
			}
		}
		cancel()
	}
}

// restartDB restarts the private mariadbd DBRestarts times (once by default, in the
// middle of the chaos): SIGTERM and wait for the clean shutdown (or kill -9 with
// DBCrash), then start again on the same data directory and port.
func (r *run) restartDB(ctx context.Context) {
	n := max(r.cfg.DBRestarts, 1)
	every := r.cfg.Duration / time.Duration(n+1)
	for range n {
		if !sleep(ctx, every) {
			return
		}
		r.restartDBOnce()
	}
}

func (r *run) restartDBOnce() {
	runCtx := r.ctx // outlives the chaos phase, not an interrupt
	how := "SIGTERM"
	if r.cfg.DBCrash {
		how = "kill -9"
	}
	r.logf("restarting MariaDB (%s, then start on the same data directory and port)", how)
	// An audit in flight when the server goes away: it must fail to run, not report
	// violations or drift.
	var audit sync.WaitGroup
	audit.Go(func() { r.audit1(runCtx) })
	sleep(runCtx, r.rnd.Dur(0, 60*time.Millisecond))
	defer audit.Wait()
	t0 := time.Now()
	stop := func() error { return r.db.Stop(60 * time.Second) }
	if r.cfg.DBCrash {
		stop = r.db.Kill
	}
	if err := stop(); err != nil {
		r.logf("stopping MariaDB: %v", err)
	}
	// A moment with the server really gone, as a failover would leave it.
	sleep(runCtx, r.rnd.Dur(500*time.Millisecond, 2*time.Second))
	if err := retry(runCtx, 60*time.Second, func() error { return r.db.Start(runCtx) }); err != nil {
		r.violation("MariaDB did not come back: %v", err)
		return
	}
	down := time.Since(t0)
	r.count(func(s *stats) { s.DBRestarts++; s.DBDowntime += down })
	r.logf("MariaDB back after %s", down.Round(100*time.Millisecond))
}

// faultKinds are the GitLab faults the chaos injects.
var writeRoutes = []struct{ method, route string }{
	{"POST", "/projects/:id/repository/commits"},
	{"POST", "/projects/:id/merge_requests"},
	{"PUT", "/projects/:id/merge_requests/:iid"},
	{"PUT", "/projects/:id/merge_requests/:iid/merge"},
}

var readRoutes = []struct{ method, route string }{
	{"GET", "/projects/:id/merge_requests"},
	{"GET", "/projects/:id/merge_requests/:iid"},
	{"GET", "/projects/:id/repository/branches/:branch"},
	{"GET", "/projects/:id/repository/commits/:sha"},
	{"GET", "/projects/:id/pipelines/:pid"},
	{"GET", ""},
}

// injectFaults adds one GitLab fault every FaultEvery, each for a few calls.
func (r *run) injectFaults(ctx context.Context) {
	for sleep(ctx, r.rnd.Around(r.cfg.FaultEvery)) {
		var f harness.SimFault
		kind := ""
		anyRoute := func() (string, string) {
			if r.rnd.Float64() < 0.5 {
				w := writeRoutes[r.rnd.IntN(len(writeRoutes))]
				return w.method, w.route
			}
			rr := readRoutes[r.rnd.IntN(len(readRoutes))]
			return rr.method, rr.route
		}
		switch p := r.rnd.Float64(); {
		case p < 0.2:
			kind = "5xx"
			f.Method, f.Route = anyRoute()
			f.Status = []int{500, 502, 503}[r.rnd.IntN(3)]
			f.Count = 1 + r.rnd.IntN(3)
		case p < 0.35:
			kind = "429 Retry-After"
			f.Method, f.Route = anyRoute()
			f.Status = 429
			f.Headers = map[string]string{"Retry-After": fmt.Sprint(1 + r.rnd.IntN(2))}
			f.Count = 1 + r.rnd.IntN(3)
		case p < 0.55:
			kind = "latency"
			f.Method, f.Route = anyRoute()
			f.LatencyMS = int64(r.rnd.Dur(200*time.Millisecond, 2500*time.Millisecond) / time.Millisecond)
			f.Count = 2 + r.rnd.IntN(4)
		case p < 0.6:
			kind = "latency beyond the client timeout"
			f.Method, f.Route = anyRoute()
			f.LatencyMS = 6000
			f.Count = 1
		case p < 0.85:
			kind = "work done, answer dropped"
			w := writeRoutes[r.rnd.IntN(len(writeRoutes))]
			f.Method, f.Route = w.method, w.route
			f.AfterWork = true
			if r.rnd.Float64() < 0.7 {
				f.Drop = true
			} else {
				f.Status = 502 // work done, a proxy answers 502
			}
			f.Count = 1
		default:
			kind = "connection dropped"
			f.Method, f.Route = anyRoute()
			f.Drop = true
			f.Count = 1
		}
		if _, err := r.c.Sim.InjectFault(ctx, f); err != nil {
			continue
		}
		r.count(func(s *stats) { s.Faults[kind]++ })
		r.event("fault: %s on %s %s ×%d", kind, f.Method, f.Route, f.Count)
	}
}

// openBatchMRs lists the open MRs of batch branches, by repository.
func openBatchMRs(st harness.SimState) map[string][]harness.SimMR {
	out := map[string][]harness.SimMR{}
	for repo, p := range st.Projects {
		for branch, mrs := range p.MergeRequests {
			if !strings.HasPrefix(branch, "batcherd/") {
				continue
			}
			for _, m := range mrs {
				if m.State == "opened" {
					out[repo] = append(out[repo], m)
				}
			}
		}
	}
	return out
}

// human acts on batch MRs behind batcherd's back every HumanEvery: merges one, closes
// one, fails a running pipeline, or retries a failed one.
//
// MRs are open for about a pipeline's duration, so the human looks often and acts
// once the pause since the last action (HumanEvery ±50%) has passed.
func (r *run) human(ctx context.Context) {
	next := time.Now().Add(r.rnd.Around(r.cfg.HumanEvery))
	for sleep(ctx, 250*time.Millisecond) {
		if time.Now().Before(next) {
			continue
		}
		st, err := r.c.Sim.State(ctx)
		if err != nil {
			continue
		}
		open := openBatchMRs(st)
		type cand struct {
			repo string
			m    harness.SimMR
		}
		var all, failed, running []cand
		for _, repo := range sortedKeys(open) {
			for _, m := range open[repo] {
				c := cand{repo, m}
				all = append(all, c)
				switch m.PipelineStatus {
				case "failed", "canceled":
					failed = append(failed, c)
				case "running", "pending", "created":
					running = append(running, c)
				}
			}
		}
		if len(all) == 0 {
			continue
		}
		next = time.Now().Add(r.rnd.Around(r.cfg.HumanEvery))
		pick := func(cs []cand) cand { return cs[r.rnd.IntN(len(cs))] }
		switch p := r.rnd.Float64(); {
		case len(failed) > 0 && p < 0.5:
			c := pick(failed)
			if r.c.Sim.SucceedMRPipeline(ctx, c.repo, c.m.IID) == nil {
				r.count(func(s *stats) { s.PipelinesRetried++ })
				r.event("human retried the failed pipeline of %s!%d", c.repo, c.m.IID)
			}
		case p < 0.3:
			c := pick(all)
			if r.c.Sim.MergeMR(ctx, c.repo, c.m.IID) == nil {
				r.count(func(s *stats) { s.HumanMerges++ })
				r.event("human merged %s!%d (%s)", c.repo, c.m.IID, c.m.SourceBranch)
			}
		case p < 0.6:
			c := pick(all)
			if r.c.Sim.CloseMR(ctx, c.repo, c.m.IID) == nil {
				r.count(func(s *stats) { s.HumanCloses++ })
				r.event("human closed %s!%d (%s)", c.repo, c.m.IID, c.m.SourceBranch)
			}
		case p < 0.8 && len(running) > 0:
			c := pick(running)
			if r.c.Sim.FailMRPipeline(ctx, c.repo, c.m.IID, "chaos: job failed") == nil {
				r.count(func(s *stats) { s.PipelinesFailedByHand++ })
				r.event("human failed the pipeline of %s!%d", c.repo, c.m.IID)
			}
		case len(failed) > 0:
			c := pick(failed)
			if r.c.Sim.SucceedMRPipeline(ctx, c.repo, c.m.IID) == nil {
				r.count(func(s *stats) { s.PipelinesRetried++ })
				r.event("human retried the failed pipeline of %s!%d", c.repo, c.m.IID)
			}
		}
	}
}

// sniper is a second human, with a nose for orphans: it merges at once any open batch
// MR whose batch the database already settled (a publish that lost to a settle, whose
// MR batcherd has yet to close). Merged wins: the database must follow.
func (r *run) sniper(ctx context.Context) {
	for sleep(ctx, 200*time.Millisecond) {
		st, err := r.c.Sim.State(ctx)
		if err != nil {
			continue
		}
		for _, repo := range sortedKeys(openBatchMRs(st)) {
			for _, m := range openBatchMRs(st)[repo] {
				_, id, ok := domain.ParseBranch(m.SourceBranch)
				if !ok {
					continue
				}
				var status int
				qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err := r.sql.QueryRowContext(qctx, "SELECT status FROM merge_batch WHERE id = ?", id).Scan(&status)
				cancel()
				if err != nil || (status != 2 && status != 3) {
					continue
				}
				if r.c.Sim.MergeMR(ctx, repo, m.IID) == nil {
					r.count(func(s *stats) { s.OrphanMerges++ })
					r.logf("human merged %s!%d, an open MR of batch %s, which is settled (status %d)", repo, m.IID, id, status)
				}
			}
		}
	}
}

// operator retries a few failed operations of the load (POST /v1/operations/{id}/retry)
// every OperatorEvery: each becomes queued again, and must end merged or failed.
func (r *run) operator(ctx context.Context) {
	runCtx := r.ctx // outlives the chaos phase, not an interrupt
	for sleep(ctx, r.rnd.Around(r.cfg.OperatorEvery)) {
		l := r.load
		l.mu.Lock()
		var cands []*opRec
		for _, o := range l.ops {
			if o.accepted {
				cands = append(cands, o)
			}
		}
		l.mu.Unlock()
		for range min(len(cands), 4) {
			o := cands[r.rnd.IntN(len(cands))]
			cur, err := r.api.Operation(ctx, o.id)
			if err != nil || cur.Status != "failed" || r.rnd.Float64() < 0.5 {
				continue
			}
			// The answer may be lost: then the retry may or may not have happened, and
			// the end state is merged or failed either way.
			if _, err := r.api.Retry(runCtx, o.id); err == nil {
				l.mu.Lock()
				o.retried++
				l.mu.Unlock()
				r.count(func(s *stats) { s.OperatorRetries++ })
				r.event("operator retried failed operation %s", o.id)
			}
		}
	}
}

// monitor checks, every second while the chaos runs, what must hold at every instant
// and not only at the end: never two open MRs for one batch branch, never two active
// batches in one repository.
func (r *run) monitor(ctx context.Context) {
	seen := map[string]bool{}
	for sleep(ctx, time.Second) {
		if st, err := r.c.Sim.State(ctx); err == nil {
			for repo, p := range st.Projects {
				for branch, mrs := range p.MergeRequests {
					n := 0
					for _, m := range mrs {
						if m.State == "opened" {
							n++
						}
					}
					if k := repo + " " + branch; n > 1 && !seen[k] {
						seen[k] = true
						r.violation("%s: %d open MRs for branch %s", repo, n, branch)
					}
				}
			}
		}
		if !r.db.Running() {
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		rows, err := r.sql.QueryContext(qctx, "SELECT repo, COUNT(*) FROM merge_batch WHERE status IN (1, 4) GROUP BY repo HAVING COUNT(*) > 1")
		if err == nil {
			for rows.Next() {
				var repo string
				var n int
				if rows.Scan(&repo, &n) == nil && !seen["I1 "+repo] {
					seen["I1 "+repo] = true
					r.violation("I1: repository %s has %d active batches", repo, n)
				}
			}
			rows.Close()
		}
		cancel()
	}
}

// progress prints one status line every 10 seconds.
func (r *run) progress(ctx context.Context) {
	for sleep(ctx, 10*time.Second) {
		r.logf("%s", r.statusLine(ctx))
	}
}

// statusLine is operations by status, active batches and what the chaos did so far.
func (r *run) statusLine(ctx context.Context) string {
	ops := map[string]int{}
	active := -1
	if r.db.Running() {
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if rows, err := r.sql.QueryContext(qctx, "SELECT status, COUNT(*) FROM operation GROUP BY status"); err == nil {
			for rows.Next() {
				var s string
				var n int
				if rows.Scan(&s, &n) == nil {
					ops[s] = n
				}
			}
			rows.Close()
		}
		_ = r.sql.QueryRowContext(qctx, "SELECT COUNT(*) FROM merge_batch WHERE status IN (1, 4)").Scan(&active)
	}
	r.mu.Lock()
	s := r.stats
	faults := 0
	for _, n := range s.Faults {
		faults += n
	}
	r.mu.Unlock()
	live := len(r.c.Live())
	db := "up"
	if !r.db.Running() {
		db = "DOWN"
	}
	return fmt.Sprintf("ops: pending %d queued %d in_batch %d merged %d failed %d rejected %d | active batches %d | replicas up %d/%d, db %s | kills %d+%d term, conn kills %d, faults %d, human %d",
		ops["pending_approval"], ops["queued"], ops["in_batch"], ops["merged"], ops["failed"], ops["rejected"], active,
		live, len(r.c.Replicas), db, s.ReplicaKills, s.ReplicaTerms, s.ConnKills+s.QueryKills, faults, s.HumanMerges+s.HumanCloses)
}

// liveVerifyUser is the read-only account the live audits use: SELECT on the run's
// database only, so an audit proves `batcherd verify` needs no more, and the
// connection killer (which targets batcherd's account) leaves it alone.
const liveVerifyUser = "chaosverify"

// grantLiveVerify creates liveVerifyUser.
func (r *run) grantLiveVerify(ctx context.Context) error {
	for _, q := range []string{
		"CREATE USER IF NOT EXISTS '" + liveVerifyUser + "'@'127.0.0.1' IDENTIFIED BY '" + liveVerifyUser + "'",
		"GRANT SELECT ON `" + r.c.DBName + "`.* TO '" + liveVerifyUser + "'@'127.0.0.1'",
	} {
		if _, err := r.sql.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// liveVerify runs `batcherd verify` every few seconds while the chaos goes on. Each
// audit reads one consistent snapshot, and every store method is one transaction, so
// a live system must never show a violation, not even a transient one.
func (r *run) liveVerify(ctx context.Context) {
	for sleep(ctx, r.rnd.Around(4*time.Second)) {
		if !r.audit1(ctx) {
			return
		}
	}
}

// audit1 runs `batcherd verify` once as the read-only account and judges it: clean
// (exit 0); failed to run (exit 1 without a report: MariaDB was restarting, which a
// restart cuts off on purpose); or a violation — any report of violations, and any
// exit 3, since drift is never transient. It returns false when ctx ended.
func (r *run) audit1(ctx context.Context) bool {
	cfg, _ := mysql.ParseDSN(r.db.ServerDSN())
	cfg.User, cfg.Passwd, cfg.DBName = liveVerifyUser, liveVerifyUser, r.c.DBName
	env := []string{"BATCHERD_MYSQL_DSN=" + cfg.FormatDSN(), "BATCHERD_LOG_FORMAT=text", "BATCHERD_LOG_LEVEL=warn"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BATCHERD_") {
			env = append(env, kv)
		}
	}
	vctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(vctx, r.c.Bin.Batcherd, "verify")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	code := cmd.ProcessState.ExitCode()
	text := string(out)
	switch {
	case err == nil:
		r.count(func(s *stats) { s.LiveVerifies++ })
	case ctx.Err() != nil:
		return false
	case code == 3 || code == 1 && strings.Contains(text, "violation(s):"):
		r.count(func(s *stats) { s.LiveVerifies++ })
		r.violation("batcherd verify during the chaos exited %d:\n%s", code, text)
	default:
		r.count(func(s *stats) { s.LiveVerifyErrors++ })
		r.event("live verify did not run (exit %d): %s", code, firstLine(text))
	}
	return true
}
