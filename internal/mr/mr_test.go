package mr_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"go.yaml.in/yaml/v3"
)

const proj = "platform/access-bindings"

// setup starts a simulator and a real client pointed at it over HTTP.
func setup(t *testing.T, opts gitlabsim.Options, tweak ...func(*mr.Config)) (*gitlabsim.Sim, *mr.Client) {
	t.Helper()
	if len(opts.Projects) == 0 {
		opts.Projects = []string{proj}
	}
	current = t
	sim := gitlabsim.StartTest(t, opts)
	cfg := mr.Config{BaseURL: sim.URL(), Token: sim.Token(), CallTimeout: 5 * time.Second, RetryWaitMin: 10 * time.Millisecond, RetryWaitMax: 50 * time.Millisecond}
	for _, f := range tweak {
		f(&cfg)
	}
	c, err := mr.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sim, c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// current is the running test; setup sets it. Tests in this package do not run in
// parallel, so must can fail the right test without taking it as an argument (Go
// does not allow must(f()) with a multi-value f).
var current *testing.T

func must[T any](v T, err error) T {
	current.Helper()
	if err != nil {
		current.Fatal(err)
	}
	return v
}

func must0(err error) {
	current.Helper()
	if err != nil {
		current.Fatal(err)
	}
}

func wantClass(t *testing.T, err error, class mr.Class, status int) *mr.Error {
	t.Helper()
	var e *mr.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *mr.Error", err, err)
	}
	if e.Class != class || (status != -1 && e.Status != status) {
		t.Fatalf("error %v: class %v status %d, want %v %d", err, e.Class, e.Status, class, status)
	}
	return e
}

// publish runs the scanner's publish sequence for one batch: the commit (which creates
// the branch), then the MR.
func publish(t *testing.T, c *mr.Client, batch int64, files []mr.FileAction) (mr.MergeRequest, string) {
	t.Helper()
	branch := fmt.Sprintf("batcherd/batch-%d", batch)
	sha := must(c.CommitFiles(ctx(t), proj, branch, "main", mr.BatchRef{ID: batch}, fmt.Sprintf("batcherd: batch %d", batch), files)).SHA
	m := must(c.EnsureMR(ctx(t), proj, mr.MRSpec{
		SourceBranch: branch, Batch: mr.BatchRef{ID: batch}, TargetBranch: "main", Title: fmt.Sprintf("batcherd: batch %d", batch),
		Description: fmt.Sprintf("Batch %d", batch), Labels: []string{"access"},
	}))
	return m, sha
}

func grant(subject, target string) mr.FileAction {
	return mr.FileAction{Path: domain.BindingPath(subject, target), Content: mr.BindingYAML(subject, target, "op-"+subject, nil)}
}

func TestHappyPathPublishAndAutoMerge(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})

	m, sha := publish(t, c, 1, []mr.FileAction{grant("alice", "db"), grant("bob", "db")})
	if m.State != mr.StateOpened || m.SHA != sha || m.SourceBranch != "batcherd/batch-1" || m.TargetBranch != "main" {
		t.Fatalf("unexpected MR %+v (commit %s)", m, sha)
	}
	if m.Labels[0] != mr.Label || len(m.Labels) != 2 {
		t.Fatalf("labels %v: want batcherd first and access", m.Labels)
	}
	if m.PipelineStatus != "running" || m.DetailedMergeStatus != "ci_still_running" || m.WebURL == "" {
		t.Fatalf("unexpected MR pipeline view %+v", m)
	}
	_, msg, _ := sim.HeadCommit(proj, "batcherd/batch-1")
	if !strings.Contains(msg, "\n\nBatcherd-Batch: 1\n") {
		t.Fatalf("head commit message lacks the trailer: %q", msg)
	}

	armed := must(c.SetAutoMerge(ctx(t), proj, m.IID, sha))
	if armed.State != mr.StateOpened || !armed.MergeWhenPipelineSucceeds {
		t.Fatalf("auto-merge not armed: %+v", armed)
	}
	// Arming twice is harmless.
	must(c.SetAutoMerge(ctx(t), proj, m.IID, sha))
	if err := sim.SucceedMRPipeline(proj, m.IID); err != nil {
		t.Fatal(err)
	}
	got := must(c.GetMR(ctx(t), proj, m.IID))
	if got.State != mr.StateMerged || got.MergedAt == nil || got.PipelineStatus != "success" {
		t.Fatalf("MR did not merge when its pipeline succeeded: %+v", got)
	}
	files := sim.Files(proj)
	if files[domain.BindingPath("alice", "db")] == "" || files[domain.BindingPath("bob", "db")] == "" {
		t.Fatalf("default branch lacks the batch's files: %v", files)
	}

	// Second batch: update one file, delete another, delete one that never existed.
	m2, sha2 := publish(t, c, 2, []mr.FileAction{
		{Path: domain.BindingPath("alice", "db"), Content: "updated\n"},
		{Path: domain.BindingPath("bob", "db"), Delete: true},
		{Path: domain.BindingPath("carol", "db"), Delete: true},
	})
	if sim.CommitCount(proj, "batcherd/batch-2") != 1 {
		t.Fatalf("want one commit on batch-2, got %d", sim.CommitCount(proj, "batcherd/batch-2"))
	}
	if err := sim.SucceedMRPipeline(proj, m2.IID); err != nil {
		t.Fatal(err)
	}
	merged := must(c.Merge(ctx(t), proj, m2.IID, sha2))
	if merged.State != mr.StateMerged {
		t.Fatalf("merge: %+v", merged)
	}
	files = sim.Files(proj)
	if files[domain.BindingPath("alice", "db")] != "updated\n" {
		t.Fatalf("update did not land: %q", files[domain.BindingPath("alice", "db")])
	}
	if _, ok := files[domain.BindingPath("bob", "db")]; ok {
		t.Fatal("delete did not land")
	}
}

func TestCommitFilesIsIdempotentByTrailer(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{})
	if err := c.EnsureBranch(ctx(t), proj, "batcherd/batch-7", ""); err != nil {
		t.Fatal(err)
	}
	files := []mr.FileAction{grant("alice", "db")}
	first := must(c.CommitFiles(ctx(t), proj, "batcherd/batch-7", "", mr.BatchRef{ID: 7}, "batch 7", files))
	again := must(c.CommitFiles(ctx(t), proj, "batcherd/batch-7", "", mr.BatchRef{ID: 7}, "batch 7", files))
	if first != again || first.Empty || sim.CommitCount(proj, "batcherd/batch-7") != 1 {
		t.Fatalf("second call made another commit: %+v vs %+v, %d commits", first, again, sim.CommitCount(proj, "batcherd/batch-7"))
	}
	// A batch of nothing but deletes of missing files makes no commit, on a branch that
	// exists and on one that does not (which it then does not create).
	if err := c.EnsureBranch(ctx(t), proj, "batcherd/batch-8", ""); err != nil {
		t.Fatal(err)
	}
	head, _, _ := sim.HeadCommit(proj, "batcherd/batch-8")
	noop := must(c.CommitFiles(ctx(t), proj, "batcherd/batch-8", "", mr.BatchRef{ID: 8}, "batch 8", []mr.FileAction{{Path: "bindings/x/y.yaml", Delete: true}}))
	if noop.SHA != head || !noop.Empty || sim.CommitCount(proj, "batcherd/batch-8") != 0 {
		t.Fatalf("a no-op batch committed: %+v vs %s", noop, head)
	}
	mainHead, _, _ := sim.HeadCommit(proj, "main")
	noop = must(c.CommitFiles(ctx(t), proj, "batcherd/batch-9", "", mr.BatchRef{ID: 9}, "batch 9", []mr.FileAction{{Path: "bindings/x/y.yaml", Delete: true}}))
	if _, made := sim.Branches(proj)["batcherd/batch-9"]; noop.SHA != mainHead || !noop.Empty || made {
		t.Fatalf("a no-op batch without a branch: %+v (main %s), branch made: %v", noop, mainHead, made)
	}
	// A branch that does not exist starts from the start branch, which must exist.
	_, err := c.CommitFiles(ctx(t), proj, "batcherd/batch-404", "no-such-branch", mr.BatchRef{ID: 404}, "x", files)
	wantClass(t, err, mr.ClassNotFound, http.StatusNotFound)
	if _, made := sim.Branches(proj)["batcherd/batch-404"]; made {
		t.Fatal("a commit from a missing start branch created the branch")
	}
}

// TestBatchBranchIsCreatedByItsCommit: the batch branch is created by the batch's
// commit, from the target's head, so GitLab runs one pipeline for it — the commit's. A
// branch created on its own first (as publish did before) runs two: one on the
// target's head for the new branch, testing nothing of the batch, then the commit's.
func TestBatchBranchIsCreatedByItsCommit(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	mainHead, _, _ := sim.HeadCommit(proj, "main")
	files := []mr.FileAction{grant("alice", "db"), grant("bob", "db")}

	got := must(c.CommitFiles(ctx(t), proj, "batcherd/batch-1", "main", mr.BatchRef{ID: 1}, "batch 1", files))
	head, msg, ok := sim.HeadCommit(proj, "batcherd/batch-1")
	if !ok || got.Empty || got.SHA != head || !strings.Contains(msg, "Batcherd-Batch: 1") {
		t.Fatalf("commit %+v, branch head %s %q (exists %v)", got, head, msg, ok)
	}
	if n := sim.CommitCount(proj, "batcherd/batch-1"); n != 1 {
		t.Fatalf("%d commits on the new branch, want 1", n)
	}
	if parents := commitParents(t, sim, head); len(parents) != 1 || parents[0] != mainHead {
		t.Fatalf("the batch commit's parents %v, want the target's head %s", parents, mainHead)
	}
	if n, _ := sim.PipelineCount(proj, "batcherd/batch-1"); n != 1 {
		t.Errorf("%d pipelines for a batch branch created by its commit, want 1", n)
	}
	if n := sim.CallCount("POST /projects/:id/repository/branches"); n != 0 {
		t.Errorf("the branch was created on its own (%d calls)", n)
	}
	// Resumed (a replica that died before recording anything): no second commit.
	if again := must(c.CommitFiles(ctx(t), proj, "batcherd/batch-1", "main", mr.BatchRef{ID: 1}, "batch 1", files)); again != got {
		t.Fatalf("resume: %+v, want %+v", again, got)
	}
	if n := sim.CommitCount(proj, "batcherd/batch-1"); n != 1 {
		t.Fatalf("%d commits after the resume, want 1", n)
	}

	// The old way, for comparison: the simulator, like GitLab, runs a pipeline for the
	// branch's creation.
	if err := c.EnsureBranch(ctx(t), proj, "batcherd/batch-2", "main"); err != nil {
		t.Fatal(err)
	}
	must(c.CommitFiles(ctx(t), proj, "batcherd/batch-2", "main", mr.BatchRef{ID: 2}, "batch 2", files))
	if n, _ := sim.PipelineCount(proj, "batcherd/batch-2"); n != 2 {
		t.Errorf("%d pipelines for a branch created before its commit, want 2", n)
	}

	// A split batch: the first chunk creates the branch, the others commit onto it.
	split, err := mr.New(mr.Config{BaseURL: sim.URL(), Token: sim.Token(), CallTimeout: 5 * time.Second, MaxActionsPerCommit: 1})
	if err != nil {
		t.Fatal(err)
	}
	must(split.CommitFiles(ctx(t), proj, "batcherd/batch-3", "main", mr.BatchRef{ID: 3}, "batch 3", []mr.FileAction{grant("a", "x"), grant("b", "x"), grant("c", "x")}))
	if n := sim.CommitCount(proj, "batcherd/batch-3"); n != 3 {
		t.Fatalf("%d commits for a batch split in 3", n)
	}
	if n, _ := sim.PipelineCount(proj, "batcherd/batch-3"); n != 3 {
		t.Errorf("%d pipelines for 3 chunk commits, want 3 (none for the branch's creation)", n)
	}
}

// commitParents reads a commit's parent ids as any GitLab client would.
func commitParents(t *testing.T, sim *gitlabsim.Sim, sha string) []string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, sim.URL()+"/api/v4/projects/"+url.PathEscape(proj)+"/repository/commits/"+sha, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("PRIVATE-TOKEN", sim.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct {
		ParentIDs []string `json:"parent_ids"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET commit %s: %d %v", sha, resp.StatusCode, err)
	}
	return c.ParentIDs
}

// TestBranchCreatedMeanwhile: between CommitFiles reading that the branch is missing
// and its commit creating it, someone creates the branch — another replica resuming
// the same batch (its commit on the head), or a human (a bare branch). GitLab refuses a
// start_sha commit onto an existing branch; CommitFiles reads the branch again and
// finishes on it as it is: the other replica's commit is the batch's (no second
// commit), and a bare branch gets the batch's commit. Never a content refusal.
func TestBranchCreatedMeanwhile(t *testing.T) {
	for _, other := range []string{"replica", "human"} {
		t.Run(other, func(t *testing.T) {
			sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
			files := []mr.FileAction{grant("alice", "db")}
			branch := "batcherd/batch-4"
			// Our commit is held on its way; the other one creates the branch meanwhile.
			fid := sim.InjectFault(gitlabsim.Fault{Method: "POST", Route: "/projects/:id/repository/commits", Latency: time.Second, Count: 1})
			type result struct {
				commit mr.Commit
				err    error
			}
			done := make(chan result, 1)
			go func() {
				cm, err := c.CommitFiles(context.Background(), proj, branch, "main", mr.BatchRef{ID: 4}, "batch 4", files)
				done <- result{cm, err}
			}()
			for deadline := time.Now().Add(10 * time.Second); sim.FaultApplied(fid) == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("our commit never reached GitLab")
				}
			}
			var theirs mr.Commit
			if other == "replica" {
				theirs = must(c.CommitFiles(ctx(t), proj, branch, "main", mr.BatchRef{ID: 4}, "batch 4", files))
			} else if err := c.EnsureBranch(ctx(t), proj, branch, "main"); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("CommitFiles with the branch created meanwhile: %v (content refusal: %v)", r.err, mr.IsContentRefusal(r.err))
			}
			refused := 0
			for _, call := range sim.Calls() {
				if call.Route == "/projects/:id/repository/commits" && call.Status == http.StatusBadRequest {
					refused++
				}
			}
			if refused != 1 {
				t.Fatalf("%d refused commits, want 1: the start_sha commit onto the existing branch", refused)
			}
			head, _, _ := sim.HeadCommit(proj, branch)
			if n := sim.CommitCount(proj, branch); n != 1 || r.commit.SHA != head || r.commit.Empty {
				t.Fatalf("%d commits, ours %+v, head %s: want the one batch commit", n, r.commit, head)
			}
			if other == "replica" && theirs.SHA != head {
				t.Fatalf("the other replica's commit %s is not the head %s", theirs.SHA, head)
			}
		})
	}
}

func TestFindMRAnyStateAndNeverASecond(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	if _, found, err := c.FindMR(ctx(t), proj, "batcherd/batch-1", mr.BatchRef{ID: 1}); err != nil || found {
		t.Fatalf("FindMR on a fresh branch: found=%v err=%v", found, err)
	}
	m, _ := publish(t, c, 1, []mr.FileAction{grant("alice", "db")})
	if err := sim.CloseMR(proj, m.IID); err != nil {
		t.Fatal(err)
	}
	found, ok, err := c.FindMR(ctx(t), proj, "batcherd/batch-1", mr.BatchRef{ID: 1})
	if err != nil || !ok || found.IID != m.IID || found.State != mr.StateClosed || found.ClosedAt == nil {
		t.Fatalf("FindMR of a closed MR: %+v ok=%v err=%v", found, ok, err)
	}
	again := must(c.EnsureMR(ctx(t), proj, mr.MRSpec{SourceBranch: "batcherd/batch-1", Batch: mr.BatchRef{ID: 1}, Title: "x"}))
	if again.IID != m.IID || len(sim.MRsByBranch(proj)["batcherd/batch-1"]) != 1 {
		t.Fatalf("EnsureMR opened a second MR for a branch whose MR is closed: %+v", sim.MRsByBranch(proj))
	}
}

// A batch branch's name is predictable: MRs from a fork's branch of that name, or from
// the batch branch into another target, are listed with the project's own but are not
// the batch's MR. Adopting one let a stranger's MR stand in for the batch.
func TestFindMRIgnoresForksAndOtherTargets(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	const branch = "batcherd/batch-4"
	forked, err := sim.OpenMR(proj, branch, "main", []string{"access"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := c.FindMR(ctx(t), proj, branch, mr.BatchRef{ID: 4}); err != nil || found {
		t.Fatalf("FindMR adopted a fork's MR: found=%v err=%v", found, err)
	}
	if err := c.EnsureBranch(ctx(t), proj, branch, "main"); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureBranch(ctx(t), proj, "release", "main"); err != nil {
		t.Fatal(err)
	}
	if _, err := sim.OpenMR(proj, branch, "release", nil, false); err != nil {
		t.Fatal(err)
	}
	if _, found, err := c.FindMR(ctx(t), proj, branch, mr.BatchRef{ID: 4}); err != nil || found {
		t.Fatalf("FindMR adopted an MR into another branch: found=%v err=%v", found, err)
	}
	m, _ := publish(t, c, 4, []mr.FileAction{grant("alice", "db")})
	if m.IID == forked || m.SourceBranch != branch || m.TargetBranch != "main" {
		t.Fatalf("EnsureMR answered %+v, want the batch's own MR", m)
	}
	if found, ok, err := c.FindMR(ctx(t), proj, branch, mr.BatchRef{ID: 4}); err != nil || !ok || found.IID != m.IID {
		t.Fatalf("FindMR = %+v ok=%v err=%v, want !%d", found, ok, err, m.IID)
	}
}

func TestEnsureMRConcurrentReplicasMakeOneMR(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	if err := c.EnsureBranch(ctx(t), proj, "batcherd/batch-3", "main"); err != nil {
		t.Fatal(err)
	}
	must(c.CommitFiles(ctx(t), proj, "batcherd/batch-3", "", mr.BatchRef{ID: 3}, "batch 3", []mr.FileAction{grant("a", "b")}))
	var wg sync.WaitGroup
	iids := make([]int64, 8)
	errs := make([]error, 8)
	for i := range iids {
		wg.Go(func() {
			m, err := c.EnsureMR(context.Background(), proj, mr.MRSpec{SourceBranch: "batcherd/batch-3", Batch: mr.BatchRef{ID: 3}, Title: "batch 3"})
			iids[i], errs[i] = m.IID, err
		})
	}
	wg.Wait()
	for i := range iids {
		if errs[i] != nil || iids[i] != iids[0] {
			t.Fatalf("replica %d: iid %d err %v (first %d)", i, iids[i], errs[i], iids[0])
		}
	}
	if n := len(sim.MRsByBranch(proj)["batcherd/batch-3"]); n != 1 {
		t.Fatalf("%d MRs for one branch", n)
	}
}

func TestAnswerLostAfterWork(t *testing.T) {
	for _, mode := range []struct {
		name string
		f    gitlabsim.Fault
	}{
		{"dropped connection", gitlabsim.Fault{AfterWork: true, Drop: true, Count: 1}},
		{"502 after the work", gitlabsim.Fault{AfterWork: true, Status: http.StatusBadGateway, Count: 1}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
			inject := func(method, route string) {
				f := mode.f
				f.Method, f.Route = method, route
				sim.InjectFault(f)
			}
			inject("POST", "/projects/:id/repository/commits") // the commit that creates the branch
			inject("POST", "/projects/:id/merge_requests")

			m, sha := publish(t, c, 5, []mr.FileAction{grant("alice", "db"), grant("bob", "db")})

			if _, ok := sim.Branches(proj)["batcherd/batch-5"]; !ok {
				t.Fatal("branch missing")
			}
			if n := sim.CommitCount(proj, "batcherd/batch-5"); n != 1 {
				t.Fatalf("%d commits on the batch branch, want 1", n)
			}
			mrs := sim.MRsByBranch(proj)["batcherd/batch-5"]
			if len(mrs) != 1 || mrs[0].IID != m.IID || mrs[0].State != "opened" || mrs[0].SHA != sha {
				t.Fatalf("MRs for the branch: %+v (client saw %+v)", mrs, m)
			}
			for _, r := range []string{"POST /projects/:id/repository/commits", "POST /projects/:id/merge_requests"} {
				if n := sim.CallCount(r); n != 1 {
					t.Errorf("%s called %d times; a lost answer must be recovered by reading, not by repeating the write", r, n)
				}
			}
			// The whole sequence again (a replica resuming) changes nothing.
			m2, sha2 := publish(t, c, 5, []mr.FileAction{grant("alice", "db"), grant("bob", "db")})
			if m2.IID != m.IID || sha2 != sha || sim.CommitCount(proj, "batcherd/batch-5") != 1 || len(sim.MRsByBranch(proj)["batcherd/batch-5"]) != 1 {
				t.Fatalf("resume duplicated work: %+v %s", m2, sha2)
			}
		})
	}
}

func TestAnswerLostOnMergeAndClose(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	m, sha := publish(t, c, 1, []mr.FileAction{grant("alice", "db")})
	must0(sim.SucceedMRPipeline(proj, m.IID))
	sim.InjectFault(gitlabsim.Fault{Method: "PUT", Route: "/projects/:id/merge_requests/:iid/merge", AfterWork: true, Drop: true, Count: 1})
	got := must(c.Merge(ctx(t), proj, m.IID, sha))
	if got.State != mr.StateMerged {
		t.Fatalf("merge with a lost answer: %+v", got)
	}

	m2, _ := publish(t, c, 2, []mr.FileAction{grant("bob", "db")})
	sim.InjectFault(gitlabsim.Fault{Method: "PUT", Route: "/projects/:id/merge_requests/:iid", AfterWork: true, Status: 502, Count: 1})
	closed := must(c.CloseMR(ctx(t), proj, m2.IID))
	if closed.State != mr.StateClosed {
		t.Fatalf("close with a lost answer: %+v", closed)
	}
}

func TestCloseThenRereadMergedWins(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	m, _ := publish(t, c, 1, []mr.FileAction{grant("alice", "db")})
	// A human merges between the settler's decision and its close call.
	if err := sim.MergeMR(proj, m.IID); err != nil {
		t.Fatal(err)
	}
	closed := must(c.CloseMR(ctx(t), proj, m.IID))
	if closed.State != mr.StateMerged {
		t.Fatalf("closing a merged MR reported %q", closed.State)
	}
	reread := must(c.GetMR(ctx(t), proj, m.IID))
	if reread.State != mr.StateMerged || reread.MergedAt == nil {
		t.Fatalf("re-read after close: %+v", reread)
	}
	// Closing a closed MR is fine too.
	m2, _ := publish(t, c, 2, []mr.FileAction{grant("bob", "db")})
	must(c.CloseMR(ctx(t), proj, m2.IID))
	again := must(c.CloseMR(ctx(t), proj, m2.IID))
	if again.State != mr.StateClosed {
		t.Fatalf("second close: %+v", again)
	}
	// An armed MR must not merge after it was closed.
	if _, ok := sim.Files(proj)[domain.BindingPath("bob", "db")]; ok {
		t.Fatal("closed MR's file reached the default branch")
	}
}

func TestThousandFilesLandAfterMerge(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true}, func(cfg *mr.Config) { cfg.MaxActionsPerCommit = 400 })
	var files []mr.FileAction
	want := map[string]string{}
	for i := range 1000 {
		f := grant(fmt.Sprintf("user-%04d@corp", i), fmt.Sprintf("team-%02d/db:%d", i%37, i%3))
		files = append(files, f)
		want[f.Path] = f.Content
	}
	// The first chunk's answer is lost after the work: the resume must continue with
	// the second chunk, not redo the first.
	sim.InjectFault(gitlabsim.Fault{Method: "POST", Route: "/projects/:id/repository/commits", AfterWork: true, Drop: true, Count: 1})
	m, sha := publish(t, c, 42, files)
	if n := sim.CommitCount(proj, "batcherd/batch-42"); n != 3 {
		t.Fatalf("%d commits for 1000 files at 400 per commit, want 3", n)
	}
	if n := sim.CallCount("POST /projects/:id/repository/commits"); n != 3 {
		t.Fatalf("%d commit calls, want 3", n)
	}
	if err := sim.SucceedMRPipeline(proj, m.IID); err != nil {
		t.Fatal(err)
	}
	must(c.Merge(ctx(t), proj, m.IID, sha))
	got := sim.Files(proj)
	for p, content := range want {
		if got[p] != content {
			t.Fatalf("%s: got %q want %q", p, got[p], content)
		}
	}
	if len(got) != len(want)+1 { // + README.md
		t.Fatalf("default branch has %d files, want %d", len(got), len(want)+1)
	}

	// A second batch over the same files updates them all: create vs update came
	// from tree listings (paginated), not from per-file calls.
	sim.ResetCalls()
	for i := range files {
		files[i].Content += "# v2\n"
	}
	m2, sha2 := publish(t, c, 43, files)
	if n := sim.CallCount("GET /projects/:id/repository/files/:path"); n != 0 {
		t.Fatalf("per-file calls: %d", n)
	}
	if sim.CallCount("GET /projects/:id/repository/tree") < 10 {
		t.Fatalf("expected a paginated tree listing, got %d tree calls", sim.CallCount("GET /projects/:id/repository/tree"))
	}
	must0(sim.SucceedMRPipeline(proj, m2.IID))
	must(c.Merge(ctx(t), proj, m2.IID, sha2))
	if got := sim.Files(proj); got[files[999].Path] != files[999].Content {
		t.Fatalf("update did not land: %q", got[files[999].Path])
	}
}

func TestPathEscaping(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	cases := [][2]string{
		{"group/sub/user", "svc/api"},
		{"user:with:colons", "db@prod"},
		{"first last", "team space/α"},
		{"пользователь", "目标:東京@west"},
		{"100%", "a+b?c#d"},
	}
	var files []mr.FileAction
	for i, cs := range cases {
		p := domain.BindingPath(cs[0], cs[1])
		if strings.Count(p, "/") != 2 {
			t.Fatalf("%q/%q → %q: '/' was not escaped", cs[0], cs[1], p)
		}
		exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		var expires *time.Time
		if i%2 == 0 {
			expires = &exp
		}
		files = append(files, mr.FileAction{Path: p, Content: mr.BindingYAML(cs[0], cs[1], fmt.Sprintf("op-%d", i), expires)})
	}
	m, sha := publish(t, c, 9, files)
	must0(sim.SucceedMRPipeline(proj, m.IID))
	must(c.Merge(ctx(t), proj, m.IID, sha))
	got := sim.Files(proj)
	for i, cs := range cases {
		content, ok := got[domain.BindingPath(cs[0], cs[1])]
		if !ok {
			t.Fatalf("file for %q/%q missing; have %v", cs[0], cs[1], got)
		}
		var doc map[string]string
		if err := yaml.Unmarshal([]byte(content), &doc); err != nil {
			t.Fatal(err)
		}
		if doc["subject"] != cs[0] || doc["target"] != cs[1] || doc["operation_id"] != fmt.Sprintf("op-%d", i) {
			t.Fatalf("YAML round trip: %v", doc)
		}
		if (i%2 == 0) != (doc["expires_at"] == "2030-01-02T03:04:05Z") {
			t.Fatalf("expires_at: %q", doc["expires_at"])
		}
	}
	// Re-granting the same odd paths updates them (the tree listing found them).
	for i := range files {
		files[i].Content += "# again\n"
	}
	m2, sha2 := publish(t, c, 10, files)
	must0(sim.SucceedMRPipeline(proj, m2.IID))
	must(c.Merge(ctx(t), proj, m2.IID, sha2))
	if !strings.HasSuffix(sim.Files(proj)[files[3].Path], "# again\n") {
		t.Fatal("update of an escaped path did not land")
	}
}

func TestBindingYAMLQuotesSafely(t *testing.T) {
	for _, s := range []string{"yes", "123", "null", "a: b", "#x", " lead", "multi\nline", "'quote\"", "~"} {
		out := mr.BindingYAML(s, s, "op", nil)
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("%q: %v\n%s", s, err, out)
		}
		if doc["subject"] != s || doc["target"] != s {
			t.Fatalf("%q did not round-trip: %#v\n%s", s, doc, out)
		}
		if _, ok := doc["expires_at"]; ok {
			t.Fatal("expires_at present without a value")
		}
	}
}

func TestListOpenLabeledAllPages(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	for i := range 105 {
		publish(t, c, int64(100+i), []mr.FileAction{grant(fmt.Sprintf("u%d", i), "t")})
	}
	// One closed and one merged MR are not listed, nor a fork's MR with the label.
	must0(sim.CloseMR(proj, 1))
	must0(sim.MergeMR(proj, 2))
	must(sim.OpenMR(proj, "batcherd/batch-100", "main", []string{mr.Label}, true))
	open := must(c.ListOpenLabeled(ctx(t), proj, mr.Label))
	if len(open) != 103 {
		t.Fatalf("listed %d open labeled MRs, want 103", len(open))
	}
	if none := must(c.ListOpenLabeled(ctx(t), proj, "other")); len(none) != 0 {
		t.Fatalf("label filter ignored: %d", len(none))
	}
}

// In parent/child pipelines the parent's own jobs list is empty (GitLab leaves trigger
// jobs out of it): why the pipeline failed is found through its trigger job in the
// child pipeline, not read as unknown.
func TestFailureReasonOfAChildPipeline(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ChildPipelines: true})
	must0(sim.AddPoison(proj, gitlabsim.PoisonRule{Substring: "mallory", FailureReason: "runner_system_failure"}))
	m, _ := publish(t, c, 1, []mr.FileAction{grant("mallory", "db")})
	if m.PipelineStatus != "failed" || m.FailureReason != "runner_system_failure" || m.FailureReasonErr != nil {
		t.Fatalf("failed parent pipeline: status %q reason %q (%v), want the child's runner_system_failure",
			m.PipelineStatus, m.FailureReason, m.FailureReasonErr)
	}
	ok, _ := publish(t, c, 2, []mr.FileAction{grant("alice", "db")})
	if ok.PipelineStatus != "success" || ok.FailureReason != "" {
		t.Fatalf("succeeded parent pipeline: %q %q", ok.PipelineStatus, ok.FailureReason)
	}
}

func TestPipelineFailureReasonAndConflicts(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{})
	must0(sim.AddPoison(proj, gitlabsim.PoisonRule{Substring: "mallory", FailureReason: "runner_system_failure"}))
	m, sha := publish(t, c, 1, []mr.FileAction{grant("alice", "db"), grant("mallory", "db")})
	if m.PipelineStatus != "failed" || m.FailureReason != "runner_system_failure" || m.DetailedMergeStatus != "ci_must_pass" {
		t.Fatalf("poisoned batch: %+v", m)
	}
	_, err := c.SetAutoMerge(ctx(t), proj, m.IID, sha)
	wantClass(t, err, mr.ClassPermanent, http.StatusMethodNotAllowed)
	_, err = c.Merge(ctx(t), proj, m.IID, sha)
	wantClass(t, err, mr.ClassPermanent, http.StatusMethodNotAllowed)

	// Two batches change the same file; the second conflicts once the first merged.
	sim.ClearPoison(proj)
	a, shaA := publish(t, c, 2, []mr.FileAction{{Path: "bindings/x/same.yaml", Content: "a\n"}})
	b, shaB := publish(t, c, 3, []mr.FileAction{{Path: "bindings/x/same.yaml", Content: "b\n"}})
	must(c.Merge(ctx(t), proj, a.IID, shaA))
	got := must(c.GetMR(ctx(t), proj, b.IID))
	if !got.HasConflicts || got.DetailedMergeStatus != "conflict" {
		t.Fatalf("conflicting MR: %+v", got)
	}
	_, err = c.Merge(ctx(t), proj, b.IID, shaB)
	wantClass(t, err, mr.ClassPermanent, http.StatusMethodNotAllowed)
	// The sha guard: a merge with another sha is refused with GitLab's message.
	c2, sha2 := publish(t, c, 4, []mr.FileAction{{Path: "bindings/y/z.yaml", Content: "z\n"}})
	_, err = c.Merge(ctx(t), proj, c2.IID, strings.Repeat("0", 40))
	e := wantClass(t, err, mr.ClassPermanent, http.StatusConflict)
	if !strings.Contains(e.Message, "SHA does not match HEAD of source branch: "+sha2) {
		t.Fatalf("409 message lost: %q", e.Message)
	}
}

func TestErrorClasses(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{})

	// 401: wrong token, with the token never in the error.
	bad, err := mr.New(mr.Config{BaseURL: sim.URL(), Token: "glpat-wrong-secret-token", CallTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.GetMR(ctx(t), proj, 1)
	wantClass(t, err, mr.ClassPermanent, http.StatusUnauthorized)

	// 404 with GitLab's message kept.
	_, err = c.GetMR(ctx(t), "no/such-project", 1)
	if e := wantClass(t, err, mr.ClassNotFound, 404); e.Message != "404 Project Not Found" {
		t.Fatalf("404 message: %q", e.Message)
	}
	_, err = c.GetMR(ctx(t), proj, 999)
	if e := wantClass(t, err, mr.ClassNotFound, 404); e.Message != "404 Merge Request Not Found" {
		t.Fatalf("404 message: %q", e.Message)
	}
	// 400 keeps GitLab's message.
	err = c.EnsureBranch(ctx(t), proj, "batcherd/batch-1", "no-such-ref")
	if e := wantClass(t, err, mr.ClassPermanent, 400); e.Message != "Invalid reference name: no-such-ref" {
		t.Fatalf("400 message: %q", e.Message)
	}
	// 403: the protected default branch refuses pushes.
	_, err = c.CommitFiles(ctx(t), proj, "main", "", mr.BatchRef{ID: 1}, "x", []mr.FileAction{grant("a", "b")})
	if e := wantClass(t, err, mr.ClassPermanent, 403); !strings.Contains(e.Message, "You are not allowed to push into this branch") {
		t.Fatalf("403 message: %q", e.Message)
	}
	// 422 from MR creation keeps GitLab's message.
	_, err = c.EnsureMR(ctx(t), proj, mr.MRSpec{SourceBranch: "nope", Title: "x"})
	if e := wantClass(t, err, mr.ClassPermanent, 422); !strings.Contains(e.Message, `Source branch "nope" does not exist`) {
		t.Fatalf("422 message: %q", e.Message)
	}

	// 5xx on a read is retried (bounded) and then reported transient.
	sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id/merge_requests/:iid", Status: 500})
	sim.ResetCalls()
	_, err = c.GetMR(ctx(t), proj, 1)
	wantClass(t, err, mr.ClassTransient, 500)
	if n := sim.CallCount("GET /projects/:id/merge_requests/:iid"); n != 4 {
		t.Fatalf("%d attempts for a failing read, want 1 + 3 retries", n)
	}
	sim.ClearFaults()

	// 5xx on a write is not repeated by the transport.
	sim.InjectFault(gitlabsim.Fault{Method: "POST", Route: "/projects/:id/repository/branches", Status: 503})
	sim.ResetCalls()
	err = c.EnsureBranch(ctx(t), proj, "batcherd/batch-2", "main")
	wantClass(t, err, mr.ClassTransient, 503)
	if n := sim.CallCount("POST /projects/:id/repository/branches"); n != 1 {
		t.Fatalf("a failed write was sent %d times", n)
	}
	sim.ClearFaults()

	// A transient read failure that clears is absorbed by the retries.
	sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id/repository/branches/:branch", Status: 502, Count: 2})
	if err := c.EnsureBranch(ctx(t), proj, "batcherd/batch-3", "main"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CommitFiles(ctx(t), proj, "batcherd/batch-3", "", mr.BatchRef{ID: 3}, "x", []mr.FileAction{grant("a", "b")}); err != nil {
		t.Fatalf("read retried through two 502s: %v", err)
	}
	sim.ClearFaults()

	// A dropped connection on reads is retried; when it persists, it is transient.
	sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id/merge_requests", Drop: true})
	_, _, err = c.FindMR(ctx(t), proj, "batcherd/batch-3", mr.BatchRef{ID: 3})
	wantClass(t, err, mr.ClassTransient, 0)
	sim.ClearFaults()

	// A call slower than CallTimeout is a transient timeout.
	slow, err := mr.New(mr.Config{BaseURL: sim.URL(), Token: sim.Token(), CallTimeout: 200 * time.Millisecond, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	sim.InjectFault(gitlabsim.Fault{Route: "/projects/:id/merge_requests/:iid", LatencyMS: 1000, Count: 1})
	start := time.Now()
	_, err = slow.GetMR(ctx(t), proj, 1)
	e := wantClass(t, err, mr.ClassTransient, 0)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("timeout not bounded by CallTimeout: %v after %v", e, time.Since(start))
	}
	sim.ClearFaults()

	// A connection refused is transient.
	dead, err := mr.New(mr.Config{BaseURL: "http://127.0.0.1:1", Token: "t", CallTimeout: time.Second, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = dead.GetMR(ctx(t), proj, 1)
	wantClass(t, err, mr.ClassTransient, 0)

	if mr.ClassOf(nil) != mr.ClassNone || mr.ClassOf(errors.New("x")) != mr.ClassNone {
		t.Fatal("ClassOf of non-GitLab errors")
	}
}

func TestTokenNeverInErrors(t *testing.T) {
	const secret = "glpat-SuperSecretValue-123"
	sim, c := setup(t, gitlabsim.Options{Token: secret})
	// A server that echoes the token back must not leak it through our errors.
	sim.InjectFault(gitlabsim.Fault{Route: "/projects/:id/merge_requests/:iid", Status: 400, Body: `{"message":"token ` + secret + ` is not allowed here"}`})
	sim.InjectFault(gitlabsim.Fault{Route: "/projects/:id/repository/branches", Status: 500, Body: `{"message":"` + secret + `"}`})
	_, err1 := c.GetMR(ctx(t), proj, 1)
	err2 := c.EnsureBranch(ctx(t), proj, "b", "main")
	_, err3 := c.GetMR(ctx(t), "missing/project", 1)
	for _, err := range []error{err1, err2, err3} {
		if err == nil {
			t.Fatal("expected an error")
		}
		var e *mr.Error
		errors.As(err, &e)
		for _, text := range []string{err.Error(), fmt.Sprintf("%+v", err), e.Message, e.Err.Error()} {
			if strings.Contains(text, secret) {
				t.Fatalf("token leaked: %s", text)
			}
		}
	}
}

func TestRateLimitWaitedOut(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{ManualPipelines: true})
	m, _ := publish(t, c, 1, []mr.FileAction{grant("a", "b")})

	// Retry-After in seconds, on a write (GitLab's limiter refuses before any work).
	sim.ResetCalls()
	sim.InjectFault(gitlabsim.Fault{Method: "PUT", Route: "/projects/:id/merge_requests/:iid", Status: 429, Headers: map[string]string{"Retry-After": "1"}, Count: 1})
	if _, err := c.CloseMR(ctx(t), proj, m.IID); err != nil {
		t.Fatalf("429 with Retry-After: 1 was not waited out: %v", err)
	}
	calls := sim.Calls()
	if len(calls) != 2 || calls[0].Status != 429 || calls[1].Status != 200 {
		t.Fatalf("want exactly one 429 then one success, got %+v", calls)
	}
	if gap := calls[1].At.Sub(calls[0].At); gap < time.Second {
		t.Fatalf("retried after %v, before Retry-After elapsed", gap)
	}

	// RateLimit-Reset (Unix time) without Retry-After, on a read.
	sim.ResetCalls()
	reset := time.Now().Add(1500 * time.Millisecond).Truncate(time.Second).Add(time.Second)
	sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id/merge_requests/:iid", Status: 429,
		Headers: map[string]string{"RateLimit-Reset": fmt.Sprint(reset.Unix()), "RateLimit-Remaining": "0"}, Count: 1})
	if _, err := c.GetMR(ctx(t), proj, m.IID); err != nil {
		t.Fatal(err)
	}
	calls = sim.Calls()
	if len(calls) != 2 || !calls[1].At.After(reset.Add(-10*time.Millisecond)) {
		t.Fatalf("RateLimit-Reset not honoured: reset %v, calls %+v", reset, calls)
	}

	// A Retry-After beyond MaxRetryAfter is not waited: one call, a transient error
	// that carries the wait for the caller's scheduler.
	sim.ResetCalls()
	sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id/merge_requests/:iid", Status: 429, Headers: map[string]string{"Retry-After": "120"}, Count: 1})
	_, err := c.GetMR(ctx(t), proj, m.IID)
	e := wantClass(t, err, mr.ClassTransient, 429)
	if e.RetryAfter != 120*time.Second || sim.CallCount("") != 1 {
		t.Fatalf("RetryAfter %v after %d calls", e.RetryAfter, sim.CallCount(""))
	}
}

func TestBindingYAMLWithAttributes(t *testing.T) {
	exp := time.Date(2031, 5, 6, 7, 8, 9, 0, time.FixedZone("x", 3600))
	out, err := mr.BindingYAMLWithAttributes("s", "t", "op", &exp, json.RawMessage(`{"ticket":"ABC-1","n":2}`))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Subject    string         `yaml:"subject"`
		ExpiresAt  string         `yaml:"expires_at"`
		Attributes map[string]any `yaml:"attributes"`
	}
	if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Subject != "s" || doc.ExpiresAt != "2031-05-06T06:08:09Z" || doc.Attributes["ticket"] != "ABC-1" || doc.Attributes["n"] != 2 {
		t.Fatalf("%+v\n%s", doc, out)
	}
	for _, empty := range []json.RawMessage{nil, json.RawMessage("null"), json.RawMessage(" ")} {
		if plain, _ := mr.BindingYAMLWithAttributes("s", "t", "op", nil, empty); plain != mr.BindingYAML("s", "t", "op", nil) {
			t.Fatalf("attributes %q: the two renderings differ:\n%s", empty, plain)
		}
	}
	if _, err := mr.BindingYAMLWithAttributes("s", "t", "op", nil, json.RawMessage(`[1]`)); err == nil {
		t.Fatal("attributes that are not an object did not fail")
	}
}

// Numbers reach the file as the numbers sent: digits as sent, plain scalars that a
// YAML 1.2 reader (yaml.v3) reads back as that number and that a YAML 1.1 reader
// (PyYAML, Ruby) does not take for strings — 1.1 wants a decimal point and a signed
// exponent in a float.
func TestBindingYAMLNumbers(t *testing.T) {
	for _, c := range []struct {
		json, line string
		want       any // what yaml.v3 reads back
	}{
		{`1234567`, `"ticket": 1234567`, 1234567},
		{`9007199254740993`, `"ticket": 9007199254740993`, 9007199254740993},
		{`-42`, `"ticket": -42`, -42},
		{`0.1`, `"ticket": 0.1`, 0.1},
		{`-12.50`, `"ticket": -12.50`, -12.5},
		{`1e5`, `"ticket": 1.0e+5`, 1e5},
		{`1.5E3`, `"ticket": 1.5e+3`, 1500.0},
		{`2.5e-3`, `"ticket": 2.5e-3`, 0.0025},
	} {
		out, err := mr.BindingYAMLWithAttributes("s", "t", "op", nil, json.RawMessage(`{"ticket":`+c.json+`,"list":[`+c.json+`]}`))
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		if !strings.Contains(out, "    "+c.line+"\n") || !strings.Contains(out, "- "+strings.TrimPrefix(c.line, `"ticket": `)+"\n") {
			t.Errorf("%s: file lacks %q (also in the list):\n%s", c.json, c.line, out)
		}
		var doc struct {
			Attributes map[string]any `yaml:"attributes"`
		}
		if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatal(err)
		}
		if got := doc.Attributes["ticket"]; got != c.want {
			t.Errorf("%s: read back %#v, want %#v", c.json, got, c.want)
		}
	}
	for n, ok := range map[string]bool{"1234567": true, "9223372036854775807": true, "9223372036854775808": false,
		"-9223372036854775809": false, "1e308": true, "1e999": false, "-1e999": false, "0.5": true, "1e-999": true} {
		if err := domain.CheckAttributeNumber(json.Number(n)); (err == nil) != ok {
			t.Errorf("CheckAttributeNumber(%s) = %v, want ok=%v", n, err, ok)
		}
	}
}

// An MR is a batch's only when its commits carry the batch's trailers: this
// installation's id (from the branch name) and the batch id. Another installation's
// commit, a commit for another batch, or a human's commit on a branch of the same name
// is foreign: FindMR names it in a *ForeignMRError and never returns it as found.
func TestFindMRAdoptsOnlyMRsCarryingTheBatchTrailers(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{})
	const inst = "inst0001"
	for i, tc := range []struct {
		name    string
		message string
		ours    bool
	}{
		{"ours", "batch\n\nBatcherd-Installation: " + inst + "\nBatcherd-Batch: %d\n", true},
		{"another installation", "batch\n\nBatcherd-Installation: inst0002\nBatcherd-Batch: %d\n", false},
		{"another batch", "batch\n\nBatcherd-Installation: " + inst + "\nBatcherd-Batch: 999\n", false},
		{"no installation", "batch\n\nBatcherd-Batch: %d\n", false},
		{"a human", "fix a typo %d\n", false},
	} {
		id := int64(100 + i)
		branch := fmt.Sprintf("batcherd/%s/batch-%d", inst, id)
		content := "x\n"
		msg := tc.message
		if strings.Contains(msg, "%d") {
			msg = fmt.Sprintf(msg, id)
		}
		if _, err := sim.CommitToBranch(proj, branch, map[string]*string{fmt.Sprintf("f%d.txt", id): &content}, msg); err != nil {
			t.Fatal(err)
		}
		iid := must(sim.OpenMR(proj, branch, "main", []string{mr.Label}, false))
		if err := sim.MergeMR(proj, iid); err != nil {
			t.Fatal(err)
		}
		m, found, err := c.FindMR(ctx(t), proj, branch, mr.BatchRef{ID: id})
		var foreign *mr.ForeignMRError
		switch {
		case tc.ours && (err != nil || !found || m.IID != iid):
			t.Errorf("%s: FindMR = !%d found=%v err=%v, want !%d", tc.name, m.IID, found, err, iid)
		case !tc.ours && (found || !errors.As(err, &foreign) || foreign.IID != iid || !strings.Contains(err.Error(), fmt.Sprintf("!%d", iid))):
			t.Errorf("%s: FindMR = found=%v err=%v, want a ForeignMRError naming !%d", tc.name, found, err, iid)
		}
		if !tc.ours {
			_, err := c.EnsureMR(ctx(t), proj, mr.MRSpec{SourceBranch: branch, Batch: mr.BatchRef{ID: id}, Title: "x"})
			if !errors.As(err, &foreign) {
				t.Errorf("%s: EnsureMR = %v, want the ForeignMRError", tc.name, err)
			}
		}
	}
	// The commit batcherd writes carries both trailers, and GitLab's extended_trailers
	// (arrays of strings) decode.
	branch := domain.BranchName(inst, 7)
	if err := c.EnsureBranch(ctx(t), proj, branch, "main"); err != nil {
		t.Fatal(err)
	}
	must(c.CommitFiles(ctx(t), proj, branch, "", mr.BatchRef{ID: 7}, "batch 7", []mr.FileAction{grant("a", "b")}))
	_, msg, _ := sim.HeadCommit(proj, branch)
	if !strings.Contains(msg, "\n\nBatcherd-Installation: "+inst+"\nBatcherd-Batch: 7\n") {
		t.Fatalf("commit message lacks the trailers:\n%s", msg)
	}
	m := must(c.EnsureMR(ctx(t), proj, mr.MRSpec{SourceBranch: branch, Batch: mr.BatchRef{ID: 7}, Title: "batch 7"}))
	if got, found, err := c.FindMR(ctx(t), proj, branch, mr.BatchRef{ID: 7}); err != nil || !found || got.IID != m.IID {
		t.Fatalf("FindMR of batcherd's own MR: !%d %v %v", got.IID, found, err)
	}
}

// Issue #14, lie 3: whether a revoke's delete is needed was decided from a tree listing
// alone; a listing that missed the file (a 404 of the wrong kind, a paging quirk) dropped
// the delete, and the batch settled with the file still there. A delete the listing
// calls unnecessary is confirmed against the file itself; only GitLab's own "404 File
// Not Found" drops it.
func TestRevokeDeleteIsConfirmedAgainstTheFile(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{})
	content := "subject: alice\n"
	path := domain.BindingPath("alice", "db/prod")
	if _, err := sim.PushToDefault(proj, map[string]*string{path: &content}, "an active grant"); err != nil {
		t.Fatal(err)
	}
	for i, lie := range []gitlabsim.Fault{
		{Method: "GET", Route: "/projects/:id/repository/tree", Status: 200, Body: "[]"},
		{Method: "GET", Route: "/projects/:id/repository/tree", Status: 404, Body: `{"message":"404 Tree Not Found"}`},
	} {
		branch := fmt.Sprintf("batcherd/batch-%d", 50+i)
		if err := c.EnsureBranch(ctx(t), proj, branch, "main"); err != nil {
			t.Fatal(err)
		}
		fid := sim.InjectFault(lie)
		got, err := c.CommitFiles(ctx(t), proj, branch, "", mr.BatchRef{ID: int64(50 + i)}, "revoke", []mr.FileAction{{Path: path, Delete: true}})
		applied := sim.FaultApplied(fid)
		sim.ClearFaults()
		if err != nil {
			t.Fatalf("listing lie %d: %v", i, err)
		}
		if applied == 0 {
			t.Fatalf("listing lie %d never applied", i)
		}
		if got.Empty {
			t.Fatalf("listing lie %d: the delete was dropped (Empty commit)", i)
		}
		if _, ok := sim.BranchFiles(proj, branch)[path]; ok {
			t.Fatalf("listing lie %d: %s is still on the batch branch", i, path)
		}
	}
	// The file's own 404 drops the delete; any other 404 is an error, never "gone".
	if err := c.EnsureBranch(ctx(t), proj, "batcherd/batch-60", "main"); err != nil {
		t.Fatal(err)
	}
	absent := domain.BindingPath("bob", "db/prod")
	if got, err := c.CommitFiles(ctx(t), proj, "batcherd/batch-60", "", mr.BatchRef{ID: 60}, "revoke", []mr.FileAction{{Path: absent, Delete: true}}); err != nil || !got.Empty {
		t.Fatalf("delete of a file that is not there: %+v %v, want Empty", got, err)
	}
	sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id/repository/files/:file", Status: 404, Body: `{"message":"404 Not Found"}`})
	defer sim.ClearFaults()
	if got, err := c.CommitFiles(ctx(t), proj, "batcherd/batch-60", "", mr.BatchRef{ID: 60}, "revoke", []mr.FileAction{{Path: absent, Delete: true}}); err == nil || got.Empty {
		t.Fatalf("a 404 that is not the file's own: %+v %v, want an error", got, err)
	}
}

// An MR opened from a batch branch after the branch's commits reached the target (a
// publisher whose lease lapsed between its FindMR and its create while another
// replica's MR merged) has no commits of its own. It is the batch's when the branch's
// head carries the batch's trailers — so the orphan sweep closes it — and someone
// else's when the head does not.
func TestEmptyMROnABatchBranchIsJudgedByTheBranchHead(t *testing.T) {
	sim, c := setup(t, gitlabsim.Options{})
	const inst = "emptymr001"
	branch := domain.BranchName(inst, 9)
	ref := mr.BatchRef{ID: 9, Claimed: time.Date(2026, 12, 1, 23, 0, 0, 123456000, time.UTC)}
	must(c.CommitFiles(ctx(t), proj, branch, "", ref, "batch 9", []mr.FileAction{grant("a", "b")}))
	first := must(c.EnsureMR(ctx(t), proj, mr.MRSpec{SourceBranch: branch, Batch: ref, Title: "batch 9"}))
	if err := sim.MergeMR(proj, first.IID); err != nil {
		t.Fatal(err)
	}
	iid, err := sim.OpenMR(proj, branch, "main", []string{mr.Label}, false)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.GetMR(ctx(t), proj, iid)
	if err != nil {
		t.Fatal(err)
	}
	if ours, err := c.IsBatchMR(ctx(t), proj, second, ref); err != nil || !ours {
		t.Fatalf("the empty MR on the batch's branch: ours=%v %v, want ours (its branch head carries the trailers)", ours, err)
	}
	if got, found, err := c.FindMR(ctx(t), proj, branch, ref); err != nil || !found || got.IID != first.IID {
		t.Fatalf("FindMR = !%d %v %v, want the merged !%d first", got.IID, found, err, first.IID)
	}
	other := ref
	other.Claimed = other.Claimed.Add(time.Second) // the same id re-issued after a restore
	if ours, err := c.IsBatchMR(ctx(t), proj, second, other); err != nil || ours {
		t.Fatalf("the empty MR judged for another claim of batch 9: ours=%v %v", ours, err)
	}

	// A human's branch of a batch name whose head carries no trailers, already merged
	// into main, and an empty MR from it: not ours.
	human := domain.BranchName(inst, 10)
	content := "x: y\n"
	if _, err := sim.CommitToBranch(proj, human, map[string]*string{"bindings/h/x.yaml": &content}, "a human's change"); err != nil {
		t.Fatal(err)
	}
	hm, err := sim.OpenMR(proj, human, "main", []string{mr.Label}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.MergeMR(proj, hm); err != nil {
		t.Fatal(err)
	}
	hiid, err := sim.OpenMR(proj, human, "main", []string{mr.Label}, false)
	if err != nil {
		t.Fatal(err)
	}
	hmr, err := c.GetMR(ctx(t), proj, hiid)
	if err != nil {
		t.Fatal(err)
	}
	if ours, err := c.IsBatchMR(ctx(t), proj, hmr, mr.BatchRef{ID: 10}); err != nil || ours {
		t.Fatalf("a human's empty MR on a batch branch name: ours=%v %v, want not ours", ours, err)
	}
}
