package api

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/store"
)

// Pause and resume: path-escaped repository, idempotent, 404 for an unconfigured
// repository, admin only, a reason required, until in the future; GET /v1/repos and
// the repository's history show it. Every answer passes the declared-status proxy.
func TestPauseResumeAPI(t *testing.T) {
	e := newEnv(t, nil)
	path := "/v1/admin/repos/" + url.PathEscape(repoA)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339)
	r := e.do(req{method: "POST", path: path + "/pause", token: adminToken, body: `{"reason":"release freeze","until":"` + until + `"}`})
	if r.status != 200 {
		t.Fatalf("pause: %d %s", r.status, r.raw)
	}
	repo, _ := r.json["repo"].(map[string]any)
	if repo["repo"] != repoA || repo["paused"] != true || repo["pause_reason"] != "release freeze" || repo["paused_until"] != until || repo["paused_by"] == nil {
		t.Fatalf("pause answered %v", repo)
	}
	for _, c := range []struct {
		req  req
		want int
		code string
	}{
		{req{method: "POST", path: path + "/pause", token: apiToken, body: `{"reason":"x"}`}, 403, "forbidden"},
		{req{method: "POST", path: "/v1/admin/repos/" + url.PathEscape("no/such") + "/pause", token: adminToken, body: `{"reason":"x"}`}, 404, "not_found"},
		{req{method: "POST", path: path + "/pause", token: adminToken, body: `{"reason":""}`}, 400, "invalid_request"},
		{req{method: "POST", path: path + "/pause", token: adminToken, body: `{"reason":"a\u0000b"}`}, 400, "invalid_request"},
		{req{method: "POST", path: path + "/pause", token: adminToken, body: `{"reason":"x","until":"2000-01-01T00:00:00Z"}`}, 400, "invalid_request"},
		{req{method: "POST", path: path + "/pause", token: adminToken, body: `{"reason":"x","until":"soon"}`}, 400, "invalid_request"},
		{req{method: "POST", path: path + "/pause", token: adminToken, body: `{"reason":"x","why":"y"}`}, 400, "unknown_field"},
		{req{method: "POST", path: path + "/pause", token: adminToken}, 400, "invalid_json"},
		{req{method: "POST", path: path + "/pause", token: adminToken, body: `{"reason":"` + strings.Repeat("x", 1025) + `"}`}, 400, "invalid_request"},
		{req{method: "POST", path: "/v1/admin/repos/" + url.PathEscape("no/such") + "/resume", token: adminToken}, 404, "not_found"},
		{req{method: "GET", path: "/v1/repos/" + url.PathEscape("no/such") + "/events", token: apiToken}, 404, "not_found"},
	} {
		got := e.do(c.req)
		if got.status != c.want || got.errCode() != c.code {
			t.Errorf("%s %s %s: %d %s, want %d %s", c.req.method, c.req.path, c.req.body, got.status, got.errCode(), c.want, c.code)
		}
	}
	l := e.do(req{method: "GET", path: "/v1/repos", token: apiToken})
	repos, _ := l.json["repos"].([]any)
	if l.status != 200 || len(repos) != 2 {
		t.Fatalf("GET /v1/repos: %d %s", l.status, l.raw)
	}
	a, b := repos[0].(map[string]any), repos[1].(map[string]any)
	if a["repo"] != repoA || a["paused"] != true || b["repo"] != repoB || b["paused"] != false || b["pause_reason"] != nil {
		t.Fatalf("GET /v1/repos: %s", l.raw)
	}
	for _, k := range []string{"waiting", "oldest_waiting_at", "active_batch_id", "gitlab", "drift", "paused_at"} {
		if _, ok := a[k]; !ok {
			t.Errorf("repo object lacks %q: %v", k, a)
		}
	}
	if r := e.do(req{method: "POST", path: path + "/resume", token: adminToken}); r.status != 200 || r.json["repo"].(map[string]any)["paused"] != false {
		t.Fatalf("resume: %d %s", r.status, r.raw)
	}
	ev := e.do(req{method: "GET", path: "/v1/repos/" + url.PathEscape(repoA) + "/events", token: apiToken})
	evs, _ := ev.json["events"].([]any)
	var codes []string
	for _, x := range evs {
		codes = append(codes, x.(map[string]any)["code"].(string))
	}
	if !slices.Equal(codes, []string{store.EventRepoPaused, store.EventRepoResumed}) {
		t.Fatalf("repository events %v", codes)
	}
}

// Withdraw over the API: 200 withdrawn (idempotent), 409 in_batch once claimed, 409
// stale once rejected, 404 unknown; an urgent approval asks for a round at once.
func TestWithdrawAndUrgentAPI(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.APITokens = append(c.APITokens, "bystander=bystander-token") })
	create := func(body string) string {
		r := e.do(req{method: "POST", path: "/v1/operations", token: apiToken, body: body})
		if r.status != 201 {
			t.Fatalf("create %s: %d %s", body, r.status, r.raw)
		}
		return r.op()["id"].(string)
	}
	id := create(`{"subject":"a","target":"t","action":"grant"}`)
	// Another API principal may not take someone else's application back.
	if r := e.do(req{method: "POST", path: "/v1/operations/" + id + "/withdraw", token: "bystander-token"}); r.status != 403 || r.errCode() != "forbidden" {
		t.Fatalf("withdraw by a bystander: %d %s", r.status, r.raw)
	}
	for range 2 {
		if r := e.do(req{method: "POST", path: "/v1/operations/" + id + "/withdraw", token: apiToken}); r.status != 200 || r.op()["status"] != "withdrawn" {
			t.Fatalf("withdraw: %d %s", r.status, r.raw)
		}
	}
	rej := create(`{"subject":"b","target":"t","action":"grant"}`)
	e.do(req{method: "POST", path: "/v1/operations/" + rej + "/reject", token: adminToken})
	if r := e.do(req{method: "POST", path: "/v1/operations/" + rej + "/withdraw", token: apiToken}); r.status != 409 || r.errCode() != "stale" {
		t.Fatalf("withdraw rejected: %d %s", r.status, r.raw)
	}
	if r := e.do(req{method: "POST", path: "/v1/operations/00000000-0000-4000-8000-000000000000/withdraw", token: apiToken}); r.status != 404 {
		t.Fatalf("withdraw unknown: %d", r.status)
	}
	if r := e.do(req{method: "POST", path: "/v1/operations", token: apiToken, body: `{"subject":"c","target":"t","action":"grant","priority":"soon"}`}); r.status != 400 {
		t.Fatalf("bad priority: %d", r.status)
	}
	u := create(`{"subject":"c","target":"t","action":"grant","priority":"urgent"}`)
	n := create(`{"subject":"d","target":"t","action":"grant"}`)
	if r := e.do(req{method: "POST", path: "/v1/operations/" + n + "/approve", token: adminToken}); r.status != 200 || r.op()["priority"] != "normal" {
		t.Fatalf("approve normal: %d %s", r.status, r.raw)
	}
	if len(e.rounds.repos) != 0 {
		t.Fatalf("a normal approval ran rounds %v", e.rounds.repos)
	}
	e.rounds.res = store.ClaimResult{Outcome: store.ClaimNothingToClaim}
	if r := e.do(req{method: "POST", path: "/v1/operations/" + u + "/approve", token: adminToken}); r.status != 200 || r.op()["priority"] != "urgent" || r.op()["status"] != "queued" {
		t.Fatalf("approve urgent: %d %s", r.status, r.raw)
	}
	if !slices.Equal(e.rounds.repos, []string{repoA}) {
		t.Fatalf("an urgent approval ran rounds %v, want one of %s", e.rounds.repos, repoA)
	}
	// Told slot_occupied while no committed batch holds the slot (a claim in flight
	// that may end without a batch), the urgent round looks again, a bounded number
	// of times.
	e.rounds.repos = nil
	e.rounds.res = store.ClaimResult{Outcome: store.ClaimSlotOccupied}
	u2 := create(`{"subject":"e","target":"t","action":"grant","priority":"urgent"}`)
	if r := e.do(req{method: "POST", path: "/v1/operations/" + u2 + "/approve", token: adminToken}); r.status != 200 || r.op()["status"] != "queued" {
		t.Fatalf("approve urgent: %d %s", r.status, r.raw)
	}
	if len(e.rounds.repos) != 5 {
		t.Fatalf("urgent rounds with a free slot told occupied: %v, want 5", e.rounds.repos)
	}
	// Claimed by a real claim: withdraw answers in_batch.
	res, err := e.st.BatchClaim(t.Context(), repoA, 10)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	// With a batch really holding the slot, one round: its settlement claims next.
	e.rounds.repos = nil
	u3 := create(`{"subject":"f","target":"t","action":"grant","priority":"urgent"}`)
	if r := e.do(req{method: "POST", path: "/v1/operations/" + u3 + "/approve", token: adminToken}); r.status != 200 || r.op()["status"] != "queued" {
		t.Fatalf("approve urgent: %d %s", r.status, r.raw)
	}
	if len(e.rounds.repos) != 1 {
		t.Fatalf("urgent rounds with the slot held: %v, want 1", e.rounds.repos)
	}
	// An admin may withdraw anyone's operation: here it is claimed already.
	if r := e.do(req{method: "POST", path: "/v1/operations/" + u + "/withdraw", token: adminToken}); r.status != 409 || r.errCode() != "in_batch" {
		t.Fatalf("withdraw in_batch: %d %s", r.status, r.raw)
	}
	if r := e.do(req{method: "POST", path: "/v1/operations/" + u + "/withdraw", token: apiToken, body: strings.Repeat("x", 70<<10)}); r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("withdraw with a huge body: %d", r.status)
	}
}
