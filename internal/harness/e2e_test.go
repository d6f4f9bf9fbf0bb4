package harness_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/harness"
)

// TestEndToEnd runs the real binaries as processes: three `batcherd serve` replicas
// on one fresh database, and the GitLab simulator. Through the HTTP API only it
// applies for grants in two repositories (half approved by an explicit call, half
// replayed with their Idempotency-Key), kills a replica with SIGKILL while batches are
// in flight, revokes part of the granted bindings, restarts the killed replica and
// stops another one gracefully. At the end every operation is merged, every batch has
// exactly one merged MR, the repository holds exactly the files it should, an admin
// round finds nothing to claim, and `batcherd verify` exits 0.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts real processes and a database (skipped under -short)")
	}
	repos := []string{"e2e/alpha", "e2e/beta"}
	c := harness.StartT(t, harness.Options{
		Replicas:          3,
		Repos:             repos,
		DBPrefix:          "bt_e2e",
		Race:              raceEnabled,
		PipelineDuration:  time.Second,
		ClaimSchedule:     "@every 1s",
		ReconcileInterval: 500 * time.Millisecond,
		StopGrace:         10 * time.Second,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	api := c.Client()
	admin := c.AdminClient()

	// Authentication is on: no token is 401, an API token may not run rounds.
	if _, err := harness.NewClient("", c.Replicas[0].URL()).Operation(ctx, "00000000-0000-0000-0000-000000000000"); !harness.IsAPIError(err, 401, "") {
		t.Errorf("no token: %v, want 401", err)
	}
	if _, err := api.Round(ctx, ""); !harness.IsAPIError(err, 403, "") {
		t.Errorf("admin round with an API token: %v, want 403", err)
	}

	type rec struct {
		id, repo, subject, target string
	}
	submit := func(t *testing.T, action string, items []rec, key func(rec) string) []rec {
		t.Helper()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		out := make([]rec, len(items))
		sem := make(chan struct{}, 6)
		for i, it := range items {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				op, created, err := api.Submit(ctx, harness.OperationRequest{Subject: it.subject, Target: it.target, Action: action, Repo: it.repo}, key(it))
				if err == nil && !created {
					err = fmt.Errorf("%s %s: first submission answered as a replay", action, it.subject)
				}
				if err == nil {
					_, err = api.Approve(ctx, op.ID)
				}
				if err == nil {
					// Replaying the application returns the same operation, creates nothing.
					var again harness.Operation
					again, created, err = api.Submit(ctx, harness.OperationRequest{Subject: it.subject, Target: it.target, Action: action, Repo: it.repo}, key(it))
					if err == nil && (created || again.ID != op.ID) {
						err = fmt.Errorf("replay of %s gave %s created=%v, want %s", key(it), again.ID, created, op.ID)
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				it.id = op.ID
				out[i] = it
			})
		}
		wg.Wait()
		for _, err := range errs {
			t.Error(err)
		}
		if len(errs) > 0 {
			t.FailNow()
		}
		return out
	}
	waitMerged := func(t *testing.T, what string, ids []string) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for {
			ops, err := harness.GetOperations(ctx, api, ids)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			var open []string
			for _, id := range ids {
				switch op := ops[id]; op.Status {
				case "merged":
				case "failed", "rejected":
					t.Fatalf("%s: operation %s is %s: %+v", what, id, op.Status, op.Error)
				default:
					open = append(open, id+"="+op.Status)
				}
			}
			if len(open) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d operations not merged after 45s: %v", what, len(open), open[:min(len(open), 10)])
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	ids := func(rs []rec) []string {
		out := make([]string, len(rs))
		for i, r := range rs {
			out[i] = r.id
		}
		return out
	}

	// Wave 1: 30 grants per repository.
	var grants []rec
	for i := range 60 {
		repo := repos[i%2]
		grants = append(grants, rec{repo: repo, subject: fmt.Sprintf("svc-%02d", i/2), target: strings.TrimPrefix(repo, "e2e/") + "/db-" + fmt.Sprint(i%3)})
	}
	grants = submit(t, "grant", grants, func(r rec) string { return "e2e-grant-" + r.subject + "-" + r.target })

	// Kill a replica with SIGKILL while batches are in flight: every grant claimed,
	// and every running batch's MR open (recorded). Not in the middle of a publish: a
	// publish reservation outlives its crashed holder for the publish lease (2m),
	// longer than this test (a separate, slower scenario).
	victim := c.Replicas[0]
	deadline := time.Now().Add(20 * time.Second)
	for {
		bs, err := api.Batches(ctx, "", "running")
		if err != nil {
			t.Fatal(err)
		}
		ready := true
		for _, b := range bs {
			ready = ready && b.MRIID != nil
		}
		if ready {
			ops, err := harness.GetOperations(ctx, api, ids(grants))
			if err != nil {
				t.Fatal(err)
			}
			merged := 0
			for _, op := range ops {
				ready = ready && (op.Status == "in_batch" || op.Status == "merged")
				if op.Status == "merged" {
					merged++
				}
			}
			if ready && len(bs) == 0 && merged == len(ops) {
				t.Log("every grant merged before a batch was seen in flight; killing a replica anyway")
			} else {
				ready = ready && len(bs) > 0
			}
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no moment with every grant claimed and a batch in flight within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	if victim.Running() || victim.State() != "signal: killed" {
		t.Fatalf("%s after kill -9: %s", victim.ID, victim.State())
	}

	// Wave 2 while it is down: 20 more grants through the survivors.
	var more []rec
	for i := range 20 {
		repo := repos[i%2]
		more = append(more, rec{repo: repo, subject: fmt.Sprintf("job-%02d", i/2), target: strings.TrimPrefix(repo, "e2e/") + "/queue"})
	}
	more = submit(t, "grant", more, func(r rec) string { return "e2e-grant-" + r.subject + "-" + r.target })
	grants = append(grants, more...)
	waitMerged(t, "grants", ids(grants))

	// Back up on the same address; then revoke a third of the bindings while another
	// replica shuts down gracefully.
	if err := victim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var revokes []rec
	for i, g := range grants {
		if i%3 == 0 {
			revokes = append(revokes, rec{repo: g.repo, subject: g.subject, target: g.target})
		}
	}
	revokes = submit(t, "revoke", revokes, func(r rec) string { return "e2e-revoke-" + r.subject + "-" + r.target })
	if code, err := c.Replicas[1].Stop(10 * time.Second); err != nil || code != 0 {
		t.Errorf("graceful stop of %s: exit %d, %v (want 0)", c.Replicas[1].ID, code, err)
	}
	waitMerged(t, "revokes", ids(revokes))

	// Nothing is left to claim; a manual round says so.
	for _, repo := range repos {
		res, err := admin.Round(ctx, repo)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != "nothing_to_claim" {
			t.Errorf("round of %s after everything merged: %+v", repo, res)
		}
	}

	// The repository and the database agree.
	exp := harness.Expect{Settled: true, Merged: append(ids(grants), ids(revokes)...)}
	revoked := map[harness.BindingKey]bool{}
	for _, r := range revokes {
		k := harness.BindingKey{Repo: r.repo, Subject: r.subject, Target: r.target}
		revoked[k] = true
		exp.Absent = append(exp.Absent, k)
	}
	for _, g := range grants {
		if k := (harness.BindingKey{Repo: g.repo, Subject: g.subject, Target: g.target}); !revoked[k] {
			exp.Present = append(exp.Present, k)
		}
	}
	rep, err := c.Audit(ctx, api, exp)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("audit: %s", rep.Summary())
	if !rep.OK() {
		t.Errorf("audit found problems:\n%s", rep.Summary())
	}
	if rep.OneMRPerBatch != rep.Batches || rep.MRs != rep.Batches {
		t.Errorf("%d batches, %d MRs, %d batches with exactly one MR: want one MR per batch", rep.Batches, rep.MRs, rep.OneMRPerBatch)
	}
	if rep.Files != len(exp.Present) {
		t.Errorf("%d binding files in the repositories, want %d", rep.Files, len(exp.Present))
	}

	// Every replica that ran did work, and the read-only audit of the database is clean.
	for _, r := range c.Live() {
		if _, err := r.Work(ctx); err != nil {
			t.Errorf("%s metrics: %v", r.ID, err)
		}
	}
	out, code, err := c.Verify(ctx)
	if err != nil || code != 0 {
		t.Errorf("batcherd verify: exit %d, %v\n%s", code, err, out)
	}
	t.Logf("batcherd verify:\n%s", out)

	// Stop the rest gracefully: exit code 0 each; no data race in any process.
	for _, r := range c.Live() {
		if code, err := r.Stop(10 * time.Second); err != nil || code != 0 {
			t.Errorf("graceful stop of %s: exit %d, %v (want 0)", r.ID, code, err)
		}
	}
	for _, r := range c.Replicas {
		if b, err := os.ReadFile(r.LogPath); err == nil && strings.Contains(string(b), "DATA RACE") {
			t.Errorf("%s reported a data race:\n%s", r.ID, harness.LogTail(r.LogPath, 80))
		}
	}
}
