package scanner

import (
	"fmt"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

func members(n, tries, retries int) []store.WaitingMember {
	out := make([]store.WaitingMember, n)
	for i := range out {
		out[i] = store.WaitingMember{OperationID: fmt.Sprintf("op-%02d", i), RequestID: int64(i + 1), Tries: tries, Retries: retries,
			CreatedAt: time.Unix(int64(i), 0)}
	}
	return out
}

func TestPipelineClass(t *testing.T) {
	for _, c := range []struct {
		status, reason string
		want           domain.FailureClass
	}{
		{"failed", "script_failure", domain.ClassTest},
		{"failed", "runner_system_failure", domain.ClassInfra},
		{"failed", "stuck_or_timeout_failure", domain.ClassInfra},
		{"failed", "scheduler_failure", domain.ClassInfra},
		{"failed", "api_failure", domain.ClassInfra},
		{"failed", "job_execution_timeout", domain.ClassTest}, // a hung test is a test failure
		{"failed", "unknown_failure", domain.ClassUnknown},
		{"failed", "some_future_reason", domain.ClassUnknown}, // neither retried for ever nor blamed on a guess
		{"failed", "", domain.ClassUnknown},
		{"canceled", "", domain.ClassInfra},
	} {
		if got := pipelineClass(c.status, c.reason); got != c.want {
			t.Errorf("pipelineClass(%s, %q) = %s, want %s", c.status, c.reason, got, c.want)
		}
	}
}

func TestPlan(t *testing.T) {
	p := policy{infraRetries: 1, conflictRetries: 1, bisect: true, maxAttempts: 3}
	b := domain.Batch{ID: 42, Depth: 2}
	fates := func(f []store.MemberFate, _ planOutcome) []store.MemberFate { return f }

	// Test failure: halves in queue order, depth + 1, not charged.
	f, o := p.plan(b, failure{domain.ClassTest, "x"}, members(7, 1, 0))
	if o.action != "bisect" || o.bisectedTo != 3 {
		t.Fatalf("outcome %+v", o)
	}
	for i, m := range f {
		wantGroup, wantHalf := "b42.1", 1
		if i >= 4 {
			wantGroup, wantHalf = "b42.2", 2
		}
		if m.Group != wantGroup || m.Half != wantHalf || m.Depth != 3 || m.Kind != domain.KindBisect || m.Event != EventBisected || m.Retries != 0 {
			t.Fatalf("fate %d: %+v", i, m)
		}
	}
	// Alone and failing: the culprit, whatever its attempts.
	f = fates(p.plan(b, failure{domain.ClassTest, "x"}, members(1, 9, 0)))
	if len(f) != 1 || f[0].Group != "" || f[0].Code != domain.ReasonCulprit || f[0].Event != EventCulprit {
		t.Fatalf("culprit fate %+v", f)
	}
	// Bisection off: every member fails with the class.
	off := p
	off.bisect = false
	for _, m := range fates(off.plan(b, failure{domain.ClassTest, "x"}, members(4, 1, 0))) {
		if m.Group != "" || m.Code != string(domain.ClassTest) {
			t.Fatalf("no-bisect fate %+v", m)
		}
	}
	// Infra: retry the same members as one group once, then fail with the class.
	f, o = p.plan(b, failure{domain.ClassInfra, "runner"}, members(5, 1, 0))
	if o.action != "retry" || o.retried != 5 {
		t.Fatalf("infra outcome %+v", o)
	}
	for _, m := range f {
		if m.Group != "b42.r" || m.Kind != "retry_infra" || m.Retries != 1 || m.Depth != 2 || m.Event != "retry_infra" {
			t.Fatalf("infra retry fate %+v", m)
		}
	}
	for _, class := range []domain.FailureClass{domain.ClassInfra, domain.ClassTimeout, domain.ClassUnavailable, domain.ClassMRMissing} {
		for _, m := range fates(p.plan(b, failure{class, "again"}, members(5, 2, 1))) {
			if m.Group != "" || m.Code != string(class) {
				t.Fatalf("%s after its retry: %+v", class, m)
			}
		}
	}
	// MaxAttempts: members that used them fail, the rest retry.
	ms := members(3, 1, 0)
	ms[1].Tries = 3
	f = fates(p.plan(b, failure{domain.ClassTimeout, "slow"}, ms))
	if f[0].Group == "" || f[1].Code != domain.ReasonMaxAttempts || f[1].Event != EventMaxAttempts || f[2].Group == "" {
		t.Fatalf("max attempts fates %+v", f)
	}
	// Conflict and unknown: retry once (rebuilt on the new head), then bisect.
	for _, class := range []domain.FailureClass{domain.ClassConflict, domain.ClassUnknown} {
		if f, o := p.plan(b, failure{class, "c"}, members(4, 1, 0)); o.action != "retry" || f[0].Kind != "retry_"+string(class) {
			t.Fatalf("%s first: %+v %+v", class, o, f[0])
		}
		if _, o := p.plan(b, failure{class, "c"}, members(4, 2, 1)); o.action != "bisect" {
			t.Fatalf("%s after its retry: %+v", class, o)
		}
		if f, o := p.plan(b, failure{class, "c"}, members(1, 2, 1)); o.action != "culprit" || f[0].Code != domain.ReasonCulprit {
			t.Fatalf("%s alone after its retry: %+v", class, o)
		}
	}
	// Closed by a human, or settled by an operator: everyone fails, no retry.
	for _, c := range []struct {
		class domain.FailureClass
		code  string
	}{{domain.ClassClosedByUser, "closed_by_user"}, {domain.ClassManual, "manual_settle"}, {domain.ClassEmpty, "empty_batch"}} {
		for _, m := range fates(p.plan(b, failure{c.class, "x"}, members(3, 1, 0))) {
			if m.Group != "" || m.Code != c.code {
				t.Fatalf("%s fate %+v", c.class, m)
			}
		}
	}
	// No retries configured: infra fails at once.
	none := p
	none.infraRetries = 0
	if _, o := none.plan(b, failure{domain.ClassInfra, "x"}, members(2, 1, 0)); o.action != "fail" {
		t.Fatalf("no-retry infra outcome %+v", o)
	}
}
