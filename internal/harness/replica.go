package harness

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Replica is one `batcherd serve` process. Its address and id stay the same across
// restarts.
type Replica struct {
	ID      string
	Addr    string // 127.0.0.1:port
	LogPath string

	c        *Cluster
	n        int // 1-based
	mu       sync.Mutex
	proc     *Process
	starts   int
	lastExit string
	http     *http.Client
}

// AddReplica starts one more replica (replica-<n>) and waits until it is ready.
func (c *Cluster) AddReplica(ctx context.Context) (*Replica, error) {
	n := len(c.Replicas) + 1
	r := &Replica{
		n:       n,
		ID:      fmt.Sprintf("replica-%d", n),
		LogPath: filepath.Join(c.LogDir, fmt.Sprintf("replica-%d.log", n)),
		c:       c,
		http:    &http.Client{Timeout: 5 * time.Second},
	}
	c.Replicas = append(c.Replicas, r)
	if err := r.Start(ctx); err != nil {
		return r, err
	}
	return r, nil
}

// Env is the complete environment the replica runs with.
func (r *Replica) Env() []string {
	o := r.c.Opts
	dsn := r.c.DSN
	if len(o.ReplicaServerDSNs) > 0 {
		dsn = r.c.replicaDSN(r.n)
	}
	vars := map[string]string{
		"BATCHERD_MYSQL_DSN":          dsn,
		"BATCHERD_MYSQL_MAX_CONNS":    "10",
		"BATCHERD_GITLAB_URL":         r.c.Sim.URL,
		"BATCHERD_GITLAB_TOKEN":       SimToken,
		"BATCHERD_GITLAB_TIMEOUT":     "10s",
		"BATCHERD_REPOS":              strings.Join(o.Repos, ","),
		"BATCHERD_HTTP_ADDR":          r.Addr,
		"BATCHERD_REPLICA_ID":         r.ID,
		"BATCHERD_API_TOKENS":         RequesterPrincipal + "=" + APIToken + "," + ApproverPrincipal + "=" + ApproverToken,
		"BATCHERD_ADMIN_TOKENS":       AdminPrincipal + "=" + AdminToken,
		"BATCHERD_WEBHOOK_SECRET":     "harness-webhook-secret",
		"BATCHERD_CLAIM_SCHEDULE":     o.ClaimSchedule,
		"BATCHERD_RECONCILE_INTERVAL": o.ReconcileInterval.String(),
		"BATCHERD_AUTO_APPROVE":       strconv.FormatBool(o.AutoApprove),
		"BATCHERD_MERGE_MODE":         o.MergeMode,
		"BATCHERD_SHUTDOWN_TIMEOUT":   "5s",
		"BATCHERD_LOG_FORMAT":         "json",
		"BATCHERD_LOG_LEVEL":          "info",
	}
	for k, v := range o.Env {
		vars[k] = v
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := baseEnv()
	for _, k := range keys {
		env = append(env, k+"="+vars[k])
	}
	return env
}

// URL is the replica's base URL.
func (r *Replica) URL() string { return "http://" + r.Addr }

// Client is an API client (API token) of this replica only.
func (r *Replica) Client() *Client { return r.c.track(NewClient(APIToken, r.URL())) }

// AdminClient is an admin-token client of this replica only.
func (r *Replica) AdminClient() *Client { return r.c.track(NewClient(AdminToken, r.URL())) }

// Process is the current process (nil before the first start).
func (r *Replica) Process() *Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}

// Running reports whether the replica's process runs.
func (r *Replica) Running() bool {
	p := r.Process()
	return p != nil && !p.Exited()
}

// Pid is the current process id (0 when never started).
func (r *Replica) Pid() int {
	if p := r.Process(); p != nil {
		return p.Pid()
	}
	return 0
}

// Starts counts how often the replica was started.
func (r *Replica) Starts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}

// State is "running", or how the last process ended ("signal: killed", "exit status 0").
func (r *Replica) State() string {
	p := r.Process()
	if p == nil {
		return "not started"
	}
	return p.State()
}

// Start starts the replica's process (it must not be running) and waits for /readyz.
// The first start picks a free port; if that port was taken meanwhile, it picks
// another. Restarts reuse the address.
func (r *Replica) Start(ctx context.Context) error {
	if r.Running() {
		return fmt.Errorf("%s is already running", r.ID)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if r.Addr == "" || (attempt > 0 && r.Starts() == 0) {
			port, err := freePort()
			if err != nil {
				return err
			}
			r.Addr = "127.0.0.1:" + strconv.Itoa(port)
		}
		p, err := startProcess(r.ID, r.c.Bin.Batcherd, []string{"serve"}, r.Env(), r.LogPath)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.proc = p
		r.mu.Unlock()
		err = waitFor(ctx, p, r.c.Opts.ReadyTimeout, func(ctx context.Context) error {
			return httpReady(ctx, r.http, r.URL()+"/readyz")
		})
		if err == nil {
			r.mu.Lock()
			r.starts++
			r.mu.Unlock()
			r.c.logf("%s ready at %s (pid %d)", r.ID, r.URL(), p.Pid())
			return nil
		}
		_ = p.Kill()
		lastErr = fmt.Errorf("%s not ready at %s: %w\n%s", r.ID, r.URL(), err, LogTail(r.LogPath, 30))
		if !strings.Contains(LogTail(r.LogPath, 30), "address already in use") {
			break
		}
	}
	return lastErr
}

// Kill ends the replica with SIGKILL (no shutdown at all: a crash) and waits until it
// is gone.
func (r *Replica) Kill() error {
	p := r.Process()
	if p == nil {
		return nil
	}
	r.c.logf("%s: kill -9 (pid %d)", r.ID, p.Pid())
	return p.Kill()
}

// Signal sends sig to the replica's process group (e.g. SIGSTOP/SIGCONT to freeze
// it).
func (r *Replica) Signal(sig syscall.Signal) error {
	p := r.Process()
	if p == nil {
		return nil
	}
	return p.Signal(sig)
}

// Stop sends SIGTERM and waits up to grace for a graceful exit (then SIGKILL). It
// returns the exit code: 0 is a clean shutdown, -1 means it had to be killed.
func (r *Replica) Stop(grace time.Duration) (int, error) {
	p := r.Process()
	if p == nil || p.Exited() {
		return 0, nil
	}
	// A stopped (SIGSTOP) process would ignore SIGTERM until continued.
	_ = p.Signal(syscall.SIGCONT)
	r.c.closeIdle()
	r.c.logf("%s: SIGTERM (pid %d)", r.ID, p.Pid())
	return p.Stop(grace)
}

// Restart stops the replica gracefully if it runs, then starts it again on the same
// address and waits for /readyz.
func (r *Replica) Restart(ctx context.Context) error {
	if _, err := r.Stop(r.c.Opts.StopGrace); err != nil {
		return err
	}
	return r.Start(ctx)
}

// Metrics scrapes the replica's /metrics.
func (r *Replica) Metrics(ctx context.Context) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s /metrics: %s", r.ID, resp.Status)
	}
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return ParseMetrics(b.String())
}

// Work is what one replica's scanner did, from its /metrics (counters restart at
// zero with the process).
type Work struct {
	Claimed   int // batches it claimed
	Published int // MRs it opened (branch + commit + MR recorded)
	Merged    int // batches it saw merged and settled as succeeded
	Failed    int // batches it settled as failed
	LostRaces int // guarded writes another replica won (normal)
}

// Work scrapes the replica's counters.
func (r *Replica) Work(ctx context.Context) (Work, error) {
	m, err := r.Metrics(ctx)
	if err != nil {
		return Work{}, err
	}
	out := "batcherd_scanner_loop_outcomes_total"
	return Work{
		Claimed:   int(m.Sum(out, "loop", "claim", "outcome", "claimed")),
		Published: int(m.Sum(out, "loop", "publish", "outcome", "published")),
		Merged:    int(m.Sum("batcherd_batch_settles_total", "outcome", "succeeded")),
		Failed:    int(m.Sum("batcherd_batch_settles_total", "outcome", "failed")),
		LostRaces: int(m.Sum(out, "outcome", "lost_race")),
	}, nil
}

// replicaDSN is replica n's DSN when Options.ReplicaServerDSNs is set: its server,
// the cluster's database.
func (c *Cluster) replicaDSN(n int) string {
	cfg, err := mysql.ParseDSN(c.Opts.ReplicaServerDSNs[(n-1)%len(c.Opts.ReplicaServerDSNs)])
	if err != nil {
		return c.DSN // Start checked them
	}
	cfg.DBName = c.DBName
	return cfg.FormatDSN()
}
