package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/batcherd/batcherd/internal/harness"
)

// Config is one chaos run.
type Config struct {
	Bin      string        // prebuilt binaries ("" builds them)
	Duration time.Duration // chaos phase
	Drain    time.Duration // bound on the drain after it
	Replicas int
	Workers  int     // concurrent submitters
	Rate     float64 // applications per second over all submitters
	Seed     int64

	KillEvery           time.Duration // mean time between replica kills
	FreezeMax           time.Duration // longest SIGSTOP of a replica (0: never)
	ConnKillEvery       time.Duration // mean time between MySQL connection kills
	FaultEvery          time.Duration // mean time between GitLab faults
	HumanEvery          time.Duration // mean time between human MR actions
	OperatorEvery       time.Duration // mean time between operator retries of failed operations
	PipelineFailureRate float64
	BatchTimeout        time.Duration
	NoDBRestart         bool
	DBRestarts          int  // how many times MariaDB is restarted (default 1, spread evenly)
	DBCrash             bool // SIGKILL instead of SIGTERM (crash recovery)

	// HA runs on a three-node Galera cluster instead of one mariadbd (ha.go):
	// "single" (every replica through HAProxy, one writer) or "multi" (each replica
	// writes through another node). "" is the usual chaos run.
	HA string
	// HASyncWait, when 0 or more, is the wsrep_sync_wait of batcherd's sessions in an
	// HA run (-1: the server's default, 0).
	HASyncWait int
	// HAPartition adds, after the kills, the writer isolated from the other two nodes
	// (frozen): the node leaves the primary component and the store is asked there.
	HAPartition bool

	Keep    bool // keep logs and the private MariaDB directory
	Verbose bool
	// Logf, when set, receives every event line instead of Out (tests: t.Logf).
	Logf func(format string, args ...any)
}

func defaultConfig() Config {
	return Config{
		Duration:            3 * time.Minute,
		Drain:               3 * time.Minute,
		Replicas:            4,
		Workers:             6,
		Rate:                8,
		KillEvery:           5 * time.Second,
		FreezeMax:           35 * time.Second, // beyond the publish lease (30s)
		ConnKillEvery:       1500 * time.Millisecond,
		FaultEvery:          1500 * time.Millisecond,
		HumanEvery:          6 * time.Second,
		OperatorEvery:       5 * time.Second,
		PipelineFailureRate: 0.08,
		// Above the publish lease (30s): a publish that crashed or failed is resumed
		// by another replica before its batch times out.
		BatchTimeout: 45 * time.Second,
		HASyncWait:   -1,
	}
}

func (c Config) validate() error {
	switch {
	case c.Replicas < 3 || c.Replicas > 5:
		return fmt.Errorf("-replicas must be 3 to 5, got %d", c.Replicas)
	case c.Duration < 10*time.Second:
		return fmt.Errorf("-duration must be at least 10s, got %s", c.Duration)
	case c.Workers < 1 || c.Rate <= 0:
		return errors.New("-workers must be at least 1 and -rate positive")
	case c.BatchTimeout < 5*time.Second:
		return fmt.Errorf("-batch-timeout must be at least 5s, got %s", c.BatchTimeout)
	case c.HA != "" && c.HA != "single" && c.HA != "multi":
		return fmt.Errorf("-ha must be single or multi, got %q", c.HA)
	}
	return nil
}

// The three repositories and their relations. Targets are namespaced per repository:
// a binding (subject, target) is unique across repositories. Names carry '/', ':',
// spaces and non-ASCII letters so the file paths exercise url.PathEscape.
var repos = []string{"chaos/alpha", "chaos/beta", "chaos/gamma"}

func relationsOf(repo string) (subjects, targets []string) {
	short := strings.TrimPrefix(repo, "chaos/")
	targets = []string{short + "/db-orders", short + "/kafka events", short + ":vault", short + "/s3-backups", short + "/k8s-prod"}
	subjects = []string{"alice", "bob", "team/ops", "svc:payments", "zoë", "carol dev", "dave", "erin", "frank", "grace"}
	return subjects, targets
}

// rnd is a seeded random source shared by every goroutine (under a lock).
type rnd struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newRnd(seed int64) *rnd { return &rnd{r: rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))} }

func (r *rnd) Float64() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.Float64()
}

func (r *rnd) IntN(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.IntN(n)
}

// Dur is uniform in [lo, hi).
func (r *rnd) Dur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return lo + time.Duration(r.r.Int64N(int64(hi-lo)))
}

// Around is mean ±50%.
func (r *rnd) Around(mean time.Duration) time.Duration { return r.Dur(mean/2, mean+mean/2) }

// run is the state of one chaos run.
type run struct {
	// ctx is the run's context: it ends on an interrupt only. Work that must outlive
	// the chaos phase (a replica restart, a call in flight) runs on it.
	ctx   context.Context
	cfg   Config
	out   io.Writer
	rnd   *rnd
	start time.Time

	db   dbServer
	gal  *harness.Galera // HA runs only (db is the same cluster)
	ha   *haRun          // HA runs only
	c    *harness.Cluster
	api  *harness.Client
	sql  *sql.DB // root over the private server's socket: never killed by the chaos
	logs string

	mu    sync.Mutex // guards everything below and the output
	stats stats
	load  *load
	viol  []string
	// replica restarts in flight (a replica is not killed again before it is back)
	busy map[string]bool
	// results of the end checks, for the summary
	audit                 harness.AuditReport
	verifyOut             string
	verifyCode            int
	files, activeBindings int
}

// dbServer is the database a run uses: one private mariadbd, or a Galera cluster
// behind HAProxy (ha.go).
type dbServer interface {
	Running() bool
	ServerDSN() string // batcherd's account, without a database
	AdminDSN() string  // the run's own account
	Stop(grace time.Duration) error
	Kill() error
	Start(ctx context.Context) error
	Close() error
}

// dbUser is batcherd's account name on the server.
func (r *run) dbUser() string {
	cfg, err := mysql.ParseDSN(r.db.ServerDSN())
	if err != nil {
		return ""
	}
	return cfg.User
}

// stats counts what the chaos did.
type stats struct {
	ReplicaKills, ReplicaTerms, ReplicaRestartFailures int
	ReplicaFreezes                                     int
	LiveVerifies, LiveVerifyErrors                     int
	ConnKills, QueryKills                              int
	DBRestarts                                         int
	DBDowntime                                         time.Duration
	Faults                                             map[string]int
	FaultCalls                                         int // API calls the faults applied to
	PipelinesFailedByHand, PipelinesRetried            int
	HumanMerges, HumanCloses                           int
	OrphanMerges                                       int
	OperatorRetries                                    int
	ChaosTime, DrainTime, Total                        time.Duration
}

func (r *run) logf(format string, args ...any) {
	if r.cfg.Logf != nil {
		r.cfg.Logf(format, args...)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	fmt.Fprintf(r.out, "%s %7.1fs  "+format+"\n", append([]any{now.UTC().Format("15:04:05.000"), now.Sub(r.start).Seconds()}, args...)...)
}

// event prints a chaos event when verbose.
func (r *run) event(format string, args ...any) {
	if r.cfg.Verbose {
		r.logf(format, args...)
	}
}

// violation records a broken promise.
func (r *run) violation(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.viol = append(r.viol, msg)
	r.mu.Unlock()
	r.logf("VIOLATION: %s", msg)
}

func (r *run) count(f func(s *stats)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.stats)
}

// Summary is what a run reports.
type Summary struct {
	Text       string
	Violations []string
}

// Run performs one chaos run and prints its progress and summary to out. The error
// is a failure to run (setup); broken promises are Summary.Violations.
func Run(ctx context.Context, cfg Config, out io.Writer) (sum *Summary, err error) {
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	r := &run{ctx: ctx, cfg: cfg, out: out, rnd: newRnd(cfg.Seed), start: time.Now(), busy: map[string]bool{}}
	r.stats.Faults = map[string]int{}
	r.logf("batcherd chaos: %d replicas, MariaDB (private), gitlab-sim, %d repositories; chaos %s, drain bound %s, seed %d",
		cfg.Replicas, len(repos), cfg.Duration, cfg.Drain, cfg.Seed)

	// What killed runs left behind.
	if dirs, _ := harness.CleanStaleMariaDBDirs("", 10*time.Minute); len(dirs) > 0 {
		r.logf("removed %d private MariaDB director(ies) left by killed runs", len(dirs))
	}
	if r.logs, err = os.MkdirTemp("", "batcherd-chaos-"); err != nil {
		return nil, err
	}
	defer func() {
		failed := err != nil || (sum != nil && len(sum.Violations) > 0)
		if cfg.Keep || (failed && ctx.Err() == nil) {
			fmt.Fprintf(out, "process logs kept in %s\n", r.logs)
		} else {
			os.RemoveAll(r.logs)
		}
	}()

	var hlog func(string, ...any)
	if cfg.Verbose {
		hlog = func(f string, a ...any) { r.logf("harness: "+f, a...) }
	}
	if cfg.HA != "" {
		if err := r.startGalera(ctx, hlog); err != nil {
			return nil, err
		}
		defer func() {
			if cerr := r.gal.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("stopping the Galera cluster: %w", cerr)
			}
			if cfg.Keep {
				fmt.Fprintf(out, "Galera cluster directory kept in %s\n", r.gal.Dir)
			}
		}()
	} else {
		mdb, err := harness.StartMariaDB(ctx, harness.MariaDBOptions{Logf: hlog})
		if err != nil {
			return nil, fmt.Errorf("private MariaDB: %w", err)
		}
		r.db = mdb
		defer func() {
			if cfg.Keep {
				_ = mdb.Stop(30 * time.Second)
				fmt.Fprintf(out, "private MariaDB directory kept in %s\n", mdb.Dir)
				return
			}
			if cerr := mdb.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("stopping the private MariaDB: %w", cerr)
			}
		}()
		r.logf("private mariadbd on 127.0.0.1:%d, data in %s", mdb.Port, mdb.DataDir)
	}

	var bins *harness.Binaries
	if cfg.Bin != "" {
		if bins, err = harness.Prebuilt(cfg.Bin); err != nil {
			return nil, err
		}
	} else {
		r.logf("building batcherd and gitlab-sim ...")
		if bins, err = harness.Build(ctx, filepath.Join(r.logs, "bin"), false); err != nil {
			return nil, err
		}
	}
	r.c, err = harness.Start(ctx, harness.Options{
		Replicas:          cfg.Replicas,
		Repos:             repos,
		ServerDSN:         r.db.ServerDSN(),
		DBPrefix:          "chaos",
		KeepDatabase:      true, // the whole private server goes at the end
		Binaries:          bins,
		LogDir:            r.logs,
		KeepLogs:          true,
		PipelineDuration:  time.Second,
		SimSeed:           uint64(cfg.Seed),
		ClaimSchedule:     "@every 1s",
		ReconcileInterval: time.Second,
		MergeMode:         "auto",
		Env: map[string]string{
			"BATCHERD_BATCH_TIMEOUT":    cfg.BatchTimeout.String(),
			"BATCHERD_GITLAB_TIMEOUT":   "5s",
			"BATCHERD_MAX_BATCH_SIZE":   "40",
			"BATCHERD_SHUTDOWN_TIMEOUT": "5s",
		},
		StopGrace:         10 * time.Second,
		Logf:              hlog,
		ReplicaServerDSNs: r.replicaServerDSNs(),
	})
	if err != nil {
		return nil, fmt.Errorf("starting the cluster: %w", err)
	}
	defer func() {
		if cerr := r.c.Close(); cerr != nil {
			r.logf("cluster close: %v", cerr)
		}
	}()
	r.api = r.c.Client()

	acfg, _ := mysql.ParseDSN(r.db.AdminDSN())
	acfg.DBName = r.c.DBName
	acfg.ParseTime = true
	acfg.Loc = time.UTC
	// The driver's own log lines (a connection broken by the database restart) are
	// expected here and would only clutter the output.
	acfg.Logger = &mysql.NopLogger{}
	conn, err := mysql.NewConnector(acfg)
	if err != nil {
		return nil, err
	}
	r.sql = sql.OpenDB(conn)
	defer r.sql.Close()
	r.sql.SetMaxOpenConns(4)
	if err := r.grantLiveVerify(ctx); err != nil {
		return nil, err
	}
	r.logf("database %s, gitlab-sim %s, replicas %s", r.c.DBName, r.c.Sim.URL, replicaList(r.c))
	r.start = time.Now()

	// The chaos phase.
	r.load = newLoad(r)
	chaosCtx, stopChaos := context.WithTimeout(ctx, cfg.Duration)
	if cfg.HA != "" {
		// An HA run's chaos lasts until its kills are done, and at least Duration.
		stopChaos()
		chaosCtx, stopChaos = r.haChaosContext(ctx)
	}
	defer stopChaos()
	restarts := &sync.WaitGroup{}
	// Every return waits for the restarts and freezes in flight (they end at once on
	// an interrupt), so none starts a replica after the cluster is closed.
	defer restarts.Wait()
	var wg sync.WaitGroup
	if err := r.c.Sim.SetPipelines(ctx, time.Second, cfg.PipelineFailureRate, false); err != nil {
		return nil, err
	}
	wg.Go(func() { r.load.run(chaosCtx) })
	if cfg.HA != "" {
		// The database fails over: nothing else is disturbed, so what clients see is
		// the failover's doing (ha.go).
		r.haDisrupt(chaosCtx, &wg)
	} else {
		wg.Go(func() { r.killReplicas(chaosCtx, restarts) })
		wg.Go(func() { r.killConnections(chaosCtx) })
		if !cfg.NoDBRestart {
			wg.Go(func() { r.restartDB(chaosCtx) })
		}
		wg.Go(func() { r.injectFaults(chaosCtx) })
		wg.Go(func() { r.human(chaosCtx) })
		wg.Go(func() { r.sniper(chaosCtx) })
	}
	wg.Go(func() { r.operator(chaosCtx) })
	wg.Go(func() { r.monitor(chaosCtx) })
	wg.Go(func() { r.liveVerify(chaosCtx) })
	wg.Go(func() { r.progress(chaosCtx) })
	wg.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	chaosTime := time.Since(r.start)
	r.count(func(s *stats) { s.ChaosTime = chaosTime })
	r.logf("chaos over after %s: clearing faults, restarting what is down, draining", chaosTime.Round(100*time.Millisecond))

	drainStart := time.Now()
	if err := r.recover(ctx, restarts); err != nil {
		return nil, err
	}
	r.drain(ctx)
	drainTime := time.Since(drainStart)
	r.count(func(s *stats) { s.DrainTime = drainTime })
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.check(ctx)
	totalTime := time.Since(r.start)
	r.count(func(s *stats) { s.Total = totalTime })
	text := r.summary(ctx)
	fmt.Fprint(out, text)
	r.mu.Lock()
	viol := append([]string(nil), r.viol...)
	r.mu.Unlock()
	if len(viol) > 0 {
		fmt.Fprintf(out, "\nlast log lines of each process:\n%s", r.c.LogTail(8))
	}
	return &Summary{Text: text, Violations: viol}, nil
}

func replicaList(c *harness.Cluster) string {
	var s []string
	for _, r := range c.Replicas {
		s = append(s, fmt.Sprintf("%s@%s", r.ID, r.Addr))
	}
	return strings.Join(s, " ")
}

// recover puts everything back: faults cleared, pipelines healthy, MariaDB up, every
// replica running.
func (r *run) recover(ctx context.Context, restarts *sync.WaitGroup) error {
	if r.gal != nil {
		if err := r.haRecover(ctx); err != nil {
			return err
		}
	} else if !r.db.Running() {
		if err := r.db.Start(ctx); err != nil {
			return fmt.Errorf("starting MariaDB again: %w", err)
		}
	}
	// Read how often the faults applied before clearing them.
	if st, err := r.c.Sim.State(ctx); err == nil {
		n := 0
		for _, f := range st.Faults {
			n += f.Applied
		}
		r.count(func(s *stats) { s.FaultCalls = n })
	}
	if err := retry(ctx, 30*time.Second, func() error { return r.c.Sim.ClearFaults(ctx) }); err != nil {
		return fmt.Errorf("clearing faults: %w", err)
	}
	if err := retry(ctx, 30*time.Second, func() error { return r.c.Sim.SetPipelines(ctx, time.Second, 0, false) }); err != nil {
		return fmt.Errorf("healing pipelines: %w", err)
	}
	restarts.Wait() // restarts in flight finish (they retry until the replica is up)
	for _, rep := range r.c.Replicas {
		if rep.Running() {
			continue
		}
		if err := retry(ctx, 90*time.Second, func() error { return rep.Start(ctx) }); err != nil {
			return fmt.Errorf("restarting %s: %w", rep.ID, err)
		}
	}
	return nil
}

// retry calls f until it succeeds or d passes.
func retry(ctx context.Context, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// sleep waits d or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
