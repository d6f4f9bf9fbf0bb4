package scanner

import (
	"testing"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
)

// The choices of publish and settle, as tables over what GitLab answered: no database,
// no simulator. The steps they choose are tested against MariaDB and the simulator in
// scanner_test.go, crash_test.go and isolation_test.go.

func TestPublishPlan(t *testing.T) {
	for _, c := range []struct {
		found bool
		state string
		write bool
	}{
		{false, "", true},             // nothing yet: branch, commit, MR
		{true, mr.StateOpened, true},  // resumed: rewrite idempotently, ensure the same MR
		{true, mr.StateMerged, false}, // a human merged what a crashed publisher opened: record it as is
		{true, mr.StateClosed, false}, // …or closed it: record it, reconcile settles it
		{true, mr.StateLocked, false},
	} {
		if got := planPublish(c.found, c.state).write; got != c.write {
			t.Errorf("planPublish(found=%v, %q).write = %v, want %v", c.found, c.state, got, c.write)
		}
	}
	for _, c := range []struct {
		empty, found, unchanged bool
	}{
		{true, false, true},   // every member's change is already there and no MR exists
		{true, true, false},   // an MR exists already: record it, do not settle around it
		{false, false, false}, // the commit changes files: open the MR
		{false, true, false},
	} {
		if got := unchangedCommit(c.empty, c.found); got != c.unchanged {
			t.Errorf("unchangedCommit(empty=%v, found=%v) = %v", c.empty, c.found, got)
		}
	}
	for _, c := range []struct {
		state string
		mode  MergeMode
		arm   bool
	}{
		{mr.StateOpened, MergeAuto, true},
		{mr.StateOpened, MergeDirect, false},
		{mr.StateOpened, MergeManual, false},
		{mr.StateMerged, MergeAuto, false},
		{mr.StateClosed, MergeAuto, false},
		{mr.StateLocked, MergeAuto, false},
	} {
		if got := armsAutoMerge(c.state, c.mode); got != c.arm {
			t.Errorf("armsAutoMerge(%q, %s) = %v", c.state, c.mode, got)
		}
	}
}

func TestSettleChoice(t *testing.T) {
	for _, c := range []struct {
		found bool
		state string
		want  settleStep
	}{
		{false, "", settleApply}, // no MR anywhere: nothing can merge, apply the policy
		{true, mr.StateOpened, settleClose},
		{true, mr.StateLocked, settleLater}, // being merged: failing first could put it behind a merge
		{true, mr.StateClosed, settleReread},
		{true, mr.StateMerged, settleReread}, // read again, then merged wins
	} {
		if got := settleBefore(c.found, c.state); got != c.want {
			t.Errorf("settleBefore(found=%v, %q) = %v, want %v", c.found, c.state, got, c.want)
		}
	}
	for _, c := range []struct {
		state string
		want  settleStep
	}{
		{mr.StateMerged, settleMergedWins}, // merged between our read and our close
		{mr.StateClosed, settleApply},
		{mr.StateOpened, settleLater}, // reopened, or GitLab refused the close
		{mr.StateLocked, settleLater},
	} {
		if got := settleAfter(c.state); got != c.want {
			t.Errorf("settleAfter(%q) = %v, want %v", c.state, got, c.want)
		}
	}
	for _, c := range []struct {
		recorded, class string
		human           bool
	}{
		{"", "test", true},            // closed before batcherd decided to: a human did
		{"infra", "infra", false},     // batcherd recorded a class: its own close, resumed
		{"", "closed_by_user", false}, // already that
		{"", "manual_settle", false},  // an operator's settlement stands
		{"", "empty_batch", false},
	} {
		f := failure{class: domain.FailureClass(c.class), msg: "m"}
		if got := closedByHuman(domain.FailureClass(c.recorded), f); got != c.human {
			t.Errorf("closedByHuman(recorded %q, %s) = %v", c.recorded, c.class, got)
		}
	}
}

// What reconcile does with an open MR that cannot merge: the block reason, then the
// class the failure policy acts on ("" waits for an operator even in isolate mode).
func TestBlockReasonAndClass(t *testing.T) {
	b := domain.Batch{ID: 7, MRSHA: "aaaa"}
	for _, c := range []struct {
		name  string
		m     mr.MergeRequest
		code  string
		class domain.FailureClass
	}{
		{"mergeable", mr.MergeRequest{SHA: "aaaa", PipelineStatus: "running", DetailedMergeStatus: "ci_still_running"}, "", ""},
		{"test failure", mr.MergeRequest{SHA: "aaaa", PipelineStatus: "failed", FailureReason: "script_failure"}, domain.BlockPipelineFailed, domain.ClassTest},
		{"runner failure", mr.MergeRequest{SHA: "aaaa", PipelineStatus: "failed", FailureReason: "runner_system_failure"}, domain.BlockPipelineFailed, domain.ClassInfra},
		{"no reason", mr.MergeRequest{SHA: "aaaa", PipelineStatus: "failed"}, domain.BlockPipelineFailed, domain.ClassUnknown},
		{"canceled", mr.MergeRequest{SHA: "aaaa", PipelineStatus: "canceled"}, domain.BlockPipelineFailed, domain.ClassInfra},
		{"conflict", mr.MergeRequest{SHA: "aaaa", HasConflicts: true}, domain.BlockMergeConflict, domain.ClassConflict},
		{"conflict status", mr.MergeRequest{SHA: "aaaa", DetailedMergeStatus: "conflict"}, domain.BlockMergeConflict, domain.ClassConflict},
		{"need rebase", mr.MergeRequest{SHA: "aaaa", DetailedMergeStatus: "need_rebase"}, domain.BlockNeedRebase, domain.ClassConflict},
		// Someone pushed to the batch branch: their pipeline and conflicts are not the
		// members' fault, so it blocks for an operator whatever else is wrong.
		{"head moved", mr.MergeRequest{SHA: "bbbb", PipelineStatus: "failed", FailureReason: "script_failure"}, domain.BlockHeadMoved, ""},
	} {
		code, msg := blockReason(b, c.m)
		if code != c.code || (code != "") != (msg != "") {
			t.Errorf("%s: blockReason = %q %q, want %q", c.name, code, msg, c.code)
		}
		if code == "" {
			continue
		}
		if got := failureClass(code, c.m); got != c.class {
			t.Errorf("%s: failureClass = %q, want %q", c.name, got, c.class)
		}
	}
}
