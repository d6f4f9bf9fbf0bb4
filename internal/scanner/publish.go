package scanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
)

// publishConfig is the publish loop's slice of Config.
type publishConfig struct {
	interval time.Duration
	lease    time.Duration // how long a publisher holds a batch before another may resume it
	target   string
	mode     MergeMode
	limit    int
	workers  int
	timeout  time.Duration // BatchTimeout: a batch past it is not published again
}

// publishLoop gives each RUNNING batch without an MR its branch, commit and MR, records
// the MR (fencing), then arms the merge. Every GitLab step is idempotent by the
// deterministic branch batcherd/<installation>/batch-<id>, so a publish abandoned at any step is
// resumed by whichever replica reserves the batch next, never duplicated.
type publishLoop struct {
	s   *Scanner
	cfg publishConfig
	log *slog.Logger
}

func (l *publishLoop) runOnce(ctx context.Context) error {
	due, err := l.s.st.BatchesDue(ctx, l.cfg.limit)
	if err != nil {
		return err
	}
	due = slices.DeleteFunc(due, func(b domain.Batch) bool { return b.Status != domain.BatchRunning || b.MRIID != nil })
	if len(due) > 0 {
		// A batch past the timeout (DB clock) is not published again: no renewed
		// reservation, so the timeout sweep — which leaves a batch alone while a publish
		// reservation is live — takes it within a lease, and finds by its branch any MR
		// an earlier publisher opened. Renewing it would let a publish run into the
		// settle (see store.qBatchesTimedOut; found by the chaos run). On a read error,
		// publish as before.
		if late, err := l.s.st.BatchesTimedOut(ctx, l.cfg.timeout, l.cfg.limit); err == nil && len(late) > 0 {
			ids := make(map[int64]bool, len(late))
			for _, b := range late {
				ids[b.ID] = true
			}
			due = slices.DeleteFunc(due, func(b domain.Batch) bool { return ids[b.ID] })
		}
	}
	started, failed := forEach(ctx, l.s, l.cfg.workers, due, func(ctx context.Context, b domain.Batch) error {
		log := batchLog(l.log, b)
		if l.s.access.held(b.Repo) {
			// GitLab refuses the repository: held, probed again after the backoff.
			l.s.m.outcomes.WithLabelValues("publish", "held_gitlab_refused").Inc()
			return nil
		}
		// tryLock: the reservation pushes next_check_at past the lease, so other
		// replicas (and our reconcile loop) leave the batch alone while we publish.
		rb, err := l.s.st.BatchReserve(ctx, b.ID, b.Version, l.cfg.lease)
		if err != nil {
			return l.s.itemErr("publish", log, "reserve failed", err)
		}
		l.s.step(ctx, "publish.reserved", b.ID)
		err = l.publish(ctx, &rb, log)
		if err != nil && mr.ClassOf(err) == mr.ClassTransient && !isCanceled(err) {
			l.retrySoon(ctx, rb, err, log)
		}
		return l.s.itemErr("publish", log, "publish failed", err)
	})
	return passResult(started, failed)
}

// publishRetry is how long a batch whose publish met a transient GitLab error (a 5xx,
// a 429, a timeout, a dropped connection) waits before the next attempt, unless
// GitLab asked for longer with Retry-After.
const publishRetry = 2 * time.Second

// retrySoon shortens the reservation of a batch whose publish failed transiently, so
// any replica tries again after publishRetry rather than after the whole publish lease
// (one 502 used to park a batch for 30 s, and two in a row could run it into the
// batch timeout). The write is guarded on the version this publisher reserved; if it
// loses, the batch moved on and there is nothing to shorten. A permanent error keeps
// the full lease: trying again at once would only meet it again.
func (l *publishLoop) retrySoon(ctx context.Context, b domain.Batch, cause error, log *slog.Logger) {
	wait := publishRetry
	var ge *mr.Error
	if errors.As(cause, &ge) && ge.RetryAfter > wait {
		wait = ge.RetryAfter
	}
	if wait >= l.cfg.lease {
		return
	}
	if _, err := l.s.st.BatchReserve(ctx, b.ID, b.Version, wait); err != nil {
		log.Debug("could not shorten the publish reservation; the lease stands", "err", err)
		return
	}
	l.s.m.outcomes.WithLabelValues("publish", "retry_soon").Inc()
	log.Debug("publish will be retried soon", "after", wait)
}

// The publish steps, in order (each idempotent by the batch's branch, so a publish
// abandoned after any of them is resumed by the next reservation, never duplicated):
//
//  1. find the branch's MR in any state (FindMR);
//  2. when there is none, or it is still open: read the members and write the commit,
//     which creates the branch from the target's head (writeBatch; one pipeline per
//     batch branch, its commit's) — a commit that changes nothing settles the batch
//     unchanged instead (settleUnchangedBatch); otherwise renew the reservation and
//     ensure the MR (openMR);
//  3. record the MR, guarded (fencing: before any merge is armed);
//  4. arm auto-merge when the MR is open and the merge mode is auto;
//  5. mark the batch due, so reconcile looks at it soon.
//
// The choices between them are plain functions of what GitLab answered (publishPlan,
// below), tested without GitLab.

// publishPlan is what a publish does after step 1, decided from plain values.
type publishPlan struct {
	// write: the branch has no MR yet, or an open one — (re)write the commit (and with
	// it the branch) and the MR. A merged or closed MR found here (a crash after
	// EnsureMR, then a human acted) is recorded as is, and reconcile settles it; never
	// open a second MR for a branch.
	write bool
}

func planPublish(found bool, state string) publishPlan {
	return publishPlan{write: !found || state == mr.StateOpened}
}

// unchangedCommit: the batch's commit changes nothing (every member is a revoke of a
// file already gone) and no MR exists: the batch settles succeeded as it stands.
func unchangedCommit(commitEmpty, found bool) bool { return commitEmpty && !found }

// armsAutoMerge: step 4 runs for an open MR in auto mode.
func armsAutoMerge(state string, mode MergeMode) bool {
	return state == mr.StateOpened && mode == MergeAuto
}

// publish runs the publish steps for the reserved batch *bp, and leaves in *bp the
// batch as this publisher last reserved it (the reservation is renewed before the MR
// is opened), so the caller's retrySoon writes against the current version.
func (l *publishLoop) publish(ctx context.Context, bp *domain.Batch, log *slog.Logger) error {
	b := *bp
	branch := batchBranch(b)
	// Only an MR whose commits carry this installation's trailers for this batch is
	// the batch's: anything else on the branch fails the batch, naming the MR, and is
	// left alone.
	m, found, err := l.s.gl.FindMR(ctx, b.Repo, branch, batchRef(b))
	if isForeign(err) {
		return l.foreign(ctx, b, err, log)
	}
	if err != nil {
		return err
	}
	l.s.step(ctx, "publish.found", b.ID)
	sha := m.SHA
	if planPublish(found, m.State).write {
		w, err := l.writeBatch(ctx, b, branch, log)
		if err != nil || w.done {
			return err
		}
		sha = w.sha
		if unchangedCommit(w.empty, found) {
			return l.settleUnchangedBatch(ctx, b, branch, log)
		}
		rb, nm, err := l.openMR(ctx, b, branch, w, log)
		*bp = rb // renewed, or b when the renewal did not happen
		if isForeign(err) {
			return l.foreign(ctx, rb, err, log)
		}
		if err != nil || nm == nil {
			return err
		}
		b, m = rb, *nm
	}
	if sha == "" {
		sha = m.SHA
	}
	return l.recordAndArm(ctx, b, m, sha, log)
}

// written is what writeBatch did: the members and their reasons (for the MR), and the
// commit's sha and whether it changed nothing. done: the batch was settled instead.
type written struct {
	members []domain.Operation
	why     map[string]string
	sha     string
	empty   bool
	done    bool
}

// writeBatch is step 2's write: the members' file actions on the batch branch in one
// commit, which creates the branch. CommitFiles is idempotent by the Batcherd-Batch
// trailer: resumed after a lost answer, or after a crash between the commit and the
// record, it finds the branch with the batch's commit on its head and returns that
// commit's sha without committing again.
func (l *publishLoop) writeBatch(ctx context.Context, b domain.Batch, branch string, log *slog.Logger) (written, error) {
	members, err := l.s.st.BatchMembers(ctx, b.ID)
	if err != nil {
		return written{}, err
	}
	if len(members) == 0 {
		// Cannot happen through BatchClaim; fail loudly rather than open an empty MR.
		_, err := l.s.settleFailure(ctx, b, failure{domain.ClassEmpty, "the batch has no members"}, log)
		return written{done: true}, err
	}
	files, err := fileActions(members)
	if err != nil {
		return written{}, err
	}
	why, err := l.s.st.BatchMemberReasons(ctx, b.ID)
	if err != nil {
		return written{}, err
	}
	// The commit creates the branch (from the target's head) when it is not there yet:
	// a branch created on its own would cost a pipeline on the target's head that
	// tests nothing of the batch (docs/ARCHITECTURE.md, "The loops").
	commit, err := l.s.gl.CommitFiles(ctx, b.Repo, branch, l.cfg.target, batchRef(b), commitMessage(b, members), files)
	if mr.IsContentRefusal(err) {
		// GitLab refuses this content for good (a path it will not store): the same
		// commit can never succeed, so the batch fails now with GitLab's words, and the
		// failure policy bisects it down to the member GitLab refuses, instead of
		// holding the slot until the batch timeout, twice.
		l.s.m.outcomes.WithLabelValues("publish", "content_refused").Inc()
		log.Warn("GitLab refused the batch's commit; failing the batch to isolate the member", "err", err)
		_, serr := l.s.settleFailure(ctx, b, failure{domain.ClassRefused, "GitLab refused the batch's commit: " + gitlabMessage(err)}, log)
		return written{done: true}, serr
	}
	if err != nil {
		return written{}, err
	}
	l.s.step(ctx, "publish.commit", b.ID)
	return written{members: members, why: why, sha: commit.SHA, empty: commit.Empty}, nil
}

// settleUnchangedBatch: nothing to change. The repository already says what the batch
// would make it say, and an MR without commits is one GitLab never merges (it reads as
// a conflict): the batch has succeeded as it stands.
func (l *publishLoop) settleUnchangedBatch(ctx context.Context, b domain.Batch, branch string, log *slog.Logger) error {
	l.s.m.outcomes.WithLabelValues("publish", "nothing_to_change").Inc()
	if _, err := l.s.settleUnchanged(ctx, b, log); err != nil {
		return err
	}
	// No commit, so no branch was created; one may stand from an earlier version
	// (which created the branch before the commit) or a human: leave no stray branch
	// behind. Best effort: a branch left over harms nothing.
	if err := l.s.gl.DeleteBranch(ctx, b.Repo, branch); err != nil && !isCanceled(err) {
		log.Info("deleting the unneeded batch branch failed; it can be deleted by hand", "branch", branch, "err", err)
	}
	return nil
}

// openMR renews the reservation right before the MR exists, with a write guarded on
// the version reserved, then ensures the MR. The branch and commit may have taken long
// (retries, a slow GitLab, a frozen process); if the batch moved on meanwhile — the
// timeout sweep failed it once the reservation lapsed, and its members may be waiting
// for another round — no MR must be opened for it (nil MR, nil error): an MR of a
// failed batch that a human merges puts its files on the target branch after all. The
// renewal leaves only the EnsureMR call itself inside a fresh lease; the orphan sweep
// closes what a publisher frozen even there still opens.
func (l *publishLoop) openMR(ctx context.Context, b domain.Batch, branch string, w written, log *slog.Logger) (domain.Batch, *mr.MergeRequest, error) {
	rb, err := l.s.st.BatchReserve(ctx, b.ID, b.Version, l.cfg.lease)
	if isLost(err) {
		l.s.m.outcomes.WithLabelValues("publish", "lost_race").Inc()
		log.Info("the batch moved on while it was being published; not opening its MR")
		return b, nil, nil
	}
	if err != nil {
		return b, nil, err
	}
	l.s.step(ctx, "publish.renewed", b.ID)
	m, err := l.s.gl.EnsureMR(ctx, rb.Repo, mr.MRSpec{
		SourceBranch: branch,
		Batch:        batchRef(rb),
		TargetBranch: l.cfg.target,
		Title:        mrTitle(rb, w.members),
		Description:  mrDescription(rb, w.members, w.why),
		Labels:       []string{mr.Label},
	})
	if err != nil {
		return rb, nil, err
	}
	l.s.step(ctx, "publish.mr", rb.ID)
	return rb, &m, nil
}

// recordAndArm is steps 3–5. Fencing: the MR is recorded with a write guarded on the
// version we reserved, BEFORE any merge is armed; if it loses, the batch moved on
// without us (lostRecord).
func (l *publishLoop) recordAndArm(ctx context.Context, b domain.Batch, m mr.MergeRequest, sha string, log *slog.Logger) error {
	rb, err := l.s.st.BatchRecordMR(ctx, b.ID, b.Version, store.MRRecord{IID: m.IID, URL: m.WebURL, SHA: sha})
	if isLost(err) {
		return l.lostRecord(ctx, b, m, log)
	}
	if err != nil {
		return err
	}
	log = log.With("mr_iid", m.IID)
	l.s.m.outcomes.WithLabelValues("publish", "published").Inc()
	log.Info("published batch", "mr_url", m.WebURL, "sha", sha, "mr_state", m.State)
	l.s.step(ctx, "publish.recorded", b.ID)

	if armsAutoMerge(m.State, l.cfg.mode) {
		// sha-guarded: GitLab refuses if the branch head is not what we committed. A
		// failure here is retried by reconcile, which re-arms any opened MR that is not
		// armed.
		am, err := l.s.gl.SetAutoMerge(ctx, b.Repo, m.IID, sha)
		if err != nil && !isCanceled(err) {
			log.Info("arming auto-merge failed; reconcile will retry", "err", err)
		} else if err == nil {
			l.s.m.outcomes.WithLabelValues("publish", "armed").Inc()
			log.Debug("auto-merge armed", "mr_state", am.State)
			l.s.step(ctx, "publish.armed", b.ID)
		}
	}
	// Reconcile should look at the MR soon, not when the publish lease runs out. A
	// scheduling hint only: it does not bump version.
	if err := l.s.st.BatchMarkDue(ctx, rb.ID); err != nil && !isCanceled(err) {
		log.Debug("mark due failed", "err", err)
	}
	kick(l.s.kickReconcile)
	return nil
}

// lostRecord handles a BatchRecordMR that lost its guard: someone else reserved or
// settled the batch while we published. Re-read it: if it is settled, our MR must not
// stay open (fencing); if it is still active, whoever holds it either records this same
// MR (EnsureMR is idempotent by branch) or settles the batch and closes the MR through
// the branch — and the orphan sweep is the backstop — so we do nothing.
func (l *publishLoop) lostRecord(ctx context.Context, b domain.Batch, m mr.MergeRequest, log *slog.Logger) error {
	cur, err := l.s.st.BatchGet(ctx, b.ID)
	if err != nil {
		return err
	}
	l.s.m.outcomes.WithLabelValues("publish", "lost_race").Inc()
	if cur.Status.Active() {
		log.Debug("recording the MR lost a race; the batch is held by another replica",
			"mr_iid", m.IID, "recorded_iid", cur.MRIID)
		return nil
	}
	if cur.Status != domain.BatchFailed {
		return nil // SUCCEEDED: the MR merged, nothing to fence
	}
	log.Info("batch settled while publishing; closing the MR we made", "mr_iid", m.IID)
	if m.State == mr.StateOpened {
		cm, err := l.s.gl.CloseMR(ctx, b.Repo, m.IID)
		if err != nil {
			return err
		}
		m = cm
	}
	if m.State == mr.StateMerged {
		// Merged in between: the database follows the repository. cur is the row as
		// stored: with no MR recorded, mergedAfterFailed records this one before the
		// success settle (setting cur.MRIID here skipped that write, and the batch went
		// SUCCEEDED without an MR; found by the protocol model, docs/MODEL.md).
		return l.s.mergedAfterFailed(ctx, cur, m, log)
	}
	return nil
}

// fileActions turns the members into one commit's file actions: grant → write the
// binding file, revoke → delete it. Members are sorted by operation id; should two
// touch the same file (the binding state machine prevents it), the newest wins, because
// one commit cannot carry two actions on one path.
func fileActions(members []domain.Operation) ([]mr.FileAction, error) {
	byPath := map[string]domain.Operation{}
	for _, op := range members {
		p := domain.BindingPath(op.Subject, op.Target)
		if prev, ok := byPath[p]; ok && prev.CreatedAt.After(op.CreatedAt) {
			continue
		}
		byPath[p] = op
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	out := make([]mr.FileAction, 0, len(paths))
	for _, p := range paths {
		op := byPath[p]
		switch op.Action {
		case domain.ActionGrant:
			content, err := bindingFile(op)
			if err != nil {
				return nil, fmt.Errorf("binding file of operation %s: %w", op.OperationID, err)
			}
			out = append(out, mr.FileAction{Path: p, Content: content})
		case domain.ActionRevoke:
			out = append(out, mr.FileAction{Path: p, Delete: true})
		default:
			return nil, errors.New("operation " + op.OperationID + ": unknown action " + string(op.Action))
		}
	}
	return out, nil
}

// bindingFile renders a grant's file, with the operation's attributes when it has any.
func bindingFile(op domain.Operation) (string, error) {
	return mr.BindingYAMLWithAttributes(op.Subject, op.Target, op.OperationID, op.ExpiresAt, op.Attributes)
}

func mrTitle(b domain.Batch, members []domain.Operation) string {
	return fmt.Sprintf("batcherd: batch %d for %s (%d operations)", b.ID, b.Repo, len(members))
}

// maxPrincipalTrailers bounds the principals a batch commit names per trailer key: a
// batch may have thousands of members, and the MR description carries every member's
// requester and approver anyway.
const maxPrincipalTrailers = 20

// commitMessage is the batch commit's message: a summary line and, as git trailers,
// the distinct principals that requested and approved its members
// ("Batcherd-Requested-By: alice", "Batcherd-Approved-By: bob"; sorted, at most
// maxPrincipalTrailers each, then "Batcherd-Principals-Omitted: <n>"). The mr layer
// appends its own trailers (Batcherd-Batch, …) to the same paragraph.
func commitMessage(b domain.Batch, members []domain.Operation) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "batcherd: batch %d (%d operations)\n\n", b.ID, len(members))
	requested, approved := map[string]bool{}, map[string]bool{}
	for _, op := range members {
		if op.RequestedBy != "" {
			requested[mr.TrailerValue(op.RequestedBy)] = true
		}
		if op.ApprovedBy != "" {
			approved[mr.TrailerValue(op.ApprovedBy)] = true
		}
	}
	omitted := 0
	for _, t := range []struct {
		key   string
		names map[string]bool
	}{{"Batcherd-Requested-By", requested}, {"Batcherd-Approved-By", approved}} {
		names := slices.Sorted(maps.Keys(t.names))
		if len(names) > maxPrincipalTrailers {
			omitted += len(names) - maxPrincipalTrailers
			names = names[:maxPrincipalTrailers]
		}
		for _, n := range names {
			fmt.Fprintf(&sb, "%s: %s\n", t.key, n)
		}
	}
	if omitted > 0 {
		fmt.Fprintf(&sb, "Batcherd-Principals-Omitted: %d\n", omitted)
	}
	return sb.String()
}

// mrDescription lists the batch id and every operation id (a contract: README, "Files
// written to the repository"), with who requested and who approved each, why the round
// exists and why each member is in it (first try, retry, half k of a bisection at
// depth d). Text from requests (subject, target, principal names) goes through
// mr.MarkdownLiteral, so it cannot become Markdown, a mention, a reference or a closing
// keyword.
//
// GitLab refuses a description over 1,048,576 characters. A batch of thousands of
// members with long names would pass that, so past maxDescription bytes the members are
// listed compactly instead: grouped by (requester, approver), names cut to 32
// characters, each group's operation ids on one line — every id and who requested and
// approved it, with the full record a GET /v1/operations/{id} away.
func mrDescription(b domain.Batch, members []domain.Operation, why map[string]string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Batch %d for `%s`, opened by batcherd.\n\n", b.ID, b.Repo)
	fmt.Fprintf(&sb, "batch_id: %d\n\nRound: %s\n\nOperations (%d):\n\n", b.ID, roundWhy(b), len(members))
	head := sb.Len()
	for _, op := range members {
		fmt.Fprintf(&sb, "- %s %s %s → %s", op.OperationID, op.Action, mr.MarkdownLiteral(op.Subject), mr.MarkdownLiteral(op.Target))
		fmt.Fprintf(&sb, " — requested by %s, approved by %s", principalMD(op.RequestedBy, 0), principalMD(op.ApprovedBy, 0))
		if w := why[op.OperationID]; w != "" {
			fmt.Fprintf(&sb, " — %s", w)
		}
		sb.WriteString("\n")
	}
	if sb.Len() <= maxDescription {
		return sb.String()
	}
	full := sb.String()
	sb.Reset()
	sb.WriteString(full[:head])
	sb.WriteString("(Listed compactly: the full list would exceed GitLab's description limit. Names are cut to 32 characters.)\n\n")
	type pair struct{ requested, approved string }
	groups := map[pair][]string{}
	var order []pair
	for _, op := range members {
		k := pair{op.RequestedBy, op.ApprovedBy}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], op.OperationID)
	}
	for _, k := range order {
		fmt.Fprintf(&sb, "- requested by %s, approved by %s: %s\n", principalMD(k.requested, 32), principalMD(k.approved, 32), strings.Join(groups[k], " "))
	}
	return sb.String()
}

// maxDescription is the MR description size past which it is listed compactly, with
// room under GitLab's 1,048,576-character limit (bytes are at least characters).
const maxDescription = 1_000_000

// principalMD is a principal's name for the MR description, cut to cut characters when
// cut > 0 ("(not recorded)" for an operation from before principals were recorded).
func principalMD(name string, cut int) string {
	if name == "" {
		return "(not recorded)"
	}
	if r := []rune(name); cut > 0 && len(r) > cut {
		name = string(r[:cut]) + "…"
	}
	return mr.MarkdownLiteral(name)
}

// batchBranch is the batch's source branch as its claim recorded it
// (batcherd/<installation>/batch-<id>; batcherd/batch-<id> for a batch claimed before
// installations had ids).
// batchRef names batch b to GitLab: its id and its claim time, which its commits carry
// (domain.TrailerBatchClaimed), so a batch of a re-issued id never adopts another's MR.
func batchRef(b domain.Batch) mr.BatchRef { return mr.BatchRef{ID: b.ID, Claimed: b.CreatedAt} }

func batchBranch(b domain.Batch) string {
	if b.SourceBranch != "" {
		return b.SourceBranch
	}
	return domain.LegacyBranchName(b.ID)
}

// isForeign reports an MR on the batch's branch that is not the batch's.
func isForeign(err error) bool {
	var f *mr.ForeignMRError
	return errors.As(err, &f)
}

// foreign fails batch b at once because the MR on its branch is someone else's: it is
// never recorded, armed, merged or closed by batcherd, and the failure names it. The
// members are retried in a new batch (a new id, so a new branch) like after an
// infrastructure failure.
func (l *publishLoop) foreign(ctx context.Context, b domain.Batch, cause error, log *slog.Logger) error {
	l.s.m.outcomes.WithLabelValues("publish", "foreign_mr").Inc()
	log.Error("the MR on the batch's branch is not this batch's; failing the batch and leaving the MR alone", "err", cause)
	_, err := l.s.settleFailure(ctx, b, failure{domain.ClassForeignMR, cause.Error()}, log)
	return err
}

// gitlabMessage is GitLab's own words in a layer error, else the error's text.
func gitlabMessage(err error) string {
	var e *mr.Error
	if errors.As(err, &e) && e.Message != "" {
		return fmt.Sprintf("%d %s", e.Status, e.Message)
	}
	return err.Error()
}
