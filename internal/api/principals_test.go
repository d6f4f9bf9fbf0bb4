package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/auth/authtest"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// Principal tokens through the HTTP API: named and bare entries, admin and API lists,
// and bearer JWTs of a local OIDC issuer the test starts.

const (
	aliceToken = "alice-secret-1"
	bobToken   = "bob-secret-2"
	opsToken   = "ops-secret-3"
	bareToken  = "bare-secret-4"
)

// principalEnv serves the API with token principals alice, bob (API), a bare token,
// ops (admin) and, when iss is not nil, the issuer's tokens (admin group
// platform/admins).
func principalEnv(t *testing.T, iss *authtest.Issuer, mut func(*Config)) *env {
	t.Helper()
	toks, err := auth.ParseTokens(
		auth.TokenList{Var: "BATCHERD_API_TOKENS", Entries: []string{"alice=" + aliceToken, "bob=" + bobToken, bareToken}},
		auth.TokenList{Var: "BATCHERD_ADMIN_TOKENS", Entries: []string{"ops=" + opsToken}, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	var o *auth.OIDC
	if iss != nil {
		o, err = auth.NewOIDC(context.Background(), auth.OIDCConfig{
			Issuer: iss.URL, Audience: iss.Audience, AdminGroups: []string{"platform/admins"},
			HTTPClient: &http.Client{Timeout: 5 * time.Second}, RetryEvery: time.Millisecond, RefetchEvery: -1,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return newEnv(t, func(c *Config) {
		c.APITokens, c.AdminTokens = nil, nil
		c.Auth = auth.New(toks, o)
		if mut != nil {
			mut(c)
		}
	})
}

func TestPrincipalTokensHTTP(t *testing.T) {
	e := principalEnv(t, nil, nil)
	for _, tc := range []struct {
		token      string
		path       string
		wantStatus int
	}{
		{aliceToken, "/v1/bindings", 200},
		{bareToken, "/v1/bindings", 200},
		{opsToken, "/v1/bindings", 200},
		{aliceToken, "/v1/admin/rounds", 403},
		{bareToken, "/v1/admin/rounds", 403},
		{opsToken, "/v1/admin/rounds", 200},
		{"alice=" + aliceToken, "/v1/bindings", 401}, // the entry is not the token
		{"alice", "/v1/bindings", 401},               // nor is the name
		{"", "/v1/bindings", 401},
	} {
		method := "GET"
		if strings.HasPrefix(tc.path, "/v1/admin") {
			method = "POST"
		}
		r := e.do(req{method: method, path: tc.path, token: tc.token})
		if r.status != tc.wantStatus {
			t.Errorf("%s %s with %q: %d %s, want %d", method, tc.path, tc.token, r.status, r.raw, tc.wantStatus)
		}
		if strings.Contains(string(r.raw), aliceToken) {
			t.Errorf("the answer shows a token: %s", r.raw)
		}
	}
}

func TestPrincipalOIDCHTTP(t *testing.T) {
	iss := authtest.NewIssuer(t, "app-1")
	e := principalEnv(t, iss, nil)
	admin := iss.Claims("dana")
	admin["groups"] = []string{"platform/admins"}
	expired := iss.Claims("carol")
	expired["exp"] = time.Now().Add(-time.Minute).Unix()
	wrongAud := iss.Claims("carol")
	wrongAud["aud"] = "another-app"
	wrongIss := iss.Claims("carol")
	wrongIss["iss"] = "https://issuer.invalid"
	ghost := authtest.NewKey(t, "ghost", jose.RS256)

	check := func(what, token, method, path string, want int) {
		t.Helper()
		r := e.do(req{method: method, path: path, token: token})
		if r.status != want {
			t.Errorf("%s: %s %s → %d %s, want %d", what, method, path, r.status, r.raw, want)
		}
		if want == 401 && r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", what)
		}
	}
	check("valid token", iss.Token(iss.Claims("carol")), "GET", "/v1/bindings", 200)
	check("valid token, admin route", iss.Token(iss.Claims("carol")), "POST", "/v1/admin/rounds", 403)
	check("admin group", iss.Token(admin), "POST", "/v1/admin/rounds", 200)
	check("expired", iss.Token(expired), "GET", "/v1/bindings", 401)
	check("wrong audience", iss.Token(wrongAud), "GET", "/v1/bindings", 401)
	check("wrong issuer", iss.Token(wrongIss), "GET", "/v1/bindings", 401)
	check("alg none", authtest.Unsigned(t, iss.Current().ID, admin), "POST", "/v1/admin/rounds", 401)
	check("HS256 with the public key", authtest.SignHS256WithPublicKey(t, iss.Current(), admin), "POST", "/v1/admin/rounds", 401)
	check("unknown kid", authtest.Sign(t, ghost, admin), "POST", "/v1/admin/rounds", 401)
	check("static token beside OIDC", aliceToken, "GET", "/v1/bindings", 200)

	// go-oidc swaps its cached keys a moment after a fetch answers its callers, so a
	// token sent right after a rotation may be refused once (see auth's eventually).
	iss.Rotate(jose.ES256)
	e.eventually("after key rotation", iss.Token(iss.Claims("carol")), 200)

	iss.SetDown(true)
	iss.Rotate(jose.RS256)
	check("new key while the issuer is down", iss.Token(iss.Claims("carol")), "GET", "/v1/bindings", 401)
	iss.SetDown(false)
	e.eventually("new key once the issuer is back", iss.Token(iss.Claims("carol")), 200)
}

// eventually sends GET /v1/bindings with token until it is answered want (2 s at most).
func (e *env) eventually(what, token string, want int) {
	e.t.Helper()
	var r resp
	for i := 0; i < 100; i++ {
		if r = e.do(req{method: "GET", path: "/v1/bindings", token: token}); r.status == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("%s: %d %s, want %d", what, r.status, r.raw, want)
}

func TestPrincipalOIDCIssuerDownAtStartHTTP(t *testing.T) {
	iss := authtest.NewIssuer(t, "app-1")
	iss.SetDown(true)
	e := principalEnv(t, iss, nil) // starts: an unreachable issuer is a warning
	tok := iss.Token(iss.Claims("carol"))
	if r := e.do(req{method: "GET", path: "/v1/bindings", token: tok}); r.status != 401 {
		t.Fatalf("issuer down: %d %s", r.status, r.raw)
	}
	if r := e.do(req{method: "GET", path: "/v1/bindings", token: aliceToken}); r.status != 200 {
		t.Fatalf("static token while the issuer is down: %d %s", r.status, r.raw)
	}
	iss.SetDown(false)
	e.eventually("issuer back", tok, 200)
}

// createAs applies for a grant as the principal of token (with an Idempotency-Key
// when key is not empty).
func (e *env) createAs(token, subject, target, key string) resp {
	e.t.Helper()
	r := req{method: "POST", path: "/v1/operations", token: token,
		body: `{"subject":"` + subject + `","target":"` + target + `","action":"grant"}`}
	if key != "" {
		r.header = map[string]string{"Idempotency-Key": key}
	}
	return e.do(r)
}

// eventActors returns the operation's events as "code:actor" ("-" for no actor).
func (e *env) eventActors(id string) []string {
	e.t.Helper()
	r := e.do(req{method: "GET", path: "/v1/operations/" + id + "/events", token: opsToken})
	if r.status != 200 {
		e.t.Fatalf("events: %d %s", r.status, r.raw)
	}
	var out []string
	for _, x := range r.json["events"].([]any) {
		ev := x.(map[string]any)
		actor, ok := ev["actor"].(string)
		if !ok {
			actor = "-"
		}
		out = append(out, ev["code"].(string)+":"+actor)
	}
	return out
}

func TestFourEyesHTTP(t *testing.T) {
	iss := authtest.NewIssuer(t, "app-1")
	e := principalEnv(t, iss, nil)

	c := e.createAs(aliceToken, "u1", "db/prod", "")
	if c.status != 201 || c.op()["requested_by"] != "alice" || c.op()["approved_by"] != nil {
		t.Fatalf("create: %d %s", c.status, c.raw)
	}
	id := c.op()["id"].(string)

	// The requester approving its own operation: 403 self_approval, nothing changed.
	self := e.post("/v1/operations/"+id+"/approve", aliceToken)
	if self.status != 403 || self.errCode() != "self_approval" {
		t.Fatalf("self-approval: %d %s", self.status, self.raw)
	}
	g := e.do(req{method: "GET", path: "/v1/operations/" + id, token: aliceToken})
	if g.op()["status"] != "pending_approval" || g.op()["approved_by"] != nil || g.op()["updated_at"] != c.op()["updated_at"] {
		t.Fatalf("after a refused self-approval: %s", g.raw)
	}
	var waiting int
	if err := e.st.DB().Get(&waiting, `SELECT COUNT(*) FROM merge_batch_request WHERE operation_id = ?`, id); err != nil || waiting != 0 {
		t.Fatalf("a refused self-approval admitted the operation: %d %v", waiting, err)
	}
	if got := strings.Join(e.eventActors(id), ","); got != "created:alice" {
		t.Fatalf("events after a refused self-approval: %s", got)
	}

	// Another principal approves: recorded.
	a := e.post("/v1/operations/"+id+"/approve", bobToken)
	if a.status != 200 || a.op()["status"] != "queued" || a.op()["approved_by"] != "bob" || a.op()["requested_by"] != "alice" {
		t.Fatalf("approve by bob: %d %s", a.status, a.raw)
	}
	// A repeat by the requester of an approved operation changes nothing either way.
	if r := e.post("/v1/operations/"+id+"/approve", aliceToken); r.status != 200 || r.op()["approved_by"] != "bob" {
		t.Fatalf("repeat by the requester: %d %s", r.status, r.raw)
	}
	if got := strings.Join(e.eventActors(id), ","); got != "created:alice,approved:bob,admitted:bob" {
		t.Fatalf("events: %s", got)
	}

	// An admin is held to four eyes too, and so is an OIDC principal.
	id2 := e.createAs(opsToken, "u2", "db/prod", "").op()["id"].(string)
	if r := e.post("/v1/operations/"+id2+"/approve", opsToken); r.status != 403 || r.errCode() != "self_approval" {
		t.Fatalf("admin self-approval: %d %s", r.status, r.raw)
	}
	carol := iss.Token(iss.Claims("carol"))
	c3 := e.createAs(carol, "u3", "db/prod", "")
	if c3.status != 201 || c3.op()["requested_by"] != "carol" {
		t.Fatalf("create as carol: %d %s", c3.status, c3.raw)
	}
	id3 := c3.op()["id"].(string)
	if r := e.post("/v1/operations/"+id3+"/approve", carol); r.status != 403 || r.errCode() != "self_approval" {
		t.Fatalf("OIDC self-approval: %d %s", r.status, r.raw)
	}
	if r := e.post("/v1/operations/"+id3+"/approve", iss.Token(iss.Claims("dave"))); r.status != 200 || r.op()["approved_by"] != "dave" {
		t.Fatalf("approve by dave (OIDC): %d %s", r.status, r.raw)
	}

	// The requester may take back (reject) its own operation: recorded.
	id4 := e.createAs(aliceToken, "u4", "db/prod", "").op()["id"].(string)
	if r := e.post("/v1/operations/"+id4+"/reject", aliceToken); r.status != 200 || r.op()["status"] != "rejected" {
		t.Fatalf("reject by the requester: %d %s", r.status, r.raw)
	}
	if got := strings.Join(e.eventActors(id4), ","); got != "created:alice,rejected:alice" {
		t.Fatalf("events of the rejected one: %s", got)
	}
	var rejectedBy string
	if err := e.st.DB().Get(&rejectedBy, `SELECT rejected_by FROM operation WHERE operation_id = ?`, id4); err != nil || rejectedBy != "alice" {
		t.Fatalf("rejected_by = %q, %v", rejectedBy, err)
	}

	// Retry is recorded with its principal.
	e.exec(`DELETE FROM merge_batch_request WHERE operation_id = ?`, id)
	e.exec(`UPDATE operation SET status = 'failed', version = version + 1 WHERE operation_id = ?`, id)
	e.exec(`UPDATE binding SET status = 'failed', version = version + 1 WHERE operation_id = ?`, id)
	if r := e.post("/v1/operations/"+id+"/retry", opsToken); r.status != 200 || r.op()["approved_by"] != "bob" {
		t.Fatalf("retry: %d %s", r.status, r.raw)
	}
	if got := e.eventActors(id); !slicesContains(got, "retry_by_operator:ops") || !slicesContains(got, "admitted:ops") {
		t.Fatalf("events after retry: %v", got)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestFourEyesOffHTTP(t *testing.T) {
	e := principalEnv(t, nil, func(c *Config) { c.AllowSelfApproval = true })
	id := e.createAs(aliceToken, "u1", "db/prod", "").op()["id"].(string)
	if r := e.post("/v1/operations/"+id+"/approve", aliceToken); r.status != 200 || r.op()["approved_by"] != "alice" {
		t.Fatalf("self-approval with four eyes off: %d %s", r.status, r.raw)
	}
}

func TestAutoApproveRecordsAutoHTTP(t *testing.T) {
	e := principalEnv(t, nil, func(c *Config) { c.AutoApprove = true })
	c := e.createAs(bareToken, "u1", "db/prod", "")
	want := auth.BareName(bareToken)
	if c.status != 201 || c.op()["status"] != "queued" || c.op()["approved_by"] != "auto" || c.op()["requested_by"] != want {
		t.Fatalf("auto-approved: %d %s", c.status, c.raw)
	}
	id := c.op()["id"].(string)
	g := e.do(req{method: "GET", path: "/v1/operations/" + id, token: aliceToken})
	if g.op()["approved_by"] != "auto" || g.op()["requested_by"] != want {
		t.Fatalf("read back: %s", g.raw)
	}
	if got := strings.Join(e.eventActors(id), ","); got != "created:"+want+",admitted:auto" {
		t.Fatalf("events: %s", got)
	}
}

// Idempotency keys are per principal: two callers may use the same key, each gets its
// own operation, and a repeat answers each caller its own.
func TestIdempotencyPerPrincipalHTTP(t *testing.T) {
	e := principalEnv(t, nil, nil)
	a := e.createAs(aliceToken, "ua", "db/prod", "same-key")
	b := e.createAs(bobToken, "ub", "db/prod", "same-key")
	if a.status != 201 || b.status != 201 || a.op()["id"] == b.op()["id"] {
		t.Fatalf("two principals, one key: %d %s / %d %s", a.status, a.raw, b.status, b.raw)
	}
	if r := e.createAs(aliceToken, "ua", "db/prod", "same-key"); r.status != 200 || r.op()["id"] != a.op()["id"] {
		t.Fatalf("alice's repeat: %d %s", r.status, r.raw)
	}
	if r := e.createAs(bobToken, "ub", "db/prod", "same-key"); r.status != 200 || r.op()["id"] != b.op()["id"] {
		t.Fatalf("bob's repeat: %d %s", r.status, r.raw)
	}
	// Bob's key with alice's body is bob's key reused with another body: 422, not
	// alice's operation.
	if r := e.createAs(bobToken, "ua", "db/prod", "same-key"); r.status != 422 {
		t.Fatalf("bob reusing his key for another body: %d %s", r.status, r.raw)
	}
}

// Many callers of two principals race with the same keys (concurrent admissions are
// grouped into shared transactions): each principal ends with exactly one operation
// per key, and every answer for a key names that principal's operation.
func TestIdempotencyPerPrincipalConcurrentHTTP(t *testing.T) {
	e := principalEnv(t, nil, nil)
	const keys, callers = 8, 6
	type answer struct {
		token, key, id string
		status         int
	}
	out := make(chan answer, 2*keys*callers)
	var wg sync.WaitGroup
	for _, tok := range []string{aliceToken, bobToken} {
		for k := 0; k < keys; k++ {
			for c := 0; c < callers; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprintf("k-%d", k)
					subject := fmt.Sprintf("%s-%d", tok[:3], k)
					r := e.createAs(tok, subject, "db/prod", key)
					id, _ := r.op()["id"].(string)
					out <- answer{tok, key, id, r.status}
				}()
			}
		}
	}
	wg.Wait()
	close(out)
	ids := map[[2]string]map[string]bool{}
	created := map[[2]string]int{}
	for a := range out {
		if a.status != 201 && a.status != 200 {
			t.Fatalf("%s %s: status %d", a.token[:3], a.key, a.status)
		}
		k := [2]string{a.token, a.key}
		if ids[k] == nil {
			ids[k] = map[string]bool{}
		}
		ids[k][a.id] = true
		if a.status == 201 {
			created[k]++
		}
	}
	for k, set := range ids {
		if len(set) != 1 || created[k] != 1 {
			t.Fatalf("%s %s: %d operations, %d created", k[0][:3], k[1], len(set), created[k])
		}
	}
	var n int
	if err := e.st.DB().Get(&n, `SELECT COUNT(*) FROM operation`); err != nil || n != 2*keys {
		t.Fatalf("%d operations stored, want %d (%v)", n, 2*keys, err)
	}
	var perPrincipal []struct {
		RequestedBy string `db:"requested_by"`
		N           int    `db:"n"`
	}
	if err := e.st.DB().Select(&perPrincipal, `SELECT requested_by, COUNT(*) AS n FROM operation GROUP BY requested_by ORDER BY requested_by`); err != nil {
		t.Fatal(err)
	}
	if len(perPrincipal) != 2 || perPrincipal[0].RequestedBy != "alice" || perPrincipal[0].N != keys || perPrincipal[1].RequestedBy != "bob" || perPrincipal[1].N != keys {
		t.Fatalf("operations per requester: %+v", perPrincipal)
	}
}

func TestInsecureNoAuthRecordsAnonymousHTTP(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.APITokens, c.AdminTokens, c.InsecureNoAuth, c.AllowSelfApproval = nil, nil, true, true
	})
	c := e.createAs("", "u1", "db/prod", "")
	if c.status != 201 || c.op()["requested_by"] != "anonymous" {
		t.Fatalf("create without auth: %d %s", c.status, c.raw)
	}
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Secrets stay secret: whatever is sent and however it is refused, neither the answer
// nor the log (at debug) carries a token; the log names principals.
func TestTokensNeverLoggedHTTP(t *testing.T) {
	iss := authtest.NewIssuer(t, "app-1")
	st, _ := storetest.New(t)
	var logs syncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	toks, err := auth.ParseTokens(auth.TokenList{Var: "BATCHERD_API_TOKENS", Entries: []string{"alice=" + aliceToken, "bob=" + bobToken}})
	if err != nil {
		t.Fatal(err)
	}
	o, err := auth.NewOIDC(context.Background(), auth.OIDCConfig{Issuer: iss.URL, Audience: iss.Audience,
		HTTPClient: &http.Client{Timeout: 5 * time.Second}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: auth.New(toks, o), Repos: []string{repoA}, LogRequests: true}, Deps{Store: st, Registry: prometheus.NewRegistry(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	e := &env{t: t, st: st, srv: srv, api: s}

	expired := iss.Claims("carol")
	expired["exp"] = time.Now().Add(-time.Minute).Unix()
	wrongAud := iss.Claims("carol")
	wrongAud["aud"] = "x"
	secrets := []string{
		aliceToken, bobToken, "wrong-" + aliceToken, aliceToken[:len(aliceToken)-1],
		iss.Token(expired), iss.Token(wrongAud), authtest.Unsigned(t, "k", iss.Claims("carol")),
		iss.Token(iss.Claims("carol")),
	}
	var answers strings.Builder
	for _, tok := range secrets {
		for _, path := range []string{"/v1/bindings", "/v1/admin/rounds"} {
			r := e.do(req{method: "POST", path: path, token: tok, body: "{}"})
			answers.Write(r.raw)
		}
	}
	c := e.createAs(aliceToken, "u1", "db/prod", "")
	id, _ := c.op()["id"].(string)
	answers.Write(e.post("/v1/operations/"+id+"/approve", aliceToken).raw)
	answers.Write(e.post("/v1/operations/"+id+"/approve", bobToken).raw)

	for _, tok := range secrets {
		for _, part := range []string{tok, strings.Split(tok, ".")[0]} {
			if len(part) < 8 {
				continue
			}
			if strings.Contains(logs.String(), part) {
				t.Errorf("the log carries a credential (%d bytes)", len(part))
			}
			if strings.Contains(answers.String(), part) {
				t.Errorf("an answer carries a credential (%d bytes)", len(part))
			}
		}
	}
	if !strings.Contains(answers.String(), "alice") {
		t.Errorf("answers name no principal: %s", answers.String())
	}
	// The request log names the principal of each request it could establish.
	for _, want := range []string{`"principal":"alice"`, `"principal":"bob"`, `"principal":"carol"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the request log lacks %s", want)
		}
	}
}
