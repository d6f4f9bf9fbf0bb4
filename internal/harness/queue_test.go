package harness_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/harness"
)

// TestQueueControlEndToEnd runs the real binaries: three `batcherd serve` replicas
// claiming every second, and the GitLab simulator. A repository paused through one
// replica is claimed by none of them for several scheduled rounds while applications
// are admitted and approved (an urgent one included); one of them is withdrawn; after
// the resume everything else merges, the urgent operation in the first batch, the
// withdrawn one in none; `batcherd verify` exits 0.
func TestQueueControlEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts real processes and a database (skipped under -short)")
	}
	const repo = "qc/alpha"
	c := harness.StartT(t, harness.Options{
		Replicas:          3,
		Repos:             []string{repo},
		DBPrefix:          "bt_qc",
		Race:              raceEnabled,
		PipelineDuration:  300 * time.Millisecond,
		ClaimSchedule:     "@every 1s",
		ReconcileInterval: 300 * time.Millisecond,
		StopGrace:         10 * time.Second,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	api, admin := c.Client(), c.AdminClient()

	if r, err := admin.Pause(ctx, repo, "release freeze"); err != nil || !r.Paused {
		t.Fatalf("pause: %+v %v", r, err)
	}
	var normal []string
	for i := range 5 {
		op, _, err := api.Submit(ctx, harness.OperationRequest{Subject: fmt.Sprintf("n%d", i), Target: "db", Action: "grant", Repo: repo}, "")
		if err == nil {
			_, err = api.Approve(ctx, op.ID)
		}
		if err != nil {
			t.Fatal(err)
		}
		normal = append(normal, op.ID)
	}
	urgent, _, err := api.Submit(ctx, harness.OperationRequest{Subject: "leaver", Target: "db", Action: "grant", Repo: repo, Priority: "urgent"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if op, err := api.Approve(ctx, urgent.ID); err != nil || op.Status != "queued" || op.Priority != "urgent" {
		t.Fatalf("urgent approval while paused: %+v %v, want queued", op, err)
	}
	// Several scheduled rounds on each replica, and an admin round: nothing is claimed.
	time.Sleep(3 * time.Second)
	if r, err := admin.Round(ctx, repo); err != nil || r.Outcome != "paused" {
		t.Fatalf("admin round while paused: %+v %v", r, err)
	}
	repos, err := api.Repos(ctx)
	if err != nil || len(repos) != 1 || !repos[0].Paused || repos[0].Waiting != 6 || repos[0].ActiveBatchID != nil {
		t.Fatalf("GET /v1/repos while paused: %+v %v", repos, err)
	}
	// Withdraw one of the waiting operations.
	if op, err := api.Withdraw(ctx, normal[4]); err != nil || op.Status != "withdrawn" {
		t.Fatalf("withdraw: %+v %v", op, err)
	}
	if r, err := admin.Resume(ctx, repo); err != nil || r.Paused {
		t.Fatalf("resume: %+v %v", r, err)
	}
	// Everything else merges; the urgent operation goes in the first batch.
	deadline := time.Now().Add(60 * time.Second)
	first := int64(0)
	for _, id := range append([]string{urgent.ID}, normal[:4]...) {
		for {
			op, err := api.Operation(ctx, id)
			if err == nil && op.Status == "merged" {
				if first == 0 || *op.BatchID < first {
					if id != urgent.ID && first != 0 {
						t.Errorf("normal operation %s merged in batch %d, before the urgent one's batch %d", id, *op.BatchID, first)
					}
					first = *op.BatchID
				}
				break
			}
			if err != nil || op.Status == "failed" || time.Now().After(deadline) {
				t.Fatalf("operation %s: %+v %v", id, op, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if op, err := api.Operation(ctx, normal[4]); err != nil || op.Status != "withdrawn" || op.BatchID != nil {
		t.Fatalf("withdrawn operation: %+v %v", op, err)
	}
	if out, code, err := c.Verify(ctx); err != nil || code != 0 {
		t.Fatalf("batcherd verify: exit %d %v\n%s", code, err, out)
	}
}
