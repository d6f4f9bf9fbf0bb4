package auth_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/auth/authtest"
)

func TestParseTokens(t *testing.T) {
	toks, err := auth.ParseTokens(
		auth.TokenList{Var: "BATCHERD_API_TOKENS", Entries: []string{"alice=s3cret-a", " bob = s3cret=b ", "bare-secret"}},
		auth.TokenList{Var: "BATCHERD_ADMIN_TOKENS", Entries: []string{"ops=s3cret-ops"}, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	a := auth.New(toks, nil)
	for tok, want := range map[string]auth.Principal{
		"s3cret-a":    {Name: "alice", Source: "token"},
		"s3cret=b":    {Name: "bob", Source: "token"}, // the token may contain '=' after the first
		"bare-secret": {Name: auth.BareName("bare-secret"), Source: "token"},
		"s3cret-ops":  {Name: "ops", Admin: true, Source: "token"},
	} {
		want.Credential = sha256.Sum256([]byte(tok)) // what a status page session is bound to
		got, err := a.Authenticate(context.Background(), tok)
		if err != nil || got != want {
			t.Errorf("token of %s: got %+v, %v", want.Name, got, err)
		}
		if p, ok := a.TokenPrincipal(want.Name); !ok || p != want {
			t.Errorf("TokenPrincipal(%s) = %+v, %v", want.Name, p, ok)
		}
	}
	if _, ok := a.TokenPrincipal("nobody"); ok {
		t.Error("TokenPrincipal found a name that is not configured")
	}
	if n := auth.BareName("bare-secret"); len(n) != len("token-")+8 || !strings.HasPrefix(n, "token-") {
		t.Errorf("bare name %q", n)
	}
	for _, bad := range []string{"", "s3cret", "alice", "s3cret-a "} {
		if _, err := a.Authenticate(context.Background(), bad); !errors.Is(err, auth.ErrUnauthenticated) {
			t.Errorf("token %q accepted: %v", bad, err)
		}
	}
}

func TestParseTokensRefusals(t *testing.T) {
	const secret = "very-secret-value"
	for _, tc := range []struct {
		name       string
		api, admin []string
		want       string
	}{
		{"same token twice in one list", []string{"a=" + secret, "b=" + secret}, nil, "BATCHERD_API_TOKENS entry 2 (principal \"b\") has the same token as BATCHERD_API_TOKENS entry 1"},
		{"same token in API and admin lists", []string{"a=" + secret}, []string{"b=" + secret}, "BATCHERD_ADMIN_TOKENS_FILE entry 1 (principal \"b\") has the same token as BATCHERD_API_TOKENS entry 1"},
		{"same bare token twice", []string{secret, secret}, nil, "same token"},
		{"name twice", []string{"a=x1", "A=x2"}, nil, "already used"},
		{"name in both lists", []string{"a=x1"}, []string{"a=x2"}, "already used"},
		{"bad character", []string{"al ice=x1"}, nil, "letters, digits"},
		{"reserved name", []string{"auto=x1"}, nil, "reserved"},
		{"empty token", []string{"alice="}, nil, "empty"},
		{"empty name", []string{"=x1"}, nil, "1 to 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := auth.ParseTokens(
				auth.TokenList{Var: "BATCHERD_API_TOKENS", Entries: tc.api},
				auth.TokenList{Var: "BATCHERD_ADMIN_TOKENS_FILE", Entries: tc.admin, Admin: true})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if msg := err.Error(); strings.Contains(msg, secret) || strings.Contains(msg, "x1") || strings.Contains(msg, "x2") {
				t.Fatalf("the error shows a token: %v", err)
			}
		})
	}
}

func newOIDC(t *testing.T, iss *authtest.Issuer, mut func(*auth.OIDCConfig)) *auth.Authenticator {
	t.Helper()
	toks, err := auth.ParseTokens(auth.TokenList{Var: "X", Entries: []string{"alice=tok-a"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := auth.OIDCConfig{Issuer: iss.URL, Audience: iss.Audience, AdminGroups: []string{"platform/admins"},
		HTTPClient: &http.Client{Timeout: 5 * time.Second}, RetryEvery: time.Millisecond, RefetchEvery: -1}
	if mut != nil {
		mut(&cfg)
	}
	o, err := auth.NewOIDC(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return auth.New(toks, o)
}

func TestOIDCVerification(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "app-123")
	a := newOIDC(t, iss, nil)

	ok := func(tok string, want auth.Principal) {
		t.Helper()
		got, err := a.Authenticate(ctx, tok)
		if err != nil || got.Expires.IsZero() {
			t.Fatalf("got %+v, %v; want %+v with the token's expiry", got, err, want)
		}
		got.Expires = time.Time{}
		if got != want {
			t.Fatalf("got %+v, %v; want %+v", got, err, want)
		}
	}
	refused := func(what, tok, msg string) {
		t.Helper()
		_, err := a.Authenticate(ctx, tok)
		if !errors.Is(err, auth.ErrUnauthenticated) || !strings.Contains(err.Error(), msg) {
			t.Fatalf("%s: got %v, want a refusal saying %q", what, err, msg)
		}
	}

	ok(iss.Token(iss.Claims("carol")), auth.Principal{Name: "carol", Source: "oidc"})
	c := iss.Claims("dave")
	c["groups"] = []string{"platform", "platform/admins"}
	ok(iss.Token(c), auth.Principal{Name: "dave", Admin: true, Source: "oidc"})
	// Static tokens still work beside OIDC (no expiry: valid while configured).
	if p, err := a.Authenticate(ctx, "tok-a"); err != nil || p != (auth.Principal{Name: "alice", Source: "token", Credential: sha256.Sum256([]byte("tok-a"))}) {
		t.Fatalf("static token beside OIDC: %+v, %v", p, err)
	}

	exp := iss.Claims("carol")
	exp["exp"] = time.Now().Add(-time.Minute).Unix()
	refused("expired", iss.Token(exp), "expired")
	aud := iss.Claims("carol")
	aud["aud"] = "another-app"
	refused("wrong audience", iss.Token(aud), "could not be verified")
	wrongIss := iss.Claims("carol")
	wrongIss["iss"] = "https://evil.example.com"
	refused("wrong issuer", iss.Token(wrongIss), "could not be verified")
	nbf := iss.Claims("carol")
	nbf["nbf"] = time.Now().Add(time.Hour).Unix()
	refused("not yet valid", iss.Token(nbf), "could not be verified")
	refused("alg none", authtest.Unsigned(t, iss.Current().ID, iss.Claims("carol")), "could not be verified")
	refused("HS256 with the public key", authtest.SignHS256WithPublicKey(t, iss.Current(), iss.Claims("carol")), "could not be verified")
	stranger := authtest.NewKey(t, iss.Current().ID, jose.RS256) // same kid, other key
	refused("forged with the published kid", authtest.Sign(t, stranger, iss.Claims("carol")), "could not be verified")
	before := iss.JWKSFetches.Load()
	refused("unknown kid", authtest.Sign(t, authtest.NewKey(t, "ghost", jose.RS256), iss.Claims("carol")), "could not be verified")
	if iss.JWKSFetches.Load() == before {
		t.Error("an unknown kid did not make the verifier fetch the keys again")
	}
	refused("tampered payload", tamper(iss.Token(iss.Claims("carol"))), "could not be verified")

	// Names: a token principal's name, a reserved one, and a missing claim.
	refused("token principal's name", iss.Token(iss.Claims("Alice")), "configured token principal")
	refused("reserved name", iss.Token(iss.Claims("auto")), "reserved")
	noSub := iss.Claims("x")
	delete(noSub, "sub")
	refused("no sub", iss.Token(noSub), "no string claim")
}

// tamper swaps the payload of a signed token for another one.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	parts[1] = strings.TrimRight(parts[1], "A") + "B"
	return strings.Join(parts, ".")
}

func TestOIDCKeyRotationAndEC(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "app-123")
	a := newOIDC(t, iss, nil)
	if _, err := a.Authenticate(ctx, iss.Token(iss.Claims("carol"))); err != nil {
		t.Fatal(err)
	}
	old := iss.Current()
	iss.Rotate(jose.ES256)
	tok := iss.Token(iss.Claims("carol"))
	eventually(t, "token of the rotated (EC) key accepted", func() error {
		p, err := a.Authenticate(ctx, tok)
		if err == nil && p.Name != "carol" {
			t.Fatalf("principal %+v", p)
		}
		return err
	})
	// The retired key is no longer published: its tokens are refused.
	stale := authtest.Sign(t, old, iss.Claims("carol"))
	eventually(t, "token of the retired key refused", func() error {
		if _, err := a.Authenticate(ctx, stale); !errors.Is(err, auth.ErrUnauthenticated) {
			return fmt.Errorf("accepted (%v)", err)
		}
		return nil
	})
}

// eventually retries check for up to two seconds. go-oidc's key set replaces its cached
// keys a moment after a fetch's callers got the new ones, and a caller arriving in that
// moment joins the finished fetch: right after a rotation a token of the new key can be
// refused once (and one of the retired key accepted) — a window of microseconds that a
// test driving tokens back to back can hit, and a client's retry closes.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	var err error
	for i := 0; i < 200; i++ {
		if err = check(); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}

func TestOIDCIssuerUnreachableAtStart(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "app-123")
	iss.SetDown(true)
	a := newOIDC(t, iss, nil) // a warning, not an error
	if _, err := a.Authenticate(ctx, iss.Token(iss.Claims("carol"))); !errors.Is(err, auth.ErrUnauthenticated) || !strings.Contains(err.Error(), "cannot be reached") {
		t.Fatalf("while the issuer is down: %v", err)
	}
	if p, err := a.Authenticate(ctx, "tok-a"); err != nil || p.Name != "alice" {
		t.Fatalf("static token while the issuer is down: %+v %v", p, err)
	}
	iss.SetDown(false)
	tok := iss.Token(iss.Claims("carol"))
	eventually(t, "once the issuer is back", func() error {
		_, err := a.Authenticate(ctx, tok)
		return err
	})
}

func TestOIDCClaims(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "app-123")
	a := newOIDC(t, iss, func(c *auth.OIDCConfig) {
		c.UsernameClaim, c.GroupsClaim = "nickname", "groups_direct"
	})
	c := iss.Claims("4711")
	c["nickname"] = "erin"
	c["groups_direct"] = []string{"platform/admins"}
	c["groups"] = []string{"ignored"}
	if p, err := a.Authenticate(ctx, iss.Token(c)); err != nil || p.Expires.Unix() != c["exp"].(int64) ||
		(auth.Principal{Name: p.Name, Admin: p.Admin, Source: p.Source}) != (auth.Principal{Name: "erin", Admin: true, Source: "oidc"}) {
		t.Fatalf("%+v %v", p, err)
	}
	c["nickname"] = "line\nbreak"
	if _, err := a.Authenticate(ctx, iss.Token(c)); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("a name with a control character: %v", err)
	}
}

// Made-up key ids cannot make batcherd fetch the issuer's keys more than once per
// RefetchEvery; a token of a key rotated in meanwhile is accepted once it has passed.
func TestOIDCKeyRefetchIsBounded(t *testing.T) {
	ctx := context.Background()
	iss := authtest.NewIssuer(t, "app-123")
	a := newOIDC(t, iss, func(c *auth.OIDCConfig) { c.RefetchEvery = 300 * time.Millisecond })
	if _, err := a.Authenticate(ctx, iss.Token(iss.Claims("carol"))); err != nil {
		t.Fatal(err) // the first fetch
	}
	before := iss.JWKSFetches.Load()
	for i := 0; i < 20; i++ {
		tok := authtest.Sign(t, authtest.NewKey(t, fmt.Sprintf("made-up-%d", i), jose.ES256), iss.Claims("carol"))
		if _, err := a.Authenticate(ctx, tok); !errors.Is(err, auth.ErrUnauthenticated) {
			t.Fatalf("made-up kid %d: %v", i, err)
		}
	}
	if n := iss.JWKSFetches.Load() - before; n > 1 {
		t.Fatalf("20 made-up key ids made %d key fetches, want at most 1", n)
	}
	iss.Rotate(jose.RS256)
	tok := iss.Token(iss.Claims("carol"))
	time.Sleep(350 * time.Millisecond)
	if p, err := a.Authenticate(ctx, tok); err != nil || p.Name != "carol" {
		t.Fatalf("rotated key after the interval: %+v %v", p, err)
	}
}
