package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"
)

func load(t *testing.T, env map[string]string) *Config {
	t.Helper()
	m := map[string]string{}
	for k, v := range env {
		m[Prefix+k] = v
	}
	c, err := Load(context.Background(), envconfig.MapLookuper(m))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func TestDefaults(t *testing.T) {
	c := load(t, nil)
	if c.HTTPAddr != ":8080" || c.ClaimSchedule != "@every 30s" || c.MaxBatchSize != 500 ||
		c.MergeMode != "auto" || c.ReconcileInterval != 10*time.Second || c.BatchTimeout != 30*time.Minute ||
		c.ShutdownTimeout != 20*time.Second || c.IdempotencyTTL != 24*time.Hour || c.TargetBranch != "main" ||
		c.MaxAttempts != 3 || c.OnFailure != "isolate" || c.InfraRetries != 1 || c.ConflictRetries != 1 || !c.Bisect {
		t.Fatalf("unexpected defaults: %+v", c)
	}
}

func TestValidateNamesEveryBadVariable(t *testing.T) {
	c := load(t, map[string]string{
		"MERGE_MODE": "yolo", "CLAIM_SCHEDULE": "not cron", "MAX_BATCH_SIZE": "0", "GITLAB_URL": "gitlab.local",
		"ON_FAILURE": "pray", "INFRA_RETRIES": "-1", "CONFLICT_RETRIES": "11",
	})
	err := c.Validate(Need{DB: true, GitLab: true, Serve: true})
	if err == nil {
		t.Fatal("want errors")
	}
	for _, name := range []string{"BATCHERD_MYSQL_DSN", "BATCHERD_MERGE_MODE", "BATCHERD_CLAIM_SCHEDULE",
		"BATCHERD_MAX_BATCH_SIZE", "BATCHERD_GITLAB_URL", "BATCHERD_GITLAB_TOKEN", "BATCHERD_REPOS", "BATCHERD_API_TOKENS",
		"BATCHERD_ON_FAILURE", "BATCHERD_INFRA_RETRIES", "BATCHERD_CONFLICT_RETRIES"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s:\n%v", name, err)
		}
	}
}

func TestValidServeConfig(t *testing.T) {
	c := load(t, map[string]string{
		"MYSQL_DSN": "u:p@tcp(db:3306)/b", "GITLAB_URL": "https://gl", "GITLAB_TOKEN": "glpat-x",
		"REPOS": "a/b, c/d", "API_TOKENS": "t1,t2",
	})
	if err := c.Validate(Need{DB: true, GitLab: true, Serve: true}); err != nil {
		t.Fatal(err)
	}
	if len(c.Repos) != 2 || c.Repos[1] != "c/d" {
		t.Fatalf("repos: %q", c.Repos)
	}
}

func TestSecretsFromFilesAndRedaction(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := load(t, map[string]string{
		"MYSQL_DSN_FILE":    write("dsn", "u:hunter2@tcp(db:3306)/b\n"),
		"GITLAB_TOKEN_FILE": write("tok", "glpat-secret\n"),
		"API_TOKENS_FILE":   write("api", "a1\na2\n"),
	})
	if c.MySQLDSN != "u:hunter2@tcp(db:3306)/b" || c.GitLabToken != "glpat-secret" || len(c.APITokens) != 2 {
		t.Fatalf("files not loaded: %+v", c)
	}
	for k, v := range c.Redacted() {
		if strings.Contains(v, "hunter2") || strings.Contains(v, "glpat-secret") || strings.Contains(v, "a1") {
			t.Errorf("%s leaks a secret: %q", k, v)
		}
	}
}

// Every secret can come from a file, and a secret set both ways is refused rather than
// one of the two silently winning (a rotation that updated only the file would leave
// the old value in force).
func TestSecretFromBothPlacesIsRefused(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := load(t, map[string]string{"WEBHOOK_SECRET_FILE": p, "ADMIN_TOKENS_FILE": p})
	if c.WebhookSecret != "from-file" || len(c.AdminTokens) != 1 || c.AdminTokens[0] != "from-file" {
		t.Fatalf("files not loaded: webhook %q admin %q", c.WebhookSecret, c.AdminTokens)
	}
	for _, name := range []string{"MYSQL_DSN", "GITLAB_TOKEN", "WEBHOOK_SECRET", "API_TOKENS", "ADMIN_TOKENS"} {
		_, err := Load(context.Background(), envconfig.MapLookuper(map[string]string{
			Prefix + name: "from-env", Prefix + name + "_FILE": p,
		}))
		if err == nil || !strings.Contains(err.Error(), Prefix+name+" and "+Prefix+name+"_FILE are both set") {
			t.Errorf("%s set both ways: %v", name, err)
		}
		if err != nil && (strings.Contains(err.Error(), "from-env") || strings.Contains(err.Error(), "from-file")) {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
}

func TestMissingSecretFileNamesVariable(t *testing.T) {
	_, err := Load(context.Background(), envconfig.MapLookuper(map[string]string{
		"BATCHERD_GITLAB_TOKEN_FILE": "/nonexistent/token",
	}))
	if err == nil || !strings.Contains(err.Error(), "BATCHERD_GITLAB_TOKEN_FILE") {
		t.Fatalf("want error naming BATCHERD_GITLAB_TOKEN_FILE, got %v", err)
	}
}

func TestVarsListsEveryField(t *testing.T) {
	vars := Vars()
	seen := map[string]bool{}
	for _, v := range vars {
		if !strings.HasPrefix(v.Name, Prefix) || v.Desc == "" {
			t.Errorf("bad var %+v", v)
		}
		seen[v.Name] = true
	}
	for _, want := range []string{"BATCHERD_MYSQL_DSN", "BATCHERD_GITLAB_TOKEN", "BATCHERD_MERGE_MODE", "BATCHERD_LOG_FORMAT"} {
		if !seen[want] {
			t.Errorf("Vars misses %s", want)
		}
	}
}
