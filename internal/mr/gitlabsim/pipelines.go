package gitlabsim

import (
	"errors"
	"net/http"
	"slices"
	"strings"
)

func init() {
	addRoute(http.MethodPost, "/projects/:id/pipelines/:pid/retry", retryPipeline)
	addRoute(http.MethodGet, "/projects/:id/merge_requests/:iid/commits", listMRCommits)
}

// runsOf counts the runs of a branch's (parent) pipelines: each pipeline once, and
// once more per retry of its failed jobs. Pipeline rules with First count runs, so a
// flaky test fails the first runs of a branch whether they are new pipelines or
// retries.
func (s *Sim) runsOf(p *project, ref string) int {
	n := 0
	for _, pl := range p.pipelines {
		if pl.ref == ref && pl.parent == nil {
			n += 1 + pl.retries
		}
	}
	return n
}

// retryPipeline is POST …/pipelines/:id/retry: the failed and canceled jobs run again
// as new jobs of the same pipeline (the old ones are then listed only with
// include_retried), and the pipeline runs again. Without such jobs nothing happens.
func retryPipeline(s *Sim, q *req) (*reply, *apiError) {
	pl, e := q.findPipeline()
	if e != nil {
		return nil, e
	}
	if pl.parent != nil {
		pl = pl.parent
	}
	s.retryLocked(q.proj, pl)
	return ok(http.StatusCreated, s.pipelineJSON(q.proj, pl))
}

func (s *Sim) retryLocked(p *project, pl *pipeline) {
	now := s.now()
	again := false
	for _, x := range []*pipeline{pl, pl.child} {
		if x == nil {
			continue
		}
		var fresh []*job
		for _, j := range x.jobs {
			if j.retried || (j.status != PipelineFailed && j.status != PipelineCanceled) {
				continue
			}
			j.retried = true
			s.nextJobID++
			fresh = append(fresh, &job{id: s.nextJobID, name: j.name, stage: j.stage, status: jobStatusFor(s.opts.PipelineStartStatus), createdAt: now})
		}
		if len(fresh) > 0 {
			again = true
			x.jobs = append(x.jobs, fresh...)
			x.status, x.finishedAt, x.updatedAt = s.opts.PipelineStartStatus, nil, now
		}
	}
	if !again {
		return
	}
	pl.retries++
	pl.status, pl.finishedAt, pl.updatedAt = s.opts.PipelineStartStatus, nil, now
	pl.planned, pl.plannedReason = PipelineSuccess, ""
	if reason, bad := s.poisoned(p, pl.sha); bad {
		pl.planned, pl.plannedReason = PipelineFailed, reason
	} else if st, reason, ok := s.ruleFor(pl.ref, s.runsOf(p, pl.ref)); ok {
		pl.planned, pl.plannedReason = st, reason
	} else if s.opts.FailureRate > 0 && s.rng.Float64() < s.opts.FailureRate {
		pl.planned, pl.plannedReason = PipelineFailed, s.opts.FailureReason
	}
	s.schedule(p, pl)
}

// RetryPipeline retries a pipeline's failed jobs as POST …/retry does.
func (s *Sim) RetryPipeline(project string, pipelineID int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return ErrNotFound
	}
	for _, pl := range p.pipelines {
		if pl.id == pipelineID {
			if pl.parent != nil {
				pl = pl.parent
			}
			s.retryLocked(p, pl)
			return nil
		}
	}
	return ErrNotFound
}

// listMRCommits is GET …/merge_requests/:iid/commits: the commits of the source branch
// that are not on the target, newest first (commit entities, trailers included).
func listMRCommits(s *Sim, q *req) (*reply, *apiError) {
	m, e := q.findMR()
	if e != nil {
		return nil, e
	}
	head := s.mrSHA(q.proj, m)
	// A merged MR keeps its commits: those the target did not have before the merge.
	base := q.proj.branches[m.target]
	if m.state == "merged" && m.targetAtMerge != "" {
		base = m.targetAtMerge
	}
	onTarget := s.ancestors(base)
	var cs []*commit // first-parent walk from the head: newest first
	for cur := head; cur != "" && !onTarget[cur]; {
		c := s.commits[cur]
		if c == nil {
			break
		}
		cs = append(cs, c)
		if len(c.parents) == 0 {
			break
		}
		cur = c.parents[0]
	}
	page, h := paginate(q, cs, true)
	out := make([]any, 0, len(page))
	for _, c := range page {
		out = append(out, s.commitJSON(q.proj, c, false))
	}
	return &reply{status: http.StatusOK, body: out, headers: h}, nil
}

// Pipeline statuses GitLab reports (Ci::Pipeline's state machine).
const (
	PipelineCreated            = "created"
	PipelineWaitingForResource = "waiting_for_resource"
	PipelinePreparing          = "preparing"
	PipelinePending            = "pending"
	PipelineRunning            = "running"
	PipelineSuccess            = "success"
	PipelineFailed             = "failed"
	PipelineCanceled           = "canceled"
	PipelineCanceling          = "canceling"
	PipelineSkipped            = "skipped"
	PipelineManual             = "manual"
	PipelineScheduled          = "scheduled"
)

// PipelineStatuses is every pipeline status, in the order GitLab documents them.
var PipelineStatuses = []string{
	PipelineCreated, PipelineWaitingForResource, PipelinePreparing, PipelinePending, PipelineRunning,
	PipelineSuccess, PipelineFailed, PipelineCanceled, PipelineCanceling, PipelineSkipped,
	PipelineManual, PipelineScheduled,
}

// Job failure reasons GitLab reports (Ci::Build failure_reason; the values the API
// shows). unknown_failure is what a job gets when nothing better is known;
// job_execution_timeout is the job's own timeout (often a hung test);
// stuck_or_timeout_failure a job no runner picked up in time.
var FailureReasons = []string{
	"unknown_failure", "script_failure", "api_failure", "stuck_or_timeout_failure",
	"runner_system_failure", "missing_dependency_failure", "runner_unsupported",
	"stale_schedule", "job_execution_timeout", "archived_failure", "unmet_prerequisites",
	"scheduler_failure", "data_integrity_failure", "forward_deployment_failure",
	"user_blocked", "project_deleted", "ci_quota_exceeded", "pipeline_loop_detected",
	"no_matching_runner", "trace_size_exceeded", "builds_disabled", "environment_creation_failure",
	"deployment_rejected", "failed_outdated_deployment_job", "protected_environment_failure",
	"insufficient_bridge_permissions", "downstream_bridge_project_not_found", "invalid_bridge_trigger",
	"upstream_bridge_project_not_found", "insufficient_upstream_permissions",
	"bridge_pipeline_is_child_pipeline", "downstream_pipeline_creation_failed",
	"secrets_provider_not_found", "reached_max_descendant_pipelines_depth", "ip_restriction_failure",
	"reached_max_pipeline_hierarchy_size", "reached_downstream_pipeline_trigger_rate_limit",
}

// finalStatus: a pipeline in this status is over (it changes only if retried).
func finalStatus(st string) bool {
	switch st {
	case PipelineSuccess, PipelineFailed, PipelineCanceled, PipelineSkipped:
		return true
	}
	return false
}

// activeStatus: GitLab's "active" pipeline statuses (auto-merge can wait for them).
func activeStatus(st string) bool {
	switch st {
	case PipelineCreated, PipelineWaitingForResource, PipelinePreparing, PipelinePending,
		PipelineRunning, PipelineScheduled, PipelineCanceling:
		return true
	}
	return false
}

// PipelineRule decides how pipelines of matching branches end, beyond the random
// FailureRate and the poison rules (which are applied first).
type PipelineRule struct {
	// RefPrefix selects branches by name prefix ("" matches every branch).
	RefPrefix string `json:"ref_prefix,omitempty"`
	// First, when positive, applies the rule to the first First pipelines of each
	// matching branch only: a flaky test that fails a branch's first pipeline and
	// passes when the same commit (or a rebuild) runs again. Zero: every pipeline.
	First int `json:"first,omitempty"`
	// Status is how the pipeline ends: failed (default), canceled, skipped, success;
	// or a status it then stays in for ever (manual, scheduled, created, pending,
	// waiting_for_resource, preparing, running, canceling), as a pipeline blocked on a
	// manual job or a resource does.
	Status string `json:"status,omitempty"`
	// FailureReason of the failed job (default Options.FailureReason).
	FailureReason string `json:"failure_reason,omitempty"`
}

// AddPipelineRule adds a rule to every project (rules are checked in order; the first
// that matches decides).
func (s *Sim) AddPipelineRule(r PipelineRule) error {
	if r.Status == "" {
		r.Status = PipelineFailed
	}
	if !slices.Contains(PipelineStatuses, r.Status) {
		return errors.New("gitlabsim: unknown pipeline status " + r.Status)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.PipelineRules = append(s.opts.PipelineRules, r)
	return nil
}

// ClearPipelineRules removes every pipeline rule.
func (s *Sim) ClearPipelineRules() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.PipelineRules = nil
}

// ruleFor returns the outcome the first matching rule plans for the n-th (1-based)
// pipeline of ref, or ok=false.
func (s *Sim) ruleFor(ref string, n int) (status, reason string, ok bool) {
	for _, r := range s.opts.PipelineRules {
		if !strings.HasPrefix(ref, r.RefPrefix) || (r.First > 0 && n > r.First) {
			continue
		}
		status, reason = r.Status, r.FailureReason
		if status == "" {
			status = PipelineFailed
		}
		if status == PipelineFailed && reason == "" {
			reason = s.opts.FailureReason
		}
		return status, reason, true
	}
	return "", "", false
}

// SetPipelineStatus puts a pipeline in any status now, as GitLab's pipeline does on
// its way (pending, running …) or at its end; reason is the failed job's
// failure_reason (default Options.FailureReason). A pipeline that succeeds lets the
// MRs armed on it merge.
func (s *Sim) SetPipelineStatus(project string, pipelineID int64, status, reason string) error {
	if !slices.Contains(PipelineStatuses, status) {
		return errors.New("gitlabsim: unknown pipeline status " + status)
	}
	return s.finishByID(project, pipelineID, status, reason)
}

// SetMRPipelineStatus is SetPipelineStatus for an MR's head pipeline.
func (s *Sim) SetMRPipelineStatus(project string, iid int64, status, reason string) error {
	id, err := s.headPipelineID(project, iid)
	if err != nil {
		return err
	}
	return s.SetPipelineStatus(project, id, status, reason)
}

// PipelineCount is how many (parent) pipelines ran for a branch, and how many of them
// ended in each status.
func (s *Sim) PipelineCount(project, ref string) (total int, byStatus map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byStatus = map[string]int{}
	p := s.projectLocked(project)
	if p == nil {
		return 0, byStatus
	}
	for _, pl := range p.pipelines {
		if pl.ref == ref && pl.parent == nil {
			total++
			byStatus[pl.status]++
		}
	}
	return total, byStatus
}

// jobStatusFor is the status of a pipeline's job when the pipeline is in status st.
func jobStatusFor(st string) string {
	switch st {
	case PipelineWaitingForResource, PipelinePreparing, PipelineCreated:
		return st
	case PipelineCanceling:
		return PipelineRunning
	}
	return st // pending, running, success, failed, canceled, skipped, manual, scheduled
}
