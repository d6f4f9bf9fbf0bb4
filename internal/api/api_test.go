package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

const (
	apiToken   = "api-token-1"
	adminToken = "admin-token-1"
	hookSecret = "hook-secret"
	repoA      = "group/repo-a"
	repoB      = "group/repo-b"
)

// fakeRounds and fakeSettler stand in for the scanner (the store is always real).
type fakeRounds struct {
	mu    sync.Mutex
	repos []string
	res   store.ClaimResult
	err   error
}

func (f *fakeRounds) RunRound(_ context.Context, repo string) (store.ClaimResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.repos = append(f.repos, repo)
	return f.res, f.err
}

type fakeSettler struct {
	st  *store.Store
	err error
	ids []int64
}

func (f *fakeSettler) SettleBatch(ctx context.Context, id int64) (domain.Batch, error) {
	f.ids = append(f.ids, id)
	if f.err != nil {
		return domain.Batch{}, f.err
	}
	b, err := f.st.BatchGet(ctx, id)
	b.OperationIDs = nil // the API must fill them itself
	return b, err
}

type env struct {
	t         *testing.T
	st        *store.Store
	srv       *httptest.Server
	api       *Server
	rounds    *fakeRounds
	settler   *fakeSettler
	schemaErr atomic.Value // error
	kicks     atomic.Int64 // scanner wake-ups asked for by webhooks
}

func newEnv(t *testing.T, mut func(*Config)) *env {
	t.Helper()
	st, _ := storetest.New(t)
	e := &env{t: t, st: st, rounds: &fakeRounds{}, settler: &fakeSettler{st: st}}
	cfg := Config{
		APITokens: []string{apiToken}, AdminTokens: []string{adminToken}, WebhookSecret: hookSecret,
		Repos: []string{repoA, repoB}, IdempotencyTTL: time.Hour,
	}
	if mut != nil {
		mut(&cfg)
	}
	s, err := New(cfg, Deps{
		Store: st, Registry: prometheus.NewRegistry(), Rounds: e.rounds, Settler: e.settler,
		Kick: func() { e.kicks.Add(1) },
		SchemaCheck: func(context.Context) error {
			if v, _ := e.schemaErr.Load().(error); v != nil {
				return v
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.api = s
	e.srv = httptest.NewServer(declaredOnly(t, s, t.Errorf))
	t.Cleanup(e.srv.Close)
	return e
}

type req struct {
	method, path string
	token        string // "" = none
	body         string
	contentType  string // default application/json when body is set
	header       map[string]string
}

type resp struct {
	status int
	header http.Header
	raw    []byte
	json   map[string]any
}

func (r resp) errCode() string {
	e, _ := r.json["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func (r resp) op() map[string]any {
	o, _ := r.json["operation"].(map[string]any)
	return o
}

func (e *env) do(r req) resp {
	e.t.Helper()
	hr, err := http.NewRequest(r.method, e.srv.URL+r.path, strings.NewReader(r.body))
	if err != nil {
		e.t.Fatal(err)
	}
	if r.token != "" {
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	ct := r.contentType
	if ct == "" && r.body != "" {
		ct = "application/json"
	}
	if ct != "-" && ct != "" {
		hr.Header.Set("Content-Type", ct)
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	out := resp{status: res.StatusCode, header: res.Header, raw: raw}
	if len(raw) > 0 && strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &out.json); err != nil {
			e.t.Fatalf("%s %s: response is not JSON: %s", r.method, r.path, raw)
		}
	}
	return out
}

func (e *env) create(subject, target, action string) resp {
	e.t.Helper()
	return e.do(req{method: "POST", path: "/v1/operations", token: apiToken,
		body: fmt.Sprintf(`{"subject":%q,"target":%q,"action":%q}`, subject, target, action)})
}

func (e *env) mustCreate(subject, target, action string) string {
	e.t.Helper()
	r := e.create(subject, target, action)
	if r.status != http.StatusCreated {
		e.t.Fatalf("create %s %s→%s: %d %s", action, subject, target, r.status, r.raw)
	}
	return r.op()["id"].(string)
}

func (e *env) post(path, token string) resp {
	e.t.Helper()
	return e.do(req{method: "POST", path: path, token: token})
}

func (e *env) exec(q string, args ...any) {
	e.t.Helper()
	if _, err := e.st.DB().Exec(q, args...); err != nil {
		e.t.Fatal(err)
	}
}

var operationKeys = []string{"id", "subject", "target", "repo", "action", "status", "priority", "batch_id", "mr_url", "error", "expires_at", "requested_by", "approved_by", "created_at", "updated_at"}

func checkOperationShape(t *testing.T, o map[string]any) {
	t.Helper()
	if len(o) != len(operationKeys) {
		t.Errorf("operation has %d keys, want %d: %v", len(o), len(operationKeys), o)
	}
	for _, k := range operationKeys {
		if _, ok := o[k]; !ok {
			t.Errorf("operation lacks %q: %v", k, o)
		}
	}
	for _, k := range []string{"created_at", "updated_at"} {
		if _, err := time.Parse(time.RFC3339, o[k].(string)); err != nil {
			t.Errorf("%s = %v is not RFC 3339", k, o[k])
		}
	}
}

func TestOperationLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	exp := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339)
	r := e.do(req{method: "POST", path: "/v1/operations", token: apiToken,
		body: `{"subject":"alice@example.com","target":"db/prod","action":"grant","expires_at":"` + exp + `","attributes":{"ticket":"OPS-1","n":1}}`})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	o := r.op()
	checkOperationShape(t, o)
	id := o["id"].(string)
	if o["status"] != "pending_approval" || o["repo"] != repoA || o["action"] != "grant" || o["expires_at"] != exp ||
		o["batch_id"] != nil || o["mr_url"] != nil || o["error"] != nil {
		t.Fatalf("created operation = %v", o)
	}
	if r.header.Get("Location") != "/v1/operations/"+id {
		t.Errorf("Location = %q", r.header.Get("Location"))
	}

	g := e.do(req{method: "GET", path: "/v1/operations/" + id, token: apiToken})
	if g.status != 200 || g.op()["id"] != id {
		t.Fatalf("get: %d %s", g.status, g.raw)
	}
	checkOperationShape(t, g.op())

	b := e.do(req{method: "GET", path: "/v1/bindings?subject=alice@example.com", token: apiToken})
	bs, _ := b.json["bindings"].([]any)
	if b.status != 200 || len(bs) != 1 {
		t.Fatalf("bindings: %d %s", b.status, b.raw)
	}
	if bd := bs[0].(map[string]any); bd["status"] != "pending" || bd["operation_id"] != id || bd["target"] != "db/prod" {
		t.Fatalf("binding = %v", bd)
	}
	if b := e.do(req{method: "GET", path: "/v1/bindings?target=db/prod&subject=nobody", token: apiToken}); len(b.json["bindings"].([]any)) != 0 {
		t.Fatalf("filtered bindings: %s", b.raw)
	}

	// No body is needed, and one sent — of any type, here an approval tool's form
	// comment — is ignored.
	a := e.do(req{method: "POST", path: "/v1/operations/" + id + "/approve", token: adminToken,
		body: "comment=looks+good", contentType: "application/x-www-form-urlencoded"})
	if a.status != 200 || a.op()["status"] != "queued" {
		t.Fatalf("approve: %d %s", a.status, a.raw)
	}
	// An id in upper case is the same id.
	if g := e.do(req{method: "GET", path: "/v1/operations/" + strings.ToUpper(id), token: apiToken}); g.status != 200 || g.op()["id"] != id {
		t.Fatalf("get by upper-case id: %d %s", g.status, g.raw)
	}
	// Idempotent: the same decision again is 200 and changes nothing.
	a2 := e.post("/v1/operations/"+id+"/approve", adminToken)
	if a2.status != 200 || a2.op()["updated_at"] != a.op()["updated_at"] {
		t.Fatalf("repeat approve: %d %s", a2.status, a2.raw)
	}
	// The opposite decision is stale.
	if rj := e.post("/v1/operations/"+id+"/reject", apiToken); rj.status != 409 || rj.errCode() != "stale" {
		t.Fatalf("reject after approve: %d %s", rj.status, rj.raw)
	}

	ev := e.do(req{method: "GET", path: "/v1/operations/" + id + "/events", token: apiToken})
	evs, _ := ev.json["events"].([]any)
	if ev.status != 200 || len(evs) != 3 {
		t.Fatalf("events: %d %s", ev.status, ev.raw)
	}
	var codes []string
	for _, x := range evs {
		codes = append(codes, x.(map[string]any)["code"].(string))
	}
	if strings.Join(codes, ",") != "created,approved,admitted" {
		t.Fatalf("event codes = %v", codes)
	}

	// A second grant of the same relation is refused while the first is in flight.
	if d := e.create("alice@example.com", "db/prod", "grant"); d.status != 409 || d.errCode() != "binding_busy" {
		t.Fatalf("second grant: %d %s", d.status, d.raw)
	}
	// Reject path and re-application.
	id2 := e.mustCreate("bob", "db/prod", "grant")
	rj := e.post("/v1/operations/"+id2+"/reject", apiToken)
	if rj.status != 200 || rj.op()["status"] != "rejected" {
		t.Fatalf("reject: %d %s", rj.status, rj.raw)
	}
	if rj2 := e.post("/v1/operations/"+id2+"/reject", apiToken); rj2.status != 200 {
		t.Fatalf("repeat reject: %d %s", rj2.status, rj2.raw)
	}
	// Revoke of a binding that is not active; grant of an active one.
	if d := e.create("bob", "db/prod", "revoke"); d.status != 409 || d.errCode() != "binding_not_active" {
		t.Fatalf("revoke of rejected: %d %s", d.status, d.raw)
	}
	e.exec(`UPDATE binding SET status = 'active', version = version + 1 WHERE subject = 'bob'`)
	if d := e.create("bob", "db/prod", "grant"); d.status != 409 || d.errCode() != "binding_active" {
		t.Fatalf("grant of active: %d %s", d.status, d.raw)
	}
	rv := e.do(req{method: "POST", path: "/v1/operations", token: apiToken,
		body: `{"subject":"bob","target":"db/prod","action":"revoke","repo":"` + repoB + `"}`})
	if rv.status != 201 || rv.op()["action"] != "revoke" || rv.op()["repo"] != repoA {
		t.Fatalf("revoke (goes to the binding's repo): %d %s", rv.status, rv.raw)
	}
}

// A late approval for an operation superseded by a re-application gets 409 stale.
func TestStaleApprovalAfterReapplication(t *testing.T) {
	e := newEnv(t, nil)
	a := e.mustCreate("carol", "t", "grant")
	if r := e.post("/v1/operations/"+a+"/reject", apiToken); r.status != 200 {
		t.Fatalf("reject A: %d %s", r.status, r.raw)
	}
	b := e.mustCreate("carol", "t", "grant") // re-application resets the binding in place
	r := e.post("/v1/operations/"+a+"/approve", adminToken)
	if r.status != 409 || r.errCode() != "stale" {
		t.Fatalf("late approval of A: %d %s", r.status, r.raw)
	}
	var waiting int
	if err := e.st.DB().Get(&waiting, `SELECT COUNT(*) FROM merge_batch_request`); err != nil || waiting != 0 {
		t.Fatalf("stale approval admitted something: %d %v", waiting, err)
	}
	if r := e.post("/v1/operations/"+b+"/approve", adminToken); r.status != 200 || r.op()["status"] != "queued" {
		t.Fatalf("approve B: %d %s", r.status, r.raw)
	}
}

func TestRetry(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AutoApprove = true })
	id := e.mustCreate("dave", "t", "grant")
	if r := e.post("/v1/operations/"+id+"/retry", apiToken); r.status != 409 || r.errCode() != "stale" {
		t.Fatalf("retry of queued: %d %s", r.status, r.raw)
	}
	// As a failed batch leaves it (the settlement itself is the batch side's business).
	e.exec(`DELETE FROM merge_batch_request WHERE operation_id = ?`, id)
	e.exec(`UPDATE operation SET status = 'failed', error_code = 'pipeline_failed', error_message = 'job lint failed', version = version + 1 WHERE operation_id = ?`, id)
	e.exec(`UPDATE binding SET status = 'failed', version = version + 1 WHERE operation_id = ?`, id)
	g := e.do(req{method: "GET", path: "/v1/operations/" + id, token: apiToken})
	if er, _ := g.op()["error"].(map[string]any); er["code"] != "pipeline_failed" || er["message"] != "job lint failed" {
		t.Fatalf("failed operation error = %v", g.op()["error"])
	}
	r := e.post("/v1/operations/"+id+"/retry", apiToken)
	if r.status != 200 || r.op()["status"] != "queued" || r.op()["error"] != nil {
		t.Fatalf("retry: %d %s", r.status, r.raw)
	}
	var waiting int
	if err := e.st.DB().Get(&waiting, `SELECT COUNT(*) FROM merge_batch_request WHERE operation_id = ? AND batch_id IS NULL`, id); err != nil || waiting != 1 {
		t.Fatalf("retried operation not waiting: %d %v", waiting, err)
	}
}

func TestBatchesRoundsSettleWebhook(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AutoApprove = true })
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		ids = append(ids, e.mustCreate(fmt.Sprintf("user-%d", i), "t", "grant"))
	}
	res, err := e.st.BatchClaim(ctx, repoA, 500)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	bid := res.BatchID
	bt, err := e.st.BatchGet(ctx, bid)
	if err != nil {
		t.Fatal(err)
	}
	const mrURL = "https://gitlab.example.com/group/repo-a/-/merge_requests/7"
	if _, err := e.st.BatchRecordMR(ctx, bid, bt.Version, store.MRRecord{IID: 7, URL: mrURL, SHA: "abc"}); err != nil {
		t.Fatal(err)
	}

	g := e.do(req{method: "GET", path: fmt.Sprintf("/v1/batches/%d", bid), token: apiToken})
	b, _ := g.json["batch"].(map[string]any)
	if g.status != 200 || b["status"] != "running" || b["mr_url"] != mrURL || b["repo"] != repoA {
		t.Fatalf("get batch: %d %s", g.status, g.raw)
	}
	if oids, _ := b["operation_ids"].([]any); len(oids) != 3 {
		t.Fatalf("operation_ids = %v", b["operation_ids"])
	}
	o := e.do(req{method: "GET", path: "/v1/operations/" + ids[0], token: apiToken}).op()
	if o["status"] != "in_batch" || o["batch_id"] != float64(bid) || o["mr_url"] != mrURL {
		t.Fatalf("operation in batch = %v", o)
	}

	// A second, finished batch, so the list has two pages.
	e.mustCreate("user-9", "t", "grant")
	e.exec(`UPDATE merge_batch SET status = 2, finished_at = CURRENT_TIMESTAMP(6), version = version + 1 WHERE id = ?`, bid)
	res2, err := e.st.BatchClaim(ctx, repoA, 500)
	if err != nil || res2.Outcome != store.ClaimClaimed {
		t.Fatalf("second claim: %+v %v", res2, err)
	}
	l := e.do(req{method: "GET", path: "/v1/batches?repo=" + repoA + "&limit=1", token: apiToken})
	page, _ := l.json["batches"].([]any)
	if l.status != 200 || len(page) != 1 || page[0].(map[string]any)["id"] != float64(res2.BatchID) || l.json["next_cursor"] == nil {
		t.Fatalf("page 1: %d %s", l.status, l.raw)
	}
	if oids := page[0].(map[string]any)["operation_ids"].([]any); len(oids) != 1 {
		t.Fatalf("listed batch operation_ids = %v", oids)
	}
	l2 := e.do(req{method: "GET", path: "/v1/batches?repo=" + repoA + "&limit=1&cursor=" + l.json["next_cursor"].(string), token: apiToken})
	page2, _ := l2.json["batches"].([]any)
	if l2.status != 200 || len(page2) != 1 || page2[0].(map[string]any)["id"] != float64(bid) || l2.json["next_cursor"] != nil {
		t.Fatalf("page 2: %d %s", l2.status, l2.raw)
	}
	if s := e.do(req{method: "GET", path: "/v1/batches?status=succeeded", token: apiToken}); len(s.json["batches"].([]any)) != 1 {
		t.Fatalf("by status: %s", s.raw)
	}
	if s := e.do(req{method: "GET", path: "/v1/batches?repo=" + repoB, token: apiToken}); s.status != 200 || len(s.json["batches"].([]any)) != 0 {
		t.Fatalf("other repo: %s", s.raw)
	}

	// Admin round: through Rounds, default all repositories, or one.
	e.rounds.res = store.ClaimResult{Outcome: store.ClaimClaimed, BatchID: 42}
	rr := e.do(req{method: "POST", path: "/v1/admin/rounds", token: adminToken})
	if rr.status != 200 || rr.json["outcome"] != "claimed" || rr.json["batch_id"] != float64(42) {
		t.Fatalf("round: %d %s", rr.status, rr.raw)
	}
	e.rounds.res = store.ClaimResult{Outcome: store.ClaimSlotOccupied}
	rr = e.do(req{method: "POST", path: "/v1/admin/rounds", token: adminToken, body: `{"repo":"` + repoB + `"}`})
	if _, has := rr.json["batch_id"]; rr.status != 200 || rr.json["outcome"] != "slot_occupied" || has {
		t.Fatalf("round repo B: %d %s", rr.status, rr.raw)
	}
	if strings.Join(e.rounds.repos, ",") != ","+repoB {
		t.Fatalf("rounds called with %q", e.rounds.repos)
	}
	e.rounds.err = errors.New("boom")
	if rr := e.do(req{method: "POST", path: "/v1/admin/rounds", token: adminToken}); rr.status != 500 || rr.errCode() != "internal" || strings.Contains(string(rr.raw), "boom") {
		t.Fatalf("round error: %d %s", rr.status, rr.raw)
	}

	// Settle: through Settler, the batch comes back with its operation ids.
	st := e.post(fmt.Sprintf("/v1/admin/batches/%d/settle", res2.BatchID), adminToken)
	sb, _ := st.json["batch"].(map[string]any)
	if st.status != 200 || sb["id"] != float64(res2.BatchID) || len(sb["operation_ids"].([]any)) != 1 {
		t.Fatalf("settle: %d %s", st.status, st.raw)
	}
	e.settler.err = store.ErrNotFound
	if st := e.post("/v1/admin/batches/999999/settle", adminToken); st.status != 404 {
		t.Fatalf("settle unknown: %d %s", st.status, st.raw)
	}
	// What GitLab answered reaches the operator who asked to settle, not a bare 500.
	for _, c := range []struct {
		err              error
		status           int
		code, say, retry string
	}{
		{&mr.Error{Op: "close_mr", Class: mr.ClassPermanent, Status: 403, Message: "403 Forbidden"}, 502, "gitlab_error", "403 Forbidden", ""},
		{&mr.Error{Op: "get_mr", Class: mr.ClassTransient, Status: 502, Message: "502 Bad Gateway"}, 503, "unavailable", "502 Bad Gateway", ""},
		{&mr.Error{Op: "get_mr", Class: mr.ClassTransient, Status: 429, Message: "429 Too Many Requests", RetryAfter: 20 * time.Second}, 503, "unavailable", "429", "20"},
		{fmt.Errorf("settle batch 1: MR !7 is locked (merging): %w", mr.ErrStillOpen), 409, "conflict", "still open", ""},
		{fmt.Errorf("settle batch 1: %w; its MR may be opening: settle again in 30s", store.ErrBatchPublishing), 409, "conflict", "being published", ""},
	} {
		e.settler.err = fmt.Errorf("settle: %w", c.err)
		r := e.post(fmt.Sprintf("/v1/admin/batches/%d/settle", res2.BatchID), adminToken)
		if r.status != c.status || r.errCode() != c.code || !strings.Contains(string(r.raw), c.say) || r.header.Get("Retry-After") != c.retry {
			t.Errorf("settle failing with %v: %d %s Retry-After=%q, want %d %s %q Retry-After=%q",
				c.err, r.status, r.raw, r.header.Get("Retry-After"), c.status, c.code, c.say, c.retry)
		}
	}
	e.settler.err = nil

	// Webhook: an MR event for a batch branch makes that batch due now, once its MR is
	// recorded (before, next_check_at is its publisher's reservation: left alone).
	e.exec(`UPDATE merge_batch SET next_check_at = CURRENT_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE id = ?`, res2.BatchID)
	due := func() bool {
		var ok bool
		if err := e.st.DB().Get(&ok, `SELECT next_check_at <= CURRENT_TIMESTAMP(6) FROM merge_batch WHERE id = ?`, res2.BatchID); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	hook := func(token, branch string) resp {
		h := map[string]string{"X-Gitlab-Event": "Merge Request Hook"}
		if token != "" {
			h["X-Gitlab-Token"] = token
		}
		return e.do(req{method: "POST", path: "/v1/webhooks/gitlab", header: h,
			body: `{"object_kind":"merge_request","object_attributes":{"source_branch":"` + branch + `","state":"merged","iid":7}}`})
	}
	b2, err := e.st.BatchGet(ctx, res2.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	branch2 := b2.SourceBranch
	if r := hook("wrong", branch2); r.status != 401 || due() {
		t.Fatalf("webhook with wrong token: %d %s", r.status, r.raw)
	}
	if r := hook("", branch2); r.status != 401 || due() {
		t.Fatalf("webhook without token: %d %s", r.status, r.raw)
	}
	if r := hook(hookSecret, "feature/x"); r.status != 204 || due() {
		t.Fatalf("webhook for another branch: %d %s", r.status, r.raw)
	}
	if e.kicks.Load() != 0 {
		t.Fatalf("rejected or ignored webhooks woke the scanner %d time(s)", e.kicks.Load())
	}
	if r := hook(hookSecret, branch2); r.status != 204 || due() {
		t.Fatalf("webhook for a batch without an MR: %d %s due=%v", r.status, r.raw, due())
	}
	e.exec(`UPDATE merge_batch SET mr_iid = 7 WHERE id = ?`, res2.BatchID)
	// Another installation's batch of the same id (a second database on the project).
	if r := hook(hookSecret, fmt.Sprintf("batcherd/otherinst/batch-%d", res2.BatchID)); r.status != 204 || due() {
		t.Fatalf("webhook for another installation's branch: %d %s due=%v", r.status, r.raw, due())
	}
	e.kicks.Store(0)
	if r := hook(hookSecret, branch2); r.status != 204 || !due() || e.kicks.Load() != 1 {
		t.Fatalf("webhook: %d %s due=%v kicks=%d", r.status, r.raw, due(), e.kicks.Load())
	}
	// The payload is never trusted as state: "merged" in it changed nothing else.
	if bb, _ := e.st.BatchGet(ctx, res2.BatchID); bb.Status != domain.BatchRunning {
		t.Fatalf("webhook changed the batch status to %v", bb.Status)
	}
	if r := hook(hookSecret, "batcherd/batch-999999"); r.status != 204 {
		t.Fatalf("webhook for unknown batch: %d", r.status)
	}
	// GitLab sends the MR's description (and on an update the previous one) with the
	// event: a large batch's is far over the API's 64 KiB body limit.
	if _, err := e.st.DB().Exec("UPDATE merge_batch SET next_check_at = CURRENT_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE id = ?", res2.BatchID); err != nil {
		t.Fatal(err)
	}
	desc := strings.Repeat("- 2f1c6a8e-0000-4000-8000-000000000000 grant `someone` → `db/prod`\n", 2000) // ~140 KB
	big, _ := json.Marshal(map[string]any{"object_kind": "merge_request",
		"object_attributes": map[string]any{"source_branch": branch2, "description": desc},
		"changes":           map[string]any{"description": map[string]any{"previous": desc, "current": desc}}})
	r := e.do(req{method: "POST", path: "/v1/webhooks/gitlab", header: map[string]string{"X-Gitlab-Token": hookSecret}, body: string(big)})
	if r.status != 204 || !due() {
		t.Fatalf("webhook of %d bytes: %d %s due=%v", len(big), r.status, r.raw, due())
	}
}

func TestWebhookDisabledWithoutSecret(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WebhookSecret = "" })
	r := e.do(req{method: "POST", path: "/v1/webhooks/gitlab", header: map[string]string{"X-Gitlab-Token": ""}, body: `{}`})
	if r.status != 404 || r.errCode() != "webhook_disabled" {
		t.Fatalf("disabled webhook: %d %s", r.status, r.raw)
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t, nil)
	id := e.mustCreate("erin", "t", "grant")
	cases := []struct {
		name, method, path, token string
		want                      int
	}{
		{"no token", "GET", "/v1/operations/" + id, "", 401},
		{"wrong token", "GET", "/v1/operations/" + id, "nope", 401},
		{"token prefix", "GET", "/v1/operations/" + id, apiToken[:5], 401},
		{"api token", "GET", "/v1/operations/" + id, apiToken, 200},
		{"admin token on api route", "GET", "/v1/operations/" + id, adminToken, 200},
		{"no token on admin", "POST", "/v1/admin/rounds", "", 401},
		{"api token on admin", "POST", "/v1/admin/rounds", apiToken, 403},
		{"api token on admin settle", "POST", "/v1/admin/batches/1/settle", apiToken, 403},
		{"admin token on admin", "POST", "/v1/admin/rounds", adminToken, 200},
		{"no token on create", "POST", "/v1/operations", "", 401},
		{"healthz is public", "GET", "/healthz", "", 200},
		{"readyz is public", "GET", "/readyz", "", 200},
		{"metrics is public", "GET", "/metrics", "", 200},
	}
	e.rounds.res = store.ClaimResult{Outcome: store.ClaimNothingToClaim}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(req{method: c.method, path: c.path, token: c.token})
			if r.status != c.want {
				t.Fatalf("%s %s: %d %s, want %d", c.method, c.path, r.status, r.raw, c.want)
			}
			switch c.want {
			case 401:
				if r.errCode() != "unauthorized" || r.header.Get("WWW-Authenticate") == "" {
					t.Fatalf("401 body/header: %s %v", r.raw, r.header)
				}
			case 403:
				if r.errCode() != "forbidden" {
					t.Fatalf("403 body: %s", r.raw)
				}
			}
		})
	}
	// Lower-case scheme is accepted (RFC 7235: the scheme is case-insensitive).
	r := e.do(req{method: "GET", path: "/v1/operations/" + id, header: map[string]string{"Authorization": "bearer " + apiToken}})
	if r.status != 200 {
		t.Fatalf("lower-case bearer: %d", r.status)
	}

	open := newEnv(t, func(c *Config) { c.APITokens, c.AdminTokens, c.InsecureNoAuth = nil, nil, true })
	if r := open.do(req{method: "POST", path: "/v1/admin/rounds"}); r.status != 200 {
		t.Fatalf("insecure no-auth admin: %d %s", r.status, r.raw)
	}
	if _, err := New(Config{Repos: []string{repoA}}, Deps{Store: e.st, Registry: prometheus.NewRegistry()}); err == nil {
		t.Fatal("New accepted a config without tokens and without InsecureNoAuth")
	}
}

func TestIdempotencyConcurrent(t *testing.T) {
	e := newEnv(t, nil)
	body := `{"subject":"frank","target":"db/prod","action":"grant","attributes":{"b":2,"a":1}}`
	const n = 32
	var wg sync.WaitGroup
	results := make([]resp, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = e.do(req{method: "POST", path: "/v1/operations", token: apiToken, body: body,
				header: map[string]string{"Idempotency-Key": "req-123"}})
		}()
	}
	close(start)
	wg.Wait()
	created := 0
	id := ""
	for i, r := range results {
		switch r.status {
		case 201:
			created++
		case 200:
		default:
			t.Fatalf("request %d: %d %s", i, r.status, r.raw)
		}
		if id == "" {
			id = r.op()["id"].(string)
		}
		if r.op()["id"] != id {
			t.Fatalf("request %d got operation %v, another got %s", i, r.op()["id"], id)
		}
	}
	if created != 1 {
		t.Fatalf("%d requests got 201, want exactly 1", created)
	}
	var ops int
	if err := e.st.DB().Get(&ops, `SELECT COUNT(*) FROM operation`); err != nil || ops != 1 {
		t.Fatalf("operations = %d %v, want 1", ops, err)
	}
	// The same request written differently (key order, white space) is the same request.
	same := e.do(req{method: "POST", path: "/v1/operations", token: apiToken,
		body:   "{ \"action\":\"grant\", \"attributes\":{\"a\":1,\"b\":2}, \"target\":\"db/prod\", \"subject\":\"frank\", \"repo\":\"" + repoA + "\" }",
		header: map[string]string{"Idempotency-Key": "req-123"}})
	if same.status != 200 || same.op()["id"] != id {
		t.Fatalf("canonical repeat: %d %s", same.status, same.raw)
	}
	// The key with another request: 422, nothing written.
	other := e.do(req{method: "POST", path: "/v1/operations", token: apiToken,
		body:   `{"subject":"frank","target":"db/other","action":"grant"}`,
		header: map[string]string{"Idempotency-Key": "req-123"}})
	if other.status != 422 || other.errCode() != "idempotency_key_reused" {
		t.Fatalf("reused key: %d %s", other.status, other.raw)
	}
	if err := e.st.DB().Get(&ops, `SELECT COUNT(*) FROM operation`); err != nil || ops != 1 {
		t.Fatalf("operations after reuse = %d %v, want 1", ops, err)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AutoApprove = true })
	if r := e.do(req{method: "GET", path: "/healthz"}); r.status != 200 || r.json["status"] != "ok" {
		t.Fatalf("healthz: %d %s", r.status, r.raw)
	}
	if r := e.do(req{method: "GET", path: "/readyz"}); r.status != 200 || r.json["status"] != "ready" {
		t.Fatalf("readyz: %d %s", r.status, r.raw)
	}
	e.schemaErr.Store(fmt.Errorf("%w: binding: index uk_subject_target is not UNIQUE", store.ErrSchemaDrift))
	r := e.do(req{method: "GET", path: "/readyz"})
	if r.status != 503 || r.errCode() != "not_ready" || !strings.Contains(string(r.raw), "uk_subject_target") {
		t.Fatalf("readyz on drift: %d %s", r.status, r.raw)
	}
	// A check that could not run says so without the driver's words: the answer is
	// public, and those name the database user and the replica's address.
	e.schemaErr.Store(fmt.Errorf("read schema: %w", errors.New("Error 1045 (28000): Access denied for user 'batcherd'@'10.1.2.3' (using password: YES)")))
	if r := e.do(req{method: "GET", path: "/readyz"}); r.status != 503 || r.errCode() != "not_ready" ||
		strings.Contains(string(r.raw), "batcherd'@") || strings.Contains(string(r.raw), "10.1.2.3") {
		t.Fatalf("readyz on a failed check: %d %s", r.status, r.raw)
	}
	e.schemaErr.Store(fmt.Errorf("%w: binding: index uk_subject_target is not UNIQUE", store.ErrSchemaDrift))
	if r := e.do(req{method: "GET", path: "/healthz"}); r.status != 200 {
		t.Fatalf("healthz must not depend on the schema: %d", r.status)
	}

	e.mustCreate("gina", "t", "grant")
	m := e.do(req{method: "GET", path: "/metrics"})
	text := string(m.raw)
	for _, want := range []string{
		`batcherd_http_requests_total{code="201",route="POST /v1/operations"} 1`,
		`batcherd_http_requests_total{code="503",route="GET /readyz"} 2`,
		`batcherd_http_request_duration_seconds_bucket{route="POST /v1/operations"`,
		`batcherd_operations{status="queued"} 1`,
		`batcherd_operations{status="merged"} 0`,
		`batcherd_waiting_depth{repo="group/repo-a"} 1`,
		`batcherd_waiting_depth{repo="group/repo-b"} 0`,
		`batcherd_waiting_oldest_age_seconds{repo="group/repo-a"}`,
		`batcherd_metrics_sample_failed 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", text)
	}
}

// Finished operations are counted on their own, slower clock (their count reads the
// whole history), and a count of them that fails is reported without taking the live
// gauges — operations in flight, the waiting set — away with it.
func TestMetricsHistoryOnItsOwnClock(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AutoApprove = true })
	db := e.api.m.db
	db.liveTTL, db.historyTTL = 0, time.Hour
	scrape := func() string { return string(e.do(req{method: "GET", path: "/metrics"}).raw) }
	has := func(text string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(text, w+"\n") {
				t.Errorf("metrics lack %q", w)
			}
		}
		if t.Failed() {
			t.Fatalf("metrics:\n%s", text)
		}
	}
	// eventually scrapes until every line is there: the count runs in the background.
	eventually := func(want ...string) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			text := scrape()
			missing := false
			for _, w := range want {
				missing = missing || !strings.Contains(text, w+"\n")
			}
			if !missing || time.Now().After(deadline) {
				has(text, want...)
				return text
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	ivy := e.mustCreate("ivy", "t", "grant")
	has(scrape(), `batcherd_operations{status="queued"} 1`, `batcherd_operations{status="merged"} 0`, `batcherd_metrics_sample_failed 0`)

	// Merged behind the API's back: the live numbers follow at once, the history count
	// only when its clock comes round.
	if _, err := e.st.DB().Exec("UPDATE operation SET status = 'merged' WHERE operation_id = ?", ivy); err != nil {
		t.Fatal(err)
	}
	e.mustCreate("jack", "t", "grant")
	e.mustCreate("kim", "t", "grant")
	has(scrape(), `batcherd_operations{status="queued"} 2`, `batcherd_operations{status="merged"} 0`, `batcherd_waiting_depth{repo="group/repo-a"} 3`,
		`batcherd_bindings_expired_active 0`)
	// Access that should have ended: ivy's binding is active past its expiry.
	if _, err := e.st.DB().Exec("UPDATE binding SET status = 'active', expires_at = CURRENT_TIMESTAMP(6) - INTERVAL 1 MINUTE WHERE operation_id = ?", ivy); err != nil {
		t.Fatal(err)
	}
	has(scrape(), `batcherd_bindings_expired_active 1`)

	db.mu.Lock()
	db.historyTTL, db.historyTimeout = 0, time.Nanosecond
	db.mu.Unlock()
	text := eventually(`batcherd_metrics_sample_failed 1`, `batcherd_operations{status="queued"} 2`, `batcherd_waiting_depth{repo="group/repo-a"} 3`)
	if strings.Contains(text, `status="merged"`) {
		t.Fatalf("a failed count still served its old numbers:\n%s", text)
	}

	db.mu.Lock()
	db.historyTimeout = time.Minute
	db.mu.Unlock()
	eventually(`batcherd_metrics_sample_failed 0`, `batcherd_operations{status="merged"} 1`, `batcherd_operations{status="queued"} 2`)
}

// A target's bindings are read in pages to the end: none is left out however many
// there are, and the last page says it is the last.
func TestBindingsPaged(t *testing.T) {
	e := newEnv(t, nil)
	want := map[string]bool{}
	for i := range 7 {
		e.mustCreate(fmt.Sprintf("pager-%d", i), "db/paged", "grant")
		want[fmt.Sprintf("pager-%d", i)] = true
	}
	e.mustCreate("someone-else", "db/other", "grant")
	got := map[string]bool{}
	cursor, pages := "", 0
	for {
		path := "/v1/bindings?target=db/paged&limit=3"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		r := e.do(req{method: "GET", path: path, token: apiToken})
		if r.status != 200 {
			t.Fatalf("%s: %d %s", path, r.status, r.raw)
		}
		pages++
		for _, b := range r.json["bindings"].([]any) {
			got[b.(map[string]any)["subject"].(string)] = true
		}
		next, ok := r.json["next_cursor"].(string)
		if !ok {
			if r.json["next_cursor"] != nil || !strings.Contains(string(r.raw), `"next_cursor":null`) {
				t.Fatalf("last page's next_cursor: %s", r.raw)
			}
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		cursor = next
	}
	if pages != 3 || len(got) != len(want) {
		t.Fatalf("%d pages, subjects %v, want 3 pages and %v", pages, got, want)
	}
	if r := e.do(req{method: "GET", path: "/v1/bindings?cursor=x", token: apiToken}); r.status != 400 {
		t.Fatalf("bad cursor: %d %s", r.status, r.raw)
	}
}

// What the strict body checks must still let through: a surrogate pair escaped as
// such, an escaped backslash before "u", other escapes, attribute keys that differ only
// in case (attributes are free-form and case-sensitive), and the same key in
// different objects.
func TestJSONTextAccepted(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []struct{ body, subject string }{
		{`{"subject":"a\ud83d\ude00","target":"t","action":"grant"}`, "a😀"},
		{`{"subject":"b\\ud800","target":"t","action":"grant"}`, `b\ud800`},
		{`{"subject":"c\"\/\u00e9","target":"t","action":"grant"}`, `c"/é`},
		{`{"subject":"d","target":"t","action":"grant","attributes":{"Ticket":1,"ticket":2,"x":{"ticket":3}}}`, "d"},
	} {
		r := e.do(req{method: "POST", path: "/v1/operations", token: apiToken, body: c.body})
		if r.status != http.StatusCreated || r.op()["subject"] != c.subject {
			t.Errorf("%s: %d %s, want 201 with subject %q", c.body, r.status, r.raw, c.subject)
		}
	}
}

// Every bad input gets its status and a JSON error, and writes nothing.
func TestBadInput(t *testing.T) {
	e := newEnv(t, nil)
	known := e.mustCreate("henry", "t", "grant")
	e.post("/v1/operations/"+known+"/reject", apiToken)

	count := func() string {
		var parts []string
		for _, tbl := range []string{"operation", "binding", "idempotency_key", "audit_event", "merge_batch_request", "merge_batch"} {
			var n int
			var v int64
			if err := e.st.DB().Get(&n, "SELECT COUNT(*) FROM "+tbl); err != nil {
				t.Fatal(err)
			}
			_ = e.st.DB().Get(&v, "SELECT COALESCE(SUM(version), 0) FROM "+tbl)
			parts = append(parts, fmt.Sprintf("%s=%d/%d", tbl, n, v))
		}
		return strings.Join(parts, " ")
	}
	// version sums only exist on some tables; the query fails harmlessly on the others.
	before := count()

	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	ok := func(extra string) string {
		return `{"subject":"ivan","target":"t","action":"grant"` + extra + `}`
	}
	big := `{"subject":"ivan","target":"t","action":"grant","attributes":{"x":"` + strings.Repeat("a", 70<<10) + `"}}`
	cases := []struct {
		name   string
		r      req
		status int
		code   string
	}{
		{"malformed JSON", req{body: `{"subject":"ivan",`}, 400, "invalid_json"},
		{"not JSON at all", req{body: `subject=ivan`}, 400, "invalid_json"},
		{"array body", req{body: `[1,2]`}, 400, "invalid_json"},
		{"two objects", req{body: ok("") + ok("")}, 400, "invalid_json"},
		{"empty body", req{body: "", contentType: "application/json"}, 400, "invalid_json"},
		{"unknown field", req{body: ok(`,"color":"red"`)}, 400, "unknown_field"},
		{"a field twice", req{body: ok(`,"subject":"x"`)}, 400, "invalid_json"},
		{"a field twice, in another case", req{body: ok(`,"SUBJECT":"x"`)}, 400, "invalid_json"},
		{"an attribute twice", req{body: ok(`,"attributes":{"a":{"k":1,"k":2}}`)}, 400, "invalid_json"},
		{"half a surrogate pair", req{body: `{"subject":"\udc00abc","target":"t","action":"grant"}`}, 400, "invalid_json"},
		{"a high surrogate alone", req{body: `{"subject":"a\ud83dbc","target":"t","action":"grant"}`}, 400, "invalid_json"},
		{"missing subject", req{body: `{"target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"empty subject", req{body: `{"subject":"","target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"subject not a string", req{body: `{"subject":5,"target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"subject too long", req{body: `{"subject":"` + strings.Repeat("s", 256) + `","target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"subject 256 runes", req{body: `{"subject":"` + strings.Repeat("é", 256) + `","target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"subject control char", req{body: `{"subject":"iv\u0007an","target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"subject newline", req{body: `{"subject":"iv\nan","target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"subject leading space", req{body: `{"subject":" ivan","target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"subject invalid UTF-8", req{body: "{\"subject\":\"iv\xffan\",\"target\":\"t\",\"action\":\"grant\"}"}, 400, "invalid_json"},
		{"missing target", req{body: `{"subject":"ivan","action":"grant"}`}, 400, "invalid_request"},
		{"target dot-dot", req{body: `{"subject":"ivan","target":"..","action":"grant"}`}, 400, "invalid_request"},
		{"target too long", req{body: `{"subject":"ivan","target":"` + strings.Repeat("t", 256) + `","action":"grant"}`}, 400, "invalid_request"},
		// 255 characters, but not 255 bytes once URL-escaped into bindings/<target>/<subject>.yaml.
		{"subject file name too long", req{body: `{"subject":"` + strings.Repeat("s", 251) + `","target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"subject escapes too long", req{body: `{"subject":"` + strings.Repeat("é", 50) + `","target":"t","action":"grant"}`}, 400, "invalid_request"},
		{"target escapes too long", req{body: `{"subject":"ivan","target":"x` + strings.Repeat(" ", 100) + `x","action":"grant"}`}, 400, "invalid_request"},
		{"missing action", req{body: `{"subject":"ivan","target":"t"}`}, 400, "invalid_request"},
		{"unknown action", req{body: `{"subject":"ivan","target":"t","action":"delete"}`}, 400, "invalid_request"},
		{"unconfigured repo", req{body: ok(`,"repo":"evil/repo"`)}, 400, "invalid_request"},
		{"expires_at not RFC 3339", req{body: ok(`,"expires_at":"tomorrow"`)}, 400, "invalid_request"},
		{"expires_at date only", req{body: ok(`,"expires_at":"2030-01-02"`)}, 400, "invalid_request"},
		{"expires_at a number", req{body: ok(`,"expires_at":1893456000`)}, 400, "invalid_request"},
		{"expires_at in the past", req{body: ok(`,"expires_at":"` + past + `"`)}, 400, "invalid_request"},
		{"expires_at past year 9999 in UTC", req{body: ok(`,"expires_at":"9999-12-31T23:30:00-01:00"`)}, 400, "invalid_request"},
		{"attributes number out of float range", req{body: ok(`,"attributes":{"x":1e999}`)}, 400, "invalid_request"},
		{"attributes integer past 64 bits, nested", req{body: ok(`,"attributes":{"x":[{"y":99999999999999999999}]}`)}, 400, "invalid_request"},
		{"expires_at on a revoke", req{body: `{"subject":"henry","target":"t","action":"revoke","expires_at":"` + future + `"}`}, 400, "invalid_request"},
		{"attributes an array", req{body: ok(`,"attributes":[1]`)}, 400, "invalid_request"},
		{"attributes a string", req{body: ok(`,"attributes":"x"`)}, 400, "invalid_request"},
		{"attributes over 16 KiB", req{body: ok(`,"attributes":{"x":"` + strings.Repeat("a", 16<<10) + `"}`)}, 400, "invalid_request"},
		{"body over 64 KiB", req{body: big}, 413, "payload_too_large"},
		{"text/plain", req{body: ok(""), contentType: "text/plain"}, 415, "unsupported_media_type"},
		{"form content type", req{body: ok(""), contentType: "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"no content type", req{body: ok(""), contentType: "-"}, 415, "unsupported_media_type"},
		{"Idempotency-Key too long", req{body: ok(""), header: map[string]string{"Idempotency-Key": strings.Repeat("k", 129)}}, 400, "invalid_request"},
		{"Idempotency-Key with space", req{body: ok(""), header: map[string]string{"Idempotency-Key": "a b"}}, 400, "invalid_request"},
		{"unknown operation", req{method: "GET", path: "/v1/operations/00000000-0000-4000-8000-000000000000"}, 404, "not_found"},
		{"operation id not a uuid", req{method: "GET", path: "/v1/operations/nope"}, 404, "not_found"},
		{"approve unknown", req{method: "POST", path: "/v1/operations/00000000-0000-4000-8000-000000000000/approve"}, 404, "not_found"},
		{"approve with a body over 64 KiB", req{method: "POST", path: "/v1/operations/" + known + "/approve", body: big, contentType: "text/plain"}, 413, "payload_too_large"},
		{"reject unknown", req{method: "POST", path: "/v1/operations/00000000-0000-4000-8000-000000000000/reject"}, 404, "not_found"},
		{"retry unknown", req{method: "POST", path: "/v1/operations/00000000-0000-4000-8000-000000000000/retry"}, 404, "not_found"},
		{"events of unknown", req{method: "GET", path: "/v1/operations/00000000-0000-4000-8000-000000000000/events"}, 404, "not_found"},
		{"approve a rejected one", req{method: "POST", path: "/v1/operations/" + known + "/approve"}, 409, "stale"},
		{"retry a rejected one", req{method: "POST", path: "/v1/operations/" + known + "/retry"}, 409, "stale"},
		{"wrong method on collection", req{method: "DELETE", path: "/v1/operations"}, 405, "method_not_allowed"},
		{"GET on create", req{method: "GET", path: "/v1/operations"}, 405, "method_not_allowed"},
		{"PUT on approve", req{method: "PUT", path: "/v1/operations/" + known + "/approve"}, 405, "method_not_allowed"},
		{"GET on admin rounds", req{method: "GET", path: "/v1/admin/rounds", token: adminToken}, 405, "method_not_allowed"},
		{"POST on healthz", req{method: "POST", path: "/healthz"}, 405, "method_not_allowed"},
		{"unknown path", req{method: "GET", path: "/v1/nothing"}, 404, "not_found"},
		{"unknown batch", req{method: "GET", path: "/v1/batches/999999"}, 404, "not_found"},
		{"batch id not a number", req{method: "GET", path: "/v1/batches/abc"}, 404, "not_found"},
		{"batches bad status", req{method: "GET", path: "/v1/batches?status=done"}, 400, "invalid_request"},
		{"batches bad limit", req{method: "GET", path: "/v1/batches?limit=0"}, 400, "invalid_request"},
		{"batches limit too big", req{method: "GET", path: "/v1/batches?limit=101"}, 400, "invalid_request"},
		{"batches bad cursor", req{method: "GET", path: "/v1/batches?cursor=abc"}, 400, "invalid_request"},
		{"bindings bad limit", req{method: "GET", path: "/v1/bindings?limit=x"}, 400, "invalid_request"},
		{"round unknown field", req{method: "POST", path: "/v1/admin/rounds", token: adminToken, body: `{"repository":"x"}`}, 400, "unknown_field"},
		{"round unconfigured repo", req{method: "POST", path: "/v1/admin/rounds", token: adminToken, body: `{"repo":"evil/repo"}`}, 400, "invalid_request"},
		{"round wrong content type", req{method: "POST", path: "/v1/admin/rounds", token: adminToken, body: `{}`, contentType: "text/plain"}, 415, "unsupported_media_type"},
		{"settle bad id", req{method: "POST", path: "/v1/admin/batches/x/settle", token: adminToken}, 404, "not_found"},
		{"webhook not JSON", req{method: "POST", path: "/v1/webhooks/gitlab", token: "-", body: `{`, header: map[string]string{"X-Gitlab-Token": hookSecret}}, 400, "invalid_json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.r
			if r.method == "" {
				r.method, r.path = "POST", "/v1/operations"
			}
			switch r.token {
			case "":
				r.token = apiToken
			case "-":
				r.token = ""
			}
			got := e.do(r)
			if got.status != c.status || got.errCode() != c.code {
				t.Fatalf("%s %s: %d %s, want %d %s", r.method, r.path, got.status, got.raw, c.status, c.code)
			}
			if msg, _ := got.json["error"].(map[string]any)["message"].(string); msg == "" {
				t.Fatalf("error without message: %s", got.raw)
			}
			if c.status == 405 && got.header.Get("Allow") == "" {
				t.Fatal("405 without Allow")
			}
			if after := count(); after != before {
				t.Fatalf("bad input wrote something:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

func TestBodyLimitConfigurable(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 100 })
	body := `{"subject":"` + strings.Repeat("a", 100) + `","target":"t","action":"grant"}`
	hr, _ := http.NewRequest("POST", e.srv.URL+"/v1/operations", io.NopCloser(bytes.NewReader([]byte(body)))) // no Content-Length: chunked
	hr.Header.Set("Authorization", "Bearer "+apiToken)
	hr.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 413 {
		t.Fatalf("chunked body over the limit: %d", res.StatusCode)
	}
}

// The binding file's path segments must fit 255 bytes once URL-escaped; the limit is on
// bytes after escaping, not on characters, and a name exactly at it is accepted.
func TestValidPathSegments(t *testing.T) {
	cases := []struct {
		subject, target string
		wantErr         string // "" = accepted
	}{
		{strings.Repeat("s", 250), "t", ""},                    // 250 + ".yaml" = 255
		{strings.Repeat("s", 251), "t", "subject is too long"}, // 256
		{strings.Repeat("é", 21), "t", ""},                     // "é" escapes to "%C3%A9": 21 × 6 + 5 = 131
		{strings.Repeat("é", 50), "t", "subject is too long"},  // 50 × 6 + 5 = 305
		{"s", strings.Repeat("t", 255), ""},
		{"s", "a" + strings.Repeat(" ", 85) + "b", "target is too long"}, // 2 + 85 × 3 = 257
		{"s", "a" + strings.Repeat(" ", 84) + "b", ""},                   // 254
	}
	for _, c := range cases {
		err := validPathSegments(c.subject, c.target)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%d-byte subject, %d-byte target refused: %v", len(c.subject), len(c.target), err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%d-byte subject, %d-byte target: err %v, want %q", len(c.subject), len(c.target), err, c.wantErr)
		}
	}
}
