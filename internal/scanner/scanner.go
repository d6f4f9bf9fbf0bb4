package scanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// GitLab is what the scanner needs from the GitLab layer; *mr.Client satisfies it.
// Declared here (not in mr) so the loops depend on the smallest surface they use.
type GitLab interface {
	DeleteBranch(ctx context.Context, project, branch string) error
	CommitFiles(ctx context.Context, project, branch, from string, batch mr.BatchRef, message string, files []mr.FileAction) (mr.Commit, error)
	FindMR(ctx context.Context, project, sourceBranch string, batch mr.BatchRef) (mr.MergeRequest, bool, error)
	EnsureMR(ctx context.Context, project string, spec mr.MRSpec) (mr.MergeRequest, error)
	GetMR(ctx context.Context, project string, iid int64) (mr.MergeRequest, error)
	SetAutoMerge(ctx context.Context, project string, iid int64, sha string) (mr.MergeRequest, error)
	Merge(ctx context.Context, project string, iid int64, sha string) (mr.MergeRequest, error)
	CloseMR(ctx context.Context, project string, iid int64) (mr.MergeRequest, error)
	ListOpenLabeled(ctx context.Context, project, label string) ([]mr.MergeRequest, error)
	IsBatchMR(ctx context.Context, project string, m mr.MergeRequest, batch mr.BatchRef) (bool, error)
	gitlabStates
	// Reads of the target branch (post-merge check, drift loop).
	ListBlobs(ctx context.Context, project, ref, dir string) ([]mr.Blob, error)
	ReadFile(ctx context.Context, project, ref, filePath string) (content string, found bool, err error)
}

var _ GitLab = (*mr.Client)(nil)

// MergeMode says who merges a batch's MR (BATCHERD_MERGE_MODE).
type MergeMode string

const (
	// MergeAuto arms "merge when pipeline succeeds", guarded by the committed sha.
	MergeAuto MergeMode = "auto"
	// MergeDirect: batcherd merges (sha-guarded) once reconcile sees the pipeline succeeded.
	MergeDirect MergeMode = "direct"
	// MergeManual: humans merge; batcherd only follows the MR.
	MergeManual MergeMode = "manual"
)

// ErrUnknownRepo is returned by RunRound for a repository that is not configured.
var ErrUnknownRepo = errors.New("repository is not configured")

// Config configures all loops. Zero values take the defaults in brackets.
type Config struct {
	Repos         []string  // GitLab project paths handled by the claim and orphan loops
	TargetBranch  string    // ["main"] branch batch MRs merge into
	ClaimSchedule string    // robfig/cron spec ["@every 30s"]
	MaxBatchSize  int       // [500] most operations claimed into one batch
	MergeMode     MergeMode // [auto]
	ReplicaID     string    // name of this replica in logs and metrics

	ReconcileInterval time.Duration // [10s] how often an active batch's MR is checked (its reservation lease)
	BatchTimeout      time.Duration // [30m] active batches older than this fail (DB clock)
	ShutdownTimeout   time.Duration // [20s] bound on finishing the current step after Run's ctx ends

	PublishInterval time.Duration // [5s] poll for batches to publish (Kick and claims wake it sooner)
	PublishLease    time.Duration // [30s] how long a publisher holds a batch; a crashed publish resumes after it (resuming early is safe: every step is idempotent)
	SettleLease     time.Duration // [1m] how long the timeout sweep / admin settle hold a batch
	TimeoutInterval time.Duration // [30s]
	ExpiryInterval  time.Duration // [1m]
	CleanupInterval time.Duration // [10m]
	OrphanInterval  time.Duration // [5m]
	// DriftInterval is how often each repository's bindings/ tree is compared with the
	// active bindings [10m]; negative turns the drift loop off.
	DriftInterval time.Duration
	// OrphanLookback bounds how far back the orphan sweep re-reads FAILED batches' MRs
	// for "merged wins" [24h].
	OrphanLookback   time.Duration
	WaitingRetention time.Duration // [24h] finished waiting rows older than this are deleted
	CleanupChunk     int           // [500] rows per cleanup statement (the store caps a chunk at 500)
	ScanLimit        int           // [200] candidates read per fetch
	Workers          int           // [4] batches one loop handles concurrently

	// Failure isolation (policy.go).
	OnFailure FailureMode // [isolate] isolate: classify a failed pipeline or conflict and retry/bisect/quarantine at once; block: keep the batch BLOCKED for an operator (the timeout then applies the policy)
	// InfraRetries: retries of the same members after an infrastructure failure, a
	// timeout, GitLab trouble or a missing MR [1]; negative means none.
	InfraRetries int
	// ConflictRetries: rebuilds on the new target head after a merge conflict (or a
	// pipeline failure without a readable reason) before bisecting [1]; negative means none.
	ConflictRetries int
	// NoBisect turns bisection off: a test failure fails every member (reason test).
	NoBisect bool
	// MaxAttempts bounds the charged attempts (first try and retries; bisection rounds
	// are free) of one operation [3]; then it fails with reason max_attempts.
	MaxAttempts int
	// FlakeRetries: in-place retries of the failed pipeline of a batch of one member
	// before it may be named the culprit [1]; negative means none.
	FlakeRetries int

	// RefusalBackoffBase and RefusalBackoffMax bound the wait between probes of a
	// repository GitLab refuses (401/403/404 for the project) [2s, 1m]: its work is held
	// meanwhile, and the first probe GitLab answers resumes it.
	RefusalBackoffBase time.Duration
	RefusalBackoffMax  time.Duration
	// Events (outbox.go). No EventReceivers: the outbox loop does not run.
	EventReceivers      []domain.EventReceiver // BATCHERD_EVENTS_URL, in its order (a row names its receiver by identity)
	EventSecret         string                 // HMAC-SHA256 key of X-Batcherd-Signature
	OutboxInterval      time.Duration          // [1s] poll for due events
	OutboxLease         time.Duration          // [3 × OutboxTimeout] how long one delivery attempt holds an event (must exceed OutboxTimeout)
	OutboxTimeout       time.Duration          // [10s] one POST
	OutboxBackoffBase   time.Duration          // [1s] first retry of a failed delivery
	OutboxBackoffMax    time.Duration          // [10m] cap of the retry delay; retries go on at the cap for ever
	OutboxRetention     time.Duration          // [1h] delivered events are kept this long, then purged
	OutboxPurgeInterval time.Duration          // [1m]

	StartJitter time.Duration // [5s] max random delay before a loop's first run
	BackoffBase time.Duration // [1s] first retry delay after a failed run
	BackoffMax  time.Duration // [1m] cap of the retry delay
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt := func(d *int, v int) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.TargetBranch == "" {
		c.TargetBranch = "main"
	}
	if c.ClaimSchedule == "" {
		c.ClaimSchedule = "@every 30s"
	}
	if c.MergeMode == "" {
		c.MergeMode = MergeAuto
	}
	defInt(&c.MaxBatchSize, 500)
	if c.OnFailure == "" {
		c.OnFailure = FailureIsolate
	}
	if c.InfraRetries == 0 {
		c.InfraRetries = 1
	}
	if c.ConflictRetries == 0 {
		c.ConflictRetries = 1
	}
	if c.FlakeRetries == 0 {
		c.FlakeRetries = 1
	}
	defInt(&c.MaxAttempts, 3)
	def(&c.ReconcileInterval, 10*time.Second)
	def(&c.BatchTimeout, 30*time.Minute)
	def(&c.ShutdownTimeout, 20*time.Second)
	def(&c.PublishInterval, 5*time.Second)
	def(&c.PublishLease, 30*time.Second)
	def(&c.SettleLease, time.Minute)
	def(&c.TimeoutInterval, 30*time.Second)
	def(&c.ExpiryInterval, time.Minute)
	def(&c.CleanupInterval, 10*time.Minute)
	def(&c.OrphanInterval, 5*time.Minute)
	if c.DriftInterval == 0 {
		c.DriftInterval = 10 * time.Minute
	}
	def(&c.OrphanLookback, 24*time.Hour)
	def(&c.WaitingRetention, 24*time.Hour)
	defInt(&c.CleanupChunk, 500)
	defInt(&c.ScanLimit, 200)
	defInt(&c.Workers, 4)
	def(&c.RefusalBackoffBase, 2*time.Second)
	def(&c.RefusalBackoffMax, time.Minute)
	def(&c.OutboxInterval, time.Second)
	def(&c.OutboxTimeout, 10*time.Second)
	def(&c.OutboxLease, 3*c.OutboxTimeout)
	def(&c.OutboxBackoffBase, time.Second)
	def(&c.OutboxBackoffMax, 10*time.Minute)
	def(&c.OutboxRetention, time.Hour)
	def(&c.OutboxPurgeInterval, time.Minute)
	def(&c.StartJitter, 5*time.Second)
	def(&c.BackoffBase, time.Second)
	def(&c.BackoffMax, time.Minute)
	return c
}

// Validate reports a configuration the loops cannot run with.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch c.MergeMode {
	case MergeAuto, MergeDirect, MergeManual:
	default:
		return fmt.Errorf("merge mode %q: want auto, direct or manual", c.MergeMode)
	}
	if _, err := cron.ParseStandard(c.ClaimSchedule); err != nil {
		return fmt.Errorf("claim schedule %q: %w", c.ClaimSchedule, err)
	}
	switch c.OnFailure {
	case FailureIsolate, FailureBlock:
	default:
		return fmt.Errorf("on failure %q: want isolate or block", c.OnFailure)
	}
	if len(c.EventReceivers) > 0 && c.EventSecret == "" {
		return errors.New("event receivers without a secret")
	}
	if c.OutboxLease <= c.OutboxTimeout {
		// A lease shorter than a POST would let a second replica send the same event
		// while the first one still waits for its answer.
		return fmt.Errorf("outbox lease %s must exceed the POST timeout %s", c.OutboxLease, c.OutboxTimeout)
	}
	return nil
}

// Scanner owns every loop of one replica.
type Scanner struct {
	cfg Config
	st  Store
	gl  GitLab // instrumented
	log *slog.Logger
	m   *metrics
	pol policy
	// access follows GitLab's answers per repository and holds the work of a
	// repository GitLab refuses (access.go).
	access *access

	claim     *claimLoop
	publish   *publishLoop
	reconcile *reconcileLoop
	timeout   *timeoutLoop
	expiry    *expiryLoop
	cleanup   *cleanupLoop
	orphans   *orphanLoop
	drift     *driftLoop
	outbox    *outboxLoop

	kickPublish   chan struct{}
	kickReconcile chan struct{}
	kickOutbox    chan struct{}

	// draining is closed when Run's context ends: loops stop taking new batches while
	// the step in hand finishes on the work context.
	draining  chan struct{}
	drainOnce sync.Once

	// testHook, when set (tests only), is called after each step boundary of claim,
	// publish and settle, so a test can abandon the work exactly there.
	testHook func(ctx context.Context, step string, batchID int64)
}

// New builds a scanner. reg receives the scanner's metrics; nil keeps them private
// (never the global default registry: tests run several scanners in one process).
func New(cfg Config, st Store, gl GitLab, log *slog.Logger, reg prometheus.Registerer) *Scanner {
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "scanner")
	if cfg.ReplicaID != "" {
		log = log.With("replica", cfg.ReplicaID)
	}
	m := newMetrics(reg, cfg.ReplicaID)
	acc := newAccess(st, log, m.gitlabState, cfg.RefusalBackoffBase, cfg.RefusalBackoffMax)
	s := &Scanner{
		cfg:           cfg,
		st:            st,
		gl:            instrument(gl, m, acc),
		access:        acc,
		log:           log,
		m:             m,
		kickPublish:   make(chan struct{}, 1),
		kickReconcile: make(chan struct{}, 1),
		kickOutbox:    make(chan struct{}, 1),
		draining:      make(chan struct{}),
		pol: policy{
			infraRetries:    max(cfg.InfraRetries, 0),
			conflictRetries: max(cfg.ConflictRetries, 0),
			bisect:          !cfg.NoBisect,
			maxAttempts:     cfg.MaxAttempts,
		},
	}
	s.claim = &claimLoop{s: s, cfg: claimConfig{repos: cfg.Repos, schedule: cfg.ClaimSchedule, maxBatch: cfg.MaxBatchSize}, log: log.With("loop", "claim")}
	s.publish = &publishLoop{s: s, cfg: publishConfig{interval: cfg.PublishInterval, lease: cfg.PublishLease, target: cfg.TargetBranch, mode: cfg.MergeMode, limit: cfg.ScanLimit, workers: cfg.Workers, timeout: cfg.BatchTimeout}, log: log.With("loop", "publish")}
	s.reconcile = &reconcileLoop{s: s, cfg: reconcileConfig{interval: cfg.ReconcileInterval, mode: cfg.MergeMode, onFailure: cfg.OnFailure, limit: cfg.ScanLimit, workers: cfg.Workers, flakeRetries: max(cfg.FlakeRetries, 0)}, log: log.With("loop", "reconcile")}
	s.timeout = &timeoutLoop{s: s, cfg: timeoutConfig{interval: cfg.TimeoutInterval, timeout: cfg.BatchTimeout, lease: cfg.SettleLease, limit: cfg.ScanLimit, workers: cfg.Workers}, log: log.With("loop", "timeout")}
	s.expiry = &expiryLoop{s: s, cfg: expiryConfig{interval: cfg.ExpiryInterval, limit: cfg.ScanLimit}, log: log.With("loop", "expiry")}
	s.cleanup = &cleanupLoop{s: s, cfg: cleanupConfig{interval: cfg.CleanupInterval, chunk: cfg.CleanupChunk, retention: cfg.WaitingRetention}, log: log.With("loop", "cleanup")}
	s.drift = &driftLoop{s: s, cfg: driftConfig{interval: cfg.DriftInterval, repos: cfg.Repos, target: cfg.TargetBranch}, log: log.With("loop", "drift")}
	s.orphans = &orphanLoop{s: s, cfg: orphanConfig{interval: cfg.OrphanInterval, repos: cfg.Repos, lookback: cfg.OrphanLookback, limit: cfg.ScanLimit}, log: log.With("loop", "orphans")}
	s.outbox = newOutboxLoop(s, outboxConfig{receivers: cfg.EventReceivers, secret: []byte(cfg.EventSecret), interval: cfg.OutboxInterval,
		lease: cfg.OutboxLease, timeout: cfg.OutboxTimeout, backoffBase: cfg.OutboxBackoffBase, backoffMax: cfg.OutboxBackoffMax,
		retention: cfg.OutboxRetention, purgeEvery: cfg.OutboxPurgeInterval, chunk: cfg.CleanupChunk, limit: cfg.ScanLimit,
		workers: max(cfg.Workers, 8)}, log.With("loop", "outbox"))
	return s
}

// ObserveGitLab tells the scanner what GitLab answered for repo outside its loops (the
// start-up preflight), so GET /v1/repos and the metric start from it.
func (s *Scanner) ObserveGitLab(repo string, err error) { s.access.observe(repo, "preflight", err) }

// KickOutbox makes the outbox loop look for due events now (after a change that wrote
// some). It never blocks.
func (s *Scanner) KickOutbox() { kick(s.kickOutbox) }

// Kick makes the publish and reconcile loops run now instead of at their next tick
// (claims and the GitLab webhook call it). It never blocks.
func (s *Scanner) Kick() {
	kick(s.kickPublish)
	kick(s.kickReconcile)
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Run starts every loop and blocks until ctx ends and the loops have stopped. On
// cancel the loops stop taking new work; the step in hand runs on a work context that
// is cancelled shortly before ShutdownTimeout, and an abandoned step is safe by construction
// (every step is resumable by any replica). Run returns nil after a graceful stop.
func (s *Scanner) Run(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	sched, _ := cron.ParseStandard(s.cfg.ClaimSchedule)
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()

	loops := []loopSpec{
		{name: "claim", run: s.claim.runOnce, next: func(now time.Time) time.Duration { return sched.Next(now).Sub(now) }},
		{name: "publish", run: s.publish.runOnce, every: s.cfg.PublishInterval, kick: s.kickPublish},
		{name: "reconcile", run: s.reconcile.runOnce, every: s.cfg.ReconcileInterval, kick: s.kickReconcile},
		{name: "timeout", run: s.timeout.runOnce, every: s.cfg.TimeoutInterval},
		{name: "expiry", run: s.expiry.runOnce, every: s.cfg.ExpiryInterval},
		{name: "cleanup", run: s.cleanup.runOnce, every: s.cfg.CleanupInterval},
		{name: "orphans", run: s.orphans.runOnce, every: s.cfg.OrphanInterval},
	}
	if s.cfg.DriftInterval > 0 {
		// Each pass takes only the repositories whose check is due (drift_next_at), so
		// polling more often than the interval costs one small read per repository.
		loops = append(loops, loopSpec{name: "drift", run: s.drift.runOnce, every: min(s.cfg.DriftInterval, time.Minute)})
	}
	if len(s.cfg.EventReceivers) > 0 {
		loops = append(loops, loopSpec{name: "outbox", run: s.outbox.runOnce, every: s.cfg.OutboxInterval, kick: s.kickOutbox})
		s.log.Info("event receivers", "receivers", describeReceivers(s.cfg.EventReceivers))
	}
	s.log.Info("scanner starting", "repos", s.cfg.Repos, "merge_mode", s.cfg.MergeMode,
		"claim_schedule", s.cfg.ClaimSchedule, "batch_timeout", s.cfg.BatchTimeout,
		"on_failure", s.cfg.OnFailure, "infra_retries", s.pol.infraRetries,
		"conflict_retries", s.pol.conflictRetries, "bisect", s.pol.bisect, "max_attempts", s.pol.maxAttempts)
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Go(func() { s.runLoop(ctx, work, l) })
	}
	<-ctx.Done()
	s.drainOnce.Do(func() { close(s.draining) })
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	// Abandon a little before ShutdownTimeout: the process (app.Run) gives up waiting
	// at ShutdownTimeout, and a step cancelled by us rolls its transaction back and
	// closes its HTTP call cleanly, which beats being cut off by the exit.
	grace := s.cfg.ShutdownTimeout - min(s.cfg.ShutdownTimeout/10, 2*time.Second)
	select {
	case <-done:
		s.log.Info("scanner stopped")
		return nil
	case <-time.After(grace):
	}
	// Abandon the steps still running: each GitLab and store call honours the work
	// context, and whatever was half done is resumed by the next pass of any replica.
	cancelWork()
	select {
	case <-done:
		s.log.Warn("scanner stopped after abandoning in-flight steps", "shutdown_timeout", s.cfg.ShutdownTimeout)
		return nil
	case <-time.After(5 * time.Second):
		return errors.New("scanner: loops did not stop within the shutdown timeout")
	}
}

// stopping reports whether Run is shutting down: loops finish the batch in hand but
// take no new one.
func (s *Scanner) stopping() bool {
	select {
	case <-s.draining:
		return true
	default:
		return false
	}
}

// step reports a step boundary to the test hook.
func (s *Scanner) step(ctx context.Context, name string, batchID int64) {
	if s.testHook != nil {
		s.testHook(ctx, name, batchID)
	}
}

// forEach runs fn over items with at most workers at a time, stopping early (without
// starting new items) when ctx ends or Run is draining. It returns how many items
// were started and how many of them failed; an item that panicked failed.
func forEach[T any](ctx context.Context, s *Scanner, workers int, items []T, fn func(context.Context, T) error) (started, failed int) {
	if workers < 1 {
		workers = 1
	}
	sem := make(chan struct{}, workers)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, it := range items {
		if ctx.Err() != nil || s.stopping() {
			break
		}
		sem <- struct{}{}
		started++
		wg.Go(func() {
			defer func() { <-sem }()
			if err := runItem(ctx, s, it, fn); err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return started, failed
}

// runItem runs fn on one item of a pass and turns a panic into the item's failure. fn
// runs on a worker goroutine, where runPass's recover cannot reach: a panic left to
// unwind there would end the process, so one bad batch would take the whole replica
// down (and, once the batch's reservation lapsed, the next replica to take it), and
// the pass's other items with it.
func runItem[T any](ctx context.Context, s *Scanner, it T, fn func(context.Context, T) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			loop := loopOf(ctx)
			log := s.log.With("loop", loop)
			if b, ok := any(it).(domain.Batch); ok {
				log = batchLog(log, b)
			} else {
				log = log.With("item", it)
			}
			log.Error("loop item panicked", "panic", r, "stack", string(debug.Stack()))
			s.m.errors.WithLabelValues(loop, "panic").Inc()
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn(ctx, it)
}

// isLost reports a lost race: normal between replicas, debug only.
func isLost(err error) bool { return errors.Is(err, store.ErrLostRace) }

// isCanceled reports that the work was cancelled (shutdown or test crash), not failed.
func isCanceled(err error) bool { return errors.Is(err, context.Canceled) }

func batchLog(l *slog.Logger, b domain.Batch) *slog.Logger {
	return l.With("repo", b.Repo, "batch_id", b.ID)
}
