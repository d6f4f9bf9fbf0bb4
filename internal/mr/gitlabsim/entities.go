package gitlabsim

import (
	"slices"
	"strconv"
	"time"
)

// The functions below render GitLab's API entities (lib/api/entities in GitLab) for
// the fields the simulator models; the rest carry GitLab's defaults so clients that
// decode the full shape see the same types.

func ts(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

func tsPtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return ts(*t)
}

func (s *Sim) userJSON() map[string]any {
	return map[string]any{
		"id": s.user.ID, "username": s.user.Username, "name": s.user.Name, "state": "active",
		"locked": false, "avatar_url": nil, "web_url": s.webBase() + "/" + s.user.Username,
	}
}

func (s *Sim) commitJSON(p *project, c *commit, detail bool) map[string]any {
	parents := c.parents
	if parents == nil {
		parents = []string{}
	}
	trailers := c.trailers()
	ext := map[string][]string{}
	for k, v := range trailers {
		ext[k] = []string{v}
	}
	out := map[string]any{
		"id": c.sha, "short_id": c.sha[:8], "created_at": ts(c.createdAt), "parent_ids": parents,
		"title": c.title(), "message": c.message,
		"author_name": c.author, "author_email": c.email, "authored_date": ts(c.createdAt),
		"committer_name": c.author, "committer_email": c.email, "committed_date": ts(c.createdAt),
		"trailers": trailers, "extended_trailers": ext,
		"web_url": s.webBase() + "/" + p.path + "/-/commit/" + c.sha,
	}
	if detail {
		out["stats"] = map[string]any{"additions": c.additions, "deletions": c.deletions, "total": c.additions + c.deletions}
		out["status"] = nil
		out["project_id"] = p.id
		out["last_pipeline"] = nil
		for i := len(p.pipelines) - 1; i >= 0; i-- {
			if pl := p.pipelines[i]; pl.sha == c.sha {
				out["status"] = pl.status
				out["last_pipeline"] = s.pipelineBasicJSON(p, pl)
				break
			}
		}
	}
	return out
}

func (s *Sim) branchJSON(p *project, name string) map[string]any {
	sha := p.branches[name]
	merged := false
	if name != p.defaultBranch {
		merged = s.ancestors(p.branches[p.defaultBranch])[sha]
	}
	return map[string]any{
		"name": name, "merged": merged, "protected": p.protected[name], "default": name == p.defaultBranch,
		"developers_can_push": false, "developers_can_merge": false, "can_push": !p.protected[name],
		"web_url": s.webBase() + "/" + p.path + "/-/tree/" + name,
		"commit":  s.commitJSON(p, s.commits[sha], false),
	}
}

func (s *Sim) pipelineBasicJSON(p *project, pl *pipeline) map[string]any {
	source := "push"
	if pl.parent != nil {
		source = "parent_pipeline"
	}
	return map[string]any{
		"id": pl.id, "iid": pl.iid, "project_id": p.id, "sha": pl.sha, "ref": pl.ref, "status": pl.status,
		"source": source, "created_at": ts(pl.createdAt), "updated_at": ts(pl.updatedAt),
		"web_url": s.webBase() + "/" + p.path + "/-/pipelines/" + strconv.FormatInt(pl.id, 10),
	}
}

func (s *Sim) pipelineJSON(p *project, pl *pipeline) map[string]any {
	out := s.pipelineBasicJSON(p, pl)
	var duration any
	if pl.finishedAt != nil && pl.startedAt != nil {
		duration = int64(pl.finishedAt.Sub(*pl.startedAt).Seconds())
	}
	out["before_sha"] = "0000000000000000000000000000000000000000"
	out["tag"] = false
	out["yaml_errors"] = nil
	out["user"] = s.userJSON()
	out["started_at"] = tsPtr(pl.startedAt)
	out["finished_at"] = tsPtr(pl.finishedAt)
	out["committed_at"] = nil
	out["duration"] = duration
	// GitLab documents queued_duration as seconds with a fraction (0.010 in its
	// examples); clients must not assume an integer.
	out["queued_duration"] = 0.01
	out["coverage"] = nil
	out["archived"] = false
	out["name"] = nil
	out["detailed_status"] = map[string]any{
		"icon": "status_" + pl.status, "text": pl.status, "label": pl.status, "group": pl.status,
		"tooltip": pl.status, "has_details": true, "details_path": "/" + p.path + "/-/pipelines/" + strconv.FormatInt(pl.id, 10),
		"illustration": nil, "favicon": "/assets/ci_favicons/favicon_status_" + pl.status + ".png",
	}
	return out
}

// bridgeJSON is a pipeline's trigger job as GET …/pipelines/:id/bridges lists it,
// with its downstream (child) pipeline.
func (s *Sim) bridgeJSON(p *project, pl *pipeline) map[string]any {
	c := pl.child
	return map[string]any{
		"id": pl.bridgeID, "name": "trigger-tests", "stage": "test", "status": c.status, "ref": pl.ref,
		"tag": false, "allow_failure": false, "created_at": ts(pl.createdAt), "started_at": tsPtr(pl.startedAt),
		"finished_at": tsPtr(c.finishedAt), "user": s.userJSON(),
		"pipeline":            s.pipelineBasicJSON(p, pl),
		"downstream_pipeline": s.pipelineBasicJSON(p, c),
		"web_url":             s.webBase() + "/" + p.path + "/-/jobs/" + strconv.FormatInt(pl.bridgeID, 10),
	}
}

func (s *Sim) jobJSON(p *project, pl *pipeline, j *job) map[string]any {
	var duration any
	if j.finishedAt != nil && j.startedAt != nil {
		duration = j.finishedAt.Sub(*j.startedAt).Seconds()
	}
	out := map[string]any{
		"id": j.id, "status": j.status, "stage": j.stage, "name": j.name, "ref": pl.ref, "tag": false,
		"coverage": nil, "allow_failure": false, "created_at": ts(j.createdAt), "started_at": tsPtr(j.startedAt),
		"finished_at": tsPtr(j.finishedAt), "erased_at": nil, "duration": duration, "queued_duration": 0.0,
		"user": s.userJSON(), "commit": s.commitJSON(p, s.commits[pl.sha], false),
		"pipeline":  map[string]any{"id": pl.id, "project_id": p.id, "ref": pl.ref, "sha": pl.sha, "status": pl.status},
		"web_url":   s.webBase() + "/" + p.path + "/-/jobs/" + strconv.FormatInt(j.id, 10),
		"project":   map[string]any{"ci_job_token_scope_enabled": false},
		"artifacts": []any{}, "runner": nil, "artifacts_expire_at": nil, "archived": false, "tag_list": []string{},
	}
	if j.status == "failed" {
		out["failure_reason"] = j.failureReason
	}
	return out
}

// mrBasicJSON is Entities::MergeRequestBasic (list answers).
func (s *Sim) mrBasicJSON(p *project, m *mergeRequest) map[string]any {
	sha := s.mrSHA(p, m)
	dms := s.detailedMergeStatus(p, m)
	mergeStatus := legacyMergeStatus(dms)
	var mergedBy, closedBy any
	if m.state == "merged" {
		mergedBy = s.userJSON()
	}
	if m.state == "closed" {
		closedBy = s.userJSON()
	}
	var mergeCommit any
	if m.mergeCommit != "" {
		mergeCommit = m.mergeCommit
	}
	labels := slices.Clone(m.labels)
	if labels == nil {
		labels = []string{}
	}
	ref := "!" + strconv.FormatInt(m.iid, 10)
	sourceProject := p.id
	if m.forkProject != 0 {
		sourceProject = m.forkProject
	}
	return map[string]any{
		"id": m.id, "iid": m.iid, "project_id": p.id, "title": m.title, "description": m.description,
		"state": m.state, "created_at": ts(m.createdAt), "updated_at": ts(m.updatedAt),
		"merged_by": mergedBy, "merge_user": mergedBy, "merged_at": tsPtr(m.mergedAt), "merge_after": nil,
		"prepared_at": ts(m.createdAt), "closed_by": closedBy, "closed_at": tsPtr(m.closedAt),
		"target_branch": m.target, "source_branch": m.source, "user_notes_count": 0, "upvotes": 0, "downvotes": 0,
		"author": s.userJSON(), "assignees": []any{}, "assignee": nil, "reviewers": []any{},
		"source_project_id": sourceProject, "target_project_id": p.id, "labels": labels, "draft": false,
		"imported": false, "imported_from": "none", "work_in_progress": false, "milestone": nil,
		"merge_when_pipeline_succeeds": m.autoMerge, "merge_status": mergeStatus, "detailed_merge_status": dms,
		"sha": sha, "merge_commit_sha": mergeCommit, "squash_commit_sha": nil, "discussion_locked": nil,
		"should_remove_source_branch": nil, "force_remove_source_branch": m.removeSource,
		"allow_collaboration": false, "allow_maintainer_to_push": false,
		"reference": ref, "references": map[string]any{"short": ref, "relative": ref, "full": p.path + ref},
		"web_url":    s.webBase() + "/" + p.path + "/-/merge_requests/" + strconv.FormatInt(m.iid, 10),
		"time_stats": map[string]any{"time_estimate": 0, "total_time_spent": 0, "human_time_estimate": nil, "human_total_time_spent": nil},
		"squash":     m.squash, "squash_on_merge": m.squash,
		"task_completion_status":        map[string]any{"count": 0, "completed_count": 0},
		"has_conflicts":                 dms == "conflict",
		"blocking_discussions_resolved": true, "approvals_before_merge": nil,
	}
}

// mrJSON is Entities::MergeRequest (get, create, update, merge answers).
func (s *Sim) mrJSON(p *project, m *mergeRequest) map[string]any {
	out := s.mrBasicJSON(p, m)
	sha := s.mrSHA(p, m)
	var head, basic any
	var started, finished any
	if pl := s.headPipeline(p, m); pl != nil {
		head = s.pipelineJSON(p, pl)
		basic = s.pipelineBasicJSON(p, pl)
		started, finished = tsPtr(pl.startedAt), tsPtr(pl.finishedAt)
	}
	base := ""
	if tgt, ok := p.branches[m.target]; ok && sha != "" {
		base = s.mergeBase(tgt, sha)
	}
	changes := 0
	if bc, hc := s.commits[base], s.commits[sha]; hc != nil {
		var bf map[string]string
		if bc != nil {
			bf = bc.files
		}
		changes = len(diffFiles(bf, hc.files))
	}
	var mergeErr any
	if m.mergeError != "" {
		mergeErr = m.mergeError
	}
	out["subscribed"] = true
	out["changes_count"] = strconv.Itoa(changes)
	out["latest_build_started_at"] = started
	out["latest_build_finished_at"] = finished
	out["first_deployed_to_production_at"] = nil
	out["pipeline"] = basic
	out["head_pipeline"] = head
	out["diff_refs"] = map[string]any{"base_sha": base, "head_sha": sha, "start_sha": p.branches[m.target]}
	out["merge_error"] = mergeErr
	out["first_contribution"] = false
	out["user"] = map[string]any{"can_merge": true}
	return out
}

func (s *Sim) projectJSON(p *project) map[string]any {
	name := p.path
	if i := lastSlash(p.path); i >= 0 {
		name = p.path[i+1:]
	}
	return map[string]any{
		"id": p.id, "name": name, "path": name, "path_with_namespace": p.path, "name_with_namespace": p.path,
		"default_branch": p.defaultBranch, "web_url": s.webBase() + "/" + p.path,
		"http_url_to_repo": s.webBase() + "/" + p.path + ".git", "created_at": ts(p.createdAt),
		"visibility": "private", "only_allow_merge_if_pipeline_succeeds": true, "merge_method": p.mergeMethod,
	}
}

func lastSlash(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return i
		}
	}
	return -1
}
