package api

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// GitLab's documented webhook payloads (the simulator's fixtures, copied from GitLab's
// docs; internal/mr/gitlabsim/testdata/README.md says where from) reach the handler as
// GitLab sends them, with the batch's branch where GitLab names the source branch, and
// make the batch due: a merge request event by object_attributes.source_branch, a
// pipeline event by merge_request.source_branch, or by object_attributes.ref when the
// pipeline is not a merge request's.
func TestWebhookTakesGitLabsDocumentedPayloads(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	storetest.InsertQueuedOps(t, e.st, repoA, 1)
	res, err := e.st.BatchClaim(ctx, repoA, 500)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	e.exec(`UPDATE merge_batch SET mr_iid = 7 WHERE id = ?`, res.BatchID)
	b, err := e.st.BatchGet(ctx, res.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	branch := b.SourceBranch // batcherd/<installation>/batch-<id>
	fixture := func(name string) map[string]any {
		raw, err := os.ReadFile("../mr/gitlabsim/testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	due := func() bool {
		var ok bool
		if err := e.st.DB().Get(&ok, `SELECT next_check_at <= CURRENT_TIMESTAMP(6) FROM merge_batch WHERE id = ?`, res.BatchID); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	mrEvent := fixture("webhook_merge_request.json")
	mrEvent["object_attributes"].(map[string]any)["source_branch"] = branch
	mrPipeline := fixture("webhook_pipeline.json")
	mrPipeline["merge_request"].(map[string]any)["source_branch"] = branch
	branchPipeline := fixture("webhook_pipeline.json")
	branchPipeline["merge_request"] = nil
	branchPipeline["object_attributes"].(map[string]any)["ref"] = branch
	for name, payload := range map[string]map[string]any{
		"Merge Request Hook":                       mrEvent,
		"Pipeline Hook (a merge request's)":        mrPipeline,
		"Pipeline Hook (a branch pipeline, no MR)": branchPipeline,
	} {
		e.exec(`UPDATE merge_batch SET next_check_at = CURRENT_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE id = ?`, res.BatchID)
		body, _ := json.Marshal(payload)
		r := e.do(req{method: "POST", path: "/v1/webhooks/gitlab", body: string(body),
			header: map[string]string{"X-Gitlab-Token": hookSecret, "X-Gitlab-Event": name}})
		if r.status != 204 || !due() {
			t.Errorf("%s: %d %s, due=%v", name, r.status, r.raw, due())
		}
	}
	// The documented examples as published name other branches: ignored, not due.
	e.exec(`UPDATE merge_batch SET next_check_at = CURRENT_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE id = ?`, res.BatchID)
	for _, name := range []string{"webhook_merge_request.json", "webhook_pipeline.json"} {
		body, _ := json.Marshal(fixture(name))
		if r := e.do(req{method: "POST", path: "/v1/webhooks/gitlab", body: string(body),
			header: map[string]string{"X-Gitlab-Token": hookSecret}}); r.status != 204 || due() {
			t.Errorf("%s as published: %d, due=%v", name, r.status, due())
		}
	}
}
