package scanner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
)

// orphanConfig is the orphan sweep's slice of Config.
type orphanConfig struct {
	interval time.Duration
	repos    []string
	lookback time.Duration
	limit    int
}

// orphanLoop is the backstop of fencing, in both directions:
//
//   - an open batcherd-labelled MR whose batch is not active (settled, or unknown to the
//     database) must not stay mergeable: close it. This catches a publish that lost
//     to a settle before the settler could see its MR.
//   - a FAILED batch whose MR merged anyway (a human merged it): the database follows
//     the repository — FAILED → SUCCEEDED with an audit event (merged wins).
type orphanLoop struct {
	s   *Scanner
	cfg orphanConfig
	log *slog.Logger

	// next is where sweepFailed's next page starts. Each pass reads one page of the
	// failed batches and the next pass the following one, wrapping round, so every
	// failed batch of the lookback is re-read however many there are. Replicas keep
	// their own positions; none is needed for correctness, only for reach.
	next store.FailedCursor
}

func (l *orphanLoop) runOnce(ctx context.Context) error {
	// Each repository is an item of the pass: one that cannot be listed (an archived
	// project, lost access) is logged and counted with its name and fails the pass only
	// when every repository failed. Failing the pass for it would make the loop back
	// off and keep reporting the pass as failed while the other repositories were swept
	// fine, on every replica, for as long as that one repository stays broken.
	started, failed := 0, 0
	for _, repo := range l.cfg.repos {
		if ctx.Err() != nil || l.s.stopping() {
			break
		}
		if l.s.access.held(repo) {
			continue // GitLab refuses it: probed by the other loops after their backoff
		}
		started++
		err := l.sweepOpen(ctx, repo)
		if l.s.itemErr("orphans", l.log.With("repo", repo), "listing open batch MRs failed", err) != nil {
			failed++
		}
	}
	if err := l.sweepFailed(ctx); err != nil {
		return err
	}
	return passResult(started, failed)
}

// sweepOpen closes open labelled MRs of repo whose batch is not active.
func (l *orphanLoop) sweepOpen(ctx context.Context, repo string) error {
	inst, err := l.s.st.Installation(ctx)
	if err != nil {
		return err
	}
	open, err := l.s.gl.ListOpenLabeled(ctx, repo, mr.Label)
	if err != nil {
		return err
	}
	for _, m := range open {
		if ctx.Err() != nil || l.s.stopping() {
			break
		}
		l.sweepOpenMR(ctx, repo, inst, m)
	}
	return nil
}

// sweepOpenMR closes one open labelled MR of repo (inst is this installation's id)
// when it is ours — on this installation's batch branch and carrying the batch's
// trailers — and its batch is not active; errors are counted per item.
func (l *orphanLoop) sweepOpenMR(ctx context.Context, repo, inst string, m mr.MergeRequest) {
	log := l.log.With("repo", repo, "mr_iid", m.IID, "branch", m.SourceBranch)
	branchInst, id, ok := domain.ParseBranch(m.SourceBranch)
	if !ok {
		// Labelled by hand, not a batch branch: not ours to close.
		log.Debug("labelled MR on a non-batch branch; leaving it")
		return
	}
	if branchInst != "" && branchInst != inst {
		// Another installation's batch (a second database on this project): its
		// own replicas follow it.
		log.Debug("another installation's batch MR; leaving it", "installation", branchInst)
		return
	}
	log = log.With("batch_id", id)
	b, err := l.s.st.BatchGet(ctx, id)
	if branchInst == "" && (err != nil || b.SourceBranch != m.SourceBranch) {
		// A legacy branch (batcherd/batch-<id>, from before installations had ids)
		// is ours only when our batch row recorded it; otherwise it may be any
		// installation's, and closing it is not ours to do.
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			l.s.itemErr("orphans", log, "reading the MR's batch failed", err)
		}
		return
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		// A batch row can only be missing if the database lost it (restore from an
		// older backup): nothing would ever follow this MR, so it must not merge.
	case err != nil:
		l.s.itemErr("orphans", log, "reading the MR's batch failed", err)
		return
	case b.Status.Active():
		return
	case b.Repo != repo:
		log.Warn("batch branch belongs to another repository's batch; leaving it", "batch_repo", b.Repo)
		return
	}
	// The branch name is predictable: only an MR whose commits carry this
	// installation's trailers for this batch is the batch's (mr.IsBatchMR, the rule
	// FindMR adopts by). Someone else's MR on it — a human's branch of that name, a
	// database re-created with the same installation id — is not ours to close, and if
	// it merged while we closed it, "merged wins" below would settle the batch
	// SUCCEEDED with someone else's merge.
	ref := mr.BatchRef{ID: id} // a row the database lost: installation and id alone
	if err == nil {
		ref = batchRef(b)
	}
	ours, err := l.s.gl.IsBatchMR(ctx, repo, m, ref)
	if err != nil {
		l.s.itemErr("orphans", log, "reading the MR's commits failed", err)
		return
	}
	if !ours {
		l.s.m.outcomes.WithLabelValues("orphans", "foreign_mr").Inc()
		log.Warn("the open MR on a batch branch is not the batch's (its commits do not carry the batch's trailers); leaving it alone", "mr_url", m.WebURL)
		return
	}
	cm, err := l.s.gl.CloseMR(ctx, repo, m.IID)
	if err != nil {
		l.s.itemErr("orphans", log, "closing an orphan MR failed", err)
		return
	}
	l.s.m.outcomes.WithLabelValues("orphans", "closed").Inc()
	log.Info("closed orphan merge request", "batch_status", b.Status.String(), "mr_state", cm.State)
	if cm.State == mr.StateMerged && b.Status == domain.BatchFailed {
		// It merged before we could close it: merged wins.
		l.s.itemErr("orphans", log, "settling a merged orphan failed", l.s.mergedAfterFailed(ctx, b, cm, log))
	}
}

// sweepFailed re-reads the MRs of recently FAILED batches (by the recorded iid, else
// by the batch's branch): merged wins.
func (l *orphanLoop) sweepFailed(ctx context.Context) error {
	failed, err := l.s.st.BatchesFailedRecently(ctx, l.cfg.lookback, l.next, l.cfg.limit)
	if err != nil {
		return err
	}
	if len(failed) < max(l.cfg.limit, 1) {
		l.next = store.FailedCursor{} // the end: start over next pass
	} else {
		l.next = l.next.After(failed[len(failed)-1])
	}
	for _, b := range failed {
		if ctx.Err() != nil || l.s.stopping() {
			break
		}
		if l.s.access.held(b.Repo) {
			continue
		}
		log := batchLog(l.log, b)
		var m mr.MergeRequest
		if b.MRIID != nil {
			log = log.With("mr_iid", *b.MRIID)
			m, err = l.s.gl.GetMR(ctx, b.Repo, *b.MRIID)
			if err == nil && m.State != mr.StateMerged {
				// The recorded MR did not merge, but a second MR of ours on the branch
				// may have: a publisher whose lease lapsed inside EnsureMR (between its
				// FindMR and its create) opens one after another replica's MR was
				// recorded and closed, and lostRecord leaves it to the batch's holder,
				// which follows only the recorded MR (found by the protocol model,
				// docs/MODEL.md). FindMR ranks a merged MR first; an error here is
				// met again next pass.
				if bm, found, ferr := l.s.gl.FindMR(ctx, b.Repo, batchBranch(b), batchRef(b)); ferr == nil && found && bm.State == mr.StateMerged {
					m = bm
				}
			}
		} else {
			// No MR recorded, yet one may have merged: a publisher frozen past its
			// lease while the batch was settled opened it afterwards, then died before
			// lostRecord could close it, and a human merged it. The open-MR sweep no
			// longer sees a merged MR, so only this look by the branch finds it (found
			// by the protocol model, docs/MODEL.md). Someone else's MR on the branch is
			// never the batch's.
			var found bool
			m, found, err = l.s.gl.FindMR(ctx, b.Repo, batchBranch(b), batchRef(b))
			if isForeign(err) || (err == nil && !found) {
				continue
			}
		}
		if err != nil {
			l.s.itemErr("orphans", log, "reading a failed batch's MR failed", err)
			continue
		}
		if m.State != mr.StateMerged {
			continue
		}
		if l.s.itemErr("orphans", log, "settling a merged failed batch failed", l.s.mergedAfterFailed(ctx, b, m, log)) == nil {
			l.s.m.outcomes.WithLabelValues("orphans", "merged_after_failed").Inc()
		}
	}
	return nil
}
