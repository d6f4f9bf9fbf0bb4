package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrincipalsValidation(t *testing.T) {
	base := map[string]string{
		"MYSQL_DSN": "u:p@tcp(db:3306)/b", "GITLAB_URL": "https://gl", "GITLAB_TOKEN": "glpat-x", "REPOS": "a/b",
	}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	file := filepath.Join(t.TempDir(), "admin-tokens")
	if err := os.WriteFile(file, []byte("ops=the-shared-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // "" = valid
	}{
		{"named and bare", with("API_TOKENS", "alice=t-a,bare-token", "ADMIN_TOKENS", "ops=t-o"), ""},
		{"same token across lists", with("API_TOKENS", "alice=the-shared-secret", "ADMIN_TOKENS_FILE", file),
			"BATCHERD_ADMIN_TOKENS_FILE entry 1 (principal \"ops\") has the same token as BATCHERD_API_TOKENS entry 1"},
		{"bad name", with("API_TOKENS", "al/ice=t-a"), "BATCHERD_API_TOKENS entry 1"},
		{"duplicate name", with("API_TOKENS", "alice=t-a", "ADMIN_TOKENS", "alice=t-b"), "BATCHERD_ADMIN_TOKENS entry 1: principal name \"alice\""},
		{"OIDC only", with("OIDC_ISSUER", "https://gitlab.example.com", "OIDC_AUDIENCE", "app-1"), ""},
		{"OIDC without audience", with("OIDC_ISSUER", "https://gitlab.example.com"), "BATCHERD_OIDC_AUDIENCE"},
		{"OIDC over http", with("OIDC_ISSUER", "http://gitlab.example.com", "OIDC_AUDIENCE", "a"), "BATCHERD_OIDC_ISSUER"},
		{"OIDC over http on loopback", with("OIDC_ISSUER", "http://127.0.0.1:5556/dex", "OIDC_AUDIENCE", "a"), ""},
		{"audience without issuer", with("API_TOKENS", "alice=t", "OIDC_AUDIENCE", "a"), "without BATCHERD_OIDC_ISSUER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := load(t, tc.env)
			err := c.Validate(Need{DB: true, GitLab: true, Serve: true})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			case err != nil && strings.Contains(err.Error(), "the-shared-secret"):
				t.Fatalf("the error shows the token: %v", err)
			}
		})
	}
	if c := load(t, base); c.OIDCUsernameClaim != "sub" || c.OIDCGroupsClaim != "groups" {
		t.Fatalf("defaults: username claim %q, groups claim %q", c.OIDCUsernameClaim, c.OIDCGroupsClaim)
	}
}
