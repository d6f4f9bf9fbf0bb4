package gitlabsim

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// mrSHA is the MR's head sha: the source branch head while open, frozen once merged
// or closed (GitLab keeps the diff it merged/closed with).
func (s *Sim) mrSHA(p *project, m *mergeRequest) string {
	if (m.state == "opened" || m.state == "locked") && m.forkProject == 0 {
		if sha, ok := p.branches[m.source]; ok {
			return sha
		}
	}
	return m.frozenSHA
}

// headPipeline is the latest pipeline for the MR's source branch at its head sha (a
// child pipeline is never an MR's head pipeline: its parent is).
func (s *Sim) headPipeline(p *project, m *mergeRequest) *pipeline {
	sha := s.mrSHA(p, m)
	for i := len(p.pipelines) - 1; i >= 0; i-- {
		pl := p.pipelines[i]
		if pl.ref == m.source && pl.sha == sha && pl.parent == nil && pl.creating <= 0 {
			return pl
		}
	}
	return nil
}

// pipelineCreating reports whether a pipeline for the MR's head is still being created.
func (s *Sim) pipelineCreating(p *project, m *mergeRequest) bool {
	sha := s.mrSHA(p, m)
	for _, pl := range p.pipelines {
		if pl.ref == m.source && pl.sha == sha && pl.parent == nil && pl.creating > 0 {
			return true
		}
	}
	return false
}

// conflicts reports whether the open MR cannot merge cleanly.
func (s *Sim) conflicts(p *project, m *mergeRequest) bool {
	if m.state != "opened" {
		return false
	}
	src, ok := p.branches[m.source]
	if !ok {
		return false
	}
	_, conf, _ := s.mergeResult(p.branches[m.target], src)
	return len(conf) > 0
}

// detailedMergeStatus follows GitLab's values for the cases the simulator models, in
// GitLab's order: not open, a pending mergeability check, conflicts, a needed rebase,
// then CI. The project requires a successful pipeline before merge.
func (s *Sim) detailedMergeStatus(p *project, m *mergeRequest) string {
	if m.state != "opened" {
		return "not_open"
	}
	if _, ok := p.branches[m.source]; !ok && m.forkProject == 0 {
		return "broken_status"
	}
	if st := s.checkStatus(m); st != "" {
		return st
	}
	if s.conflicts(p, m) {
		return "conflict"
	}
	if s.needRebase(p, m) {
		return "need_rebase"
	}
	if s.pipelineCreating(p, m) {
		return "ci_still_running"
	}
	if pl := s.headPipeline(p, m); pl != nil {
		switch {
		case activeStatus(pl.status):
			return "ci_still_running"
		case pl.status != PipelineSuccess:
			// failed, canceled, skipped, manual: none of them is a passed pipeline.
			return "ci_must_pass"
		}
	}
	return "mergeable"
}

// mergeable is GitLab's merge_request.mergeable? for the modelled checks.
func (s *Sim) mergeable(p *project, m *mergeRequest) bool {
	return s.detailedMergeStatus(p, m) == "mergeable"
}

var errConflict = errors.New("gitlabsim: merge conflict")

var errNeedRebase = errors.New("gitlabsim: fast-forward merge is not possible: the source branch must be rebased onto the target branch")

// doMerge merges the MR into its target by the project's merge method: a merge commit
// of the MR's changes since the merge base (merge; rebase_merge once the source
// contains the target's head), or the target moved to the source's head (ff). sha,
// when set, must be the head.
func (s *Sim) doMerge(p *project, m *mergeRequest, sha string, human bool) error {
	src, ok := p.branches[m.source]
	if !ok {
		return errors.New("gitlabsim: source branch is gone")
	}
	if sha != "" && sha != src {
		return errors.New("gitlabsim: sha does not match the source head")
	}
	tgt := p.branches[m.target]
	merged, conf, _ := s.mergeResult(tgt, src)
	if len(conf) > 0 {
		return fmt.Errorf("%w: %s", errConflict, strings.Join(conf, ", "))
	}
	if p.mergeMethod != MergeMethodMerge && !s.ancestors(src)[tgt] {
		return errNeedRebase
	}
	mergeCommit := src
	if p.mergeMethod == MergeMethodFastForward {
		p.branches[m.target] = src
	} else {
		msg := fmt.Sprintf("Merge branch '%s' into '%s'\n\n%s\n\nSee merge request %s!%d", m.source, m.target, m.title, p.path, m.iid)
		c := s.newCommit([]string{tgt, src}, msg, merged)
		p.branches[m.target] = c.sha
		mergeCommit = c.sha
	}
	now := s.now()
	m.state = "merged"
	m.mergedAt = &now
	m.updatedAt = now
	m.mergeCommit = mergeCommit
	m.targetAtMerge = tgt
	m.frozenSHA = src
	m.autoMerge = false
	m.mergedByHuman = human
	m.check = asyncCheck{}
	if m.removeSource {
		delete(p.branches, m.source)
	}
	s.recheckBranch(p, m.target)
	return nil
}

// closeMR closes an open MR. As in GitLab (close transitions only from opened), a
// locked MR — one being merged — stays as it is, and the caller reads it back locked.
func (s *Sim) closeMR(p *project, m *mergeRequest) {
	if m.state != "opened" {
		return
	}
	now := s.now()
	m.frozenSHA = s.mrSHA(p, m)
	m.state = "closed"
	m.closedAt = &now
	m.updatedAt = now
	m.autoMerge = false
}

// createPipeline starts the pipeline for a commit pushed to ref. Its outcome is
// decided now (poison rules, pipeline rules, random failure rate) and applied when it
// finishes.
func (s *Sim) createPipeline(p *project, ref, sha string) *pipeline {
	n := s.runsOf(p, ref) + 1
	s.nextPipeID++
	s.nextJobID++
	now := s.now()
	start := s.opts.PipelineStartStatus
	var started *time.Time
	if start == PipelineRunning {
		started = &now
	}
	pl := &pipeline{
		id: s.nextPipeID, iid: int64(len(p.pipelines) + 1), projectID: p.id,
		sha: sha, ref: ref, status: start, createdAt: now, startedAt: started, updatedAt: now,
		planned: PipelineSuccess, creating: s.opts.PipelineCreateReads,
	}
	pl.jobs = []*job{{id: s.nextJobID, name: "test", stage: "test", status: jobStatusFor(start), createdAt: now, startedAt: started}}
	if s.opts.ChildPipelines {
		// The job moves to a child pipeline the parent's bridge job triggers.
		s.nextPipeID++
		s.nextJobID++
		child := &pipeline{
			id: s.nextPipeID, iid: int64(len(p.pipelines) + 2), projectID: p.id,
			sha: sha, ref: ref, status: start, createdAt: now, startedAt: started, updatedAt: now,
			jobs: pl.jobs, parent: pl,
		}
		pl.jobs, pl.child, pl.bridgeID = nil, child, s.nextJobID
		defer func() { p.pipelines = append(p.pipelines, child) }()
	}
	if reason, bad := s.poisoned(p, sha); bad {
		pl.planned, pl.plannedReason = PipelineFailed, reason
	} else if st, reason, ok := s.ruleFor(ref, n); ok {
		pl.planned, pl.plannedReason = st, reason
	} else if s.opts.FailureRate > 0 && s.rng.Float64() < s.opts.FailureRate {
		pl.planned, pl.plannedReason = PipelineFailed, s.opts.FailureReason
	}
	p.pipelines = append(p.pipelines, pl)
	s.schedule(p, pl)
	return pl
}

// schedule finishes a pipeline with its planned outcome after PipelineDuration (at
// once when zero; never by itself with ManualPipelines).
func (s *Sim) schedule(p *project, pl *pipeline) {
	switch {
	case s.opts.ManualPipelines:
	case s.opts.PipelineDuration <= 0:
		s.finishPipeline(p, pl, pl.planned, pl.plannedReason)
	default:
		var t *time.Timer
		t = time.AfterFunc(s.opts.PipelineDuration, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.timers, t)
			if s.closed {
				return
			}
			s.finishPipeline(p, pl, pl.planned, pl.plannedReason)
		})
		s.timers[t] = true
	}
}

// poisoned checks the commit's changes relative to the default branch against the
// project's poison rules.
func (s *Sim) poisoned(p *project, sha string) (string, bool) {
	if len(p.poison) == 0 {
		return "", false
	}
	c := s.commits[sha]
	base := s.commits[p.branches[p.defaultBranch]]
	if c == nil || base == nil {
		return "", false
	}
	changes := diffFiles(base.files, c.files)
	for i, r := range p.poison {
		inPath, inContent := r.InPath, r.InContent
		if !inPath && !inContent {
			inPath, inContent = true, true
		}
		for path, ch := range changes {
			if (inPath && strings.Contains(path, r.Substring)) || (inContent && !ch.del && strings.Contains(ch.content, r.Substring)) {
				if r.Times > 0 {
					// Count this use; the rule retires after its last one.
					if r.Times == 1 {
						p.poison = append(p.poison[:i:i], p.poison[i+1:]...)
					} else {
						p.poison[i].Times--
					}
				}
				return r.FailureReason, true
			}
		}
	}
	return "", false
}

// finishPipeline puts a pipeline in status (its end, or a status it then stays in)
// and lets armed MRs merge when it succeeded.
func (s *Sim) finishPipeline(p *project, pl *pipeline, status, reason string) {
	if pl.child != nil {
		// The child's jobs fail with the reason; the parent (and its bridge) follow
		// the child's status.
		s.finishPipeline(p, pl.child, status, reason)
	}
	now := s.now()
	pl.status = status
	pl.updatedAt = now
	pl.failureReason = ""
	pl.finishedAt = nil
	if finalStatus(status) {
		pl.finishedAt = &now
	}
	if status == PipelineRunning && pl.startedAt == nil {
		pl.startedAt = &now
	}
	for _, j := range pl.jobs {
		j.status = jobStatusFor(status)
		j.finishedAt = pl.finishedAt
		j.failureReason = ""
		if status == PipelineFailed {
			j.failureReason = reason
		}
	}
	if status != PipelineSuccess || pl.parent != nil {
		return // armed MRs merge on their head (parent) pipeline
	}
	for _, m := range p.mrs {
		if m.autoMerge && m.state == "opened" && m.source == pl.ref && s.mrSHA(p, m) == pl.sha {
			s.tryAutoMerge(p, m)
		}
	}
}

// tryAutoMerge merges an MR armed for auto-merge whose head pipeline succeeded, or
// aborts the auto-merge with GitLab's reason when it cannot merge. GitLab checks
// mergeability synchronously at this point, so a pending check ends here.
func (s *Sim) tryAutoMerge(p *project, m *mergeRequest) {
	pl := s.headPipeline(p, m)
	if !m.autoMerge || m.state != "opened" || pl == nil || pl.status != PipelineSuccess {
		return
	}
	s.finishCheck(m)
	head := s.mrSHA(p, m)
	if m.autoMergeSHA != "" && m.autoMergeSHA != head {
		// GitLab aborts auto-merge when the source moved after it was armed.
		m.autoMerge = false
		m.mergeError = "Merge request was not merged: the source branch changed after auto-merge was set"
		return
	}
	if err := s.doMerge(p, m, head, false); err != nil {
		m.autoMerge = false
		m.mergeError = "Merge request is not mergeable"
		if errors.Is(err, errNeedRebase) {
			m.mergeError = "Fast-forward merge is not possible. Rebase the source branch onto the target branch."
		}
	}
}
