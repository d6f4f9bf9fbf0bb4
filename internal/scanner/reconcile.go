package scanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
)

// Block codes recorded on a BLOCKED batch.
const ()

// reconcileConfig is the reconcile loop's slice of Config.
type reconcileConfig struct {
	interval  time.Duration // also the reservation lease: the next check of a batch
	mode      MergeMode
	onFailure FailureMode
	limit     int
	workers   int
	// flakeRetries: in-place retries of a lone member's failed pipeline (gitlabstates.go).
	flakeRetries int
}

// reconcileLoop follows the MR of every active batch that is due for a check, taken
// with fetch → tryLock so the replicas do not all poll the same MR. The MR is the
// truth; the database follows it.
type reconcileLoop struct {
	s   *Scanner
	cfg reconcileConfig
	log *slog.Logger
}

func (l *reconcileLoop) runOnce(ctx context.Context) error {
	due, err := l.s.st.BatchesDue(ctx, l.cfg.limit)
	if err != nil {
		return err
	}
	// Batches without an MR belong to publish.
	due = slices.DeleteFunc(due, func(b domain.Batch) bool { return b.MRIID == nil })
	started, failed := forEach(ctx, l.s, l.cfg.workers, due, func(ctx context.Context, b domain.Batch) error {
		log := batchLog(l.log, b).With("mr_iid", *b.MRIID)
		if l.s.access.held(b.Repo) {
			// GitLab refuses the repository: held, probed again after the backoff.
			l.s.m.outcomes.WithLabelValues("reconcile", "held_gitlab_refused").Inc()
			return nil
		}
		// The lease is the check interval: whatever we find, the next look at this
		// batch is one interval from now (DB clock), by whichever replica.
		rb, err := l.s.st.BatchReserve(ctx, b.ID, b.Version, l.cfg.interval)
		if err != nil {
			return l.s.itemErr("reconcile", log, "reserve failed", err)
		}
		if rb.MRIID == nil {
			return nil // cannot happen: an MR is never unrecorded
		}
		return l.s.itemErr("reconcile", log, "reconcile failed", l.reconcile(ctx, rb, log))
	})
	return passResult(started, failed)
}

// reconcile applies what the MR says to the reserved batch b.
// reconcile applies what the MR says to the reserved batch b, step by step: a merged or
// closed MR settles the batch (settleByState); GitLab's own state of an open MR
// (gitlabState); a reason the MR cannot merge isolates or blocks (onBlocked); a batch
// whose reason went away is unblocked; then the merge is armed or made (advanceMerge).
func (l *reconcileLoop) reconcile(ctx context.Context, b domain.Batch, log *slog.Logger) error {
	m, err := l.s.gl.GetMR(ctx, b.Repo, *b.MRIID)
	if mr.AccessOf(err) == mr.AccessNotFound {
		// GitLab does not show the project at all (access lost, project moved): that
		// is the repository's state, not the MR's; the work is held (access.go).
		return err
	}
	if mr.ClassOf(err) == mr.ClassNotFound {
		// The MR was deleted (or the project moved): nothing can merge it any more.
		_, err = l.s.settleFailure(ctx, b, failure{domain.ClassMRMissing, fmt.Sprintf("merge request !%d no longer exists", *b.MRIID)}, log)
		return err
	}
	if err != nil {
		return err
	}
	if done, err := l.settleByState(ctx, b, m, log); err != nil || done {
		return err
	}
	b, done, err := l.gitlabState(ctx, b, m, log)
	if err != nil || done {
		return err
	}
	if code, msg := blockReason(b, m); code != "" {
		return l.onBlocked(ctx, b, m, code, msg, log)
	}
	if b.Status == domain.BatchBlocked {
		// The reason went away (pipeline retried, conflict resolved): back to RUNNING,
		// and go on to re-arm the merge.
		nb, err := l.s.st.BatchUnblock(ctx, b.ID, b.Version)
		if err != nil {
			return err
		}
		l.s.m.outcomes.WithLabelValues("reconcile", "unblocked").Inc()
		log.Info("batch unblocked", "pipeline", m.PipelineStatus)
		b = nb
	}
	return l.advanceMerge(ctx, b, m, log)
}

// settleByState settles the batch of a merged or closed MR; done is false for an open
// one (and for a locked one, which GitLab is merging: look again next interval, done).
func (l *reconcileLoop) settleByState(ctx context.Context, b domain.Batch, m mr.MergeRequest, log *slog.Logger) (bool, error) {
	switch m.State {
	case mr.StateMerged:
		l.noteFlake(ctx, b, m, log)
		_, err := l.s.settleSucceeded(ctx, b, log)
		return true, err
	case mr.StateClosed:
		f := failure{domain.ClassClosedByUser, fmt.Sprintf("merge request !%d was closed without merging, not by batcherd", m.IID)}
		if b.FailClass != "" {
			// batcherd recorded a failure class before closing it: a settle that did not
			// finish. Resume it with that class.
			f = failure{b.FailClass, fmt.Sprintf("merge request !%d closed by batcherd settling the batch as %s (settlement resumed)", m.IID, b.FailClass)}
		}
		_, err := l.s.settleFailure(ctx, b, f, log)
		return true, err
	case mr.StateOpened:
		return false, nil
	}
	return true, nil // locked: GitLab is merging it; look again next interval
}

// onBlocked acts on an open MR that cannot merge for the reason code: in isolate mode
// a reason with a failure class settles the batch failed through the policy (after a
// flaky pipeline's retry); anything else keeps or makes the batch BLOCKED.
func (l *reconcileLoop) onBlocked(ctx context.Context, b domain.Batch, m mr.MergeRequest, code, msg string, log *slog.Logger) error {
	if code == domain.BlockPipelineFailed && m.FailureReasonErr != nil {
		// Why the pipeline failed decides what isolation does (retry the group for
		// an infrastructure failure, bisect for a test failure). A reason GitLab did
		// not give us is not "unknown": read as unknown, a runner failure was
		// retried, then bisected, and could end with a member named the culprit.
		// Look again next interval; the batch timeout bounds the wait.
		return fmt.Errorf("reading why pipeline %d failed: %w", m.PipelineID, m.FailureReasonErr)
	}
	if l.cfg.onFailure == FailureIsolate {
		if class := failureClass(code, m); class != "" {
			if retried, err := l.flakeRetry(ctx, b, m, class, log); err != nil || retried {
				return err
			}
			// Isolate at once: close the MR and retry, bisect or quarantine.
			_, err := l.s.settleFailure(ctx, b, failure{class, msg}, log)
			return err
		}
	}
	if b.Status == domain.BatchBlocked {
		return nil // still blocked; the timeout sweep bounds how long
	}
	nb, err := l.s.st.BatchBlock(ctx, b.ID, b.Version, code, msg)
	if err != nil {
		return err
	}
	l.s.m.outcomes.WithLabelValues("reconcile", "blocked").Inc()
	log.Warn("batch blocked", "code", code, "message", msg, "version", nb.Version)
	return nil
}

// advanceMerge arms auto-merge or merges, as the merge mode says, and settles the batch
// when the merge is done.
func (l *reconcileLoop) advanceMerge(ctx context.Context, b domain.Batch, m mr.MergeRequest, log *slog.Logger) error {
	var err error
	// Every merge call carries the sha batcherd committed and recorded, never the head
	// GitLab reports: a branch moved by someone else must not merge under our batch.
	sha := b.MRSHA
	if sha == "" {
		sha = m.SHA
	}
	var merged mr.MergeRequest
	switch l.cfg.mode {
	case MergeAuto:
		if m.MergeWhenPipelineSucceeds {
			return nil
		}
		// Not armed: publish crashed (or failed to arm) after recording the MR, or the
		// pipeline was retried after a failure disarmed it.
		merged, err = l.s.gl.SetAutoMerge(ctx, b.Repo, m.IID, sha)
		var ge *mr.Error
		if errors.As(err, &ge) && ge.Status == http.StatusMethodNotAllowed {
			// GitLab cannot arm or merge it now (its mergeability changed since our read:
			// a check still running, a rebase needed, a pipeline being created). Not an
			// error of ours: the next pass reads the MR again and acts on what it says.
			l.s.m.outcomes.WithLabelValues("reconcile", "arm_refused").Inc()
			log.Info("GitLab refused to arm auto-merge now; looking again next pass", "err", err)
			return nil
		}
		if err != nil {
			return err
		}
		l.s.m.outcomes.WithLabelValues("reconcile", "armed").Inc()
		log.Info("auto-merge armed", "mr_state", merged.State)
	case MergeDirect:
		if m.PipelineStatus != "success" || m.MergeabilityPending() {
			// Mergeability still being computed: GitLab refuses a merge now (405).
			return nil
		}
		merged, err = l.s.gl.Merge(ctx, b.Repo, m.IID, sha)
		if err != nil {
			return err
		}
		l.s.m.outcomes.WithLabelValues("reconcile", "merged").Inc()
	default:
		return nil // manual: humans merge
	}
	if merged.State == mr.StateMerged {
		l.noteFlake(ctx, b, merged, log)
		_, err := l.s.settleSucceeded(ctx, b, log)
		return err
	}
	return nil
}

// blockReason says why an open MR cannot merge as it stands, or "" when it can (or may
// once its pipeline finishes).
func blockReason(b domain.Batch, m mr.MergeRequest) (code, msg string) {
	switch {
	// First: once someone else pushed to the batch branch, its pipeline and its
	// conflicts are theirs, not the members'. Isolating on them would close the MR
	// (discarding the push) and bisect or blame members for it; head_moved blocks for
	// an operator whatever BATCHERD_ON_FAILURE says.
	case b.MRSHA != "" && m.SHA != "" && m.SHA != b.MRSHA:
		return domain.BlockHeadMoved, fmt.Sprintf("the head of %s is %s, not the commit batcherd made (%s)", m.SourceBranch, short(m.SHA), short(b.MRSHA))
	case m.PipelineStatus == "failed" || m.PipelineStatus == "canceled":
		msg := fmt.Sprintf("pipeline %d of merge request !%d %s", m.PipelineID, m.IID, m.PipelineStatus)
		if m.FailureReason != "" {
			msg += ": " + m.FailureReason
		}
		return domain.BlockPipelineFailed, msg
	case (m.PipelineStatus == "skipped" || m.PipelineStatus == "manual") && m.DetailedMergeStatus != "mergeable" && !m.MergeabilityPending():
		// A skipped pipeline, or one waiting for a manual job, never passes by itself
		// (unless the project counts skipped as passed: then the MR reads mergeable).
		return domain.BlockCIBlocked, fmt.Sprintf("pipeline %d of merge request !%d is %s: it will not pass by itself (check the CI rules for batch branches, or play the manual job)", m.PipelineID, m.IID, m.PipelineStatus)
	case m.HasConflicts || m.DetailedMergeStatus == "conflict":
		return domain.BlockMergeConflict, fmt.Sprintf("merge request !%d has conflicts with its target branch", m.IID)
	case m.DetailedMergeStatus == "need_rebase":
		return domain.BlockNeedRebase, fmt.Sprintf("merge request !%d needs a rebase onto its target branch", m.IID)
	}
	return "", ""
}

// failureClass maps a block reason to the failure class the policy acts on, or "" for
// a reason that waits for an operator even in isolate mode: a head that moved away
// from batcherd's commit means someone pushed to the batch branch, and batcherd does
// not second-guess them (the timeout bounds the wait).
func failureClass(code string, m mr.MergeRequest) domain.FailureClass {
	switch code {
	case domain.BlockPipelineFailed:
		return pipelineClass(m.PipelineStatus, m.FailureReason)
	case domain.BlockMergeConflict, domain.BlockNeedRebase:
		return domain.ClassConflict
	case domain.BlockCIBlocked:
		return domain.ClassCIBlocked
	}
	return ""
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
