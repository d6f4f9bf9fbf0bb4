// Package mr is batcherd's GitLab layer: branches, commits and merge requests through
// gitlab.com/gitlab-org/api/client-go, with every call bounded by a timeout and every
// error classified once (transient, permanent, not found). Each method is idempotent
// by the batch's deterministic branch name, so a replica that crashed halfway — or a
// call whose answer was lost after GitLab did the work — is resumed, never duplicated.
//
// The types and method signatures in this file are the contract the scanner builds
// against (issue #3); the implementation lives in client.go, commit.go and errors.go.
package mr

import (
	"errors"
	"fmt"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
)

// Label marks every MR batcherd opens; the orphan sweep lists MRs by it.
const Label = "batcherd"

// CommitTrailer is the git trailer key carrying the batch id in every batch commit. A
// branch whose head commit carries "Batcherd-Batch: <id>" (and, on an installation's
// branch, "Batcherd-Installation: <installation>") already has the batch's commit (the
// answer to the commit call may have been lost).
const CommitTrailer = domain.TrailerBatch

// Owner is the batch a branch belongs to: the installation named in the branch
// (batcherd/<installation>/batch-<id>; "" for a legacy batcherd/batch-<id> branch) and
// the batch id. A batch commit carries both as trailers, and an MR is the batch's only
// when its commits do.
type Owner struct {
	Installation string
	BatchID      int64
	// Stamp is the batch's claim time (domain.BatchStamp; "" when unknown): a commit
	// that carries a Batcherd-Batch-Claimed trailer is the batch's only when it is this
	// one, so a database restored from an older backup, which issues the same batch ids
	// again, never adopts the MRs of the batches it forgot. Commits from before the
	// trailer existed carry none and are judged by installation and id alone.
	Stamp string
}

// BatchRef names the batch whose branch, commit or MR is meant: its id and the claim
// time of its row (merge_batch.created_at; zero when unknown, e.g. a row the database
// lost).
type BatchRef struct {
	ID      int64
	Claimed time.Time
}

// ownerOf is the owner of branch as batch b: the installation comes from the branch
// name (none when the name is not an installation's batch branch).
func ownerOf(branch string, b BatchRef) Owner {
	inst, _, _ := domain.ParseBranch(branch)
	return Owner{Installation: inst, BatchID: b.ID, Stamp: domain.BatchStamp(b.Claimed)}
}

// ForeignMRError: the MR found for a batch's branch is not the batch's — its commits do
// not carry this installation's trailers for this batch (another installation's, a
// database re-created against an old project, a human's branch of the same name). It
// is never adopted: never recorded, merged, closed or settled as the batch's.
type ForeignMRError struct {
	Branch string
	Owner  Owner
	IID    int64
	State  string
	WebURL string
}

func (e *ForeignMRError) Error() string {
	inst := e.Owner.Installation
	if inst == "" {
		inst = "(none: legacy branch)"
	}
	return fmt.Sprintf("merge request !%d (%s, %s) on branch %s is not this batch's: its commits do not carry %s: %s and %s: %d; it was left alone",
		e.IID, e.State, e.WebURL, e.Branch, domain.TrailerInstallation, inst, CommitTrailer, e.Owner.BatchID)
}

// MR states as GitLab reports them.
const (
	StateOpened = "opened"
	StateClosed = "closed"
	StateMerged = "merged"
	StateLocked = "locked"
)

// MergeRequest is what batcherd reads of an MR.
type MergeRequest struct {
	IID                 int64
	State               string // opened, closed, merged, locked
	DetailedMergeStatus string // e.g. mergeable, ci_still_running, conflict, need_rebase, checking
	// MergeStatus is the deprecated merge_status (unchecked, preparing, checking,
	// can_be_merged, cannot_be_merged…): servers whose detailed_merge_status is empty
	// still say with it whether mergeability is being checked.
	MergeStatus  string
	HasConflicts bool
	// RebaseInProgress: a rebase (Rebase) is running in the background.
	RebaseInProgress bool
	// MergeError is GitLab's last word on a merge or rebase that did not happen
	// ("Rebase failed: …", an aborted auto-merge), "" when none.
	MergeError     string
	PipelineStatus string // head pipeline: "" (none), or one of GitLab's statuses (created, waiting_for_resource, preparing, pending, running, success, failed, canceled, canceling, skipped, manual, scheduled)
	PipelineID     int64
	// FailureReason is the failure_reason of the first failed job of a failed head
	// pipeline (script_failure, runner_system_failure, stuck_or_timeout_failure, …),
	// "" when unknown or not failed.
	FailureReason string
	// FailureReasonErr is why FailureReason could not be read (GitLab refused or did
	// not answer the jobs listing), nil otherwise. "" with an error is not "no reason":
	// a caller that acts on the reason must not read it as unknown.
	FailureReasonErr          error
	SHA                       string // head sha of the source branch as the MR sees it
	WebURL                    string
	SourceBranch              string
	TargetBranch              string
	Labels                    []string
	MergeWhenPipelineSucceeds bool
	MergedAt                  *time.Time
	ClosedAt                  *time.Time
}

// MergeabilityPending reports whether GitLab is still computing whether the MR can
// merge (after it was created, or either branch moved): detailed_merge_status
// preparing, unchecked or checking — or, from a server that sends no detailed status,
// merge_status unchecked/checking/…_recheck. Its conflict and rebase answers are not
// known yet; the caller waits.
func (m MergeRequest) MergeabilityPending() bool {
	switch m.DetailedMergeStatus {
	case "preparing", "unchecked", "checking", "approvals_syncing":
		return true
	case "":
		switch m.MergeStatus {
		case "preparing", "unchecked", "checking", "cannot_be_merged_recheck", "cannot_be_merged_rechecking":
			return true
		}
	}
	return false
}

// FileAction is one file change of a batch commit. The layer decides create vs update
// itself (one tree listing, not one call per file).
type FileAction struct {
	Path    string
	Content string // ignored when Delete
	Delete  bool
}

// MRSpec describes the MR to ensure for a batch branch.
type MRSpec struct {
	SourceBranch string
	Batch        BatchRef // the batch of SourceBranch: its commits carry it (FindMR)
	TargetBranch string
	Title        string
	Description  string
	Labels       []string // Label is always added
}

// Class is the one classification of a GitLab error.
type Class int

const (
	ClassNone      Class = iota // not a GitLab error (nil, or a local error)
	ClassTransient              // 5xx, 429, timeouts, connection reset/EOF: retry later
	ClassPermanent              // 400/401/403/405/409/422: retrying the same call will not help
	ClassNotFound               // 404: the thing is not there
)

func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	case ClassNotFound:
		return "not_found"
	}
	return "none"
}

// Error is every error the layer returns for a GitLab call. It never carries the token.
type Error struct {
	Op         string // e.g. "create_branch"
	Class      Class
	Status     int    // HTTP status, 0 when none (network)
	Message    string // GitLab's message, kept
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string {
	return "gitlab " + e.Op + ": " + e.Class.String() + ": " + e.Message
}
func (e *Error) Unwrap() error { return e.Err }

// ErrStillOpen: a merge request batcherd closed is still open when read back (it was
// reopened in between, or GitLab is merging it and refuses to close it). Retrying later
// settles it either way.
var ErrStillOpen = errors.New("merge request still open after closing it")

// ClassOf returns the class of err (ClassNone for nil or non-GitLab errors; a context
// deadline on a call is transient).
func ClassOf(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return ClassNone
}
