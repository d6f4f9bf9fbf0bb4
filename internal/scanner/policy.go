package scanner

// Failure isolation (issue #9): classify each batch failure from GitLab's state, then
// decide each member's fate — retry the same members, bisect, or fail with a reason.
// The decision is pure (this file); the store applies it in one guarded transaction
// (store.BatchSettleIsolate).
//
//	class               cause                                      what happens to the members
//	test                pipeline failed, job failure_reason         bisect: split into parts (first half, first
//	                    script_failure                              half of the rest, …; domain.SplitParts),
//	                                                                later rounds take one part at a time; a
//	                                                                passing part merges and the next part is
//	                                                                already the next split (inference); a
//	                                                                failing part is split again and its later
//	                                                                siblings deferred to the search's
//	                                                                remainder, run as one batch at the end; a
//	                                                                failing batch of one member → that member
//	                                                                failed "culprit"
//	infra               pipeline failed for another reason          retry the same members once as one group
//	                    (runner_system_failure, stuck_or_timeout_   (InfraRetries), no bisection; then failed
//	                    failure, scheduler_failure, api_failure,    with the class as reason
//	                    any unknown reason), or canceled
//	timeout             batch older than BatchTimeout               as infra
//	gitlab_unavailable  timed out without an MR ever recorded       as infra
//	mr_missing          the batch's MR no longer exists             as infra
//	foreign_mr          the MR on the batch's branch is not the     as infra (a new batch has a new branch);
//	                    batch's (its commits lack this              the MR is left alone
//	                    installation's trailers for the batch)
//	gitlab_refused      GitLab refused the batch's commit for good  as test: bisect down to the member whose
//	                    (400/422: a path it will not store)         file GitLab refuses
//	conflict            merge conflict / need rebase                retry once rebuilt on the new target head
//	                                                                (ConflictRetries), then bisect
//	unknown             pipeline failed, no failure_reason readable as conflict: retry once, then bisect
//	closed_by_user      MR closed, not by batcherd                  failed "closed_by_user", no retry
//	manual_settle       an operator settled the batch               failed "manual_settle", no retry
//
// Every requeue of a retry is charged against MaxAttempts (the first try is charged at
// its claim too); a member whose charged attempts reached MaxAttempts fails with
// "max_attempts" instead of being retried. Bisection rounds are not charged: they
// narrow down someone else's failure, and their number is bounded by ⌈log2 batch size⌉
// per culprit, plus the remainder's run.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

// Failure classes (domain.FailureClass): short names for this package.
const ()

// Member failure reasons (operation error codes) besides the classes.
const ()

// Member outcome event codes (audit_event.code) written by a failure settlement.
const (
	EventBisected     = "bisected"
	EventCulprit      = "culprit"
	EventClosedByUser = "closed_by_user"
	EventMaxAttempts  = "max_attempts"
	// EventRetryPrefix + class: retry_infra, retry_timeout, retry_conflict, …
	EventRetryPrefix = "retry_"
)

// FailureMode says what reconcile does when a batch's pipeline fails or its MR
// conflicts (BATCHERD_ON_FAILURE).
type FailureMode string

const (
	// FailureIsolate classifies the failure and applies the policy at once.
	FailureIsolate FailureMode = "isolate"
	// FailureBlock keeps the batch BLOCKED (holding the slot) for an operator to retry
	// the pipeline or fix the conflict; the timeout then fails it through the policy.
	FailureBlock FailureMode = "block"
)

// policy is the failure policy of one scanner (from Config).
type policy struct {
	infraRetries    int
	conflictRetries int
	bisect          bool
	maxAttempts     int
}

// failure is a classified batch failure.
type failure struct {
	class domain.FailureClass
	msg   string
}

// pipelineClass classifies a failed (or canceled) head pipeline: canceled is infra
// (someone or something stopped it; nothing the members changed); a failed one by the
// failure_reason of its first failed job, as domain.ClassOfFailureReason maps every
// documented reason.
func pipelineClass(status, reason string) domain.FailureClass {
	if status == "canceled" {
		return domain.ClassInfra
	}
	return domain.ClassOfFailureReason(reason)
}

// retriable reports whether a failure class may be overridden by what GitLab shows
// (a human closed the MR): the operator's and the empty-batch settlements are final.
func retriable(class domain.FailureClass) bool { return !class.Final() }

// planOutcome summarises a plan for logs and metrics.
type planOutcome struct {
	action     string // fail, retry, bisect, culprit
	retried    int
	bisectedTo int // depth of the halves when bisected
	culprits   int
	maxed      int
	// deferral: the failed part's later siblings, deferred to the search's remainder
	// in the same settlement (isolate).
	deferral store.Deferral
}

// plan decides the fate of each member of failed batch b. ms are the batch's waiting
// rows in queue order (store.BatchWaitingMembers).
func (p policy) plan(b domain.Batch, f failure, ms []store.WaitingMember) ([]store.MemberFate, planOutcome) {
	retries := 0
	for _, m := range ms {
		retries = max(retries, m.Retries)
	}
	switch f.class {
	case domain.ClassClosedByUser:
		return p.failAll(ms, string(domain.ClassClosedByUser), EventClosedByUser,
			fmt.Sprintf("merge request of batch %d was closed by someone else than batcherd: no retry", b.ID)), planOutcome{action: "fail"}
	case domain.ClassInfra, domain.ClassTimeout, domain.ClassUnavailable, domain.ClassMRMissing, domain.ClassCIBlocked, domain.ClassForeignMR:
		if retries < p.infraRetries {
			return p.retry(b, f, ms, retries)
		}
		return p.failAll(ms, string(f.class), store.EventMemberFailed,
				fmt.Sprintf("batch %d failed (%s) after %d retr%s of the same members: %s", b.ID, f.class, retries, plural(retries, "y", "ies"), f.msg)),
			planOutcome{action: "fail"}
	case domain.ClassConflict, domain.ClassUnknown:
		if retries < p.conflictRetries {
			return p.retry(b, f, ms, retries)
		}
		return p.isolate(b, f, ms)
	case domain.ClassTest, domain.ClassRefused:
		return p.isolate(b, f, ms)
	}
	return p.failAll(ms, string(f.class), store.EventMemberFailed, string(f.class)+": "+f.msg), planOutcome{action: "fail"}
}

func (p policy) failAll(ms []store.WaitingMember, code, event, detail string) []store.MemberFate {
	out := make([]store.MemberFate, len(ms))
	for i, m := range ms {
		out[i] = store.MemberFate{OperationID: m.OperationID, Code: code, Message: detail, Event: event, Detail: detail}
	}
	return out
}

// retry requeues the same members as one group, each charged one attempt at its next
// claim; members already at MaxAttempts fail instead.
func (p policy) retry(b domain.Batch, f failure, ms []store.WaitingMember, retries int) ([]store.MemberFate, planOutcome) {
	out := make([]store.MemberFate, len(ms))
	o := planOutcome{action: "retry"}
	group := "b" + strconv.FormatInt(b.ID, 10) + ".r"
	if _, ok := domain.ParseSearchGroup(b.Grp); ok {
		// A search's part (or remainder) keeps its group, so the search goes on from its
		// retry: a later failure still defers the right siblings to the right remainder.
		// Its rows are older than its siblings', so the retry is still claimed next.
		group = b.Grp
	}
	for i, m := range ms {
		if m.Tries >= p.maxAttempts {
			detail := fmt.Sprintf("batch %d failed (%s) and the operation has used %d of %d attempts: %s", b.ID, f.class, m.Tries, p.maxAttempts, f.msg)
			out[i] = store.MemberFate{OperationID: m.OperationID, Code: domain.ReasonMaxAttempts, Message: detail, Event: EventMaxAttempts, Detail: detail}
			o.maxed++
			continue
		}
		out[i] = store.MemberFate{
			OperationID: m.OperationID, Group: group, Kind: domain.KindRetryPrefix + string(f.class),
			Depth: b.Depth, Half: m.Half, Retries: retries + 1,
			Event: EventRetryPrefix + string(f.class),
			Detail: fmt.Sprintf("batch %d failed (%s): retry %d of the same %d member(s) as one group, attempt %d of %d; no bisection",
				b.ID, f.class, retries+1, len(ms), m.Tries+1, p.maxAttempts),
		}
		o.retried++
	}
	if o.retried == 0 {
		o.action = "fail"
	}
	return out, o
}

// isolate splits a failing batch into parts (domain.SplitParts, domain.SearchGroup), or
// names its only member the culprit; either way, when the batch was a part of a
// search, its later siblings are deferred to the search's remainder: this part explains
// its parent's failure, so they are probably good, and they run together once this
// part's search is over.
func (p policy) isolate(b domain.Batch, f failure, ms []store.WaitingMember) ([]store.MemberFate, planOutcome) {
	root := b.ID
	var d store.Deferral
	if g, ok := domain.ParseSearchGroup(b.Grp); ok {
		root = g.Root
		if !g.Rest() {
			d = store.Deferral{Repo: b.Repo, Prefix: domain.SiblingPrefix(g.Root, g.Parent), Into: domain.RestGroup(g.Root)}
		}
	}
	if len(ms) == 1 {
		detail := fmt.Sprintf("alone in batch %d and it still failed (%s: %s)", b.ID, f.class, f.msg)
		if b.Depth > 0 {
			detail += fmt.Sprintf(": isolated by bisection at depth %d", b.Depth)
		}
		return []store.MemberFate{{OperationID: ms[0].OperationID, Code: domain.ReasonCulprit, Message: detail, Event: EventCulprit, Detail: detail}},
			planOutcome{action: "culprit", culprits: 1, deferral: d}
	}
	if !p.bisect {
		return p.failAll(ms, string(f.class), store.EventMemberFailed, fmt.Sprintf("batch %d failed (%s; bisection is off): %s", b.ID, f.class, f.msg)),
			planOutcome{action: "fail"}
	}
	// Parts in queue order; the first (oldest) part is claimed first, and each later
	// one only after every earlier one merged.
	depth := b.Depth + 1
	sizes := domain.SplitParts(len(ms))
	out := make([]store.MemberFate, 0, len(ms))
	for part, size := range sizes {
		for _, m := range ms[len(out) : len(out)+size] {
			out = append(out, store.MemberFate{
				OperationID: m.OperationID, Group: domain.PartGroup(root, b.ID, part+1),
				Kind: domain.KindBisect, Depth: depth, Half: part + 1,
				Event: EventBisected,
				Detail: fmt.Sprintf("batch %d failed (%s): split into parts of %s; this one is in part %d (%d member(s)), depth %d; each part runs once every earlier one merged",
					b.ID, f.class, joinInts(sizes), part+1, size, depth),
			})
		}
	}
	return out, planOutcome{action: "bisect", bisectedTo: depth, deferral: d}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// roundWhy says why a claimed batch exists, for the MR description.
func roundWhy(b domain.Batch) string {
	parent := int64(0)
	if b.ParentID != nil {
		parent = *b.ParentID
	}
	switch {
	case b.Kind == domain.KindBisect:
		if g, ok := domain.ParseSearchGroup(b.Grp); ok && g.Rest() {
			return fmt.Sprintf("remainder of the bisection that started with failed batch %d: the parts deferred while a failing part was searched", g.Root)
		} else if ok {
			return fmt.Sprintf("bisection of failed batch %d: part %d, depth %d (every earlier part merged)", parent, g.Part, b.Depth)
		}
		half := strings.TrimPrefix(b.Grp, "b"+strconv.FormatInt(parent, 10)+".")
		return fmt.Sprintf("bisection of failed batch %d: half %s of 2, depth %d", parent, half, b.Depth)
	case strings.HasPrefix(b.Kind, domain.KindRetryPrefix):
		return fmt.Sprintf("retry of failed batch %d after a %s failure", parent, strings.TrimPrefix(b.Kind, domain.KindRetryPrefix))
	}
	return "first try"
}
