package scanner

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/batcherd/batcherd/internal/drift"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// The drift loop compares the bindings/ tree with the active bindings: a file nobody
// explains (unexpected), an active binding without its file (missing), a file another
// operation's id (modified). The result is stored for every replica, exported, and
// only one replica checks a repository per interval.
func TestDriftLoopFindsEachKindOnce(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	bg := context.Background()
	ids := storetest.InsertQueuedOps(t, e.st, repo, 4)
	a := e.scanner("a", func(c *Config) { c.DriftInterval = time.Hour })
	b := e.scanner("b", func(c *Config) { c.DriftInterval = time.Hour })
	res, err := a.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	if got := e.drive(a, res.BatchID, 20*time.Second); got.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s", got.Status)
	}
	waitUntil(t, 30*time.Second, "the first drift check is stored", func() bool {
		if _, err := e.st.DB().Exec("UPDATE repo_state SET drift_next_at = CURRENT_TIMESTAMP(6)"); err != nil {
			t.Fatal(err)
		}
		_ = a.drift.runOnce(bg)
		st, _ := e.st.RepoHealths(bg)
		return st[repo].DriftCheckedAt != nil
	})
	if st, _ := e.st.RepoHealths(bg); *st[repo].DriftUnexpected+*st[repo].DriftMissing+*st[repo].DriftModified != 0 {
		t.Fatalf("clean repository: %+v", st[repo])
	}

	ops := e.ops(ids)
	var paths []string
	for _, id := range ids {
		paths = append(paths, domain.BindingPath(ops[id].Subject, ops[id].Target))
	}
	stray, other := "subject: stray\n", strings.ReplaceAll(e.sim.Files(repo)[paths[1]], ids[1], "00000000-0000-4000-8000-000000000000")
	if _, err := e.sim.PushToDefault(repo, map[string]*string{
		"bindings/x/stray.yaml": &stray, // unexpected
		paths[0]:                nil,    // missing
		paths[1]:                &other, // modified
	}, "a human's edits"); err != nil {
		t.Fatal(err)
	}
	// Force the next check, then race two replicas for it: exactly one takes it.
	force := func() {
		t.Helper()
		if _, err := e.st.DB().Exec("UPDATE repo_state SET drift_next_at = CURRENT_TIMESTAMP(6)"); err != nil {
			t.Fatal(err)
		}
	}
	taken := func() float64 {
		n := 0.0
		for _, s := range []*Scanner{a, b} {
			n += testutil.ToFloat64(s.m.outcomes.WithLabelValues("drift", "taken"))
		}
		return n
	}
	before := taken()
	force()
	var wg sync.WaitGroup
	for _, s := range []*Scanner{a, b} {
		wg.Go(func() { _ = s.drift.runOnce(bg) })
	}
	wg.Wait()
	if n := taken() - before; n != 1 {
		t.Fatalf("%v replicas took the repository's check in one interval, want 1", n)
	}
	// The result is stored for every replica (a check that met a GitLab hiccup under
	// load is simply run again).
	var r store.RepoHealth
	waitUntil(t, 30*time.Second, "the drift counts are stored", func() bool {
		st, _ := e.st.RepoHealths(bg)
		r = st[repo]
		if r.DriftUnexpected != nil && *r.DriftUnexpected+*r.DriftMissing+*r.DriftModified > 0 {
			return true
		}
		force()
		_ = a.drift.runOnce(bg)
		return false
	})
	if *r.DriftUnexpected != 1 || *r.DriftMissing != 1 || *r.DriftModified != 1 {
		t.Fatalf("drift = %d unexpected, %d missing, %d modified; want 1 each", *r.DriftUnexpected, *r.DriftMissing, *r.DriftModified)
	}
	rep, err := drift.Check(bg, e.gl, e.st, repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"bindings/x/stray.yaml": drift.Unexpected, paths[0]: drift.Missing, paths[1]: drift.Modified}
	if len(rep.Files) != 3 {
		t.Fatalf("files: %v", rep.Files)
	}
	for _, f := range rep.Files {
		if want[f.Path] != f.Kind {
			t.Errorf("%s: %s, want %s", f.Path, f.Kind, want[f.Path])
		}
	}
}

// After a batch merges, the target branch is read back: a member whose change is not
// there is drift — reported by an event, a metric and a log line, never accepted.
func TestPostMergeCheckReportsAMissingFile(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	bg := context.Background()
	ids := storetest.InsertQueuedOps(t, e.st, repo, 3)
	s := e.scanner("a", nil)
	victim := e.ops(ids)[ids[0]]
	var once sync.Once
	s.testHook = func(_ context.Context, step string, _ int64) {
		if step == "settle.succeeded" {
			once.Do(func() {
				// Between the merge and the read-back, the file goes (a human's push).
				if _, err := e.sim.PushToDefault(repo, map[string]*string{domain.BindingPath(victim.Subject, victim.Target): nil}, "oops"); err != nil {
					t.Error(err)
				}
			})
		}
	}
	res, err := s.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	if got := e.drive(s, res.BatchID, 20*time.Second); got.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s", got.Status)
	}
	if v := testutil.ToFloat64(s.m.mergeDrift.WithLabelValues(repo, drift.Missing)); v != 1 {
		t.Fatalf("batcherd_merge_verify_misses_total{kind=missing} = %v, want 1", v)
	}
	var n int
	if err := e.st.DB().Get(&n, "SELECT COUNT(*) FROM audit_event WHERE batch_id = ? AND code = ? AND detail LIKE ?",
		res.BatchID, EventMergeVerifyMiss, "%"+victim.OperationID+"%"); err != nil || n != 1 {
		t.Fatalf("%d %s events naming the operation (%v), want 1", n, EventMergeVerifyMiss, err)
	}
	if v := testutil.ToFloat64(s.m.mergeDrift.WithLabelValues(repo, drift.Modified)); v != 0 {
		t.Fatalf("the other members were reported: %v", v)
	}
}
