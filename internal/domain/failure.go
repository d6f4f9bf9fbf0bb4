package domain

import (
	"strconv"
	"strings"
)

// FailureClass is why a batch failed, as the failure policy reads it. Each class is
// also the error code recorded on the batch (and on members failed for it), and the
// fail_class a settle records before it closes the batch's MR.
type FailureClass string

const (
	// ClassTest: the pipeline failed with job failure_reason script_failure — a member
	// may be at fault (bisect).
	ClassTest FailureClass = "test"
	// ClassInfra: the pipeline failed for another reason, or was canceled — nothing
	// the members changed (retry).
	ClassInfra FailureClass = "infra"
	// ClassConflict: merge conflict or need rebase (retry rebuilt, then bisect).
	ClassConflict FailureClass = "conflict"
	// ClassUnknown: the pipeline failed and no failure_reason was readable.
	ClassUnknown FailureClass = "unknown"
	// ClassClosedByUser: the MR was closed by someone else than batcherd (final).
	ClassClosedByUser FailureClass = "closed_by_user"
	// ClassTimeout: the batch was older than the batch timeout.
	ClassTimeout FailureClass = "timeout"
	// ClassUnavailable: timed out without an MR ever recorded.
	ClassUnavailable FailureClass = "gitlab_unavailable"
	// ClassMRMissing: the batch's MR no longer exists.
	ClassMRMissing FailureClass = "mr_missing"
	// ClassManual: an operator settled the batch (final).
	ClassManual FailureClass = "manual_settle"
	// ClassEmpty: the batch had no members left to publish (final).
	ClassEmpty FailureClass = "empty_batch"
	// ClassCIBlocked: the head pipeline was skipped or waits for a manual job, and the
	// project does not count that as passed: it will not pass by itself, and nothing
	// says a member is at fault (retry once, then fail; see failure_reasons.go).
	ClassCIBlocked FailureClass = "ci_blocked"
	// ClassForeignMR: the MR on the batch's branch is not the batch's — its commits lack
	// this installation's trailers for the batch (retried like infra: a new batch has a
	// new branch; the MR is left alone).
	ClassForeignMR FailureClass = "foreign_mr"
	// ClassRefused: GitLab permanently refused the batch's content (400/422 on the
	// commit, e.g. a path it will not store): bisected like a test failure, down to the
	// member whose file GitLab refuses.
	ClassRefused FailureClass = "gitlab_refused"
)

// FailureClasses lists every class.
var FailureClasses = []FailureClass{ClassTest, ClassInfra, ClassConflict, ClassUnknown, ClassClosedByUser,
	ClassTimeout, ClassUnavailable, ClassMRMissing, ClassManual, ClassEmpty, ClassCIBlocked, ClassForeignMR, ClassRefused}

// Final reports whether a settlement for this class stands whatever GitLab shows
// afterwards (a human closing the MR does not turn an operator's or an empty batch's
// failure into closed_by_user).
func (c FailureClass) Final() bool { return c == ClassManual || c == ClassEmpty }

// Member failure reasons (operation error codes) besides the classes.
const (
	ReasonCulprit     = "culprit"
	ReasonMaxAttempts = "max_attempts"
)

// Block codes recorded on a BLOCKED batch (the block failure mode).
const (
	BlockPipelineFailed = "pipeline_failed"
	BlockMergeConflict  = "merge_conflict"
	BlockNeedRebase     = "need_rebase"
	BlockHeadMoved      = "head_moved"
	// BlockCIBlocked: the head pipeline was skipped or waits for a manual job.
	BlockCIBlocked = "ci_blocked"
)

// Failure isolation's search groups (docs/ARCHITECTURE.md, "Failure isolation").
//
// A failed batch of several members is split, in queue order, into parts: its first
// half, then the first half of what is left, and so on down to one or two single
// members (SplitParts). Each part is a claim group of its own, and since waiting rows
// keep their created_at, the claim takes the parts in that order, one at a time:
//
//   - a part that passes merges, and the rest of the failed batch is then known to hold
//     a culprit (unless the failure was a flake) — the next part is already the first
//     half of that rest, so no run of the rest as a whole is spent (inference);
//   - a part that fails is split the same way, and its later siblings — probably good,
//     since this part explains the failure — are deferred into the search's remainder
//     group, which is claimed only when nothing older of the search waits, i.e. when
//     the failing part's search is finished (deferral). The remainder runs as one batch;
//     if it fails, that is a new failure, split and searched again;
//   - a failing part whose every part then merges failed by a flake: the siblings it
//     deferred go back to their parent's chain (Resume).
//
// The names carry the search: "s<root>.<parent>.<part>" is part <part> (1-based) of
// failed batch <parent>, in the search that started when batch <root> failed, and
// "s<root>.rest" is that search's remainder. Everything a replica needs to go on is in
// the waiting rows' group names, written in the failed batch's settlement transaction.

// SearchGroup is a parsed search group name.
type SearchGroup struct {
	Root   int64 // the failed batch the search started with
	Parent int64 // the failed batch this part was split from; 0 for the remainder
	Part   int   // 1-based position among Parent's parts; 0 for the remainder
}

// PartGroup names part part of failed batch parent in the search of root.
func PartGroup(root, parent int64, part int) string {
	return "s" + strconv.FormatInt(root, 10) + "." + strconv.FormatInt(parent, 10) + "." + strconv.Itoa(part)
}

// RestGroup names the remainder group of the search of root.
func RestGroup(root int64) string { return "s" + strconv.FormatInt(root, 10) + ".rest" }

// SiblingPrefix is the prefix every part group of failed batch parent (in the search
// of root) starts with, and no other group does.
func SiblingPrefix(root, parent int64) string {
	return "s" + strconv.FormatInt(root, 10) + "." + strconv.FormatInt(parent, 10) + "."
}

// ParseSearchGroup reads a group name written by PartGroup or RestGroup; ok false for
// any other group (the ordinary queue "", a retry group, an older release's halves).
func ParseSearchGroup(name string) (SearchGroup, bool) {
	rest, ok := strings.CutPrefix(name, "s")
	if !ok {
		return SearchGroup{}, false
	}
	fields := strings.Split(rest, ".")
	root, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil || root <= 0 {
		return SearchGroup{}, false
	}
	switch {
	case len(fields) == 2 && fields[1] == "rest":
		return SearchGroup{Root: root}, true
	case len(fields) == 3:
		parent, err1 := strconv.ParseInt(fields[1], 10, 64)
		part, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil || parent <= 0 || part <= 0 {
			return SearchGroup{}, false
		}
		return SearchGroup{Root: root, Parent: parent, Part: part}, true
	}
	return SearchGroup{}, false
}

// Rest reports whether g is a search's remainder group.
func (g SearchGroup) Rest() bool { return g.Parent == 0 }

// SplitParts returns the sizes of the parts a failed batch of n members is split
// into, in queue order: the first half (rounded up), then the first half of what is
// left, and so on; the last two parts are single members. n < 2: no parts (a lone
// member is not split). The sizes add up to n; there are about log₂ n + 1 of them.
func SplitParts(n int) []int {
	if n < 2 {
		return nil
	}
	var out []int
	for n > 1 {
		h := (n + 1) / 2
		out = append(out, h)
		n -= h
	}
	return append(out, n)
}

// Resume decides what follows when a part of failed batch q merged and no later part
// of q waits any more: every part of q merged, so q held no culprit and its failure was
// a flake. If q was itself part qPart of failed batch parent (qGroup, its group, says
// so), the parts of parent after q were deferred when q failed as probably good — but
// with q clean, parent's failure is still unexplained, so they are where its culprit
// is: they go back from the remainder to parent's chain, as its parts qPart+1, … (a
// split of them as SplitParts would make, one part when a single member is left),
// instead of running whole in the remainder and failing there. ok false: q was not a
// part (the search's first batch, or a remainder), nothing to resume.
func Resume(merged SearchGroup, qGroup string) (parent int64, firstPart int, ok bool) {
	if merged.Rest() {
		return 0, 0, false
	}
	q, isPart := ParseSearchGroup(qGroup)
	if !isPart || q.Rest() || q.Root != merged.Root {
		return 0, 0, false
	}
	return q.Parent, q.Part + 1, true
}

// ResumeParts is the split of n members resumed by Resume: SplitParts, or one part of
// one member.
func ResumeParts(n int) []int {
	if n == 1 {
		return []int{1}
	}
	return SplitParts(n)
}
