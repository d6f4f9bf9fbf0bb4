package gitlabsim

import (
	"encoding/base64"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func init() {
	addRoute(http.MethodGet, "/projects/:id", getProject)
	addRoute(http.MethodGet, "/projects/:id/repository/branches", listBranches)
	addRoute(http.MethodPost, "/projects/:id/repository/branches", createBranch)
	addRoute(http.MethodGet, "/projects/:id/repository/branches/:branch", getBranch)
	addRoute(http.MethodDelete, "/projects/:id/repository/branches/:branch", deleteBranch)
	addRoute(http.MethodPost, "/projects/:id/repository/commits", createCommit)
	addRoute(http.MethodGet, "/projects/:id/repository/commits/:sha", getCommit)
	addRoute(http.MethodGet, "/projects/:id/repository/tree", listTree)
	addRoute(http.MethodGet, "/projects/:id/merge_requests", listMRs)
	addRoute(http.MethodPost, "/projects/:id/merge_requests", createMR)
	addRoute(http.MethodGet, "/projects/:id/merge_requests/:iid", getMR)
	addRoute(http.MethodPut, "/projects/:id/merge_requests/:iid", updateMR)
	addRoute(http.MethodPut, "/projects/:id/merge_requests/:iid/merge", mergeMR)
	addRoute(http.MethodPost, "/projects/:id/merge_requests/:iid/cancel_merge_when_pipeline_succeeds", cancelAutoMerge)
	addRoute(http.MethodGet, "/projects/:id/pipelines/:pid", getPipeline)
	addRoute(http.MethodGet, "/projects/:id/pipelines/:pid/jobs", listPipelineJobs)
	addRoute(http.MethodGet, "/projects/:id/pipelines/:pid/bridges", listPipelineBridges)
}

func ok(status int, body any) (*reply, *apiError) { return &reply{status: status, body: body}, nil }

func getProject(s *Sim, q *req) (*reply, *apiError) { return ok(http.StatusOK, s.projectJSON(q.proj)) }

func listBranches(s *Sim, q *req) (*reply, *apiError) {
	names := slices.Sorted(maps.Keys(q.proj.branches))
	if search, ok := q.str("search"); ok && search != "" {
		names = slices.DeleteFunc(names, func(n string) bool { return !strings.Contains(n, search) })
	}
	page, h := paginate(q, names, true)
	out := make([]any, 0, len(page))
	for _, n := range page {
		out = append(out, s.branchJSON(q.proj, n))
	}
	return &reply{status: http.StatusOK, body: out, headers: h}, nil
}

func getBranch(s *Sim, q *req) (*reply, *apiError) {
	name := q.segs[4]
	if _, ok := q.proj.branches[name]; !ok {
		return nil, notFound("Branch")
	}
	return ok(http.StatusOK, s.branchJSON(q.proj, name))
}

func deleteBranch(s *Sim, q *req) (*reply, *apiError) {
	name := q.segs[4]
	if _, ok := q.proj.branches[name]; !ok {
		return nil, notFound("Branch")
	}
	if name == q.proj.defaultBranch || q.proj.protected[name] {
		return nil, msgErr(http.StatusForbidden, "403 Forbidden")
	}
	for _, m := range q.proj.mrs {
		if m.source == name && (m.state == "opened" || m.state == "locked") {
			m.frozenSHA = q.proj.branches[name]
		}
	}
	delete(q.proj.branches, name)
	return &reply{status: http.StatusNoContent}, nil
}

// validBranchName follows git check-ref-format's rules that matter in practice.
func validBranchName(n string) bool {
	if n == "" || n == "HEAD" || strings.HasPrefix(n, "-") || strings.HasPrefix(n, "/") || strings.HasSuffix(n, "/") ||
		strings.HasSuffix(n, ".") || strings.HasSuffix(n, ".lock") || strings.Contains(n, "..") ||
		strings.Contains(n, "//") || strings.Contains(n, "@{") || strings.ContainsAny(n, " ~^:?*[\\\x7f") {
		return false
	}
	for _, r := range n {
		if r < 0x20 {
			return false
		}
	}
	return true
}

// resolveRef turns a branch name or a (full or 8+ char short) sha into a commit sha.
func (s *Sim) resolveRef(p *project, ref string) (string, bool) {
	if sha, ok := p.branches[ref]; ok {
		return sha, true
	}
	if len(ref) >= 8 {
		for sha := range s.commits {
			if strings.HasPrefix(sha, ref) {
				return sha, true
			}
		}
	}
	return "", false
}

func createBranch(s *Sim, q *req) (*reply, *apiError) {
	if e := q.missing("branch", "ref"); e != nil {
		return nil, e
	}
	name, _ := q.str("branch")
	ref, _ := q.str("ref")
	if !validBranchName(name) {
		return nil, msgErr(http.StatusBadRequest, "Branch name is invalid")
	}
	if _, exists := q.proj.branches[name]; exists {
		return nil, msgErr(http.StatusBadRequest, "Branch already exists")
	}
	sha, found := s.resolveRef(q.proj, ref)
	if !found {
		return nil, msgErr(http.StatusBadRequest, "Invalid reference name: "+ref)
	}
	q.proj.branches[name] = sha
	// A new branch is a push: GitLab runs a pipeline for it.
	s.createPipeline(q.proj, name, sha)
	s.recheckBranch(q.proj, name)
	return ok(http.StatusCreated, s.branchJSON(q.proj, name))
}

func getCommit(s *Sim, q *req) (*reply, *apiError) {
	sha, found := s.resolveRef(q.proj, q.segs[4])
	if !found {
		return nil, notFound("Commit")
	}
	return ok(http.StatusOK, s.commitJSON(q.proj, s.commits[sha], true))
}

func cleanPath(p string) (string, *apiError) {
	if p == "" {
		return "", msgErr(http.StatusBadRequest, "You must provide a file path")
	}
	for part := range strings.SplitSeq(p, "/") {
		if part == ".." {
			return "", msgErr(http.StatusBadRequest, "Path cannot include directory traversal")
		}
	}
	return strings.TrimPrefix(p, "/"), nil
}

// One function on purpose: its checks and per-action cases follow the order in which
// GitLab answers (validation, protection, start ref, then each action in turn), so the
// first failing check decides the answer as it does on GitLab.
func createCommit(s *Sim, q *req) (*reply, *apiError) {
	if e := q.missing("branch", "commit_message", "actions"); e != nil {
		return nil, e
	}
	branch, _ := q.str("branch")
	message, _ := q.str("commit_message")
	rawActions, isList := q.params["actions"].([]any)
	if !isList {
		return nil, validationErr("actions is invalid")
	}
	if len(rawActions) == 0 {
		return nil, validationErr("actions is empty")
	}
	_, hasStartBranch := q.params["start_branch"]
	if _, hasStartSHA := q.params["start_sha"]; hasStartBranch && hasStartSHA {
		return nil, validationErr("start_branch, start_sha are mutually exclusive")
	}
	if q.proj.protected[branch] {
		return nil, msgErr(http.StatusForbidden, "403 Forbidden - You are not allowed to push into this branch")
	}
	if s.opts.MaxActionsPerCommit > 0 && len(rawActions) > s.opts.MaxActionsPerCommit {
		return nil, msgErr(http.StatusBadRequest, fmt.Sprintf("Too many actions: the simulator accepts at most %d per commit", s.opts.MaxActionsPerCommit))
	}
	head, e := s.commitStart(q, branch)
	if e != nil {
		return nil, e
	}
	files := maps.Clone(s.commits[head].files)
	for i, ra := range rawActions {
		a, isMap := ra.(map[string]any)
		if !isMap {
			return nil, validationErr(fmt.Sprintf("actions[%d] is invalid", i))
		}
		action, _ := a["action"].(string)
		fp, hasPath := a["file_path"].(string)
		if !hasPath {
			return nil, validationErr(fmt.Sprintf("actions[%d][file_path] is missing", i))
		}
		fp, perr := cleanPath(fp)
		if perr == nil {
			perr = s.refusedPath(q.proj, fp)
		}
		if perr != nil {
			return nil, perr
		}
		content, _ := a["content"].(string)
		if enc, _ := a["encoding"].(string); enc == "base64" {
			b, err := base64.StdEncoding.DecodeString(content)
			if err != nil {
				return nil, msgErr(http.StatusBadRequest, "Invalid base64 content")
			}
			content = string(b)
		}
		_, present := files[fp]
		switch action {
		case "create":
			if present {
				return nil, msgErr(http.StatusBadRequest, "A file with this name already exists")
			}
			if hasDirPrefix(files, fp) {
				return nil, msgErr(http.StatusBadRequest, "A directory with this name already exists")
			}
			files[fp] = content
		case "update":
			if !present {
				return nil, msgErr(http.StatusBadRequest, "A file with this name doesn't exist")
			}
			files[fp] = content
		case "delete":
			if !present {
				return nil, msgErr(http.StatusBadRequest, "A file with this name doesn't exist")
			}
			delete(files, fp)
		case "move":
			prev, _ := a["previous_path"].(string)
			if _, ok := files[prev]; !ok {
				return nil, msgErr(http.StatusBadRequest, "A file with this name doesn't exist")
			}
			if present {
				return nil, msgErr(http.StatusBadRequest, "A file with this name already exists")
			}
			if _, given := a["content"]; !given {
				content = files[prev]
			}
			delete(files, prev)
			files[fp] = content
		case "chmod":
			if !present {
				return nil, msgErr(http.StatusBadRequest, "A file with this name doesn't exist")
			}
		default:
			return nil, validationErr(fmt.Sprintf("actions[%d][action] does not have a valid value", i))
		}
	}
	c := s.newCommit([]string{head}, message, files)
	q.proj.branches[branch] = c.sha
	if branch != q.proj.defaultBranch {
		s.createPipeline(q.proj, branch, c.sha)
	}
	s.recheckBranch(q.proj, branch)
	return ok(http.StatusCreated, s.commitJSON(q.proj, c, true))
}

// commitStart is the commit a new commit on branch starts from, checked as GitLab's
// Commits::CreateService validates it (validate_start_sha!, validate_on_branch!,
// validate_branch_existence!, validate_new_branch_name!), each refusal a 400:
//
//   - without start_branch and start_sha the start is branch itself, which must exist;
//   - start_sha must be a full commit id of a commit the repository has;
//   - start_branch must exist;
//   - starting from anything else than branch itself (another start_branch, any
//     start_sha — even branch's own head) creates branch, so branch must not exist,
//     unless force, which points the existing branch at the new commit;
//   - and the branch name must be valid.
func (s *Sim) commitStart(q *req, branch string) (string, *apiError) {
	startBranch, hasStartBranch := q.str("start_branch")
	startSHA, hasStartSHA := q.str("start_sha")
	if !hasStartBranch && !hasStartSHA {
		startBranch = branch // the API's default: attrs[:start_branch] ||= attrs[:branch_name]
	}
	var start string
	if hasStartSHA {
		if !isCommitID(startSHA) {
			return "", msgErr(http.StatusBadRequest, "Invalid start_sha '"+startSHA+"'")
		}
		start = strings.ToLower(startSHA)
		if s.commits[start] == nil {
			return "", msgErr(http.StatusBadRequest, "Cannot find start_sha '"+startSHA+"'")
		}
	} else {
		sha, ok := q.proj.branches[startBranch]
		if !ok {
			return "", msgErr(http.StatusBadRequest, "You can only create or edit files when you are on a branch")
		}
		start = sha
	}
	if hasStartSHA || startBranch != branch {
		if _, exists := q.proj.branches[branch]; exists && !q.boolean("force") {
			return "", msgErr(http.StatusBadRequest, "A branch called '"+branch+"' already exists. Switch to that branch in order to make changes")
		}
		if !validBranchName(branch) {
			return "", msgErr(http.StatusBadRequest, "Something went wrong when we tried to create '"+branch+"' for you: Branch name is invalid")
		}
	}
	return start, nil
}

// isCommitID: a full commit id, 40 (SHA-1) or 64 (SHA-256) hex digits
// (Gitlab::Git.commit_id?); a short sha or a branch name is not one.
func isCommitID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			return false
		}
	}
	return true
}

func hasDirPrefix(files map[string]string, p string) bool {
	prefix := p + "/"
	for f := range files {
		if strings.HasPrefix(f, prefix) {
			return true
		}
	}
	return false
}

type treeEntry struct {
	id, name, typ, path, mode string
}

// One function on purpose: ref lookup, the directory walk (recursive or not) and both
// paginations in GitLab's answer order; split, that order would be spread out.
func listTree(s *Sim, q *req) (*reply, *apiError) {
	ref, hasRef := q.str("ref")
	if !hasRef || ref == "" {
		ref = q.proj.defaultBranch
	}
	sha, found := s.resolveRef(q.proj, ref)
	if !found {
		return nil, notFound("Tree")
	}
	files := s.commits[sha].files
	dir, _ := q.str("path")
	dir = strings.Trim(dir, "/")
	recursive := q.boolean("recursive")
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	dirs := map[string]bool{}
	var blobs []treeEntry
	for p, content := range files {
		if !strings.HasPrefix(p, prefix) {
			continue
		}
		rest := strings.TrimPrefix(p, prefix)
		parts := strings.Split(rest, "/")
		if recursive {
			for i := 1; i < len(parts); i++ {
				dirs[prefix+strings.Join(parts[:i], "/")] = true
			}
			blobs = append(blobs, treeEntry{id: blobID(content), name: parts[len(parts)-1], typ: "blob", path: p, mode: "100644"})
			continue
		}
		if len(parts) > 1 {
			dirs[prefix+parts[0]] = true
			continue
		}
		blobs = append(blobs, treeEntry{id: blobID(content), name: parts[0], typ: "blob", path: p, mode: "100644"})
	}
	if dir != "" && len(blobs) == 0 && len(dirs) == 0 {
		return nil, notFound("Tree")
	}
	var entries []treeEntry
	for d := range dirs {
		entries = append(entries, treeEntry{id: treeID(d, files), name: d[lastSlash(d)+1:], typ: "tree", path: d, mode: "040000"})
	}
	if recursive {
		entries = append(entries, blobs...)
		sort.Slice(entries, func(i, j int) bool { return entries[i].path < entries[j].path })
	} else {
		// Non-recursive listings show directories first, as GitLab does.
		sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
		sort.Slice(blobs, func(i, j int) bool { return blobs[i].name < blobs[j].name })
		entries = append(entries, blobs...)
	}
	render := func(es []treeEntry) []any {
		out := make([]any, 0, len(es))
		for _, e := range es {
			out = append(out, map[string]any{"id": e.id, "name": e.name, "type": e.typ, "path": e.path, "mode": e.mode})
		}
		return out
	}
	if p, _ := q.str("pagination"); p == "keyset" {
		// Keyset pagination: page_token names the last entry of the previous page
		// (its path, so identical blobs cannot confuse it) and the next page's URL
		// comes in the Link header.
		per := q.integer("per_page", 20)
		if per < 1 || per > 100 {
			per = min(max(per, 20), 100)
		}
		start := 0
		if tok, _ := q.str("page_token"); tok != "" {
			start = sort.Search(len(entries), func(i int) bool { return entries[i].path > tok })
			if !recursive {
				start = len(entries)
				for i, e := range entries {
					if e.path == tok {
						start = i + 1
						break
					}
				}
			}
		}
		end := min(start+int(per), len(entries))
		page := entries[min(start, len(entries)):end]
		h := http.Header{}
		if end < len(entries) && len(page) > 0 {
			h.Set("Link", linkTo(q, map[string]string{"page_token": page[len(page)-1].path}, "next"))
		}
		return &reply{status: http.StatusOK, body: render(page), headers: h}, nil
	}
	page, h := paginate(q, entries, false)
	return &reply{status: http.StatusOK, body: render(page), headers: h}, nil
}

func (q *req) mrIID() (int64, *apiError) {
	iid, err := strconv.ParseInt(q.segs[3], 10, 64)
	if err != nil {
		return 0, validationErr("merge_request_iid is invalid")
	}
	return iid, nil
}

func (q *req) findMR() (*mergeRequest, *apiError) {
	iid, e := q.mrIID()
	if e != nil {
		return nil, e
	}
	m := q.proj.mr(iid)
	if m == nil {
		return nil, notFound("Merge Request")
	}
	return m, nil
}

// One function on purpose: a flat list of GitLab's filters, each a few lines.
func listMRs(s *Sim, q *req) (*reply, *apiError) {
	state, _ := q.str("state")
	if state == "" {
		state = "all"
	}
	switch state {
	case "all", "opened", "closed", "merged", "locked":
	default:
		return nil, validationErr("state does not have a valid value")
	}
	src, hasSrc := q.str("source_branch")
	tgt, hasTgt := q.str("target_branch")
	labels, hasLabels := q.list("labels")
	iids, hasIIDs := q.list("iids")
	var ms []*mergeRequest
	for _, m := range q.proj.mrs {
		if state != "all" && m.state != state {
			continue
		}
		if hasSrc && m.source != src {
			continue
		}
		if hasTgt && m.target != tgt {
			continue
		}
		if hasLabels && !hasAllLabels(m.labels, labels) {
			continue
		}
		if hasIIDs && !slices.Contains(iids, strconv.FormatInt(m.iid, 10)) {
			continue
		}
		ms = append(ms, m)
	}
	orderBy, _ := q.str("order_by")
	desc := true
	if sortDir, _ := q.str("sort"); sortDir == "asc" {
		desc = false
	}
	sort.SliceStable(ms, func(i, j int) bool {
		a, b := ms[i], ms[j]
		less := a.createdAt.Before(b.createdAt) || (a.createdAt.Equal(b.createdAt) && a.id < b.id)
		if orderBy == "updated_at" {
			less = a.updatedAt.Before(b.updatedAt) || (a.updatedAt.Equal(b.updatedAt) && a.id < b.id)
		}
		if desc {
			return !less
		}
		return less
	})
	page, h := paginate(q, ms, true)
	out := make([]any, 0, len(page))
	for _, m := range page {
		out = append(out, s.mrBasicJSON(q.proj, m))
	}
	return &reply{status: http.StatusOK, body: out, headers: h}, nil
}

func hasAllLabels(have, want []string) bool {
	for _, w := range want {
		switch strings.ToLower(w) {
		case "any":
			if len(have) == 0 {
				return false
			}
			continue
		case "none":
			if len(have) > 0 {
				return false
			}
			continue
		}
		if !slices.ContainsFunc(have, func(h string) bool { return strings.EqualFold(h, w) }) {
			return false
		}
	}
	return true
}

func getMR(s *Sim, q *req) (*reply, *apiError) {
	m, e := q.findMR()
	if e != nil {
		return nil, e
	}
	s.readMR(q.proj, m)
	out := s.mrJSON(q.proj, m)
	if q.boolean("include_rebase_in_progress") {
		out["rebase_in_progress"] = m.rebase != nil
	}
	return ok(http.StatusOK, out)
}

func createMR(s *Sim, q *req) (*reply, *apiError) {
	if e := q.missing("title", "source_branch", "target_branch"); e != nil {
		return nil, e
	}
	title, _ := q.str("title")
	src, _ := q.str("source_branch")
	tgt, _ := q.str("target_branch")
	if tp, has := q.str("target_project_id"); has && tp != strconv.FormatInt(q.proj.id, 10) {
		return nil, msgErr(http.StatusUnprocessableEntity, []string{"Validate fork Source project is not a fork of the target project"})
	}
	if src == tgt {
		return nil, msgErr(http.StatusUnprocessableEntity, []string{"You can't use same project/branch for source and target"})
	}
	if _, ok := q.proj.branches[src]; !ok {
		return nil, msgErr(http.StatusUnprocessableEntity, []string{fmt.Sprintf("Source branch \"%s\" does not exist", src)})
	}
	if _, ok := q.proj.branches[tgt]; !ok {
		return nil, msgErr(http.StatusUnprocessableEntity, []string{fmt.Sprintf("Target branch \"%s\" does not exist", tgt)})
	}
	for _, m := range q.proj.mrs {
		if m.source == src && m.target == tgt && m.state == "opened" && m.forkProject == 0 {
			return nil, msgErr(http.StatusConflict, []string{fmt.Sprintf("Another open merge request already exists for this source branch: !%d", m.iid)})
		}
	}
	desc, _ := q.str("description")
	labels, _ := q.list("labels")
	now := s.now()
	s.nextMRID++
	q.proj.nextIID++
	m := &mergeRequest{
		id: s.nextMRID, iid: q.proj.nextIID, title: title, description: desc, source: src, target: tgt,
		labels: dedupe(labels), state: "opened", createdAt: now, updatedAt: now,
		removeSource: q.boolean("remove_source_branch"), squash: q.boolean("squash"),
	}
	q.proj.mrs = append(q.proj.mrs, m)
	s.startCheck(m, "preparing")
	return ok(http.StatusCreated, s.mrJSON(q.proj, m))
}

func dedupe(in []string) []string {
	out := []string{}
	for _, l := range in {
		if !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

var updateParams = []string{"assignee_id", "assignee_ids", "reviewer_ids", "description", "labels", "add_labels",
	"remove_labels", "milestone_id", "milestone", "remove_source_branch", "allow_collaboration",
	"allow_maintainer_to_push", "squash", "target_branch", "title", "state_event", "discussion_locked", "merge_after"}

// One function on purpose: parameters, state event, each field, then the state change,
// in GitLab's answer order, so the first failing check decides the answer as there.
func updateMR(s *Sim, q *req) (*reply, *apiError) {
	m, e := q.findMR()
	if e != nil {
		return nil, e
	}
	given := false
	for _, k := range updateParams {
		if _, has := q.params[k]; has {
			given = true
			break
		}
	}
	if !given {
		return nil, validationErr(strings.Join(updateParams, ", ") + " are missing, at least one parameter must be provided")
	}
	ev, hasEv := q.str("state_event")
	if hasEv && ev != "close" && ev != "reopen" {
		return nil, validationErr("state_event does not have a valid value")
	}
	if t, has := q.str("title"); has {
		if t == "" {
			return nil, validationErr("title is empty")
		}
		m.title = t
	}
	if d, has := q.str("description"); has {
		m.description = d
	}
	if ls, has := q.list("labels"); has {
		m.labels = dedupe(ls)
	}
	if ls, has := q.list("add_labels"); has {
		m.labels = dedupe(append(m.labels, ls...))
	}
	if ls, has := q.list("remove_labels"); has {
		m.labels = slices.DeleteFunc(m.labels, func(l string) bool { return slices.Contains(ls, l) })
	}
	if _, has := q.params["remove_source_branch"]; has {
		m.removeSource = q.boolean("remove_source_branch")
	}
	// Invalid transitions (closing a merged MR, reopening an open one) are ignored by
	// GitLab's state machine: the answer is 200 with the MR as it is.
	switch ev {
	case "close":
		s.closeMR(q.proj, m)
	case "reopen":
		if m.state == "closed" {
			if _, has := q.proj.branches[m.source]; has {
				conflict := false
				for _, o := range q.proj.mrs {
					if o != m && o.source == m.source && o.target == m.target && o.state == "opened" {
						conflict = true
					}
				}
				if conflict {
					return nil, msgErr(http.StatusConflict, []string{fmt.Sprintf("Another open merge request already exists for this source branch: !%d", m.iid)})
				}
				m.state = "opened"
				m.closedAt = nil
				m.frozenSHA = ""
			}
		}
	}
	m.updatedAt = s.now()
	return ok(http.StatusOK, s.mrJSON(q.proj, m))
}

// mergeMR follows GitLab's PUT …/merge as the simulated version does it.
//
// 17.11 and later: the sha guard first (409); then auto_merge (or its deprecated alias
// merge_when_pipeline_succeeds) arms auto-merge when something it can wait for is
// pending (a running pipeline, a mergeability check) and merges at once when nothing
// is; a plain merge merges a mergeable MR; anything else is 405, and 422 "Branch cannot
// be merged" when the merge itself fails.
//
// Before 17.11: auto_merge is unknown (dropped like any unknown parameter), so only
// merge_when_pipeline_succeeds arms, and only while the head pipeline is active; a
// call that can neither arm nor merge now is 405, an armable one on an MR that cannot
// merge (conflict, rebase needed) 422, and the sha guard (409) comes after both.
//
// One function on purpose: its branches are GitLab's answer order above, by version;
// split, that order would be spread over several functions.
func mergeMR(s *Sim, q *req) (*reply, *apiError) {
	m, e := q.findMR()
	if e != nil {
		return nil, e
	}
	p := q.proj
	head := s.mrSHA(p, m)
	sha, hasSHA := q.str("sha")
	shaErr := func() *apiError {
		if hasSHA && sha != head {
			return msgErr(http.StatusConflict, "SHA does not match HEAD of source branch: "+head)
		}
		return nil
	}
	notAllowed := msgErr(http.StatusMethodNotAllowed, "405 Method Not Allowed")
	cannot := msgErr(http.StatusUnprocessableEntity, "Branch cannot be merged")
	if s.ver.shaFirst() {
		if e := shaErr(); e != nil {
			return nil, e
		}
	}
	auto := q.boolean("merge_when_pipeline_succeeds")
	if s.ver.knowsAutoMerge() {
		auto = auto || q.boolean("auto_merge")
	}
	if m.state != "opened" || s.pipelineCreating(p, m) {
		// Nothing merges, and auto-merge is not available, while the head's pipeline is
		// being created.
		return nil, notAllowed
	}
	dms := s.detailedMergeStatus(p, m)
	pl := s.headPipeline(p, m)
	arm := func() (*reply, *apiError) {
		m.autoMerge = true
		m.autoMergeSHA = head
		m.mergeError = ""
		m.updatedAt = s.now()
		return ok(http.StatusOK, s.mrJSON(p, m))
	}
	now := func() (*reply, *apiError) {
		if err := s.doMerge(p, m, head, false); err != nil {
			return nil, cannot
		}
		return ok(http.StatusOK, s.mrJSON(p, m))
	}
	if s.ver.knowsAutoMerge() {
		switch {
		case auto && (dms == "ci_still_running" || dms == "checking" || dms == "unchecked" || dms == "preparing"):
			return arm()
		case dms == "mergeable":
			return now()
		}
		return nil, notAllowed
	}
	automatically := auto && pl != nil && activeStatus(pl.status)
	switch {
	case automatically && (dms == "conflict" || dms == "need_rebase"):
		return nil, cannot
	case automatically:
		if e := shaErr(); e != nil {
			return nil, e
		}
		return arm()
	case dms == "mergeable":
		if e := shaErr(); e != nil {
			return nil, e
		}
		return now()
	}
	return nil, notAllowed
}

func cancelAutoMerge(s *Sim, q *req) (*reply, *apiError) {
	m, e := q.findMR()
	if e != nil {
		return nil, e
	}
	if m.state != "opened" || !m.autoMerge {
		return nil, msgErr(http.StatusNotAcceptable, "406 Not Acceptable")
	}
	m.autoMerge = false
	m.updatedAt = s.now()
	return ok(http.StatusCreated, s.mrJSON(q.proj, m))
}

func (q *req) findPipeline() (*pipeline, *apiError) {
	id, err := strconv.ParseInt(q.segs[3], 10, 64)
	if err != nil {
		return nil, validationErr("pipeline_id is invalid")
	}
	for _, pl := range q.proj.pipelines {
		if pl.id == id {
			return pl, nil
		}
	}
	return nil, notFound("")
}

func getPipeline(s *Sim, q *req) (*reply, *apiError) {
	pl, e := q.findPipeline()
	if e != nil {
		return nil, e
	}
	return ok(http.StatusOK, s.pipelineJSON(q.proj, pl))
}

// listPipelineBridges lists a pipeline's trigger jobs (GitLab leaves them out of the
// jobs listing), filtered by scope like the jobs.
func listPipelineBridges(s *Sim, q *req) (*reply, *apiError) {
	pl, e := q.findPipeline()
	if e != nil {
		return nil, e
	}
	out := []any{}
	scope, hasScope := q.list("scope")
	if pl.child != nil && (!hasScope || len(scope) == 0 || slices.Contains(scope, pl.child.status)) {
		out = append(out, s.bridgeJSON(q.proj, pl))
	}
	return &reply{status: http.StatusOK, body: out}, nil
}

func listPipelineJobs(s *Sim, q *req) (*reply, *apiError) {
	pl, e := q.findPipeline()
	if e != nil {
		return nil, e
	}
	scope, hasScope := q.list("scope")
	withRetried := q.boolean("include_retried")
	var jobs []*job
	for _, j := range pl.jobs {
		if j.retried && !withRetried {
			continue
		}
		if hasScope && len(scope) > 0 && !slices.Contains(scope, j.status) {
			continue
		}
		jobs = append(jobs, j)
	}
	// GitLab lists a pipeline's jobs newest first.
	sort.Slice(jobs, func(i, k int) bool { return jobs[i].id > jobs[k].id })
	page, h := paginate(q, jobs, true)
	out := make([]any, 0, len(page))
	for _, j := range page {
		out = append(out, s.jobJSON(q.proj, pl, j))
	}
	return &reply{status: http.StatusOK, body: out, headers: h}, nil
}
