package api

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/batcherd/batcherd/internal/store"
)

var repoKeys = []string{"repo", "paused", "pause_reason", "paused_until", "paused_by", "paused_at", "waiting", "oldest_waiting_at", "active_batch_id", "gitlab", "drift"}

// GET /v1/repos shows each repository's GitLab state and last drift check from the
// database (repo_state), null until a replica recorded them.
func TestListReposGitLabAndDrift(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	if r := e.do(req{method: "GET", path: "/v1/repos"}); r.status != 401 {
		t.Fatalf("without a token: %d", r.status)
	}
	get := func() []map[string]any {
		t.Helper()
		r := e.do(req{method: "GET", path: "/v1/repos", token: apiToken})
		if r.status != 200 {
			t.Fatalf("GET /v1/repos: %d %s", r.status, r.raw)
		}
		var out struct {
			Repos []map[string]any `json:"repos"`
		}
		if err := json.Unmarshal(r.raw, &out); err != nil {
			t.Fatal(err)
		}
		for _, rp := range out.Repos {
			keys := make([]string, 0, len(rp))
			for k := range rp {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			want := slices.Sorted(slices.Values(repoKeys))
			if !reflect.DeepEqual(keys, want) {
				t.Fatalf("repo object keys %v, want %v", keys, want)
			}
		}
		return out.Repos
	}
	rs := get()
	if len(rs) != 2 || rs[0]["repo"] != repoA || rs[1]["repo"] != repoB {
		t.Fatalf("repos = %v, want %s and %s in configuration order", rs, repoA, repoB)
	}
	for _, rp := range rs {
		if rp["waiting"] != 0.0 || rp["oldest_waiting_at"] != nil || rp["active_batch_id"] != nil || rp["gitlab"] != nil ||
			rp["drift"] != nil || rp["paused"] != false || rp["pause_reason"] != nil {
			t.Fatalf("fresh repository: %v", rp)
		}
	}

	// Two approved operations of repo A wait; then a round claims one batch.
	e.mustCreate("alice", "db", "grant")
	e.mustCreate("bob", "db", "grant")
	e.exec("UPDATE operation SET status = 'queued'")
	e.exec("INSERT INTO merge_batch_request (operation_id, repo) SELECT operation_id, repo FROM operation")
	rs = get()
	if rs[0]["waiting"] != 2.0 || rs[0]["oldest_waiting_at"] == nil || rs[1]["waiting"] != 0.0 {
		t.Fatalf("after two admissions: %v", rs)
	}
	res, err := e.st.BatchClaim(ctx, repoA, 1)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if err := e.st.RepoGitLabStateSet(ctx, repoB, store.GitLabUnauthorized, "401 Unauthorized"); err != nil {
		t.Fatal(err)
	}
	if err := e.st.RepoDriftRecord(ctx, repoA, store.DriftCounts{Unexpected: 1, Missing: 2, Modified: 3}); err != nil {
		t.Fatal(err)
	}
	rs = get()
	if rs[0]["waiting"] != 1.0 || rs[0]["active_batch_id"] != float64(res.BatchID) {
		t.Fatalf("after the claim: %v", rs[0])
	}
	d, _ := rs[0]["drift"].(map[string]any)
	if d["unexpected"] != 1.0 || d["missing"] != 2.0 || d["modified"] != 3.0 || d["checked_at"] == nil {
		t.Fatalf("drift = %v", rs[0]["drift"])
	}
	if rs[1]["gitlab"] != "unauthorized" || rs[1]["drift"] != nil {
		t.Fatalf("repo B: %v", rs[1])
	}
	if rs[0]["gitlab"] != nil {
		t.Fatalf("repo A's GitLab state without any answer recorded: %v", rs[0]["gitlab"])
	}
	if err := e.st.RepoGitLabStateSet(ctx, repoA, store.GitLabOK, ""); err != nil {
		t.Fatal(err)
	}
	if rs = get(); rs[0]["gitlab"] != "ok" {
		t.Fatalf("repo A after an answer: %v", rs[0]["gitlab"])
	}
}
