package gitlabsim_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
)

func mrPath(iid int64) string { return api(fmt.Sprintf("/merge_requests/%d", iid)) }

func getMR(t *testing.T, sim *gitlabsim.Sim, iid int64) map[string]any {
	t.Helper()
	return call(t, sim, "GET", mrPath(iid)+"?include_rebase_in_progress=true", nil).obj(t)
}

func TestVersionEndpoint(t *testing.T) {
	for _, v := range gitlabsim.Versions {
		sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, Version: v})
		got := call(t, sim, "GET", "/api/v4/version", nil)
		if got.status != 200 || got.obj(t)["version"] != v+"-ee" {
			t.Fatalf("%s: GET /version answered %d %v", v, got.status, got.body)
		}
		want(t, call(t, sim, "GET", "/api/v4/version", nil, "PRIVATE-TOKEN", ""), 401, "")
	}
	if gitlabsim.New(gitlabsim.Options{}).Version() != gitlabsim.DefaultVersion {
		t.Fatal("default version")
	}
}

// The merge endpoint as each version answers it (as GitLab's own source and docs describe it):
// before 17.11 auto_merge is dropped as unknown and the sha guard comes last; from
// 17.11 on auto_merge arms and the sha guard comes first.
func TestMergeSemanticsByVersion(t *testing.T) {
	type step struct {
		name   string
		body   map[string]any
		status int
		armed  bool
	}
	for _, tc := range []struct {
		version string
		steps   []step
	}{
		{gitlabsim.Version16, []step{
			{"auto_merge is unknown: a plain merge, refused while the pipeline runs", map[string]any{"auto_merge": true}, 405, false},
			{"a wrong sha on a call that cannot merge: 405 before the sha guard", map[string]any{"auto_merge": true, "sha": "0000"}, 405, false},
			{"merge_when_pipeline_succeeds with a wrong sha: the guard, once the call could arm", map[string]any{"merge_when_pipeline_succeeds": true, "sha": "0000"}, 409, false},
			{"merge_when_pipeline_succeeds arms", map[string]any{"merge_when_pipeline_succeeds": true, "sha": "HEAD"}, 200, true},
		}},
		{gitlabsim.Version17, []step{
			{"a wrong sha: the guard first", map[string]any{"sha": "0000"}, 409, false},
			{"a plain merge while the pipeline runs", map[string]any{"sha": "HEAD"}, 405, false},
			{"auto_merge arms", map[string]any{"auto_merge": true, "sha": "HEAD"}, 200, true},
		}},
		{gitlabsim.Version18, []step{
			{"a wrong sha with auto_merge: the guard first", map[string]any{"auto_merge": true, "sha": "0000"}, 409, false},
			{"the deprecated alias still arms", map[string]any{"merge_when_pipeline_succeeds": true, "sha": "HEAD"}, 200, true},
		}},
	} {
		t.Run(tc.version, func(t *testing.T) {
			sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, ManualPipelines: true, Version: tc.version})
			iid, sha := openMR(t, sim, "b1", "a.yaml", "a")
			for _, st := range tc.steps {
				if st.body["sha"] == "HEAD" {
					st.body["sha"] = sha
				}
				got := call(t, sim, "PUT", mrPath(iid)+"/merge", st.body)
				if got.status != st.status {
					t.Fatalf("%s: %d %v, want %d", st.name, got.status, got.body, st.status)
				}
				if m := getMR(t, sim, iid); m["merge_when_pipeline_succeeds"] != st.armed {
					t.Fatalf("%s: armed=%v, want %v", st.name, m["merge_when_pipeline_succeeds"], st.armed)
				}
			}
			must(t, sim.SucceedMRPipeline(proj, iid))
			if m := getMR(t, sim, iid); m["state"] != "merged" {
				t.Fatalf("armed MR did not merge on success: %v", m["state"])
			}
		})
	}
	// Before 17.11, arming an MR that cannot merge (a conflict) is 422, still before
	// the sha guard.
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, ManualPipelines: true, Version: gitlabsim.Version16})
	iid, _ := openMR(t, sim, "c1", "same.yaml", "mine")
	theirs := "theirs"
	_, err := sim.PushToDefault(proj, map[string]*string{"same.yaml": &theirs}, "human")
	must(t, err)
	want(t, call(t, sim, "PUT", mrPath(iid)+"/merge", map[string]any{"merge_when_pipeline_succeeds": true, "sha": "0000"}), 422, `{"message":"Branch cannot be merged"}`)
}

// Every pipeline status a pipeline can end (or stay) in shows on the pipeline, its
// job, the MR's head pipeline and its detailed_merge_status; only success merges, and
// only failed jobs carry a failure_reason.
func TestEveryPipelineStatus(t *testing.T) {
	for _, status := range gitlabsim.PipelineStatuses {
		t.Run(status, func(t *testing.T) {
			sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj},
				PipelineRules: []gitlabsim.PipelineRule{{Status: status, FailureReason: "job_execution_timeout"}}})
			iid, sha := openMR(t, sim, "b1", "a.yaml", "a")
			m := getMR(t, sim, iid)
			hp := m["head_pipeline"].(map[string]any)
			if hp["status"] != status {
				t.Fatalf("head pipeline %v, want %s", hp["status"], status)
			}
			wantDMS := "ci_must_pass"
			switch status {
			case "success":
				wantDMS = "mergeable"
			case "created", "waiting_for_resource", "preparing", "pending", "running", "scheduled", "canceling":
				wantDMS = "ci_still_running"
			}
			if m["detailed_merge_status"] != wantDMS {
				t.Fatalf("detailed_merge_status %v, want %s", m["detailed_merge_status"], wantDMS)
			}
			jobs := call(t, sim, "GET", api(fmt.Sprintf("/pipelines/%v/jobs", hp["id"])), nil).list(t)
			job := jobs[0].(map[string]any)
			reason, has := job["failure_reason"]
			if (status == "failed") != has || (has && reason != "job_execution_timeout") {
				t.Fatalf("job %v", job)
			}
			got := call(t, sim, "PUT", mrPath(iid)+"/merge", map[string]any{"sha": sha, "auto_merge": true})
			switch wantDMS {
			case "mergeable":
				if got.status != 200 || got.obj(t)["state"] != "merged" {
					t.Fatalf("success: %d %v", got.status, got.body)
				}
			case "ci_still_running":
				if got.status != 200 || got.obj(t)["merge_when_pipeline_succeeds"] != true {
					t.Fatalf("%s: auto-merge not armed: %d %v", status, got.status, got.body)
				}
			default:
				if got.status != 405 {
					t.Fatalf("%s: merge answered %d", status, got.status)
				}
			}
		})
	}
}

// A flaky rule fails the first pipeline of each batch branch and lets the next pass.
func TestFlakyRuleFailsFirstPipelinesOfABranch(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj},
		PipelineRules: []gitlabsim.PipelineRule{{RefPrefix: "batcherd/", First: 1, FailureReason: "script_failure"}}})
	openMR(t, sim, "batcherd/b1", "a.yaml", "a")
	openMR(t, sim, "other", "o.yaml", "o")
	// The branch's pipelines: its creation (failed), its commit (success).
	total, by := sim.PipelineCount(proj, "batcherd/b1")
	if total != 2 || by["failed"] != 1 || by["success"] != 1 {
		t.Fatalf("batcherd/b1 pipelines: %d %v", total, by)
	}
	if total, by := sim.PipelineCount(proj, "other"); total != 2 || by["success"] != 2 {
		t.Fatalf("a branch the rule does not select: %d %v", total, by)
	}
}

// Mergeability is computed asynchronously: a new MR reads preparing, then checking,
// until it has been read MergeCheckReads times; a push makes it unchecked again.
// Meanwhile a plain merge is refused and auto-merge arms.
func TestAsyncMergeability(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, MergeCheckReads: 2})
	iid, sha := openMR(t, sim, "b1", "a.yaml", "a")
	for i, wantDMS := range []string{"checking", "mergeable"} {
		m := getMR(t, sim, iid)
		if m["detailed_merge_status"] != wantDMS || (wantDMS == "checking" && (m["merge_status"] != "checking" || m["has_conflicts"] != false)) {
			t.Fatalf("read %d: %v / %v, want %s", i+1, m["detailed_merge_status"], m["merge_status"], wantDMS)
		}
	}
	want(t, call(t, sim, "POST", api("/repository/commits"), map[string]any{"branch": "b1", "commit_message": "more",
		"actions": []map[string]any{{"action": "create", "file_path": "b.yaml", "content": "b"}}}), 201, "")
	list := call(t, sim, "GET", api("/merge_requests?source_branch=b1"), nil).list(t)
	if got := list[0].(map[string]any)["detailed_merge_status"]; got != "unchecked" {
		t.Fatalf("after a push: %v", got)
	}
	m := getMR(t, sim, iid)
	if m["detailed_merge_status"] != "checking" {
		t.Fatalf("after a push, first read: %v", m["detailed_merge_status"])
	}
	head := m["sha"].(string)
	want(t, call(t, sim, "PUT", mrPath(iid)+"/merge", map[string]any{"sha": head}), 405, "")
	armed := call(t, sim, "PUT", mrPath(iid)+"/merge", map[string]any{"sha": head, "auto_merge": true})
	if armed.status != 200 || armed.obj(t)["merge_when_pipeline_succeeds"] != true {
		t.Fatalf("auto-merge while checking: %d %v", armed.status, armed.body)
	}
	// The check ends on the next read, and the armed MR (pipeline passed) merges.
	if m := getMR(t, sim, iid); m["state"] != "merged" {
		t.Fatalf("armed MR after its check: %v %v", m["state"], m["detailed_merge_status"])
	}
	_ = sha
}

// Fast-forward and semi-linear projects: an MR behind its target needs a rebase; PUT
// …/rebase answers 202, runs in the background, keeps the commits' messages (and so
// their trailers) under new shas, runs a new pipeline and cancels auto-merge; a rebase
// that conflicts leaves the branch alone and says so in merge_error.
func TestMergeMethodsAndRebase(t *testing.T) {
	for _, method := range gitlabsim.MergeMethods {
		t.Run(method, func(t *testing.T) {
			sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, MergeMethod: method, ManualPipelines: true, RebaseReads: 2})
			iid, sha := openMR(t, sim, "b1", "a.yaml", "a")
			must(t, sim.SucceedMRPipeline(proj, iid))
			armed := call(t, sim, "PUT", mrPath(iid)+"/merge", map[string]any{"sha": sha, "auto_merge": true})
			_ = armed
			if m := getMR(t, sim, iid); m["state"] != "merged" {
				t.Fatalf("an MR on the target's head: %v", m["detailed_merge_status"])
			}
			iid, sha = openMR(t, sim, "b2", "b.yaml", "b\n\nBatcherd-Batch: 7")
			other := "o"
			_, err := sim.PushToDefault(proj, map[string]*string{"other.yaml": &other}, "human")
			must(t, err)
			must(t, sim.SucceedMRPipeline(proj, iid))
			m := getMR(t, sim, iid)
			if method == gitlabsim.MergeMethodMerge {
				if m["detailed_merge_status"] != "mergeable" {
					t.Fatalf("merge method: %v", m["detailed_merge_status"])
				}
				return
			}
			if m["detailed_merge_status"] != "need_rebase" {
				t.Fatalf("behind the target: %v", m["detailed_merge_status"])
			}
			want(t, call(t, sim, "PUT", mrPath(iid)+"/merge", map[string]any{"sha": sha, "auto_merge": true}), 405, "")
			want(t, call(t, sim, "PUT", mrPath(iid)+"/rebase", nil), 202, `{"rebase_in_progress":true}`)
			want(t, call(t, sim, "PUT", mrPath(iid)+"/rebase", nil), 409, "")
			if m := getMR(t, sim, iid); m["rebase_in_progress"] != true || m["sha"] != sha {
				t.Fatalf("rebase done on the first read: %v %v", m["rebase_in_progress"], m["sha"])
			}
			m = getMR(t, sim, iid)
			newSHA, _ := m["sha"].(string)
			if m["rebase_in_progress"] != false || newSHA == sha || m["merge_error"] != nil {
				t.Fatalf("after the rebase: %v %v %v", m["rebase_in_progress"], m["sha"], m["merge_error"])
			}
			if _, msg, _ := sim.HeadCommit(proj, "b2"); msg != "m" {
				t.Fatalf("rebased commit message %q", msg)
			}
			if hp := m["head_pipeline"].(map[string]any); hp["sha"] != newSHA || hp["status"] != "running" {
				t.Fatalf("no new pipeline for the rebased head: %v", hp)
			}
			must(t, sim.SucceedMRPipeline(proj, iid))
			want(t, call(t, sim, "PUT", mrPath(iid)+"/merge", map[string]any{"sha": sha}), 409, "")
			done := call(t, sim, "PUT", mrPath(iid)+"/merge", map[string]any{"sha": newSHA})
			if done.status != 200 || done.obj(t)["state"] != "merged" {
				t.Fatalf("merge after the rebase: %d %v", done.status, done.body)
			}
			head, _, _ := sim.HeadCommit(proj, "main")
			if (method == gitlabsim.MergeMethodFastForward) != (head == newSHA) {
				t.Fatalf("%s: main is %s, the rebased source %s", method, head, newSHA)
			}
			if f := sim.Files(proj); f["b.yaml"] == "" || f["other.yaml"] != "o" {
				t.Fatalf("files: %v", f)
			}

			// A rebase that conflicts.
			iid, sha = openMR(t, sim, "b3", "c.yaml", "mine")
			theirs := "theirs"
			_, err = sim.PushToDefault(proj, map[string]*string{"c.yaml": &theirs}, "human")
			must(t, err)
			want(t, call(t, sim, "PUT", mrPath(iid)+"/rebase", nil), 202, "")
			getMR(t, sim, iid)
			m = getMR(t, sim, iid)
			if m["rebase_in_progress"] != false || m["sha"] != sha || !strings.HasPrefix(fmt.Sprint(m["merge_error"]), "Rebase failed") {
				t.Fatalf("conflicting rebase: %v %v %v", m["rebase_in_progress"], m["sha"], m["merge_error"])
			}
		})
	}
}

func TestControlAPIForStatesAndMethods(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, ManualPipelines: true})
	ctl := func(method, path string, body any) answer { return call(t, sim, method, "/-/sim/"+path, body) }
	want(t, ctl("POST", "pipeline_rules", map[string]any{"ref_prefix": "x", "status": "bogus"}), 400, "")
	want(t, ctl("POST", "pipeline_rules", map[string]any{"ref_prefix": "never", "status": "canceled"}), 200, "")
	want(t, ctl("DELETE", "pipeline_rules", nil), 200, "")
	want(t, ctl("POST", "projects/"+pid+"/merge_method", map[string]any{"merge_method": "squash"}), 400, "")
	want(t, ctl("POST", "projects/"+pid+"/merge_method", map[string]any{"merge_method": "ff"}), 200, "")
	if p := call(t, sim, "GET", api(""), nil).obj(t); p["merge_method"] != "ff" {
		t.Fatalf("project merge_method %v", p["merge_method"])
	}
	iid, _ := openMR(t, sim, "b1", "a.yaml", "a")
	id := int64(getMR(t, sim, iid)["head_pipeline"].(map[string]any)["id"].(float64))
	want(t, ctl("POST", fmt.Sprintf("projects/%s/pipelines/%d/status", pid, id), map[string]any{"status": "nope"}), 400, "")
	want(t, ctl("POST", fmt.Sprintf("projects/%s/pipelines/%d/status", pid, id), map[string]any{"status": "manual"}), 200, "")
	if m := getMR(t, sim, iid); m["head_pipeline"].(map[string]any)["status"] != "manual" || m["detailed_merge_status"] != "ci_must_pass" {
		t.Fatalf("after status manual: %v", m["detailed_merge_status"])
	}
}

// Retrying a pipeline's failed jobs runs them again in the same pipeline; the old jobs
// are listed only with include_retried, and flaky rules count the retry as a run.
func TestPipelineRetryAndMRCommits(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj},
		PipelineRules: []gitlabsim.PipelineRule{{RefPrefix: "b1", First: 2, FailureReason: "script_failure"}}})
	iid, sha := openMR(t, sim, "b1", "a.yaml", "a")
	m := getMR(t, sim, iid)
	hp := m["head_pipeline"].(map[string]any)
	if hp["status"] != "failed" {
		t.Fatalf("second run of b1 (its commit) should fail: %v", hp["status"])
	}
	id := int64(hp["id"].(float64))
	retried := call(t, sim, "POST", api(fmt.Sprintf("/pipelines/%d/retry", id)), nil)
	if retried.status != 201 || retried.obj(t)["status"] != "success" || retried.obj(t)["id"] != hp["id"] {
		t.Fatalf("retry: %d %v", retried.status, retried.body)
	}
	if jobs := call(t, sim, "GET", api(fmt.Sprintf("/pipelines/%d/jobs", id)), nil).list(t); len(jobs) != 1 || jobs[0].(map[string]any)["status"] != "success" {
		t.Fatalf("jobs after retry: %v", jobs)
	}
	if jobs := call(t, sim, "GET", api(fmt.Sprintf("/pipelines/%d/jobs?include_retried=true", id)), nil).list(t); len(jobs) != 2 {
		t.Fatalf("jobs with the retried one: %v", jobs)
	}
	if m := getMR(t, sim, iid); m["detailed_merge_status"] != "mergeable" {
		t.Fatalf("after a passing retry: %v", m["detailed_merge_status"])
	}
	commits := call(t, sim, "GET", mrPath(iid)+"/commits", nil).list(t)
	if len(commits) != 1 || commits[0].(map[string]any)["id"] != sha {
		t.Fatalf("MR commits: %v", commits)
	}
}

// While GitLab creates the head's pipeline the MR has no head pipeline yet and every
// version refuses a merge or an auto-merge with 405.
func TestPipelineBeingCreated(t *testing.T) {
	for _, v := range gitlabsim.Versions {
		sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj}, Version: v, ManualPipelines: true, PipelineCreateReads: 2})
		iid, sha := openMR(t, sim, "b1", "a.yaml", "a")
		m := getMR(t, sim, iid)
		if m["head_pipeline"] != nil || m["detailed_merge_status"] != "ci_still_running" {
			t.Fatalf("%s: while the pipeline is created: %v %v", v, m["head_pipeline"], m["detailed_merge_status"])
		}
		for _, body := range []map[string]any{{"sha": sha, "auto_merge": true}, {"sha": sha, "merge_when_pipeline_succeeds": true}, {"sha": sha}} {
			want(t, call(t, sim, "PUT", mrPath(iid)+"/merge", body), 405, "")
		}
		m = getMR(t, sim, iid)
		if hp, _ := m["head_pipeline"].(map[string]any); hp == nil || hp["sha"] != sha {
			t.Fatalf("%s: the pipeline never appeared: %v", v, m["head_pipeline"])
		}
	}
}
