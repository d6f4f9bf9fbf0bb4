package scanner

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/mr"
)

// metrics are one scanner's collectors. They are registered on the registerer given
// to New, never the global default: tests run several scanners in one process.
type metrics struct {
	runs          *prometheus.CounterVec   // loop
	outcomes      *prometheus.CounterVec   // loop, outcome
	errors        *prometheus.CounterVec   // loop, class
	duration      *prometheus.HistogramVec // loop
	batchDuration *prometheus.HistogramVec // outcome
	batchSize     prometheus.Histogram
	settles       *prometheus.CounterVec // outcome, code
	gitlab        *prometheus.CounterVec // op, class
	gitlabState   *prometheus.GaugeVec   // repo, state (access.go)
	drift         *prometheus.GaugeVec   // repo, kind (drift.go)
	mergeDrift    *prometheus.CounterVec // repo, kind (verify after merge)

	// Failure isolation.
	retries        *prometheus.CounterVec   // class
	bisectionDepth prometheus.Histogram     // depth of the halves a bisection creates
	culprits       *prometheus.CounterVec   // repo
	maxAttempts    *prometheus.CounterVec   // repo
	timeToMerge    *prometheus.HistogramVec // repo

	// GitLab states (gitlabstates.go).
	rebases      *prometheus.CounterVec // repo
	flakeRetries *prometheus.CounterVec // repo
	flakes       *prometheus.CounterVec // repo

	// Events (outbox.go); receiver = its index in BATCHERD_EVENTS_URL.
	eventsDelivered *prometheus.CounterVec // receiver
	eventFailures   *prometheus.CounterVec // receiver
	outboxDepth     *prometheus.GaugeVec   // receiver
	outboxOldest    *prometheus.GaugeVec   // receiver
	outboxUnrouted  prometheus.Gauge       // undelivered events of receivers this replica is not configured with
}

// newMetrics declares the scanner's metrics and registers them on reg. It is long
// because it is a list — one declaration per metric, names and help texts a reader
// compares with the README's metrics table — with no branch to split along.
func newMetrics(reg prometheus.Registerer, replica string) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	var cl prometheus.Labels
	if replica != "" {
		// Lets several scanners share one registry (distinct label values); one
		// process per replica in production makes it a harmless constant.
		cl = prometheus.Labels{"replica": replica}
	}
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batcherd_scanner_loop_runs_total", Help: "Passes of each scanner loop.", ConstLabels: cl,
		}, []string{"loop"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batcherd_scanner_loop_outcomes_total", Help: "Normal outcomes of scanner loops (claimed, slot_occupied, nothing_to_claim, preempted, published, lost_race, blocked, …).", ConstLabels: cl,
		}, []string{"loop", "outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batcherd_scanner_loop_errors_total", Help: "Errors of scanner loops by class (gitlab_transient, gitlab_permanent, gitlab_not_found, db, db_commit_unknown, timeout, panic, other).", ConstLabels: cl,
		}, []string{"loop", "class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "batcherd_scanner_loop_duration_seconds", Help: "Duration of one pass of a scanner loop.", ConstLabels: cl,
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"loop"}),
		batchDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "batcherd_batch_duration_seconds", Help: "Time from claim to settlement of a batch (DB clock), by outcome.", ConstLabels: cl,
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200},
		}, []string{"outcome"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "batcherd_batch_size", Help: "Operations claimed into one batch.", ConstLabels: cl,
			Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000},
		}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batcherd_batch_settles_total", Help: "Batches settled by this replica, by outcome and failure code.", ConstLabels: cl,
		}, []string{"outcome", "code"}),
		gitlab: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batcherd_scanner_gitlab_calls_total", Help: "GitLab calls made by the scanner, by operation and result class (ok, transient, permanent, not_found, canceled, other).", ConstLabels: cl,
		}, []string{"op", "class"}),
	}
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_batch_retries_total", Help: "Failed batches whose members were retried as one group, by failure class (infra, timeout, gitlab_unavailable, mr_missing, conflict, unknown).", ConstLabels: cl,
	}, []string{"class"})
	m.bisectionDepth = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "batcherd_bisection_depth", Help: "Depth of the halves each bisection of a failed batch creates (1 = halves of a first try).", ConstLabels: cl,
		Buckets: []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12},
	})
	m.culprits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_culprits_total", Help: "Operations failed as the culprit of a batch failure (alone in a failing batch), by repository.", ConstLabels: cl,
	}, []string{"repo"})
	m.maxAttempts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_max_attempts_total", Help: "Operations failed because they used BATCHERD_MAX_ATTEMPTS attempts, by repository.", ConstLabels: cl,
	}, []string{"repo"})
	m.timeToMerge = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "batcherd_time_to_merge_seconds", Help: "Time from an operation's creation to the settlement of the batch that merged it (DB clock), by repository; p50/p95 with histogram_quantile.", ConstLabels: cl,
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400},
	}, []string{"repo"})
	m.rebases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_mr_rebases_total", Help: "Rebases batcherd asked GitLab for (an MR of a fast-forward or semi-linear project behind its target), by repository.", ConstLabels: cl,
	}, []string{"repo"})
	m.flakeRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_pipeline_flake_retries_total", Help: "Failed pipelines of a batch of one member retried in place before the member could be named the culprit (BATCHERD_FLAKE_RETRIES), by repository.", ConstLabels: cl,
	}, []string{"repo"})
	m.flakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_pipeline_flakes_total", Help: "Pipelines that failed and then passed when retried in place (the batch merged): flaky pipelines, by repository.", ConstLabels: cl,
	}, []string{"repo"})
	m.eventsDelivered = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_events_delivered_total", Help: "Events a receiver answered 2xx, by receiver (its name=, else its URL's host; never the URL).", ConstLabels: cl,
	}, []string{"receiver"}))
	m.eventFailures = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_events_delivery_failures_total", Help: "Event deliveries that failed (not 2xx, refused, timed out) and were scheduled again, by receiver.", ConstLabels: cl,
	}, []string{"receiver"}))
	m.outboxDepth = register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "batcherd_events_outbox_depth", Help: "Events not yet delivered, by receiver (sampled from the database by the outbox loop).", ConstLabels: cl,
	}, []string{"receiver"}))
	m.outboxOldest = register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "batcherd_events_outbox_oldest_age_seconds", Help: "Age of the oldest undelivered event, by receiver (0 when none waits; database clock).", ConstLabels: cl,
	}, []string{"receiver"}))
	m.outboxUnrouted = register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "batcherd_events_outbox_unrouted", Help: "Undelivered events written for a receiver that is not in this replica's BATCHERD_EVENTS_URL (renamed or removed: nothing sends them).", ConstLabels: cl,
	}))
	m.rebases = register(reg, m.rebases)
	m.flakeRetries = register(reg, m.flakeRetries)
	m.flakes = register(reg, m.flakes)
	m.gitlabState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "batcherd_repository_gitlab_state", Help: "1 for the state GitLab last answered for a repository as this replica saw it (ok, unauthorized, forbidden, not_found, unreachable), 0 for the others.", ConstLabels: cl,
	}, []string{"repo", "state"})
	m.drift = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "batcherd_repository_drift_files", Help: "Files of the repository's bindings/ tree that differ from the active bindings at the last drift check, by kind (unexpected, missing, modified).", ConstLabels: cl,
	}, []string{"repo", "kind"})
	m.mergeDrift = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "batcherd_merge_verify_misses_total", Help: "Members of merged batches whose change the target branch did not hold when read after the merge (grant: file missing or another operation's; revoke: file still there), by repository and kind.", ConstLabels: cl,
	}, []string{"repo", "kind"})
	m.gitlabState = register(reg, m.gitlabState)
	m.drift = register(reg, m.drift)
	m.mergeDrift = register(reg, m.mergeDrift)
	m.runs = register(reg, m.runs)
	m.retries = register(reg, m.retries)
	m.bisectionDepth = register(reg, m.bisectionDepth)
	m.culprits = register(reg, m.culprits)
	m.maxAttempts = register(reg, m.maxAttempts)
	m.timeToMerge = register(reg, m.timeToMerge)
	m.outcomes = register(reg, m.outcomes)
	m.errors = register(reg, m.errors)
	m.duration = register(reg, m.duration)
	m.batchDuration = register(reg, m.batchDuration)
	m.batchSize = register(reg, m.batchSize)
	m.settles = register(reg, m.settles)
	m.gitlab = register(reg, m.gitlab)
	return m
}

// register registers c, reusing an identical collector already there (two scanners with
// the same replica id on one registry share their series instead of panicking).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if ex, ok := are.ExistingCollector.(C); ok {
				return ex
			}
		}
		// A conflicting collector under our name is a programming error in the caller's
		// registry; metrics must never stop the scanner, so keep ours unregistered.
	}
	return c
}

// instrumented wraps the GitLab layer to count every call by op and result class.
type instrumented struct {
	gl     GitLab
	m      *metrics
	access *access
}

func instrument(gl GitLab, m *metrics, a *access) GitLab {
	return &instrumented{gl: gl, m: m, access: a}
}

// count counts one call and tells the access tracker what GitLab answered for project.
func (g *instrumented) count(op, project string, err error) {
	g.access.observe(project, op, err)
	class := "ok"
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled):
		class = "canceled"
	default:
		if c := mr.ClassOf(err); c != mr.ClassNone {
			class = c.String()
		} else {
			class = "other"
		}
	}
	g.m.gitlab.WithLabelValues(op, class).Inc()
}

func (g *instrumented) DeleteBranch(ctx context.Context, project, branch string) error {
	err := g.gl.DeleteBranch(ctx, project, branch)
	g.count("delete_branch", project, err)
	return err
}

func (g *instrumented) CommitFiles(ctx context.Context, project, branch, from string, batch mr.BatchRef, message string, files []mr.FileAction) (mr.Commit, error) {
	c, err := g.gl.CommitFiles(ctx, project, branch, from, batch, message, files)
	g.count("commit_files", project, err)
	return c, err
}

func (g *instrumented) FindMR(ctx context.Context, project, sourceBranch string, batch mr.BatchRef) (mr.MergeRequest, bool, error) {
	m, found, err := g.gl.FindMR(ctx, project, sourceBranch, batch)
	g.count("find_mr", project, err)
	return m, found, err
}

func (g *instrumented) EnsureMR(ctx context.Context, project string, spec mr.MRSpec) (mr.MergeRequest, error) {
	m, err := g.gl.EnsureMR(ctx, project, spec)
	g.count("ensure_mr", project, err)
	return m, err
}

func (g *instrumented) GetMR(ctx context.Context, project string, iid int64) (mr.MergeRequest, error) {
	m, err := g.gl.GetMR(ctx, project, iid)
	g.count("get_mr", project, err)
	return m, err
}

func (g *instrumented) SetAutoMerge(ctx context.Context, project string, iid int64, sha string) (mr.MergeRequest, error) {
	m, err := g.gl.SetAutoMerge(ctx, project, iid, sha)
	g.count("set_auto_merge", project, err)
	return m, err
}

func (g *instrumented) Merge(ctx context.Context, project string, iid int64, sha string) (mr.MergeRequest, error) {
	m, err := g.gl.Merge(ctx, project, iid, sha)
	g.count("merge", project, err)
	return m, err
}

func (g *instrumented) CloseMR(ctx context.Context, project string, iid int64) (mr.MergeRequest, error) {
	m, err := g.gl.CloseMR(ctx, project, iid)
	g.count("close_mr", project, err)
	return m, err
}

func (g *instrumented) ListOpenLabeled(ctx context.Context, project, label string) ([]mr.MergeRequest, error) {
	ms, err := g.gl.ListOpenLabeled(ctx, project, label)
	g.count("list_open_labeled", project, err)
	return ms, err
}

func (g *instrumented) IsBatchMR(ctx context.Context, project string, m mr.MergeRequest, batch mr.BatchRef) (bool, error) {
	ours, err := g.gl.IsBatchMR(ctx, project, m, batch)
	g.count("is_batch_mr", project, err)
	return ours, err
}

func (g *instrumented) ListBlobs(ctx context.Context, project, ref, dir string) ([]mr.Blob, error) {
	b, err := g.gl.ListBlobs(ctx, project, ref, dir)
	g.count("list_blobs", project, err)
	return b, err
}

func (g *instrumented) ReadFile(ctx context.Context, project, ref, filePath string) (string, bool, error) {
	c, found, err := g.gl.ReadFile(ctx, project, ref, filePath)
	g.count("read_file", project, err)
	return c, found, err
}
