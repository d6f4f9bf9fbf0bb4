package ui

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/auth/authtest"
)

// handlerWith is the status page of a replica configured with these token entries
// (same session key as newTestHandler, as every replica behind one load balancer).
func handlerWith(t *testing.T, api, admin []string) *Handler {
	t.Helper()
	toks, err := auth.ParseTokens(auth.TokenList{Var: "API", Entries: api}, auth.TokenList{Var: "ADMIN", Entries: admin, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{Auth: auth.New(toks, nil), SessionKey: []byte(testKey), Repos: []string{"platform/access"}}, fakeStore{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// sessionOn sends a logged-in browser's cookies to another replica's page (or the same
// replica after a restart with a new configuration) and says whether it was let in and
// whether it was shown as an admin.
func sessionOn(t *testing.T, from *client, h *Handler) (in, admin bool) {
	t.Helper()
	c := newClient(t, h)
	c.cookies[sessionCookie] = from.cookies[sessionCookie]
	res := c.do("GET", "/ui", nil, nil)
	if res.StatusCode == http.StatusSeeOther {
		if _, still := c.cookies[sessionCookie]; still {
			t.Error("a refused session's cookie was not cleared")
		}
		return false, false
	}
	if res.StatusCode != 200 {
		t.Fatalf("GET /ui = %d", res.StatusCode)
	}
	return true, strings.Contains(readBody(t, res), `<span class="tag">admin</span>`)
}

// A session is bound to the token it was opened with: removing the token, or giving
// its name another token, ends the session on the next request — before, a session
// lived on for its whole TTL (8 h by default) after the token was revoked. The admin
// flag is the one configured now, so a demoted admin loses it at once.
func TestSessionEndsWithItsToken(t *testing.T) {
	const rotated = "a-new-token-for-alice-0123456789"
	orig := handlerWith(t, []string{"alice=" + testToken}, []string{"bob=" + adminToken})
	alice, bob := newClient(t, orig), newClient(t, orig)
	alice.login(testToken)
	bob.login(adminToken)

	for _, tc := range []struct {
		name           string
		api, admin     []string
		aliceIn, bobIn bool
		bobAdmin       bool
	}{
		{"same configuration", []string{"alice=" + testToken}, []string{"bob=" + adminToken}, true, true, true},
		{"alice's token removed", nil, []string{"bob=" + adminToken}, false, true, true},
		{"alice's token replaced", []string{"alice=" + rotated}, []string{"bob=" + adminToken}, false, true, true},
		{"alice's token now under another name", []string{"alicia=" + testToken}, []string{"bob=" + adminToken}, false, true, true},
		{"bob demoted to an API token", []string{"alice=" + testToken, "bob=" + adminToken}, nil, true, true, false},
	} {
		h := handlerWith(t, tc.api, tc.admin)
		if in, _ := sessionOn(t, alice, h); in != tc.aliceIn {
			t.Errorf("%s: alice's session let in = %v, want %v", tc.name, in, tc.aliceIn)
		}
		in, admin := sessionOn(t, bob, h)
		if in != tc.bobIn || admin != tc.bobAdmin {
			t.Errorf("%s: bob's session in=%v admin=%v, want %v %v", tc.name, in, admin, tc.bobIn, tc.bobAdmin)
		}
	}
}

// An OIDC session ends when its token expires (not after the full TTL), and when the
// issuer is no longer configured.
func TestOIDCSessionEndsWithItsToken(t *testing.T) {
	iss := authtest.NewIssuer(t, "batcherd")
	o, err := auth.NewOIDC(context.Background(), auth.OIDCConfig{Issuer: iss.URL, Audience: "batcherd"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cfg := Config{Auth: auth.New(nil, o), SessionKey: []byte(testKey), Repos: []string{"platform/access"},
		Now: func() time.Time { return now }}
	h, err := New(cfg, fakeStore{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, h)
	claims := iss.Claims("carol")
	exp := now.Add(10 * time.Minute).Unix()
	claims["exp"] = exp
	if res := c.login(iss.Token(claims)); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/ui/batches" {
		t.Fatalf("OIDC login = %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	s := mustOpen(t, h, c.cookies[sessionCookie].Value)
	if s.Expires.Unix() != exp || s.Name != "carol" {
		t.Fatalf("session %q until %s, want carol until the token's exp %s", s.Name, s.Expires, time.Unix(exp, 0))
	}
	if in, _ := sessionOn(t, c, h); !in {
		t.Fatal("a fresh OIDC session was refused")
	}
	now = now.Add(10*time.Minute + time.Second)
	if in, _ := sessionOn(t, c, h); in {
		t.Error("the OIDC session outlived its token (the TTL is 8 h)")
	}
	now = now.Add(-time.Minute)
	tokensOnly := handlerWith(t, []string{"alice=" + testToken}, nil)
	if in, _ := sessionOn(t, c, tokensOnly); in {
		t.Error("an OIDC session was let in by a replica without an issuer")
	}
}
