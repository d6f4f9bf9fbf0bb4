package mr_test

import (
	"slices"
	"testing"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
)

// The client reads the server's version once and arms auto-merge in the words that
// version understands: merge_when_pipeline_succeeds before 17.11 (where auto_merge
// alone is a plain merge, refused with 405 while the pipeline runs), auto_merge from
// 17.11 on.
func TestAutoMergeInTheServersWords(t *testing.T) {
	for _, v := range gitlabsim.Versions {
		t.Run(v, func(t *testing.T) {
			sim, c := setup(t, gitlabsim.Options{ManualPipelines: true, Version: v})
			m, sha := publish(t, c, 1, []mr.FileAction{grant("alice", "db")})
			armed := must(c.SetAutoMerge(ctx(t), proj, m.IID, sha))
			if !armed.MergeWhenPipelineSucceeds || armed.State != mr.StateOpened {
				t.Fatalf("not armed: %+v", armed)
			}
			ver := must(c.ServerVersion(ctx(t)))
			if ver.Raw != v+"-ee" {
				t.Fatalf("version %+v", ver)
			}
			var sent []string
			for _, call := range sim.Calls() {
				if call.Route == "/projects/:id/merge_requests/:iid/merge" {
					sent = call.Params
				}
			}
			wantParam, notParam := "auto_merge", "merge_when_pipeline_succeeds"
			if !ver.KnowsAutoMerge() {
				wantParam, notParam = notParam, wantParam
			}
			if !slices.Contains(sent, wantParam) || slices.Contains(sent, notParam) {
				t.Fatalf("%s: merge call sent %v", v, sent)
			}
			if n := sim.CallCount("GET /version"); n != 1 {
				t.Fatalf("GET /version read %d times, want once", n)
			}
			must0(sim.SucceedMRPipeline(proj, m.IID))
			if got := must(c.GetMR(ctx(t), proj, m.IID)); got.State != mr.StateMerged {
				t.Fatalf("armed MR did not merge: %+v", got)
			}
		})
	}
}

// A version the client cannot read (GitLab refuses GET /version) makes it send both
// names, which every version takes; it asks again next time.
func TestAutoMergeWithoutAVersion(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true, Version: gitlabsim.Version16})
	sim.InjectFault(gitlabsim.Fault{Route: "/version", Status: 403, Count: 1})
	m, sha := publish(t, c, 1, []mr.FileAction{grant("alice", "db")})
	if armed := must(c.SetAutoMerge(ctx(t), proj, m.IID, sha)); !armed.MergeWhenPipelineSucceeds {
		t.Fatalf("not armed: %+v", armed)
	}
	if v := must(c.ServerVersion(ctx(t))); !v.Known() || v.KnowsAutoMerge() {
		t.Fatalf("version after the refusal: %+v", v)
	}
}

// Mergeability being computed reads as pending (checking), never as a conflict.
func TestMergeabilityPendingIsRead(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true, MergeCheckReads: 2})
	m, _ := publish(t, c, 1, []mr.FileAction{grant("alice", "db")})
	got := must(c.GetMR(ctx(t), proj, m.IID))
	if !got.MergeabilityPending() || got.HasConflicts || got.DetailedMergeStatus != "checking" {
		t.Fatalf("first read: %+v", got)
	}
	got = must(c.GetMR(ctx(t), proj, m.IID))
	if got.MergeabilityPending() || got.DetailedMergeStatus != "ci_still_running" {
		t.Fatalf("second read: %+v", got)
	}
	_ = sim
	for _, tc := range []struct {
		m    mr.MergeRequest
		want bool
	}{
		{mr.MergeRequest{DetailedMergeStatus: "unchecked"}, true},
		{mr.MergeRequest{DetailedMergeStatus: "preparing"}, true},
		{mr.MergeRequest{DetailedMergeStatus: "mergeable", MergeStatus: "checking"}, false},
		{mr.MergeRequest{MergeStatus: "cannot_be_merged_recheck"}, true},
		{mr.MergeRequest{MergeStatus: "can_be_merged"}, false},
	} {
		if tc.m.MergeabilityPending() != tc.want {
			t.Errorf("%+v: pending %v", tc.m, !tc.want)
		}
	}
}

// A fast-forward project: the MR behind its target needs a rebase; the client asks
// for it, sees it run, and finds the rebased head with the batch's trailer.
func TestRebaseOfABatchMR(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true, MergeMethod: gitlabsim.MergeMethodFastForward})
	m, sha := publish(t, c, 7, []mr.FileAction{grant("alice", "db")})
	other := "x"
	must(sim.PushToDefault(proj, map[string]*string{"README.md": &other}, "human"))
	got := must(c.GetMR(ctx(t), proj, m.IID))
	if got.DetailedMergeStatus != "need_rebase" {
		t.Fatalf("behind the target: %+v", got)
	}
	must0(c.Rebase(ctx(t), proj, m.IID))
	must0(c.Rebase(ctx(t), proj, m.IID)) // already running: fine
	if got := must(c.GetMR(ctx(t), proj, m.IID)); got.SHA == sha || got.RebaseInProgress {
		t.Fatalf("after the rebase: %+v", got) // the sim finishes it on the first read
	}
	got = must(c.GetMR(ctx(t), proj, m.IID))
	commits := must(c.MRCommits(ctx(t), proj, m.IID))
	if len(commits) != 1 || commits[0].ID != got.SHA || !commits[0].Carries(mr.OwnerOf("batcherd/batch-7", mr.BatchRef{ID: 7})) || commits[0].Carries(mr.OwnerOf("batcherd/batch-8", mr.BatchRef{ID: 8})) {
		t.Fatalf("MR commits after the rebase: %+v (head %s)", commits, got.SHA)
	}
	must0(sim.SucceedMRPipeline(proj, m.IID))
	if done := must(c.Merge(ctx(t), proj, m.IID, got.SHA)); done.State != mr.StateMerged {
		t.Fatalf("merge of the rebased head: %+v", done)
	}
}

// A failed pipeline retried in place: the same pipeline runs again, and the client can
// tell afterwards that it was retried.
func TestRetryPipelineInPlace(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	m, _ := publish(t, c, 1, []mr.FileAction{grant("alice", "db")})
	must0(sim.FailMRPipeline(proj, m.IID, "script_failure"))
	got := must(c.GetMR(ctx(t), proj, m.IID))
	if got.PipelineStatus != "failed" || must(c.PipelineRetries(ctx(t), proj, got.PipelineID)) != 0 {
		t.Fatalf("before the retry: %+v", got)
	}
	if st := must(c.RetryPipeline(ctx(t), proj, got.PipelineID)); st != "running" {
		t.Fatalf("retry answered %q", st)
	}
	again := must(c.GetMR(ctx(t), proj, m.IID))
	if again.PipelineID != got.PipelineID || again.PipelineStatus != "running" || must(c.PipelineRetries(ctx(t), proj, got.PipelineID)) != 1 {
		t.Fatalf("after the retry: %+v", again)
	}
}
