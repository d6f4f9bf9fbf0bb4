package app_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// Queue control through the HTTP API with several replicas (issue #17): pause and
// resume, withdraw, and the urgent lane. The schedule is an hour, so every round in
// these tests is one the test (or the urgent lane) started.

// approverToken is a second API principal: four eyes refuses the requester's own approval.
const approverToken = "approver-token-for-tests"

func queueConfig(t *testing.T, dsn, glURL string, extra map[string]string, repos ...string) *config.Config {
	t.Helper()
	env := map[string]string{
		"BATCHERD_MYSQL_DSN":          dsn,
		"BATCHERD_GITLAB_URL":         glURL,
		"BATCHERD_GITLAB_TOKEN":       "sim-token",
		"BATCHERD_REPOS":              strings.Join(repos, ","),
		"BATCHERD_HTTP_ADDR":          "127.0.0.1:0",
		"BATCHERD_API_TOKENS":         "requester=" + apiToken + ",approver=" + approverToken,
		"BATCHERD_ADMIN_TOKENS":       "oncall=" + adminToken,
		"BATCHERD_AUTO_APPROVE":       "true",
		"BATCHERD_CLAIM_SCHEDULE":     "@every 1h",
		"BATCHERD_RECONCILE_INTERVAL": "100ms",
		"BATCHERD_SHUTDOWN_TIMEOUT":   "5s",
	}
	for k, v := range extra {
		env[k] = v
	}
	cfg, err := config.Load(context.Background(), envconfig.MapLookuper(env))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(config.Need{DB: true, GitLab: true, Serve: true}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// queueCluster starts n replicas on one fresh database and a GitLab simulator.
func queueCluster(t *testing.T, n int, extra map[string]string, pipeline time.Duration, repos ...string) (bases []string, sim *gitlabsim.Sim) {
	t.Helper()
	_, dsn := storetest.New(t)
	sim = gitlabsim.New(gitlabsim.Options{Projects: repos, PipelineDuration: pipeline})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	for range n {
		a, stop := startApp(t, queueConfig(t, dsn, sim.URL(), extra, repos...))
		t.Cleanup(stop)
		bases = append(bases, "http://"+a.Addr())
	}
	// Each replica runs a claim pass right after its start jitter, schedule or not:
	// wait for those, so the only rounds from here on are the ones a test starts.
	for _, base := range bases {
		deadline := time.Now().Add(30 * time.Second)
		for claimAnswers(t, base) < len(repos) {
			if time.Now().After(deadline) {
				t.Fatalf("%s ran no claim pass within 30s", base)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return bases, sim
}

type repoEnvelope struct {
	Repo repoObj `json:"repo"`
}

type repoObj struct {
	Repo          string  `json:"repo"`
	Paused        bool    `json:"paused"`
	PauseReason   *string `json:"pause_reason"`
	PausedUntil   *string `json:"paused_until"`
	PausedBy      *string `json:"paused_by"`
	Waiting       int64   `json:"waiting"`
	OldestWaiting *string `json:"oldest_waiting_at"`
	ActiveBatchID *int64  `json:"active_batch_id"`
}

type roundOut struct {
	Outcome string `json:"outcome"`
	BatchID *int64 `json:"batch_id"`
}

func round(t *testing.T, base, repo string) roundOut {
	t.Helper()
	var out roundOut
	if code := call(t, "POST", base+"/v1/admin/rounds", adminToken, map[string]any{"repo": repo}, &out); code != 200 {
		t.Fatalf("round %s on %s: status %d", repo, base, code)
	}
	return out
}

func createOp(t *testing.T, base string, body map[string]any) opEnvelope {
	t.Helper()
	var env opEnvelope
	if code := call(t, "POST", base+"/v1/operations", apiToken, body, &env); code != 201 {
		t.Fatalf("create %v on %s: status %d", body, base, code)
	}
	return env
}

func getOp(t *testing.T, base, id string) opEnvelope {
	t.Helper()
	var env opEnvelope
	if code := call(t, "GET", base+"/v1/operations/"+id, apiToken, nil, &env); code != 200 {
		t.Fatalf("get %s: status %d", id, code)
	}
	return env
}

func waitStatus(t *testing.T, base, id, want string, within time.Duration) opEnvelope {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		env := getOp(t, base, id)
		if env.Operation.Status == want {
			return env
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s is %s after %s, want %s", id, env.Operation.Status, within, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func metricLine(t *testing.T, base, prefix string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// waitMetric waits until base's metric line with prefix ends in suffix (the database
// gauges are sampled every few seconds).
func waitMetric(t *testing.T, base, prefix, suffix string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		l := metricLine(t, base, prefix)
		if strings.HasSuffix(l, suffix) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q, want it to end in %q", base, l, suffix)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// claimAnswers sums a replica's claim outcomes (one per repository and round).
func claimAnswers(t *testing.T, base string) int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "batcherd_scanner_loop_outcomes_total{") && strings.Contains(l, `loop="claim"`) {
			var v float64
			if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err == nil {
				n += int(v)
			}
		}
	}
	return n
}

// A pause made through one replica stops every replica's rounds; admission goes on,
// the batch in flight finishes, GET /v1/repos and the metrics show it, resume (or the
// end time) lets the next round claim, and the repository's history records it.
func TestPauseResumeAcrossReplicas(t *testing.T) {
	const repo, other = "platform/access", "platform/other"
	bases, _ := queueCluster(t, 2, nil, 300*time.Millisecond, repo, other)
	a, b := bases[0], bases[1]
	esc := url.PathEscape(repo)

	// A batch in flight before the freeze.
	inflight := createOp(t, a, map[string]any{"subject": "early", "target": "db", "action": "grant", "repo": repo})
	if r := round(t, a, repo); r.Outcome != "claimed" {
		t.Fatalf("round before the pause: %+v", r)
	}

	var pe repoEnvelope
	if code := call(t, "POST", a+"/v1/admin/repos/"+esc+"/pause", adminToken, map[string]any{"reason": "release 4.2 freeze"}, &pe); code != 200 {
		t.Fatalf("pause: status %d", code)
	}
	if !pe.Repo.Paused || pe.Repo.Repo != repo || pe.Repo.PauseReason == nil || *pe.Repo.PauseReason != "release 4.2 freeze" ||
		pe.Repo.PausedBy == nil || *pe.Repo.PausedBy != "oncall" || pe.Repo.PausedUntil != nil {
		t.Fatalf("pause answered %+v", pe.Repo)
	}
	// Idempotent.
	if code := call(t, "POST", a+"/v1/admin/repos/"+esc+"/pause", adminToken, map[string]any{"reason": "release 4.2 freeze"}, &pe); code != 200 || !pe.Repo.Paused {
		t.Fatalf("second pause: status %d, %+v", code, pe.Repo)
	}
	for _, c := range []struct {
		path, token string
		body        any
		want        int
	}{
		{"/v1/admin/repos/" + url.PathEscape("no/such") + "/pause", adminToken, map[string]any{"reason": "x"}, 404},
		{"/v1/admin/repos/" + esc + "/pause", apiToken, map[string]any{"reason": "x"}, 403},
		{"/v1/admin/repos/" + esc + "/pause", adminToken, map[string]any{}, 400},
		{"/v1/admin/repos/" + esc + "/pause", adminToken, map[string]any{"reason": "x", "until": "2001-01-01T00:00:00Z"}, 400},
		{"/v1/admin/repos/" + esc + "/pause", adminToken, map[string]any{"reason": "x", "until": "tomorrow"}, 400},
		{"/v1/admin/repos/" + url.PathEscape("no/such") + "/resume", adminToken, nil, 404},
	} {
		if code := call(t, "POST", a+c.path, c.token, c.body, nil); code != c.want {
			t.Errorf("POST %s %v: status %d, want %d", c.path, c.body, code, c.want)
		}
	}

	// Admission goes on through the other replica; no replica claims.
	waiting := createOp(t, b, map[string]any{"subject": "frozen", "target": "db", "action": "grant", "repo": repo})
	for _, base := range bases {
		if r := round(t, base, repo); r.Outcome != "paused" {
			t.Fatalf("round on %s while paused: %+v", base, r)
		}
	}
	// The other repository is not paused.
	createOp(t, b, map[string]any{"subject": "x", "target": "db", "action": "grant", "repo": other})
	if r := round(t, b, other); r.Outcome != "claimed" {
		t.Fatalf("round of the other repository: %+v", r)
	}
	// The batch in flight finishes.
	waitStatus(t, b, inflight.Operation.ID, "merged", 30*time.Second)

	var list struct {
		Repos []repoObj `json:"repos"`
	}
	if code := call(t, "GET", b+"/v1/repos", apiToken, nil, &list); code != 200 || len(list.Repos) != 2 {
		t.Fatalf("GET /v1/repos: %d %+v", code, list)
	}
	if r := list.Repos[0]; r.Repo != repo || !r.Paused || r.Waiting != 1 || r.OldestWaiting == nil || r.PauseReason == nil {
		t.Fatalf("GET /v1/repos shows %+v", r)
	}
	if r := list.Repos[1]; r.Repo != other || r.Paused {
		t.Fatalf("GET /v1/repos shows %+v for the other repository", r)
	}
	waitMetric(t, b, `batcherd_repo_paused{repo="platform/access"}`, " 1")
	if getOp(t, a, waiting.Operation.ID).Operation.Status != "queued" {
		t.Fatal("an operation was claimed while paused")
	}

	// Resume through the other replica: the next round claims.
	if code := call(t, "POST", b+"/v1/admin/repos/"+esc+"/resume", adminToken, nil, &pe); code != 200 || pe.Repo.Paused || pe.Repo.PauseReason != nil {
		t.Fatalf("resume: status %d, %+v", code, pe.Repo)
	}
	if code := call(t, "POST", b+"/v1/admin/repos/"+esc+"/resume", adminToken, nil, &pe); code != 200 || pe.Repo.Paused {
		t.Fatalf("second resume: status %d, %+v", code, pe.Repo)
	}
	waitMetric(t, a, `batcherd_repo_paused{repo="platform/access"}`, " 0")
	if r := round(t, a, repo); r.Outcome != "claimed" {
		t.Fatalf("round after resume: %+v", r)
	}
	waitStatus(t, a, waiting.Operation.ID, "merged", 30*time.Second)

	// A pause with an end time ends by itself.
	until := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	if code := call(t, "POST", a+"/v1/admin/repos/"+esc+"/pause", adminToken, map[string]any{"reason": "short window", "until": until}, &pe); code != 200 || pe.Repo.PausedUntil == nil {
		t.Fatalf("pause until: status %d, %+v", code, pe.Repo)
	}
	late := createOp(t, a, map[string]any{"subject": "late", "target": "db", "action": "grant", "repo": repo})
	if r := round(t, b, repo); r.Outcome != "paused" {
		t.Fatalf("round during the window: %+v", r)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := round(t, b, repo)
		if r.Outcome == "claimed" {
			break
		}
		if r.Outcome != "paused" || time.Now().After(deadline) {
			t.Fatalf("round after the window: %+v", r)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitStatus(t, a, late.Operation.ID, "merged", 30*time.Second)

	var evs struct {
		Events []struct {
			Code   string `json:"code"`
			Detail string `json:"detail"`
		} `json:"events"`
	}
	if code := call(t, "GET", a+"/v1/repos/"+esc+"/events", apiToken, nil, &evs); code != 200 {
		t.Fatalf("repository events: %d", code)
	}
	var codes []string
	for _, e := range evs.Events {
		codes = append(codes, e.Code)
	}
	if want := "repo_paused repo_paused repo_resumed repo_paused"; strings.Join(codes, " ") != want {
		t.Fatalf("repository history %v, want %s", codes, want)
	}
}

// Withdraw through the HTTP API with two replicas: from pending_approval and from
// queued (never claimed afterwards, the relation re-appliable), 409 in_batch once
// claimed, a revoke's binding back to active; and, racing, withdrawals on one replica
// while the other runs rounds: every answer is either 200 withdrawn with the operation
// in no batch, or 409 in_batch with it in one.
func TestWithdrawAcrossReplicas(t *testing.T) {
	const repo = "platform/access"
	bases, _ := queueCluster(t, 2, map[string]string{"BATCHERD_AUTO_APPROVE": "false", "BATCHERD_MAX_BATCH_SIZE": "3"}, 50*time.Millisecond, repo)
	a, b := bases[0], bases[1]

	pending := createOp(t, a, map[string]any{"subject": "p", "target": "db", "action": "grant"})
	var w opEnvelope
	if code := call(t, "POST", b+"/v1/operations/"+pending.Operation.ID+"/withdraw", apiToken, nil, &w); code != 200 || w.Operation.Status != "withdrawn" {
		t.Fatalf("withdraw pending: %d %+v", code, w)
	}
	if code := call(t, "POST", a+"/v1/operations/"+strings.ToUpper(pending.Operation.ID)+"/withdraw", apiToken, nil, &w); code != 200 || w.Operation.Status != "withdrawn" {
		t.Fatalf("withdraw again: %d %+v", code, w)
	}
	var bl struct {
		Bindings []struct {
			Status string `json:"status"`
		} `json:"bindings"`
	}
	call(t, "GET", a+"/v1/bindings?subject=p&target=db", apiToken, nil, &bl)
	if len(bl.Bindings) != 1 || bl.Bindings[0].Status != "closed" {
		t.Fatalf("binding after withdraw: %+v", bl)
	}
	queued := createOp(t, b, map[string]any{"subject": "p", "target": "db", "action": "grant"}) // re-appliable
	if code := call(t, "POST", a+"/v1/operations/"+queued.Operation.ID+"/approve", approverToken, nil, nil); code != 200 {
		t.Fatalf("approve: %d", code)
	}
	if code := call(t, "POST", b+"/v1/operations/"+queued.Operation.ID+"/withdraw", apiToken, nil, &w); code != 200 || w.Operation.Status != "withdrawn" {
		t.Fatalf("withdraw queued: %d %+v", code, w)
	}
	if r := round(t, a, repo); r.Outcome != "nothing_to_claim" {
		t.Fatalf("round after withdrawing everything: %+v", r)
	}
	claimed := createOp(t, b, map[string]any{"subject": "p", "target": "db", "action": "grant"})
	call(t, "POST", b+"/v1/operations/"+claimed.Operation.ID+"/approve", approverToken, nil, nil)
	if r := round(t, b, repo); r.Outcome != "claimed" {
		t.Fatalf("round: %+v", r)
	}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if code := call(t, "POST", a+"/v1/operations/"+claimed.Operation.ID+"/withdraw", apiToken, nil, &e); code != 409 || e.Error.Code != "in_batch" {
		t.Fatalf("withdraw in_batch: %d %+v", code, e)
	}
	if code := call(t, "POST", a+"/v1/operations/00000000-0000-4000-8000-000000000000/withdraw", apiToken, nil, nil); code != 404 {
		t.Fatalf("withdraw unknown: %d", code)
	}
	waitStatus(t, a, claimed.Operation.ID, "merged", 30*time.Second)
	revoke := createOp(t, a, map[string]any{"subject": "p", "target": "db", "action": "revoke"})
	if code := call(t, "POST", b+"/v1/operations/"+revoke.Operation.ID+"/withdraw", apiToken, nil, &w); code != 200 {
		t.Fatalf("withdraw revoke: %d", code)
	}
	call(t, "GET", a+"/v1/bindings?subject=p&target=db", apiToken, nil, &bl)
	if len(bl.Bindings) != 1 || bl.Bindings[0].Status != "active" {
		t.Fatalf("binding after a withdrawn revoke: %+v", bl)
	}

	// The race, through both replicas.
	const n = 60
	ids := make([]string, n)
	for i := range ids {
		op := createOp(t, a, map[string]any{"subject": fmt.Sprintf("r%d", i), "target": "db", "action": "grant"})
		if code := call(t, "POST", b+"/v1/operations/"+op.Operation.ID+"/approve", approverToken, nil, nil); code != 200 {
			t.Fatalf("approve: %d", code)
		}
		ids[i] = op.Operation.ID
	}
	codes := make([]int, n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			var out roundOut
			call(t, "POST", a+"/v1/admin/rounds", adminToken, map[string]any{"repo": repo}, &out)
			time.Sleep(5 * time.Millisecond)
		}
	})
	var ww sync.WaitGroup
	for g := range 3 {
		ww.Go(func() {
			for i := g; i < n; i += 3 {
				codes[i] = call(t, "POST", bases[(i+g)%2]+"/v1/operations/"+ids[i]+"/withdraw", apiToken, nil, nil)
				time.Sleep(time.Duration(i%7) * time.Millisecond)
			}
		})
	}
	ww.Wait()
	close(stop)
	wg.Wait()
	var nw, nb int
	for i, id := range ids {
		op := getOp(t, a, id).Operation
		switch codes[i] {
		case 200:
			nw++
			if op.Status != "withdrawn" || op.BatchID != nil {
				t.Errorf("%s: withdrawn answered, but %s in batch %v", id, op.Status, op.BatchID)
			}
		case 409:
			nb++
			if op.BatchID == nil || op.Status == "withdrawn" {
				t.Errorf("%s: in_batch answered, but %s in batch %v", id, op.Status, op.BatchID)
			}
		default:
			t.Errorf("%s: withdraw answered %d", id, codes[i])
		}
	}
	t.Logf("HTTP race: %d withdrawn, %d in_batch", nw, nb)
}

// The urgent lane through two replicas: an urgent approval on one replica claims at
// once (the answer already shows it in_batch, ahead of older normal work); an urgent
// approval that meets a running batch does not preempt it and is claimed as soon as
// that batch settles — long before the (hourly) schedule.
func TestUrgentLaneAcrossReplicas(t *testing.T) {
	const repo = "platform/access"
	bases, _ := queueCluster(t, 2, map[string]string{"BATCHERD_AUTO_APPROVE": "false", "BATCHERD_MAX_BATCH_SIZE": "3"}, time.Second, repo)
	a, b := bases[0], bases[1]
	var normal []string
	for i := range 4 {
		op := createOp(t, a, map[string]any{"subject": fmt.Sprintf("n%d", i), "target": "db", "action": "grant"})
		if code := call(t, "POST", a+"/v1/operations/"+op.Operation.ID+"/approve", approverToken, nil, nil); code != 200 {
			t.Fatal(code)
		}
		normal = append(normal, op.Operation.ID)
	}
	var u opEnvelope
	if code := call(t, "POST", b+"/v1/operations", apiToken, map[string]any{"subject": "leaver", "target": "db", "action": "grant", "priority": "urgent"}, &u); code != 201 || u.Operation.Status != "pending_approval" {
		t.Fatalf("create urgent: %d %+v", code, u)
	}
	if code := call(t, "POST", b+"/v1/operations", apiToken, map[string]any{"subject": "x", "target": "db", "action": "grant", "priority": "asap"}, nil); code != 400 {
		t.Fatalf("unknown priority: %d", code)
	}
	var approved opEnvelope
	if code := call(t, "POST", b+"/v1/operations/"+u.Operation.ID+"/approve", approverToken, nil, &approved); code != 200 || approved.Operation.Status != "in_batch" || approved.Operation.BatchID == nil {
		t.Fatalf("urgent approval answered %d %+v, want in_batch at once", code, approved)
	}
	var batch struct {
		Batch struct {
			OperationIDs []string `json:"operation_ids"`
		} `json:"batch"`
	}
	call(t, "GET", a+fmt.Sprintf("/v1/batches/%d", *approved.Operation.BatchID), apiToken, nil, &batch)
	want := map[string]bool{u.Operation.ID: true, normal[0]: true, normal[1]: true}
	if len(batch.Batch.OperationIDs) != 3 {
		t.Fatalf("urgent batch has %v", batch.Batch.OperationIDs)
	}
	for _, id := range batch.Batch.OperationIDs {
		if !want[id] {
			t.Fatalf("urgent batch has %v, want the urgent one and the two oldest normal ones", batch.Batch.OperationIDs)
		}
	}

	// The slot is held (pipelines take a second): a second urgent approval waits.
	u2 := createOp(t, a, map[string]any{"subject": "leaver2", "target": "db", "action": "grant", "priority": "urgent"})
	var ap2 opEnvelope
	if code := call(t, "POST", a+"/v1/operations/"+u2.Operation.ID+"/approve", approverToken, nil, &ap2); code != 200 || ap2.Operation.Status != "queued" {
		t.Fatalf("urgent approval with the slot held: %d %+v, want queued (no preemption)", code, ap2)
	}
	// The first batch settles; its settling replica claims the urgent one next.
	waitStatus(t, a, u.Operation.ID, "merged", 30*time.Second)
	got := waitStatus(t, a, u2.Operation.ID, "in_batch", 10*time.Second)
	call(t, "GET", a+fmt.Sprintf("/v1/batches/%d", *got.Operation.BatchID), apiToken, nil, &batch)
	if len(batch.Batch.OperationIDs) != 3 {
		t.Fatalf("second urgent batch has %v", batch.Batch.OperationIDs)
	}
	has := map[string]bool{}
	for _, id := range batch.Batch.OperationIDs {
		has[id] = true
	}
	if !has[u2.Operation.ID] || !has[normal[2]] || !has[normal[3]] {
		t.Fatalf("second batch %v, want the urgent one and the remaining normal ones", batch.Batch.OperationIDs)
	}
}
