package scanner

// Failure isolation (issue #9): classify each batch failure from GitLab's state, then
// decide each member's fate — retry the same members, bisect, or fail with a reason.
// The decision is pure (this file); the store applies it in one guarded transaction
// (store.BatchSettleRequeue).
//
//	class               cause                                      what happens to the members
//	test                pipeline failed, job failure_reason         bisect: two halves, later rounds take each
//	                    script_failure                              as its own batch, recursively; a failing
//	                                                                batch of one member → that member failed
//	                                                                "culprit"; passing halves merge
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
// narrow down someone else's failure, and their number is bounded by ⌈log2 batch size⌉.

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

// isolate bisects a failing batch, or names its only member the culprit.
func (p policy) isolate(b domain.Batch, f failure, ms []store.WaitingMember) ([]store.MemberFate, planOutcome) {
	if len(ms) == 1 {
		detail := fmt.Sprintf("alone in batch %d and it still failed (%s: %s)", b.ID, f.class, f.msg)
		if b.Depth > 0 {
			detail += fmt.Sprintf(": isolated by bisection at depth %d", b.Depth)
		}
		return []store.MemberFate{{OperationID: ms[0].OperationID, Code: domain.ReasonCulprit, Message: detail, Event: EventCulprit, Detail: detail}},
			planOutcome{action: "culprit", culprits: 1}
	}
	if !p.bisect {
		return p.failAll(ms, string(f.class), store.EventMemberFailed, fmt.Sprintf("batch %d failed (%s; bisection is off): %s", b.ID, f.class, f.msg)),
			planOutcome{action: "fail"}
	}
	// Halves in queue order; the first (older) half is claimed first.
	depth := b.Depth + 1
	cut := (len(ms) + 1) / 2
	out := make([]store.MemberFate, len(ms))
	for i, m := range ms {
		half := 1
		if i >= cut {
			half = 2
		}
		size := cut
		if half == 2 {
			size = len(ms) - cut
		}
		out[i] = store.MemberFate{
			OperationID: m.OperationID, Group: "b" + strconv.FormatInt(b.ID, 10) + "." + strconv.Itoa(half),
			Kind: domain.KindBisect, Depth: depth, Half: half,
			Event: EventBisected,
			Detail: fmt.Sprintf("batch %d failed (%s): bisected into halves of %d and %d; this one is in half %d (%d member(s)), depth %d",
				b.ID, f.class, cut, len(ms)-cut, half, size, depth),
		}
	}
	return out, planOutcome{action: "bisect", bisectedTo: depth}
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
		half := strings.TrimPrefix(b.Grp, "b"+strconv.FormatInt(parent, 10)+".")
		return fmt.Sprintf("bisection of failed batch %d: half %s of 2, depth %d", parent, half, b.Depth)
	case strings.HasPrefix(b.Kind, domain.KindRetryPrefix):
		return fmt.Sprintf("retry of failed batch %d after a %s failure", parent, strings.TrimPrefix(b.Kind, domain.KindRetryPrefix))
	}
	return "first try"
}
