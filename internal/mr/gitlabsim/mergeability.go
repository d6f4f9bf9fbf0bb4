package gitlabsim

import (
	"maps"
	"net/http"
	"time"
)

// asyncCheck is GitLab's asynchronous mergeability check of one MR: after the MR is
// created (first shown as preparing) or either branch moves (unchecked), it reads
// checking until done. GitLab runs it in a background job; the simulator finishes it
// once the MR was read enough times and enough time passed (Options.MergeCheckReads,
// MergeCheckDelay), so tests decide how long a client sees it.
type asyncCheck struct {
	pending bool
	first   string // preparing or unchecked: what the first read shows
	shown   bool   // the first read happened
	reads   int    // reads left
	until   time.Time
}

// startCheck begins a mergeability check of m (first: preparing or unchecked).
func (s *Sim) startCheck(m *mergeRequest, first string) {
	if s.opts.MergeCheckReads <= 0 && s.opts.MergeCheckDelay <= 0 {
		return
	}
	m.check = asyncCheck{pending: true, first: first, reads: s.opts.MergeCheckReads, until: s.now().Add(s.opts.MergeCheckDelay)}
}

// recheckBranch restarts the check of every open MR whose source or target is ref:
// GitLab marks them unchecked when either branch moves.
func (s *Sim) recheckBranch(p *project, ref string) {
	for _, m := range p.mrs {
		if m.state == "opened" && (m.source == ref || m.target == ref) && !m.check.pending {
			s.startCheck(m, "unchecked")
		}
	}
}

// checkStatus is the status the pending check shows now ("" when done).
func (s *Sim) checkStatus(m *mergeRequest) string {
	if !m.check.pending {
		return ""
	}
	if m.check.reads <= 0 && !s.now().Before(m.check.until) {
		m.check = asyncCheck{}
		return ""
	}
	if !m.check.shown {
		return m.check.first
	}
	return "checking"
}

// readMR counts one read of m (GET of the single MR) towards its pending check and
// rebase, and finishes them when due.
func (s *Sim) readMR(p *project, m *mergeRequest) {
	if m.state == "opened" {
		for _, pl := range p.pipelines {
			if pl.ref == m.source && pl.creating > 0 {
				pl.creating--
			}
		}
	}
	if m.check.pending {
		m.check.shown = true
		if m.check.reads > 0 {
			m.check.reads--
		}
		if s.checkStatus(m) == "" {
			// The check is done: an MR armed while it ran merges now if it can.
			s.tryAutoMerge(p, m)
		}
	}
	if r := m.rebase; r != nil {
		if r.reads > 0 {
			r.reads--
		}
		if r.reads <= 0 && !s.now().Before(r.until) {
			s.finishRebase(p, m)
		}
	}
}

// finishCheck completes a pending check at once: GitLab checks mergeability
// synchronously when it is about to merge (auto-merge firing, a human's merge).
func (s *Sim) finishCheck(m *mergeRequest) { m.check = asyncCheck{} }

// needRebase: the project merges only fast-forward or semi-linear, and the MR's source
// does not contain the target's head.
func (s *Sim) needRebase(p *project, m *mergeRequest) bool {
	if p.mergeMethod == MergeMethodMerge || m.state != "opened" {
		return false
	}
	src, ok := p.branches[m.source]
	if !ok {
		return false
	}
	return !s.ancestors(src)[p.branches[m.target]]
}

// asyncRebase is a rebase GitLab is running for an MR (rebase_in_progress).
type asyncRebase struct {
	reads  int
	until  time.Time
	skipCI bool
}

func init() {
	addRoute(http.MethodPut, "/projects/:id/merge_requests/:iid/rebase", rebaseMR)
}

// rebaseMR is PUT …/merge_requests/:iid/rebase: 202 {"rebase_in_progress": true}; the
// rebase runs in the background and its outcome shows on the MR (rebase_in_progress
// false, a new sha, or merge_error when it failed).
func rebaseMR(s *Sim, q *req) (*reply, *apiError) {
	m, e := q.findMR()
	if e != nil {
		return nil, e
	}
	if m.state != "opened" {
		return nil, msgErr(http.StatusForbidden, "403 Forbidden")
	}
	if m.rebase != nil {
		return nil, msgErr(http.StatusConflict, "Rebase is already in progress")
	}
	if _, ok := q.proj.branches[m.source]; !ok {
		return nil, msgErr(http.StatusForbidden, "403 Forbidden")
	}
	reads := s.opts.RebaseReads
	if reads <= 0 {
		reads = 1
	}
	m.rebase = &asyncRebase{reads: reads, until: s.now().Add(s.opts.RebaseDelay), skipCI: q.boolean("skip_ci")}
	m.mergeError = ""
	return ok(http.StatusAccepted, map[string]any{"rebase_in_progress": true})
}

// finishRebase replays the MR's own commits (those not on the target) onto the
// target's head, as git rebase does, keeping each commit's message (and so its
// trailers) under a new sha; a conflict leaves the branch as it was and says so in
// merge_error. A successful rebase is a push: a new pipeline, a new mergeability check,
// and auto-merge aborted (the source branch changed).
//
// One function on purpose: the steps of one rebase (replay, conflict, push effects)
// share its state and read in git's order.
func (s *Sim) finishRebase(p *project, m *mergeRequest) {
	r := m.rebase
	m.rebase = nil
	src, ok := p.branches[m.source]
	if !ok {
		m.mergeError = "Rebase failed: the source branch is gone"
		return
	}
	tgt := p.branches[m.target]
	onTarget := s.ancestors(tgt)
	var own []*commit // oldest first
	for cur := src; cur != "" && !onTarget[cur]; {
		c := s.commits[cur]
		if c == nil {
			break
		}
		own = append([]*commit{c}, own...)
		if len(c.parents) == 0 {
			break
		}
		cur = c.parents[0]
	}
	head := tgt
	for _, c := range own {
		var parentFiles map[string]string
		if len(c.parents) > 0 {
			if pc := s.commits[c.parents[0]]; pc != nil {
				parentFiles = pc.files
			}
		}
		base := s.commits[head].files
		next := maps.Clone(base)
		for path, ch := range diffFiles(parentFiles, c.files) {
			was, wasHas := parentFiles[path]
			now, nowHas := base[path]
			movedOnTarget := wasHas != nowHas || was != now
			alreadyThere := (ch.del && !nowHas) || (!ch.del && nowHas && now == ch.content)
			if movedOnTarget && !alreadyThere {
				// The target changed this path too, differently: git stops here.
				m.mergeError = "Rebase failed: Rebase locally, resolve all conflicts, then push the branch."
				return
			}
			if ch.del {
				delete(next, path)
			} else {
				next[path] = ch.content
			}
		}
		head = s.newCommit([]string{head}, c.message, next).sha
	}
	p.branches[m.source] = head
	m.updatedAt = s.now()
	if m.autoMerge {
		m.autoMerge = false
		m.mergeError = "Auto-merge was canceled: the source branch was updated"
	}
	s.recheckBranch(p, m.source)
	if !r.skipCI && head != src {
		s.createPipeline(p, m.source, head)
	}
}

// legacyMergeStatus is the deprecated merge_status for a detailed status.
func legacyMergeStatus(detailed string) string {
	switch detailed {
	case "preparing", "unchecked", "checking":
		return detailed
	case "conflict":
		return "cannot_be_merged"
	}
	return "can_be_merged"
}
