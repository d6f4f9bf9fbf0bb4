package ui

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

// These tests drive the handler over HTTP without a browser (browser_test.go has the
// browser) and without a database: a fixed store whose every text field is hostile.

const hostile = `<script>alert("x")</script>'"&`

// fakeStore answers fixed hostile rows; members is a batch's member count (0: one).
type fakeStore struct{ members int }

func hostileOp(id string) domain.Operation {
	b := int64(7)
	return domain.Operation{OperationID: id, Subject: "sub" + hostile, Target: "tgt" + hostile, Repo: "platform/access",
		Action: domain.ActionGrant, Status: domain.OpFailed, Priority: domain.PriorityNormal, BatchID: &b,
		ErrorCode: "code" + hostile, ErrorMessage: "msg" + hostile, RequestedBy: "req" + hostile, ApprovedBy: "appr" + hostile,
		CreatedAt: time.Unix(1_700_000_000, 0), UpdatedAt: time.Unix(1_700_000_100, 0)}
}

func hostileBatch(id int64) domain.Batch {
	iid := int64(3)
	return domain.Batch{ID: id, Repo: "platform/access", Status: domain.BatchBlocked, Size: 1,
		SourceBranch: "br" + hostile, MRIID: &iid, MRURL: "javascript:alert(1)//" + hostile, MRSHA: "sha" + hostile,
		ErrorCode: "ec" + hostile, ErrorMessage: "em" + hostile, Kind: "first_try", Grp: "g" + hostile,
		CreatedAt: time.Unix(1_700_000_000, 0), NextCheckAt: time.Unix(1_700_000_060, 0)}
}

func (fakeStore) RepoStates(ctx context.Context, repos []string) ([]store.RepoState, error) {
	out := make([]store.RepoState, len(repos))
	for i, r := range repos {
		t := time.Unix(1_700_000_000, 0)
		b := int64(7)
		out[i] = store.RepoState{Waiting: 3, OldestWaitingAt: &t, ActiveBatchID: &b}
		out[i].Repo = r
		out[i].Paused = true
		out[i].Reason = "reason" + hostile
		out[i].PausedBy = "by" + hostile
	}
	return out, nil
}

func (fakeStore) BatchGet(ctx context.Context, id int64) (domain.Batch, error) {
	if id != 7 {
		return domain.Batch{}, store.ErrNotFound
	}
	return hostileBatch(id), nil
}

func (fakeStore) BatchList(ctx context.Context, f store.BatchFilter) ([]domain.Batch, error) {
	return []domain.Batch{hostileBatch(7)}, nil
}

func (f fakeStore) BatchMembers(ctx context.Context, id int64) ([]domain.Operation, error) {
	out := []domain.Operation{hostileOp("op-1")}
	for i := 1; i < f.members; i++ {
		out = append(out, hostileOp(fmt.Sprintf("op-%d", i+1)))
	}
	return out, nil
}

func (fakeStore) OperationGetView(ctx context.Context, id string) (store.OperationView, error) {
	if id != "op-1" {
		return store.OperationView{}, store.ErrNotFound
	}
	return store.OperationView{Operation: hostileOp(id), MRURL: "javascript:alert(2)"}, nil
}

func (fakeStore) RepoHealths(ctx context.Context) (map[string]store.RepoHealth, error) {
	two, now := 2, time.Unix(1_700_000_000, 0)
	return map[string]store.RepoHealth{"platform/access": {Repo: "platform/access", GitLabState: "forbidden",
		GitLabDetail: "detail" + hostile, GitLabChangedAt: &now, DriftUnexpected: &two, DriftMissing: &two, DriftModified: &two,
		DriftCheckedAt: &now}}, nil
}

func (fakeStore) OperationEvents(ctx context.Context, id string) ([]store.Event, error) {
	b := int64(7)
	return []store.Event{{OperationID: &id, BatchID: &b, Code: "ev" + hostile, Detail: "detail" + hostile, Actor: "actor" + hostile,
		CreatedAt: time.Unix(1_700_000_050, 0)}}, nil
}

const (
	testToken  = "a-token-of-the-tests-0123456789"
	adminToken = "an-admin-token-of-the-tests-0123"
	testKey    = "0123456789abcdef0123456789abcdef"
)

func newTestHandler(t *testing.T, mod func(*Config)) *Handler {
	t.Helper()
	toks, err := auth.ParseTokens(auth.TokenList{Var: "API", Entries: []string{"alice=" + testToken}},
		auth.TokenList{Var: "ADMIN", Entries: []string{"bob=" + adminToken}, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Auth: auth.New(toks, nil), SessionKey: []byte(testKey), Repos: []string{"platform/access"}}
	if mod != nil {
		mod(&cfg)
	}
	h, err := New(cfg, fakeStore{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

type client struct {
	t       *testing.T
	h       http.Handler
	cookies map[string]*http.Cookie
}

func newClient(t *testing.T, h http.Handler) *client {
	return &client{t: t, h: h, cookies: map[string]*http.Cookie{}}
}

func (c *client) do(method, path string, form url.Values, hdr map[string]string) *http.Response {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req := httptest.NewRequest(method, "http://batcherd.test"+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	for _, ck := range c.cookies {
		req.AddCookie(ck)
	}
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, req)
	res := rec.Result()
	for _, ck := range res.Cookies() {
		if ck.MaxAge < 0 {
			delete(c.cookies, ck.Name)
		} else {
			c.cookies[ck.Name] = ck
		}
	}
	return res
}

func readBody(t *testing.T, res *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// login runs the form: GET for the CSRF token, POST with the token.
func (c *client) login(token string) *http.Response {
	c.t.Helper()
	res := c.do("GET", "/ui/login", nil, nil)
	if res.StatusCode != 200 {
		c.t.Fatalf("GET /ui/login = %d", res.StatusCode)
	}
	return c.do("POST", "/ui/login", url.Values{"token": {token}, "csrf": {c.cookies[loginCookie].Value}, "next": {"/ui/batches"}}, nil)
}

var pages = []string{"/ui", "/ui/batches", "/ui/batches?repo=platform%2Faccess", "/ui/batches/7", "/ui/operations/op-1"}

func TestNoSessionRedirectsToLogin(t *testing.T) {
	c := newClient(t, newTestHandler(t, nil))
	for _, p := range pages {
		res := c.do("GET", p, nil, nil)
		if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/ui/login?next=") {
			t.Errorf("GET %s without a session = %d to %q", p, res.StatusCode, res.Header.Get("Location"))
		}
	}
	// The stylesheet is public (the login form needs it).
	if res := c.do("GET", "/ui/static/style.css", nil, nil); res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/css") {
		t.Errorf("style.css = %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
}

func TestLoginSetsASessionCookieWithoutTheToken(t *testing.T) {
	c := newClient(t, newTestHandler(t, nil))
	res := c.login(testToken)
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/ui/batches" {
		t.Fatalf("login = %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	ck := c.cookies[sessionCookie]
	if ck == nil {
		t.Fatal("no session cookie")
	}
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/ui" || ck.Secure || ck.MaxAge != int(DefaultSessionTTL/time.Second) {
		t.Errorf("cookie attributes: %+v", ck)
	}
	if strings.Contains(ck.Value, testToken) || strings.Contains(ck.String(), testToken) {
		t.Error("the session cookie carries the token")
	}
	if _, ok := c.cookies[loginCookie]; ok {
		t.Error("the login CSRF cookie outlived the login")
	}
	for _, p := range pages {
		res := c.do("GET", p, nil, nil)
		body := readBody(t, res)
		if res.StatusCode != 200 || !strings.Contains(body, `<span id="principal">alice</span>`) {
			t.Errorf("GET %s with a session = %d", p, res.StatusCode)
		}
		if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") {
			t.Errorf("GET %s: CSP %q", p, csp)
		}
		if res.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s: Cache-Control %q", p, res.Header.Get("Cache-Control"))
		}
	}

	// Behind a TLS-terminating proxy the cookie is Secure.
	c2 := newClient(t, newTestHandler(t, nil))
	c2.do("GET", "/ui/login", nil, nil)
	c2.do("POST", "/ui/login", url.Values{"token": {adminToken}, "csrf": {c2.cookies[loginCookie].Value}},
		map[string]string{"X-Forwarded-Proto": "https"})
	if ck := c2.cookies[sessionCookie]; ck == nil || !ck.Secure {
		t.Errorf("session cookie over https: %+v", ck)
	}
}

func TestWrongTokenIsRefused(t *testing.T) {
	c := newClient(t, newTestHandler(t, nil))
	for _, tok := range []string{"wrong", testToken + "x", "", "a.b.c"} {
		res := c.login(tok)
		body := readBody(t, res)
		if res.StatusCode != http.StatusUnauthorized || c.cookies[sessionCookie] != nil {
			t.Errorf("token %q: %d, session %v", tok, res.StatusCode, c.cookies[sessionCookie] != nil)
		}
		if tok != "" && strings.Contains(body, tok) {
			t.Errorf("the refusal page repeats the token %q", tok)
		}
	}
}

func TestForgedTamperedAndExpiredSessionsAreRefused(t *testing.T) {
	now := time.Now()
	h := newTestHandler(t, func(c *Config) { c.Now = func() time.Time { return now } })
	other := sealer{key: []byte("another-key-another-key-another-k")}
	alice, _ := h.cfg.Auth.TokenPrincipal("alice")
	bob, _ := h.cfg.Auth.TokenPrincipal("bob")
	valid, _ := h.seal.seal(alice, now.Add(time.Hour))
	p64, m64, _ := strings.Cut(valid, ".")
	forged, _ := other.seal(bob, now.Add(time.Hour))
	expired, _ := h.seal.seal(alice, now.Add(-time.Second))
	raw, _ := base64.RawURLEncoding.DecodeString(p64)
	adminPayload := base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(raw), "|0|", "|1|", 1)))
	cases := map[string]string{
		"valid":            valid,
		"forged other key": forged,
		"expired":          expired,
		"admin flag flip":  adminPayload + "." + m64,
		"mac truncated":    p64 + "." + m64[:len(m64)-2],
		"no mac":           p64,
		"garbage":          "garbage",
		"empty mac":        p64 + ".",
	}
	for name, v := range cases {
		c := newClient(t, h)
		c.cookies[sessionCookie] = &http.Cookie{Name: sessionCookie, Value: v}
		res := c.do("GET", "/ui", nil, nil)
		if name == "valid" {
			if res.StatusCode != 200 {
				t.Errorf("valid session refused: %d", res.StatusCode)
			}
			continue
		}
		if res.StatusCode != http.StatusSeeOther {
			t.Errorf("%s: GET /ui = %d, want 303 to the login", name, res.StatusCode)
		}
		if _, still := c.cookies[sessionCookie]; still {
			t.Errorf("%s: the bad cookie was not cleared", name)
		}
	}
	// The session ends at its expiry by the server's clock.
	c := newClient(t, h)
	c.cookies[sessionCookie] = &http.Cookie{Name: sessionCookie, Value: valid}
	now = now.Add(time.Hour + time.Second)
	if res := c.do("GET", "/ui", nil, nil); res.StatusCode != http.StatusSeeOther {
		t.Errorf("a session past its expiry: %d", res.StatusCode)
	}
}

func TestLoginCSRF(t *testing.T) {
	h := newTestHandler(t, nil)
	fresh := func() *client {
		c := newClient(t, h)
		c.do("GET", "/ui/login", nil, nil)
		return c
	}
	// No CSRF cookie (a cross-site form post carries none: SameSite=Strict).
	c := newClient(t, h)
	res := c.do("POST", "/ui/login", url.Values{"token": {testToken}, "csrf": {h.seal.loginToken()}}, nil)
	if res.StatusCode != http.StatusForbidden || c.cookies[sessionCookie] != nil {
		t.Errorf("login without the CSRF cookie: %d", res.StatusCode)
	}
	// A field that does not match the cookie.
	c = fresh()
	res = c.do("POST", "/ui/login", url.Values{"token": {testToken}, "csrf": {h.seal.loginToken()}}, nil)
	if res.StatusCode != http.StatusForbidden || c.cookies[sessionCookie] != nil {
		t.Errorf("login with another form's token: %d", res.StatusCode)
	}
	// A made-up pair (cookie and field equal but not signed by the key).
	c = newClient(t, h)
	c.cookies[loginCookie] = &http.Cookie{Name: loginCookie, Value: "abc.def"}
	res = c.do("POST", "/ui/login", url.Values{"token": {testToken}, "csrf": {"abc.def"}}, nil)
	if res.StatusCode != http.StatusForbidden || c.cookies[sessionCookie] != nil {
		t.Errorf("login with an unsigned token pair: %d", res.StatusCode)
	}
	// Another site's page (Origin, Sec-Fetch-Site).
	for _, hdr := range []map[string]string{{"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}} {
		c = fresh()
		res = c.do("POST", "/ui/login", url.Values{"token": {testToken}, "csrf": {c.cookies[loginCookie].Value}}, hdr)
		if res.StatusCode != http.StatusForbidden || c.cookies[sessionCookie] != nil {
			t.Errorf("login with %v: %d", hdr, res.StatusCode)
		}
	}
	// The same origin passes.
	c = fresh()
	res = c.do("POST", "/ui/login", url.Values{"token": {testToken}, "csrf": {c.cookies[loginCookie].Value}},
		map[string]string{"Origin": "http://batcherd.test", "Sec-Fetch-Site": "same-origin"})
	if res.StatusCode != http.StatusSeeOther || c.cookies[sessionCookie] == nil {
		t.Errorf("same-origin login: %d", res.StatusCode)
	}
}

func TestLogoutNeedsTheSessionsCSRFToken(t *testing.T) {
	h := newTestHandler(t, nil)
	c := newClient(t, h)
	c.login(testToken)
	sess := c.cookies[sessionCookie]
	if sess == nil {
		t.Fatal("no session")
	}
	// Without or with a wrong token, or from another site: refused, still logged in.
	other := newClient(t, h)
	other.login(adminToken)
	otherCSRF := h.seal.csrf(mustOpen(t, h, other.cookies[sessionCookie].Value))
	for _, f := range []struct {
		form url.Values
		hdr  map[string]string
	}{
		{url.Values{}, nil},
		{url.Values{"csrf": {"nope"}}, nil},
		{url.Values{"csrf": {otherCSRF}}, nil},
		{url.Values{"csrf": {h.seal.csrf(mustOpen(t, h, sess.Value))}}, map[string]string{"Origin": "https://evil.example"}},
	} {
		res := c.do("POST", "/ui/logout", f.form, f.hdr)
		if res.StatusCode != http.StatusForbidden || c.cookies[sessionCookie] == nil {
			t.Errorf("logout with %v %v: %d", f.form, f.hdr, res.StatusCode)
		}
	}
	// The page's own form logs out.
	page := readBody(t, c.do("GET", "/ui", nil, nil))
	tok := between(page, `name="csrf" value="`, `"`)
	res := c.do("POST", "/ui/logout", url.Values{"csrf": {tok}}, nil)
	if res.StatusCode != http.StatusSeeOther || c.cookies[sessionCookie] != nil {
		t.Fatalf("logout: %d, cookie %v", res.StatusCode, c.cookies[sessionCookie])
	}
	if res := c.do("GET", "/ui", nil, nil); res.StatusCode != http.StatusSeeOther {
		t.Errorf("after logout /ui = %d", res.StatusCode)
	}
}

// Every page renders every text field of the store escaped: no hostile markup, no
// javascript: link.
func TestHostileTextIsEscapedOnEveryPage(t *testing.T) {
	c := newClient(t, newTestHandler(t, nil))
	c.login(testToken)
	for _, p := range append(pages, "/ui/login?next="+url.QueryEscape(`/ui"><script>x</script>`), "/ui/batches/8", "/ui/operations/"+url.PathEscape(hostile)) {
		if p == "/ui/login" || strings.HasPrefix(p, "/ui/login?") {
			c2 := newClient(t, c.h)
			body := readBody(t, c2.do("GET", p, nil, nil))
			if strings.Contains(body, "<script>") {
				t.Errorf("GET %s has raw markup", p)
			}
			continue
		}
		res := c.do("GET", p, nil, nil)
		body := readBody(t, res)
		if strings.Contains(body, "<script") || strings.Contains(body, `alert("x")`) {
			t.Errorf("GET %s (%d) contains raw hostile markup", p, res.StatusCode)
		}
		if strings.Contains(body, `href="javascript:`) {
			t.Errorf("GET %s links to javascript:", p)
		}
		if res.StatusCode == 200 && !strings.Contains(body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&#39;&#34;&amp;") {
			t.Errorf("GET %s does not show the hostile text escaped", p)
		}
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                           "/ui",
		"/ui/batches?repo=a":         "/ui/batches?repo=a",
		"//evil.example/ui":          "/ui",
		"https://evil.example/ui":    "/ui",
		"/uix":                       "/ui",
		"/ui\\@evil.example":         "/ui",
		"/ui/../v1/admin/rounds":     "/ui",
		"/ui/%2e%2e/v1":              "/ui",
		"/ui/operations/x\r\nSet: 1": "/ui",
		"/v1/operations":             "/ui",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestInsecureNoAuthServesWithoutLogin(t *testing.T) {
	h, err := New(Config{InsecureNoAuth: true, Repos: []string{"platform/access"}}, fakeStore{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, h)
	res := c.do("GET", "/ui", nil, nil)
	if body := readBody(t, res); res.StatusCode != 200 || !strings.Contains(body, "anonymous") || !strings.Contains(body, "no authentication") {
		t.Errorf("insecure /ui = %d", res.StatusCode)
	}
	// Without it, an unconfigured authenticator is an error, not an open page.
	if _, err := New(Config{Repos: []string{"platform/access"}}, fakeStore{}, nil); err == nil {
		t.Error("New without authentication succeeded")
	}
	if _, err := New(Config{InsecureNoAuth: true, SessionKey: []byte("short")}, fakeStore{}, nil); err == nil {
		t.Error("a short session key was accepted")
	}
}

func mustOpen(t *testing.T, h *Handler, v string) Session {
	t.Helper()
	s, err := h.seal.open(v, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func between(s, a, b string) string {
	_, rest, ok := strings.Cut(s, a)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, b)
	return v
}

// A batch page shows at most maxMembersShown members and says how many there are.
func TestBatchPageShowsTheFirstMembers(t *testing.T) {
	for _, n := range []int{maxMembersShown, maxMembersShown + 1, 5000} {
		h, err := New(Config{InsecureNoAuth: true, Repos: []string{"platform/access"}}, fakeStore{members: n}, nil)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, newClient(t, h).do("GET", "/ui/batches/7", nil, nil))
		rows := strings.Count(body, `<td class="subject">`)
		if rows != min(n, maxMembersShown) || !strings.Contains(body, fmt.Sprintf("Members (%d)", n)) ||
			strings.Contains(body, `id="members-cut"`) != (n > maxMembersShown) {
			t.Errorf("%d members: %d rows shown", n, rows)
		}
	}
}
