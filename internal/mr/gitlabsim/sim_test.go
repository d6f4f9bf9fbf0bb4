package gitlabsim_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
)

const proj = "grp/sub/repo"

var pid = url.PathEscape(proj) // grp%2Fsub%2Frepo

type answer struct {
	status int
	body   any
	header http.Header
}

func (a answer) obj(t *testing.T) map[string]any {
	t.Helper()
	m, ok := a.body.(map[string]any)
	if !ok {
		t.Fatalf("answer %d is not an object: %#v", a.status, a.body)
	}
	return m
}

func (a answer) list(t *testing.T) []any {
	t.Helper()
	l, ok := a.body.([]any)
	if !ok {
		t.Fatalf("answer %d is not a list: %#v", a.status, a.body)
	}
	return l
}

// call makes one raw HTTP request, the way any GitLab client would.
func call(t *testing.T, sim *gitlabsim.Sim, method, path string, body any, hdr ...string) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, sim.URL()+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("PRIVATE-TOKEN", sim.Token())
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s %s: body is not JSON: %q", method, path, raw)
		}
	}
	return answer{status: resp.StatusCode, body: v, header: resp.Header}
}

func want(t *testing.T, a answer, status int, body string) {
	t.Helper()
	got, _ := json.Marshal(a.body)
	if a.status != status || (body != "" && string(got) != body) {
		t.Fatalf("got %d %s, want %d %s", a.status, got, status, body)
	}
}

func api(p string) string { return "/api/v4/projects/" + pid + p }

func TestAuthAndProjectAddressing(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{"other/one", proj}})
	want(t, call(t, sim, "GET", api(""), nil, "PRIVATE-TOKEN", ""), 401, `{"message":"401 Unauthorized"}`)
	want(t, call(t, sim, "GET", api(""), nil, "PRIVATE-TOKEN", "wrong"), 401, `{"message":"401 Unauthorized"}`)
	want(t, call(t, sim, "GET", api(""), nil, "PRIVATE-TOKEN", "", "Authorization", "Bearer "+sim.Token()), 200, "")
	p := call(t, sim, "GET", "/api/v4/projects/2", nil).obj(t)
	if p["path_with_namespace"] != proj || p["default_branch"] != "main" {
		t.Fatalf("project by id: %v", p)
	}
	want(t, call(t, sim, "GET", "/api/v4/projects/no%2Fsuch", nil), 404, `{"message":"404 Project Not Found"}`)
	want(t, call(t, sim, "GET", "/api/v4/nothing/here", nil), 404, `{"error":"404 Not Found"}`)
}

func TestBranchesCommitsAndErrors(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}})
	want(t, call(t, sim, "POST", api("/repository/branches"), map[string]any{}), 400, `{"error":"branch is missing, ref is missing"}`)
	b := call(t, sim, "POST", api("/repository/branches"), map[string]any{"branch": "batcherd/batch-1", "ref": "main"})
	want(t, b, 201, "")
	if b.obj(t)["name"] != "batcherd/batch-1" || b.obj(t)["protected"] != false {
		t.Fatalf("branch: %v", b.body)
	}
	want(t, call(t, sim, "POST", api("/repository/branches"), map[string]any{"branch": "batcherd/batch-1", "ref": "main"}), 400, `{"message":"Branch already exists"}`)
	want(t, call(t, sim, "POST", api("/repository/branches"), map[string]any{"branch": "x", "ref": "nope"}), 400, `{"message":"Invalid reference name: nope"}`)
	want(t, call(t, sim, "GET", api("/repository/branches/"+url.PathEscape("batcherd/batch-1")), nil), 200, "")
	want(t, call(t, sim, "GET", api("/repository/branches/missing"), nil), 404, `{"message":"404 Branch Not Found"}`)

	commit := func(branch string, actions ...map[string]any) answer {
		if actions == nil {
			actions = []map[string]any{}
		}
		return call(t, sim, "POST", api("/repository/commits"), map[string]any{
			"branch": branch, "commit_message": "msg\n\nBatcherd-Batch: 1\nCc: a\n", "actions": actions,
		})
	}
	c := commit("batcherd/batch-1", map[string]any{"action": "create", "file_path": "a/b.yaml", "content": "x"})
	want(t, c, 201, "")
	co := c.obj(t)
	tr, _ := json.Marshal(co["trailers"])
	ext, _ := json.Marshal(co["extended_trailers"])
	if string(tr) != `{"Batcherd-Batch":"1","Cc":"a"}` || string(ext) != `{"Batcherd-Batch":["1"],"Cc":["a"]}` {
		t.Fatalf("trailers %s extended %s", tr, ext)
	}
	if co["stats"].(map[string]any)["additions"].(float64) != 1 || co["title"] != "msg" {
		t.Fatalf("commit: %v", co)
	}
	want(t, commit("batcherd/batch-1", map[string]any{"action": "create", "file_path": "a/b.yaml", "content": "x"}), 400, `{"message":"A file with this name already exists"}`)
	want(t, commit("batcherd/batch-1", map[string]any{"action": "update", "file_path": "a/c.yaml", "content": "x"}), 400, `{"message":"A file with this name doesn't exist"}`)
	want(t, commit("batcherd/batch-1", map[string]any{"action": "delete", "file_path": "a/c.yaml"}), 400, `{"message":"A file with this name doesn't exist"}`)
	want(t, commit("batcherd/batch-1", map[string]any{"action": "create", "file_path": "../x", "content": "x"}), 400, `{"message":"Path cannot include directory traversal"}`)
	want(t, commit("batcherd/batch-1"), 400, `{"error":"actions is empty"}`)
	want(t, commit("main", map[string]any{"action": "create", "file_path": "z", "content": "x"}), 403, `{"message":"403 Forbidden - You are not allowed to push into this branch"}`)
	want(t, commit("no-branch", map[string]any{"action": "create", "file_path": "z", "content": "x"}), 400, `{"message":"You can only create or edit files when you are on a branch"}`)
	// A failed commit changes nothing.
	if n := sim.CommitCount(proj, "batcherd/batch-1"); n != 1 {
		t.Fatalf("%d commits", n)
	}
	want(t, call(t, sim, "GET", api("/repository/commits/"+co["id"].(string)), nil), 200, "")
	want(t, call(t, sim, "GET", api("/repository/commits/0123456789abcdef"), nil), 404, `{"message":"404 Commit Not Found"}`)
}

// TestCommitStartsABranch: the commits API creates the branch it commits into from
// start_branch or start_sha, with GitLab's answers (lib/api/commits.rb and
// Commits::CreateService's validations) when it cannot; the push of the new branch
// runs one pipeline, the commit's — as creating a branch through the branches API
// runs one, on the commit it starts from.
func TestCommitStartsABranch(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, ManualPipelines: true})
	mainHead, _, _ := sim.HeadCommit(proj, "main")
	commit := func(params map[string]any, path string) answer {
		body := map[string]any{"commit_message": "msg", "actions": []map[string]any{{"action": "create", "file_path": path, "content": "x"}}}
		for k, v := range params {
			body[k] = v
		}
		return call(t, sim, "POST", api("/repository/commits"), body)
	}
	parents := func(a answer) []any { return a.obj(t)["parent_ids"].([]any) }

	// start_branch: the new branch starts at main's head, with one pipeline.
	c := commit(map[string]any{"branch": "b1", "start_branch": "main"}, "a")
	want(t, c, 201, "")
	if p := parents(c); len(p) != 1 || p[0] != mainHead {
		t.Fatalf("parents %v, want main's head %s", p, mainHead)
	}
	if head, _, _ := sim.HeadCommit(proj, "b1"); head != c.obj(t)["id"] {
		t.Fatalf("b1 is at %s, want the new commit", head)
	}
	// start_sha: the same from a commit id.
	c = commit(map[string]any{"branch": "b2", "start_sha": mainHead}, "a")
	want(t, c, 201, "")
	if p := parents(c); len(p) != 1 || p[0] != mainHead {
		t.Fatalf("parents %v, want %s", p, mainHead)
	}
	for _, b := range []string{"b1", "b2"} {
		if n, _ := sim.PipelineCount(proj, b); n != 1 {
			t.Errorf("branch %s created by a commit ran %d pipelines, want 1", b, n)
		}
	}
	want(t, call(t, sim, "POST", api("/repository/branches"), map[string]any{"branch": "b3", "ref": "main"}), 201, "")
	if n, _ := sim.PipelineCount(proj, "b3"); n != 1 {
		t.Errorf("branch created through the branches API ran %d pipelines, want 1", n)
	}

	// Starting from anything but the branch itself creates it: refused when it exists.
	exists := `{"message":"A branch called 'b1' already exists. Switch to that branch in order to make changes"}`
	want(t, commit(map[string]any{"branch": "b1", "start_branch": "main"}, "b"), 400, exists)
	want(t, commit(map[string]any{"branch": "b1", "start_sha": mainHead}, "b"), 400, exists)
	b1, _, _ := sim.HeadCommit(proj, "b1")
	want(t, commit(map[string]any{"branch": "b1", "start_sha": b1}, "b"), 400, exists)
	// start_branch = branch is a commit onto it, as is no start at all.
	want(t, commit(map[string]any{"branch": "b1", "start_branch": "b1"}, "b"), 201, "")
	want(t, commit(map[string]any{"branch": "b1"}, "c"), 201, "")
	if n := sim.CommitCount(proj, "b1"); n != 3 {
		t.Fatalf("b1 has %d commits, want 3", n)
	}
	// force points the existing branch at a new commit on the start.
	c = commit(map[string]any{"branch": "b1", "start_sha": mainHead, "force": true}, "d")
	want(t, c, 201, "")
	if n := sim.CommitCount(proj, "b1"); n != 1 {
		t.Fatalf("b1 has %d commits after a forced commit, want 1", n)
	}

	// The start must exist and be a start; the new branch's name must be valid.
	want(t, commit(map[string]any{"branch": "b4", "start_branch": "nope"}, "a"), 400, `{"message":"You can only create or edit files when you are on a branch"}`)
	want(t, commit(map[string]any{"branch": "b4"}, "a"), 400, `{"message":"You can only create or edit files when you are on a branch"}`)
	want(t, commit(map[string]any{"branch": "b4", "start_sha": "main"}, "a"), 400, `{"message":"Invalid start_sha 'main'"}`)
	want(t, commit(map[string]any{"branch": "b4", "start_sha": mainHead[:12]}, "a"), 400, `{"message":"Invalid start_sha '`+mainHead[:12]+`'"}`)
	want(t, commit(map[string]any{"branch": "b4", "start_sha": strings.Repeat("0", 40)}, "a"), 400, `{"message":"Cannot find start_sha '`+strings.Repeat("0", 40)+`'"}`)
	want(t, commit(map[string]any{"branch": "b4", "start_branch": "main", "start_sha": mainHead}, "a"), 400, `{"error":"start_branch, start_sha are mutually exclusive"}`)
	want(t, commit(map[string]any{"branch": "b4..x", "start_branch": "main"}, "a"), 400, `{"message":"Something went wrong when we tried to create 'b4..x' for you: Branch name is invalid"}`)
	// The file actions apply to the start's tree: a refused one creates no branch.
	main := map[string]any{"branch": "b5", "start_branch": "main"}
	want(t, commit(main, "README.md"), 400, `{"message":"A file with this name already exists"}`)
	if _, made := sim.Branches(proj)["b5"]; made {
		t.Fatal("a refused commit created its branch")
	}
	for _, b := range []string{"b4", "b4..x", "b5"} {
		if n, _ := sim.PipelineCount(proj, b); n != 0 {
			t.Errorf("refused commit into %s ran %d pipelines", b, n)
		}
	}
}

func TestTreePagination(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}})
	call(t, sim, "POST", api("/repository/branches"), map[string]any{"branch": "b", "ref": "main"})
	var actions []map[string]any
	for i := range 150 {
		actions = append(actions, map[string]any{"action": "create", "file_path": fmt.Sprintf("bindings/t%d/s%03d.yaml", i%3, i), "content": "same"})
	}
	want(t, call(t, sim, "POST", api("/repository/commits"), map[string]any{"branch": "b", "commit_message": "m", "actions": actions}), 201, "")

	// Keyset: follow Link rel="next" until it is absent.
	seen := map[string]bool{}
	next := api("/repository/tree?ref=b&path=bindings&recursive=true&pagination=keyset&per_page=100")
	pages := 0
	for next != "" {
		a := call(t, sim, "GET", next, nil)
		want(t, a, 200, "")
		for _, e := range a.list(t) {
			n := e.(map[string]any)
			if seen[n["path"].(string)] {
				t.Fatalf("duplicate %v", n)
			}
			seen[n["path"].(string)] = true
		}
		pages++
		next = ""
		if l := a.header.Get("Link"); l != "" {
			u, _ := url.Parse(strings.Trim(strings.Split(l, ";")[0], "<>"))
			next = u.RequestURI()
		}
	}
	if len(seen) != 153 || pages != 2 { // 150 blobs + 3 trees
		t.Fatalf("keyset listing: %d entries in %d pages", len(seen), pages)
	}
	// Offset: X-Next-Page.
	a := call(t, sim, "GET", api("/repository/tree?ref=b&path=bindings/t0&per_page=20&page=2"), nil)
	if a.header.Get("X-Next-Page") != "3" || a.header.Get("X-Page") != "2" || len(a.list(t)) != 20 {
		t.Fatalf("offset page: %v %d", a.header, len(a.list(t)))
	}
	n := a.list(t)[0].(map[string]any)
	if n["type"] != "blob" || n["mode"] != "100644" || len(n["id"].(string)) != 40 {
		t.Fatalf("tree node: %v", n)
	}
	want(t, call(t, sim, "GET", api("/repository/tree?ref=b&path=nope"), nil), 404, `{"message":"404 Tree Not Found"}`)
}

func openMR(t *testing.T, sim *gitlabsim.Sim, branch, path, content string) (iid int64, sha string) {
	t.Helper()
	want(t, call(t, sim, "POST", api("/repository/branches"), map[string]any{"branch": branch, "ref": "main"}), 201, "")
	c := call(t, sim, "POST", api("/repository/commits"), map[string]any{"branch": branch, "commit_message": "m",
		"actions": []map[string]any{{"action": "create", "file_path": path, "content": content}}})
	want(t, c, 201, "")
	m := call(t, sim, "POST", api("/merge_requests"), map[string]any{"source_branch": branch, "target_branch": "main", "title": "t", "labels": "batcherd,x"})
	want(t, m, 201, "")
	return int64(m.obj(t)["iid"].(float64)), c.obj(t)["id"].(string)
}

func TestMergeRequestsLifecycle(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, ManualPipelines: true})
	iid, sha := openMR(t, sim, "batcherd/batch-1", "a.yaml", "a")
	mrPath := api(fmt.Sprintf("/merge_requests/%d", iid))
	want(t, call(t, sim, "POST", api("/merge_requests"), map[string]any{"source_branch": "batcherd/batch-1", "target_branch": "main", "title": "t"}),
		409, `{"message":["Another open merge request already exists for this source branch: !1"]}`)
	want(t, call(t, sim, "POST", api("/merge_requests"), map[string]any{"source_branch": "nope", "target_branch": "main", "title": "t"}),
		422, `{"message":["Source branch \"nope\" does not exist"]}`)
	want(t, call(t, sim, "POST", api("/merge_requests"), map[string]any{"target_branch": "main"}), 400, `{"error":"title is missing, source_branch is missing"}`)

	m := call(t, sim, "GET", mrPath, nil).obj(t)
	hp := m["head_pipeline"].(map[string]any)
	if m["detailed_merge_status"] != "ci_still_running" || hp["status"] != "running" || hp["sha"] != sha || m["sha"] != sha {
		t.Fatalf("fresh MR: %v", m)
	}
	list := call(t, sim, "GET", api("/merge_requests?state=opened&labels=batcherd&source_branch=batcherd%2Fbatch-1"), nil)
	if len(list.list(t)) != 1 || list.header.Get("X-Total") != "1" {
		t.Fatalf("list: %v", list.body)
	}
	if _, has := list.list(t)[0].(map[string]any)["head_pipeline"]; has {
		t.Fatal("list answers use the basic entity, without head_pipeline")
	}

	want(t, call(t, sim, "PUT", mrPath+"/merge", map[string]any{"sha": "deadbeef"}), 409, `{"message":"SHA does not match HEAD of source branch: `+sha+`"}`)
	want(t, call(t, sim, "PUT", mrPath+"/merge", map[string]any{"sha": sha}), 405, `{"message":"405 Method Not Allowed"}`)
	armed := call(t, sim, "PUT", mrPath+"/merge", map[string]any{"sha": sha, "auto_merge": true})
	want(t, armed, 200, "")
	if armed.obj(t)["merge_when_pipeline_succeeds"] != true || armed.obj(t)["state"] != "opened" {
		t.Fatalf("armed: %v", armed.body)
	}
	if err := sim.SucceedMRPipeline(proj, iid); err != nil {
		t.Fatal(err)
	}
	merged := call(t, sim, "GET", mrPath, nil).obj(t)
	if merged["state"] != "merged" || merged["merged_at"] == nil || merged["merge_commit_sha"] == nil || sim.Files(proj)["a.yaml"] != "a" {
		t.Fatalf("auto-merge did not merge: %v", merged)
	}
	// Closing a merged MR leaves it merged; a closed MR can be closed again.
	closed := call(t, sim, "PUT", mrPath, map[string]any{"state_event": "close"})
	if closed.status != 200 || closed.obj(t)["state"] != "merged" {
		t.Fatalf("close of merged: %d %v", closed.status, closed.body)
	}
	want(t, call(t, sim, "PUT", mrPath, map[string]any{}), 400, "")
	want(t, call(t, sim, "PUT", mrPath, map[string]any{"state_event": "bogus"}), 400, `{"error":"state_event does not have a valid value"}`)
	want(t, call(t, sim, "GET", api("/merge_requests/99"), nil), 404, `{"message":"404 Merge Request Not Found"}`)
}

func TestConflictsAndAutoMergeAbort(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, ManualPipelines: true})
	iid, _ := openMR(t, sim, "b1", "same.yaml", "mine")
	theirs := "theirs"
	if _, err := sim.PushToDefault(proj, map[string]*string{"same.yaml": &theirs}, "human"); err != nil {
		t.Fatal(err)
	}
	m := call(t, sim, "GET", api(fmt.Sprintf("/merge_requests/%d", iid)), nil).obj(t)
	if m["detailed_merge_status"] != "conflict" || m["has_conflicts"] != true || m["merge_status"] != "cannot_be_merged" {
		t.Fatalf("conflict not detected: %v", m)
	}
	if err := sim.MergeMR(proj, iid); err == nil {
		t.Fatal("a conflicting MR merged")
	}
	// Non-overlapping changes merge cleanly, even after the default branch moved.
	iid2, sha2 := openMR(t, sim, "b2", "other.yaml", "x")
	must(t, sim.SucceedMRPipeline(proj, iid2))
	want(t, call(t, sim, "PUT", api(fmt.Sprintf("/merge_requests/%d/merge", iid2)), map[string]any{"sha": sha2}), 200, "")
	if f := sim.Files(proj); f["other.yaml"] != "x" || f["same.yaml"] != "theirs" {
		t.Fatalf("files after merge: %v", f)
	}
	// Auto-merge armed at one sha does not merge a newer head.
	iid3, sha3 := openMR(t, sim, "b3", "third.yaml", "x")
	want(t, call(t, sim, "PUT", api(fmt.Sprintf("/merge_requests/%d/merge", iid3)), map[string]any{"sha": sha3, "merge_when_pipeline_succeeds": true}), 200, "")
	want(t, call(t, sim, "POST", api("/repository/commits"), map[string]any{"branch": "b3", "commit_message": "more",
		"actions": []map[string]any{{"action": "create", "file_path": "fourth.yaml", "content": "y"}}}), 201, "")
	must(t, sim.SucceedMRPipeline(proj, iid3))
	if st, _ := sim.MR(proj, iid3); st.State != "opened" || st.AutoMerge {
		t.Fatalf("auto-merge armed at an older sha merged or stayed armed: %+v", st)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestPipelinesPoisonAndDeterministicFailures(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, PipelineDuration: 30 * time.Millisecond})
	must(t, sim.AddPoison(proj, gitlabsim.PoisonRule{Substring: "evil", InContent: true, FailureReason: "stuck_or_timeout_failure"}))
	iid, _ := openMR(t, sim, "p1", "x.yaml", "an evil line")
	deadline := time.Now().Add(3 * time.Second)
	for {
		st, _ := sim.MR(proj, iid)
		if st.PipelineStatus == "failed" {
			jobs := call(t, sim, "GET", api(fmt.Sprintf("/pipelines/%d/jobs?scope[]=failed", st.PipelineID)), nil).list(t)
			if len(jobs) != 1 || jobs[0].(map[string]any)["failure_reason"] != "stuck_or_timeout_failure" {
				t.Fatalf("failed jobs: %v", jobs)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipeline never failed: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The same seed fails the same pipelines.
	outcomes := func() string {
		s := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, FailureRate: 0.5, Seed: 42})
		var b strings.Builder
		for i := range 16 {
			call(t, s, "POST", api("/repository/branches"), map[string]any{"branch": fmt.Sprint("b", i), "ref": "main"})
			b.WriteString(s.Dump().Projects[proj].Branches[fmt.Sprint("b", i)][:1])
		}
		var st strings.Builder
		for i := range 16 {
			a := call(t, s, "GET", api(fmt.Sprintf("/pipelines/%d", i+1)), nil).obj(t)
			st.WriteString(a["status"].(string)[:1])
		}
		return st.String()
	}
	a, b := outcomes(), outcomes()
	if a != b || !strings.Contains(a, "f") || !strings.Contains(a, "s") {
		t.Fatalf("seeded outcomes differ or are uniform: %s vs %s", a, b)
	}
}

func TestFaultsAndControlAPI(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, ManualPipelines: true})
	ctl := func(method, path string, body any) answer { return call(t, sim, method, "/-/sim/"+path, body) }

	f := ctl("POST", "faults", map[string]any{"method": "GET", "route": "/projects/:id", "status": 502, "count": 1})
	want(t, f, 200, "")
	want(t, call(t, sim, "GET", api(""), nil), 502, `{"message":"502 Bad Gateway"}`)
	want(t, call(t, sim, "GET", api(""), nil), 200, "")
	ctl("POST", "faults", map[string]any{"route": "/projects/:id", "status": 429, "headers": map[string]string{"Retry-After": "7"}, "count": 1})
	if a := call(t, sim, "GET", api(""), nil); a.status != 429 || a.header.Get("Retry-After") != "7" {
		t.Fatalf("429 fault: %d %v", a.status, a.header)
	}
	// Drop after work: the branch exists though the client saw no answer.
	ctl("POST", "faults", map[string]any{"method": "POST", "route": "/projects/:id/repository/branches", "after_work": true, "drop": true, "count": 1})
	req, _ := http.NewRequest("POST", sim.URL()+api("/repository/branches"), strings.NewReader(`{"branch":"dropped","ref":"main"}`))
	req.Header.Set("PRIVATE-TOKEN", sim.Token())
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the connection was not dropped")
	}
	if _, ok := sim.Branches(proj)["dropped"]; !ok {
		t.Fatal("the work was not done before the drop")
	}
	faults := ctl("GET", "faults", nil).list(t)
	if len(faults) != 3 || faults[2].(map[string]any)["applied"].(float64) != 1 {
		t.Fatalf("faults: %v", faults)
	}
	want(t, ctl("DELETE", "faults", nil), 200, "")

	// Control: push, open an MR, fail its pipeline, merge it as a human, dump state.
	want(t, ctl("POST", "projects/"+pid+"/push", map[string]any{"files": map[string]any{"human.txt": "hi"}}), 200, "")
	iid, _ := openMR(t, sim, "c1", "c.yaml", "c")
	want(t, ctl("POST", fmt.Sprintf("projects/%s/merge_requests/%d/fail_pipeline", pid, iid), map[string]any{"failure_reason": "script_failure"}), 200, "")
	if st, _ := sim.MR(proj, iid); st.PipelineStatus != "failed" || st.DetailedMergeStatus != "ci_must_pass" {
		t.Fatalf("after fail_pipeline: %+v", st)
	}
	want(t, ctl("POST", fmt.Sprintf("projects/%s/merge_requests/%d/merge", pid, iid), nil), 200, "")
	state := ctl("GET", "state", nil).obj(t)
	p := state["projects"].(map[string]any)[proj].(map[string]any)
	files := p["files"].(map[string]any)
	mrs := p["merge_requests"].(map[string]any)["c1"].([]any)
	if files["c.yaml"] != "c" || files["human.txt"] != "hi" || mrs[0].(map[string]any)["state"] != "merged" {
		t.Fatalf("state dump: %v", p)
	}
	if state["calls"].(map[string]any)["POST /projects/:id/merge_requests"].(float64) != 1 {
		t.Fatalf("call counts: %v", state["calls"])
	}
	want(t, ctl("POST", "projects/"+pid+"/merge_requests/77/close", nil), 404, "")
	want(t, ctl("POST", "projects", map[string]any{"path": "new/proj"}), 200, `{"id":2}`)
}

// A poison rule with Times fails that many pipelines, then retires: a runner that
// fails once and recovers.
func TestPoisonTimes(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}})
	must(t, sim.AddPoison(proj, gitlabsim.PoisonRule{Substring: "x", InPath: true, FailureReason: "runner_system_failure", Times: 1}))
	first, _ := openMR(t, sim, "p1", "x1.yaml", "a")
	second, _ := openMR(t, sim, "p2", "x2.yaml", "b")
	if st, _ := sim.MR(proj, first); st.PipelineStatus != "failed" {
		t.Fatalf("first pipeline %s, want failed", st.PipelineStatus)
	}
	if st, _ := sim.MR(proj, second); st.PipelineStatus != "success" {
		t.Fatalf("second pipeline %s, want success (rule retired after one use)", st.PipelineStatus)
	}
}
