package domain

// Why a pipeline failed decides what isolation does with the batch's members: a
// failure a member's change can cause is bisected down to that member (ClassTest);
// one no change of theirs causes is retried with the same members (ClassInfra); one
// that could be either is retried once, then bisected (ClassUnknown). GitLab reports
// why per job (failure_reason); batcherd reads the first failed job's. Every reason
// GitLab documents is mapped here on purpose; the README's failure isolation and
// GitLab states tables say the same.

// failureReasonClass maps each documented job failure_reason to a class.
var failureReasonClass = map[string]FailureClass{
	// The job's script failed: the tests said no.
	"script_failure": ClassTest,
	// The job ran past its own timeout. Most often a test that hangs, which a change
	// can cause like any failing test: bisected. A flaky hang is caught by the flake
	// retry before a lone member is named the culprit.
	"job_execution_timeout": ClassTest,

	// No better reason is known: a runner crash and a failing test look alike.
	"unknown_failure": ClassUnknown,

	// Runners, scheduling and GitLab itself.
	"runner_system_failure":    ClassInfra,
	"stuck_or_timeout_failure": ClassInfra, // no runner picked the job up in time
	"scheduler_failure":        ClassInfra,
	"api_failure":              ClassInfra,
	"data_integrity_failure":   ClassInfra,
	"runner_unsupported":       ClassInfra,
	"no_matching_runner":       ClassInfra,
	"archived_failure":         ClassInfra,
	"stale_schedule":           ClassInfra,
	"ci_quota_exceeded":        ClassInfra,
	"trace_size_exceeded":      ClassInfra,
	"builds_disabled":          ClassInfra,
	"user_blocked":             ClassInfra,
	"project_deleted":          ClassInfra,
	"ip_restriction_failure":   ClassInfra,
	// Dependencies and prerequisites the pipeline, not the change, provides.
	"missing_dependency_failure":   ClassInfra,
	"unmet_prerequisites":          ClassInfra,
	"secrets_provider_not_found":   ClassInfra,
	"environment_creation_failure": ClassInfra,
	// Deployments and protected environments.
	"forward_deployment_failure":     ClassInfra,
	"deployment_rejected":            ClassInfra,
	"failed_outdated_deployment_job": ClassInfra,
	"protected_environment_failure":  ClassInfra,
	// Trigger jobs whose downstream pipeline never ran (one that ran and failed is
	// followed by the mr layer to its own job's reason).
	"insufficient_bridge_permissions":                ClassInfra,
	"downstream_bridge_project_not_found":            ClassInfra,
	"invalid_bridge_trigger":                         ClassInfra,
	"upstream_bridge_project_not_found":              ClassInfra,
	"insufficient_upstream_permissions":              ClassInfra,
	"bridge_pipeline_is_child_pipeline":              ClassInfra,
	"downstream_pipeline_creation_failed":            ClassInfra,
	"reached_max_descendant_pipelines_depth":         ClassInfra,
	"reached_max_pipeline_hierarchy_size":            ClassInfra,
	"reached_downstream_pipeline_trigger_rate_limit": ClassInfra,
	"pipeline_loop_detected":                         ClassInfra,
}

// ClassOfFailureReason is the class of a failed pipeline whose first failed job gave
// reason. No reason (GitLab gave none) and a reason batcherd does not know (a newer
// GitLab's) are ClassUnknown: retried once as a group, then bisected — neither a
// retry for ever nor a culprit named on a guess.
func ClassOfFailureReason(reason string) FailureClass {
	if c, ok := failureReasonClass[reason]; ok {
		return c
	}
	return ClassUnknown
}

// KnownFailureReasons lists the failure reasons mapped on purpose.
func KnownFailureReasons() []string {
	out := make([]string, 0, len(failureReasonClass))
	for r := range failureReasonClass {
		out = append(out, r)
	}
	return out
}
