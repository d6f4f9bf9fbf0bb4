package gitlabsim

import (
	"encoding/json"
	"strconv"
	"time"
)

// Webhook payloads as GitLab sends them (X-Gitlab-Event "Merge Request Hook" and
// "Pipeline Hook"), for tests and the demo to feed a receiver such as batcherd's
// webhook. The simulator does not deliver them itself.

// webhookTime is the time format of webhook payloads ("2016-08-12 15:23:28 UTC").
func webhookTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 MST") }

func webhookTimePtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return webhookTime(*t)
}

func (s *Sim) hookProjectJSON(p *project) map[string]any {
	name := p.path
	if i := lastSlash(p.path); i >= 0 {
		name = p.path[i+1:]
	}
	ns := p.path
	if i := lastSlash(p.path); i >= 0 {
		ns = p.path[:i]
	}
	return map[string]any{
		"id": p.id, "name": name, "description": "", "web_url": s.webBase() + "/" + p.path, "avatar_url": nil,
		"git_ssh_url": "git@sim:" + p.path + ".git", "git_http_url": s.webBase() + "/" + p.path + ".git",
		"namespace": ns, "visibility_level": 0, "path_with_namespace": p.path, "default_branch": p.defaultBranch,
		"ci_config_path": nil,
	}
}

func (s *Sim) hookUserJSON() map[string]any {
	return map[string]any{"id": s.user.ID, "name": s.user.Name, "username": s.user.Username, "avatar_url": nil, "email": s.user.Email}
}

func (s *Sim) hookCommitJSON(p *project, sha string) map[string]any {
	c := s.commits[sha]
	if c == nil {
		return nil
	}
	return map[string]any{
		"id": c.sha, "message": c.message, "title": c.title(), "timestamp": c.createdAt.UTC().Format(time.RFC3339),
		"url":    s.webBase() + "/" + p.path + "/-/commit/" + c.sha,
		"author": map[string]any{"name": c.author, "email": c.email},
	}
}

// MergeRequestEvent renders the Merge Request Hook payload GitLab sends for an action
// (open, update, merge, close, …) on an MR.
func (s *Sim) MergeRequestEvent(project string, iid int64, action string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, m, err := s.mrLocked(project, iid)
	if err != nil {
		return nil, err
	}
	dms := s.detailedMergeStatus(p, m)
	var headPipeline any
	if pl := s.headPipeline(p, m); pl != nil {
		headPipeline = pl.id
	}
	stateID := map[string]int{"opened": 1, "closed": 2, "merged": 3, "locked": 4}[m.state]
	var mergeCommit, mergeErr any
	if m.mergeCommit != "" {
		mergeCommit = m.mergeCommit
	}
	if m.mergeError != "" {
		mergeErr = m.mergeError
	}
	labels := []any{}
	for i, l := range m.labels {
		labels = append(labels, map[string]any{"id": i + 1, "title": l, "color": "#adb21a", "project_id": p.id,
			"created_at": webhookTime(m.createdAt), "updated_at": webhookTime(m.createdAt), "template": false,
			"description": nil, "type": "ProjectLabel", "group_id": nil})
	}
	now := s.now()
	attrs := map[string]any{
		"author_id": s.user.ID, "created_at": webhookTime(m.createdAt), "description": m.description, "draft": false,
		"head_pipeline_id": headPipeline, "id": m.id, "iid": m.iid, "last_edited_at": nil, "last_edited_by_id": nil,
		"merge_commit_sha": mergeCommit, "merged_at": webhookTimePtr(m.mergedAt), "merge_error": mergeErr,
		"merge_params": map[string]any{"force_remove_source_branch": "0"}, "merge_status": legacyMergeStatus(dms),
		"merge_user_id": nil, "merge_when_pipeline_succeeds": m.autoMerge, "milestone_id": nil,
		"source_branch": m.source, "source_project_id": p.id, "squash_commit_sha": nil, "state_id": stateID,
		"target_branch": m.target, "target_branch_protected": p.protected[m.target], "target_project_id": p.id,
		"time_estimate": 0, "title": m.title, "updated_at": webhookTime(m.updatedAt), "updated_by_id": nil,
		"prepared_at": webhookTime(m.createdAt), "assignee_ids": []any{}, "blocking_discussions_resolved": true,
		"detailed_merge_status": dms, "first_contribution": false, "human_time_change": nil,
		"human_time_estimate": nil, "human_total_time_spent": nil, "labels": labels,
		"last_commit": s.hookCommitJSON(p, s.mrSHA(p, m)), "reviewer_ids": []any{},
		"source": s.hookProjectJSON(p), "state": m.state, "system": false, "target": s.hookProjectJSON(p),
		"time_change": 0, "total_time_spent": 0,
		"url":    s.webBase() + "/" + p.path + "/-/merge_requests/" + strconv.FormatInt(m.iid, 10),
		"action": action, "actioned_at": webhookTime(now),
	}
	return json.Marshal(map[string]any{
		"object_kind": "merge_request", "event_type": "merge_request", "user": s.hookUserJSON(),
		"project": s.hookProjectJSON(p), "object_attributes": attrs, "labels": labels,
		"changes": map[string]any{}, "assignees": []any{}, "reviewers": []any{},
	})
}

// PipelineEvent renders the Pipeline Hook payload GitLab sends when a pipeline changes
// status; merge_request is set when an open MR has the pipeline's branch as source.
func (s *Sim) PipelineEvent(project string, pipelineID int64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return nil, ErrNotFound
	}
	var pl *pipeline
	for _, x := range p.pipelines {
		if x.id == pipelineID {
			pl = x
		}
	}
	if pl == nil {
		return nil, ErrNotFound
	}
	var duration any
	if pl.finishedAt != nil && pl.startedAt != nil {
		duration = int64(pl.finishedAt.Sub(*pl.startedAt).Seconds())
	}
	source := "push"
	if pl.parent != nil {
		source = "parent_pipeline"
	}
	attrs := map[string]any{
		"id": pl.id, "iid": pl.iid, "name": nil, "ref": pl.ref, "tag": false, "sha": pl.sha,
		"before_sha": "0000000000000000000000000000000000000000", "source": source, "status": pl.status,
		"detailed_status": pl.status, "stages": []string{"test"}, "created_at": webhookTime(pl.createdAt),
		"finished_at": webhookTimePtr(pl.finishedAt), "duration": duration, "queued_duration": 0,
		"variables": []any{}, "url": s.webBase() + "/" + p.path + "/-/pipelines/" + strconv.FormatInt(pl.id, 10),
	}
	var mrJSON any
	for _, m := range p.mrs {
		if m.source == pl.ref && m.state == "opened" {
			mrJSON = map[string]any{
				"id": m.id, "iid": m.iid, "title": m.title, "source_branch": m.source, "source_project_id": p.id,
				"target_branch": m.target, "target_project_id": p.id, "state": m.state,
				"merge_status": legacyMergeStatus(s.detailedMergeStatus(p, m)), "detailed_merge_status": s.detailedMergeStatus(p, m),
				"url": s.webBase() + "/" + p.path + "/-/merge_requests/" + strconv.FormatInt(m.iid, 10),
			}
		}
	}
	builds := []any{}
	for _, j := range pl.jobs {
		var jd, reason any
		if j.finishedAt != nil && j.startedAt != nil {
			jd = j.finishedAt.Sub(*j.startedAt).Seconds()
		}
		if j.failureReason != "" {
			reason = j.failureReason
		}
		builds = append(builds, map[string]any{
			"id": j.id, "stage": j.stage, "name": j.name, "status": j.status, "created_at": webhookTime(j.createdAt),
			"started_at": webhookTimePtr(j.startedAt), "finished_at": webhookTimePtr(j.finishedAt), "duration": jd,
			"queued_duration": 0.0, "failure_reason": reason, "when": "on_success", "manual": j.status == PipelineManual,
			"allow_failure": false, "user": s.hookUserJSON(), "runner": nil,
			"artifacts_file": map[string]any{"filename": nil, "size": nil}, "environment": nil,
		})
	}
	var sourcePipeline any
	if pl.parent != nil {
		sourcePipeline = map[string]any{
			"project":     map[string]any{"id": p.id, "web_url": s.webBase() + "/" + p.path, "path_with_namespace": p.path},
			"pipeline_id": pl.parent.id, "job_id": pl.parent.bridgeID,
		}
	}
	return json.Marshal(map[string]any{
		"object_kind": "pipeline", "object_attributes": attrs, "merge_request": mrJSON, "user": s.hookUserJSON(),
		"project": s.hookProjectJSON(p), "commit": s.hookCommitJSON(p, pl.sha), "builds": builds,
		"source_pipeline": sourcePipeline,
	})
}
