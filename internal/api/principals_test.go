package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/auth/authtest"
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
			HTTPClient: &http.Client{Timeout: 5 * time.Second}, RetryEvery: time.Millisecond,
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

	iss.Rotate(jose.ES256)
	check("after key rotation", iss.Token(iss.Claims("carol")), "GET", "/v1/bindings", 200)

	iss.SetDown(true)
	iss.Rotate(jose.RS256)
	check("new key while the issuer is down", iss.Token(iss.Claims("carol")), "GET", "/v1/bindings", 401)
	iss.SetDown(false)
	check("new key once the issuer is back", iss.Token(iss.Claims("carol")), "GET", "/v1/bindings", 200)
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
	time.Sleep(5 * time.Millisecond)
	if r := e.do(req{method: "GET", path: "/v1/bindings", token: tok}); r.status != 200 {
		t.Fatalf("issuer back: %d %s", r.status, r.raw)
	}
}
