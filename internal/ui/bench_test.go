package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
	"github.com/batcherd/batcherd/internal/ui"
)

// Seeded history of BenchmarkPages: benchOps operations in all (README, "Status page":
// the render-time figure). 97,000 merged in 19,400 succeeded batches of 5, 1,000 in
// the two running batches (500 members each, the largest page), 2,000 queued and
// waiting; three audit events per operation.
const (
	benchOps      = 100_000
	benchMerged   = 97_000
	benchRunning  = 1_000
	benchBatches  = benchMerged / 5
	benchRepoA    = "platform/access"
	benchRepoB    = "platform/other"
	benchSeedStep = 20_000
)

func seedHistory(b *testing.B, st *store.Store) {
	b.Helper()
	ctx := context.Background()
	db := st.DB()
	exec := func(q string, args ...any) {
		b.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			b.Fatalf("%s: %v", q[:min(len(q), 80)], err)
		}
	}
	opID := "CONCAT('00000000-0000-4000-8000-', LPAD(seq, 12, '0'))"
	// Batches 1..benchBatches succeeded, then one running batch per repository.
	exec(`INSERT INTO merge_batch (id, repo, status, size, source_branch, mr_iid, mr_url, mr_sha, created_at, updated_at, finished_at)
		SELECT seq, IF(seq % 2 = 0, ?, ?), 2, 5, CONCAT('batcherd/bench/batch-', seq), seq,
		  CONCAT('https://gitlab.example.com/platform/access/-/merge_requests/', seq), SHA1(seq),
		  NOW(6) - INTERVAL (? - seq) MINUTE, NOW(6) - INTERVAL (? - seq) MINUTE, NOW(6) - INTERVAL (? - seq) MINUTE
		FROM seq_1_to_`+fmt.Sprint(benchBatches), benchRepoA, benchRepoB, benchBatches, benchBatches, benchBatches)
	exec(`INSERT INTO merge_batch (id, repo, status, size, source_branch, mr_iid, mr_url, mr_sha)
		VALUES (?, ?, 1, 500, 'batcherd/bench/batch-a', 90001, 'https://gitlab.example.com/platform/access/-/merge_requests/90001', 'abc'),
		       (?, ?, 1, 500, 'batcherd/bench/batch-b', 90002, 'https://gitlab.example.com/platform/other/-/merge_requests/90002', 'def')`,
		benchBatches+1, benchRepoA, benchBatches+2, benchRepoB)
	// Operations in steps (one statement per step keeps each transaction modest).
	for lo := 1; lo <= benchOps; lo += benchSeedStep {
		hi := min(lo+benchSeedStep-1, benchOps)
		exec(`INSERT INTO operation (operation_id, subject, target, repo, action, status, batch_id, attempts,
			  requested_by, approved_by, created_at, updated_at)
			SELECT `+opID+`, CONCAT('user-', seq), CONCAT('db/prod-', seq % 50),
			  CASE WHEN seq <= ? THEN IF(CEIL(seq / 5) % 2 = 0, ?, ?)
			       WHEN seq <= ? THEN IF(seq % 2 = 0, ?, ?) ELSE ? END,
			  'grant',
			  CASE WHEN seq <= ? THEN 'merged' WHEN seq <= ? THEN 'in_batch' ELSE 'queued' END,
			  CASE WHEN seq <= ? THEN CEIL(seq / 5) WHEN seq <= ? THEN ? + 1 + (seq % 2) ELSE NULL END,
			  1, 'alice', 'bob', NOW(6) - INTERVAL (? - seq) SECOND, NOW(6)
			FROM seq_`+fmt.Sprint(lo)+`_to_`+fmt.Sprint(hi),
			benchMerged, benchRepoA, benchRepoB,
			benchMerged+benchRunning, benchRepoB, benchRepoA, benchRepoA,
			benchMerged, benchMerged+benchRunning,
			benchMerged, benchMerged+benchRunning, benchBatches,
			benchOps)
		exec(`INSERT INTO merge_batch_member (batch_id, operation_id, created_at)
			SELECT batch_id, operation_id, created_at FROM operation WHERE operation_id BETWEEN ? AND ? AND batch_id IS NOT NULL`, benchOpID(lo), benchOpID(hi))
		exec(`INSERT INTO audit_event (dedupe_key, operation_id, batch_id, code, detail, actor, created_at)
			SELECT CONCAT('op:', o.operation_id, ':', c.code), o.operation_id, IF(c.code = 'merged', o.batch_id, NULL), c.code,
			  CONCAT(c.code, ' (seeded)'), c.actor, o.created_at + INTERVAL c.n SECOND
			FROM operation o
			JOIN (SELECT 1 AS n, 'created' AS code, 'alice' AS actor UNION ALL SELECT 2, 'approved', 'bob'
			      UNION ALL SELECT 3, 'merged', '') c
			WHERE o.operation_id BETWEEN ? AND ?`, benchOpID(lo), benchOpID(hi))
	}
	exec(`INSERT INTO merge_batch_request (operation_id, repo, created_at)
		SELECT operation_id, repo, created_at FROM operation WHERE status = 'queued'`)
	exec(`INSERT INTO merge_batch_request (operation_id, repo, batch_id, created_at)
		SELECT operation_id, repo, batch_id, created_at FROM operation WHERE status = 'in_batch'`)
	exec("ANALYZE TABLE operation, merge_batch, merge_batch_member, merge_batch_request, audit_event")
	for q, want := range map[string]int{
		"SELECT COUNT(*) FROM operation":          benchOps,
		"SELECT COUNT(*) FROM merge_batch_member": benchMerged + benchRunning,
		"SELECT COUNT(*) FROM audit_event":        3 * benchOps,
	} {
		var n int
		if err := db.GetContext(ctx, &n, q); err != nil || n != want {
			b.Fatalf("%s: %d, want %d (%v)", q, n, want, err)
		}
	}
}

// benchOpID is the operation_id seedHistory gives operation n (ordered as n).
func benchOpID(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// BenchmarkPages renders each status page against a database of 100,000 operations
// (seedHistory), through the handler with a logged-in session, and reports ms per page.
// Run by hand: go test -run '^$' -bench Pages -benchtime 200x ./internal/ui/
func BenchmarkPages(b *testing.B) {
	st, _ := storetest.New(b)
	t0 := time.Now()
	seedHistory(b, st)
	b.Logf("seeded %d operations in %s", benchOps, time.Since(t0).Round(time.Millisecond))
	toks, err := auth.ParseTokens(auth.TokenList{Var: "API", Entries: []string{"alice=" + aliceToken}})
	if err != nil {
		b.Fatal(err)
	}
	h, err := ui.New(ui.Config{Auth: auth.New(toks, nil), SessionKey: []byte("0123456789abcdef0123456789abcdef"),
		Repos: []string{benchRepoA, benchRepoB}}, st, nil)
	if err != nil {
		b.Fatal(err)
	}
	cookie := benchLogin(b, h)
	mid := benchBatches / 2
	pages := []struct{ name, path, want string }{
		{"repos", "/ui", "#19402"},
		{"batches", "/ui/batches", "#19353"},
		{"batches_repo_deep", fmt.Sprintf("/ui/batches?repo=%s&before=%d", url.QueryEscape(benchRepoB), mid), "#9601"},
		{"batch_5_members", fmt.Sprintf("/ui/batches/%d", mid), "Members (5)"},
		{"batch_500_members", fmt.Sprintf("/ui/batches/%d", benchBatches+1), "Members (500)"},
		{"operation", "/ui/operations/00000000-0000-4000-8000-000000050000", "approved"},
	}
	for _, p := range pages {
		// The page shows what it is measured for (not an error page or an empty list).
		req := httptest.NewRequest("GET", p.path, nil)
		req.AddCookie(cookie)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), p.want) {
			b.Fatalf("GET %s = %d without %q", p.path, rec.Code, p.want)
		}
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				req := httptest.NewRequest("GET", p.path, nil)
				req.AddCookie(cookie)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("GET %s = %d", p.path, rec.Code)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
		})
	}
}

func benchLogin(b *testing.B, h http.Handler) *http.Cookie {
	b.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/login", nil))
	var csrf *http.Cookie
	for _, c := range rec.Result().Cookies() {
		if c.Name == "batcherd_ui_login" {
			csrf = c
		}
	}
	if csrf == nil {
		b.Fatal("no login cookie")
	}
	form := url.Values{"token": {aliceToken}, "csrf": {csrf.Value}}
	req := httptest.NewRequest("POST", "/ui/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(csrf)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	for _, c := range rec.Result().Cookies() {
		if c.Name == "batcherd_ui" {
			return c
		}
	}
	b.Fatalf("login answered %d without a session", rec.Code)
	return nil
}
