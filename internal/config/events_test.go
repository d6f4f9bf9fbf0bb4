package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sethvargo/go-envconfig"
)

// Events: receivers need the secret; the secret comes from the variable or its file,
// never both; a bad URL is named by position only (a URL may carry credentials), and
// neither the URLs nor the secret are printed by the configuration's listing.
func TestEventsConfig(t *testing.T) {
	base := map[string]string{
		"MYSQL_DSN": "u:p@tcp(db:3306)/b", "GITLAB_URL": "https://gl", "GITLAB_TOKEN": "glpat-x",
		"REPOS": "a/b", "API_TOKENS": "t1",
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
	serve := Need{DB: true, GitLab: true, Serve: true}

	c := load(t, with("EVENTS_URL", " https://hooks.example/a , http://u:hunter2@10.0.0.1:9000/b ", "EVENTS_SECRET", "s"))
	if err := c.Validate(serve); err != nil {
		t.Fatal(err)
	}
	if len(c.EventsURL) != 2 || c.EventsURL[1] != "http://u:hunter2@10.0.0.1:9000/b" {
		t.Fatalf("urls: %q", c.EventsURL)
	}
	if r := c.Redacted(); r[Prefix+"EVENTS_URL"] != "<set>" || r[Prefix+"EVENTS_SECRET"] != "<set>" {
		t.Fatalf("the configuration log would print %q and %q", r[Prefix+"EVENTS_URL"], r[Prefix+"EVENTS_SECRET"])
	}

	c = load(t, with("EVENTS_URL", "https://hooks.example/a"))
	if err := c.Validate(serve); err == nil || !strings.Contains(err.Error(), "BATCHERD_EVENTS_SECRET") {
		t.Fatalf("receivers without a secret: %v", err)
	}

	c = load(t, with("EVENTS_URL", "https://ok.example/,ftp://u:hunter2@x/", "EVENTS_SECRET", "s"))
	err := c.Validate(serve)
	if err == nil || !strings.Contains(err.Error(), "BATCHERD_EVENTS_URL: entry 2") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("bad URL: %v", err)
	}

	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c = load(t, with("EVENTS_URL", "https://hooks.example/a", "EVENTS_SECRET_FILE", file))
	if c.EventsSecret != "from-file" || c.Validate(serve) != nil {
		t.Fatalf("secret from file: %q", c.EventsSecret)
	}
	m := map[string]string{}
	for k, v := range with("EVENTS_SECRET", "env", "EVENTS_SECRET_FILE", file) {
		m[Prefix+k] = v
	}
	if _, err := Load(context.Background(), envconfig.MapLookuper(m)); err == nil ||
		!strings.Contains(err.Error(), "BATCHERD_EVENTS_SECRET and BATCHERD_EVENTS_SECRET_FILE are both set") {
		t.Fatalf("secret set both ways: %v", err)
	}

	for _, v := range Vars() {
		if (v.Name == Prefix+"EVENTS_URL" || v.Name == Prefix+"EVENTS_SECRET") && !v.Secret {
			t.Errorf("%s is not marked secret", v.Name)
		}
	}
}
