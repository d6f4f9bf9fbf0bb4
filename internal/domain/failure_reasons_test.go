package domain

import "testing"

func TestClassOfFailureReason(t *testing.T) {
	for reason, want := range map[string]FailureClass{
		"script_failure":           ClassTest,
		"job_execution_timeout":    ClassTest,
		"unknown_failure":          ClassUnknown,
		"":                         ClassUnknown,
		"a_reason_from_gitlab_99":  ClassUnknown,
		"runner_system_failure":    ClassInfra,
		"stuck_or_timeout_failure": ClassInfra,
		"data_integrity_failure":   ClassInfra,
	} {
		if got := ClassOfFailureReason(reason); got != want {
			t.Errorf("%q: %s, want %s", reason, got, want)
		}
	}
	for _, r := range KnownFailureReasons() {
		if c := ClassOfFailureReason(r); c != ClassTest && c != ClassInfra && c != ClassUnknown {
			t.Errorf("%q maps to %s", r, c)
		}
	}
}
