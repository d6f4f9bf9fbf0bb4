package domain

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
