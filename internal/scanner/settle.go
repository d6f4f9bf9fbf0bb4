package scanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
)

// Failure codes recorded on a batch and its members by settle failure. The failure
// classes of policy.go are codes too.
const ()

// errStillOpen is mr.ErrStillOpen, the answer the admin API turns into a 409.
var errStillOpen = mr.ErrStillOpen

// settleFailure settles an active batch b (whose version the caller just read or
// reserved) as failed with the classified failure f, and applies the failure policy to
// its members. Order matters (fencing, docs/ARCHITECTURE.md):
//
//  1. find the MR by the recorded iid, or by the deterministic branch when none is
//     recorded yet — a publish in flight may have opened it (findBatchMR);
//  2. if it is open, record the failure class on the batch (guarded), then close it
//     (closeForFailure): a closed MR on a batch without a recorded class was closed by
//     a human, one with it by a batcherd settle that did not finish, resumed with the
//     same class; if it was already closed and no class was recorded, a human closed
//     it first;
//  3. read it again: merged wins (it merged between our read and our close) → settle
//     success (mergedWhileFailing);
//  4. otherwise plan each member's fate (retry, bisect, fail with a reason) from the
//     batch's waiting rows and apply it in one store transaction, batch guard first,
//     so a second settler fails at its first statement and changes nothing
//     (applyFailure).
//
// The choices between the steps are plain functions of the MR's state (settleBefore,
// settleAfter, closedByHuman), tested without GitLab. GitLab trouble at steps 1–3
// aborts the settle (the batch stays active and is retried): failing a batch whose MR
// may still merge is what fencing forbids.
func (s *Scanner) settleFailure(ctx context.Context, b domain.Batch, f failure, log *slog.Logger) (domain.Batch, error) {
	m, found, err := s.findBatchMR(ctx, b)
	if err != nil {
		return b, err
	}
	s.step(ctx, "settle.found", b.ID)
	next := settleBefore(found, m.State)
	switch next {
	case settleLater:
		// GitLab is merging it right now: the outcome is about to be known, and
		// failing the batch first could put it behind a merge. Retry later.
		return b, fmt.Errorf("settle batch %d: MR !%d is locked (merging): %w", b.ID, m.IID, errStillOpen)
	case settleClose:
		if b, err = s.closeForFailure(ctx, b, f, m); err != nil {
			return b, err
		}
	case settleReread:
		if m.State == mr.StateClosed && closedByHuman(b.FailClass, f) {
			f = failure{domain.ClassClosedByUser, fmt.Sprintf("merge request !%d was closed without merging (not by batcherd) while the batch was being failed for %s: %s", m.IID, f.class, f.msg)}
		}
	}
	if next != settleApply {
		// Re-read after closing, never trust the close's answer alone: merged wins.
		m, err = s.gl.GetMR(ctx, b.Repo, m.IID)
		if err != nil {
			return b, err
		}
		s.step(ctx, "settle.reread", b.ID)
		switch settleAfter(m.State) {
		case settleMergedWins:
			return s.mergedWhileFailing(ctx, b, m, f, log)
		case settleLater:
			return b, fmt.Errorf("settle batch %d: MR !%d is %s: %w", b.ID, m.IID, m.State, errStillOpen)
		}
	}
	return s.applyFailure(ctx, b, f, log)
}

// settleStep is the next step of a failure settlement.
type settleStep int

const (
	settleApply      settleStep = iota // no MR, or its close stands: apply the failure policy
	settleClose                        // the MR is open: record the class, close it, read it again
	settleReread                       // the MR is closed (or merged) already: read it again
	settleMergedWins                   // the MR merged: settle success instead
	settleLater                        // locked (merging), or still open after closing: retry later
)

// settleBefore decides from the MR as first found (found false: the batch has no MR).
func settleBefore(found bool, state string) settleStep {
	switch {
	case !found:
		return settleApply
	case state == mr.StateLocked:
		return settleLater
	case state == mr.StateOpened:
		return settleClose
	}
	return settleReread
}

// settleAfter decides from the MR as read again after the close.
func settleAfter(state string) settleStep {
	switch state {
	case mr.StateMerged:
		return settleMergedWins
	case mr.StateClosed:
		return settleApply
	}
	return settleLater
}

// closedByHuman: an MR found closed on a batch with no failure class on record was
// closed before batcherd ever decided to close it — by a human. The failure becomes
// closed_by_user, unless its class is final or already that.
func closedByHuman(recorded domain.FailureClass, f failure) bool {
	return recorded == "" && retriable(f.class) && f.class != domain.ClassClosedByUser
}

// findBatchMR is settle step 1.
func (s *Scanner) findBatchMR(ctx context.Context, b domain.Batch) (mr.MergeRequest, bool, error) {
	if b.MRIID != nil {
		m, err := s.gl.GetMR(ctx, b.Repo, *b.MRIID)
		switch {
		case err == nil:
			return m, true, nil
		case mr.ClassOf(err) != mr.ClassNotFound:
			return m, false, err
		}
	}
	m, found, err := s.gl.FindMR(ctx, b.Repo, batchBranch(b), batchRef(b))
	var foreign *mr.ForeignMRError
	if errors.As(err, &foreign) {
		// Someone else's MR on the batch's branch name: not ours to close, and never
		// the batch's merge. The batch has no MR of its own.
		s.log.Warn("the MR on the batch's branch is not this batch's; leaving it alone", "batch_id", b.ID, "foreign", foreign.Error())
		return mr.MergeRequest{}, false, nil
	}
	return m, found, err
}

// closeForFailure is settle step 2 for an open MR: the class goes on record before
// the close (guarded; bumps version), so a settle interrupted after the close is
// resumed with it rather than read as a human's close.
func (s *Scanner) closeForFailure(ctx context.Context, b domain.Batch, f failure, m mr.MergeRequest) (domain.Batch, error) {
	if b.FailClass != f.class {
		nb, err := s.st.BatchMarkFailing(ctx, b.ID, b.Version, f.class)
		if err != nil {
			return b, err
		}
		b = nb
		s.step(ctx, "settle.marked", b.ID)
	}
	if _, err := s.gl.CloseMR(ctx, b.Repo, m.IID); err != nil {
		return b, err
	}
	s.step(ctx, "settle.closed", b.ID)
	return b, nil
}

// mergedWhileFailing is settle step 3's "merged wins".
func (s *Scanner) mergedWhileFailing(ctx context.Context, b domain.Batch, m mr.MergeRequest, f failure, log *slog.Logger) (domain.Batch, error) {
	log.Info("merge request merged while being failed: merged wins", "mr_iid", m.IID, "class", f.class)
	if b.MRIID == nil {
		// Found by its branch, never recorded (its publisher died or lost the answer
		// before recording it). Record it first, guarded like any publish, so that a
		// SUCCEEDED batch always names the MR that merged it. Found by the chaos run
		// (verify: "SUCCEEDED batch has no MR recorded"). A crash between the two
		// writes leaves a RUNNING batch with a merged MR, which reconcile settles.
		nb, err := s.st.BatchRecordMR(ctx, b.ID, b.Version, store.MRRecord{IID: m.IID, URL: m.WebURL, SHA: m.SHA})
		if err != nil {
			return b, err
		}
		b = nb
	}
	return s.settleSucceeded(ctx, b, log)
}

// applyFailure is settle step 4: the members' fates planned by the failure policy and
// applied in one store transaction, then metrics, the log line and the follow-up claim.
func (s *Scanner) applyFailure(ctx context.Context, b domain.Batch, f failure, log *slog.Logger) (domain.Batch, error) {
	members, err := s.st.BatchWaitingMembers(ctx, b.ID)
	if err != nil {
		return b, err
	}
	fates, out := s.pol.plan(b, f, members)
	nb, err := s.st.BatchSettleIsolate(ctx, b.ID, b.Status, b.Version, f.class, truncate(f.msg, 1024), fates, out.deferral)
	if err != nil {
		return b, err
	}
	s.step(ctx, "settle.settled", b.ID)
	s.observeFailure(b, nb, f, out)
	log.Info("batch failed", "class", f.class, "message", f.msg, "operations", nb.Size,
		"action", out.action, "retried", out.retried, "culprits", out.culprits, "max_attempts", out.maxed,
		"depth", b.Depth, "kind", b.Kind)
	// Whatever this settle did, a bisection part, a search's remainder or a retry group
	// may be waiting — its own (retry, bisect) or an earlier one's (this batch's culprit
	// is now found, so the remainder is next): claim it now, not at the next scheduled
	// round.
	// The follow-up claim takes only such groups, never the ordinary queue.
	s.followUp(ctx, b.Repo)
	return nb, nil
}

// observeFailure counts a failure settlement in the metrics.
func (s *Scanner) observeFailure(b, nb domain.Batch, f failure, out planOutcome) {
	s.m.settles.WithLabelValues("failed", string(f.class)).Inc()
	s.observeBatch(nb, "failed")
	switch out.action {
	case "retry":
		s.m.retries.WithLabelValues(string(f.class)).Inc()
	case "bisect":
		s.m.bisectionDepth.Observe(float64(out.bisectedTo))
	}
	if out.culprits > 0 {
		s.m.culprits.WithLabelValues(b.Repo).Add(float64(out.culprits))
	}
	if out.maxed > 0 {
		s.m.maxAttempts.WithLabelValues(b.Repo).Add(float64(out.maxed))
	}
}

// settleSucceeded settles an active batch as merged, guarded on the version read.
func (s *Scanner) settleSucceeded(ctx context.Context, b domain.Batch, log *slog.Logger) (domain.Batch, error) {
	nb, err := s.st.BatchSettleSucceeded(ctx, b.ID, b.Status, b.Version)
	if err != nil {
		return b, err
	}
	s.succeeded(ctx, nb, log)
	log.Info("batch merged", "operations", nb.Size)
	s.verifyMerged(ctx, nb, log)
	return nb, nil
}

// settleUnchanged settles a running batch whose changes the repository already has as
// succeeded without an MR, guarded on the version read.
func (s *Scanner) settleUnchanged(ctx context.Context, b domain.Batch, log *slog.Logger) (domain.Batch, error) {
	nb, err := s.st.BatchSettleUnchanged(ctx, b.ID, b.Version)
	if err != nil {
		return b, err
	}
	s.succeeded(ctx, nb, log)
	log.Info("batch succeeded without an MR: the repository already had every change", "operations", nb.Size)
	return nb, nil
}

// succeeded is what follows a batch settled succeeded: metrics, and the next half or
// retry group, or waiting urgent work, claimed at once.
func (s *Scanner) succeeded(ctx context.Context, nb domain.Batch, log *slog.Logger) {
	s.step(ctx, "settle.succeeded", nb.ID)
	s.m.settles.WithLabelValues("succeeded", "").Inc()
	s.observeBatch(nb, "succeeded")
	s.observeMerged(ctx, nb, log)
	s.resumeSearch(ctx, nb, log)
	// A bisection half or a retry merged: the next half may be waiting. Or an urgent
	// operation met this batch's slot and waits for it: it is claimed now, not at the
	// next scheduled round (the follow-up claim takes nothing else).
	s.followUp(ctx, nb.Repo)
}

// resumeSearch: when nb was the last waiting part of a failed batch q, q held no
// culprit after all (its failure was a flake), and the siblings q's failure deferred go
// back to their parent's chain (store.SearchResume, domain.Resume) before the follow-up
// claim, instead of running whole in the remainder only to fail there. Best effort: if
// it is lost (an error, a crash), the remainder runs whole and is searched as any
// failure — a few runs more, nothing else.
func (s *Scanner) resumeSearch(ctx context.Context, nb domain.Batch, log *slog.Logger) {
	g, ok := domain.ParseSearchGroup(nb.Grp)
	if !ok || g.Rest() {
		return
	}
	n, err := s.st.SearchResume(ctx, nb.Repo, g)
	switch {
	case err != nil && !isCanceled(err):
		log.Warn("resuming the bisection after a clean part failed; its remainder runs whole", "err", err)
	case n > 0:
		log.Info("every part of a failed batch merged (a flake): its deferred siblings go back to their parent's parts",
			"failed_batch", g.Parent, "resumed", n)
	}
}

// mergedAfterFailed applies "merged wins" to a FAILED batch whose MR merged anyway (a
// human merged it, or a merge landed while the batch was being failed): guarded
// FAILED → SUCCEEDED with its members, and an audit event saying why.
func (s *Scanner) mergedAfterFailed(ctx context.Context, b domain.Batch, m mr.MergeRequest, log *slog.Logger) error {
	if b.MRIID == nil {
		// The MR was found by its branch (the orphan sweep closing it, a publisher that
		// lost its record): record it first, so the SUCCEEDED batch names the MR that
		// merged it (verify: "SUCCEEDED batch has no MR recorded"). A crash between the
		// two writes leaves a FAILED batch with its merged MR recorded, which the
		// merged-wins sweep then settles.
		rb, err := s.st.BatchRecordMRFailed(ctx, b.ID, b.Version, store.MRRecord{IID: m.IID, URL: m.WebURL, SHA: m.SHA})
		if err != nil {
			return err
		}
		b = rb
	}
	nb, err := s.st.BatchSettleSucceeded(ctx, b.ID, domain.BatchFailed, b.Version)
	if err != nil {
		return err
	}
	s.m.settles.WithLabelValues("succeeded_after_failed", b.ErrorCode).Inc()
	log.Warn("batch had failed but its merge request merged: settled succeeded (merged wins)",
		"mr_iid", m.IID, "previous_code", b.ErrorCode)
	id := b.ID
	detail := fmt.Sprintf("batch %d was FAILED (%s: %s) but its merge request !%d merged; the database follows the repository",
		b.ID, b.ErrorCode, b.ErrorMessage, m.IID)
	if _, err := s.st.EventRecord(ctx, store.Event{
		DedupeKey: "batch-merged-after-failed:" + strconv.FormatInt(b.ID, 10),
		BatchID:   &id,
		Code:      "merged_after_failed",
		Detail:    truncate(detail, 2048),
	}); err != nil && !isCanceled(err) {
		// The state change is what matters; the event is explanation.
		log.Warn("recording the merged-after-failed event failed", "err", err)
	}
	s.observeBatch(nb, "succeeded")
	s.observeMerged(ctx, nb, log)
	return nil
}

// SettleBatch settles an active batch as failed now (admin API), through the same
// close-then-reread path as the timeout sweep: if its MR merged, the batch settles
// SUCCEEDED instead. A FAILED batch whose MR has merged since is moved to SUCCEEDED
// (merged wins). Other settled batches are returned as they are. store.ErrNotFound
// when the batch does not exist.
func (s *Scanner) SettleBatch(ctx context.Context, id int64) (domain.Batch, error) {
	var lastErr error
	for attempt := range 5 {
		if attempt > 0 && !sleep(ctx, backoff(50*time.Millisecond, time.Second, attempt), nil) {
			return domain.Batch{}, ctx.Err()
		}
		b, err := s.st.BatchGet(ctx, id)
		if err != nil {
			return domain.Batch{}, err
		}
		log := batchLog(s.log.With("loop", "admin"), b)
		if !b.Status.Active() {
			if b.Status == domain.BatchFailed && b.MRIID != nil {
				m, err := s.gl.GetMR(ctx, b.Repo, *b.MRIID)
				if err != nil {
					return b, err
				}
				if m.State == mr.StateMerged {
					if err := s.mergedAfterFailed(ctx, b, m, log); err != nil && !isLost(err) {
						return b, err
					}
					return s.st.BatchGet(ctx, id)
				}
			}
			return b, nil
		}
		// Not under a publisher that may be opening the MR right now: the operator asks
		// again once it is open (recorded) or the reservation lapsed. A publisher that
		// reserves after this check is fenced by our reservation (its renewal before
		// opening the MR is guarded on its version).
		if busy, err := s.st.BatchPublishing(ctx, b.ID); err != nil || busy {
			if err == nil {
				err = fmt.Errorf("settle batch %d: %w; its MR may be opening: settle again in %s",
					b.ID, store.ErrBatchPublishing, s.cfg.PublishLease)
			}
			return b, err
		}
		// Reserve first, like every loop: it fences the reconcile and timeout loops of
		// every replica off this batch while we close its MR.
		rb, err := s.st.BatchReserve(ctx, b.ID, b.Version, s.cfg.SettleLease)
		if isLost(err) {
			lastErr = err
			continue
		}
		if err != nil {
			return b, err
		}
		_, err = s.settleFailure(ctx, rb, failure{domain.ClassManual, "settled as failed by an operator"}, log)
		if isLost(err) {
			lastErr = err
			continue
		}
		if err != nil {
			return rb, err
		}
		return s.st.BatchGet(ctx, id)
	}
	return domain.Batch{}, fmt.Errorf("settle batch %d: kept losing races with other replicas: %w", id, lastErr)
}

// observeBatch records a settled batch's claim-to-settle duration (DB clock).
func (s *Scanner) observeBatch(b domain.Batch, outcome string) {
	if b.FinishedAt != nil && !b.CreatedAt.IsZero() {
		s.m.batchDuration.WithLabelValues(outcome).Observe(b.FinishedAt.Sub(b.CreatedAt).Seconds())
	}
}

// observeMerged records the time to merge of each operation a batch merged (creation
// to settlement, DB clock), per repository. Metrics only: a failed read is logged.
func (s *Scanner) observeMerged(ctx context.Context, b domain.Batch, log *slog.Logger) {
	lat, err := s.st.BatchMergeLatencies(ctx, b.ID)
	if err != nil {
		if !isCanceled(err) {
			log.Debug("reading merge latencies failed", "err", err)
		}
		return
	}
	h := s.m.timeToMerge.WithLabelValues(b.Repo)
	for _, v := range lat {
		h.Observe(v)
	}
}

// truncate cuts s to at most n bytes on a rune boundary (columns are VARCHAR in
// characters, but staying under n bytes is always safe).
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
