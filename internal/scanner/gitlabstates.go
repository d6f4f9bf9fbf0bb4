package scanner

// GitLab states beyond opened/merged/closed (the README's GitLab states table):
//
//	state of the open MR                   what reconcile does                          gives up
//	rebase_in_progress                     waits                                        batch timeout
//	head moved, every MR commit carries    records the new sha (guarded), then re-arms  —
//	  this batch's trailer (a rebase)        with it; no attempt charged, no rebuild
//	need_rebase                            asks GitLab to rebase (PUT …/rebase), waits  batch timeout
//	need_rebase after "Rebase failed"      conflict: rebuilt on the new target, then    conflict policy
//	                                         bisected
//	preparing / unchecked / checking       waits; no conflict verdict; direct mode      batch timeout
//	                                         does not merge yet
//	pipeline created … running, scheduled, waits                                        batch timeout
//	  canceling, or none yet
//	pipeline canceled                      infra: retry the members once, then fail     InfraRetries
//	pipeline skipped / manual (not         ci_blocked: retry once, then fail            InfraRetries
//	  mergeable)
//	pipeline failed                        the failure_reason's class (domain); a lone  policy
//	                                         member's test/unknown failure is first
//	                                         retried in place (FlakeRetries)

import (
	"context"
	"log/slog"
	"strings"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
)

// gitlabStates is what the handling of these states calls beyond the publish and
// settle calls (*mr.Client has them all).
type gitlabStates interface {
	Rebase(ctx context.Context, project string, iid int64) error
	MRCommits(ctx context.Context, project string, iid int64) ([]mr.CommitInfo, error)
	RetryPipeline(ctx context.Context, project string, pipelineID int64) (string, error)
	PipelineRetries(ctx context.Context, project string, pipelineID int64) (int, error)
}

// rebaseFailed: GitLab's merge_error after a rebase it could not do (a conflict).
func rebaseFailed(m mr.MergeRequest) bool {
	return strings.HasPrefix(strings.ToLower(m.MergeError), "rebase failed")
}

// gitlabState handles what an open MR's GitLab state asks of batcherd before the
// failure policy looks at it. done: reconcile is over for this pass. It returns the
// batch as now stored (a recorded rebase bumps its version).
func (l *reconcileLoop) gitlabState(ctx context.Context, b domain.Batch, m mr.MergeRequest, log *slog.Logger) (domain.Batch, bool, error) {
	if m.RebaseInProgress {
		// Neither the head nor the pipeline is final until GitLab finishes.
		l.s.m.outcomes.WithLabelValues("reconcile", "rebase_running").Inc()
		return b, true, nil
	}
	if b.MRSHA != "" && m.SHA != "" && m.SHA != b.MRSHA {
		nb, rebased, err := l.recordRebase(ctx, b, m, log)
		if err != nil {
			return b, true, err
		}
		if rebased {
			b = nb
		}
	}
	if m.DetailedMergeStatus == "need_rebase" && m.SHA == b.MRSHA && !rebaseFailed(m) {
		// Fast-forward and semi-linear projects: the target moved. Rebasing is not a
		// conflict — the members' changes are still what they were — so the batch is
		// neither failed nor rebuilt, and no attempt is charged; once GitLab rebased the
		// branch, recordRebase takes the new head and the merge is armed with it.
		if err := l.s.gl.Rebase(ctx, b.Repo, m.IID); err != nil {
			return b, true, err
		}
		l.s.m.rebases.WithLabelValues(b.Repo).Inc()
		l.s.m.outcomes.WithLabelValues("reconcile", "rebase_requested").Inc()
		log.Info("merge request needs a rebase onto its target; asked GitLab for it", "sha", short(m.SHA))
		return b, true, nil
	}
	return b, false, nil
}

// recordRebase: the MR's head is not the sha on record. If every commit the MR brings
// carries this installation's and this batch's trailers, the branch holds only batcherd's commits replayed onto
// a newer target (our rebase, or a human pressing Rebase): the new head is recorded
// with a guarded write before anything is armed with it, as publish records the first
// (fencing). Anything else — a human's commit — is not ours, and blockReason reports
// head_moved.
func (l *reconcileLoop) recordRebase(ctx context.Context, b domain.Batch, m mr.MergeRequest, log *slog.Logger) (domain.Batch, bool, error) {
	commits, err := l.s.gl.MRCommits(ctx, b.Repo, m.IID)
	if err != nil {
		return b, false, err
	}
	if len(commits) == 0 || commits[0].ID != m.SHA {
		return b, false, nil
	}
	owner := mr.OwnerOf(b.SourceBranch, batchRef(b))
	for _, c := range commits {
		if !c.Carries(owner) {
			return b, false, nil
		}
	}
	nb, err := l.s.st.BatchRecordRebase(ctx, b.ID, b.Version, b.MRSHA, m.SHA)
	if err != nil {
		return b, false, err
	}
	l.s.m.outcomes.WithLabelValues("reconcile", "rebased").Inc()
	log.Info("merge request rebased onto its target; new head recorded", "from", short(b.MRSHA), "to", short(m.SHA))
	return nb, true, nil
}

// flakeRetry retries in place the failed pipeline of a batch of one member before the
// policy could name that member the culprit: a flaky test fails a random pipeline, and
// bisection would otherwise end on whoever is alone when it strikes. The retry count
// lives in GitLab (retried jobs), so any replica sees it. true: retried, wait.
func (l *reconcileLoop) flakeRetry(ctx context.Context, b domain.Batch, m mr.MergeRequest, class domain.FailureClass, log *slog.Logger) (bool, error) {
	if l.cfg.flakeRetries <= 0 || b.Size != 1 || m.PipelineID == 0 || m.PipelineStatus != "failed" ||
		(class != domain.ClassTest && class != domain.ClassUnknown) {
		return false, nil
	}
	n, err := l.s.gl.PipelineRetries(ctx, b.Repo, m.PipelineID)
	if err != nil {
		return false, err
	}
	if n >= l.cfg.flakeRetries {
		return false, nil
	}
	if _, err := l.s.gl.RetryPipeline(ctx, b.Repo, m.PipelineID); err != nil {
		return false, err
	}
	l.s.m.flakeRetries.WithLabelValues(b.Repo).Inc()
	l.s.m.outcomes.WithLabelValues("reconcile", "flake_retry").Inc()
	log.Info("lone member's pipeline failed; retrying it in place before naming a culprit",
		"pipeline", m.PipelineID, "class", class, "reason", m.FailureReason, "retry", n+1, "of", l.cfg.flakeRetries)
	return true, nil
}

// noteFlake counts a merged batch of one member whose pipeline passed only when
// retried: a flaky pipeline, per repository. Best effort (a metric).
func (l *reconcileLoop) noteFlake(ctx context.Context, b domain.Batch, m mr.MergeRequest, log *slog.Logger) {
	if l.cfg.flakeRetries <= 0 || b.Size != 1 || m.PipelineID == 0 {
		return
	}
	n, err := l.s.gl.PipelineRetries(ctx, b.Repo, m.PipelineID)
	if err != nil {
		log.Debug("could not read whether the pipeline was retried", "err", err)
		return
	}
	if n > 0 {
		l.s.m.flakes.WithLabelValues(b.Repo).Inc()
		log.Info("pipeline flaked: failed, then passed when retried", "pipeline", m.PipelineID, "retries", n)
	}
}

func (g *instrumented) Rebase(ctx context.Context, project string, iid int64) error {
	err := g.gl.Rebase(ctx, project, iid)
	g.count("rebase", project, err)
	return err
}

func (g *instrumented) MRCommits(ctx context.Context, project string, iid int64) ([]mr.CommitInfo, error) {
	cs, err := g.gl.MRCommits(ctx, project, iid)
	g.count("list_mr_commits", project, err)
	return cs, err
}

func (g *instrumented) RetryPipeline(ctx context.Context, project string, pipelineID int64) (string, error) {
	st, err := g.gl.RetryPipeline(ctx, project, pipelineID)
	g.count("retry_pipeline", project, err)
	return st, err
}

func (g *instrumented) PipelineRetries(ctx context.Context, project string, pipelineID int64) (int, error) {
	n, err := g.gl.PipelineRetries(ctx, project, pipelineID)
	g.count("pipeline_retries", project, err)
	return n, err
}
