package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/batcherd/batcherd/internal/app"
	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/logging"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/scanner"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

const (
	apiToken   = "api-token-for-tests"
	adminToken = "admin-token-for-tests"
)

func testConfig(t *testing.T, dsn, glURL string, repos ...string) *config.Config {
	t.Helper()
	cfg, err := config.Load(context.Background(), envconfig.MapLookuper(map[string]string{
		"BATCHERD_MYSQL_DSN":          dsn,
		"BATCHERD_GITLAB_URL":         glURL,
		"BATCHERD_GITLAB_TOKEN":       "sim-token",
		"BATCHERD_REPOS":              strings.Join(repos, ","),
		"BATCHERD_HTTP_ADDR":          "127.0.0.1:0",
		"BATCHERD_API_TOKENS":         apiToken,
		"BATCHERD_ADMIN_TOKENS":       adminToken,
		"BATCHERD_AUTO_APPROVE":       "true",
		"BATCHERD_CLAIM_SCHEDULE":     "@every 1s",
		"BATCHERD_RECONCILE_INTERVAL": "200ms",
		"BATCHERD_SHUTDOWN_TIMEOUT":   "5s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(config.Need{DB: true, GitLab: true, Serve: true}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func fast(c *scanner.Config) {
	c.PublishInterval = 200 * time.Millisecond
	c.StartJitter = 50 * time.Millisecond
	c.BackoffBase = 50 * time.Millisecond
	c.BackoffMax = 500 * time.Millisecond
	c.TimeoutInterval = time.Second
}

func startApp(t *testing.T, cfg *config.Config) (*app.App, func()) {
	t.Helper()
	a, err := app.New(context.Background(), cfg, app.Env{Log: logging.Discard(), Stdout: io.Discard, Version: "test", TuneScanner: fast})
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stop := func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("app did not stop within 15s")
		}
	}
	return a, stop
}

func call(t *testing.T, method, url, token string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

type opEnvelope struct {
	Operation struct {
		ID      string `json:"id"`
		Status  string `json:"status"`
		BatchID *int64 `json:"batch_id"`
		MRURL   string `json:"mr_url"`
	} `json:"operation"`
}

// TestServeEndToEnd runs two replicas in-process against one database and the GitLab
// simulator, submits grants over two repositories through the HTTP API and waits until
// every one is merged, with one MR per batch and the files on the default branch.
func TestServeEndToEnd(t *testing.T) {
	_, dsn := storetest.New(t)
	repos := []string{"platform/access", "platform/other"}
	sim := gitlabsim.New(gitlabsim.Options{Projects: repos, PipelineDuration: 100 * time.Millisecond})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()

	a1, stop1 := startApp(t, testConfig(t, dsn, sim.URL(), repos...))
	defer stop1()
	_, stop2 := startApp(t, testConfig(t, dsn, sim.URL(), repos...))
	defer stop2()
	base := "http://" + a1.Addr()

	if code := call(t, "GET", base+"/readyz", "", nil, nil); code != 200 {
		t.Fatalf("readyz = %d", code)
	}
	const n = 30
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var env opEnvelope
			body := map[string]any{"subject": fmt.Sprintf("user-%d", i), "target": "db/prod", "action": "grant", "repo": repos[i%2]}
			if i == 0 { // numbers reach the file as sent (checked below)
				body["attributes"] = json.RawMessage(`{"ticket":1234567,"big":9007199254740993,"ratio":1e5}`)
			}
			if code := call(t, "POST", base+"/v1/operations", apiToken, body, &env); code != 201 {
				t.Errorf("create %d: status %d", i, code)
			}
			ids[i] = env.Operation.ID
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range ids {
		for {
			var env opEnvelope
			call(t, "GET", base+"/v1/operations/"+id, apiToken, nil, &env)
			if env.Operation.Status == "merged" {
				if env.Operation.MRURL == "" {
					t.Errorf("merged operation %s has no mr_url", id)
				}
				break
			}
			if env.Operation.Status == "failed" || time.Now().After(deadline) {
				t.Fatalf("operation %s ended %q", id, env.Operation.Status)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i, repo := range repos {
		files := sim.Files(repo)
		for j := i; j < n; j += 2 {
			p := domain.BindingPath(fmt.Sprintf("user-%d", j), "db/prod")
			content, ok := files[p]
			if !ok {
				t.Errorf("%s: %s missing on the default branch", repo, p)
			}
			if j == 0 {
				for _, line := range []string{`"ticket": 1234567` + "\n", `"big": 9007199254740993` + "\n", `"ratio": 1.0e+5` + "\n"} {
					if !strings.Contains(content, line) {
						t.Errorf("%s lacks %q:\n%s", p, line, content)
					}
				}
			}
		}
		for branch, mrs := range sim.MRsByBranch(repo) {
			if len(mrs) != 1 {
				t.Errorf("%s: branch %s has %d MRs", repo, branch, len(mrs))
			}
		}
	}
}

// TestServeRefusesSchemaDrift: I8 at start-up — a unique index replaced by a plain one
// makes New fail with ErrSchemaDrift (exit code 3) naming the index.
func TestServeRefusesSchemaDrift(t *testing.T) {
	st, dsn := storetest.New(t)
	if _, err := st.DB().Exec("ALTER TABLE merge_batch_request DROP INDEX uk_operation_id, ADD INDEX uk_operation_id (operation_id)"); err != nil {
		t.Fatal(err)
	}
	_, err := app.New(context.Background(), testConfig(t, dsn, "http://127.0.0.1:1", "g/p"), app.Env{Log: logging.Discard(), Stdout: io.Discard})
	if !errors.Is(err, app.ErrSchemaDrift) || app.ExitCode(err) != app.ExitSchemaDrift {
		t.Fatalf("want schema drift, got %v", err)
	}
	if !strings.Contains(err.Error(), "uk_operation_id") {
		t.Fatalf("error does not name the index: %v", err)
	}
}

// TestSecretsNeverLogged starts a replica with every secret set and checks that none of
// them appears in what it logs, while the configuration line says they are set.
func TestSecretsNeverLogged(t *testing.T) {
	_, dsn := storetest.New(t)
	sim := startSim(t, "g/p")
	cfg := testConfig(t, dsn, sim.URL(), "g/p")
	cfg.WebhookSecret = "webhook-secret-value"
	out := runLogged(t, cfg, "debug", func(base string) {
		call(t, "GET", base+"/readyz", "", nil, nil)
		call(t, "POST", base+"/v1/operations", "wrong-token", map[string]any{"subject": "s", "target": "t", "action": "grant"}, nil)
		time.Sleep(300 * time.Millisecond)
	})
	if !strings.Contains(out, `"BATCHERD_GITLAB_TOKEN":"<set>"`) {
		t.Fatalf("configuration line missing or secret not masked:\n%s", out)
	}
	pass := strings.SplitN(strings.SplitN(dsn, "@", 2)[0], ":", 2)[1]
	for _, secret := range []string{"sim-token", apiToken, adminToken, "webhook-secret-value", pass + "@"} {
		if strings.Contains(out, secret) {
			t.Errorf("log output contains the secret %q", secret)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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
