package store

// Failure isolation (issue #9, issue 20): the store side of retry, bisection and quarantine.
//
// A failed batch's members either fail (with a reason) or go back to the waiting set in
// a claim group: a retry of the same members ("b<batch>.r", or the search part's own
// group) or one part of a bisection ("s<root>.<batch>.<part>", domain.SearchGroup); the
// same settlement may defer the failed part's later siblings into the search's
// remainder group ("s<root>.rest", Deferral). Waiting rows keep their created_at, so the group of a
// failed batch is older than anything admitted since and the next claims take it first
// (bystanders keep their queue position). BatchClaim takes the group of the oldest
// waiting row only, with the same read, guarded UPDATE and affected-row check as
// always (I2, I3). What to do with each member is the scanner's policy; the store
// applies a plan in one transaction, batch guard first, so two settlers cannot both
// requeue a member (the second fails at its first statement and changes nothing).

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// whyLen bounds merge_batch_member.why.
const whyLen = 255

// groupLen bounds merge_batch_request.grp and merge_batch.grp.
const groupLen = 64

// why says, for the member history and the MR description, why a waiting row is in the
// round that claims it. Attempt numbers count charged attempts (first try and retries).
func (w waitingRow) why() string {
	parent := int64(0)
	if w.ParentID != nil {
		parent = *w.ParentID
	}
	switch {
	case w.Kind == domain.KindBisect && w.Half == 0:
		// Deferred (Deferral): a sibling of a part that failed, waiting for the end of
		// that part's search.
		return fmt.Sprintf("remainder of a bisection: split from failed batch %d, deferred until the failing part's search ended", parent)
	case w.Kind == domain.KindBisect:
		return fmt.Sprintf("part %d of failed batch %d, bisection depth %d", w.Half, parent, w.Depth)
	case strings.HasPrefix(w.Kind, domain.KindRetryPrefix):
		return fmt.Sprintf("retry %d of failed batch %d after a %s failure (attempt %d)",
			w.Retries, parent, strings.TrimPrefix(w.Kind, domain.KindRetryPrefix), w.Tries+1)
	case w.Tries > 0:
		return fmt.Sprintf("first try (attempt %d)", w.Tries+1)
	}
	return "first try"
}

// WaitingMember is a member of an active batch with its waiting-row bookkeeping: what
// the failure policy needs to plan the members' fates.
type WaitingMember struct {
	OperationID string    `db:"operation_id"`
	RequestID   int64     `db:"id"`
	Grp         string    `db:"grp"`
	Kind        string    `db:"kind"`
	ParentID    *int64    `db:"parent_id"`
	Depth       int       `db:"depth"`
	Half        int       `db:"half"`
	Retries     int       `db:"retries"`
	Tries       int       `db:"tries"` // charged attempts so far, this batch included
	CreatedAt   time.Time `db:"created_at"`
}

// qBatchWaiting: the waiting rows a batch claimed, in queue order: the batch row, then
// idx_repo_waiting's (repo, batch_id) prefix, whose (lane, created_at, id) tail is that
// order (urgent first, then oldest).
const qBatchWaiting = `SELECT r.id, r.operation_id, r.grp, r.kind, r.parent_id, r.depth, r.half, r.retries, r.tries, r.created_at
	FROM merge_batch b JOIN merge_batch_request r ON r.repo = b.repo AND r.batch_id = b.id
	WHERE b.id = ? ORDER BY r.lane, r.created_at, r.id`

// qDeleteBatchWaiting deletes the waiting rows a batch still claims, found like
// qBatchWaiting (the settlement already holds the batch row).
const qDeleteBatchWaiting = `DELETE r FROM merge_batch_request r
	JOIN merge_batch b ON r.repo = b.repo AND r.batch_id = b.id WHERE b.id = ?`

// BatchWaitingMembers returns the waiting rows batch id claimed, in queue order
// (created_at, id). While the batch is active nothing but its own settlement writes
// these rows, and that settlement is guarded on the batch's version, so a plan made
// from this read is applied to exactly these rows or not at all.
func (s *Store) BatchWaitingMembers(ctx context.Context, batchID int64) ([]WaitingMember, error) {
	out := []WaitingMember{}
	err := s.db.SelectContext(ctx, &out, qBatchWaiting, batchID)
	return out, translate(err)
}

// MemberFate says what the settlement of a failed batch does with one member.
type MemberFate struct {
	OperationID string
	// Requeue when Group is not empty: the operation goes back to queued (binding
	// unchanged) and its waiting row back to the waiting set in Group, created_at kept,
	// with the group's Kind, Depth, Half and Retries; the failed batch is its parent.
	Group   string
	Kind    string
	Depth   int
	Half    int
	Retries int
	// Fail when Group is empty: the operation fails with Code and Message (binding:
	// grant → failed, revoke → active) and its waiting row is deleted.
	Code, Message string
	// Event is the member's outcome event (bisected, retry_infra, culprit,
	// closed_by_user, max_attempts, failed, …) and Detail its text. Empty Event: failed
	// for a failure, "requeued" for a requeue.
	Event, Detail string
}

// BatchSettleRequeue settles an active batch as failed and applies plan to its members,
// in one READ COMMITTED transaction:
//
//  1. the batch guard: status = from AND version = version → FAILED with code, message
//     and fail_class = code (ErrLostRace when another settler was first);
//  2. lock the members still in_batch in this batch, in key order;
//  3. requeued members, group by group: operation in_batch → queued, batch_id NULL
//     (binding unchanged: still pending / revoking); waiting row batch_id NULL with the
//     group's columns, created_at unchanged — every write guarded and its affected-row
//     count checked;
//     3b. the Deferral, if any: other groups' waiting rows into the search's remainder;
//  4. failed members (those the plan fails, and any locked member the plan does not
//     mention, which fails with the batch's code): in_batch → failed with their reason,
//     bindings, then the batch's remaining waiting rows deleted;
//  5. events, set-based: batch_failed for the batch and every member, then each
//     member's outcome event.
func (s *Store) BatchSettleRequeue(ctx context.Context, id int64, from domain.BatchStatus, version int64, class domain.FailureClass, message string, plan []MemberFate) (domain.Batch, error) {
	return s.BatchSettleIsolate(ctx, id, from, version, class, message, plan, Deferral{})
}

// Deferral moves waiting rows of other groups in the same settlement: the later parts
// of the failed part's parent (its siblings, groups starting with Prefix, still
// waiting) into the search's remainder group Into, created_at, lane, kind, parent and
// depth kept (domain.SearchGroup). The zero Deferral moves nothing.
type Deferral struct {
	Repo   string
	Prefix string // domain.SiblingPrefix: ends with "."
	Into   string // domain.RestGroup
}

// qDeferSiblings moves the still waiting rows of a group-name range of one repository
// into another group: a range of idx_repo_group_waiting (repo, batch_id IS NULL, grp
// from the prefix to the prefix with its last byte + 1; the table is utf8mb4_bin, so
// byte order), locking only the rows it moves (READ COMMITTED). Admissions insert
// ordinary rows (group "") outside that range (I3).
const qDeferSiblings = `UPDATE merge_batch_request SET grp = ?, half = 0
	WHERE repo = ? AND batch_id IS NULL AND grp >= ? AND grp < ?`

// deferSiblings applies d in the settlement's transaction and returns how many waiting
// rows it moved. No affected-row check: the siblings are whatever still waits (a
// withdrawal may have taken one); none of them is claimed meanwhile, since the failed
// batch held the repository's slot until this transaction commits (I1).
func deferSiblings(ctx context.Context, tx *sqlx.Tx, d Deferral) (int64, error) {
	if d.Prefix == "" {
		return 0, nil
	}
	r, err := tx.ExecContext(ctx, qDeferSiblings, d.Into, d.Repo, d.Prefix, prefixEnd(d.Prefix))
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// BatchSettleIsolate is BatchSettleRequeue that also applies a Deferral (step 3b, after
// the requeue of the batch's own members), in the same transaction.
func (s *Store) BatchSettleIsolate(ctx context.Context, id int64, from domain.BatchStatus, version int64, class domain.FailureClass, message string, plan []MemberFate, d Deferral) (domain.Batch, error) {
	if d.Prefix != "" && (!strings.HasSuffix(d.Prefix, ".") || d.Into == "" || d.Repo == "" || len(d.Into) > groupLen) {
		return domain.Batch{}, fmt.Errorf("store: bad deferral %+v", d)
	}
	if !from.Active() {
		return domain.Batch{}, fmt.Errorf("store: cannot settle a batch as failed from status %s", from)
	}
	code, message := truncRunes(string(class), errorCodeLen), truncRunes(message, errorMessageLen)
	fates := make(map[string]MemberFate, len(plan))
	for _, f := range plan {
		if len(f.Group) > groupLen {
			return domain.Batch{}, fmt.Errorf("store: group %q is longer than %d", f.Group, groupLen)
		}
		fates[f.OperationID] = f
	}
	var b domain.Batch
	err := s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		if err := settleBatchRow(ctx, tx, id, from, version, domain.BatchFailed, code, message, code); err != nil {
			return err
		}
		members, err := memberIDs(ctx, tx, id)
		if err != nil {
			return err
		}
		ops, err := lockMembers(ctx, tx, id, members, domain.OpInBatch)
		if err != nil {
			return err
		}
		sp := sortFates(ops, fates, code, message)
		if err := requeueGroups(ctx, tx, id, sp); err != nil {
			return err
		}
		deferred, err := deferSiblings(ctx, tx, d)
		if err != nil {
			return err
		}
		if err := failMembers(ctx, tx, id, sp); err != nil {
			return err
		}
		if err := settleFailureEvents(ctx, tx, id, ops, len(members), sp, fates, code, message, d, deferred); err != nil {
			return err
		}
		if b, err = getBatch(ctx, tx, id); err != nil {
			return err
		}
		b.OperationIDs = members
		// Requeued members (bisection, infrastructure retry) are not failed: they are
		// queued again and report nothing until they merge or fail for good.
		evs := []outEvent{batchEvent(EventTypeBatchFailed, b)}
		for _, r := range sp.reasons {
			evs = append(evs, eventsOfSettled(EventTypeOperationFailed, b, sp.failures[r], domain.OpFailed, r.code, r.message)...)
		}
		return s.writeOutbox(ctx, tx, evs)
	})
	return b, err
}

// failReason is the error code and message a failed member is failed with.
type failReason struct{ code, message string }

// settlePlan is a failure plan sorted for writing: the requeue groups (names in order)
// and the failed members by reason (reasons in order, failed by operation id).
type settlePlan struct {
	groups   map[string][]string   // group → operation ids, in lock order
	groupOf  map[string]MemberFate // group → its first member's fate (a group is uniform)
	names    []string
	failures map[failReason][]settledOp
	reasons  []failReason
	failed   []settledOp
}

// sortFates sorts the locked members into requeue groups and failure reasons: a member
// with a group is requeued in it; any other — failed by the plan, or one the plan does
// not mention — fails with its own reason, or the batch's code and message.
func sortFates(ops []settledOp, fates map[string]MemberFate, code, message string) settlePlan {
	sp := settlePlan{groups: map[string][]string{}, groupOf: map[string]MemberFate{}, failures: map[failReason][]settledOp{}}
	for _, o := range ops {
		f, ok := fates[o.OperationID]
		if ok && f.Group != "" {
			sp.groups[f.Group] = append(sp.groups[f.Group], o.OperationID)
			if _, seen := sp.groupOf[f.Group]; !seen {
				sp.groupOf[f.Group] = f
			}
			continue
		}
		r := failReason{code, message}
		if ok && f.Code != "" {
			r = failReason{truncRunes(f.Code, errorCodeLen), truncRunes(f.Message, errorMessageLen)}
		}
		sp.failures[r] = append(sp.failures[r], o)
		sp.failed = append(sp.failed, o)
	}
	for g := range sp.groups {
		sp.names = append(sp.names, g)
	}
	slices.Sort(sp.names)
	for r := range sp.failures {
		sp.reasons = append(sp.reasons, r)
	}
	slices.SortFunc(sp.reasons, func(a, b failReason) int {
		return strings.Compare(a.code+"\x00"+a.message, b.code+"\x00"+b.message)
	})
	slices.SortFunc(sp.failed, func(a, b settledOp) int { return strings.Compare(a.OperationID, b.OperationID) })
	return sp
}

// requeueGroups is step 3: each group's operations in_batch → queued and their waiting
// rows back in the waiting set with the group's columns.
func requeueGroups(ctx context.Context, tx *sqlx.Tx, id int64, sp settlePlan) error {
	for _, g := range sp.names {
		ids, f := sp.groups[g], sp.groupOf[g]
		if err := moveOps(ctx, tx, id, ids, domain.OpInBatch, domain.OpQueued, "", ""); err != nil {
			return err
		}
		if err := requeueRows(ctx, tx, id, ids, f); err != nil {
			return err
		}
	}
	return nil
}

// failMembers is step 4: failed members in_batch → failed with their reason, their
// bindings (a failed grant leaves no file: failed; a failed revoke leaves it: active),
// then the waiting rows still claimed by this batch — the failed members' (and strays)
// — deleted, so that an operator retry can admit the operation again (the waiting set
// is unique on operation_id). The member history keeps the record.
func failMembers(ctx context.Context, tx *sqlx.Tx, id int64, sp settlePlan) error {
	for _, r := range sp.reasons {
		if err := moveOps(ctx, tx, id, opIDsOf(sp.failures[r]), domain.OpInBatch, domain.OpFailed, r.code, r.message); err != nil {
			return err
		}
	}
	if err := moveBindings(ctx, tx, sp.failed, domain.BindingPending, domain.BindingFailed, domain.BindingRevoking, domain.BindingActive); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, qDeleteBatchWaiting, id)
	return err
}

// settleFailureEvents is step 5: batch_failed for the batch and every member, then each
// member's outcome event.
func settleFailureEvents(ctx context.Context, tx *sqlx.Tx, id int64, ops []settledOp, nMembers int, sp settlePlan,
	fates map[string]MemberFate, code, message string, d Deferral, deferred int64) error {
	batchDetail := fmt.Sprintf("%s: %s; %d of %d member(s): %d failed, %d requeued", code, message,
		len(ops), nMembers, len(sp.failed), len(ops)-len(sp.failed))
	for _, g := range sp.names {
		batchDetail += fmt.Sprintf("; group %s: %d", g, len(sp.groups[g]))
	}
	if deferred > 0 {
		batchDetail += fmt.Sprintf("; %d waiting member(s) of groups %s* deferred to %s", deferred, d.Prefix, d.Into)
	}
	if err := recordBatchEvent(ctx, tx, id, EventBatchFailed, "failed", batchDetail); err != nil {
		return err
	}
	evs := make([]memberEvent, 0, 2*len(ops))
	for _, o := range ops {
		evs = append(evs, memberEvent{op: o.OperationID, code: EventMemberBatchFailed, verb: "failed",
			detail: fmt.Sprintf("batch %d failed: %s: %s", id, code, message)})
	}
	for _, o := range ops {
		f, ok := fates[o.OperationID]
		ev, detail := outcomeEvent(f, ok, code, message)
		evs = append(evs, memberEvent{op: o.OperationID, code: ev, verb: "outcome", detail: detail})
	}
	return insertMemberEvents(ctx, tx, id, evs)
}

// outcomeEvent is a member's outcome event code and text: the plan's own when it gave
// them; otherwise failed with the member's (or the batch's) reason, or requeued in its
// group.
func outcomeEvent(f MemberFate, inPlan bool, code, message string) (string, string) {
	ev, detail := f.Event, f.Detail
	if !inPlan || f.Group == "" {
		if ev == "" {
			ev = EventMemberFailed
		}
		if detail == "" {
			c, m := code, message
			if inPlan && f.Code != "" {
				c, m = f.Code, f.Message
			}
			detail = c + ": " + m
		}
	} else if ev == "" {
		ev = "requeued"
	}
	if detail == "" {
		detail = "requeued in group " + f.Group
	}
	return ev, detail
}

// requeueRows puts the claimed waiting rows of ids back in the waiting set in group f,
// created_at unchanged, guarded on still being claimed by batch id.
func requeueRows(ctx context.Context, tx *sqlx.Tx, id int64, ids []string, f MemberFate) error {
	kind := f.Kind
	if kind == "" {
		kind = domain.KindFirstTry
	}
	return forChunks(len(ids), maxInPlaceholders, func(lo, hi int) error {
		args := make([]any, 0, hi-lo+7)
		args = append(args, f.Group, kind, id, f.Depth, f.Half, f.Retries, id)
		for _, o := range ids[lo:hi] {
			args = append(args, o)
		}
		r, err := tx.ExecContext(ctx,
			`UPDATE merge_batch_request SET batch_id = NULL, grp = ?, kind = ?, parent_id = ?, depth = ?, half = ?, retries = ?
			  WHERE batch_id = ? AND operation_id IN (`+inPlaceholders(hi-lo)+`)`, args...)
		if err != nil {
			return err
		}
		// A member without its claimed waiting row would be queued and never claimed:
		// refuse the whole settlement rather than strand it.
		if n, err := r.RowsAffected(); err != nil {
			return err
		} else if n != int64(hi-lo) {
			return fmt.Errorf("store: requeue of batch %d: %d of %d waiting rows found: %w", id, n, hi-lo, ErrLostRace)
		}
		return nil
	})
}

// BatchMarkFailing records, guarded on version, the failure class batcherd is about to
// settle an active batch with, before it closes the batch's MR. A closed MR on a batch
// without it was closed by someone else (a human); with it, by a batcherd settle that
// did not finish, which the next pass resumes with the same class.
func (s *Store) BatchMarkFailing(ctx context.Context, id, version int64, class domain.FailureClass) (domain.Batch, error) {
	return s.guardedBatchWrite(ctx, id, version, "fail_class = ?", "status IN (1, 4)", truncRunes(string(class), 32))
}

// BatchMemberReasons returns why each member is in batch id (merge_batch_member.why),
// by operation id — what the MR description shows.
func (s *Store) BatchMemberReasons(ctx context.Context, batchID int64) (map[string]string, error) {
	var rows []struct {
		OperationID string `db:"operation_id"`
		Why         string `db:"why"`
	}
	if err := s.db.SelectContext(ctx, &rows,
		"SELECT operation_id, why FROM merge_batch_member WHERE batch_id = ?", batchID); err != nil {
		return nil, translate(err)
	}
	out := make(map[string]string, len(rows))
	for _, r := range rows {
		out[r.OperationID] = r.Why
	}
	return out, nil
}

// BatchMergeLatencies returns, for each member merged by batch id, the seconds from the
// operation's creation to the batch's settlement (DB clock): time to merge.
func (s *Store) BatchMergeLatencies(ctx context.Context, batchID int64) ([]float64, error) {
	out := []float64{}
	err := s.db.SelectContext(ctx, &out, `SELECT TIMESTAMPDIFF(MICROSECOND, o.created_at, b.finished_at) / 1000000
		FROM merge_batch b
		JOIN merge_batch_member m ON m.batch_id = b.id
		JOIN operation o ON o.operation_id = m.operation_id
		WHERE b.id = ? AND b.status = 2 AND b.finished_at IS NOT NULL
		  AND o.status = 'merged' AND o.batch_id = b.id`, batchID)
	return out, translate(err)
}

// EventSearchResumed: the batch event recorded on a failed part whose every part then
// merged (its failure was a flake), when its deferred siblings go back from the
// remainder to their parent's chain (SearchResume).
const EventSearchResumed = "bisection_resumed"

const (
	// qPartsWaiting: does any part of one failed batch still wait (the range of
	// idx_repo_group_waiting that qDeferSiblings moves)?
	qPartsWaiting = `SELECT EXISTS (SELECT 1 FROM merge_batch_request
		WHERE repo = ? AND batch_id IS NULL AND grp >= ? AND grp < ?)`
	// qDeferredOf: the remainder's rows that are parts of one failed batch, in queue
	// order (idx_repo_group_waiting, then parent_id), locked so a claim that read them
	// waits for the regrouping and then takes them as it read them.
	qDeferredOf = `SELECT id FROM merge_batch_request
		WHERE repo = ? AND batch_id IS NULL AND grp = ? AND parent_id = ?
		ORDER BY lane, created_at, id FOR UPDATE`
)

// SearchResume is what follows the merge of a batch of group merged (a part of failed
// batch q = merged.Parent), in one READ COMMITTED transaction: when no later part of q
// waits any more, every part of q merged, and when q was itself a part of failed batch
// p (domain.Resume), the parts of p deferred to the remainder when q failed go back to
// p's chain, split as domain.ResumeParts — created_at, lane, kind, parent and depth
// kept. It returns how many waiting rows it moved (0: nothing to resume).
//
// It runs after the merge's own settlement, outside the slot, so a claim may take the
// remainder meanwhile: rows it already claimed are not read here, and rows a claim read
// but had not yet claimed are locked here first, so that claim takes them afterwards
// as it read them, all in one batch (the remainder run whole, as without the resume).
// Every UPDATE checks its affected rows; a shortfall rolls everything back
// (ErrLostRace). A crash before the commit only loses the shortcut: the remainder then
// runs whole, fails, and is searched.
func (s *Store) SearchResume(ctx context.Context, repo string, merged domain.SearchGroup) (int64, error) {
	if merged.Rest() {
		return 0, nil
	}
	var moved int64
	err := s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		prefix := domain.SiblingPrefix(merged.Root, merged.Parent)
		var waiting bool
		if err := tx.GetContext(ctx, &waiting, qPartsWaiting, repo, prefix, prefixEnd(prefix)); err != nil || waiting {
			return err
		}
		var qGroup []string
		if err := tx.SelectContext(ctx, &qGroup, "SELECT grp FROM merge_batch WHERE id = ? AND repo = ?", merged.Parent, repo); err != nil || len(qGroup) == 0 {
			return err
		}
		parent, first, ok := domain.Resume(merged, qGroup[0])
		if !ok {
			return nil
		}
		var ids []int64
		if err := tx.SelectContext(ctx, &ids, qDeferredOf, repo, domain.RestGroup(merged.Root), parent); err != nil || len(ids) == 0 {
			return err
		}
		at := 0
		for k, size := range domain.ResumeParts(len(ids)) {
			part := ids[at : at+size]
			at += size
			if err := forChunks(len(part), maxInPlaceholders, func(lo, hi int) error {
				args := []any{domain.PartGroup(merged.Root, parent, first+k), first + k}
				for _, id := range part[lo:hi] {
					args = append(args, id)
				}
				r, err := tx.ExecContext(ctx, "UPDATE merge_batch_request SET grp = ?, half = ? WHERE batch_id IS NULL AND id IN ("+
					inPlaceholders(hi-lo)+")", args...)
				if err != nil {
					return err
				}
				return mustAffect(r, int64(hi-lo))
			}); err != nil {
				return err
			}
		}
		moved = int64(len(ids))
		return recordBatchEvent(ctx, tx, merged.Parent, EventSearchResumed, "resumed",
			fmt.Sprintf("every part of batch %d merged, so its failure was a flake: the %d member(s) of failed batch %d deferred when it failed go back to that batch's parts from part %d on (%s)",
				merged.Parent, len(ids), parent, first, joinSizes(domain.ResumeParts(len(ids)))))
	})
	return moved, err
}

// prefixEnd is the first string after every string that starts with prefix (its last
// byte + 1), for a range read of a utf8mb4_bin column.
func prefixEnd(prefix string) string {
	return prefix[:len(prefix)-1] + string(prefix[len(prefix)-1]+1)
}

func joinSizes(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return "parts of " + strings.Join(s, ", ")
}
