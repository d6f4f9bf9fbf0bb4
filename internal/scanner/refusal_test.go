package scanner

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// Issue #14, lie 2 at run time: a token GitLab refuses (401) left one log line and a
// batch running until the batch timeout, which then failed it — and its members — for
// a token problem. Refusals hold the work: nothing fails for them, not even by the
// timeout sweep; the repository shows as unauthorized (repo_state, metric); and once
// the token works again, everything goes on by itself.
func TestTokenRefusedHoldsWorkUntilFixed(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	bg := context.Background()
	const timeout = 400 * time.Millisecond
	s := e.scanner("a", func(c *Config) {
		c.BatchTimeout = timeout
		c.RefusalBackoffBase = 50 * time.Millisecond
		c.RefusalBackoffMax = 100 * time.Millisecond
	})
	// Published by a replica with the default timeout: one with a timeout this short
	// does not publish a batch past it, and under load publishing can take that long.
	pub := e.scanner("pub", nil)
	res, err := pub.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	var b domain.Batch
	waitUntil(t, 20*time.Second, "the batch is published", func() bool {
		_ = pub.publish.runOnce(bg)
		b, _ = e.st.BatchGet(bg, res.BatchID)
		return b.MRIID != nil
	})
	e.sim.InjectFault(gitlabsim.Fault{Status: 401, Body: `{"message":"401 Unauthorized"}`})
	deadline := time.Now().Add(4 * timeout)
	for time.Now().Before(deadline) {
		e.due(b.ID)
		_ = s.publish.runOnce(bg)
		_ = s.reconcile.runOnce(bg)
		_ = s.timeout.runOnce(bg)
		_ = s.orphans.runOnce(bg)
		time.Sleep(20 * time.Millisecond)
	}
	cur, _ := e.st.BatchGet(bg, b.ID)
	if cur.Status != domain.BatchRunning {
		t.Fatalf("batch %s (%s: %s) while GitLab refused the token; want it held running", cur.Status, cur.ErrorCode, cur.ErrorMessage)
	}
	e.requireOps(ids, domain.OpInBatch)
	states, err := e.st.RepoHealths(bg)
	if err != nil {
		t.Fatal(err)
	}
	if st := states[repo]; st.GitLabState != store.GitLabUnauthorized || !strings.Contains(st.GitLabDetail, "401") {
		t.Fatalf("repo_state = %+v, want unauthorized", st)
	}
	if v := testutil.ToFloat64(s.m.gitlabState.WithLabelValues(repo, store.GitLabUnauthorized)); v != 1 {
		t.Fatalf("batcherd_repository_gitlab_state{state=unauthorized} = %v", v)
	}
	// Held, and probed with backoff rather than at every pass.
	if n := testutil.ToFloat64(s.m.outcomes.WithLabelValues("reconcile", "held_gitlab_refused")); n == 0 {
		t.Fatal("reconcile never held the batch")
	}

	// The token is fixed. The batch — long past its timeout by the clock — gets a
	// whole timeout again instead of failing as soon as GitLab answers; then its
	// pipeline passes, GitLab merges, and everything goes on by itself.
	e.sim.ClearFaults()
	time.Sleep(120 * time.Millisecond) // past the longest probe backoff
	e.due(b.ID)
	_ = s.reconcile.runOnce(bg) // the first probe GitLab answers
	_ = s.timeout.runOnce(bg)
	if cur, _ := e.st.BatchGet(bg, b.ID); cur.Status != domain.BatchRunning {
		t.Fatalf("the timeout sweep settled the batch %s (%s: %s) as soon as GitLab answered again", cur.Status, cur.ErrorCode, cur.ErrorMessage)
	}
	if err := e.sim.SucceedMRPipeline(repo, *b.MRIID); err != nil {
		t.Fatal(err)
	}
	e.due(b.ID)
	if done := e.drive(s, b.ID, 10*time.Second); done.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s (%s: %s) after the token was fixed, want succeeded", done.Status, done.ErrorCode, done.ErrorMessage)
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
	// Leaving a refusal is recorded in the background: soon, not necessarily yet.
	waitUntil(t, 10*time.Second, "repo_state says ok again", func() bool {
		states, _ = e.st.RepoHealths(bg)
		return states[repo].GitLabState == store.GitLabOK
	})
}

// Issue #14: one name GitLab refuses sank its whole batch through two batch timeouts
// without bisection. A permanent refusal of the batch's content (400/422 on the commit)
// fails the batch at once with GitLab's message, and the failure policy isolates the
// member whose file GitLab refuses; the others merge.
func TestContentRefusalFailsAtOnceAndIsolatesTheMember(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	bg := context.Background()
	good := storetest.InsertOps(t, e.st, storetest.Ops{Repo: repo, N: 5, Admit: true, Prefix: "good"})
	bad := storetest.InsertOps(t, e.st, storetest.Ops{Repo: repo, N: 1, Admit: true, Prefix: "refused"})
	if err := e.sim.RefusePath(repo, gitlabsim.RefusedPath{Contains: "refused-", Message: "Path is not allowed by the server"}); err != nil {
		t.Fatal(err)
	}
	s := e.scanner("a", func(c *Config) { c.BatchTimeout = time.Hour })
	res, err := s.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	_ = s.publish.runOnce(bg)
	first, _ := e.st.BatchGet(bg, res.BatchID)
	if first.Status != domain.BatchFailed || first.ErrorCode != string(domain.ClassRefused) || !strings.Contains(first.ErrorMessage, "Path is not allowed by the server") {
		t.Fatalf("first batch: %s %s %q; want failed at once, %s, with GitLab's message", first.Status, first.ErrorCode, first.ErrorMessage, domain.ClassRefused)
	}
	// Bisection goes on by itself (each settle claims the next half); a round now and
	// then stands in for the schedule. A batch timeout of an hour never fires here.
	waitUntil(t, 30*time.Second, "every operation settled", func() bool {
		_, _ = s.RunRound(bg, repo)
		_ = s.publish.runOnce(bg)
		_ = s.reconcile.runOnce(bg)
		for _, op := range e.ops(append(append([]string{}, good...), bad...)) {
			if op.Status != domain.OpMerged && op.Status != domain.OpFailed {
				return false
			}
		}
		return true
	})
	e.requireFiles(repo, e.requireOps(good, domain.OpMerged), true)
	culprit := e.requireOps(bad, domain.OpFailed)[bad[0]]
	if culprit.ErrorCode != domain.ReasonCulprit || !strings.Contains(culprit.ErrorMessage, "Path is not allowed") {
		t.Fatalf("refused member: %s %q, want culprit with GitLab's message", culprit.ErrorCode, culprit.ErrorMessage)
	}
}

// Issue #14, lie 3, end to end: a revoke whose delete a lying tree listing called
// unnecessary settled succeeded with the binding file still on the target branch.
func TestRevokeIsNotLostToATreeListing(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	bg := context.Background()
	ids := storetest.InsertOps(t, e.st, storetest.Ops{Repo: repo, N: 2, Action: domain.ActionRevoke, Admit: true})
	files := map[string]*string{}
	for _, op := range e.ops(ids) {
		content := "subject: " + op.Subject + "\noperation_id: an-earlier-grant\n"
		files[domain.BindingPath(op.Subject, op.Target)] = &content
	}
	if _, err := e.sim.PushToDefault(repo, files, "the grants being revoked"); err != nil {
		t.Fatal(err)
	}
	e.sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id/repository/tree", Status: 200, Body: "[]"})
	s := e.scanner("a", nil)
	res, err := s.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	b := e.drive(s, res.BatchID, 20*time.Second)
	e.sim.ClearFaults()
	if b.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s (%s: %s)", b.Status, b.ErrorCode, b.ErrorMessage)
	}
	e.requireOps(ids, domain.OpMerged)
	main := e.sim.Files(repo)
	for p := range files {
		if _, ok := main[p]; ok {
			t.Errorf("revoked, but %s is still on the target branch", p)
		}
	}
}
