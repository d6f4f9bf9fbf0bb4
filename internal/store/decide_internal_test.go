package store

import (
	"errors"
	"slices"
	"testing"

	"github.com/batcherd/batcherd/internal/domain"
)

// checkApplication is the decision both admission paths take on the binding they read
// (I5): a table over every binding state, no database.
func TestCheckApplication(t *testing.T) {
	for _, c := range []struct {
		action   domain.Action
		found    bool
		status   domain.BindingStatus
		want     error
		wantRepo string
	}{
		{domain.ActionGrant, false, "", nil, "mine"},
		{domain.ActionGrant, true, domain.BindingRejected, nil, "mine"}, // re-applied in place
		{domain.ActionGrant, true, domain.BindingClosed, nil, "mine"},
		{domain.ActionGrant, true, domain.BindingActive, ErrBindingActive, ""},
		{domain.ActionGrant, true, domain.BindingPending, ErrBindingBusy, ""},
		{domain.ActionGrant, true, domain.BindingRevoking, ErrBindingBusy, ""},
		{domain.ActionGrant, true, domain.BindingFailed, ErrBindingBusy, ""}, // overwriting it would orphan its recovery
		{domain.ActionRevoke, false, "", ErrBindingNotActive, ""},
		{domain.ActionRevoke, true, domain.BindingActive, nil, "theirs"}, // a revoke goes where the file is
		{domain.ActionRevoke, true, domain.BindingPending, ErrBindingBusy, ""},
		{domain.ActionRevoke, true, domain.BindingRevoking, ErrBindingBusy, ""},
		{domain.ActionRevoke, true, domain.BindingFailed, ErrBindingBusy, ""},
		{domain.ActionRevoke, true, domain.BindingClosed, ErrBindingNotActive, ""},
		{domain.ActionRevoke, true, domain.BindingRejected, ErrBindingNotActive, ""},
		{"frobnicate", false, "", ErrInvalidRequest, ""},
	} {
		b := domain.Binding{Status: c.status, Repo: "theirs"}
		repo, err := checkApplication(c.action, "mine", b, c.found)
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s on found=%v %q: %v, want %v", c.action, c.found, c.status, err, c.want)
		}
		if err == nil && repo != c.wantRepo {
			t.Errorf("%s on %q: repo %q, want %q", c.action, c.status, repo, c.wantRepo)
		}
	}
}

// claimAnswer: no claim outcome is an error, and a lost race is preempted only once
// the slot was ours.
func TestClaimAnswer(t *testing.T) {
	won := ClaimResult{Outcome: ClaimClaimed, BatchID: 9}
	for _, c := range []struct {
		res       ClaimResult
		err       error
		slotTaken bool
		want      ClaimOutcome
		wantErr   bool
	}{
		{won, nil, true, ClaimClaimed, false},
		{ClaimResult{Outcome: ClaimNothingToClaim}, errRollback, true, ClaimNothingToClaim, false},
		{ClaimResult{Outcome: ClaimSlotOccupied}, errRollback, false, ClaimSlotOccupied, false},
		{ClaimResult{Outcome: ClaimPreempted}, errRollback, true, ClaimPreempted, false},
		{ClaimResult{}, ErrLostRace, true, ClaimPreempted, false},
		{ClaimResult{}, ErrLostRace, false, ClaimSlotOccupied, false},
		{ClaimResult{}, errors.New("boom"), true, "", true},
	} {
		got, err := claimAnswer(c.res, c.err, c.slotTaken)
		if got.Outcome != c.want || (err != nil) != c.wantErr {
			t.Errorf("claimAnswer(%v, slot %v) = %v %v, want %v", c.err, c.slotTaken, got.Outcome, err, c.want)
		}
		if c.err != nil && got.BatchID != 0 {
			t.Errorf("claimAnswer(%v) kept batch %d", c.err, got.BatchID)
		}
	}
}

// sortFates is the settlement's choice per member: requeued in its group, or failed
// with its reason (the plan's, or the batch's for a member the plan does not name).
func TestSortFatesAndOutcomeEvents(t *testing.T) {
	ops := []settledOp{{OperationID: "d"}, {OperationID: "a"}, {OperationID: "c"}, {OperationID: "b"}, {OperationID: "e"}}
	fates := map[string]MemberFate{
		"a": {OperationID: "a", Group: "b9.2", Event: "bisected", Detail: "half 2"},
		"b": {OperationID: "b", Group: "b9.1", Event: "bisected", Detail: "half 1"},
		"c": {OperationID: "c", Code: "culprit", Message: "alone", Event: "culprit", Detail: "alone and failed"},
		"d": {OperationID: "d", Group: "b9.1"},
		// e: not in the plan
	}
	sp := sortFates(ops, fates, "test", "pipeline failed")
	if want := []string{"b9.1", "b9.2"}; !slices.Equal(sp.names, want) {
		t.Errorf("groups %v, want %v", sp.names, want)
	}
	if got := sp.groups["b9.1"]; !slices.Equal(got, []string{"d", "b"}) {
		t.Errorf("group b9.1 = %v, want lock order [d b]", got)
	}
	if len(sp.failed) != 2 || sp.failed[0].OperationID != "c" || sp.failed[1].OperationID != "e" {
		t.Errorf("failed %v, want c then e", sp.failed)
	}
	want := []failReason{{"culprit", "alone"}, {"test", "pipeline failed"}}
	if !slices.Equal(sp.reasons, want) {
		t.Errorf("reasons %v, want %v", sp.reasons, want)
	}
	for _, c := range []struct {
		op, ev, detail string
	}{
		{"a", "bisected", "half 2"},
		{"c", "culprit", "alone and failed"},
		{"d", "requeued", "requeued in group b9.1"},
		{"e", EventMemberFailed, "test: pipeline failed"},
	} {
		f, ok := fates[c.op]
		if ev, detail := outcomeEvent(f, ok, "test", "pipeline failed"); ev != c.ev || detail != c.detail {
			t.Errorf("%s: outcome %q %q, want %q %q", c.op, ev, detail, c.ev, c.detail)
		}
	}
}
